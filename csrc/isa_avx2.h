// AVX2 + FMA + F16C: one 4-double register per lane group (lanes.h).
// Included by kernels.cpp inside namespace fastnorm::avx2, under a target pragma.

struct Acc {
  __m256d g[kGroups];
};

FASTNORM_INLINE Acc acc_zero() {
  Acc a;
  for (__m256d& g : a.g) g = _mm256_setzero_pd();
  return a;
}

FASTNORM_INLINE double fold(const Acc& a) {
  __m256d h[4], i[2];
  for (int k = 0; k < 4; ++k) h[k] = _mm256_add_pd(a.g[k], a.g[k + 4]);
  for (int k = 0; k < 2; ++k) i[k] = _mm256_add_pd(h[k], h[k + 2]);
  const __m256d j = _mm256_add_pd(i[0], i[1]);
  const __m128d pairs = _mm_add_pd(_mm256_castpd256_pd128(j), _mm256_extractf128_pd(j, 1));
  return _mm_cvtsd_f64(_mm_add_sd(pairs, _mm_unpackhi_pd(pairs, pairs)));
}

// acc + v^2 or acc + |v|. Fused where the square is exact (float32 and 16-bit
// inputs), which gives the bits of a separate multiply and add; float64
// squares round, so they are multiplied and added apart, as everywhere else.
template <int Power, bool ExactSquare>
FASTNORM_INLINE __m256d step(__m256d acc, __m256d v) {
  if constexpr (Power == 2) {
    return ExactSquare ? _mm256_fmadd_pd(v, v, acc) : _mm256_add_pd(acc, _mm256_mul_pd(v, v));
  } else {
    return _mm256_add_pd(acc, _mm256_andnot_pd(_mm256_set1_pd(-0.0), v));
  }
}

// Element k of every 64-bit word of w, widened (elements.h): |x| * 2^-896.
template <class W, int K>
FASTNORM_INLINE __m256d widen(__m256i w) {
  constexpr int shift = W::kWidenShift[K];
  const __m256i moved = shift >= 0 ? _mm256_slli_epi64(w, shift) : _mm256_srli_epi64(w, -shift);
  return _mm256_castsi256_pd(_mm256_and_si256(moved, _mm256_set1_epi64x(int64_t(W::kWidenMask))));
}

// Adds element k of every word of w, widened, to lane group `group`.
template <class W, int Power, int K>
FASTNORM_INLINE void add_widened(Acc& a, int group, __m256i w) {
  const __m256d v = _mm256_mul_pd(widen<W, K>(w), _mm256_set1_pd(W::kWidenScale));
  a.g[group] = step<Power, true>(a.g[group], v);
}

template <class E, int Power>
FASTNORM_INLINE void add_block(Acc& a, const typename E::T* x) {
  if constexpr (E::kCode == kFloat64) {
    for (int k = 0; k < kGroups; ++k) a.g[k] = step<Power, false>(a.g[k], _mm256_loadu_pd(x + 4 * k));
  } else if constexpr (E::kCode == kFloat32) {
    // Converted straight from memory: on some cores (AMD Zen 4) twice as fast
    // as converting a register.
    for (int k = 0; k < kGroups; ++k) {
      a.g[k] = step<Power, true>(a.g[k], _mm256_cvtps_pd(_mm_loadu_ps(x + 4 * k)));
    }
  } else if constexpr (E::kCode == kFloat16) {
    // Eight halves to floats per quarter q: element 8q + 2j + k goes to group 4k + q.
    for (int q = 0; q < 4; ++q) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 8 * q));
      const __m256i w = _mm256_castps_si256(_mm256_cvtph_ps(h));
      add_widened<F32Pairs, Power, 0>(a, q, w);
      add_widened<F32Pairs, Power, 1>(a, 4 + q, w);
    }
  } else {
    // Sixteen bfloat16 per half h: element 16h + 4j + k goes to group 2k + h.
    for (int h = 0; h < 2; ++h) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16 * h));
      add_widened<E, Power, 0>(a, h, w);
      add_widened<E, Power, 1>(a, 2 + h, w);
      add_widened<E, Power, 2>(a, 4 + h, w);
      add_widened<E, Power, 3>(a, 6 + h, w);
    }
  }
}

// Every sum runs the loop of kernels_impl.h here.
template <class E>
constexpr bool kSumElsewhere = false;

template <class E, int Power>
FASTNORM_INLINE double sum_elsewhere(const typename E::T*, int64_t) {
  return 0.0;
}

// The lanes are in lanes.h's order already.
template <class E>
FASTNORM_INLINE const Acc& canonical(const Acc& a) {
  return a;
}

template <class E, int Power>
FASTNORM_INLINE void add_tail(Acc& a, const typename E::T* x, int64_t n) {
  alignas(32) typename E::T padded[kLanes] = {};
  std::memcpy(padded, x, size_t(n) * sizeof(typename E::T));
  add_block<E, Power>(a, padded);
}

// Rounds float32 values to bfloat16 like c10::BFloat16 (convert.h), eight
// per 128-bit half, and packs them back in the order unpack took them apart.
FASTNORM_INLINE __m256i round_to_bf16(__m256 f) {
  const __m256i u = _mm256_castps_si256(f);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i half_up = _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, half_up), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan);
}

template <class E>
FASTNORM_INLINE int64_t scale_blocks(uint16_t* x, int64_t n, float coef) {
  const __m256 c = _mm256_set1_ps(coef);
  int64_t i = 0;
  if constexpr (E::kCode == kFloat16) {
    for (; i + 8 <= n; i += 8) {
      auto* p = reinterpret_cast<__m128i*>(x + i);
      const __m256 f = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(p)), c);
      _mm_storeu_si128(p, _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT));
    }
  } else {
    const __m256i zero = _mm256_setzero_si256();
    for (; i + 16 <= n; i += 16) {
      auto* p = reinterpret_cast<__m256i*>(x + i);
      const __m256i w = _mm256_loadu_si256(p);
      const __m256 lo = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, w)), c);
      const __m256 hi = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, w)), c);
      _mm256_storeu_si256(p, _mm256_packus_epi32(round_to_bf16(lo), round_to_bf16(hi)));
    }
  }
  return i;
}
