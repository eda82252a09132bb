#include "pool.h"

#include <sched.h>

#include <chrono>
#include <cstdlib>

#if defined(__x86_64__)
#include <immintrin.h>
#define MLXNB_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define MLXNB_PAUSE() asm volatile("yield")
#else
#define MLXNB_PAUSE() \
  do {                \
  } while (0)
#endif

namespace mlxnb {

int default_threads() {
  if (const char* env = std::getenv("MLX_NB_THREADS")) {
    const int n = std::atoi(env);
    if (n >= 1) return n;
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n >= 1) return n;
  }
  const unsigned n = std::thread::hardware_concurrency();
  return n ? static_cast<int>(n) : 1;
}

Pool& Pool::instance() {
  static Pool* pool = [] {
    int spin = 200;
    if (const char* env = std::getenv("MLX_NB_SPIN_US")) spin = std::atoi(env);
    return new Pool(default_threads(), spin);  // never destroyed: workers may outlive static teardown
  }();
  return *pool;
}

Pool::Pool(int threads, int spin_us) : spin_us_(spin_us) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { work(i); });
}

Pool::~Pool() {
  stop_.store(true);
  generation_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    wake_.notify_all();
  }
  for (auto& t : workers_) t.join();
}

void Pool::run_tasks() {
  for (int64_t i; (i = next_.fetch_add(1)) < n_;) (*fn_)(i);
}

void Pool::work(int) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load();
    if (gen == seen) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
      for (int k = 0; (gen = generation_.load()) == seen; ++k) {
        MLXNB_PAUSE();
        if ((k & 63) == 63) {
          if (std::chrono::steady_clock::now() > until) break;
          sched_yield();  // a waiting Python thread (the next step's graph) may take the core meanwhile
        }
      }
      if (gen == seen) {
        std::unique_lock<std::mutex> lock(sleep_mutex_);
        sleeping_.fetch_add(1);
        wake_.wait(lock, [&] { return (gen = generation_.load()) != seen; });
        sleeping_.fetch_sub(1);
      }
    }
    seen = gen;
    if (stop_.load()) return;
    join(gen);
  }
}

void Pool::join(uint64_t gen) {
  // Join only the job this generation opened, and only while it is open: the caller closes it
  // before it waits, and waits for exactly the workers inside (seq_cst on both sides).
  inside_.fetch_add(1);
  if (open_.load() && generation_.load() == gen) run_tasks();
  inside_.fetch_sub(1);
}

void Pool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::lock_guard<std::mutex> guard(call_mutex_);
  while (inside_.load() != 0) MLXNB_PAUSE();  // a worker late for the last job is on its way out
  fn_ = &fn;
  n_ = n;
  next_.store(0);
  open_.store(true);
  generation_.fetch_add(1);
  if (sleeping_.load() > 0) {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    wake_.notify_all();
  }
  run_tasks();
  open_.store(false);
  while (inside_.load() != 0) MLXNB_PAUSE();  // the tasks workers took are done when they leave
}

}  // namespace mlxnb
