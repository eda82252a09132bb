// RoPE as MLX primitives: mx.fast.rope's contract, and the split of a fused q/k/v projection into
// heads with queries and keys rotated, in one pass instead of reshapes, transposes and two ropes.
#include <atomic>
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

std::atomic<int64_t> cache_copies{0};

// Inputs: the projection's parts (side by side along the last axis), the offsets, the frequencies
// if any, then the key and value caches if given (outputs 1 and 2 are then the caches with this
// step's keys and values written at column `write_at`, in the caches' own buffers when MLX may
// donate them: the cache update is not an op of its own).
class QkvRope : public CpuOnly {
 public:
  QkvRope(mx::Stream s, int heads, int kv_heads, int head_dim, RopeArgs a, int parts, bool freqs, int write_at)
      : CpuOnly(s), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), a_(a), parts_(parts), freqs_(freqs),
        write_at_(write_at) {}
  const char* name() const override { return "MlxNbQkvRoPE"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const QkvRope&>(other);
    return o.heads_ == heads_ && o.kv_heads_ == kv_heads_ && o.head_dim_ == head_dim_ && o.a_ == a_ &&
           o.parts_ == parts_ && o.freqs_ == freqs_ && o.write_at_ == write_at_;
  }
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    const size_t cache_at = parts_ + 1 + (freqs_ ? 1 : 0);
    const bool cached = in.size() > cache_at;
    alloc(outs[0]);
    // A cache is written in place when MLX lets us take its buffer, else copied whole first.
    bool copy_k = false, copy_v = false;
    auto take = [&](const mx::array& c, mx::array& o) {
      if (c.is_donatable() && c.flags().row_contiguous && c.data_size() == c.size()) {
        o.copy_shared_buffer(c);
        return false;
      }
      alloc(o);
      cache_copies.fetch_add(1, std::memory_order_relaxed);
      return true;
    };
    if (cached) {
      // Each output of a primitive holds its own copy of the inputs, so a cache is held twice more
      // than by `in` and MLX's donation test (nothing else holds the array) would always fail. The
      // other outputs are being computed right here and MLX drops their inputs once this returns,
      // so drop them now; under a transformation (a tracer) they stay, and so does the copy.
      if (!outs[0].is_tracer())
        for (auto& o : outs)
          if (&o.inputs() != &in) o.inputs().clear();
      copy_k = take(in[cache_at], outs[1]);
      copy_v = take(in[cache_at + 1], outs[2]);
    } else {
      alloc(outs[1]), alloc(outs[2]);
    }
    std::optional<mx::array> freqs, kc, vc;
    if (freqs_) freqs = in[parts_ + 1];
    if (copy_k) kc = in[cache_at];
    if (copy_v) vc = in[cache_at + 1];
    const int64_t B = in[0].shape(0), L = in[0].shape(1);
    const int64_t S = cached ? outs[1].shape(2) : L, col = cached ? write_at_ : 0;
    std::vector<mx::array> parts(in.begin(), in.begin() + parts_);
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([parts, offa = in[parts_], freqs, kc, vc, q = outs[0].data<float>(), k = outs[1].data<float>(),
                  v = outs[2].data<float>(), B, L, S, col, H = int64_t(heads_), Hk = int64_t(kv_heads_),
                  D = int64_t(head_dim_), a = a_]() {
      thread_local std::vector<float> cbuf;
      if (kc) std::memcpy(k, row_major(*kc, cbuf), kc->nbytes());
      if (vc) std::memcpy(v, row_major(*vc, cbuf), vc->nbytes());
      // Each head's source: its part's rows, and its column in them.
      thread_local std::vector<std::vector<float>> xbufs;
      xbufs.resize(std::max(xbufs.size(), parts.size()));
      const int64_t all = H + 2 * Hk;
      std::vector<const float*> base(all);
      std::vector<int64_t> width(all);
      for (size_t p = 0, h = 0; p < parts.size(); ++p) {
        const float* x = row_major(parts[p], xbufs[p]);
        const int64_t w = parts[p].shape(-1);
        for (int64_t c = 0; c < w; c += D, ++h) base[h] = x + c, width[h] = w;
      }
      const int64_t n_off = offa.size();
      const RopeTable& t = table_for(offa, freqs, L, a);
      const int half = a.dims / 2;
      for_rows(B * L, all * D, [&](int64_t r0, int64_t r1) {
        for (int64_t bl = r0; bl < r1; ++bl) {
          const int64_t b = bl / L, l = bl % L, tb = n_off == 1 ? 0 : b;
          const float* c = t.cos.data() + (tb * L + l) * half;
          const float* s = t.sin.data() + (tb * L + l) * half;
          auto src = [&](int64_t h) { return base[h] + bl * width[h]; };
          for (int64_t h = 0; h < H; ++h) rotate(src(h), q + ((b * H + h) * L + l) * D, c, s, a.dims, D, a.traditional);
          for (int64_t h = 0; h < Hk; ++h)
            rotate(src(H + h), k + ((b * Hk + h) * S + col + l) * D, c, s, a.dims, D, a.traditional);
          for (int64_t h = 0; h < Hk; ++h)
            std::memcpy(v + ((b * Hk + h) * S + col + l) * D, src(H + Hk + h), D * sizeof(float));
        }
      });
    });
  }

 private:
  int heads_, kv_heads_, head_dim_;
  RopeArgs a_;
  int parts_;
  bool freqs_;
  int write_at_;
};

// The inputs of a RoPE primitive: `xs` as float32, then the offsets (int32), then the frequencies if any.
std::vector<mx::array> rope_inputs(const std::string& op, const std::vector<mx::array>& xs, int batch,
                                   const mx::array& offset, const std::optional<mx::array>& freqs, int dims,
                                   std::optional<float> base, mx::StreamOrDevice s) {
  if (base.has_value() == freqs.has_value()) fail(op, "give exactly one of base and freqs");
  if (dims <= 0 || dims % 2) fail(op, "dims must be even and positive");
  if (!mx::issubdtype(offset.dtype(), mx::integer) || offset.ndim() > 1 ||
      (offset.size() != 1 && offset.size() != static_cast<size_t>(batch)))
    fail(op, "offset must be an integer scalar or one per batch row");
  mx::array off = offset.dtype() == mx::int32 ? offset : mx::astype(offset, mx::int32, s);
  std::vector<mx::array> inputs;
  for (auto& x : xs) inputs.push_back(as_f32(x, s));
  inputs.push_back(off);
  if (freqs) {
    if (freqs->ndim() != 1 || freqs->size() != static_cast<size_t>(dims / 2)) fail(op, "freqs must have dims / 2 entries");
    inputs.push_back(as_f32(*freqs, s));
  }
  return inputs;
}

}  // namespace

int64_t qkv_rope_cache_copies() { return cache_copies.load(std::memory_order_relaxed); }

mx::array rope(const mx::array& x, int dims, bool traditional, std::optional<float> base, float scale,
               const mx::array& offset, const std::optional<mx::array>& freqs, mx::StreamOrDevice s) {
  const std::string op = "rope";
  check_float(op, x);
  if (x.ndim() < 3) fail(op, "x must have at least 3 dimensions");
  if (dims > x.shape(-1)) fail(op, "dims must be at most x's last axis");
  auto inputs = rope_inputs(op, {x}, x.shape(0), offset, freqs, dims, base, s);
  auto out = mx::array(x.shape(), mx::float32,
                       std::make_shared<Rope>(mx::to_stream(s), RopeArgs{dims, traditional, base.value_or(0.0f), scale}),
                       std::move(inputs));
  return back_to(out, x.dtype(), s);
}

std::vector<mx::array> qkv_rope(const std::vector<mx::array>& parts, int heads, int kv_heads, int head_dim, int dims,
                                bool traditional, std::optional<float> base, float scale, const mx::array& offset,
                                const std::optional<mx::array>& freqs, const std::optional<mx::array>& k_cache,
                                const std::optional<mx::array>& v_cache, int write_at, mx::StreamOrDevice s) {
  const std::string op = "qkv_rope";
  if (parts.empty()) fail(op, "give the projection as one array or its parts");
  const auto& first = parts[0];
  int64_t width = 0;
  for (auto& p : parts) {
    check_float(op, p);
    if (p.ndim() != 3 || p.shape(0) != first.shape(0) || p.shape(1) != first.shape(1) || p.shape(2) % head_dim)
      fail(op, "each part must be [B, L, a multiple of head_dim]");
    width += p.shape(2);
  }
  if (width != int64_t(heads + 2 * kv_heads) * head_dim)
    fail(op, "qkv must be [B, L, (heads + 2 * kv_heads) * head_dim]");
  if (dims > head_dim) fail(op, "dims must be at most head_dim");
  const int B = first.shape(0), L = first.shape(1);
  if (k_cache.has_value() != v_cache.has_value()) fail(op, "give both caches or neither");
  auto inputs = rope_inputs(op, parts, B, offset, freqs, dims, base, s);
  mx::Shape kv_shape{B, kv_heads, L, head_dim};
  if (k_cache) {
    for (auto* c : {&*k_cache, &*v_cache})
      if (c->dtype() != mx::float32 || c->ndim() != 4 || c->shape(0) != B || c->shape(1) != kv_heads ||
          c->shape(3) != head_dim || c->shape() != k_cache->shape())
        fail(op, "the caches must be float32 [B, kv_heads, S, head_dim]");
    if (write_at < 0 || write_at + L > k_cache->shape(2)) fail(op, "write_at + L must fit in the caches");
    kv_shape = k_cache->shape();
    inputs.push_back(*k_cache);
    inputs.push_back(*v_cache);
  } else {
    write_at = 0;
  }
  auto outs = mx::array::make_arrays(
      {{B, heads, L, head_dim}, kv_shape, kv_shape}, {mx::float32, mx::float32, mx::float32},
      std::make_shared<QkvRope>(mx::to_stream(s), heads, kv_heads, head_dim,
                                RopeArgs{dims, traditional, base.value_or(0.0f), scale}, int(parts.size()),
                                freqs.has_value(), write_at),
      std::move(inputs));
  if (!k_cache)
    for (auto& o : outs) o = back_to(o, first.dtype(), s);
  else
    outs[0] = back_to(outs[0], first.dtype(), s);
  return outs;
}

}  // namespace mlxnb
