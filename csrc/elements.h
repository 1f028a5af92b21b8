// Element types by the dtype code the Python side passes, shared by every
// instruction set.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "convert.h"
#include "fastnorm.h"

namespace fastnorm {

// Bits is an integer of the element's width whose order on |x| (sign bit
// cleared) is the order of the magnitudes, with inf above every finite value
// and NaN above inf: max |x| is an exact integer max that keeps NaN.
struct F32 {
  using T = float;
  using Bits = uint32_t;
  static constexpr int kCode = kFloat32;
  static constexpr Bits kAbsMask = 0x7FFFFFFFu;
  static constexpr Bits kFiniteBits = 0x7F7FFFFFu;  // the largest finite |x|
  static FASTNORM_INLINE double to_double(T x) { return double(x); }
  static FASTNORM_INLINE double from_bits(Bits b) { return double(bits_to_float(b)); }
};
struct F64 {
  using T = double;
  using Bits = int64_t;  // |x| bits are below 2^63: signed compares vectorize on AVX2
  static constexpr int kCode = kFloat64;
  static constexpr Bits kAbsMask = 0x7FFFFFFFFFFFFFFFll;
  static constexpr Bits kFiniteBits = 0x7FEFFFFFFFFFFFFFll;
  static FASTNORM_INLINE double to_double(T x) { return x; }
  static FASTNORM_INLINE double from_bits(Bits b) {
    double d;
    std::memcpy(&d, &b, sizeof d);
    return d;
  }
};
// 16-bit values are widened to float64 exactly, through float32: float16 with
// F16C (or convert.h), bfloat16 by placing its bits in the upper half of a
// float32. kFiniteBound = 2^128 is above every finite |x|: sum_pow_checked
// (kernels_impl.h) asks max |x| about sums that reach it (L1) or its square (L2).
struct F16 {
  using T = uint16_t;
  using Bits = uint16_t;
  static constexpr int kCode = kFloat16;
  static constexpr Bits kAbsMask = 0x7FFFu;
  static constexpr Bits kFiniteBits = 0x7BFFu;
  static constexpr double kFiniteBound = 0x1p128;
  static FASTNORM_INLINE double to_double(T x) { return double(half_to_float(x)); }
  static FASTNORM_INLINE double from_bits(Bits b) { return double(half_to_float(b)); }
};
struct BF16 {
  using T = uint16_t;
  using Bits = uint16_t;
  static constexpr int kCode = kBFloat16;
  static constexpr Bits kAbsMask = 0x7FFFu;
  static constexpr Bits kFiniteBits = 0x7F7Fu;
  static constexpr double kFiniteBound = 0x1p128;
  static FASTNORM_INLINE double to_double(T x) { return double(bf16_to_float(x)); }
  static FASTNORM_INLINE double from_bits(Bits b) { return double(bf16_to_float(b)); }
};

// The sums' loops (kernels_impl.h sum_pow, isa_avx2.h sum_bf16) may hand each
// stretch of at most kVisitBytes they have just read, in order and each
// element once, to a visitor while it is in L1: the statistics' counts
// (kernels_impl.h Counter) run there, inside the norm's own pass. NoVisit, the
// norm's, compiles to the loops without it.
struct NoVisit {
  FASTNORM_INLINE void operator()(const void*, int64_t) const {}
};
template <class V>
constexpr bool kVisits = !std::is_same_v<std::decay_t<V>, NoVisit>;
constexpr int64_t kVisitBytes = 8192;
// A visitor that also takes each block of kLanes elements as the loop reads it
// (block), then the stretch they form (stretch), instead of the stretch alone
// (a call): kernels_impl.h's Counter of the loop's own target.
template <class V, class = void>
struct VisitsBlocks : std::false_type {};
template <class V>
struct VisitsBlocks<V, std::void_t<decltype(std::declval<V&>().block(nullptr))>> : std::true_type {};
template <class V>
constexpr bool kVisitsBlocks = VisitsBlocks<std::decay_t<V>>::value;

}  // namespace fastnorm
