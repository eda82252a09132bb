// Scaled dot-product attention as an MLX primitive: MLX's CPU fallback is five ops with a BLAS call
// per (row, head); this is one pass per query row that reads the cache's keys and values in place
// (a cache hands out strided views) and writes [B, L, heads * D], the output projection's input.
#include "common.h"
#include "isa.h"
#include "ops.h"

namespace mlxnb {
namespace {

enum class MaskKind { kNone, kCausal, kBool, kAdditive };

class Attention : public CpuOnly {
 public:
  Attention(mx::Stream s, float scale, MaskKind mask) : CpuOnly(s), scale_(scale), mask_(mask) {}
  const char* name() const override { return "MlxNbAttention"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const Attention&>(other);
    return o.scale_ == scale_ && o.mask_ == mask_;
  }
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& out = outs[0];
    alloc(out);
    std::optional<mx::array> mask;
    if (in.size() > 3) mask = in[3];
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([qa = in[0], ka = in[1], va = in[2], mask, o = out.data<float>(), scale = scale_, kind = mask_]() {
      thread_local std::vector<float> qbuf, kbuf, vbuf;
      const int64_t B = qa.shape(0), H = qa.shape(1), L = qa.shape(2), D = qa.shape(3);
      const int64_t Hk = ka.shape(1), S = ka.shape(2), group = H / Hk;
      const float* q = row_major(qa, qbuf);
      // Keys and values are read through their strides while each key's D values are contiguous.
      auto view = [&](const mx::array& a, std::vector<float>& buf, mx::Strides& st) {
        if (a.strides(3) == 1) {
          st = a.strides();
          return a.data<float>();
        }
        st = {Hk * S * D, S * D, D, 1};
        return row_major(a, buf);
      };
      mx::Strides ks, vs, ms(4, 0);  // ms: the mask's strides over [B, H, L, S], 0 where it broadcasts
      if (mask)
        for (int i = 0, nd = mask->ndim(); i < nd; ++i) ms[4 - nd + i] = mask->shape(i) == 1 ? 0 : mask->strides(i);
      const float* k = view(ka, kbuf, ks);
      const float* v = view(va, vbuf, vs);
      const Isa& isa_ = isa();
      for_rows(B * H * L, S * D, [&](int64_t r0, int64_t r1) {
        thread_local std::vector<float> scores;
        scores.resize(S);
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t b = r / (H * L), h = (r / L) % H, l = r % L, kh = h / group;
          AttnRow a{};
          a.q = q + r * D;
          a.k = k + b * ks[0] + kh * ks[1];
          a.v = v + b * vs[0] + kh * vs[1];
          a.k_stride = ks[2];
          a.v_stride = vs[2];
          a.limit = kind == MaskKind::kCausal ? std::min(S, l + (S - L) + 1) : S;
          a.D = D;
          a.scale = scale;
          if (kind == MaskKind::kBool || kind == MaskKind::kAdditive) {
            const int64_t at = b * ms[0] + h * ms[1] + l * ms[2];
            if (kind == MaskKind::kBool) {
              a.keep = mask->data<uint8_t>() + at;
            } else {
              a.add_mask = mask->data<float>() + at;
            }
            a.mask_stride = ms[3];
          }
          a.scores = scores.data();
          a.out = o + ((b * L + l) * H + h) * D;
          isa_.attn_row(a);
        }
      }, 1 << 20);  // a row is cheap: one decode row of 9 heads over 1,500 keys is faster alone
    });
  }

 private:
  float scale_;
  MaskKind mask_;
};

}  // namespace

mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale, bool causal,
                    const std::optional<mx::array>& mask, mx::StreamOrDevice s) {
  const std::string op = "attention";
  for (auto* a : {&q, &k, &v}) {
    check_float(op, *a);
    if (a->ndim() != 4) fail(op, "q, k and v must be [B, heads, L, D]");
  }
  const int B = q.shape(0), H = q.shape(1), L = q.shape(2), D = q.shape(3);
  if (k.shape() != v.shape() || k.shape(0) != B || k.shape(3) != D || H % k.shape(1))
    fail(op, "k and v must be [B, kv_heads, S, D] with kv_heads dividing the query heads");
  const int S = k.shape(2);
  if (causal && mask) fail(op, "give a mask or causal, not both");
  if (causal && L > S) fail(op, "a causal mask needs at least as many keys as queries");
  std::vector<mx::array> inputs{as_f32(q, s), as_f32(k, s), as_f32(v, s)};
  MaskKind kind = causal ? MaskKind::kCausal : MaskKind::kNone;
  if (mask) {
    mx::array m = *mask;
    if (m.ndim() > 4) fail(op, "the mask must broadcast to [B, heads, L, S]");
    if (m.dtype() == mx::bool_) {
      kind = MaskKind::kBool;
    } else {
      check_float(op, m);
      kind = MaskKind::kAdditive;
      m = as_f32(m, s);
    }
    bool fits = true;
    try {
      fits = mx::broadcast_shapes(m.shape(), {B, H, L, S}) == mx::Shape{B, H, L, S};
    } catch (const std::exception&) {
      fits = false;
    }
    if (!fits) fail(op, "the mask must broadcast to [B, heads, L, S]");
    inputs.push_back(m);  // read through broadcast strides: no broadcast op a layer
  }
  auto out = mx::array({B, L, H * D}, mx::float32, std::make_shared<Attention>(mx::to_stream(s), scale, kind),
                       std::move(inputs));
  return back_to(out, q.dtype(), s);
}

}  // namespace mlxnb
