// The portable loops: plain C++ on the 32 lanes of lanes.h, which the compiler
// vectorizes for the target's baseline (SSE2 on x86-64, NEON on arm64).
// Included by kernels.cpp inside namespace fastnorm::generic.

struct Acc {
  double lane[kLanes];
};

FASTNORM_INLINE Acc acc_zero() {
  Acc a;
  for (double& v : a.lane) v = 0.0;
  return a;
}

FASTNORM_INLINE double fold(const Acc& a) { return fold_lanes(a.lane); }

// Squares of float32 and 16-bit values are exact in float64, so the separate
// multiply and add here give the bits the fused ones of the vector loops give.
template <int Power>
FASTNORM_INLINE void step(double& lane, double v) {
  lane = Power == 2 ? lane + v * v : lane + std::fabs(v);
}

// Written as loops that compilers vectorize: the conversions over contiguous
// elements, then the lanes of lanes.h.
template <class E, int Power>
FASTNORM_INLINE void add_block(Acc& a, const typename E::T* x) {
  if constexpr (E::kCode == kBFloat16) {
    // lanes.h: element 8q + 2j + k goes to lane 8q + 4k + j.
    double v[kLanes];
    for (int e = 0; e < kLanes; ++e) v[e] = E::to_double(x[e]);
    for (int q = 0; q < kLanes; q += 8) {
      for (int j = 0; j < 4; ++j) {
        step<Power>(a.lane[q + j], v[q + 2 * j]);
        step<Power>(a.lane[q + 4 + j], v[q + 2 * j + 1]);
      }
    }
  } else {
    for (int e = 0; e < kLanes; ++e) step<Power>(a.lane[e], E::to_double(x[e]));
  }
}

// Every sum runs the loop of kernels_impl.h here.
template <class E>
constexpr bool kSumElsewhere = false;
template <class E>
constexpr bool kOwnVisited = false;

template <class E, int Power, class Visit>
FASTNORM_INLINE double sum_elsewhere(const typename E::T*, int64_t, Visit&) {
  return 0.0;
}

// The lanes are in lanes.h's order already.
template <class E>
FASTNORM_INLINE const Acc& canonical(const Acc& a) {
  return a;
}

template <class E, int Power>
FASTNORM_INLINE void add_tail(Acc& a, const typename E::T* x, int64_t n) {
  typename E::T padded[kLanes] = {};
  std::memcpy(padded, x, size_t(n) * sizeof(typename E::T));
  add_block<E, Power>(a, padded);
}

// In-place x *= coef over whole blocks of 16-bit values; returns how many
// elements it scaled (kernels_impl.h scales the rest one by one). The portable
// loops scale every element one by one.
template <class E>
FASTNORM_INLINE int64_t scale_blocks(uint16_t*, int64_t, float) {
  return 0;
}

// The bounds' loop of kernels_impl.h (Counter) runs every element here.
template <class E>
struct Bounds {
  static constexpr bool kBlocks = false;
  FASTNORM_INLINE void block(const typename E::Bits*) {}
  FASTNORM_INLINE bool stretch_low(int64_t) { return true; }
  FASTNORM_INLINE int64_t scan(const typename E::Bits*, int64_t, int64_t, bool& low) {
    low = false;
    return 0;
  }
  int64_t top() const { return 0; }
};

// The counts' loop of kernels_impl.h (count_bits) runs every element here.
template <class E>
FASTNORM_INLINE int64_t count_blocks(const typename E::Bits*, int64_t, int64_t, int64_t&, int64_t&, int64_t&) {
  return 0;
}
