// Portable kernels: plain C++, the reference every SIMD table is tested against and the path on CPUs
// (or builds) without one. Same algorithms and data layout as the SIMD files, one value at a time.
#include <cmath>
#include <cstring>

#include "attn_block.h"
#include "isa.h"

namespace mlxnb {
namespace {

void quantize_rows(const float* x, int64_t rows, int64_t K, int digits, int8_t* q, float* d, float* sum,
                   float* half) {
  const int64_t nb = K / kBlock;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + r * K + b * kBlock;
      const int64_t i = r * nb + b;
      int8_t* qb = q + i * kBlock * digits;
      float amax = 0.0f;
      for (int j = 0; j < kBlock; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
      const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
      int32_t qs[2] = {0, 0};
      for (int j = 0; j < kBlock; ++j) {
        const float v = xb[j] * id, hi = std::nearbyint(v);
        qb[j] = static_cast<int8_t>(hi);
        if (digits == 2) {
          const float lo = std::nearbyint((v - hi) * static_cast<float>(kFine));
          qb[kBlock + j] = static_cast<int8_t>(lo);
          qs[j / 16] += kFine * static_cast<int32_t>(hi) + static_cast<int32_t>(lo);
        } else {
          qs[j / 16] += static_cast<int32_t>(hi);
        }
      }
      d[i] = amax / (digits == 2 ? 127.0f * kFine : 127.0f);
      sum[i] = d[i] * static_cast<float>(qs[0] + qs[1]);
      half[2 * i] = d[i] * static_cast<float>(qs[0]);
      half[2 * i + 1] = d[i] * static_cast<float>(qs[1]);
    }
  }
}

void qgemm(const QGemm& g, int64_t t0, int64_t t1) {
  const int64_t nb = g.K / kBlock, bb = block_bytes(g.w.bits);
  const bool halves = g.w.scheme == kQ6K, two = g.x.digits == 2;
  for (int64_t t = t0; t < t1; ++t) {
    const int lanes = static_cast<int>(g.N - t * kLanes < kLanes ? g.N - t * kLanes : kLanes);
    for (int64_t m = 0; m < g.M; ++m) {
      for (int o = 0; o < lanes; ++o) {
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
          const uint8_t* blk = g.w.q + (t * nb + b) * bb;
          const int8_t* xb = g.x.q + (m * nb + b) * kBlock * g.x.digits;
          int32_t dot[2] = {0, 0};
          for (int k = 0; k < kBlock; ++k) {
            const int32_t xv = two ? kFine * xb[k] + xb[kBlock + k] : xb[k];
            dot[k / 16] += packed_q(blk, g.w.bits, o, k) * xv;
          }
          const BlockScale s = block_scale(g.w, g.K, t, b, o);
          const int64_t i = m * nb + b;
          const float dx = g.x.d[i];
          if (halves) {
            acc = std::fma(static_cast<float>(dot[0]), s.s0 * dx, acc);
            acc = std::fma(static_cast<float>(dot[1]), s.s1 * dx, acc);
            acc = std::fma(s.b0, g.x.half[2 * i], acc);
            acc = std::fma(s.b1, g.x.half[2 * i + 1], acc);
          } else {
            acc = std::fma(static_cast<float>(dot[0] + dot[1]), s.s0 * dx, acc);
            acc = std::fma(s.b0, g.x.sum[i], acc);
          }
        }
        g.out[m * g.N + t * kLanes + o] = acc;
      }
    }
  }
}

void vexp(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

void silu_mul(const float* g, const float* u, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss = std::fma(x[i], x[i], ss);
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * w[i];
}

float row_max(const float* x, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::fmax(m, x[i]);
  return m;
}

float softmax(const float* x, float* y, int64_t n) {
  const float m = row_max(x, n);
  if (m == -INFINITY) {  // every entry masked: MLX's softmax gives NaN; keep the row finite (zeros)
    std::memset(y, 0, n * sizeof(float));
    return -INFINITY;
  }
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += (y[i] = std::exp(x[i] - m));
  const float inv = 1.0f / s;
  for (int64_t i = 0; i < n; ++i) y[i] *= inv;
  return m + std::log(s);
}

float logsumexp(const float* x, int64_t n) {
  const float m = row_max(x, n);
  if (!std::isfinite(m)) return m;
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] - m);
  return m + std::log(s);
}

void sub_scalar(const float* x, float c, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] - c;
}

// One float at a time, for the kernels written once over vector operations (attn_block.h).
struct Scalar {
  static constexpr int W = 1;
  using reg = float;
  static reg zero() { return 0.0f; }
  static reg load(const float* p) { return *p; }
  static void store(float* p, reg v) { *p = v; }
  static reg set1(float x) { return x; }
  static reg fmadd(reg a, reg b, reg c) { return std::fma(a, b, c); }
  static reg sub(reg a, reg b) { return a - b; }
  static reg mul(reg a, reg b) { return a * b; }
  static float hsum(reg v) { return v; }
  static bool dot16(const float*, const float*, int64_t, int64_t, float*) { return false; }
  static reg exp(reg v) { return std::exp(v); }
};

}  // namespace

void gelu(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678118654752f));
}

const Isa kPortable = {"portable", quantize_rows, qgemm, vexp, silu_mul, rms_norm, softmax, logsumexp, sub_scalar,
                       attn_block_t<Scalar>, gelu};

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(man), -24);  // zero or subnormal
  } else if (exp == 31) {
    f = man ? NAN : INFINITY;
  } else {
    uint32_t bits = ((exp + 112) << 23) | (man << 13);
    std::memcpy(&f, &bits, 4);
  }
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits |= sign;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace mlxnb
