// The per-element loops, compiled once per instruction set.
//
// kernels.cpp includes this file inside one namespace per target (generic, and
// avx2+fma+f16c on x86-64 under a target pragma) and picks one at run time, so
// a single build runs everywhere and still uses the wide vectors where present.
// Each namespace first defines five hooks:
//   half_block_to_double(const uint16_t* x, double* out)  kLanes halves -> doubles
//   bf16_block_to_double(const uint16_t* x, double* out)  kLanes bfloat16 -> doubles
//   half_block_to_float(const uint16_t* x, float* out)    kLanes halves -> floats
//   float_block_to_half(const float* x, uint16_t* out)    kLanes floats -> halves (RNE)
//   muladd(a, b, c)                                       a * b + c
// Do not include headers here: everything it needs is included before.
//
// Every loop keeps kLanes independent accumulators so that the compiler can
// vectorize the reduction without -ffast-math, and combines them in a fixed
// order: the result depends only on the data, never on the thread count.

constexpr int64_t kPowTile = 256;

// Element types by the dtype code the Python side passes. kPlain types are
// read in place as double; the 16-bit ones go through the ISA hooks. Bits is
// an integer of the same width, whose order on |x| (sign bit cleared) is the
// order of the magnitudes, with inf above every finite value and NaN above inf.
struct F32 {
  using T = float;
  using Bits = uint32_t;
  static constexpr bool kPlain = true;
  static constexpr Bits kAbsMask = 0x7FFFFFFFu;
  static FASTNORM_INLINE double from_bits(Bits b) { return double(bits_to_float(b)); }
};
struct F64 {
  using T = double;
  using Bits = int64_t;  // |x| bits are below 2^63: signed compares vectorize on AVX2
  static constexpr bool kPlain = true;
  static constexpr Bits kAbsMask = 0x7FFFFFFFFFFFFFFFll;
  static FASTNORM_INLINE double from_bits(Bits b) {
    double d;
    std::memcpy(&d, &b, sizeof d);
    return d;
  }
};
struct F16 {
  using T = uint16_t;
  using Bits = uint16_t;
  static constexpr bool kPlain = false;
  static constexpr Bits kAbsMask = 0x7FFFu;
  static FASTNORM_INLINE void widen(const T* x, double* out) { half_block_to_double(x, out); }
  static FASTNORM_INLINE double from_bits(Bits b) { return double(half_to_float(b)); }
};
struct BF16 {
  using T = uint16_t;
  using Bits = uint16_t;
  static constexpr bool kPlain = false;
  static constexpr Bits kAbsMask = 0x7FFFu;
  static FASTNORM_INLINE void widen(const T* x, double* out) { bf16_block_to_double(x, out); }
  static FASTNORM_INLINE double from_bits(Bits b) { return double(bf16_to_float(b)); }
};

// kLanes values of x as doubles. Plain types stay where they are (a copy
// through the stack would stall on store forwarding); 16-bit ones are widened
// into `buf` by whole vectors, read back at the width they were written.
template <class E>
FASTNORM_INLINE void load_block(const typename E::T* x, double (&buf)[kLanes]) {
  if constexpr (E::kPlain) {
    for (int j = 0; j < kLanes; ++j) buf[j] = double(x[j]);
  } else {
    E::widen(x, buf);
  }
}

// The first n (< kLanes) values of x, padded with zeros.
template <class E>
FASTNORM_INLINE void pad_block(const typename E::T* x, int64_t n, typename E::T (&out)[kLanes]) {
  for (int j = 0; j < kLanes; ++j) out[j] = j < n ? x[j] : typename E::T(0);
}

// Pairwise, in a fixed order, written out: a loop here costs more than the
// arithmetic for the many tensors of a few elements.
FASTNORM_INLINE double fold(const double (&acc)[kLanes]) {
  static_assert(kLanes == 16, "fold is written for 16 lanes");
  double half[8], quarter[4];
  for (int j = 0; j < 8; ++j) half[j] = acc[j] + acc[j + 8];
  for (int j = 0; j < 4; ++j) quarter[j] = half[j] + half[j + 4];
  return (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
}

// acc[j] (+)= |x_j|^Power for one block. The first block initializes the
// lanes (0 + y is y): zeroing them first costs more than the arithmetic for
// tensors of a few elements.
template <class E, int Power, bool First>
FASTNORM_INLINE void accumulate_block(double (&acc)[kLanes], const typename E::T* x) {
  const auto step = [&](int j, double v) {
    const double base = First ? 0.0 : acc[j];
    acc[j] = Power == 2 ? muladd(v, v, base) : base + std::fabs(v);
  };
  if constexpr (E::kPlain) {
    for (int j = 0; j < kLanes; ++j) step(j, double(x[j]));
  } else {
    double v[kLanes];
    E::widen(x, v);
    for (int j = 0; j < kLanes; ++j) step(j, v[j]);
  }
}

// sum |x|^2 (Power == 2) or sum |x| (Power == 1), accumulated in double: the
// square of any float32 is exact in double and cannot overflow there.
template <class E, int Power>
FASTNORM_INLINE double sum_pow(const typename E::T* x, int64_t n) {
  double acc[kLanes];
  typename E::T padded[kLanes];
  if (n < kLanes) {
    pad_block<E>(x, n, padded);
    accumulate_block<E, Power, true>(acc, padded);
    return fold(acc);
  }
  accumulate_block<E, Power, true>(acc, x);
  int64_t i = kLanes;
  for (; i + kLanes <= n; i += kLanes) accumulate_block<E, Power, false>(acc, x + i);
  if (i < n) {
    pad_block<E>(x + i, n - i, padded);
    accumulate_block<E, Power, false>(acc, padded);
  }
  return fold(acc);
}

// max |x|, NaN if any x is NaN: an integer max over the bits with the sign
// cleared, which orders magnitudes exactly and puts NaN above everything
// (std::max and fmax both drop NaN; this cannot).
template <class E>
FASTNORM_INLINE double max_abs(const void* ptr, int64_t n) {
  using B = typename E::Bits;
  const auto* x = static_cast<const B*>(ptr);
  B acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const B a = B(x[i + j] & E::kAbsMask);
      acc[j] = a > acc[j] ? a : acc[j];
    }
  }
  B m = 0;
  for (; i < n; ++i) {
    const B a = B(x[i] & E::kAbsMask);
    m = a > m ? a : m;
  }
  for (int j = 0; j < kLanes; ++j) m = acc[j] > m ? acc[j] : m;
  return E::from_bits(m);
}

template <class E>
FASTNORM_INLINE void reduce_as(int mode, double p, const void* ptr, int64_t n, Acc& acc) {
  const auto* x = static_cast<const typename E::T*>(ptr);
  switch (mode) {
    case kL2:
      acc.s += sum_pow<E, 2>(x, n);
      return;
    case kL1:
      acc.s += sum_pow<E, 1>(x, n);
      return;
    case kLinf:
      acc.m = nan_max(acc.m, max_abs<E>(ptr, n));
      return;
    default:
      // General p: sum (|x| / tile_max)^p per tile, merged into a running
      // (max, scaled sum), so |x|^p never overflows or underflows.
      for (int64_t t = 0; t < n; t += kPowTile) {
        const int64_t len = n - t < kPowTile ? n - t : kPowTile;
        const double tile_max = max_abs<E>(x + t, len);
        double tile_sum = 1.0;  // also the value for an inf tile: the norm is inf
        if (tile_max > 0.0 && tile_max < INFINITY) {
          tile_sum = 0.0;
          // Divided, not multiplied by 1 / tile_max: that overflows for the
          // smallest float64 values.
          double v[kLanes];
          typename E::T padded[kLanes];
          for (int64_t i = 0; i < len; i += kLanes) {
            if (len - i >= kLanes) {
              load_block<E>(x + t + i, v);
            } else {
              pad_block<E>(x + t + i, len - i, padded);
              load_block<E>(padded, v);
            }
            for (int j = 0; j < kLanes; ++j) tile_sum += std::pow(std::fabs(v[j]) / tile_max, p);
          }
        }
        merge_scaled(acc, tile_max, tile_sum, p);
      }
  }
}

inline void reduce_piece(int dtype, int mode, double p, const void* ptr, int64_t n, Acc& acc) {
  switch (dtype) {
    case kFloat32:
      return reduce_as<F32>(mode, p, ptr, n, acc);
    case kFloat64:
      return reduce_as<F64>(mode, p, ptr, n, acc);
    case kFloat16:
      return reduce_as<F16>(mode, p, ptr, n, acc);
    default:
      return reduce_as<BF16>(mode, p, ptr, n, acc);
  }
}

// In-place x *= coef for halves: whole blocks through the hooks, the tail
// through the portable conversions (both round like c10::Half).
FASTNORM_INLINE void scale_half(uint16_t* x, int64_t n, float coef) {
  float v[kLanes];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    half_block_to_float(x + i, v);
    for (int j = 0; j < kLanes; ++j) v[j] *= coef;
    float_block_to_half(v, x + i);
  }
  for (; i < n; ++i) x[i] = float_to_half(half_to_float(x[i]) * coef);
}

// In-place x *= coef, rounding 16-bit results like torch does.
inline void scale_piece(int dtype, void* ptr, int64_t n, float coef, double coef64) {
  switch (dtype) {
    case kFloat32: {
      auto* x = static_cast<float*>(ptr);
      for (int64_t i = 0; i < n; ++i) x[i] *= coef;
      return;
    }
    case kFloat64: {
      auto* x = static_cast<double*>(ptr);
      for (int64_t i = 0; i < n; ++i) x[i] *= coef64;
      return;
    }
    case kFloat16:
      return scale_half(static_cast<uint16_t*>(ptr), n, coef);
    default: {
      auto* x = static_cast<uint16_t*>(ptr);
      for (int64_t i = 0; i < n; ++i) x[i] = float_to_bf16(bf16_to_float(x[i]) * coef);
      return;
    }
  }
}
