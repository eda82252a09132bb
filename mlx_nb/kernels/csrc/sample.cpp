// Token sampling as an MLX primitive, row by row: mlx_lm's make_sampler semantics (top-p, then
// min-p, then top-k on the untempered distribution, then a draw at the temperature; argmax at
// temperature 0) without a full-vocabulary sort, log or Gumbel draw per token: one vectorized exp
// and an inverse-CDF walk driven by one uniform number per row.
#include <cmath>
#include <numeric>

#include "common.h"
#include "isa.h"
#include "ops.h"

namespace mlxnb {
namespace {

int32_t argmax_row(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

struct Row {
  std::vector<float> p;         // exp(x - max), then 0 where filtered out
  std::vector<float> w;         // the tempered weights
  std::vector<int32_t> order;   // token ids, the first `sorted` of them by p descending
};

// Zeroes p outside the nucleus: a token is kept while the mass of the tokens ranked above it is
// below top_p of the total (mlx_lm's apply_top_p). The boundary is found by a weighted quickselect
// (partition around a pivot, keep the heavier side whole or search inside it), so a flat
// distribution whose nucleus is most of the vocabulary costs O(V), not a sort of it.
void keep_top_p(Row& r, float top_p) {
  const int64_t n = r.p.size();
  double total = 0.0;
  for (float v : r.p) total += v;
  double need = top_p * total;  // mass still to take from order[lo, hi)
  r.order.resize(n);
  std::iota(r.order.begin(), r.order.end(), 0);
  const auto& p = r.p;
  auto desc = [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); };
  int64_t lo = 0, hi = n;  // order[0, lo) is kept whole; the boundary lies in order[lo, hi)
  while (hi - lo > 64) {
    const float a = p[r.order[lo]], b = p[r.order[(lo + hi) / 2]], c = p[r.order[hi - 1]];
    const float pivot = std::max(std::min(a, b), std::min(std::max(a, b), c));  // median of three
    auto mid_it = std::partition(r.order.begin() + lo, r.order.begin() + hi, [&](int32_t i) { return p[i] > pivot; });
    const int64_t mid = mid_it - r.order.begin();
    if (mid == lo) break;  // the rest are all equal to the pivot: sort them below
    double heavier = 0.0;
    for (int64_t i = lo; i < mid; ++i) heavier += p[r.order[i]];
    if (heavier >= need) {
      hi = mid;
    } else {
      need -= heavier;
      lo = mid;
    }
  }
  std::sort(r.order.begin() + lo, r.order.begin() + hi, desc);
  int64_t kept = lo;
  for (double above = 0.0; kept < hi && above < need; ++kept) above += p[r.order[kept]];
  for (int64_t i = kept; i < n; ++i) r.p[r.order[i]] = 0.0f;
}

// Keeps the k largest (ties broken by the lower id).
void keep_top_k(Row& r, int64_t k) {
  const int64_t n = r.p.size();
  if (k <= 0 || k >= n) return;
  r.order.resize(n);
  std::iota(r.order.begin(), r.order.end(), 0);
  auto desc = [&](int32_t a, int32_t b) { return r.p[a] > r.p[b] || (r.p[a] == r.p[b] && a < b); };
  std::nth_element(r.order.begin(), r.order.begin() + (k - 1), r.order.end(), desc);
  for (int64_t i = k; i < n; ++i) r.p[r.order[i]] = 0.0f;
}

int32_t sample_row(const Isa& k, const float* x, int64_t n, float temp, float top_p, int32_t top_k, float min_p,
                   float u, Row& r) {
  if (temp <= 0.0f) return argmax_row(x, n);
  r.p.resize(n);
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
  k.sub_scalar(x, m, r.p.data(), n);
  k.exp(r.p.data(), r.p.data(), n);  // p = exp(x - max): the top token has 1
  if (top_p > 0.0f && top_p < 1.0f) keep_top_p(r, top_p);
  if (min_p > 0.0f)
    for (auto& v : r.p)
      if (v < min_p) v = 0.0f;
  keep_top_k(r, top_k);
  // Draw at the temperature among the kept: weight exp((x - max) / temp) = p ^ (1 / temp).
  const float inv_t = 1.0f / temp;
  if (inv_t != 1.0f) {
    r.w.resize(n);
    for (int64_t i = 0; i < n; ++i) r.w[i] = (x[i] - m) * inv_t;
    k.exp(r.w.data(), r.w.data(), n);
    for (int64_t i = 0; i < n; ++i) r.p[i] = r.p[i] > 0.0f ? r.w[i] : 0.0f;
  }
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += r.p[i];
  const double target = static_cast<double>(u) * total;
  double acc = 0.0;
  int32_t last = argmax_row(x, n);
  for (int64_t i = 0; i < n; ++i)
    if (r.p[i] > 0.0f) {
      acc += r.p[i];
      last = static_cast<int32_t>(i);
      if (acc > target) return last;
    }
  return last;
}

class Sample : public CpuOnly {
 public:
  using CpuOnly::CpuOnly;
  const char* name() const override { return "MlxNbSample"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& out = outs[0];
    alloc(out);
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([la = in[0], ta = in[1], pa = in[2], ka = in[3], ma = in[4], ua = in[5], o = out.data<int32_t>()]() {
      thread_local std::vector<float> lbuf, tbuf, pbuf, mbuf, ubuf;
      thread_local std::vector<int32_t> kbuf;
      const float* logits = row_major(la, lbuf);
      const float *t = row_major(ta, tbuf), *p = row_major(pa, pbuf), *mp = row_major(ma, mbuf), *u = row_major(ua, ubuf);
      const int32_t* tk = row_major(ka, kbuf);
      const int64_t V = la.shape(-1), B = V ? la.size() / V : 0;
      const Isa& k = isa();
      for_rows(B, V * 8, [&](int64_t r0, int64_t r1) {
        thread_local Row row;
        for (int64_t b = r0; b < r1; ++b) o[b] = sample_row(k, logits + b * V, V, t[b], p[b], tk[b], mp[b], u[b], row);
      });
    });
  }
};

}  // namespace

mx::array sample(const mx::array& logits, const mx::array& temperature, const mx::array& top_p, const mx::array& top_k,
                 const mx::array& min_p, const mx::array& uniform, mx::StreamOrDevice s) {
  const std::string op = "sample";
  check_float(op, logits);
  if (logits.ndim() != 2) fail(op, "logits must be [rows, vocabulary]");
  const int B = logits.shape(0);
  for (auto* a : {&temperature, &top_p, &top_k, &min_p, &uniform})
    if (a->ndim() != 1 || a->shape(0) != B) fail(op, "each setting must have one value per row");
  return mx::array({B}, mx::int32, std::make_shared<Sample>(mx::to_stream(s)),
                   {as_f32(logits, s), as_f32(temperature, s), as_f32(top_p, s), mx::astype(top_k, mx::int32, s),
                    as_f32(min_p, s), as_f32(uniform, s)});
}

}  // namespace mlxnb
