// Loops over whole vectors of W floats whose last, partial vector goes through the same vector code
// on a padded copy: an element's result never depends on where in the array it sits.
#pragma once

#include <cstdint>
#include <cstring>

namespace mlxnb {

template <int W, class F>
inline void map1(const float* x, float* y, int64_t n, F&& f, float pad = 0.0f) {
  int64_t i = 0;
  for (; i + W <= n; i += W) f(x + i, y ? y + i : nullptr);
  if (i < n) {
    alignas(64) float a[W], out[W];
    for (int j = 0; j < W; ++j) a[j] = i + j < n ? x[i + j] : pad;
    f(a, y ? out : nullptr);
    if (y) std::memcpy(y + i, out, (n - i) * sizeof(float));
  }
}

template <int W, class F>
inline void map2(const float* x, const float* z, float* y, int64_t n, F&& f) {
  int64_t i = 0;
  for (; i + W <= n; i += W) f(x + i, z + i, y + i);
  if (i < n) {
    alignas(64) float a[W] = {}, b[W] = {}, out[W];
    std::memcpy(a, x + i, (n - i) * sizeof(float));
    std::memcpy(b, z + i, (n - i) * sizeof(float));
    f(a, b, out);
    std::memcpy(y + i, out, (n - i) * sizeof(float));
  }
}

template <int W, class F>
inline void reduce1(const float* x, int64_t n, float pad, F&& f) {
  int64_t i = 0;
  for (; i + W <= n; i += W) f(x + i);
  if (i < n) {
    alignas(64) float a[W];
    for (int j = 0; j < W; ++j) a[j] = i + j < n ? x[i + j] : pad;
    f(a);
  }
}

}  // namespace mlxnb
