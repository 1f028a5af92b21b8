// AVX-512 (F, BW, VL, DQ) + FMA + F16C: two lane groups (lanes.h) per
// register, z[k] = (G_2k | G_2k+1). A piece's last, partial block is read
// through masked loads, which never touch memory past its end.
// Included by kernels.cpp inside namespace fastnorm::avx512, under a target pragma.

struct Acc {
  __m512d z[4];
};

FASTNORM_INLINE Acc acc_zero() {
  Acc a;
  for (__m512d& z : a.z) z = _mm512_setzero_pd();
  return a;
}

FASTNORM_INLINE double fold(const Acc& a) {
  const __m512d h01 = _mm512_add_pd(a.z[0], a.z[2]);  // (H0 | H1)
  const __m512d h23 = _mm512_add_pd(a.z[1], a.z[3]);  // (H2 | H3)
  const __m512d i = _mm512_add_pd(h01, h23);          // (I0 | I1)
  const __m256d j = _mm256_add_pd(_mm512_castpd512_pd256(i), _mm512_extractf64x4_pd(i, 1));
  const __m128d pairs = _mm_add_pd(_mm256_castpd256_pd128(j), _mm256_extractf128_pd(j, 1));
  return _mm_cvtsd_f64(_mm_add_sd(pairs, _mm_unpackhi_pd(pairs, pairs)));
}

// See isa_avx2.h: fused only where the square is exact.
template <int Power, bool ExactSquare>
FASTNORM_INLINE __m512d step(__m512d acc, __m512d v) {
  if constexpr (Power == 2) {
    return ExactSquare ? _mm512_fmadd_pd(v, v, acc) : _mm512_add_pd(acc, _mm512_mul_pd(v, v));
  } else {
    return _mm512_add_pd(acc, _mm512_abs_pd(v));
  }
}

// Eight 16-bit values to float32, exactly: float16 by F16C, bfloat16 by its bits widened (each one's
// bits are the high half of its float32's).
template <class E>
FASTNORM_INLINE __m256 halves_to_float(__m128i h) {
  if constexpr (E::kCode == kBFloat16) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(h);
  }
}

// float64, float16, and the float32 and bfloat16 of the statistics' pass
// (kOwnVisited below): the others run the AVX2 loops (kSumElsewhere below).
// Eight halves to floats (F16C, from memory, or bfloat16's bits widened) to
// doubles per register, or eight floats to doubles: element e goes to lane e.
template <class E, int Power>
FASTNORM_INLINE void add_block(Acc& a, const typename E::T* x) {
  for (int k = 0; k < 4; ++k) {
    if constexpr (E::kCode == kFloat64) {
      a.z[k] = step<Power, false>(a.z[k], _mm512_loadu_pd(x + 8 * k));
    } else if constexpr (E::kCode == kFloat32) {
      a.z[k] = step<Power, true>(a.z[k], _mm512_cvtps_pd(_mm256_loadu_ps(x + 8 * k)));
    } else {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 8 * k));
      a.z[k] = step<Power, true>(a.z[k], _mm512_cvtps_pd(halves_to_float<E>(h)));
    }
  }
}

// float32 sums run the AVX2 loop: its 4-wide conversions from memory are
// faster on AMD Zen 4 than the 8-wide ones, which cross the 256-bit halves of
// the register (same lanes, same bits); bfloat16 sums run its float32-word
// loop (isa_avx2.h).
template <class E>
constexpr bool kSumElsewhere = E::kCode == kFloat32 || E::kCode == kBFloat16;
// But the statistics' pass sums float32 and bfloat16 here, where its counts (a
// visitor) inline into the loop: the 8-wide conversions take half the AVX2
// loop's micro-ops, which the counts need (Intel Sapphire Rapids: see
// docs/design.md), and the AVX2 word loop could only hand each chunk to the
// counts through a call, to be read again from L1 (bfloat16's tensor_stats /
// total_norm on AMD Zen 4: GPT-2 small 1.22 -> 1.03, Llama 300M 1.21 -> 1.04).
template <class E>
constexpr bool kOwnVisited = E::kCode == kFloat32 || E::kCode == kBFloat16;

// The norm alone (no visitor: a visited pass sums here, kOwnVisited).
template <class E, int Power, class Visit>
FASTNORM_INLINE double sum_elsewhere(const typename E::T* x, int64_t n, Visit& visit) {
  static_assert(!kVisits<Visit>, "a visited pass sums in this target's loop");
  return avx2::sum_pow<E, Power>(x, n, visit);
}

// The mask of the first n of `width` elements (n may be <= 0 or >= width).
FASTNORM_INLINE uint32_t first_n(int64_t n, int width) {
  return n <= 0 ? 0u : n >= width ? (width == 32 ? ~0u : (1u << width) - 1u) : (1u << n) - 1u;
}

template <class E, int Power>
FASTNORM_INLINE void add_tail(Acc& a, const typename E::T* x, int64_t n) {
  for (int k = 0; k < 4; ++k) {
    const __mmask8 m = __mmask8(first_n(n - 8 * k, 8));
    if constexpr (E::kCode == kFloat64) {
      a.z[k] = step<Power, false>(a.z[k], _mm512_maskz_loadu_pd(m, x + 8 * k));
    } else if constexpr (E::kCode == kFloat32) {
      a.z[k] = step<Power, true>(a.z[k], _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, x + 8 * k)));
    } else {
      const __m128i h = _mm_maskz_loadu_epi16(m, x + 8 * k);
      a.z[k] = step<Power, true>(a.z[k], _mm512_cvtps_pd(halves_to_float<E>(h)));
    }
  }
}

// The lanes are in lanes.h's order already.
template <class E>
FASTNORM_INLINE const Acc& canonical(const Acc& a) {
  return a;
}

// See isa_avx2.h, sixteen per 256-bit half.
FASTNORM_INLINE __m512i round_to_bf16(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i half_up = _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, half_up), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
  return _mm512_mask_blend_epi32(nan, rounded, _mm512_set1_epi32(0x7FC0));
}

template <class E>
FASTNORM_INLINE int64_t scale_blocks(uint16_t* x, int64_t n, float coef) {
  const __m512 c = _mm512_set1_ps(coef);
  int64_t i = 0;
  if constexpr (E::kCode == kFloat16) {
    for (; i + 16 <= n; i += 16) {
      auto* p = reinterpret_cast<__m256i*>(x + i);
      const __m512 f = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256(p)), c);
      _mm256_storeu_si256(p, _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT));
    }
  } else {
    const __m512i zero = _mm512_setzero_si512();
    for (; i + 32 <= n; i += 32) {
      const __m512i w = _mm512_loadu_si512(x + i);
      const __m512 lo = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, w)), c);
      const __m512 hi = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, w)), c);
      _mm512_storeu_si512(x + i, _mm512_packus_epi32(round_to_bf16(lo), round_to_bf16(hi)));
    }
  }
  return i;
}

// The counts' loop (kernels_impl.h, count_bits) over whole pairs of 64-byte
// registers: the magnitude bits' maximum and, as masked adds of 1 in lanes of
// the element's width, the zeros and the values below lo. The compiler's loop
// materialises each compare's mask as a register of ones before adding it (8
// vector operations a register against 6 here: 47 against 67 GB/s on a 512 KiB
// float32 piece in L2 on Zen 4). Integers, so every target's counts agree.
// Returns how many elements it read (a multiple of two registers); m, zeros and
// below are raised by what it found. n <= kCountBlock: a lane's count stays
// far below its type's range.
template <int Bytes>
struct CountLanes;
template <>
struct CountLanes<2> {
  static FASTNORM_INLINE __m512i max(__m512i a, __m512i b) { return _mm512_max_epi16(a, b); }
  static FASTNORM_INLINE __m512i min(__m512i a, __m512i b) { return _mm512_min_epi16(a, b); }
  static FASTNORM_INLINE __mmask32 zero(__m512i a) { return _mm512_testn_epi16_mask(a, a); }
  static FASTNORM_INLINE __mmask32 less(__m512i a, __m512i b) { return _mm512_cmplt_epi16_mask(a, b); }
  static FASTNORM_INLINE __m512i inc(__m512i c, __mmask32 k, __m512i one) { return _mm512_mask_add_epi16(c, k, c, one); }
  static FASTNORM_INLINE __m512i add(__m512i a, __m512i b) { return _mm512_add_epi16(a, b); }
  static FASTNORM_INLINE __m512i set1(int64_t v) { return _mm512_set1_epi16(int16_t(v)); }
};
template <>
struct CountLanes<4> {
  static FASTNORM_INLINE __m512i max(__m512i a, __m512i b) { return _mm512_max_epi32(a, b); }
  static FASTNORM_INLINE __m512i min(__m512i a, __m512i b) { return _mm512_min_epi32(a, b); }
  static FASTNORM_INLINE __mmask16 zero(__m512i a) { return _mm512_testn_epi32_mask(a, a); }
  static FASTNORM_INLINE __mmask16 less(__m512i a, __m512i b) { return _mm512_cmplt_epi32_mask(a, b); }
  static FASTNORM_INLINE __m512i inc(__m512i c, __mmask16 k, __m512i one) { return _mm512_mask_add_epi32(c, k, c, one); }
  static FASTNORM_INLINE __m512i add(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }
  static FASTNORM_INLINE __m512i set1(int64_t v) { return _mm512_set1_epi32(int32_t(v)); }
};
template <>
struct CountLanes<8> {
  static FASTNORM_INLINE __m512i max(__m512i a, __m512i b) { return _mm512_max_epi64(a, b); }
  static FASTNORM_INLINE __m512i min(__m512i a, __m512i b) { return _mm512_min_epi64(a, b); }
  static FASTNORM_INLINE __mmask8 zero(__m512i a) { return _mm512_testn_epi64_mask(a, a); }
  static FASTNORM_INLINE __mmask8 less(__m512i a, __m512i b) { return _mm512_cmplt_epi64_mask(a, b); }
  static FASTNORM_INLINE __m512i inc(__m512i c, __mmask8 k, __m512i one) { return _mm512_mask_add_epi64(c, k, c, one); }
  static FASTNORM_INLINE __m512i add(__m512i a, __m512i b) { return _mm512_add_epi64(a, b); }
  static FASTNORM_INLINE __m512i set1(int64_t v) { return _mm512_set1_epi64(v); }
};

template <class E>
FASTNORM_INLINE int64_t count_blocks(const typename E::Bits* x, int64_t n, int64_t lo, int64_t& m, int64_t& zeros,
                                     int64_t& below) {
  using S = std::make_signed_t<typename E::Bits>;
  using L = CountLanes<int(sizeof(S))>;
  constexpr int kWidth = 64 / int(sizeof(S));
  const __m512i mask = L::set1(int64_t(E::kAbsMask)), low = L::set1(lo), one = L::set1(1);
  __m512i m0 = _mm512_setzero_si512(), m1 = m0, z0 = m0, z1 = m0, b0 = m0, b1 = m0;
  int64_t i = 0;
  // The line prefetch_bytes() ahead of each two registers, as the sums' loops do (prefetch.h): 0, no prefetch,
  // where the hardware's prefetchers keep the memory busy alone (Zen 4).
  const int64_t ahead = prefetch_bytes();
  const int64_t stop = prefetch_stop<typename E::Bits>(n, ahead);
  for (; i + 2 * kWidth <= n; i += 2 * kWidth) {
    if (i + 2 * kWidth <= stop) prefetch_ahead<2 * kWidth * int(sizeof(S))>(x + i, ahead);
    const __m512i a0 = _mm512_and_si512(_mm512_loadu_si512(x + i), mask);
    const __m512i a1 = _mm512_and_si512(_mm512_loadu_si512(x + i + kWidth), mask);
    m0 = L::max(m0, a0);
    m1 = L::max(m1, a1);
    z0 = L::inc(z0, L::zero(a0), one);
    z1 = L::inc(z1, L::zero(a1), one);
    b0 = L::inc(b0, L::less(a0, low), one);
    b1 = L::inc(b1, L::less(a1, low), one);
  }
  // The two registers' lanes summed: at most 2 * kCountBlock / (2 * kWidth) a lane, far inside S.
  alignas(64) S top[kWidth], zs[kWidth], bs[kWidth];
  _mm512_store_si512(top, L::max(m0, m1));
  _mm512_store_si512(zs, L::add(z0, z1));
  _mm512_store_si512(bs, L::add(b0, b1));
  for (int j = 0; j < kWidth; ++j) {
    m = top[j] > m ? top[j] : m;
    zeros += zs[j];
    below += bs[j];
  }
  return i;
}

// The bounds' loop (kernels_impl.h, Counter) over whole pairs of registers:
// the largest magnitude bits, kept in lanes across stretches (folded once, by
// top()), and whether a stretch holds one below lo (its least, compared in
// lanes). scan returns how many elements it read.
template <class E>
struct Bounds {
  using S = std::make_signed_t<typename E::Bits>;
  using L = CountLanes<int(sizeof(S))>;
  static constexpr int kWidth = 64 / int(sizeof(S));
  static constexpr bool kBlocks = true;
  __m512i m = _mm512_setzero_si512();
  __m512i least = L::set1(int64_t(E::kAbsMask));  // of the stretch the blocks are in

  // A block of kLanes elements (whole registers), as the sum reads it.
  FASTNORM_INLINE void block(const typename E::Bits* x) {
    const __m512i mask = L::set1(int64_t(E::kAbsMask));
    for (int r = 0; r < kLanes / kWidth; ++r) {
      const __m512i a = _mm512_and_si512(_mm512_loadu_si512(x + r * kWidth), mask);
      m = L::max(m, a);
      least = L::min(least, a);
    }
  }

  // Whether the stretch of the blocks since the last call held a value below lo.
  FASTNORM_INLINE bool stretch_low(int64_t lo) {
    const bool low = L::less(least, L::set1(lo)) != 0;
    least = L::set1(int64_t(E::kAbsMask));
    return low;
  }

  FASTNORM_INLINE int64_t scan(const typename E::Bits* x, int64_t n, int64_t lo, bool& low) {
    const __m512i mask = L::set1(int64_t(E::kAbsMask));
    __m512i m0 = m, m1 = m, l0 = mask, l1 = mask;
    int64_t i = 0;
    for (; i + 2 * kWidth <= n; i += 2 * kWidth) {
      const __m512i a0 = _mm512_and_si512(_mm512_loadu_si512(x + i), mask);
      const __m512i a1 = _mm512_and_si512(_mm512_loadu_si512(x + i + kWidth), mask);
      m0 = L::max(m0, a0);
      m1 = L::max(m1, a1);
      l0 = L::min(l0, a0);
      l1 = L::min(l1, a1);
    }
    m = L::max(m0, m1);
    low = L::less(L::min(l0, l1), L::set1(lo)) != 0;
    return i;
  }

  int64_t top() const {
    alignas(64) S lanes[kWidth];
    _mm512_store_si512(lanes, m);
    S t = 0;
    for (S v : lanes) t = v > t ? v : t;
    return t;
  }
};
