// A small persistent thread pool: the calling thread plus up to N-1 workers
// take task indices from one atomic counter until none are left.
//
// Persistent, because starting threads costs tens of microseconds per call;
// ours, rather than OpenMP, because a second OpenMP runtime next to the one
// torch ships fights it for the cores.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#if !defined(_WIN32)
#include <unistd.h>
#endif

namespace fastnorm {

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

  // Runs fn(task) for every task in [0, num_tasks) on at most num_threads
  // threads, the caller included, and returns when all are done. Calls from
  // several threads at once are serialized.
  void run(int64_t num_tasks, int num_threads, const std::function<void(int64_t)>& fn) {
    if (num_threads <= 1 || num_tasks <= 1) {
      for (int64_t t = 0; t < num_tasks; ++t) fn(t);
      return;
    }
    std::lock_guard<std::mutex> run_lock(run_mutex_);
    const int helpers = int(std::min<int64_t>(num_threads, num_tasks)) - 1;
    grow(helpers);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fn_ = &fn;
      num_tasks_ = num_tasks;
      next_.store(0);
      helpers_ = helpers;
      pending_.store(helpers);
      ++generation_;
    }
    wake_.notify_all();
    drain();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_.load() == 0; });
    fn_ = nullptr;
  }

 private:
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
      drain();
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
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<int> pending_{0};
  int helpers_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace fastnorm
