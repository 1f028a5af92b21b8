// The per-element loops, compiled once per instruction set.
//
// kernels.cpp includes this file inside one namespace per target (generic,
// avx2, avx512), after that target's isa_*.h, which defines:
//   Acc, acc_zero(), fold(acc)          the 32 float64 lanes of lanes.h
//   add_block<E, Power>(acc, x)         adds |x_j|^Power of 32 elements to lane j
//   add_tail<E, Power>(acc, x, n)       the same for the first n < 32 of them
//   canonical<E>(acc)                   the lanes in lanes.h's order, for the fold
//   kSumElsewhere<E>, sum_elsewhere     a sum another target's loop does better
//   scale_blocks<E>(x, n, coef)         x *= coef over whole blocks of 16-bit values
//   count_blocks<E>(x, n, lo, ...)      count_bits' maximum and counts over whole blocks
// Everything that decides a result's bits (which lane takes which element, the
// order of the additions, the fold) is the same in every target, so they all
// agree bit for bit; the result never depends on the thread count either.
// Do not include headers here: everything it needs is included before.

constexpr int64_t kPowTile = 256;

// sum |x|^2 (Power == 2) or sum |x| (Power == 1), accumulated in double: the
// square of any float32 or 16-bit value is exact in double and cannot
// overflow there.
template <class E, int Power>
FASTNORM_INLINE double sum_pow(const typename E::T* x, int64_t n) {
  if constexpr (kSumElsewhere<E>) {
    return sum_elsewhere<E, Power>(x, n);
  } else {
    Acc acc = acc_zero();
    int64_t i = 0;
    const int64_t ahead = prefetch_bytes();
    for (const int64_t stop = prefetch_stop<typename E::T>(n, ahead); i + kLanes <= stop; i += kLanes) {
      prefetch_ahead<kLanes * int(sizeof(typename E::T))>(x + i, ahead);
      add_block<E, Power>(acc, x + i);
    }
    for (; i + kLanes <= n; i += kLanes) add_block<E, Power>(acc, x + i);
    if (i < n) add_tail<E, Power>(acc, x + i, n - i);
    return fold(canonical<E>(acc));
  }
}

// sum_pow with the sums of 16-bit values checked: where an element is inf or
// NaN, the bfloat16 loop of isa_avx2.h may give NaN for inf (the float32 word
// of an inf and its neighbour is a NaN), so a sum that is NaN, inf or at least
// kFiniteBound (L1) or its square (L2) is answered by max |x| when that is inf
// or NaN. Other sums are exact already.
template <class E, int Power>
FASTNORM_INLINE double sum_pow_checked(const typename E::T* x, int64_t n);

// max |x|, NaN if any x is NaN: an integer max over the bits with the sign
// cleared, which orders magnitudes exactly and puts NaN above everything
// (std::max and fmax both drop NaN; this cannot).
template <class E>
FASTNORM_INLINE double max_abs(const void* ptr, int64_t n) {
  using B = typename E::Bits;
  constexpr int kMaxLanes = 16;
  const auto* x = static_cast<const B*>(ptr);
  B acc[kMaxLanes] = {};
  int64_t i = 0;
  for (; i + kMaxLanes <= n; i += kMaxLanes) {
    for (int j = 0; j < kMaxLanes; ++j) {
      const B a = B(x[i + j] & E::kAbsMask);
      acc[j] = a > acc[j] ? a : acc[j];
    }
  }
  B m = 0;
  for (; i < n; ++i) {
    const B a = B(x[i] & E::kAbsMask);
    m = a > m ? a : m;
  }
  for (int j = 0; j < kMaxLanes; ++j) m = acc[j] > m ? acc[j] : m;
  return E::from_bits(m);
}

template <class E, int Power>
FASTNORM_INLINE double sum_pow_checked(const typename E::T* x, int64_t n) {
  const double s = sum_pow<E, Power>(x, n);
  if constexpr (sizeof(typename E::T) == 2) {
    // s != s, not !(s < bound): an ordered compare with NaN raises the invalid
    // exception, and this NaN may be the word loop's, not the caller's.
    if (s != s || s >= (Power == 2 ? E::kFiniteBound * E::kFiniteBound : E::kFiniteBound)) {
      const double top = max_abs<E>(x, n);
      if (!(top < INFINITY)) return top;
    }
  }
  return s;
}

// The L2 partial of float64 values whose plain sum of squares `plain` is out
// of kPlainL2 (overflowed, or so small that squares may have underflowed):
// sum (x / scale)^2 with scale a power of two near max |x|, on the same lanes
// and fold as the plain sum. Dividing by a power of two is exact but where a
// quotient underflows, and those are below 2^-1022 of the largest term.
// Pieces whose plain sum is 0, inf (an inf element) or NaN are what they are.
FASTNORM_NOINLINE Partial l2_scaled(const double* x, int64_t n, double plain) {
  const double top = plain != plain ? 0.0 : max_abs<F64>(x, n);
  if (top == 0.0 || top == INFINITY) return {0.0, plain};
  const double scale = std::ldexp(1.0, std::min(std::max(std::ilogb(top), -1022), 1023));
  double lane[kLanes] = {};
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i] / scale;
    lane[i % kLanes] += v * v;
  }
  return {scale, fold_lanes(lane)};
}

template <class E>
FASTNORM_INLINE void reduce_as(int mode, double p, const void* ptr, int64_t n, Partial& acc) {
  const auto* x = static_cast<const typename E::T*>(ptr);
  switch (mode) {
    case kL2: {
      const double s = sum_pow_checked<E, 2>(x, n);
      if constexpr (E::kCode == kFloat64) {
        if (!in_plain_l2_range(s)) {
          merge_l2(acc, l2_scaled(static_cast<const double*>(ptr), n, s));
          return;
        }
      }
      merge_l2(acc, {0.0, s});
      return;
    }
    case kL1:
      acc.s += sum_pow_checked<E, 1>(x, n);
      return;
    case kLinf:
      acc.m = nan_max(acc.m, max_abs<E>(ptr, n));
      return;
    default:
      // General p: sum (|x| / tile_max)^p per tile, merged into a running
      // (max, scaled sum), so |x|^p never overflows or underflows. pow is the
      // same library call in every target, in the same order.
      for (int64_t t = 0; t < n; t += kPowTile) {
        const int64_t len = n - t < kPowTile ? n - t : kPowTile;
        const double tile_max = max_abs<E>(x + t, len);
        double tile_sum = 1.0;  // also the value for an inf tile: the norm is inf
        if (tile_max > 0.0 && tile_max < INFINITY) {
          tile_sum = 0.0;
          // Divided, not multiplied by 1 / tile_max: that overflows for the
          // smallest float64 values.
          for (int64_t i = 0; i < len; ++i) {
            tile_sum += std::pow(std::fabs(E::to_double(x[t + i])) / tile_max, p);
          }
        }
        merge_scaled(acc, tile_max, tile_sum, p);
      }
  }
}

// ---------------------------------------------------------------------------
// Statistics (fastnorm/_stats.py). A piece's sum of squares is the norm's own
// (reduce_as in mode L2: the same code, so the same bits); the maximum and the
// counts come from a second loop over the piece's bits, which the first has
// just brought into cache (a piece is at most a task, 256 KiB, inside L2).
//
// That loop reads each element's magnitude bits (E::Bits with the sign
// cleared), whose order is that of the magnitudes, with inf and NaN above
// every finite value, so every count is an integer compare and the largest
// magnitude an integer max: zeros (a == 0) and values below lo (zeros
// included), the two counts every piece needs. Only a piece whose largest
// magnitude is above hi holds values above the margin or non-finite ones:
// count_high reads it once more for those (and for the largest finite one).
// One plain loop with scalar accumulators of the element's width, which the
// compiler turns into vector lanes of that width (an explicit array of lanes,
// as here before, was vectorized across lanes with permutes and spills: 4.4 G
// float32/s on Zen 4 against 12 G for the 1-D loop). The counts are unsigned
// of the element's width, summed into int64 every kCountBlock elements, before a
// 16-bit count could wrap. The bits are below the sign bit, so signed compares
// serve, which vectorize on every target.
constexpr int64_t kCountBlock = 32768;  // < 2^16: a 16-bit count of one block cannot wrap

template <class E>
FASTNORM_NOINLINE void count_high(const typename E::Bits* x, int64_t n, int64_t hi, Stats& st) {
  using S = std::make_signed_t<typename E::Bits>;
  const S finite = S(E::kFiniteBits);
  S top = 0;
  int64_t above = 0, nonfinite = 0;
  for (int64_t i = 0; i < n; ++i) {
    const S a = S(x[i] & E::kAbsMask);
    const S shown = a > finite ? S(0) : a;
    top = shown > top ? shown : top;
    above += a > S(hi);
    nonfinite += a > finite;
  }
  st.max_abs = E::from_bits(typename E::Bits(top));
  st.nonfinite = nonfinite;
  st.overflow = above - nonfinite;  // hi <= the largest finite value
}

template <class E>
FASTNORM_NOINLINE void count_bits(const void* ptr, int64_t n, const Limits& lim, Stats& st) {
  using S = std::make_signed_t<typename E::Bits>;
  using U = std::make_unsigned_t<typename E::Bits>;
  const auto* x = static_cast<const typename E::Bits*>(ptr);
  const S lo = S(lim.lo);
  S m = 0;
  int64_t zeros = 0, below = 0;
  for (int64_t i = 0; i < n; i += kCountBlock) {
    const int64_t end = std::min(n, i + kCountBlock);
    int64_t wide = m;
    const int64_t done = count_blocks<E>(x + i, end - i, lim.lo, wide, zeros, below);
    m = S(wide);
    U z = 0, b = 0;  // at most kCountBlock each: exact in U, which wraps (never overflows) lane by lane
    for (int64_t k = i + done; k < end; ++k) {
      const S a = S(x[k] & E::kAbsMask);
      m = a > m ? a : m;
      z = U(z + U(a == 0));
      b = U(b + U(a < lo));
    }
    zeros += z;
    below += b;
  }
  st.zeros = zeros;
  st.subnormal = below - zeros;  // lo > 0: every zero is below it
  if (m > S(lim.hi)) {
    count_high<E>(x, n, lim.hi, st);
  } else {
    st.max_abs = E::from_bits(typename E::Bits(m));
    st.nonfinite = st.overflow = 0;
  }
}

// The statistics of a piece into st, and its partial of the norm (mode) into
// acc, as reduce_piece adds it.
template <class E>
FASTNORM_INLINE void stats_as(int mode, double p, const void* ptr, int64_t n, const Limits& lim, Partial& acc,
                              Stats& st) {
  if (mode == kCountsOnly) return count_bits<E>(ptr, n, lim, st);
  reduce_as<E>(kL2, p, ptr, n, st.l2);
  if (mode == kL2) {
    merge_l2(acc, st.l2);
  } else {
    reduce_as<E>(mode, p, ptr, n, acc);
  }
  count_bits<E>(ptr, n, lim, st);
}

inline void stats_piece(int dtype, int mode, double p, const void* ptr, int64_t n, const Limits& lim,
                        Partial& acc, Stats& st) {
  switch (dtype) {
    case kFloat32:
      return stats_as<F32>(mode, p, ptr, n, lim, acc, st);
    case kFloat64:
      return stats_as<F64>(mode, p, ptr, n, lim, acc, st);
    case kFloat16:
      return stats_as<F16>(mode, p, ptr, n, lim, acc, st);
    default:
      return stats_as<BF16>(mode, p, ptr, n, lim, acc, st);
  }
}

inline void reduce_piece(int dtype, int mode, double p, const void* ptr, int64_t n, Partial& acc) {
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

// x *= coef over float32 or float64 values, prefetching a line ahead of every
// 64 bytes while that stays inside the piece.
template <class T>
FASTNORM_INLINE void scale_plain(T* x, int64_t n, T coef) {
  constexpr int64_t kLine = 64 / int64_t(sizeof(T));
  const int64_t ahead = prefetch_bytes();
  int64_t i = 0;
  for (const int64_t stop = prefetch_stop<T>(n, ahead); i + kLine <= stop; i += kLine) {
    prefetch_ahead<64>(x + i, ahead);
    for (int64_t k = 0; k < kLine; ++k) x[i + k] *= coef;
  }
  for (; i < n; ++i) x[i] *= coef;
}

// In-place x *= coef, rounding 16-bit results like torch does.
inline void scale_piece(int dtype, void* ptr, int64_t n, float coef, double coef64) {
  switch (dtype) {
    case kFloat32:
      return scale_plain(static_cast<float*>(ptr), n, coef);
    case kFloat64:
      return scale_plain(static_cast<double*>(ptr), n, coef64);
    case kFloat16: {
      auto* x = static_cast<uint16_t*>(ptr);
      for (int64_t i = scale_blocks<F16>(x, n, coef); i < n; ++i) {
        x[i] = float_to_half(half_to_float(x[i]) * coef);
      }
      return;
    }
    default: {
      auto* x = static_cast<uint16_t*>(ptr);
      for (int64_t i = scale_blocks<BF16>(x, n, coef); i < n; ++i) {
        x[i] = float_to_bf16(bf16_to_float(x[i]) * coef);
      }
      return;
    }
  }
}
