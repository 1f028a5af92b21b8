// fastnorm CPU kernels: one fused, threaded reduction over many tensors and
// the conditional in-place scale used for clipping.
//
// The extension never links libtorch: tensors arrive as raw addresses, element
// counts and dtype codes, so one build serves every torch version and building
// needs no torch at all.
#pragma once

#include <atomic>
#include <cmath>
#include <functional>
#include <cstdint>
#include <string>
#include <vector>

#if defined(__GNUC__) || defined(__clang__)
#define FASTNORM_INLINE inline __attribute__((always_inline))
#define FASTNORM_NOINLINE __attribute__((noinline))
#define FASTNORM_PREFETCH(address) __builtin_prefetch(address)
#else
#define FASTNORM_INLINE __forceinline
#define FASTNORM_NOINLINE __declspec(noinline)
#define FASTNORM_PREFETCH(address) ((void)(address))
#endif

namespace fastnorm {

// Codes shared with fastnorm/backends/cpp.py.
enum DType : int { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBFloat16 = 3 };
enum Mode : int { kL2 = 0, kL1 = 1, kLinf = 2, kLp = 3 };
// reduce_stats only: the counts and maximum without a norm (sum_sq written as NaN, the norm 0).
constexpr int kCountsOnly = -1;

// A partial reduction (the contract of fastnorm/backends/__init__.py).
// L2: scale = m when m > 0, else 1; the norm^2 is scale^2 * s. L1: s is the
// sum of |x|. Linf: m is the max |x|. Lp: the norm^p is m^p * s (s is scaled
// by the running max m). NaN anywhere makes m (Linf, Lp) or s (L2, L1) NaN.
struct Partial {
  double m = 0.0;
  double s = 0.0;
};

FASTNORM_INLINE double nan_max(double a, double b) { return (b > a || b != b) ? b : a; }

// Merges a tile whose max |x| is tile_max and whose sum of (|x|/tile_max)^p is
// tile_sum into acc (mode Lp). Exact for equal maxima, so inf merges into inf.
FASTNORM_INLINE void merge_scaled(Partial& acc, double tile_max, double tile_sum, double p) {
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

// A plain L2 sum of squares (m = 0) is exact enough where it lies in
// [2^-969, DBL_MAX]: a square that underflowed is off by at most 2^-1075,
// below 2^-106 of such a sum. Only float64 values can leave that range (the
// squares of float32 and 16-bit values lie in [2^-298, 2^256]).
FASTNORM_INLINE bool in_plain_l2_range(double s) { return s >= 0x1p-969 && s <= 0x1.fffffffffffffp+1023; }

// Merges two L2 partials whose scales differ, or whose plain sum overflowed.
void merge_l2_rescaled(Partial& a, const Partial& b);

// Merges b into a (mode L2). Both plain, the common case: their sum, the bits
// of a plain sum of squares.
FASTNORM_INLINE void merge_l2(Partial& a, const Partial& b) {
  if (a.m == b.m) {
    const double s = a.s + b.s;
    if (s != INFINITY || a.s == INFINITY || b.s == INFINITY) {
      a.s = s;
      return;
    }
  }
  merge_l2_rescaled(a, b);
}

// A fixed split of the tensors into tasks of similar byte size. The split
// depends only on the sizes, so the reduction order (and the result, bit for
// bit) does not depend on how many threads run it.
class TaskSplit {
 public:
  TaskSplit(const std::vector<uintptr_t>& addrs, const std::vector<int64_t>& numels,
       const std::vector<int>& dtypes, int64_t task_bytes);

  struct Piece {
    uintptr_t addr;
    int64_t numel;
    int64_t nbytes;
    int dtype;
    int64_t tensor;  // index of the tensor it belongs to
  };

  int64_t num_tasks() const { return int64_t(task_start_.size()) - 1; }
  int64_t numel() const { return numel_; }
  int64_t nbytes() const { return nbytes_; }
  int64_t num_pieces() const { return int64_t(pieces_.size()); }
  int64_t num_tensors() const { return num_tensors_; }
  const Piece& piece(int64_t i) const { return pieces_[size_t(i)]; }
  // For reduce_checked: given the index of the first item that gives each
  // tensor (not decreasing), records how many items must be checked before
  // each task may run.
  void set_gates(const std::vector<int64_t>& first_item);
  const std::vector<int64_t>& gates() const { return gates_; }
  int64_t task_begin(int64_t task) const { return task_start_[size_t(task)]; }

  // Calls fn(index, piece) for the pieces of a task, in order. Tensors are
  // separate allocations that no hardware prefetcher predicts: the first line
  // of a piece a few ahead is requested while this one runs, and the first
  // kLeadBytes of the next one, which its stream would otherwise start cold
  // (14% faster over 2000 tensors of 16 KB on Zen 4; leading by more hurt).
  template <class Fn>
  void for_each_piece(int64_t task, Fn&& fn) const {
    constexpr int64_t kAhead = 4;
    constexpr int64_t kLine = 64;
    constexpr int64_t kLeadBytes = 1024;
    const int64_t end = task_start_[task + 1];
    for (int64_t i = task_start_[task]; i < end; ++i) {
      if (i + kAhead < end) FASTNORM_PREFETCH(reinterpret_cast<const void*>(pieces_[i + kAhead].addr));
      if (i + 1 < end) {
        const Piece& next = pieces_[i + 1];
        const int64_t lead = next.nbytes < kLeadBytes ? next.nbytes : kLeadBytes;
        for (int64_t b = kLine; b < lead; b += kLine) {
          FASTNORM_PREFETCH(reinterpret_cast<const void*>(next.addr + b));
        }
      }
      fn(i, pieces_[i]);
    }
  }

 private:
  std::vector<Piece> pieces_;
  std::vector<int64_t> task_start_;
  std::vector<int64_t> gates_;  // empty until set_gates
  int64_t numel_ = 0;
  int64_t nbytes_ = 0;
  int64_t num_tensors_ = 0;
};

// Reduces every tensor of the split. Writes the partial {m, s} (two doubles) to
// partial_addr, the norm to root_addr as float64 (root_is_double) or float32
// when root_addr is not 0, and each tensor's own partial {m, s} to
// per_tensor_addr (2 doubles per tensor, in split order) when it is not 0.
void reduce(const TaskSplit& split, int mode, double p, uintptr_t partial_addr, uintptr_t root_addr,
            bool root_is_double, uintptr_t per_tensor_addr, int num_threads);

// reduce() without per-tensor norms, run while `check` confirms on the calling
// thread that the split still describes the gradients: check(progress) raises
// progress to the number of items confirmed so far, and task t waits until it
// reaches split.gates()[t] (TaskSplit::set_gates). Returns false, with nothing
// written, when check returns false; the tasks then read only confirmed tensors.
// On fastnorm's own thread pool the check runs to its end first.
bool reduce_checked(const TaskSplit& split, const std::function<bool(std::atomic<int64_t>&)>& check, int mode, double p,
                    uintptr_t partial_addr, uintptr_t root_addr, bool root_is_double, int num_threads);

// Per-tensor statistics (fastnorm/_stats.py): the tensor's L2 partial as the
// norm accumulates it, the largest finite |x|, and exact counts of non-finite
// values, zeros, nonzero values with |x| < tiny and finite ones with |x| > margin.
struct Stats {
  Partial l2;
  double max_abs = 0.0;
  int64_t nonfinite = 0;
  int64_t zeros = 0;
  int64_t subnormal = 0;
  int64_t overflow = 0;
};

// How a limit dtype judges the elements of one dtype: its smallest normal
// (tiny) and overflow margin as the magnitude bits of the elements' dtype: lo,
// of its smallest value at least tiny (nonzero |x| < tiny iff bits < lo); hi,
// of its largest value at most the margin (|x| > margin iff bits > hi).
struct Limits {
  int64_t lo;
  int64_t hi;
};

// reduce() (per-tensor partials aside), plus each tensor's statistics: 6
// doubles per tensor at stats_addr, in split order (sum_sq, max_abs,
// nonfinite, zeros, subnormal, overflow). thresholds_addr holds 4 x 4 Limits,
// [element dtype code][limit dtype code]; limit_codes_addr one int32 per
// tensor, the dtype code of its limit (-1: its own), or 0 for every tensor by
// its own. The norm's bits are reduce()'s; the statistics do not depend on the
// thread count either. The counts run inside the sum of squares' loop
// (kernels_impl.h, Counter); reduce()'s own loop is left as it is.
// mode kCountsOnly: the loop over the bits alone, for tensors whose sum of
// squares nobody reads (a pass's activations): sum_sq is NaN, the norm 0.
void reduce_stats(const TaskSplit& split, int mode, double p, uintptr_t partial_addr, uintptr_t root_addr,
                  bool root_is_double, uintptr_t thresholds_addr, uintptr_t limit_codes_addr,
                  uintptr_t stats_addr, int num_threads);

// reduce_stats(kCountsOnly) of one tensor (numel elements of dtype at addr, read
// as flat), judged by limit_code (-1: its own dtype), into the 6 doubles at
// stats_addr, split into tasks of task_bytes as a TaskSplit of it would be:
// one call from Python per tensor read once (a pass's activations), no split
// object to build there. A tensor that would stay on the calling thread (one
// thread, or under a megabyte) is read in one piece, with no split at all: the
// counts and the maximum do not depend on the cut.
void count_stats(uintptr_t addr, int64_t numel, int dtype, int limit_code, int64_t task_bytes,
                 uintptr_t thresholds_addr, uintptr_t stats_addr, int num_threads);

// Reads the norm at norm_addr (float64 or float32), computes the coefficient as
// torch.nn.utils.clip_grad_norm_ does, and scales every tensor in place by it,
// unless it is >= 1, in which case no tensor is read or written. Returns
// whether the tensors were scaled.
bool scale_by_norm(const TaskSplit& split, uintptr_t norm_addr, bool norm_is_double, double max_norm,
                   int num_threads);

// Instruction sets: "generic" (portable C++), "avx2" (AVX2, FMA, F16C) and
// "avx512" (AVX-512 F/BW/VL/DQ besides those). All give the same bits.
//
// The one the kernels run with: FASTNORM_ISA (or its older name
// FASTNORM_CPU_ISA) when set, else the widest this CPU supports. Chosen at the
// first use; an unknown or unsupported FASTNORM_ISA throws std::runtime_error
// naming what this CPU supports.
const char* isa();

// The instruction sets this build can run on this CPU, narrowest first.
std::vector<std::string> supported_isas();

// Switches the kernels to `name` (one of supported_isas()) for the calls that
// start afterwards: to compare them within one process.
void use_isa(const std::string& name);

// The default prefetch distance (bytes) for a CPU of `vendor` ("intel", "amd",
// anything else), with or without AVX-512, of x86 `family` (as /proc/cpuinfo
// says it): 4096 on Intel, where the loops reach the memory's speed only with
// it; 1024 on AMD without AVX-512 (Zen 3, measured: its 256-entry reorder
// buffer holds too few lines of the loops in flight); 4096 on AMD family 26
// and later (Zen 5, measured: 5-12% faster than none); 0 elsewhere (AMD Zen 4,
// family 25 with AVX-512, reads at the memory's speed without).
// docs/design.md, "Where the cycles go".
int64_t vendor_prefetch(const std::string& vendor, bool avx512, int family = 0);

// The software prefetch distance of the kernels' loops (prefetch.h), in bytes;
// 0 for none. FASTNORM_PREFETCH (bytes) when set, else vendor_prefetch of
// this CPU. Chosen at the first use; a value that is not a multiple of 64 in
// [0, 65536] throws std::runtime_error there. It never changes a result's bits.
int64_t prefetch_bytes();

// Sets it for the calls that start afterwards (to compare within one process);
// std::invalid_argument for a value FASTNORM_PREFETCH would refuse.
void set_prefetch_bytes(int64_t bytes);

// The core clock, measured for about `seconds` on the calling thread: the
// fastest rate of a chain of dependent integer additions (one cycle each on
// x86-64). 0 where that cannot be measured. For elements-per-cycle figures.
double clock_hz(double seconds);

}  // namespace fastnorm
