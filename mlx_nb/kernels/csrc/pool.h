// A small thread pool for the kernels: the calling thread takes part, workers spin briefly between
// jobs (a decode step runs hundreds of short kernels back to back) and then sleep, so they leave the
// cores to BLAS and Python when no kernel runs. While spinning they yield the core to any other
// runnable thread: on a 2-core machine the thread building the next step's graph is one, and a
// worker that only spun would starve it (about 7% fewer tokens/s for one stream).
//
// A job is open to workers only while the caller runs it. The caller then waits only for the workers
// that joined, never for one that has not woken yet: with three busy threads on two cores, waiting
// for every worker to check in made a step's small matmuls wait for the scheduler.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mlxnb {

class Pool {
 public:
  static Pool& instance();
  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  // Runs fn(i) for every i in [0, n) across the pool and the caller; returns when all are done.
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);
  ~Pool();

 private:
  explicit Pool(int threads, int spin_us);
  void work(int id);
  void run_tasks();
  void join(uint64_t gen);

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one job at a time
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};  // bumped when a job opens
  std::atomic<bool> open_{false};         // whether the current generation's job may be joined
  std::atomic<int> sleeping_{0};
  std::atomic<int> inside_{0};            // workers inside a job
  std::atomic<int64_t> next_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int spin_us_;
};

// Threads the kernels use (MLX_NB_THREADS, else the CPUs this process may run on).
int default_threads();

}  // namespace mlxnb
