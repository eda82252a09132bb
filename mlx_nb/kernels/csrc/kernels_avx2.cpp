// AVX2 + FMA kernels (compiled with -mavx2 -mfma -mf16c; chosen at run time when the CPU has them).
// 4-bit weights: u8 x s8 products with maddubs (at most 15 * 127 * 2 per pair, no saturation);
// 8-bit weights: widened to 16 bits and multiplied with madd, which is exact for 0..255 x -127..127.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "isa.h"
#include "attn_row.h"
#include "simd_tail.h"

namespace mlxnb {
namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// exp to ~1 ulp (Cephes' polynomial); exactly 0 below -87.33, as the masked entries of a softmax need.
inline __m256 exp8(__m256 x) {
  const __m256 zero_below = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3365f), _CMP_LT_OQ);
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3365f));
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(zero_below, y);
}

void quantize_rows(const float* x, int64_t rows, int64_t K, int8_t* q, float* d, float* sum) {
  const int64_t nb = K / kBlock;
  const __m256 sign = _mm256_set1_ps(-0.0f), fine = _mm256_set1_ps(static_cast<float>(kFine));
  alignas(32) int32_t hv[kBlock], lv[kBlock];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + r * K + b * kBlock;
      const int64_t i = r * nb + b;
      __m256 xs[4];
      __m256 m = _mm256_setzero_ps();
      for (int j = 0; j < 4; ++j) {
        xs[j] = _mm256_loadu_ps(xb + 8 * j);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, xs[j]));
      }
      const float amax = hmax(m);
      const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
      for (int j = 0; j < 4; ++j) {
        const __m256 v = _mm256_mul_ps(xs[j], id);
        const __m256i h = _mm256_cvtps_epi32(v);
        _mm256_store_si256(reinterpret_cast<__m256i*>(hv + 8 * j), h);
        _mm256_store_si256(reinterpret_cast<__m256i*>(lv + 8 * j),
                           _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(v, _mm256_cvtepi32_ps(h)), fine)));
      }
      int8_t* qb = q + i * 2 * kBlock;
      int32_t qs = 0;
      for (int j = 0; j < kBlock; ++j) {
        qb[j] = static_cast<int8_t>(hv[j]);
        qb[kBlock + j] = static_cast<int8_t>(lv[j]);
        qs += kFine * hv[j] + lv[j];
      }
      d[i] = amax / (127.0f * kFine);
      sum[i] = d[i] * static_cast<float>(qs);
    }
  }
}

template <bool HALF>
inline __m256 load8(const void* p, int64_t i) {
  if constexpr (HALF)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
  return _mm256_loadu_ps(static_cast<const float*>(p) + i);
}

inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// The 8 int32 dot products of one block for outputs 8h .. 8h + 7 of a tile, for the digits at xb.
// 16-bit partial sums stay exact: a 4-bit weight (or a nibble of an 8-bit one) times 127, 8 pairs
// deep, is at most 30,480.
template <int BITS>
inline __m256i block_dot(const uint8_t* wb, int h, const int8_t* xb) {
  const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
  if constexpr (BITS == 4) {
    for (int j = 0; j < 4; ++j) {
      const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + j * 64 + h * 32));
      lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(_mm256_and_si256(z, nib), bcast4(xb + 4 * j)));
      lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(z, 4), nib),
                                                     bcast4(xb + 16 + 4 * j)));
    }
    return _mm256_madd_epi16(lo, ones);
  } else {
    for (int j = 0; j < 8; ++j) {
      const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + j * 64 + h * 32));
      const __m256i xv = bcast4(xb + 4 * j);
      lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(_mm256_and_si256(z, nib), xv));
      hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(z, 4), nib), xv));
    }
    return _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_slli_epi32(_mm256_madd_epi16(hi, ones), 4));
  }
}

template <int BITS, bool HALF>
void qgemm_t(const QGemm& g, int64_t t0, int64_t t1) {
  const int64_t nb = g.K / kBlock, ng = g.K / g.w.group_size, bpg = g.w.group_size / kBlock;
  constexpr int64_t BB = kLanes * kBlock * BITS / 8;
  alignas(32) float tmp[kLanes];
  for (int64_t t = t0; t < t1; ++t) {
    const uint8_t* wt = g.w.q + t * nb * BB;
    const int64_t left = g.N - t * kLanes, lanes = left < kLanes ? left : kLanes;
    for (int64_t m = 0; m < g.M; ++m) {
      __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t si = (t * ng + b / bpg) * kLanes;
        const int8_t* xb = g.x.q + (m * nb + b) * 2 * kBlock;
        const __m256 dv = _mm256_set1_ps(g.x.d[m * nb + b]), sumv = _mm256_set1_ps(g.x.sum[m * nb + b]);
        for (int h = 0; h < 2; ++h) {
          const __m256i hi = block_dot<BITS>(wt + b * BB, h, xb), lo = block_dot<BITS>(wt + b * BB, h, xb + kBlock);
          // 254 * hi + lo, exact in 32 bits
          const __m256 dot = _mm256_cvtepi32_ps(
              _mm256_add_epi32(_mm256_sub_epi32(_mm256_slli_epi32(hi, 8), _mm256_slli_epi32(hi, 1)), lo));
          acc[h] = _mm256_fmadd_ps(dot, _mm256_mul_ps(load8<HALF>(g.w.scales, si + 8 * h), dv), acc[h]);
          acc[h] = _mm256_fmadd_ps(load8<HALF>(g.w.biases, si + 8 * h), sumv, acc[h]);
        }
      }
      _mm256_store_ps(tmp, acc[0]);
      _mm256_store_ps(tmp + 8, acc[1]);
      std::memcpy(g.out + m * g.N + t * kLanes, tmp, lanes * sizeof(float));
    }
  }
}

void qgemm(const QGemm& g, int64_t t0, int64_t t1) {
  if (g.w.bits == 4) {
    g.w.half ? qgemm_t<4, true>(g, t0, t1) : qgemm_t<4, false>(g, t0, t1);
  } else {
    g.w.half ? qgemm_t<8, true>(g, t0, t1) : qgemm_t<8, false>(g, t0, t1);
  }
}

// Element-wise loops: whole vectors, and the tail through a padded copy so that every element goes
// through the same vector code wherever it sits.
void vexp(const float* x, float* y, int64_t n) {
  map1<8>(x, y, n, [](const float* a, float* out) { _mm256_storeu_ps(out, exp8(_mm256_loadu_ps(a))); });
}

void silu_mul(const float* g, const float* u, float* y, int64_t n) {
  map2<8>(g, u, y, n, [](const float* a, const float* b, float* out) {
    const __m256 gv = _mm256_loadu_ps(a);
    const __m256 den = _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv)));
    _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_div_ps(gv, den), _mm256_loadu_ps(b)));
  });
}

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  __m256 ss = _mm256_setzero_ps();
  reduce1<8>(x, n, 0.0f, [&](const float* a) {
    const __m256 v = _mm256_loadu_ps(a);
    ss = _mm256_fmadd_ps(v, v, ss);
  });
  const float r = 1.0f / std::sqrt(hsum(ss) / static_cast<float>(n) + eps);
  const __m256 rv = _mm256_set1_ps(r);
  map2<8>(x, w, y, n, [&](const float* a, const float* b, float* out) {
    _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(a), rv), _mm256_loadu_ps(b)));
  });
}

float row_max(const float* x, int64_t n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  reduce1<8>(x, n, -INFINITY, [&](const float* a) { m = _mm256_max_ps(m, _mm256_loadu_ps(a)); });
  return hmax(m);
}

float exp_sum(const float* x, float* y, int64_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 s = _mm256_setzero_ps();
  map1<8>(x, y, n, [&](const float* a, float* out) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(a), mv));
    s = _mm256_add_ps(s, e);
    if (out) _mm256_storeu_ps(out, e);
  }, /*pad=*/-INFINITY);
  return hsum(s);
}

float softmax(const float* x, float* y, int64_t n) {
  const float m = row_max(x, n);
  if (m == -INFINITY) {
    std::memset(y, 0, n * sizeof(float));
    return -INFINITY;
  }
  const float s = exp_sum(x, y, n, m);
  const __m256 inv = _mm256_set1_ps(1.0f / s);
  map1<8>(y, y, n, [&](const float* a, float* out) { _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_loadu_ps(a), inv)); });
  return m + std::log(s);
}

float logsumexp(const float* x, int64_t n) {
  const float m = row_max(x, n);
  if (!std::isfinite(m)) return m;
  return m + std::log(exp_sum(x, nullptr, n, m));
}

void sub_scalar(const float* x, float c, float* y, int64_t n) {
  const __m256 cv = _mm256_set1_ps(c);
  map1<8>(x, y, n, [&](const float* a, float* out) { _mm256_storeu_ps(out, _mm256_sub_ps(_mm256_loadu_ps(a), cv)); });
}

// This instruction set's vector operations, for the kernels written once over them (attn_row.h).
struct Vec {
  static constexpr int W = 8;
  using reg = __m256;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static reg set1(float x) { return _mm256_set1_ps(x); }
  static reg fmadd(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static float hsum(reg v) { return mlxnb::hsum(v); }
  static bool dot16(const float*, const float*, int64_t, int64_t, float*) { return false; }
  static reg exp(reg v) { return exp8(v); }
};

}  // namespace

const Isa kAvx2 = {"avx2", quantize_rows, qgemm, vexp, silu_mul, rms_norm, softmax, logsumexp, sub_scalar, attn_row_t<Vec>};

}  // namespace mlxnb
