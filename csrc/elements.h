// Element types by the dtype code the Python side passes, shared by every
// instruction set.
#pragma once

#include <cstdint>
#include <cstring>

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
  static FASTNORM_INLINE double to_double(T x) { return double(x); }
  static FASTNORM_INLINE double from_bits(Bits b) { return double(bits_to_float(b)); }
};
struct F64 {
  using T = double;
  using Bits = int64_t;  // |x| bits are below 2^63: signed compares vectorize on AVX2
  static constexpr int kCode = kFloat64;
  static constexpr Bits kAbsMask = 0x7FFFFFFFFFFFFFFFll;
  static FASTNORM_INLINE double to_double(T x) { return x; }
  static FASTNORM_INLINE double from_bits(Bits b) {
    double d;
    std::memcpy(&d, &b, sizeof d);
    return d;
  }
};
// bfloat16 and float32 values are widened to float64 with integer operations,
// several to a 64-bit word: element k of the word is shifted by
// kWidenShift[k] (left; right when negative) and masked with kWidenMask, which
// puts its exponent and mantissa on the float64's own, sign cleared. That
// float64 is exactly |x| * 2^-896 for every finite x, subnormals included, and
// one multiply by kWidenScale = 2^896 makes it |x|. inf and NaN become finite
// values of at least kFiniteBound = 2^128 instead, above every finite |x|: a
// sum that reaches kFiniteBound (L1) or its square (L2) is checked against
// max |x|. float16 values go through float32 first (F16C, exact), so that no
// float64 is subnormal: some CPUs take a hundred cycles over each such operand.
struct F32Pairs {
  static constexpr int kWidenShift[2] = {29, -3};
  static constexpr uint64_t kWidenMask = 0x0FFFFFFFE0000000ull;
  static constexpr double kWidenScale = 0x1p896;
};

struct F16 {
  using T = uint16_t;
  using Bits = uint16_t;
  static constexpr int kCode = kFloat16;
  static constexpr Bits kAbsMask = 0x7FFFu;
  static constexpr double kFiniteBound = 0x1p128;
  static FASTNORM_INLINE double to_double(T x) { return double(half_to_float(x)); }
  static FASTNORM_INLINE double from_bits(Bits b) { return double(half_to_float(b)); }
};
struct BF16 {
  using T = uint16_t;
  using Bits = uint16_t;
  static constexpr int kCode = kBFloat16;
  static constexpr Bits kAbsMask = 0x7FFFu;
  static constexpr int kWidenShift[4] = {45, 29, 13, -3};
  static constexpr uint64_t kWidenMask = 0x0FFFE00000000000ull;  // the same bits as F32Pairs
  static constexpr double kWidenScale = 0x1p896;
  static constexpr double kFiniteBound = 0x1p128;
  static FASTNORM_INLINE double to_double(T x) { return double(bf16_to_float(x)); }
  static FASTNORM_INLINE double from_bits(Bits b) { return double(bf16_to_float(b)); }
};

}  // namespace fastnorm
