// AVX2 + FMA kernels (compiled with -mavx2 -mfma -mf16c; chosen at run time when the CPU has them).
// 4/5/6-bit weights: u8 x s8 products with maddubs, summed in 16 bits only as deep as cannot
// saturate; 8-bit weights by their two nibbles. A tile's 16 outputs are two 8-lane halves: for one
// or two rows both halves are computed in one pass over the weights, so the computing overlaps
// the weights streaming in from memory (one stream reads at ~90% of this machine's bandwidth).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "isa.h"
#include "attn_block.h"
#include "elementwise.h"

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

void quantize_rows(const float* x, int64_t rows, int64_t K, int digits, int8_t* q, float* d, float* sum,
                   float* half) {
  const int64_t nb = K / kBlock;
  const __m256 sign = _mm256_set1_ps(-0.0f), fine = _mm256_set1_ps(static_cast<float>(kFine));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + r * K + b * kBlock;
      const int64_t i = r * nb + b;
      int8_t* qb = q + i * kBlock * digits;
      __m256 xs[4];
      __m256 m = _mm256_setzero_ps();
      for (int j = 0; j < 4; ++j) {
        xs[j] = _mm256_loadu_ps(xb + 8 * j);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, xs[j]));
      }
      const float amax = hmax(m);
      const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
      __m256i hi[4], lo[4];
      for (int j = 0; j < 4; ++j) {
        const __m256 v = _mm256_mul_ps(xs[j], id);
        hi[j] = _mm256_cvtps_epi32(v);
        if (digits == 2) lo[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(v, _mm256_cvtepi32_ps(hi[j])), fine));
      }
      // int32 -> int8 in order: pack to 16 bits, then 8, then undo the per-128-bit-lane interleave
      auto store8 = [&](const __m256i* v, int8_t* dst) {
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_permutevar8x32_epi32(p, order));
      };
      store8(hi, qb);
      __m256i sa = _mm256_add_epi32(hi[0], hi[1]), sb = _mm256_add_epi32(hi[2], hi[3]);
      if (digits == 2) {
        store8(lo, qb + kBlock);
        const __m256i kf = _mm256_set1_epi32(kFine);
        sa = _mm256_add_epi32(_mm256_mullo_epi32(sa, kf), _mm256_add_epi32(lo[0], lo[1]));
        sb = _mm256_add_epi32(_mm256_mullo_epi32(sb, kf), _mm256_add_epi32(lo[2], lo[3]));
      }
      alignas(32) int32_t t[16];
      _mm256_store_si256(reinterpret_cast<__m256i*>(t), sa);
      _mm256_store_si256(reinterpret_cast<__m256i*>(t + 8), sb);
      int32_t s0 = 0, s1 = 0;
      for (int j = 0; j < 8; ++j) s0 += t[j], s1 += t[8 + j];
      d[i] = amax / (digits == 2 ? 127.0f * kFine : 127.0f);
      sum[i] = d[i] * static_cast<float>(s0 + s1);
      half[2 * i] = d[i] * static_cast<float>(s0);
      half[2 * i + 1] = d[i] * static_cast<float>(s1);
    }
  }
}

template <bool HALF>
inline __m256 load8(const void* p, int64_t i) {
  if constexpr (HALF)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
  return _mm256_loadu_ps(static_cast<const float*>(p) + i);
}

inline __m256 load8_u8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

inline __m256 load8_i8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

inline __m256i or_masked(__m256i w, __m256i shifted, __m256i mask) {
  return _mm256_or_si256(w, _mm256_and_si256(shifted, mask));
}

// The q of outputs 8h .. 8h + 7 of a block as bytes: w[j] holds inputs 4j .. 4j + 3 (isa.h's layout;
// 5 and 6 bits as in kernels_avx512.cpp). Not for 8 bits, which block_dot reads by nibbles.
template <int BITS>
MLXNB_ALWAYS_INLINE void unpack(const uint8_t* wb, int h, __m256i w[8]) {
  const __m256i nib = _mm256_set1_epi8(0x0F);
  for (int j = 0; j < 4; ++j) {
    const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + j * 64 + h * 32));
    w[j] = _mm256_and_si256(z, nib);
    w[j + 4] = _mm256_and_si256(_mm256_srli_epi16(z, 4), nib);
  }
  if constexpr (BITS == 5) {
    const __m256i hp = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 256 + h * 32));
    const __m256i bit = _mm256_set1_epi8(0x10);
    w[0] = or_masked(w[0], _mm256_slli_epi16(hp, 4), bit);
    w[1] = or_masked(w[1], _mm256_slli_epi16(hp, 3), bit);
    w[2] = or_masked(w[2], _mm256_slli_epi16(hp, 2), bit);
    w[3] = or_masked(w[3], _mm256_slli_epi16(hp, 1), bit);
    w[4] = or_masked(w[4], hp, bit);
    w[5] = or_masked(w[5], _mm256_srli_epi16(hp, 1), bit);
    w[6] = or_masked(w[6], _mm256_srli_epi16(hp, 2), bit);
    w[7] = or_masked(w[7], _mm256_srli_epi16(hp, 3), bit);
  }
  if constexpr (BITS == 6) {
    const __m256i two = _mm256_set1_epi8(0x30);
    for (int p = 0; p < 2; ++p) {
      const __m256i hp = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 256 + 64 * p + h * 32));
      w[4 * p] = or_masked(w[4 * p], _mm256_slli_epi16(hp, 4), two);
      w[4 * p + 1] = or_masked(w[4 * p + 1], _mm256_slli_epi16(hp, 2), two);
      w[4 * p + 2] = or_masked(w[4 * p + 2], hp, two);
      w[4 * p + 3] = or_masked(w[4 * p + 3], _mm256_srli_epi16(hp, 2), two);
    }
  }
}

// The int32 dot products of one block for outputs 8h .. 8h + 7 with the activations at xb: of
// inputs 0-15 in out[0] and 16-31 in out[1] (4- and 8-bit: all 32 in out[0], out[1] zero; only
// Q6_K needs the halves apart). maddubs' 16-bit sums stay exact: a 4-bit weight (or a nibble of an
// 8-bit one) times 127, 8 products deep, is at most 30,480; 5-bit 4 deep 31,496; 6-bit 2 deep 32,004.
template <int BITS>
MLXNB_ALWAYS_INLINE void block_dot(const uint8_t* wb, int h, const __m256i w[8], const int8_t* xb,
                                   __m256i out[2]) {
  const __m256i ones = _mm256_set1_epi16(1);
  auto mul = [&](int j) { return _mm256_maddubs_epi16(w[j], bcast4(xb + 4 * j)); };
  if constexpr (BITS == 4) {
    __m256i acc = mul(0);
    for (int j = 1; j < 8; ++j) acc = _mm256_add_epi16(acc, mul(j));
    out[0] = _mm256_madd_epi16(acc, ones);
    out[1] = _mm256_setzero_si256();
  } else if constexpr (BITS == 5) {
    for (int half = 0; half < 2; ++half) {
      const int j = 4 * half;
      const __m256i a = _mm256_add_epi16(_mm256_add_epi16(mul(j), mul(j + 1)), _mm256_add_epi16(mul(j + 2), mul(j + 3)));
      out[half] = _mm256_madd_epi16(a, ones);
    }
  } else if constexpr (BITS == 6) {
    for (int half = 0; half < 2; ++half) {
      const int j = 4 * half;
      out[half] = _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(mul(j), mul(j + 1)), ones),
                                   _mm256_madd_epi16(_mm256_add_epi16(mul(j + 2), mul(j + 3)), ones));
    }
  } else {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + j * 64 + h * 32));
      const __m256i xv = bcast4(xb + 4 * j);
      lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(_mm256_and_si256(z, nib), xv));
      hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(z, 4), nib), xv));
    }
    out[0] = _mm256_add_epi32(_mm256_madd_epi16(lo, ones), _mm256_slli_epi32(_mm256_madd_epi16(hi, ones), 4));
    out[1] = _mm256_setzero_si256();
  }
}

// The scales of outputs 8h .. 8h + 7 of tile t for input block b: s0 for inputs 0-15, s1 for 16-31
// (Q6_K's 16-weight sub-blocks; the other schemes use s0 and b0 alone).
template <int SCHEME, bool HALF>
MLXNB_ALWAYS_INLINE void block_scales(const QGemm& g, int64_t t, int64_t b, int h, __m256& s0, __m256& b0,
                                      __m256& s1, __m256& b1) {
  const int64_t nb = g.K / kBlock;
  if constexpr (SCHEME == kAffine) {
    const int64_t si = (t * (g.K / g.w.group_size) + b / (g.w.group_size / kBlock)) * kLanes + 8 * h;
    s0 = load8<HALF>(g.w.scales, si);
    b0 = load8<HALF>(g.w.biases, si);
  } else if constexpr (SCHEME == kSym) {
    s0 = load8<true>(g.w.scales, (t * nb + b) * kLanes + 8 * h);
    b0 = _mm256_mul_ps(s0, _mm256_set1_ps(static_cast<float>(-g.w.zero)));
  } else {
    const int64_t si = (t * (g.K / 256) + b / 8) * kLanes + 8 * h;
    const uint8_t* sb = g.w.sub + (t * nb + b) * 2 * kLanes + 8 * h;
    const __m256 d = load8<true>(g.w.scales, si);
    if constexpr (SCHEME == kKQuant) {
      s0 = _mm256_mul_ps(d, load8_u8(sb));
      b0 = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(load8<true>(g.w.biases, si), load8_u8(sb + kLanes)));
    } else {
      s0 = _mm256_mul_ps(d, load8_i8(sb));
      s1 = _mm256_mul_ps(d, load8_i8(sb + kLanes));
      b0 = _mm256_mul_ps(s0, _mm256_set1_ps(-32.0f));
      b1 = _mm256_mul_ps(s1, _mm256_set1_ps(-32.0f));
    }
  }
}

constexpr int64_t kAhead = 8;  // blocks prefetched ahead of the one computed

// Rows m0 .. m0 + RT of tile t into out[RT][16]: outputs 8h .. 8h + 7 for the NH halves from h0.
// With both halves in one pass (a few rows) the weights stream while they are computed on; with
// many rows, one half a pass keeps the accumulators in registers. A block's weights are unpacked
// once for the RT rows, and each row's arithmetic is the same whatever RT and NH are.
template <int BITS, int SCHEME, bool HALF, int DIGITS, int RT, int NH>
inline void tile(const QGemm& g, int64_t t, int64_t m0, int h0, float* out) {
  const int64_t nb = g.K / kBlock;
  constexpr int64_t BB = kLanes * kBlock * BITS / 8;
  const uint8_t* wt = g.w.q + t * nb * BB;
  __m256 acc[RT][NH];
  for (int r = 0; r < RT; ++r)
    for (int k = 0; k < NH; ++k) acc[r][k] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    if (h0 == 0 && b + kAhead < nb)  // the weights stream from memory: ask for them early
      for (int64_t l = 0; l < BB; l += 64) _mm_prefetch(reinterpret_cast<const char*>(wt + (b + kAhead) * BB + l), _MM_HINT_T0);
    for (int k = 0; k < NH; ++k) {
      const int h = h0 + k;
      __m256 s0, b0, s1 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
      block_scales<SCHEME, HALF>(g, t, b, h, s0, b0, s1, b1);
      __m256i w[8];
      if constexpr (BITS != 8) unpack<BITS>(wt + b * BB, h, w);
      for (int r = 0; r < RT; ++r) {
        const int64_t i = (m0 + r) * nb + b;
        const __m256 dv = _mm256_set1_ps(g.x.d[i]);
        const int8_t* xb = g.x.q + i * kBlock * DIGITS;
        __m256i dot[2];
        block_dot<BITS>(wt + b * BB, h, w, xb, dot);
        if constexpr (DIGITS == 2) {  // 254 * hi + lo, exact in 32 bits
          __m256i lo[2];
          block_dot<BITS>(wt + b * BB, h, w, xb + kBlock, lo);
          for (int e = 0; e < 2; ++e)
            dot[e] = _mm256_add_epi32(_mm256_sub_epi32(_mm256_slli_epi32(dot[e], 8), _mm256_slli_epi32(dot[e], 1)), lo[e]);
        }
        __m256& a = acc[r][k];
        if constexpr (SCHEME == kQ6K) {
          a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[0]), _mm256_mul_ps(s0, dv), a);
          a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[1]), _mm256_mul_ps(s1, dv), a);
          a = _mm256_fmadd_ps(b0, _mm256_set1_ps(g.x.half[2 * i]), a);
          a = _mm256_fmadd_ps(b1, _mm256_set1_ps(g.x.half[2 * i + 1]), a);
        } else {
          a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(dot[0], dot[1])), _mm256_mul_ps(s0, dv), a);
          a = _mm256_fmadd_ps(b0, _mm256_set1_ps(g.x.sum[i]), a);
        }
      }
    }
  }
  for (int r = 0; r < RT; ++r)
    for (int k = 0; k < NH; ++k) _mm256_store_ps(out + 16 * r + 8 * (h0 + k), acc[r][k]);
}

template <int BITS, int SCHEME, bool HALF, int DIGITS, int RT>
inline void rows(const QGemm& g, int64_t t, int64_t m0) {
  alignas(32) float tmp[RT * 16];
  const int64_t lanes = std::min<int64_t>(kLanes, g.N - t * kLanes);
  if constexpr (RT <= 2) {
    tile<BITS, SCHEME, HALF, DIGITS, RT, 2>(g, t, m0, 0, tmp);
  } else {
    tile<BITS, SCHEME, HALF, DIGITS, RT, 1>(g, t, m0, 0, tmp);
    if (lanes > 8) tile<BITS, SCHEME, HALF, DIGITS, RT, 1>(g, t, m0, 1, tmp);
  }
  for (int r = 0; r < RT; ++r) std::memcpy(g.out + (m0 + r) * g.N + t * kLanes, tmp + 16 * r, lanes * 4);
}

// Rows 16 at a time, then 8, then 4, then the rest: a block's unpacked weights and scales serve
// every row of a pass (the accumulators live in memory past 4 rows, which costs less than unpacking
// again: 16 rows a pass computes 1.2x faster than 4 for 4-bit K-quants, 1.3x for Q6_K, 1.8x for Q5_K).
template <int BITS, int SCHEME, bool HALF, int DIGITS>
void qgemm_t(const QGemm& g, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    int64_t m0 = 0;
    for (; m0 + 16 <= g.M; m0 += 16) rows<BITS, SCHEME, HALF, DIGITS, 16>(g, t, m0);
    for (; m0 + 8 <= g.M; m0 += 8) rows<BITS, SCHEME, HALF, DIGITS, 8>(g, t, m0);
    for (; m0 + 4 <= g.M; m0 += 4) rows<BITS, SCHEME, HALF, DIGITS, 4>(g, t, m0);
    switch (g.M - m0) {
      case 3: rows<BITS, SCHEME, HALF, DIGITS, 3>(g, t, m0); break;
      case 2: rows<BITS, SCHEME, HALF, DIGITS, 2>(g, t, m0); break;
      case 1: rows<BITS, SCHEME, HALF, DIGITS, 1>(g, t, m0); break;
      default: break;
    }
  }
}

template <int BITS, int SCHEME, bool HALF>
void qgemm_digits(const QGemm& g, int64_t t0, int64_t t1) {
  g.x.digits == 2 ? qgemm_t<BITS, SCHEME, HALF, 2>(g, t0, t1) : qgemm_t<BITS, SCHEME, HALF, 1>(g, t0, t1);
}

template <int BITS>
void qgemm_bits(const QGemm& g, int64_t t0, int64_t t1) {
  switch (g.w.scheme) {
    case kSym: return qgemm_digits<BITS, kSym, true>(g, t0, t1);
    case kKQuant: return qgemm_digits<BITS, kKQuant, true>(g, t0, t1);
    case kQ6K: return qgemm_digits<BITS, kQ6K, true>(g, t0, t1);
    default:
      return g.w.half ? qgemm_digits<BITS, kAffine, true>(g, t0, t1) : qgemm_digits<BITS, kAffine, false>(g, t0, t1);
  }
}

void qgemm(const QGemm& g, int64_t t0, int64_t t1) {
  switch (g.w.bits) {
    case 4: return qgemm_bits<4>(g, t0, t1);
    case 5: return qgemm_bits<5>(g, t0, t1);
    case 6: return qgemm_bits<6>(g, t0, t1);
    default: return qgemm_bits<8>(g, t0, t1);
  }
}

// This instruction set's vector operations, for the kernels written once over them (attn_block.h).
struct Vec {
  static constexpr int W = 8;
  using reg = __m256;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static reg set1(float x) { return _mm256_set1_ps(x); }
  static reg fmadd(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg add(reg a, reg b) { return _mm256_add_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static reg div(reg a, reg b) { return _mm256_div_ps(a, b); }
  static reg max(reg a, reg b) { return _mm256_max_ps(a, b); }
  static float hsum(reg v) { return mlxnb::hsum(v); }
  static float hmax(reg v) { return mlxnb::hmax(v); }
  static bool dot16(const float*, const float*, int64_t, int64_t, float*) { return false; }
  static reg exp(reg v) { return exp8(v); }
};

}  // namespace

const Isa kAvx2 = {"avx2", quantize_rows, qgemm, vexp_t<Vec>, silu_mul_t<Vec>, rms_norm_t<Vec>,
                    softmax_t<Vec>, logsumexp_t<Vec>, sub_scalar_t<Vec>, attn_block_t<Vec>, gelu_t<Vec>};

}  // namespace mlxnb
