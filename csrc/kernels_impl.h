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
// overflow there. A visitor (elements.h, here a Counter) gets each whole block
// as it is summed (block), each stretch of kVisitBytes of them (stretch), then
// the tail (a call); the lanes and their order are the same with or without
// one, so are the bits.
template <class E, int Power, class Visit = NoVisit>
FASTNORM_INLINE double sum_pow(const typename E::T* x, int64_t n, Visit&& visit = Visit{}) {
  using T = typename E::T;
  if constexpr (kSumElsewhere<E> && !(kVisits<Visit> && kOwnVisited<E>)) {
    return (sum_elsewhere<E, Power>)(x, n, visit);  // parenthesised: no look-up in the visitor's namespace
  } else {
    Acc acc = acc_zero();
    int64_t i = 0;
    const int64_t ahead = prefetch_bytes();
    const int64_t stop = prefetch_stop<T>(n, ahead);
    if constexpr (kVisits<Visit>) {
      constexpr int64_t kStretch = kVisitBytes / int64_t(sizeof(T));  // a multiple of kLanes
      const int64_t whole = n - n % kLanes;
      for (int64_t c = 0; c < whole; c += kStretch) {
        const int64_t end = std::min(whole, c + kStretch);
        for (i = c; i < end; i += kLanes) {
          if (i + kLanes <= stop) prefetch_ahead<kLanes * int(sizeof(T))>(x + i, ahead);
          add_block<E, Power>(acc, x + i);
          visit.block(x + i);
        }
        visit.stretch(x + c, end - c);
      }
      i = whole;
    } else {
      for (; i + kLanes <= stop; i += kLanes) {
        prefetch_ahead<kLanes * int(sizeof(T))>(x + i, ahead);
        add_block<E, Power>(acc, x + i);
      }
      for (; i + kLanes <= n; i += kLanes) add_block<E, Power>(acc, x + i);
    }
    if (i < n) {
      add_tail<E, Power>(acc, x + i, n - i);
      visit(x + i, n - i);
    }
    return fold(canonical<E>(acc));
  }
}

// sum_pow with the sums of 16-bit values checked: where an element is inf or
// NaN, the bfloat16 loop of isa_avx2.h may give NaN for inf (the float32 word
// of an inf and its neighbour is a NaN), so a sum that is NaN, inf or at least
// kFiniteBound (L1) or its square (L2) is answered by max |x| when that is inf
// or NaN. Other sums are exact already.
template <class E, int Power, class Visit = NoVisit>
FASTNORM_INLINE double sum_pow_checked(const typename E::T* x, int64_t n, Visit&& visit = Visit{});

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

template <class E, int Power, class Visit>
FASTNORM_INLINE double sum_pow_checked(const typename E::T* x, int64_t n, Visit&& visit) {
  const double s = sum_pow<E, Power>(x, n, visit);
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

// The L2 partial of a piece, as reduce_as adds it (visit: see sum_pow).
template <class E, class Visit = NoVisit>
FASTNORM_INLINE Partial l2_partial(const void* ptr, int64_t n, Visit&& visit = Visit{}) {
  const double s = sum_pow_checked<E, 2>(static_cast<const typename E::T*>(ptr), n, visit);
  if constexpr (E::kCode == kFloat64) {
    if (!in_plain_l2_range(s)) return l2_scaled(static_cast<const double*>(ptr), n, s);
  }
  return {0.0, s};
}

template <class E>
FASTNORM_INLINE void reduce_as(int mode, double p, const void* ptr, int64_t n, Partial& acc) {
  const auto* x = static_cast<const typename E::T*>(ptr);
  switch (mode) {
    case kL2:
      merge_l2(acc, l2_partial<E>(ptr, n));
      return;
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
// (l2_partial, the code reduce_as runs in mode L2, so the same bits); the
// maximum and the counts come from the bits of each stretch of it that the
// sum's loop has just read (Counter, its visitor: elements.h), from L1, inside
// the norm's pass: the memory keeps streaming while they run.
//
// The counts read each element's magnitude bits (E::Bits with the sign
// cleared), whose order is that of the magnitudes, with inf and NaN above
// every finite value, so every count is an integer compare and the largest
// magnitude an integer max: zeros (a == 0) and values below lo (zeros
// included), the two counts every piece needs. Only a piece whose largest
// magnitude is above hi holds values above the margin or non-finite ones:
// count_high reads it once more for those (and for the largest finite one).
// One plain loop with scalar accumulators of the element's width, which the
// compiler turns into vector lanes of that width (an explicit array of lanes,
// as here before, was vectorized across lanes with permutes and spills: 4.4 G
// float32/s on Zen 4 against 12 G for the 1-D loop), or the target's
// count_blocks. The counts are unsigned of the element's width, summed into
// int64 every stretch of at most kCountBlock elements, before a 16-bit count
// could wrap. The bits are below the sign bit, so signed compares serve, which
// vectorize on every target.
constexpr int64_t kCountBlock = 32768;  // < 2^16: a 16-bit count of one block cannot wrap
static_assert(kVisitBytes / 2 + kLanes <= kCountBlock, "a visited stretch (and a tail) fits one count block");

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

// The largest magnitude bits, the zeros and the values below lo of the
// stretches it is given, each of at most kCountBlock elements. Inlined into
// the sums' loops of its target (a visited pass never sums in another's:
// isa_avx512.h, kOwnVisited).
template <class E>
struct Counter {
  using S = std::make_signed_t<typename E::Bits>;
  using U = std::make_unsigned_t<typename E::Bits>;
  int64_t lo;
  int64_t m = 0, zeros = 0, below = 0;
  Bounds<E> bounds{};  // the target's lanes of the bounds' loop

  // A stretch: its largest and smallest magnitude first (three vector
  // operations a register); only a stretch whose smallest is below lo holds a
  // zero or a value below the smallest normal, and only such a stretch is
  // counted, from L1.
  // In the sum's own loop (kernels_impl.h sum_pow): each block of kLanes
  // elements as it is summed, then their stretch. A target whose Bounds read
  // blocks decides the stretch from its lanes; the others scan it.
  FASTNORM_INLINE void block(const void* ptr) {
    if constexpr (Bounds<E>::kBlocks) bounds.block(static_cast<const typename E::Bits*>(ptr));
  }
  FASTNORM_INLINE void stretch(const void* ptr, int64_t n) {
    if constexpr (Bounds<E>::kBlocks) {
      if (bounds.stretch_low(lo)) count(static_cast<const typename E::Bits*>(ptr), n);
    } else {
      (*this)(ptr, n);
    }
  }

  FASTNORM_INLINE void operator()(const void* ptr, int64_t n) {
    const auto* x = static_cast<const typename E::Bits*>(ptr);
    bool low = false;
    const int64_t seen = bounds.scan(x, n, lo, low);
    S top = S(m), bottom = std::numeric_limits<S>::max();
    for (int64_t k = seen; k < n; ++k) {
      const S a = S(x[k] & E::kAbsMask);
      top = a > top ? a : top;
      bottom = a < bottom ? a : bottom;
    }
    m = top;
    if (!low && bottom >= S(lo)) return;
    count(x, n);
  }

  FASTNORM_INLINE void count(const typename E::Bits* x, int64_t n) {
    const int64_t done = count_blocks<E>(x, n, lo, m, zeros, below);
    const S low = S(lo);
    S top = S(m);
    U z = 0, b = 0;  // at most kCountBlock each: exact in U, which wraps (never overflows) lane by lane
    for (int64_t k = done; k < n; ++k) {
      const S a = S(x[k] & E::kAbsMask);
      top = a > top ? a : top;
      z = U(z + U(a == 0));
      b = U(b + U(a < low));
    }
    m = top;
    zeros += z;
    below += b;
  }

  // The statistics of the piece of n elements at ptr it has seen whole.
  void finish(const void* ptr, int64_t n, int64_t hi, Stats& st) {
    m = std::max(m, bounds.top());
    st.zeros = zeros;
    st.subnormal = below - zeros;  // lo > 0: every zero is below it
    if (m > hi) {
      count_high<E>(static_cast<const typename E::Bits*>(ptr), n, hi, st);
    } else {
      st.max_abs = E::from_bits(typename E::Bits(m));
      st.nonfinite = st.overflow = 0;
    }
  }
};

// The counts alone (mode kCountsOnly).
template <class E>
FASTNORM_NOINLINE void count_bits(const void* ptr, int64_t n, const Limits& lim, Stats& st) {
  Counter<E> counter{lim.lo};
  const auto* x = static_cast<const typename E::Bits*>(ptr);
  for (int64_t i = 0; i < n; i += kCountBlock) counter.count(x + i, std::min(n, i + kCountBlock) - i);
  counter.finish(ptr, n, lim.hi, st);
}

// The statistics of a piece into st, and its partial of the norm (mode) into
// acc, as reduce_piece adds it: the counts in the sum of squares' pass; the
// other norms read the piece again (from L2: a piece is at most a task, 256 KiB).
template <class E>
FASTNORM_INLINE void stats_as(int mode, double p, const void* ptr, int64_t n, const Limits& lim, Partial& acc,
                              Stats& st) {
  if (mode == kCountsOnly) return count_bits<E>(ptr, n, lim, st);
  Counter<E> counter{lim.lo};
  merge_l2(st.l2, l2_partial<E>(ptr, n, counter));
  counter.finish(ptr, n, lim.hi, st);
  if (mode == kL2) {
    merge_l2(acc, st.l2);
  } else {
    reduce_as<E>(mode, p, ptr, n, acc);
  }
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
