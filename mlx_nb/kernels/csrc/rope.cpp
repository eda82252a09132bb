// RoPE as MLX primitives: mx.fast.rope's contract, and the split of a fused q/k/v projection into
// heads with queries and keys rotated, in one pass instead of reshapes, transposes and two ropes.
#include <cmath>

#include "common.h"
#include "ops.h"

namespace mlxnb {
namespace {

struct RopeTable {
  std::vector<int32_t> offsets;
  int64_t L = -1;
  int dims = 0;
  float base = 0, scale = 0;
  std::vector<float> freqs;
  std::vector<float> cos, sin;  // [offsets][L][dims / 2]
};

// The angles for these positions, reused while the next call asks for the same ones (every layer of
// a step does, for queries and keys). Computed as MLX's fallback does, in float32.
const RopeTable& rope_table(const int32_t* off, int64_t n_off, int64_t L, int dims, float base, float scale,
                            const float* freqs) {
  thread_local RopeTable t;
  const int half = dims / 2;
  const bool same = t.L == L && t.dims == dims && t.base == base && t.scale == scale &&
                    t.offsets.size() == static_cast<size_t>(n_off) && std::equal(off, off + n_off, t.offsets.begin()) &&
                    (freqs ? t.freqs.size() == static_cast<size_t>(half) && std::equal(freqs, freqs + half, t.freqs.begin())
                           : t.freqs.empty());
  if (same) return t;
  t.offsets.assign(off, off + n_off);
  t.L = L, t.dims = dims, t.base = base, t.scale = scale;
  if (freqs) {
    t.freqs.assign(freqs, freqs + half);
  } else {
    t.freqs.clear();
  }
  std::vector<float> inv(half);
  const float step = std::log(base) / static_cast<float>(half);
  for (int i = 0; i < half; ++i) inv[i] = freqs ? 1.0f / freqs[i] : std::exp(-static_cast<float>(i) * step);
  t.cos.resize(n_off * L * half);
  t.sin.resize(n_off * L * half);
  for (int64_t b = 0; b < n_off; ++b)
    for (int64_t l = 0; l < L; ++l) {
      const float pos = static_cast<float>(l + off[b]) * scale;
      for (int i = 0; i < half; ++i) {
        const float th = pos * inv[i];
        t.cos[(b * L + l) * half + i] = std::cos(th);
        t.sin[(b * L + l) * half + i] = std::sin(th);
      }
    }
  return t;
}

// y = x rotated by the angles (c, s) on its first `dims` values (pairs (2i, 2i+1) when traditional,
// else (i, i + dims/2)); the rest copied.
inline void rotate(const float* x, float* y, const float* c, const float* s, int dims, int64_t D, bool trad) {
  const int half = dims / 2;
  for (int i = 0; i < half; ++i) {
    const int64_t i1 = trad ? 2 * i : i, i2 = trad ? i1 + 1 : i1 + half;
    const float x1 = x[i1], x2 = x[i2];
    y[i1] = x1 * c[i] - x2 * s[i];
    y[i2] = x1 * s[i] + x2 * c[i];
  }
  if (dims < D) std::memcpy(y + dims, x + dims, (D - dims) * sizeof(float));
}

struct RopeArgs {
  int dims;
  bool traditional;
  float base, scale;
  bool operator==(const RopeArgs& o) const {
    return dims == o.dims && traditional == o.traditional && base == o.base && scale == o.scale;
  }
};

// The angles for a RoPE primitive's offsets (and frequencies), read when its kernel runs.
const RopeTable& table_for(const mx::array& offsets, const std::optional<mx::array>& freqs, int64_t L,
                           const RopeArgs& a) {
  thread_local std::vector<float> fbuf;
  thread_local std::vector<int32_t> obuf;
  return rope_table(row_major(offsets, obuf), offsets.size(), L, a.dims, a.base, a.scale,
                    freqs ? row_major(*freqs, fbuf) : nullptr);
}

class Rope : public CpuOnly {
 public:
  Rope(mx::Stream s, RopeArgs a) : CpuOnly(s), a_(a) {}
  const char* name() const override { return "MlxNbRoPE"; }
  bool is_equivalent(const mx::Primitive& other) const override { return static_cast<const Rope&>(other).a_ == a_; }
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& x = in[0];
    auto& out = outs[0];
    alloc(out);
    const int64_t D = x.shape(-1), L = x.shape(-2), B = x.shape(0), H = x.size() / (B * L * D);
    std::optional<mx::array> freqs;
    if (in.size() > 2) freqs = in[2];
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([xa = x, offa = in[1], freqs, o = out.data<float>(), B, H, L, D, a = a_]() {
      thread_local std::vector<float> xbuf;
      const float* x = row_major(xa, xbuf);
      const int64_t n_off = offa.size();
      const RopeTable& t = table_for(offa, freqs, L, a);
      const int half = a.dims / 2;
      for_rows(B * H, L * D, [&](int64_t r0, int64_t r1) {
        for (int64_t bh = r0; bh < r1; ++bh) {
          const int64_t b = n_off == 1 ? 0 : bh / H;
          for (int64_t l = 0; l < L; ++l)
            rotate(x + (bh * L + l) * D, o + (bh * L + l) * D, t.cos.data() + (b * L + l) * half,
                   t.sin.data() + (b * L + l) * half, a.dims, D, a.traditional);
        }
      });
    });
  }

 private:
  RopeArgs a_;
};

class QkvRope : public CpuOnly {
 public:
  QkvRope(mx::Stream s, int heads, int kv_heads, int head_dim, RopeArgs a)
      : CpuOnly(s), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), a_(a) {}
  const char* name() const override { return "MlxNbQkvRoPE"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const QkvRope&>(other);
    return o.heads_ == heads_ && o.kv_heads_ == kv_heads_ && o.head_dim_ == head_dim_ && o.a_ == a_;
  }
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    for (auto& o : outs) alloc(o);
    const int64_t B = in[0].shape(0), L = in[0].shape(1);
    std::optional<mx::array> freqs;
    if (in.size() > 2) freqs = in[2];
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([xa = in[0], offa = in[1], freqs, q = outs[0].data<float>(), k = outs[1].data<float>(),
                  v = outs[2].data<float>(), B, L, H = int64_t(heads_), Hk = int64_t(kv_heads_), D = int64_t(head_dim_),
                  a = a_]() {
      thread_local std::vector<float> xbuf;
      const float* x = row_major(xa, xbuf);
      const int64_t n_off = offa.size();
      const RopeTable& t = table_for(offa, freqs, L, a);
      const int half = a.dims / 2;
      const int64_t all = H + 2 * Hk;
      for_rows(B * L, all * D, [&](int64_t r0, int64_t r1) {
        for (int64_t bl = r0; bl < r1; ++bl) {
          const int64_t b = bl / L, l = bl % L, tb = n_off == 1 ? 0 : b;
          const float* c = t.cos.data() + (tb * L + l) * half;
          const float* s = t.sin.data() + (tb * L + l) * half;
          const float* src = x + bl * all * D;
          for (int64_t h = 0; h < H; ++h) rotate(src + h * D, q + ((b * H + h) * L + l) * D, c, s, a.dims, D, a.traditional);
          for (int64_t h = 0; h < Hk; ++h)
            rotate(src + (H + h) * D, k + ((b * Hk + h) * L + l) * D, c, s, a.dims, D, a.traditional);
          for (int64_t h = 0; h < Hk; ++h)
            std::memcpy(v + ((b * Hk + h) * L + l) * D, src + (H + Hk + h) * D, D * sizeof(float));
        }
      });
    });
  }

 private:
  int heads_, kv_heads_, head_dim_;
  RopeArgs a_;
};

std::vector<mx::array> rope_inputs(const std::string& op, const mx::array& x, int batch, const mx::array& offset,
                                   const std::optional<mx::array>& freqs, int dims, std::optional<float> base,
                                   mx::StreamOrDevice s) {
  if (base.has_value() == freqs.has_value()) fail(op, "give exactly one of base and freqs");
  if (dims <= 0 || dims % 2) fail(op, "dims must be even and positive");
  if (!mx::issubdtype(offset.dtype(), mx::integer) || offset.ndim() > 1 ||
      (offset.size() != 1 && offset.size() != static_cast<size_t>(batch)))
    fail(op, "offset must be an integer scalar or one per batch row");
  mx::array off = offset.dtype() == mx::int32 ? offset : mx::astype(offset, mx::int32, s);
  std::vector<mx::array> inputs{as_f32(x, s), off};
  if (freqs) {
    if (freqs->ndim() != 1 || freqs->size() != static_cast<size_t>(dims / 2)) fail(op, "freqs must have dims / 2 entries");
    inputs.push_back(as_f32(*freqs, s));
  }
  return inputs;
}

}  // namespace

mx::array rope(const mx::array& x, int dims, bool traditional, std::optional<float> base, float scale,
               const mx::array& offset, const std::optional<mx::array>& freqs, mx::StreamOrDevice s) {
  const std::string op = "rope";
  check_float(op, x);
  if (x.ndim() < 3) fail(op, "x must have at least 3 dimensions");
  if (dims > x.shape(-1)) fail(op, "dims must be at most x's last axis");
  auto inputs = rope_inputs(op, x, x.shape(0), offset, freqs, dims, base, s);
  auto out = mx::array(x.shape(), mx::float32,
                       std::make_shared<Rope>(mx::to_stream(s), RopeArgs{dims, traditional, base.value_or(0.0f), scale}),
                       std::move(inputs));
  return back_to(out, x.dtype(), s);
}

std::vector<mx::array> qkv_rope(const mx::array& qkv, int heads, int kv_heads, int head_dim, int dims, bool traditional,
                                std::optional<float> base, float scale, const mx::array& offset,
                                const std::optional<mx::array>& freqs, mx::StreamOrDevice s) {
  const std::string op = "qkv_rope";
  check_float(op, qkv);
  if (qkv.ndim() != 3 || qkv.shape(-1) != (heads + 2 * kv_heads) * head_dim)
    fail(op, "qkv must be [B, L, (heads + 2 * kv_heads) * head_dim]");
  if (dims > head_dim) fail(op, "dims must be at most head_dim");
  const int B = qkv.shape(0), L = qkv.shape(1);
  auto inputs = rope_inputs(op, qkv, B, offset, freqs, dims, base, s);
  auto outs = mx::array::make_arrays(
      {{B, heads, L, head_dim}, {B, kv_heads, L, head_dim}, {B, kv_heads, L, head_dim}},
      {mx::float32, mx::float32, mx::float32},
      std::make_shared<QkvRope>(mx::to_stream(s), heads, kv_heads, head_dim,
                                RopeArgs{dims, traditional, base.value_or(0.0f), scale}),
      std::move(inputs));
  for (auto& o : outs) o = back_to(o, qkv.dtype(), s);
  return outs;
}

}  // namespace mlxnb
