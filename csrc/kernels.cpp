#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "convert.h"
#include "fastnorm.h"
#include "thread_pool.h"

namespace fastnorm {

namespace generic {
FASTNORM_INLINE void half_block_to_float(const uint16_t* x, float* out) {
  for (int j = 0; j < kLanes; ++j) out[j] = half_to_float(x[j]);
}
FASTNORM_INLINE void float_block_to_half(const float* x, uint16_t* out) {
  for (int j = 0; j < kLanes; ++j) out[j] = float_to_half(x[j]);
}
FASTNORM_INLINE void half_block_to_double(const uint16_t* x, double* out) {
  for (int j = 0; j < kLanes; ++j) out[j] = double(half_to_float(x[j]));
}
FASTNORM_INLINE void bf16_block_to_double(const uint16_t* x, double* out) {
  for (int j = 0; j < kLanes; ++j) out[j] = double(bf16_to_float(x[j]));
}
FASTNORM_INLINE double muladd(double a, double b, double c) { return a * b + c; }
#include "kernels_impl.h"
}  // namespace generic

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FASTNORM_HAVE_AVX2 1
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
namespace avx2 {
static_assert(kLanes == 16, "the F16C hooks convert two groups of 8");
FASTNORM_INLINE void half_block_to_float(const uint16_t* x, float* out) {
  for (int k = 0; k < kLanes; k += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + k));
    _mm256_storeu_ps(out + k, _mm256_cvtph_ps(h));
  }
}
FASTNORM_INLINE void float_block_to_half(const float* x, uint16_t* out) {
  for (int k = 0; k < kLanes; k += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + k), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), h);
  }
}
// 8 floats -> two groups of 4 doubles, stored as whole vectors.
FASTNORM_INLINE void store_as_doubles(__m256 f, double* out) {
  _mm256_storeu_pd(out, _mm256_cvtps_pd(_mm256_castps256_ps128(f)));
  _mm256_storeu_pd(out + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1)));
}
FASTNORM_INLINE void half_block_to_double(const uint16_t* x, double* out) {
  for (int k = 0; k < kLanes; k += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + k));
    store_as_doubles(_mm256_cvtph_ps(h), out + k);
  }
}
FASTNORM_INLINE void bf16_block_to_double(const uint16_t* x, double* out) {
  for (int k = 0; k < kLanes; k += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + k));
    const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    store_as_doubles(_mm256_castsi256_ps(w), out + k);
  }
}
// Exact for squares of float32/16-bit values (the product fits a double), so
// fusing changes no result there; it only saves an instruction per lane.
FASTNORM_INLINE double muladd(double a, double b, double c) { return std::fma(a, b, c); }
#include "kernels_impl.h"
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

namespace {

using ReduceFn = void (*)(int, int, double, const void*, int64_t, Acc&);
using ScaleFn = void (*)(int, void*, int64_t, float, double);

struct Kernels {
  ReduceFn reduce;
  ScaleFn scale;
  const char* isa;
};

// FASTNORM_CPU_ISA=generic forces the portable loops (to test them, or to rule
// out the vector path when chasing a problem).
Kernels select_kernels() {
  const char* forced = std::getenv("FASTNORM_CPU_ISA");
  if (forced != nullptr && std::string(forced) == "generic") {
    return {generic::reduce_piece, generic::scale_piece, "generic"};
  }
#if defined(FASTNORM_HAVE_AVX2)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    return {avx2::reduce_piece, avx2::scale_piece, "avx2"};
  }
#endif
  return {generic::reduce_piece, generic::scale_piece, "generic"};
}

const Kernels& kernels() {
  static const Kernels k = select_kernels();
  return k;
}

int64_t element_size(int dtype) {
  switch (dtype) {
    case kFloat32:
      return 4;
    case kFloat64:
      return 8;
    case kFloat16:
    case kBFloat16:
      return 2;
    default:
      throw std::invalid_argument("fastnorm._C: unknown dtype code " + std::to_string(dtype));
  }
}

// Below this many bytes a call stays on the calling thread: waking the pool
// costs more than it saves.
constexpr int64_t kParallelBytes = int64_t(1) << 20;

int threads_for(const Plan& plan, int num_threads) {
  return plan.nbytes() < kParallelBytes ? 1 : std::max(1, num_threads);
}

}  // namespace

Plan::Plan(const std::vector<uintptr_t>& addrs, const std::vector<int64_t>& numels,
           const std::vector<int>& dtypes, int64_t task_bytes) {
  if (addrs.size() != numels.size() || addrs.size() != dtypes.size()) {
    throw std::invalid_argument("fastnorm._C.Plan: addrs, numels and dtypes differ in length");
  }
  if (task_bytes <= 0) throw std::invalid_argument("fastnorm._C.Plan: task_bytes must be > 0");
  task_start_.push_back(0);
  int64_t filled = 0;  // bytes in the task being built
  for (size_t i = 0; i < addrs.size(); ++i) {
    const int64_t size = element_size(dtypes[i]);
    if (numels[i] < 0) throw std::invalid_argument("fastnorm._C.Plan: negative numel");
    numel_ += numels[i];
    nbytes_ += numels[i] * size;
    int64_t done = 0;
    while (done < numels[i]) {
      const int64_t room = std::max<int64_t>(1, (task_bytes - filled) / size);
      const int64_t take = std::min(room, numels[i] - done);
      pieces_.push_back({addrs[i] + uintptr_t(done * size), take, dtypes[i], int64_t(i)});
      done += take;
      filled += take * size;
      if (filled >= task_bytes) {
        task_start_.push_back(int64_t(pieces_.size()));
        filled = 0;
      }
    }
  }
  if (task_start_.back() != int64_t(pieces_.size())) task_start_.push_back(int64_t(pieces_.size()));
  num_tensors_ = int64_t(addrs.size());
}

namespace {

// Merges b into a for the given mode, the same way at every level (pieces into
// tasks, tasks into the total, pieces into their tensor).
void merge(Acc& a, const Acc& b, int mode, double p) {
  switch (mode) {
    case kL2:
    case kL1:
      a.s += b.s;
      break;
    case kLinf:
      a.m = nan_max(a.m, b.m);
      break;
    default:
      merge_scaled(a, b.m, b.s, p);
  }
}

double root_of(const Acc& acc, int mode, double p) {
  switch (mode) {
    case kL2:
      return std::sqrt(acc.s);
    case kL1:
      return acc.s;
    case kLinf:
      return acc.m;
    default:
      return acc.m == 0.0 ? 0.0 : acc.m * std::pow(acc.s, 1.0 / p);
  }
}

}  // namespace

void reduce(const Plan& plan, int mode, double p, uintptr_t partial_addr, uintptr_t root_addr,
            bool root_is_double, uintptr_t per_tensor_addr, int num_threads) {
  if (mode < kL2 || mode > kLp) throw std::invalid_argument("fastnorm._C.reduce: unknown mode");
  const ReduceFn reduce_piece = kernels().reduce;
  std::vector<Acc> partial(size_t(plan.num_tasks()));
  std::vector<Acc> pieces(per_tensor_addr != 0 ? size_t(plan.num_pieces()) : 0);
  ThreadPool::instance().run(plan.num_tasks(), threads_for(plan, num_threads), [&](int64_t task) {
    Acc acc;
    plan.for_each_piece(task, [&](int64_t index, const Plan::Piece& piece) {
      Acc own;
      reduce_piece(piece.dtype, mode, p, reinterpret_cast<const void*>(piece.addr), piece.numel,
                   own);
      merge(acc, own, mode, p);
      if (!pieces.empty()) pieces[size_t(index)] = own;
    });
    partial[size_t(task)] = acc;
  });

  Acc total;
  for (const Acc& acc : partial) merge(total, acc, mode, p);
  auto* out = reinterpret_cast<double*>(partial_addr);
  out[0] = total.m;
  out[1] = total.s;

  if (root_addr != 0) {
    const double root = root_of(total, mode, p);
    if (root_is_double) {
      *reinterpret_cast<double*>(root_addr) = root;
    } else {
      *reinterpret_cast<float*>(root_addr) = float(root);
    }
  }

  if (per_tensor_addr != 0) {
    std::vector<Acc> tensors(size_t(plan.num_tensors()));
    for (int64_t i = 0; i < plan.num_pieces(); ++i) {
      merge(tensors[size_t(plan.piece(i).tensor)], pieces[size_t(i)], mode, p);
    }
    auto* per_tensor = reinterpret_cast<double*>(per_tensor_addr);
    for (size_t t = 0; t < tensors.size(); ++t) {
      per_tensor[2 * t] = tensors[t].m;
      per_tensor[2 * t + 1] = tensors[t].s;
    }
  }
}

bool scale_by_norm(const Plan& plan, uintptr_t norm_addr, bool norm_is_double, double max_norm,
                   int num_threads) {
  // The coefficient exactly as torch computes it (reciprocal(norm + 1e-6) *
  // max_norm, in the norm's dtype), so that the clipped gradients match bit for bit.
  float coef;
  double coef64;
  if (norm_is_double) {
    const double norm = *reinterpret_cast<const double*>(norm_addr);
    coef64 = (1.0 / (norm + 1e-6)) * max_norm;
    coef = float(coef64);
  } else {
    const float norm = *reinterpret_cast<const float*>(norm_addr);
    coef = (1.0f / (norm + float(1e-6))) * float(max_norm);
    coef64 = double(coef);
  }
  // clamp(coef, max=1) leaves a NaN coefficient NaN, and torch scales by it.
  if (coef64 >= 1.0) return false;
  const ScaleFn scale_piece = kernels().scale;
  ThreadPool::instance().run(plan.num_tasks(), threads_for(plan, num_threads), [&](int64_t task) {
    plan.for_each_piece(task, [&](int64_t, const Plan::Piece& piece) {
      scale_piece(piece.dtype, reinterpret_cast<void*>(piece.addr), piece.numel, coef, coef64);
    });
  });
  return true;
}

const char* isa() { return kernels().isa; }

}  // namespace fastnorm
