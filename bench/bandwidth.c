/* This machine's memory read bandwidth: every core streams its share of a 1 GiB buffer with AVX2
   (or plain) loads; the best of five passes, in GB/s. What a single decode stream of a
   memory-bound model can read at most. Built and run by bench/limits.py. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

static size_t total;
static unsigned char* buf;
static int threads;
static volatile uint64_t sink;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void* stream(void* arg) {
  const size_t per = total / threads, id = (size_t)arg;
  const unsigned char* p = buf + id * per;
#if defined(__AVX2__)
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (size_t i = 0; i + 128 <= per; i += 128) {
    a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i*)(p + i)));
    b = _mm256_xor_si256(b, _mm256_load_si256((const __m256i*)(p + i + 32)));
    c = _mm256_xor_si256(c, _mm256_load_si256((const __m256i*)(p + i + 64)));
    d = _mm256_xor_si256(d, _mm256_load_si256((const __m256i*)(p + i + 96)));
  }
  sink = (uint64_t)_mm256_extract_epi64(_mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d)), 0);
#else
  uint64_t acc = 0;
  for (size_t i = 0; i + 8 <= per; i += 8) acc ^= *(const uint64_t*)(p + i);
  sink = acc;
#endif
  return NULL;
}

int main(int argc, char** argv) {
  threads = argc > 1 ? atoi(argv[1]) : 1;
  total = (size_t)1 << 30;
  buf = aligned_alloc(64, total);
  memset(buf, 1, total);
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    pthread_t th[256];
    const double t = now();
    for (long i = 0; i < threads; ++i) pthread_create(&th[i], NULL, stream, (void*)i);
    for (int i = 0; i < threads; ++i) pthread_join(th[i], NULL);
    const double dt = now() - t;
    if (dt < best) best = dt;
  }
  printf("%.2f\n", total / best / 1e9);
  return 0;
}
