// Parallel tasks: the calling thread plus up to N-1 helpers take task indices
// from one atomic counter until none are left.
//
// The helpers are torch's own OpenMP threads when the Python side has attached
// the OpenMP runtime torch loaded (attach_openmp): right after a torch op those
// threads are still spinning, and a second set of threads would fight them for
// the cores (a 20% loss seen on 2 cores). Otherwise, a small persistent pool of
// our own. The extension is not linked to any OpenMP runtime: it calls the one
// already in the process through its C ABI (GOMP_parallel), which libgomp,
// Intel's libiomp5 and LLVM's libomp all provide.
//
// Every helper runs a call's tasks under the calling thread's floating-point
// modes (FloatModes), so that a task gives the same bits on any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#if !defined(_WIN32)
#include <dlfcn.h>
#include <unistd.h>
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace fastnorm {

// The floating-point modes that decide a result's bits: flush-to-zero,
// denormals-are-zero and the rounding mode, which live in a per-thread
// register (MXCSR on x86-64). torch.set_flush_denormal(True) sets the first
// two on its calling thread only, and the helper threads (torch's OpenMP
// threads, our own) keep the modes they started with: a subnormal float32 read
// on the calling thread counted as 0 and exactly on the others, so 48 tensors
// of 65,536 values of 1e-39 gave a norm that changed from call to call. The
// caller's modes rule every task instead, the same answer as one thread's
// (torch's own ops answer 0 there too). Other platforms: torch sets no flush
// mode there, and none is carried over.
class FloatModes {
 public:
  // The calling thread's modes.
  static unsigned current() {
#if defined(__x86_64__) || defined(_M_X64)
    return _mm_getcsr() & kModes;
#else
    return 0;
#endif
  }

  // Runs this thread under `modes` until the end of the scope, then puts its
  // own register back as it was.
  class Scope {
   public:
    explicit Scope(unsigned modes) {
#if defined(__x86_64__) || defined(_M_X64)
      saved_ = _mm_getcsr();
      if ((saved_ & kModes) != modes) {
        _mm_setcsr((saved_ & ~kModes) | modes);
        changed_ = true;
      }
#else
      (void)modes;
#endif
    }
    ~Scope() {
#if defined(__x86_64__) || defined(_M_X64)
      if (changed_) _mm_setcsr(saved_);
#endif
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    unsigned saved_ = 0;
    bool changed_ = false;
  };

 private:
  // MXCSR: flush-to-zero (bit 15), rounding control (bits 13-14), denormals-are-zero (bit 6).
  static constexpr unsigned kModes = 0x8000u | 0x6000u | 0x0040u;
};

class ThreadPool {
 public:
  // The pool of this process. A child made by fork() gets a fresh one: the
  // parent's threads do not exist there.
  static ThreadPool& instance() {
    static std::mutex guard;
    static ThreadPool* pool = nullptr;
    std::lock_guard<std::mutex> lock(guard);
    const long pid = current_pid();
    if (pool == nullptr || pool->pid_ != pid) {
      pool = new ThreadPool(pid);  // never destroyed: workers may outlive static destructors
    }
    return *pool;
  }

  // Uses the OpenMP runtime already loaded from `path` for the helpers.
  // Returns false (and keeps the own pool) when it is not loaded or lacks the ABI.
  static bool attach_openmp(const char* path) {
#if defined(_WIN32)
    (void)path;
    return false;
#else
    void* handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) return false;
    auto parallel = reinterpret_cast<GompParallel>(dlsym(handle, "GOMP_parallel"));
    if (parallel == nullptr) return false;
    openmp_parallel() = parallel;
    return true;
#endif
  }

  static bool uses_openmp() { return openmp_parallel() != nullptr; }

  // Runs fn(task) for every task in [0, num_tasks) on at most num_threads
  // threads, the caller included, each under the caller's floating-point
  // modes, and returns when all are done. With a `leader`, the calling thread
  // runs it first, while the helpers start on the tasks (which may wait for
  // something the leader does).
  void run(int64_t num_tasks, int num_threads, const std::function<void(int64_t)>& fn,
           const std::function<void()>* leader = nullptr) {
    if (num_threads <= 1 || num_tasks <= 1) {
      if (leader != nullptr) (*leader)();
      for (int64_t t = 0; t < num_tasks; ++t) fn(t);
      return;
    }
    if (GompParallel parallel = openmp_parallel()) {
      OpenMPJob job{&fn, num_tasks, {0}, leader, std::this_thread::get_id(), FloatModes::current()};
      const auto threads = unsigned(std::min<int64_t>(num_threads, num_tasks));
      parallel(&OpenMPJob::work, &job, threads, 0);
      return;
    }
    std::lock_guard<std::mutex> run_lock(run_mutex_);
    const int helpers = int(std::min<int64_t>(num_threads, num_tasks)) - 1;
    grow(helpers);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fn_ = &fn;
      modes_ = FloatModes::current();
      num_tasks_ = num_tasks;
      next_.store(0);
      helpers_ = helpers;
      pending_.store(helpers);
      ++generation_;
    }
    wake_.notify_all();
    if (leader != nullptr) (*leader)();
    drain();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_.load() == 0; });
    fn_ = nullptr;
  }

 private:
  using GompParallel = void (*)(void (*)(void*), void*, unsigned, unsigned);

  static GompParallel& openmp_parallel() {
    static GompParallel parallel = nullptr;
    return parallel;
  }

  struct OpenMPJob {
    const std::function<void(int64_t)>* fn;
    int64_t num_tasks;
    std::atomic<int64_t> next;
    const std::function<void()>* leader;
    std::thread::id caller;  // GOMP_parallel runs the work on the calling thread too
    unsigned modes;          // the caller's FloatModes

    static void work(void* data) {
      auto* job = static_cast<OpenMPJob*>(data);
      if (job->leader != nullptr && std::this_thread::get_id() == job->caller) (*job->leader)();
      const FloatModes::Scope scope(job->modes);  // a no-op on the caller
      for (int64_t t = job->next.fetch_add(1); t < job->num_tasks; t = job->next.fetch_add(1)) (*job->fn)(t);
    }
  };

  explicit ThreadPool(long pid) : pid_(pid) {}

  static long current_pid() {
#if defined(_WIN32)
    return 0;
#else
    return long(getpid());
#endif
  }

  void grow(int helpers) {
    while (int(workers_.size()) < helpers) {
      const int index = int(workers_.size());
      workers_.emplace_back([this, index] { work(index); });
      workers_.back().detach();
    }
  }

  void drain() {
    for (int64_t t = next_.fetch_add(1); t < num_tasks_; t = next_.fetch_add(1)) (*fn_)(t);
  }

  void work(int index) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (index >= helpers_) continue;
      }
      {
        const FloatModes::Scope scope(modes_);
        drain();
      }
      if (pending_.fetch_sub(1) == 1) {
        std::lock_guard<std::mutex> lock(mutex_);
        done_.notify_one();
      }
    }
  }

  const long pid_;
  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  unsigned modes_ = 0;  // the caller's FloatModes
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<int> pending_{0};
  int helpers_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace fastnorm
