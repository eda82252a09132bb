// The attention row (isa.h's AttnRow) written once over an instruction set's vector operations.
// V supplies: W (floats a vector), reg, zero(), load(p), store(p, v), set1(x), fmadd(a, b, c),
// sub(a, b), hsum(v) and exp(v); each kernels_<isa>.cpp instantiates it with its own.
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

template <class V>
void attn_row_t(const AttnRow& a) {
  float m = -INFINITY;
  for (int64_t j = 0; j < a.limit; ++j) {
    if (a.keep && !a.keep[j * a.mask_stride]) {
      a.scores[j] = -INFINITY;
      continue;
    }
    float s = dot_row<V>(a.q, a.k + j * a.k_stride, a.D) * a.scale;
    if (a.add_mask) s += a.add_mask[j * a.mask_stride];
    a.scores[j] = s;
    m = std::fmax(m, s);
  }
  for (int64_t d = 0; d < a.D; ++d) a.out[d] = 0.0f;
  if (m == -INFINITY) return;
  const typename V::reg mv = V::set1(m);
  map1<V::W>(a.scores, a.scores, a.limit, [&](const float* x, float* y) { V::store(y, V::exp(V::sub(V::load(x), mv))); },
             -INFINITY);
  float sum = 0.0f;
  for (int64_t j = 0; j < a.limit; ++j) {
    const float p = a.scores[j];
    if (p == 0.0f) continue;  // masked (exp(-inf)) or underflowed: adds nothing
    sum += p;
    const float* vj = a.v + j * a.v_stride;
    const typename V::reg pv = V::set1(p);
    int64_t d = 0;
    for (; d + V::W <= a.D; d += V::W) V::store(a.out + d, V::fmadd(pv, V::load(vj + d), V::load(a.out + d)));
    for (; d < a.D; ++d) a.out[d] = std::fma(p, vj[d], a.out[d]);
  }
  const float inv = 1.0f / sum;
  for (int64_t d = 0; d < a.D; ++d) a.out[d] *= inv;
}

}  // namespace mlxnb
