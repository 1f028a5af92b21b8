// fastnorm CPU kernels: one fused, threaded reduction over many tensors and
// the conditional in-place scale used for clipping.
//
// The extension never links libtorch: tensors arrive as raw addresses, element
// counts and dtype codes, so one build serves every torch version and building
// needs no torch at all.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__GNUC__) || defined(__clang__)
#define FASTNORM_INLINE inline __attribute__((always_inline))
#define FASTNORM_PREFETCH(address) __builtin_prefetch(address)
#else
#define FASTNORM_INLINE __forceinline
#define FASTNORM_PREFETCH(address) ((void)(address))
#endif

namespace fastnorm {

// Codes shared with fastnorm/backends/cpp.py.
enum DType : int { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBFloat16 = 3 };
enum Mode : int { kL2 = 0, kL1 = 1, kLinf = 2, kLp = 3 };

// Independent accumulators per loop: enough for the compiler to fill the
// vector units without reassociating (no -ffast-math).
constexpr int kLanes = 16;

// A partial reduction. L2/L1: s is the sum of |x|^p. Linf: m is the max |x|.
// Lp: the norm^p is m^p * s (s is scaled by the running max m).
// NaN anywhere makes m (Linf, Lp) or s (L2, L1) NaN.
struct Acc {
  double m = 0.0;
  double s = 0.0;
};

FASTNORM_INLINE double nan_max(double a, double b) { return (b > a || b != b) ? b : a; }

// Merges a tile whose max |x| is tile_max and whose sum of (|x|/tile_max)^p is
// tile_sum into acc (mode Lp). Exact for equal maxima, so inf merges into inf.
FASTNORM_INLINE void merge_scaled(Acc& acc, double tile_max, double tile_sum, double p) {
  if (tile_max != tile_max) {
    acc.m = tile_max;
  } else if (tile_max > acc.m) {
    acc.s = acc.s * std::pow(acc.m / tile_max, p) + tile_sum;
    acc.m = tile_max;
  } else if (tile_max == acc.m) {
    acc.s += tile_sum;
  } else if (tile_max > 0.0) {
    acc.s += tile_sum * std::pow(tile_max / acc.m, p);
  }
}

// A fixed split of the tensors into tasks of similar byte size. The split
// depends only on the sizes, so the reduction order (and the result, bit for
// bit) does not depend on how many threads run it.
class Plan {
 public:
  Plan(const std::vector<uintptr_t>& addrs, const std::vector<int64_t>& numels,
       const std::vector<int>& dtypes, int64_t task_bytes);

  struct Piece {
    uintptr_t addr;
    int64_t numel;
    int dtype;
    int64_t tensor;  // index of the tensor it belongs to
  };

  int64_t num_tasks() const { return int64_t(task_start_.size()) - 1; }
  int64_t numel() const { return numel_; }
  int64_t nbytes() const { return nbytes_; }
  int64_t num_pieces() const { return int64_t(pieces_.size()); }
  int64_t num_tensors() const { return num_tensors_; }
  const Piece& piece(int64_t i) const { return pieces_[size_t(i)]; }
  int64_t task_begin(int64_t task) const { return task_start_[size_t(task)]; }

  // Calls fn(index, piece) for the pieces of a task, in order. Tensors of a few
  // elements are separate allocations that no hardware prefetcher predicts:
  // the first line of a piece a few ahead is requested while this one runs.
  template <class Fn>
  void for_each_piece(int64_t task, Fn&& fn) const {
    constexpr int64_t kAhead = 4;
    const int64_t end = task_start_[task + 1];
    for (int64_t i = task_start_[task]; i < end; ++i) {
      if (i + kAhead < end) FASTNORM_PREFETCH(reinterpret_cast<const void*>(pieces_[i + kAhead].addr));
      fn(i, pieces_[i]);
    }
  }

 private:
  std::vector<Piece> pieces_;
  std::vector<int64_t> task_start_;
  int64_t numel_ = 0;
  int64_t nbytes_ = 0;
  int64_t num_tensors_ = 0;
};

// Reduces every tensor of the plan. Writes the partial {m, s} (two doubles) to
// partial_addr, the norm to root_addr as float64 (root_is_double) or float32
// when root_addr is not 0, and each tensor's own partial {m, s} to
// per_tensor_addr (2 doubles per tensor, in plan order) when it is not 0.
void reduce(const Plan& plan, int mode, double p, uintptr_t partial_addr, uintptr_t root_addr,
            bool root_is_double, uintptr_t per_tensor_addr, int num_threads);

// Reads the norm at norm_addr (float64 or float32), computes the coefficient as
// torch.nn.utils.clip_grad_norm_ does, and scales every tensor in place by it,
// unless it is >= 1, in which case no tensor is read or written. Returns
// whether the tensors were scaled.
bool scale_by_norm(const Plan& plan, uintptr_t norm_addr, bool norm_is_double, double max_norm,
                   int num_threads);

// The instruction set the kernels run with on this machine.
const char* isa();

}  // namespace fastnorm
