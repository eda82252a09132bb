// AVX-512 kernels (F, BW, VL and VNNI; compiled with those flags, chosen at run time). A block's 16
// outputs fill a 512-bit register; VNNI's dpbusd sums u8 x s8 products straight into 32-bit lanes,
// so 8-bit weights need no widening and nothing saturates.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "isa.h"
#include "attn_block.h"
#include "elementwise.h"

namespace mlxnb {
namespace {

inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

inline float hsum(__m512 v) {
  return hsum256(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

inline float hmax(__m512 v) {
  __m256 h = _mm256_max_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// exp to ~1 ulp (Cephes' polynomial); exactly 0 below -87.33, as the masked entries of a softmax need.
inline __m512 exp16(__m512 x) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3365f), _CMP_GE_OQ);
  x = _mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f));
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3365f));
  const __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(keep, y, _mm512_castsi512_ps(e));
}

void quantize_rows(const float* x, int64_t rows, int64_t K, int digits, int8_t* q, float* d, float* sum,
                   float* half) {
  const int64_t nb = K / kBlock;
  const __m512 fine = _mm512_set1_ps(static_cast<float>(kFine));
  const __m512i kf = _mm512_set1_epi32(kFine);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + r * K + b * kBlock;
      const int64_t i = r * nb + b;
      int8_t* qb = q + i * kBlock * digits;
      const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
      const float amax = hmax(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
      const __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
      const __m512 v0 = _mm512_mul_ps(x0, id), v1 = _mm512_mul_ps(x1, id);
      __m512i h0 = _mm512_cvtps_epi32(v0), h1 = _mm512_cvtps_epi32(v1);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb), _mm512_cvtepi32_epi8(h0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16), _mm512_cvtepi32_epi8(h1));
      if (digits == 2) {
        const __m512i l0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(v0, _mm512_cvtepi32_ps(h0)), fine));
        const __m512i l1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(v1, _mm512_cvtepi32_ps(h1)), fine));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 32), _mm512_cvtepi32_epi8(l0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 48), _mm512_cvtepi32_epi8(l1));
        h0 = _mm512_add_epi32(_mm512_mullo_epi32(h0, kf), l0);  // the values summed below: 254 * hi + lo
        h1 = _mm512_add_epi32(_mm512_mullo_epi32(h1, kf), l1);
      }
      const int32_t s0 = _mm512_reduce_add_epi32(h0), s1 = _mm512_reduce_add_epi32(h1);
      d[i] = amax / (digits == 2 ? 127.0f * kFine : 127.0f);
      sum[i] = d[i] * static_cast<float>(s0 + s1);
      half[2 * i] = d[i] * static_cast<float>(s0);
      half[2 * i + 1] = d[i] * static_cast<float>(s1);
    }
  }
}

template <bool HALF>
inline __m512 load16(const void* p, int64_t i) {
  if constexpr (HALF)
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i)));
  return _mm512_loadu_ps(static_cast<const float*>(p) + i);
}

inline __m512 load16_u8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

inline __m512 load16_i8(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// w | (shifted & mask), one instruction
inline __m512i or_masked(__m512i w, __m512i shifted, __m512i mask) {
  return _mm512_ternarylogic_epi32(w, shifted, mask, 0xF8);
}

// The q of a block as bytes: w[j] holds inputs 4j .. 4j + 3 of each of the 16 outputs (isa.h's layout).
template <int BITS>
MLXNB_ALWAYS_INLINE void unpack(const uint8_t* wb, __m512i w[8]) {
  if constexpr (BITS == 8) {
    for (int j = 0; j < 8; ++j) w[j] = _mm512_loadu_si512(wb + j * 64);
    return;
  }
  const __m512i nib = _mm512_set1_epi8(0x0F);
  for (int j = 0; j < 4; ++j) {
    const __m512i z = _mm512_loadu_si512(wb + j * 64);
    w[j] = _mm512_and_si512(z, nib);
    w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(z, 4), nib);
  }
  if constexpr (BITS == 5) {  // bit j of the plane's bytes -> bit 4 of w[j]'s (16-bit shifts: masked after)
    const __m512i hp = _mm512_loadu_si512(wb + 256), bit = _mm512_set1_epi8(0x10);
    w[0] = or_masked(w[0], _mm512_slli_epi16(hp, 4), bit);
    w[1] = or_masked(w[1], _mm512_slli_epi16(hp, 3), bit);
    w[2] = or_masked(w[2], _mm512_slli_epi16(hp, 2), bit);
    w[3] = or_masked(w[3], _mm512_slli_epi16(hp, 1), bit);
    w[4] = or_masked(w[4], hp, bit);
    w[5] = or_masked(w[5], _mm512_srli_epi16(hp, 1), bit);
    w[6] = or_masked(w[6], _mm512_srli_epi16(hp, 2), bit);
    w[7] = or_masked(w[7], _mm512_srli_epi16(hp, 3), bit);
  }
  if constexpr (BITS == 6) {  // bits 2(j % 4), +1 of plane j / 4 -> bits 4, 5 of w[j]
    const __m512i two = _mm512_set1_epi8(0x30);
    for (int p = 0; p < 2; ++p) {
      const __m512i hp = _mm512_loadu_si512(wb + 256 + 64 * p);
      w[4 * p] = or_masked(w[4 * p], _mm512_slli_epi16(hp, 4), two);
      w[4 * p + 1] = or_masked(w[4 * p + 1], _mm512_slli_epi16(hp, 2), two);
      w[4 * p + 2] = or_masked(w[4 * p + 2], hp, two);
      w[4 * p + 3] = or_masked(w[4 * p + 3], _mm512_srli_epi16(hp, 2), two);
    }
  }
}

// The int32 dot products of one digit of a block's activations (at xb) with its 16 outputs: of
// inputs 0-15 (a) and 16-31 (b). Four independent chains: dpbusd's latency, not its throughput,
// bounds a row.
MLXNB_ALWAYS_INLINE void dots(const __m512i w[8], const int8_t* xb, __m512i& a, __m512i& b) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, b0 = a0, b1 = a0;
  for (int j = 0; j < 4; j += 2) {
    a0 = _mm512_dpbusd_epi32(a0, w[j], bcast4(xb + 4 * j));
    a1 = _mm512_dpbusd_epi32(a1, w[j + 1], bcast4(xb + 4 * j + 4));
    b0 = _mm512_dpbusd_epi32(b0, w[j + 4], bcast4(xb + 16 + 4 * j));
    b1 = _mm512_dpbusd_epi32(b1, w[j + 5], bcast4(xb + 20 + 4 * j));
  }
  a = _mm512_add_epi32(a0, a1);
  b = _mm512_add_epi32(b0, b1);
}

// Rows m0 .. m0 + RT of the 16 outputs of tile t. Each row's arithmetic is the same whatever RT is.
template <int BITS, int SCHEME, bool HALF, int DIGITS, int RT>
inline void tile(const QGemm& g, int64_t t, int64_t m0) {
  const int64_t nb = g.K / kBlock;
  constexpr int64_t BB = kLanes * kBlock * BITS / 8;
  const uint8_t* wt = g.w.q + t * nb * BB;
  __m512 acc[RT];
  for (int r = 0; r < RT; ++r) acc[r] = _mm512_setzero_ps();
  __m512 sup_d = _mm512_setzero_ps(), sup_m = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    // this block's scales (s0 for inputs 0-15, s1 for 16-31) and biases, per output
    __m512 s0, b0, s1 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
    if constexpr (SCHEME == kAffine) {
      const int64_t si = (t * (g.K / g.w.group_size) + b / (g.w.group_size / kBlock)) * kLanes;
      s0 = load16<HALF>(g.w.scales, si);
      b0 = load16<HALF>(g.w.biases, si);
    } else if constexpr (SCHEME == kSym) {
      s0 = load16<true>(g.w.scales, (t * nb + b) * kLanes);
      b0 = _mm512_mul_ps(s0, _mm512_set1_ps(static_cast<float>(-g.w.zero)));
    } else {
      if (b % 8 == 0) {
        const int64_t si = (t * (g.K / 256) + b / 8) * kLanes;
        sup_d = load16<true>(g.w.scales, si);
        if constexpr (SCHEME == kKQuant) sup_m = load16<true>(g.w.biases, si);
      }
      const uint8_t* sb = g.w.sub + (t * nb + b) * 2 * kLanes;
      if constexpr (SCHEME == kKQuant) {
        s0 = _mm512_mul_ps(sup_d, load16_u8(sb));
        b0 = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(sup_m, load16_u8(sb + kLanes)));
      } else {
        s0 = _mm512_mul_ps(sup_d, load16_i8(sb));
        s1 = _mm512_mul_ps(sup_d, load16_i8(sb + kLanes));
        b0 = _mm512_mul_ps(s0, _mm512_set1_ps(-32.0f));
        b1 = _mm512_mul_ps(s1, _mm512_set1_ps(-32.0f));
      }
    }
    __m512i w[8];
    unpack<BITS>(wt + b * BB, w);
    for (int r = 0; r < RT; ++r) {
      const int64_t i = (m0 + r) * nb + b;
      const int8_t* xb = g.x.q + i * kBlock * DIGITS;
      __m512i dotA, dotB;
      dots(w, xb, dotA, dotB);
      if constexpr (DIGITS == 2) {  // 254 * hi + lo, exact in 32 bits (|hi| <= 32 * 255 * 127)
        __m512i loA, loB;
        dots(w, xb + kBlock, loA, loB);
        dotA = _mm512_add_epi32(_mm512_sub_epi32(_mm512_slli_epi32(dotA, 8), _mm512_slli_epi32(dotA, 1)), loA);
        dotB = _mm512_add_epi32(_mm512_sub_epi32(_mm512_slli_epi32(dotB, 8), _mm512_slli_epi32(dotB, 1)), loB);
      }
      const __m512 dx = _mm512_set1_ps(g.x.d[i]);
      if constexpr (SCHEME == kQ6K) {
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dotA), _mm512_mul_ps(s0, dx), acc[r]);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dotB), _mm512_mul_ps(s1, dx), acc[r]);
        acc[r] = _mm512_fmadd_ps(b0, _mm512_set1_ps(g.x.half[2 * i]), acc[r]);
        acc[r] = _mm512_fmadd_ps(b1, _mm512_set1_ps(g.x.half[2 * i + 1]), acc[r]);
      } else {
        const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(dotA, dotB));
        acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(s0, dx), acc[r]);
        acc[r] = _mm512_fmadd_ps(b0, _mm512_set1_ps(g.x.sum[i]), acc[r]);
      }
    }
  }
  const int64_t left = g.N - t * kLanes;
  const __mmask16 mask = left >= kLanes ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
  for (int r = 0; r < RT; ++r) _mm512_mask_storeu_ps(g.out + (m0 + r) * g.N + t * kLanes, mask, acc[r]);
}

template <int BITS, int SCHEME, bool HALF, int DIGITS>
void qgemm_t(const QGemm& g, int64_t t0, int64_t t1) {
  constexpr int RT = 4;
  for (int64_t t = t0; t < t1; ++t) {
    int64_t m0 = 0;
    for (; m0 + RT <= g.M; m0 += RT) tile<BITS, SCHEME, HALF, DIGITS, RT>(g, t, m0);
    switch (g.M - m0) {
      case 3: tile<BITS, SCHEME, HALF, DIGITS, 3>(g, t, m0); break;
      case 2: tile<BITS, SCHEME, HALF, DIGITS, 2>(g, t, m0); break;
      case 1: tile<BITS, SCHEME, HALF, DIGITS, 1>(g, t, m0); break;
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

// The dot products of q with 16 consecutive keys, each summed exactly as dot_row sums one (16-lane
// partials over D, then hsum's tree: x[i] + x[i + 8], + [i + 4], + [i + 2], + [i + 1]), but the 16
// trees reduced together with shuffles instead of one horizontal sum a key. D a multiple of 16.
inline bool dot16_keys(const float* q, const float* k, int64_t ks, int64_t D, float* out) {
  __m512 p[16];
  for (int j = 0; j < 16; ++j) {
    const float* kj = k + j * ks;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(kj + d), acc);
    p[j] = acc;
  }
  __m512 t[8], u[4], w[2];
  for (int i = 0; i < 8; ++i)  // keys 2i, 2i+1: x[i] + x[i + 8] in lanes 0-7 and 8-15
    t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(p[2 * i], p[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // 128-bit block b: key 4i + b, t[i] + t[i + 4]
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // block b: (key 8i + b, key 8i + 4 + b) x (u[0] + u[2], u[1] + u[3])
    w[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // block b: keys b, 4 + b, 8 + b, 12 + b, each w[0] + w[1]
  const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // lane 4b + m holds key b + 4m: back to key order
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, r));
  return true;
}

// This instruction set's vector operations, for the kernels written once over them (attn_block.h).
struct Vec {
  static constexpr int W = 16;
  using reg = __m512;
  static reg zero() { return _mm512_setzero_ps(); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static reg set1(float x) { return _mm512_set1_ps(x); }
  static reg fmadd(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg add(reg a, reg b) { return _mm512_add_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static reg div(reg a, reg b) { return _mm512_div_ps(a, b); }
  static reg max(reg a, reg b) { return _mm512_max_ps(a, b); }
  static float hsum(reg v) { return mlxnb::hsum(v); }
  static float hmax(reg v) { return mlxnb::hmax(v); }
  static reg exp(reg v) { return exp16(v); }
  static bool dot16(const float* q, const float* k, int64_t ks, int64_t D, float* out) { return dot16_keys(q, k, ks, D, out); }
};

}  // namespace

const Isa kAvx512 = {"avx512", quantize_rows, qgemm, vexp_t<Vec>, silu_mul_t<Vec>, rms_norm_t<Vec>,
                    softmax_t<Vec>, logsumexp_t<Vec>, sub_scalar_t<Vec>, attn_block_t<Vec>, gelu_t<Vec>};

}  // namespace mlxnb
