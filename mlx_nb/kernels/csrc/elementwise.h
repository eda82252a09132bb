// The element-wise kernels (isa.h's vexp, silu_mul, rms_norm, softmax, logsumexp, sub_scalar)
// written once over an instruction set's vector operations, as attn_block.h is. V supplies W, reg,
// zero(), load(p), store(p, v), set1(x), add/sub/mul/div/max(a, b), fmadd(a, b, c), exp(v), hsum(v)
// and hmax(v); each kernels_<isa>.cpp instantiates them for its Vec. Tails go through the same
// vector code on a padded copy (simd_tail.h), so an element's result never depends on its place.
#pragma once

#include <cmath>
#include <cstring>

#include "simd_tail.h"

namespace mlxnb {

template <class V>
void vexp_t(const float* x, float* y, int64_t n) {
  map1<V::W>(x, y, n, [](const float* a, float* out) { V::store(out, V::exp(V::load(a))); });
}

// y = g * sigmoid(g) * u: the SiLU gate of a fused gate/up projection
template <class V>
void silu_mul_t(const float* g, const float* u, float* y, int64_t n) {
  map2<V::W>(g, u, y, n, [](const float* a, const float* b, float* out) {
    const typename V::reg gv = V::load(a);
    const typename V::reg den = V::add(V::set1(1.0f), V::exp(V::sub(V::zero(), gv)));
    V::store(out, V::mul(V::div(gv, den), V::load(b)));
  });
}

// y = gelu(x) = x Phi(x), BERT's exact GELU. With q = Phi(-|x|) = erfc(|x|/sqrt 2)/2, from Abramowitz &
// Stegun 7.1.26 (erfc(z) = p(t) exp(-z^2), t = 1/(1 + 0.3275911 z), |error| <= 1.5e-7):
// gelu = x q + max(x, 0)(1 - 2q), which is x(1 - q) for x >= 0 and x q below, with no branch and no
// cancellation on the negative side (where x (1 + erf) would subtract two numbers near |x|).
template <class V>
void gelu_t(const float* x, float* y, int64_t n) {
  map1<V::W>(x, y, n, [](const float* a, float* out) {
    const typename V::reg xv = V::load(a);
    const typename V::reg z = V::mul(V::max(xv, V::sub(V::zero(), xv)), V::set1(0.70710678118654752f));
    const typename V::reg t = V::div(V::set1(1.0f), V::fmadd(V::set1(0.3275911f), z, V::set1(1.0f)));
    typename V::reg p = V::set1(1.061405429f);
    p = V::fmadd(p, t, V::set1(-1.453152027f));
    p = V::fmadd(p, t, V::set1(1.421413741f));
    p = V::fmadd(p, t, V::set1(-0.284496736f));
    p = V::fmadd(p, t, V::set1(0.254829592f));
    const typename V::reg q = V::mul(V::mul(V::set1(0.5f), V::mul(p, t)), V::exp(V::sub(V::zero(), V::mul(z, z))));
    const typename V::reg rest = V::sub(V::set1(1.0f), V::add(q, q));
    V::store(out, V::fmadd(V::max(xv, V::zero()), rest, V::mul(xv, q)));
  });
}

template <class V>
void rms_norm_t(const float* x, const float* w, float* y, int64_t n, float eps) {
  typename V::reg ss = V::zero();
  reduce1<V::W>(x, n, 0.0f, [&](const float* a) {
    const typename V::reg v = V::load(a);
    ss = V::fmadd(v, v, ss);
  });
  const typename V::reg rv = V::set1(1.0f / std::sqrt(V::hsum(ss) / static_cast<float>(n) + eps));
  map2<V::W>(x, w, y, n, [&](const float* a, const float* b, float* out) {
    V::store(out, V::mul(V::mul(V::load(a), rv), V::load(b)));
  });
}

template <class V>
float row_max_t(const float* x, int64_t n) {
  typename V::reg m = V::set1(-INFINITY);
  reduce1<V::W>(x, n, -INFINITY, [&](const float* a) { m = V::max(m, V::load(a)); });
  return V::hmax(m);
}

// sum of exp(x - m), each term written to y when y is given (padding: exp(-inf) = 0)
template <class V>
float exp_sum_t(const float* x, float* y, int64_t n, float m) {
  const typename V::reg mv = V::set1(m);
  typename V::reg s = V::zero();
  map1<V::W>(x, y, n, [&](const float* a, float* out) {
    const typename V::reg e = V::exp(V::sub(V::load(a), mv));
    s = V::add(s, e);
    if (out) V::store(out, e);
  }, /*pad=*/-INFINITY);
  return V::hsum(s);
}

// y = softmax(x); returns logsumexp(x) (-inf, and y all zero, for a row masked whole)
template <class V>
float softmax_t(const float* x, float* y, int64_t n) {
  const float m = row_max_t<V>(x, n);
  if (m == -INFINITY) {
    std::memset(y, 0, n * sizeof(float));
    return -INFINITY;
  }
  const float s = exp_sum_t<V>(x, y, n, m);
  const typename V::reg inv = V::set1(1.0f / s);
  map1<V::W>(y, y, n, [&](const float* a, float* out) { V::store(out, V::mul(V::load(a), inv)); });
  return m + std::log(s);
}

template <class V>
float logsumexp_t(const float* x, int64_t n) {
  const float m = row_max_t<V>(x, n);
  if (!std::isfinite(m)) return m;
  return m + std::log(exp_sum_t<V>(x, nullptr, n, m));
}

template <class V>
void sub_scalar_t(const float* x, float c, float* y, int64_t n) {
  const typename V::reg cv = V::set1(c);
  map1<V::W>(x, y, n, [&](const float* a, float* out) { V::store(out, V::sub(V::load(a), cv)); });
}

}  // namespace mlxnb
