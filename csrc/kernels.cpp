#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__)
// GCC's AVX-512 headers fill don't-care inputs with self-initialized values
// (_mm512_undefined_*), which its own -Wmaybe-uninitialized then reports.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "convert.h"
#include "elements.h"
#include "fastnorm.h"
#include "lanes.h"
#include "prefetch.h"
#include "thread_pool.h"

namespace fastnorm {

namespace generic {
#include "isa_generic.h"
#include "kernels_impl.h"
}  // namespace generic

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FASTNORM_HAVE_X86 1
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
namespace avx2 {
#include "isa_avx2.h"
#include "kernels_impl.h"
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#endif
namespace avx512 {
#include "isa_avx512.h"
#include "kernels_impl.h"
}  // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

namespace {

using ReduceFn = void (*)(int, int, double, const void*, int64_t, Partial&);
using ScaleFn = void (*)(int, void*, int64_t, float, double);
using StatsFn = void (*)(int, int, double, const void*, int64_t, const Limits&, Partial&, Stats&);

struct Kernels {
  const char* name;
  ReduceFn reduce;
  ScaleFn scale;
  bool (*supported)();
  StatsFn stats;
};

bool always() { return true; }

#if defined(FASTNORM_HAVE_X86)
bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
// __builtin_cpu_supports also checks that the OS saves the AVX-512 registers.
bool cpu_has_avx512() {
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}
#endif

// Narrowest first.
const Kernels kAll[] = {
    {"generic", generic::reduce_piece, generic::scale_piece, always, generic::stats_piece},
#if defined(FASTNORM_HAVE_X86)
    {"avx2", avx2::reduce_piece, avx2::scale_piece, cpu_has_avx2, avx2::stats_piece},
    {"avx512", avx512::reduce_piece, avx512::scale_piece, cpu_has_avx512, avx512::stats_piece},
#endif
};

const Kernels* find(const std::string& name) {
  for (const Kernels& k : kAll) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

std::string supported_list() {
  std::string out;
  for (const std::string& name : supported_isas()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

const Kernels* select_kernels() {
  const char* forced = std::getenv("FASTNORM_ISA");
  const char* variable = "FASTNORM_ISA";
  if (forced == nullptr || *forced == 0) {
    forced = std::getenv("FASTNORM_CPU_ISA");
    variable = "FASTNORM_CPU_ISA";
  }
  if (forced != nullptr && *forced != 0) {
    const Kernels* k = find(forced);
    if (k == nullptr || !k->supported()) {
      const char* why = k == nullptr ? " is unknown" : " is not supported here";
      throw std::runtime_error(std::string(variable) + "=" + forced + why +
                               "; this CPU and build support: " + supported_list());
    }
    return k;
  }
  const Kernels* best = &kAll[0];
  for (const Kernels& k : kAll) {
    if (k.supported()) best = &k;
  }
  return best;
}

std::atomic<const Kernels*>& current() {
  static std::atomic<const Kernels*> chosen{select_kernels()};
  return chosen;
}

const Kernels& kernels() { return *current().load(std::memory_order_acquire); }

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

int threads_for(const TaskSplit& split, int num_threads) {
  return split.nbytes() < kParallelBytes ? 1 : std::max(1, num_threads);
}

}  // namespace

TaskSplit::TaskSplit(const std::vector<uintptr_t>& addrs, const std::vector<int64_t>& numels,
           const std::vector<int>& dtypes, int64_t task_bytes) {
  if (addrs.size() != numels.size() || addrs.size() != dtypes.size()) {
    throw std::invalid_argument("fastnorm._C.TaskSplit: addrs, numels and dtypes differ in length");
  }
  if (task_bytes <= 0) throw std::invalid_argument("fastnorm._C.TaskSplit: task_bytes must be > 0");
  task_start_.push_back(0);
  int64_t filled = 0;  // bytes in the task being built
  for (size_t i = 0; i < addrs.size(); ++i) {
    const int64_t size = element_size(dtypes[i]);
    if (numels[i] < 0) throw std::invalid_argument("fastnorm._C.TaskSplit: negative numel");
    numel_ += numels[i];
    nbytes_ += numels[i] * size;
    int64_t done = 0;
    while (done < numels[i]) {
      const int64_t room = std::max<int64_t>(1, (task_bytes - filled) / size);
      const int64_t take = std::min(room, numels[i] - done);
      pieces_.push_back({addrs[i] + uintptr_t(done * size), take, take * size, dtypes[i], int64_t(i)});
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
void merge(Partial& a, const Partial& b, int mode, double p) {
  switch (mode) {
    case kL2:
      merge_l2(a, b);
      break;
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

double root_of(const Partial& acc, int mode, double p) {
  switch (mode) {
    case kL2:
      return acc.m > 0.0 ? std::sqrt(acc.s) * acc.m : std::sqrt(acc.s);
    case kL1:
      return acc.s;
    case kLinf:
      return acc.m;
    default:
      return acc.m == 0.0 ? 0.0 : acc.m * std::pow(acc.s, 1.0 / p);
  }
}

}  // namespace

void merge_l2_rescaled(Partial& a, const Partial& b) {
  // An empty partial (s == 0) takes no part in choosing the scale.
  if (b.s == 0.0) return;
  if (a.s == 0.0) {
    a = b;
    return;
  }
  const double scale_a = a.m > 0.0 ? a.m : 1.0;
  const double scale_b = b.m > 0.0 ? b.m : 1.0;
  if (scale_a == scale_b) {
    // Two plain sums that overflowed together: both move to the scale 2^512.
    a.m = 0x1p512;
    a.s = std::ldexp(a.s, -1024) + std::ldexp(b.s, -1024);
    return;
  }
  // The smaller scale's sum moves to the larger one. The scales are powers of
  // two, so ldexp does it with one rounding, keeps inf and NaN as they are and
  // never makes inf * 0.
  const Partial& big = scale_a > scale_b ? a : b;
  const Partial& small = scale_a > scale_b ? b : a;
  const int shift = 2 * (std::ilogb(small.m > 0.0 ? small.m : 1.0) - std::ilogb(big.m > 0.0 ? big.m : 1.0));
  const double s = big.s + std::ldexp(small.s, shift);
  a.m = big.m;
  a.s = s;
}

namespace {

// Waits while `ready()` is false: spins a while (the wait is usually short),
// then yields the core.
template <class Ready>
void wait_until(Ready&& ready) {
  for (int spins = 0; !ready(); ++spins) {
    if (spins < 4096) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
      __builtin_ia32_pause();
#endif
    } else {
      std::this_thread::yield();
    }
  }
}

// The shared body of reduce() and reduce_checked(): each task's partial (and
// each piece's, with per_tensor_addr), then the total and its root.
// `task_ready(task)` is false when a task must be skipped.
template <class Ready>
void reduce_tasks(const TaskSplit& split, int mode, double p, uintptr_t partial_addr, uintptr_t root_addr,
                  bool root_is_double, uintptr_t per_tensor_addr, int num_threads, Ready&& task_ready,
                  const std::function<void()>* leader, const std::atomic<bool>* failed) {
  if (mode < kL2 || mode > kLp) throw std::invalid_argument("fastnorm._C.reduce: unknown mode");
  const ReduceFn reduce_piece = kernels().reduce;
  std::vector<Partial> partial(size_t(split.num_tasks()));
  std::vector<Partial> pieces(per_tensor_addr != 0 ? size_t(split.num_pieces()) : 0);
  const std::function<void(int64_t)> body = [&](int64_t task) {
    if (!task_ready(task)) return;
    Partial acc;
    split.for_each_piece(task, [&](int64_t index, const TaskSplit::Piece& piece) {
      Partial own;
      reduce_piece(piece.dtype, mode, p, reinterpret_cast<const void*>(piece.addr), piece.numel,
                   own);
      merge(acc, own, mode, p);
      if (!pieces.empty()) pieces[size_t(index)] = own;
    });
    partial[size_t(task)] = acc;
  };
  ThreadPool::instance().run(split.num_tasks(), threads_for(split, num_threads), body, leader);
  if (failed != nullptr && failed->load(std::memory_order_acquire)) return;

  Partial total;
  for (const Partial& acc : partial) merge(total, acc, mode, p);
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
    std::vector<Partial> tensors(size_t(split.num_tensors()));
    for (int64_t i = 0; i < split.num_pieces(); ++i) {
      merge(tensors[size_t(split.piece(i).tensor)], pieces[size_t(i)], mode, p);
    }
    auto* per_tensor = reinterpret_cast<double*>(per_tensor_addr);
    for (size_t t = 0; t < tensors.size(); ++t) {
      per_tensor[2 * t] = tensors[t].m;
      per_tensor[2 * t + 1] = tensors[t].s;
    }
  }
}

}  // namespace

void reduce(const TaskSplit& split, int mode, double p, uintptr_t partial_addr, uintptr_t root_addr,
            bool root_is_double, uintptr_t per_tensor_addr, int num_threads) {
  reduce_tasks(split, mode, p, partial_addr, root_addr, root_is_double, per_tensor_addr, num_threads,
               [](int64_t) { return true; }, nullptr, nullptr);
}

namespace {

// A limit dtype code: -1 (the tensor's own dtype) or a dtype's.
void check_limit_code(int32_t code) {
  if (code < -1 || code > kBFloat16) {
    throw std::invalid_argument("fastnorm._C.reduce_stats: unknown limit dtype code " + std::to_string(code));
  }
}

// A tensor's statistics as the 6 doubles of its row (fastnorm/_stats.py's COLUMNS).
void write_stats_row(const Stats& st, bool counts_only, double* row) {
  row[0] = counts_only ? std::numeric_limits<double>::quiet_NaN()
                       : st.l2.m > 0.0 ? st.l2.s * (st.l2.m * st.l2.m) : st.l2.s;
  row[1] = st.max_abs;
  row[2] = double(st.nonfinite);
  row[3] = double(st.zeros);
  row[4] = double(st.subnormal);
  row[5] = double(st.overflow);
}

}  // namespace

void reduce_stats(const TaskSplit& split, int mode, double p, uintptr_t partial_addr, uintptr_t root_addr,
                  bool root_is_double, uintptr_t thresholds_addr, uintptr_t limit_codes_addr,
                  uintptr_t stats_addr, int num_threads) {
  if ((mode < kL2 && mode != kCountsOnly) || mode > kLp) {
    throw std::invalid_argument("fastnorm._C.reduce_stats: unknown mode");
  }
  const bool counts_only = mode == kCountsOnly;
  const int merged = counts_only ? int(kL2) : mode;  // no partial to merge: every one stays empty
  const auto* limits = reinterpret_cast<const Limits*>(thresholds_addr);
  const auto* codes = reinterpret_cast<const int32_t*>(limit_codes_addr);
  for (int64_t t = 0; codes != nullptr && t < split.num_tensors(); ++t) check_limit_code(codes[t]);
  const StatsFn stats_piece = kernels().stats;
  std::vector<Partial> partial(size_t(split.num_tasks()));
  std::vector<Stats> pieces(size_t(split.num_pieces()));
  ThreadPool::instance().run(split.num_tasks(), threads_for(split, num_threads), [&](int64_t task) {
    Partial acc;
    split.for_each_piece(task, [&](int64_t index, const TaskSplit::Piece& piece) {
      const int32_t code = codes == nullptr ? -1 : codes[piece.tensor];
      Partial own;
      stats_piece(piece.dtype, mode, p, reinterpret_cast<const void*>(piece.addr), piece.numel,
                  limits[4 * piece.dtype + (code < 0 ? piece.dtype : code)], own, pieces[size_t(index)]);
      merge(acc, own, merged, p);
    });
    partial[size_t(task)] = acc;
  });

  Partial total;
  for (const Partial& acc : partial) merge(total, acc, merged, p);
  auto* out = reinterpret_cast<double*>(partial_addr);
  out[0] = total.m;
  out[1] = total.s;
  const double root = root_of(total, merged, p);
  if (root_is_double) {
    *reinterpret_cast<double*>(root_addr) = root;
  } else {
    *reinterpret_cast<float*>(root_addr) = float(root);
  }

  // Pieces into their tensors in order, the way reduce() merges per-tensor partials.
  std::vector<Stats> tensors(size_t(split.num_tensors()));
  for (int64_t i = 0; i < split.num_pieces(); ++i) {
    Stats& t = tensors[size_t(split.piece(i).tensor)];
    const Stats& own = pieces[size_t(i)];
    merge_l2(t.l2, own.l2);
    t.max_abs = own.max_abs > t.max_abs ? own.max_abs : t.max_abs;
    t.nonfinite += own.nonfinite;
    t.zeros += own.zeros;
    t.subnormal += own.subnormal;
    t.overflow += own.overflow;
  }
  auto* rows = reinterpret_cast<double*>(stats_addr);
  for (size_t t = 0; t < tensors.size(); ++t) write_stats_row(tensors[t], counts_only, rows + 6 * t);
}

void count_stats(uintptr_t addr, int64_t numel, int dtype, int limit_code, int64_t task_bytes,
                 uintptr_t thresholds_addr, uintptr_t stats_addr, int num_threads) {
  if (dtype < kFloat32 || dtype > kBFloat16) {
    throw std::invalid_argument("fastnorm._C.count_stats: unknown dtype code " + std::to_string(dtype));
  }
  check_limit_code(limit_code);
  if (numel >= 0 && task_bytes > 0 && (num_threads <= 1 || numel * element_size(dtype) < kParallelBytes)) {
    // On the calling thread either way: the tensor in one piece, with no split to build (the
    // locator calls this hundreds of times a pass, mostly on small tensors). The counts and the
    // largest magnitude do not depend on how the tensor is cut, so the row is the split's.
    const auto* limits = reinterpret_cast<const Limits*>(thresholds_addr);
    Stats st;
    if (numel > 0) {
      Partial own;
      kernels().stats(dtype, kCountsOnly, 2.0, reinterpret_cast<const void*>(addr), numel,
                      limits[4 * dtype + (limit_code < 0 ? dtype : limit_code)], own, st);
    }
    write_stats_row(st, true, reinterpret_cast<double*>(stats_addr));
    return;
  }
  const TaskSplit split({addr}, {numel}, {dtype}, task_bytes);
  const int32_t code = limit_code;
  double scratch[3];
  reduce_stats(split, kCountsOnly, 2.0, uintptr_t(scratch), uintptr_t(scratch + 2), true, thresholds_addr,
               uintptr_t(&code), stats_addr, num_threads);
}

void TaskSplit::set_gates(const std::vector<int64_t>& first_item) {
  if (int64_t(first_item.size()) != num_tensors_) {
    throw std::invalid_argument("fastnorm._C.TaskSplit.set_gates: one item index per tensor is needed");
  }
  for (size_t i = 1; i < first_item.size(); ++i) {
    if (first_item[i] < first_item[i - 1]) {
      throw std::invalid_argument("fastnorm._C.TaskSplit.set_gates: item indices must not decrease");
    }
  }
  std::vector<int64_t> gates(static_cast<size_t>(num_tasks()));
  for (int64_t task = 0; task < num_tasks(); ++task) {
    // The tasks read the tensors in order: a task's last piece holds its last
    // tensor, which the last of its items gives.
    gates[size_t(task)] = first_item[size_t(pieces_[size_t(task_start_[size_t(task) + 1] - 1)].tensor)] + 1;
  }
  gates_ = std::move(gates);
}

bool reduce_checked(const TaskSplit& split, const std::function<bool(std::atomic<int64_t>&)>& check, int mode,
                    double p, uintptr_t partial_addr, uintptr_t root_addr, bool root_is_double, int num_threads) {
  const std::vector<int64_t>& gates = split.gates();
  if (int64_t(gates.size()) != split.num_tasks()) {
    throw std::invalid_argument("fastnorm._C.reduce_checked: the split has no gates (TaskSplit.set_gates)");
  }
  std::atomic<int64_t> progress{0};
  if (!ThreadPool::uses_openmp()) {
    // The own pool serves one call at a time (a lock). The check may run
    // Python code (a TorchFunctionMode sees every attribute read), which may
    // hand the GIL to another thread that then waits for that lock holding the
    // GIL: check first, then reduce. torch's OpenMP runtime gives each calling
    // thread its own team and shares no lock between two calls.
    if (!check(progress)) return false;
    reduce(split, mode, p, partial_addr, root_addr, root_is_double, 0, num_threads);
    return true;
  }
  std::atomic<bool> failed{false};
  const std::function<void()> leader = [&] {
    if (!check(progress)) failed.store(true, std::memory_order_release);
  };
  // A task reads its tensors only once they are known to be the split's: a
  // stale address is never read, even where the check fails further on.
  auto ready = [&](int64_t task) {
    const int64_t gate = gates[size_t(task)];
    wait_until([&] {
      return progress.load(std::memory_order_acquire) >= gate || failed.load(std::memory_order_acquire);
    });
    return progress.load(std::memory_order_acquire) >= gate;
  };
  reduce_tasks(split, mode, p, partial_addr, root_addr, root_is_double, 0, num_threads, ready, &leader,
               &failed);
  return !failed.load(std::memory_order_acquire);
}

bool scale_by_norm(const TaskSplit& split, uintptr_t norm_addr, bool norm_is_double, double max_norm,
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
  ThreadPool::instance().run(split.num_tasks(), threads_for(split, num_threads), [&](int64_t task) {
    split.for_each_piece(task, [&](int64_t, const TaskSplit::Piece& piece) {
      scale_piece(piece.dtype, reinterpret_cast<void*>(piece.addr), piece.numel, coef, coef64);
    });
  });
  return true;
}

const char* isa() { return kernels().name; }

std::vector<std::string> supported_isas() {
  std::vector<std::string> names;
  for (const Kernels& k : kAll) {
    if (k.supported()) names.emplace_back(k.name);
  }
  return names;
}

void use_isa(const std::string& name) {
  const Kernels* k = find(name);
  if (k == nullptr || !k->supported()) {
    throw std::invalid_argument("fastnorm._C.use_isa: " + name + " is not one of " + supported_list());
  }
  current().store(k, std::memory_order_release);
}

namespace {

constexpr int64_t kMaxPrefetch = int64_t(1) << 16;

bool valid_prefetch(int64_t bytes) { return bytes >= 0 && bytes <= kMaxPrefetch && bytes % 64 == 0; }

#if defined(FASTNORM_HAVE_X86)
// The x86 family, as Linux's /proc/cpuinfo reports it ("cpu family"): the base
// family, plus the extended one where the base is 15 (every AMD core since K8).
int cpu_family() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return 0;
  const int base = static_cast<int>((eax >> 8) & 0xF);
  return base == 0xF ? base + static_cast<int>((eax >> 20) & 0xFF) : base;
}
#endif

int64_t default_prefetch() {
  const char* forced = std::getenv("FASTNORM_PREFETCH");
  if (forced != nullptr && *forced != 0) {
    bool digits = true;  // no sign, space or other: what fastnorm/_extension.py accepts
    for (const char* c = forced; *c != 0; ++c) digits = digits && *c >= '0' && *c <= '9';
    const long long bytes = digits ? std::strtoll(forced, nullptr, 10) : -1;
    if (!valid_prefetch(bytes)) {
      throw std::runtime_error(std::string("FASTNORM_PREFETCH=") + forced +
                               " is not a whole number of 64-byte lines from 0 to 65536 (bytes)");
    }
    return bytes;
  }
#if defined(FASTNORM_HAVE_X86)
  __builtin_cpu_init();
  const char* vendor = __builtin_cpu_is("intel") ? "intel" : __builtin_cpu_is("amd") ? "amd" : "";
  return vendor_prefetch(vendor, __builtin_cpu_supports("avx512f"), cpu_family());
#else
  return 0;
#endif
}

std::atomic<int64_t>& prefetch_setting() {
  static std::atomic<int64_t> bytes{default_prefetch()};
  return bytes;
}

}  // namespace

int64_t vendor_prefetch(const std::string& vendor, bool avx512, int family) {
  if (vendor == "intel") return 4096;
  if (vendor == "amd" && !avx512) return 1024;
  if (vendor == "amd" && family >= 26) return 4096;
  return 0;
}

int64_t prefetch_bytes() { return prefetch_setting().load(std::memory_order_relaxed); }

void set_prefetch_bytes(int64_t bytes) {
  if (!valid_prefetch(bytes)) {
    throw std::invalid_argument("fastnorm._C.set_prefetch_bytes: " + std::to_string(bytes) +
                                " is not a whole number of 64-byte lines from 0 to 65536");
  }
  prefetch_setting().store(bytes, std::memory_order_relaxed);
}

}  // namespace fastnorm

namespace fastnorm {

double clock_hz(double seconds) {
#if defined(FASTNORM_HAVE_X86)
  // A chain of dependent register additions retires one per cycle on every
  // x86-64 core (register-register adds are neither fused nor eliminated).
  using clock = std::chrono::steady_clock;
  constexpr int64_t kAdds = 1 << 20;
  double best = 0.0;
  const auto stop = clock::now() + std::chrono::duration<double>(seconds);
  do {
    uint64_t x = 1;
    const auto t0 = clock::now();
    for (int64_t i = 0; i < kAdds; i += 8) {
      asm volatile(
          "add %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\t"
          "add %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\tadd %0, %0"
          : "+r"(x));
    }
    const double elapsed = std::chrono::duration<double>(clock::now() - t0).count();
    best = std::max(best, double(kAdds) / elapsed);
  } while (clock::now() < stop);
  return best;
#else
  (void)seconds;
  return 0.0;
#endif
}

}  // namespace fastnorm
