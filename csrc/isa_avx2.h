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

// The float32 values of four words, or sixteen bfloat16 as float32 (exact):
// the even elements are the upper halves of the words shifted up, the odd
// ones the upper halves kept.
FASTNORM_INLINE __m256 bf16_even(__m256i w) { return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)); }
FASTNORM_INLINE __m256 bf16_odd(__m256i w) {
  return _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(int32_t(0xFFFF0000u))));
}

// Adds the eight float32 values of f, widened (exact), to groups lo and hi.
template <int Power>
FASTNORM_INLINE void add_floats(Acc& a, int lo, int hi, __m256 f) {
  a.g[lo] = step<Power, true>(a.g[lo], _mm256_cvtps_pd(_mm256_castps256_ps128(f)));
  a.g[hi] = step<Power, true>(a.g[hi], _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
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
    // Four halves to floats to doubles per group: element e goes to lane e.
    for (int k = 0; k < kGroups; ++k) {
      const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(x + 4 * k));
      a.g[k] = step<Power, true>(a.g[k], _mm256_cvtps_pd(_mm_cvtph_ps(h)));
    }
  } else {
    // Sixteen bfloat16 per half h, as float32 (lanes.h: 16h + 2j + k goes to
    // group 4h + 2(j / 4) + k).
    for (int h = 0; h < 2; ++h) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16 * h));
      add_floats<Power>(a, 4 * h, 4 * h + 2, bf16_even(w));
      add_floats<Power>(a, 4 * h + 1, 4 * h + 3, bf16_odd(w));
    }
  }
}

template <class E, int Power>
FASTNORM_INLINE void add_tail(Acc& a, const typename E::T* x, int64_t n) {
  alignas(32) typename E::T padded[kLanes] = {};
  std::memcpy(padded, x, size_t(n) * sizeof(typename E::T));
  add_block<E, Power>(a, padded);
}

// ---------------------------------------------------------------------------
// bfloat16 sums at the speed of float32 ones
//
// A bfloat16 is the upper half of a float32, so 32 bfloat16 can be widened by
// reading memory as float32 words and converting those straight from memory,
// which costs no more than a float32 sum: the odd elements are the upper
// halves of the words at x, the even ones those of the words two bytes
// earlier (x - 1 element). The lower half of each word is a neighbour, which
// adds 16 low bits to the float32's mantissa; they land below the bfloat16's
// 7 mantissa bits in the float64 and one AND clears them, which leaves the
// element's exact value (inf and NaN become NaN: sum_pow_checked then asks
// max |x|).
//
// That fails only where an element's exponent bits are all zero (zero or
// subnormal) and its neighbour is not zero: the float32 word is then a
// subnormal holding the neighbour's bits. The blocks are read in chunks, each
// in the first of these ways that holds, with the lanes restored before the next:
//   1. as words: converting a subnormal sets the denormal-operand flag (DE) of
//      MXCSR, and nothing else in the loop can: a chunk that leaves DE clear
//      had no such word;
//   2. as words with denormals-are-zero (DAZ) set, which reads those words as
//      zero: right for every zero element, and a running minimum of
//      (|x| bits - 1) over the chunk tells whether any element was subnormal;
//   3. block by block, widened in registers (add_block).
// After a chunk that way 1 could not read, the next ones start with way 2.
// Every way adds the same exact values to the same lanes in the same order,
// so the result is that of the other instruction sets. The exceptions these
// words raise are not the caller's: they are masked meanwhile, and MXCSR is
// left as the caller had it, flags included.

// MXCSR's denormal-operand flag, denormals-are-zero mode and exception masks.
constexpr unsigned kDenormalFlag = 0x0002;
constexpr unsigned kDenormalsAreZero = 0x0040;
constexpr unsigned kExceptionMasks = 0x1F80;
// Blocks per chunk (16 KiB: a chunk read again comes from L1 or L2). MXCSR is read
// once per chunk; reading it waits for the conversions in flight.
constexpr int64_t kChunkBlocks = 256;
// After a chunk that way 1 could not read, this many start with way 2.
constexpr int kCarefulChunks = 16;

// Adds |x|^Power of a block of 32 bfloat16 read as float32 words (x[-1] is
// read too). Exact unless an element's exponent is zero.
template <int Power>
FASTNORM_INLINE void add_bf16_words(Acc& a, const uint16_t* x) {
  const __m256d keep = _mm256_castsi256_pd(_mm256_set1_epi64x(int64_t(0x7FFFE00000000000ull)));
  const float* odd = reinterpret_cast<const float*>(x);
  const float* even = reinterpret_cast<const float*>(x - 1);
  for (int q = 0; q < 4; ++q) {
    const __m256d e = _mm256_and_pd(_mm256_cvtps_pd(_mm_loadu_ps(even + 4 * q)), keep);
    const __m256d o = _mm256_and_pd(_mm256_cvtps_pd(_mm_loadu_ps(odd + 4 * q)), keep);
    a.g[2 * q] = step<Power, true>(a.g[2 * q], e);
    a.g[2 * q + 1] = step<Power, true>(a.g[2 * q + 1], o);
  }
}

// add_bf16_words of block i of x, prefetching (prefetch.h) while the lines
// `ahead` bytes on are inside the piece (i * kLanes + kLanes <= stop). The
// branch goes the same way for all but one block of a piece.
template <int Power>
FASTNORM_INLINE void add_bf16_words_ahead(Acc& a, const uint16_t* x, int64_t i, int64_t stop, int64_t ahead) {
  if (i * kLanes + kLanes <= stop) prefetch_ahead<kLanes * 2>(x + i * kLanes, ahead);
  add_bf16_words<Power>(a, x + i * kLanes);
}

// min over the block of the 16-bit (|x| bits - 1), wrapping: 0xFFFF for zero,
// below 0x7F exactly for subnormals.
FASTNORM_INLINE __m256i min_magnitude_bits(__m256i m, const uint16_t* x) {
  const __m256i magnitude = _mm256_set1_epi16(0x7FFF);
  const __m256i minus_one = _mm256_set1_epi16(-1);
  for (int h = 0; h < 2; ++h) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 16 * h));
    m = _mm256_min_epu16(m, _mm256_add_epi16(_mm256_and_si256(w, magnitude), minus_one));
  }
  return m;
}

FASTNORM_INLINE bool any_below(__m256i m, int16_t bound) {
  const __m256i below = _mm256_cmpeq_epi16(_mm256_min_epu16(m, _mm256_set1_epi16(bound - 1)), m);
  return !_mm256_testz_si256(below, below);
}

// Keeps the compiler from moving loads or conversions across the reads and
// writes of MXCSR: every lane is computed before it, and nothing is loaded
// before it that is used after.
FASTNORM_INLINE void mxcsr_fence(Acc& a) {
  for (__m256d& g : a.g) asm volatile("" : "+x"(g));
  asm volatile("" ::: "memory");
}

// visit (elements.h) gets each chunk once it is read for good, at the start
// of the next one, block 0 with the first, and the last with the tail. A
// visitor of blocks (this target's Counter) gets each block as a way reads it
// (again if a later way reads it again: its bounds are a maximum and a
// minimum), each chunk as its stretch, then the tail.
template <int Power, class Visit>
FASTNORM_NOINLINE double sum_bf16(const uint16_t* x, int64_t n, Visit& caller) {
  // The visitor's own copy, handed back at the end. Reached through the
  // reference its lanes stayed in memory, since every load of x may alias them
  // (__m256i loads alias anything): each block stored them and the next loaded
  // them back, a chain through memory that held bfloat16 statistics at 1.2-1.35x
  // the norm's time on AMD Zen 3. A copy whose address is never taken stays in
  // registers.
  std::decay_t<Visit> visit = caller;
  Acc acc = acc_zero();
  int64_t counted = 0;  // the elements visit has had
  const int64_t blocks = n / kLanes;
  const int64_t ahead = prefetch_bytes();
  const int64_t stop = prefetch_stop<uint16_t>(n, ahead);  // blocks from `stop / kLanes` on prefetch nothing
  int64_t b = 0;
  if (blocks >= 2) {
    // Exceptions masked while the words are read: the word of an inf and its
    // neighbour is a signalling NaN, that of a zero and its neighbour a
    // subnormal, neither of them the caller's. MXCSR is put back as it was,
    // flags included, at the end.
    const unsigned entry = _mm_getcsr();
    // DAZ stays as the caller has it: with it (torch.set_flush_denormal(True))
    // every conversion here and in the other loops reads a subnormal as zero,
    // the word of a zero and its neighbour too, and DE is never raised.
    const unsigned clear = (entry & ~kDenormalFlag) | kExceptionMasks;
    if (entry != clear) _mm_setcsr(clear);
    // The first block reads nothing before x.
    add_block<BF16, Power>(acc, x);
    if constexpr (kVisitsBlocks<Visit>) visit.block(x);
    b = 1;
    mxcsr_fence(acc);
    bool written = (_mm_getcsr() & kDenormalFlag) != 0;  // MXCSR may differ from `clear`
    int careful = 0;
    for (; b < blocks; b = std::min(blocks, b + kChunkBlocks)) {
      const int64_t end = std::min(blocks, b + kChunkBlocks);
      if constexpr (kVisitsBlocks<Visit>) {
        if (b > 1) visit.stretch(x + counted, b * kLanes - counted);  // the chunk before, its blocks seen
        if (b > 1) counted = b * kLanes;
      } else if constexpr (kVisits<Visit>) {
        visit(x + counted, b * kLanes - counted);  // the chunk before (block 0 before the first)
        counted = b * kLanes;
      }
      __m256d before[kGroups];
      for (int k = 0; k < kGroups; ++k) before[k] = acc.g[k];
      if (careful == 0) {  // way 1
        if (written) _mm_setcsr(clear);
        written = false;
        mxcsr_fence(acc);
        for (int64_t i = b; i < end; ++i) {
          add_bf16_words_ahead<Power>(acc, x, i, stop, ahead);
          if constexpr (kVisitsBlocks<Visit>) visit.block(x + i * kLanes);
        }
        mxcsr_fence(acc);
        if (!(_mm_getcsr() & kDenormalFlag)) continue;
        written = true;
        for (int k = 0; k < kGroups; ++k) acc.g[k] = before[k];
        careful = kCarefulChunks;
      } else {
        --careful;
      }
      // way 2
      _mm_setcsr(clear | kDenormalsAreZero);
      written = true;
      __m256i least = _mm256_set1_epi16(-1);
      mxcsr_fence(acc);
      for (int64_t i = b; i < end; ++i) {
        least = min_magnitude_bits(least, x + i * kLanes);
        add_bf16_words_ahead<Power>(acc, x, i, stop, ahead);
        if constexpr (kVisitsBlocks<Visit>) visit.block(x + i * kLanes);
      }
      mxcsr_fence(acc);
      _mm_setcsr(clear);
      if (!any_below(least, 0x7F)) continue;
      // way 3
      for (int k = 0; k < kGroups; ++k) acc.g[k] = before[k];
      for (int64_t i = b; i < end; ++i) add_block<BF16, Power>(acc, x + i * kLanes);
    }
    mxcsr_fence(acc);
    if (_mm_getcsr() != entry) _mm_setcsr(entry);
  }
  for (; b < blocks; ++b) add_block<BF16, Power>(acc, x + b * kLanes);
  if (blocks * kLanes < n) add_tail<BF16, Power>(acc, x + blocks * kLanes, n - blocks * kLanes);
  if constexpr (kVisitsBlocks<Visit>) {
    if (blocks >= 2) {  // the last chunk's blocks are seen: the stretch, then the tail
      visit.stretch(x + counted, blocks * kLanes - counted);
      counted = blocks * kLanes;
    }
  }
  if constexpr (kVisits<Visit>) {
    if (counted < n) visit(x + counted, n - counted);
    caller = visit;
  }
  return fold(acc);
}

// bfloat16 sums run sum_bf16, the others the loop of kernels_impl.h.
template <class E>
constexpr bool kSumElsewhere = E::kCode == kBFloat16;
template <class E>
constexpr bool kOwnVisited = false;

template <class E, int Power, class Visit>
FASTNORM_INLINE double sum_elsewhere(const typename E::T* x, int64_t n, Visit& visit) {
  return sum_bf16<Power>(x, n, visit);
}

// The lanes are in lanes.h's order already.
template <class E>
FASTNORM_INLINE const Acc& canonical(const Acc& a) {
  return a;
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

// The magnitude bits' lanes of the bounds below, by the element's width.
// AVX2 has no 64-bit max or min: a compare and a blend.
template <int Bytes>
struct BitLanes;
template <>
struct BitLanes<2> {
  static FASTNORM_INLINE __m256i max(__m256i a, __m256i b) { return _mm256_max_epi16(a, b); }
  static FASTNORM_INLINE __m256i min(__m256i a, __m256i b) { return _mm256_min_epi16(a, b); }
  static FASTNORM_INLINE __m256i less(__m256i a, __m256i b) { return _mm256_cmpgt_epi16(b, a); }
  static FASTNORM_INLINE __m256i eq(__m256i a, __m256i b) { return _mm256_cmpeq_epi16(a, b); }
  static FASTNORM_INLINE __m256i add(__m256i a, __m256i b) { return _mm256_add_epi16(a, b); }
  static FASTNORM_INLINE __m256i sub(__m256i a, __m256i b) { return _mm256_sub_epi16(a, b); }
  static FASTNORM_INLINE __m256i set1(int64_t v) { return _mm256_set1_epi16(int16_t(v)); }
};
template <>
struct BitLanes<4> {
  static FASTNORM_INLINE __m256i max(__m256i a, __m256i b) { return _mm256_max_epi32(a, b); }
  static FASTNORM_INLINE __m256i min(__m256i a, __m256i b) { return _mm256_min_epi32(a, b); }
  static FASTNORM_INLINE __m256i less(__m256i a, __m256i b) { return _mm256_cmpgt_epi32(b, a); }
  static FASTNORM_INLINE __m256i eq(__m256i a, __m256i b) { return _mm256_cmpeq_epi32(a, b); }
  static FASTNORM_INLINE __m256i add(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
  static FASTNORM_INLINE __m256i sub(__m256i a, __m256i b) { return _mm256_sub_epi32(a, b); }
  static FASTNORM_INLINE __m256i set1(int64_t v) { return _mm256_set1_epi32(int32_t(v)); }
};
template <>
struct BitLanes<8> {
  static FASTNORM_INLINE __m256i max(__m256i a, __m256i b) {
    return _mm256_blendv_epi8(b, a, _mm256_cmpgt_epi64(a, b));
  }
  static FASTNORM_INLINE __m256i min(__m256i a, __m256i b) {
    return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b));
  }
  static FASTNORM_INLINE __m256i less(__m256i a, __m256i b) { return _mm256_cmpgt_epi64(b, a); }
  static FASTNORM_INLINE __m256i eq(__m256i a, __m256i b) { return _mm256_cmpeq_epi64(a, b); }
  static FASTNORM_INLINE __m256i add(__m256i a, __m256i b) { return _mm256_add_epi64(a, b); }
  static FASTNORM_INLINE __m256i sub(__m256i a, __m256i b) { return _mm256_sub_epi64(a, b); }
  static FASTNORM_INLINE __m256i set1(int64_t v) { return _mm256_set1_epi64x(v); }
};

// The bounds' loop (kernels_impl.h, Counter) inside the sum's own loop: each
// block's magnitude bits, loaded again from the line the sum has just read
// (L1), raise the largest (kept in lanes across stretches, folded once by
// top()) and lower the stretch's least. A separate scan of each stretch from
// L1, as before, let the memory stream stall while it ran: 1.15x to 1.39x
// the norm's time on AMD Zen 3 (docs/design.md). scan serves the stretches
// handed over whole (the AVX-512 target's visitors of this loop).
template <class E>
struct Bounds {
  using S = std::make_signed_t<typename E::Bits>;
  using L = BitLanes<int(sizeof(S))>;
  static constexpr int kWidth = 32 / int(sizeof(S));
  static constexpr bool kBlocks = true;
  __m256i m = _mm256_setzero_si256();
  __m256i least = L::set1(int64_t(E::kAbsMask));

  FASTNORM_INLINE void block(const typename E::Bits* x) {
    const __m256i mask = L::set1(int64_t(E::kAbsMask));
    for (int r = 0; r < kLanes / kWidth; ++r) {
      const __m256i a =
          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + r * kWidth)), mask);
      m = L::max(m, a);
      least = L::min(least, a);
    }
  }

  FASTNORM_INLINE bool stretch_low(int64_t lo) {
    const __m256i below = L::less(least, L::set1(lo));
    least = L::set1(int64_t(E::kAbsMask));
    return !_mm256_testz_si256(below, below);
  }

  FASTNORM_INLINE int64_t scan(const typename E::Bits* x, int64_t n, int64_t lo, bool& low) {
    const __m256i mask = L::set1(int64_t(E::kAbsMask));
    __m256i m0 = m, m1 = m, l0 = mask, l1 = mask;
    int64_t i = 0;
    for (; i + 2 * kWidth <= n; i += 2 * kWidth) {
      const __m256i a0 = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), mask);
      const __m256i a1 =
          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + kWidth)), mask);
      m0 = L::max(m0, a0);
      m1 = L::max(m1, a1);
      l0 = L::min(l0, a0);
      l1 = L::min(l1, a1);
    }
    m = L::max(m0, m1);
    const __m256i below = L::less(L::min(l0, l1), L::set1(lo));
    low = !_mm256_testz_si256(below, below);
    return i;
  }

  int64_t top() const {
    alignas(32) S lanes[kWidth];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), m);
    S t = 0;
    for (S v : lanes) t = v > t ? v : t;
    return t;
  }
};

// The counts' loop (kernels_impl.h, count_bits) over whole pairs of 32-byte
// registers: the magnitude bits' maximum and the zeros and values below lo,
// each counted by subtracting its compare's mask (-1 where true) from lanes of
// the element's width: six vector operations a register, as AVX-512's masked
// adds. Left to the compiler the loop ran scalar: 17.8 GB/s on a 16 MB float32
// tensor against torch.sum's 36 on Zen 3 (one core). Returns how many elements
// it read (a multiple of two registers); m, zeros and below are raised by what
// it found. n <= kCountBlock: a lane's count stays far below its type's range.
template <class E>
FASTNORM_INLINE int64_t count_blocks(const typename E::Bits* x, int64_t n, int64_t lo, int64_t& m, int64_t& zeros,
                                     int64_t& below) {
  using S = std::make_signed_t<typename E::Bits>;
  using L = BitLanes<int(sizeof(S))>;
  constexpr int kWidth = 32 / int(sizeof(S));
  const __m256i mask = L::set1(int64_t(E::kAbsMask)), low = L::set1(lo), none = _mm256_setzero_si256();
  __m256i m0 = none, m1 = none, z0 = none, z1 = none, b0 = none, b1 = none;
  int64_t i = 0;
  // From memory the loop alone leaves it idle part of the time (prefetch.h): 13.3-13.8 GB/s against
  // 17.7-18.3 for a plain torch.sum on Zen 3; the line prefetch_bytes() ahead of each 64 bytes: 16-18.
  const int64_t ahead = prefetch_bytes();
  const int64_t stop = prefetch_stop<typename E::Bits>(n, ahead);
  for (; i + 2 * kWidth <= n; i += 2 * kWidth) {
    if (i + 2 * kWidth <= stop) prefetch_ahead<2 * kWidth * int(sizeof(S))>(x + i, ahead);
    const __m256i a0 = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), mask);
    const __m256i a1 = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + kWidth)), mask);
    m0 = L::max(m0, a0);
    m1 = L::max(m1, a1);
    z0 = L::sub(z0, L::eq(a0, none));
    z1 = L::sub(z1, L::eq(a1, none));
    b0 = L::sub(b0, L::less(a0, low));
    b1 = L::sub(b1, L::less(a1, low));
  }
  // The two registers' lanes summed: at most 2 * kCountBlock / (2 * kWidth) a lane, far inside S.
  alignas(32) S top[kWidth], zs[kWidth], bs[kWidth];
  _mm256_store_si256(reinterpret_cast<__m256i*>(top), L::max(m0, m1));
  _mm256_store_si256(reinterpret_cast<__m256i*>(zs), L::add(z0, z1));
  _mm256_store_si256(reinterpret_cast<__m256i*>(bs), L::add(b0, b1));
  for (int j = 0; j < kWidth; ++j) {
    m = top[j] > m ? top[j] : m;
    zeros += zs[j];
    below += bs[j];
  }
  return i;
}
