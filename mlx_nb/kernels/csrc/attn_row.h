// The sums of attention's rows (attn_block.h), written once over an instruction set's vector operations.
// V supplies: W (floats a vector), reg, zero(), load(p), store(p, v), set1(x), fmadd(a, b, c),
// sub(a, b), hsum(v) and exp(v), and dot16(q, k, k_stride, D, out): the dot_row of 16 consecutive
// keys at once, bit for bit (or false when it has none); each kernels_<isa>.cpp instantiates it.
#pragma once

#include <cmath>

#include "isa.h"
#include "simd_tail.h"

namespace mlxnb {

template <class V>
inline float dot_row(const float* q, const float* k, int64_t D) {
  typename V::reg acc = V::zero();
  int64_t d = 0;
  for (; d + V::W <= D; d += V::W) acc = V::fmadd(V::load(q + d), V::load(k + d), acc);
  float s = V::hsum(acc);
  for (; d < D; ++d) s = std::fma(q[d], k[d], s);
  return s;
}

// dot_row of 4 consecutive keys (k, k + ks, ...) at once: four independent sums instead of one
// chain of dependent multiply-adds, each key's sum made exactly as dot_row makes it.
template <class V>
inline void dot4(const float* q, const float* k, int64_t ks, int64_t D, float* out) {
  typename V::reg a0 = V::zero(), a1 = V::zero(), a2 = V::zero(), a3 = V::zero();
  int64_t d = 0;
  for (; d + V::W <= D; d += V::W) {
    const typename V::reg qv = V::load(q + d);
    a0 = V::fmadd(qv, V::load(k + d), a0);
    a1 = V::fmadd(qv, V::load(k + ks + d), a1);
    a2 = V::fmadd(qv, V::load(k + 2 * ks + d), a2);
    a3 = V::fmadd(qv, V::load(k + 3 * ks + d), a3);
  }
  float s[4] = {V::hsum(a0), V::hsum(a1), V::hsum(a2), V::hsum(a3)};
  for (int i = 0; i < 4; ++i) {
    for (int64_t t = d; t < D; ++t) s[i] = std::fma(q[t], k[i * ks + t], s[i]);
    out[i] = s[i];
  }
}

// The dot products of 4 queries with 3 consecutive keys (k, k + ks, k + 2 ks) at once, each made
// exactly as dot_row makes it: out[r][c] for query r and key c. Twelve independent sums that share
// their loads: the key chunk is read once for four rows.
template <class V>
inline void dot_tile(const float* const* q, const float* k, int64_t ks, int64_t D, float* const* out) {
  using R = typename V::reg;
  R a[4][3];
  for (auto& row : a) row[0] = row[1] = row[2] = V::zero();
  int64_t d = 0;
  for (; d + V::W <= D; d += V::W) {
    const R k0 = V::load(k + d), k1 = V::load(k + ks + d), k2 = V::load(k + 2 * ks + d);
    for (int r = 0; r < 4; ++r) {
      const R qv = V::load(q[r] + d);
      a[r][0] = V::fmadd(qv, k0, a[r][0]);
      a[r][1] = V::fmadd(qv, k1, a[r][1]);
      a[r][2] = V::fmadd(qv, k2, a[r][2]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) {
      float s = V::hsum(a[r][c]);
      for (int64_t t = d; t < D; ++t) s = std::fma(q[r][t], k[c * ks + t], s);
      out[r][c] = s;
    }
}

// out[r][d] += sum over keys j < n in order of p[r][j] * v_j[d] for 4 rows at once, two vectors of d
// at a time: each row's sums made exactly as accumulate makes them (a weight of 0 adds an exact 0
// to a finite sum, so not skipping it changes nothing), each value loaded once for the four rows.
template <class V>
inline void accumulate_tile(const float* const* p, int64_t n, const float* v, int64_t vs, int64_t D,
                            float* const* out) {
  using R = typename V::reg;
  int64_t d = 0;
  for (; d + 2 * V::W <= D; d += 2 * V::W) {
    R a[4][2];
    for (int r = 0; r < 4; ++r) a[r][0] = V::load(out[r] + d), a[r][1] = V::load(out[r] + d + V::W);
    for (int64_t j = 0; j < n; ++j) {
      const R v0 = V::load(v + j * vs + d), v1 = V::load(v + j * vs + d + V::W);
      for (int r = 0; r < 4; ++r) {
        const R pv = V::set1(p[r][j]);
        a[r][0] = V::fmadd(pv, v0, a[r][0]);
        a[r][1] = V::fmadd(pv, v1, a[r][1]);
      }
    }
    for (int r = 0; r < 4; ++r) V::store(out[r] + d, a[r][0]), V::store(out[r] + d + V::W, a[r][1]);
  }
  for (int r = 0; r < 4; ++r)  // the rest of d, row by row
    if (d < D) {
      float* o = out[r];
      for (int64_t t = d; t < D; ++t) {
        float acc = o[t];
        for (int64_t j = 0; j < n; ++j)
          if (p[r][j] != 0.0f) acc = std::fma(p[r][j], v[j * vs + t], acc);
        o[t] = acc;
      }
    }
}

// out[d] += sum over keys j < n in order of p[j] * v_j[d] (keys with p[j] == 0, masked or underflowed,
// skipped; value j at v + j * vs), with the sums held in registers across keys, four vectors of d at a
// time, starting from out's running sums (a float in a register and in memory are the same value).
template <class V>
inline void accumulate(const float* p, int64_t n, const float* v, int64_t vs, int64_t D, float* out) {
  using R = typename V::reg;
  int64_t d = 0;
  for (; d + 4 * V::W <= D; d += 4 * V::W) {
    R a0 = V::load(out + d), a1 = V::load(out + d + V::W), a2 = V::load(out + d + 2 * V::W),
      a3 = V::load(out + d + 3 * V::W);
    for (int64_t j = 0; j < n; ++j) {
      if (p[j] == 0.0f) continue;
      const R pv = V::set1(p[j]);
      const float* vj = v + j * vs + d;
      a0 = V::fmadd(pv, V::load(vj), a0);
      a1 = V::fmadd(pv, V::load(vj + V::W), a1);
      a2 = V::fmadd(pv, V::load(vj + 2 * V::W), a2);
      a3 = V::fmadd(pv, V::load(vj + 3 * V::W), a3);
    }
    V::store(out + d, a0), V::store(out + d + V::W, a1), V::store(out + d + 2 * V::W, a2);
    V::store(out + d + 3 * V::W, a3);
  }
  for (; d + V::W <= D; d += V::W) {
    R acc = V::load(out + d);
    for (int64_t j = 0; j < n; ++j)
      if (p[j] != 0.0f) acc = V::fmadd(V::set1(p[j]), V::load(v + j * vs + d), acc);
    V::store(out + d, acc);
  }
  for (; d < D; ++d) {
    float acc = out[d];
    for (int64_t j = 0; j < n; ++j)
      if (p[j] != 0.0f) acc = std::fma(p[j], v[j * vs + d], acc);
    out[d] = acc;
  }
}

}  // namespace mlxnb
