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

// Keys or values of a cache as [B, kv_heads, S, C] read through their strides, each key's C
// entries contiguous (a strided copy otherwise).
template <typename T>
const T* cache_view(const mx::array& a, std::vector<T>& buf, mx::Strides& st) {
  if (a.strides(3) == 1) {
    st = a.strides();
    return a.data<T>();
  }
  const int64_t H = a.shape(1), S = a.shape(2), C = a.shape(3);
  st = {H * S * C, S * C, C, 1};
  return row_major(a, buf);
}

class QuantizedAttention : public CpuOnly {
 public:
  QuantizedAttention(mx::Stream s, float scale, MaskKind mask, int bits, int group)
      : CpuOnly(s), scale_(scale), mask_(mask), bits_(bits), group_(group) {}
  const char* name() const override { return "MlxNbQuantizedAttention"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const QuantizedAttention&>(other);
    return o.scale_ == scale_ && o.mask_ == mask_ && o.bits_ == bits_ && o.group_ == group_;
  }
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& out = outs[0];
    alloc(out);
    std::optional<mx::array> mask;
    if (in.size() > 7) mask = in[7];
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([in, mask, o = out.data<float>(), scale = scale_, kind = mask_, bits = bits_, group = group_]() {
      thread_local std::vector<float> qbuf, fbuf[4];
      thread_local std::vector<uint32_t> wbuf[2];
      const auto& qa = in[0];
      const int64_t B = qa.shape(0), H = qa.shape(1), L = qa.shape(2), D = qa.shape(3);
      const int64_t Hk = in[1].shape(1), S = in[1].shape(2), group_heads = H / Hk;
      const float* q = row_major(qa, qbuf);
      mx::Strides kws, kss, kbs, vws, vss, vbs, ms(4, 0);
      const uint32_t* kw = cache_view(in[1], wbuf[0], kws);
      const float* ks = cache_view(in[2], fbuf[0], kss);
      const float* kb = cache_view(in[3], fbuf[1], kbs);
      const uint32_t* vw = cache_view(in[4], wbuf[1], vws);
      const float* vs = cache_view(in[5], fbuf[2], vss);
      const float* vb = cache_view(in[6], fbuf[3], vbs);
      if (mask)
        for (int i = 0, nd = mask->ndim(); i < nd; ++i) ms[4 - nd + i] = mask->shape(i) == 1 ? 0 : mask->strides(i);
      // a block: one batch row, one KV head, up to kBlock of the query rows that read it
      constexpr int64_t kBlock = 16;
      const int64_t per_head = group_heads * L, blocks = (per_head + kBlock - 1) / kBlock;
      const Isa& isa_ = isa();
      for_rows(B * Hk * blocks, kBlock * S * D, [&](int64_t i0, int64_t i1) {
        const float* qs[kBlock];
        float* os[kBlock];
        int64_t limits[kBlock];
        const float* adds[kBlock];
        const uint8_t* keeps[kBlock];
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t b = i / (Hk * blocks), kh = (i / blocks) % Hk, first = (i % blocks) * kBlock;
          QAttnBlock a{};
          a.rows = std::min(kBlock, per_head - first);
          for (int64_t r = 0; r < a.rows; ++r) {
            const int64_t h = kh * group_heads + (first + r) / L, l = (first + r) % L;
            qs[r] = q + ((b * H + h) * L + l) * D;
            os[r] = o + ((b * L + l) * H + h) * D;
            limits[r] = kind == MaskKind::kCausal ? std::min(S, l + (S - L) + 1) : S;
            const int64_t at = b * ms[0] + h * ms[1] + l * ms[2];
            adds[r] = kind == MaskKind::kAdditive ? mask->data<float>() + at : nullptr;
            keeps[r] = kind == MaskKind::kBool ? mask->data<uint8_t>() + at : nullptr;
          }
          a.q = qs, a.out = os, a.limit = limits, a.add_mask = adds, a.keep = keeps, a.mask_stride = ms[3];
          a.D = D, a.bits = bits, a.group = group, a.scale = scale;
          a.kw = kw + b * kws[0] + kh * kws[1], a.kw_stride = kws[2];
          a.ks = ks + b * kss[0] + kh * kss[1], a.ks_stride = kss[2];
          a.kb = kb + b * kbs[0] + kh * kbs[1];
          a.vw = vw + b * vws[0] + kh * vws[1], a.vw_stride = vws[2];
          a.vs = vs + b * vss[0] + kh * vss[1], a.vs_stride = vss[2];
          a.vb = vb + b * vbs[0] + kh * vbs[1];
          isa_.qattn_block(a);
        }
      }, 1 << 16);
    });
  }

 private:
  float scale_;
  MaskKind mask_;
  int bits_, group_;
};

// The mask's kind, checked to broadcast to [B, H, L, S], as float32 or bool.
MaskKind mask_kind(const std::string& op, std::optional<mx::array>& mask, bool causal, int B, int H, int L, int S,
                   mx::StreamOrDevice s) {
  if (causal && mask) fail(op, "give a mask or causal, not both");
  if (causal && L > S) fail(op, "a causal mask needs at least as many keys as queries");
  if (!mask) return causal ? MaskKind::kCausal : MaskKind::kNone;
  mx::array m = *mask;
  if (m.ndim() > 4) fail(op, "the mask must broadcast to [B, heads, L, S]");
  MaskKind kind = MaskKind::kBool;
  if (m.dtype() != mx::bool_) {
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
  mask = m;  // read through broadcast strides: no broadcast op a layer
  return kind;
}

}  // namespace

mx::array quantized_attention(const mx::array& q, const mx::array& kw, const mx::array& ks, const mx::array& kb,
                              const mx::array& vw, const mx::array& vs, const mx::array& vb, float scale, int bits,
                              int group_size, bool causal, const std::optional<mx::array>& mask,
                              mx::StreamOrDevice s) {
  const std::string op = "quantized_attention";
  check_float(op, q);
  if (bits != 4 && bits != 8) fail(op, "bits must be 4 or 8");
  if (q.ndim() != 4) fail(op, "q must be [B, heads, L, D]");
  const int B = q.shape(0), H = q.shape(1), L = q.shape(2), D = q.shape(3);
  if (group_size <= 0 || D % group_size || group_size % 2) fail(op, "group_size must divide the head size D");
  const mx::array* parts[] = {&kw, &ks, &kb, &vw, &vs, &vb};
  for (auto* a : parts)
    if (a->ndim() != 4 || a->shape(0) != B || a->shape(1) != kw.shape(1) || a->shape(2) != kw.shape(2))
      fail(op, "keys and values must be [B, kv_heads, S, *] (words, scales, biases)");
  const int Hk = kw.shape(1), S = kw.shape(2);
  if (H % Hk) fail(op, "kv_heads must divide the query heads");
  for (auto* w : {&kw, &vw})
    if (w->dtype() != mx::uint32 || w->shape(3) * 32 / bits != D) fail(op, "words must be uint32, D * bits / 32 a key");
  for (auto* a : {&ks, &kb, &vs, &vb}) {
    check_float(op, *a);
    if (a->shape(3) * group_size != D) fail(op, "scales and biases must hold D / group_size a key");
  }
  std::optional<mx::array> m = mask;
  const MaskKind kind = mask_kind(op, m, causal, B, H, L, S, s);
  std::vector<mx::array> inputs{as_f32(q, s), kw, as_f32(ks, s), as_f32(kb, s), vw, as_f32(vs, s), as_f32(vb, s)};
  if (m) inputs.push_back(*m);
  auto out = mx::array({B, L, H * D}, mx::float32,
                       std::make_shared<QuantizedAttention>(mx::to_stream(s), scale, kind, bits, group_size),
                       std::move(inputs));
  return back_to(out, q.dtype(), s);
}

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
  std::optional<mx::array> m = mask;
  const MaskKind kind = mask_kind(op, m, causal, B, H, L, S, s);
  std::vector<mx::array> inputs{as_f32(q, s), as_f32(k, s), as_f32(v, s)};
  if (m) inputs.push_back(*m);
  auto out = mx::array({B, L, H * D}, mx::float32, std::make_shared<Attention>(mx::to_stream(s), scale, kind),
                       std::move(inputs));
  return back_to(out, q.dtype(), s);
}

}  // namespace mlxnb
