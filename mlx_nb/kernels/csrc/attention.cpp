// Scaled dot-product attention as an MLX primitive: MLX's CPU fallback is five ops with a BLAS call
// per (row, head); this reads the cache's keys and values in place (a cache hands out strided views),
// float or quantized, in blocks of the query rows sharing a KV head (attn_block.h), and writes
// [B, L, heads * D], the output projection's input.
#include "common.h"
#include "isa.h"
#include "ops.h"

namespace mlxnb {
namespace {

enum class MaskKind { kNone, kCausal, kBool, kAdditive };

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

// Query rows per block: up to 16 (a chunk of keys read once for all of them), fewer when the
// batch is small, so the blocks still keep every thread busy (a lone decode row of 3 KV heads).
int64_t rows_per_block(int64_t blocks_of_one, int64_t per_head) {
  const int64_t wanted = 2 * Pool::instance().threads();
  const int64_t by_threads = std::max<int64_t>(1, blocks_of_one * per_head / std::max<int64_t>(wanted, 1));
  return std::min<int64_t>({16, per_head, by_threads});
}

// Inputs: q, then k, v (bits 0) or the words, scales and biases of k and of v (bits 4 or 8), then
// the mask if any.
class Attention : public CpuOnly {
 public:
  Attention(mx::Stream s, float scale, MaskKind mask, int bits, int group, int kv_len = -1)
      : CpuOnly(s), scale_(scale), mask_(mask), bits_(bits), group_(group), kv_len_(kv_len) {}
  const char* name() const override { return bits_ ? "MlxNbQuantizedAttention" : "MlxNbAttention"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const Attention&>(other);
    return o.scale_ == scale_ && o.mask_ == mask_ && o.bits_ == bits_ && o.group_ == group_ && o.kv_len_ == kv_len_;
  }
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& out = outs[0];
    alloc(out);
    const size_t parts = bits_ ? 7 : 3;
    std::optional<mx::array> mask;
    if (in.size() > parts) mask = in[parts];
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([in, mask, o = out.data<float>(), scale = scale_, kind = mask_, bits = bits_, group = group_,
                  kv_len = kv_len_]() {
      thread_local std::vector<float> qbuf, fbuf[6];
      thread_local std::vector<uint32_t> wbuf[2];
      const auto& qa = in[0];
      const int64_t B = qa.shape(0), H = qa.shape(1), L = qa.shape(2), D = qa.shape(3);
      const int64_t Hk = in[1].shape(1), S = kv_len < 0 ? in[1].shape(2) : kv_len, group_heads = H / Hk;
      const float* q = row_major(qa, qbuf);
      // Keys and values are read through their strides while each key's values are contiguous.
      mx::Strides st[6], ms(4, 0);
      const float* kf = nullptr;
      const float* vf = nullptr;
      const uint32_t *kw = nullptr, *vw = nullptr;
      const float *ks = nullptr, *kb = nullptr, *vs = nullptr, *vb = nullptr;
      if (bits == 0) {
        kf = cache_view(in[1], fbuf[0], st[0]);
        vf = cache_view(in[2], fbuf[1], st[1]);
      } else {
        kw = cache_view(in[1], wbuf[0], st[0]);
        ks = cache_view(in[2], fbuf[0], st[2]);
        kb = cache_view(in[3], fbuf[1], st[3]);
        vw = cache_view(in[4], wbuf[1], st[1]);
        vs = cache_view(in[5], fbuf[2], st[4]);
        vb = cache_view(in[6], fbuf[3], st[5]);
      }
      if (mask)
        for (int i = 0, nd = mask->ndim(); i < nd; ++i) ms[4 - nd + i] = mask->shape(i) == 1 ? 0 : mask->strides(i);
      const int64_t per_head = group_heads * L, block = rows_per_block(B * Hk, per_head);
      const int64_t blocks = (per_head + block - 1) / block;
      const Isa& isa_ = isa();
      for_rows(B * Hk * blocks, block * S * D, [&](int64_t i0, int64_t i1) {
        std::vector<const float*> qs(block), adds(block);
        std::vector<float*> os(block);
        std::vector<int64_t> limits(block);
        std::vector<const uint8_t*> keeps(block);
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t b = i / (Hk * blocks), kh = (i / blocks) % Hk, first = (i % blocks) * block;
          AttnBlock a{};
          a.rows = std::min(block, per_head - first);
          for (int64_t r = 0; r < a.rows; ++r) {
            const int64_t h = kh * group_heads + (first + r) / L, l = (first + r) % L;
            qs[r] = q + ((b * H + h) * L + l) * D;
            os[r] = o + ((b * L + l) * H + h) * D;
            limits[r] = kind == MaskKind::kCausal ? std::min(S, l + (S - L) + 1) : S;
            const int64_t at = b * ms[0] + h * ms[1] + l * ms[2];
            adds[r] = kind == MaskKind::kAdditive ? mask->data<float>() + at : nullptr;
            keeps[r] = kind == MaskKind::kBool ? mask->data<uint8_t>() + at : nullptr;
          }
          a.q = qs.data(), a.out = os.data(), a.limit = limits.data(), a.add_mask = adds.data();
          a.keep = keeps.data(), a.mask_stride = ms[3];
          a.D = D, a.bits = bits, a.group = group, a.scale = scale;
          auto at = [&](const auto* base, const mx::Strides& s) { return base + b * s[0] + kh * s[1]; };
          if (bits == 0) {
            a.kf = at(kf, st[0]), a.kf_stride = st[0][2];
            a.vf = at(vf, st[1]), a.vf_stride = st[1][2];
          } else {
            a.kw = at(kw, st[0]), a.kw_stride = st[0][2];
            a.vw = at(vw, st[1]), a.vw_stride = st[1][2];
            a.ks = at(ks, st[2]), a.ks_stride = st[2][2];
            a.kb = at(kb, st[3]);
            a.vs = at(vs, st[4]), a.vs_stride = st[4][2];
            a.vb = at(vb, st[5]);
          }
          isa_.attn_block(a);
        }
      }, 1 << 16);
    });
  }

 private:
  float scale_;
  MaskKind mask_;
  int bits_, group_, kv_len_;  // kv_len_: keys read (-1: all)
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
                       std::make_shared<Attention>(mx::to_stream(s), scale, kind, bits, group_size),
                       std::move(inputs));
  return back_to(out, q.dtype(), s);
}

mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale, bool causal,
                    const std::optional<mx::array>& mask, int kv_len, mx::StreamOrDevice s) {
  const std::string op = "attention";
  for (auto* a : {&q, &k, &v}) {
    check_float(op, *a);
    if (a->ndim() != 4) fail(op, "q, k and v must be [B, heads, L, D]");
  }
  const int B = q.shape(0), H = q.shape(1), L = q.shape(2), D = q.shape(3);
  if (k.shape() != v.shape() || k.shape(0) != B || k.shape(3) != D || H % k.shape(1))
    fail(op, "k and v must be [B, kv_heads, S, D] with kv_heads dividing the query heads");
  if (kv_len > k.shape(2) || kv_len == 0 || kv_len < -1) fail(op, "kv_len must be in [1, S] (or -1 for all)");
  const int S = kv_len < 0 ? k.shape(2) : kv_len;
  std::optional<mx::array> m = mask;
  const MaskKind kind = mask_kind(op, m, causal, B, H, L, S, s);
  std::vector<mx::array> inputs{as_f32(q, s), as_f32(k, s), as_f32(v, s)};
  if (m) inputs.push_back(*m);
  auto out = mx::array({B, L, H * D}, mx::float32,
                       std::make_shared<Attention>(mx::to_stream(s), scale, kind, 0, 0, kv_len), std::move(inputs));
  return back_to(out, q.dtype(), s);
}

}  // namespace mlxnb
