#include "ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "isa.h"
#include "mlx/backend/cpu/encoder.h"
#include "pool.h"

namespace mlxnb {
namespace {

// ---------------------------------------------------------------------------------------------
// Shared plumbing

[[noreturn]] void fail(const std::string& op, const std::string& what) {
  throw std::invalid_argument("[mlx_nb." + op + "] " + what);
}

mx::array as_f32(const mx::array& a, mx::StreamOrDevice s) {
  return mx::contiguous(a.dtype() == mx::float32 ? a : mx::astype(a, mx::float32, s), false, s);
}

mx::array back_to(const mx::array& out, mx::Dtype dtype, mx::StreamOrDevice s) {
  return dtype == mx::float32 ? out : mx::astype(out, dtype, s);
}

void check_float(const std::string& op, const mx::array& a) {
  if (!mx::issubdtype(a.dtype(), mx::floating)) fail(op, "expects a floating-point array");
}

// Rows of `n` split into contiguous chunks over the pool when the work is large enough.
template <class F>
void for_rows(int64_t rows, int64_t n, F&& f) {
  auto& pool = Pool::instance();
  if (rows < 2 || rows * n < (1 << 15) || pool.threads() == 1) {
    f(0, rows);
    return;
  }
  const int64_t tasks = std::min<int64_t>(rows, pool.threads() * 4);
  const int64_t per = (rows + tasks - 1) / tasks;
  pool.parallel_for((rows + per - 1) / per, [&](int64_t t) { f(t * per, std::min(rows, (t + 1) * per)); });
}

class CpuOnly : public mx::Primitive {
 public:
  using mx::Primitive::Primitive;
  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error(std::string("[mlx_nb] ") + name() + " runs on the CPU only");
  }
};

void alloc(mx::array& out) { out.set_data(mx::allocator::malloc(out.nbytes())); }

// ---------------------------------------------------------------------------------------------
// Quantized matmul

struct Scratch {
  std::vector<int8_t> q;
  std::vector<float> d, sum;
};

void run_qmatmul(const float* x, const QWeight& w, int64_t M, int64_t N, int64_t K, float* out) {
  thread_local Scratch scratch;
  Scratch& sc = scratch;  // the caller's: a lambda body naming a thread_local would get the worker's
  const int64_t nb = K / kBlock;
  sc.q.resize(M * K * 2);
  sc.d.resize(M * nb);
  sc.sum.resize(M * nb);
  const Isa& k = isa();
  for_rows(M, K, [&](int64_t r0, int64_t r1) {
    k.quantize_rows(x + r0 * K, r1 - r0, K, sc.q.data() + r0 * K * 2, sc.d.data() + r0 * nb,
                    sc.sum.data() + r0 * nb);
  });
  const QGemm g{{sc.q.data(), sc.d.data(), sc.sum.data()}, w, M, N, K, out};
  const int64_t tiles = (N + kLanes - 1) / kLanes;
  auto& pool = Pool::instance();
  if (pool.threads() == 1 || M * N * K < (1 << 17)) {
    k.qgemm(g, 0, tiles);
    return;
  }
  // A few tiles of 16 outputs a task; each output is computed whole by one thread.
  const int64_t per = std::max<int64_t>(1, tiles / (pool.threads() * 4));
  pool.parallel_for((tiles + per - 1) / per, [&](int64_t t) { k.qgemm(g, t * per, std::min(tiles, (t + 1) * per)); });
}

// The packed weight's arrays as the kernels read them.
QWeight packed_view(const std::vector<mx::array>& in, int bits, int group_size) {
  return {in[1].data<uint8_t>(), in[2].data<void>(), in[3].data<void>(), in[2].dtype() == mx::float16, bits,
          group_size};
}

class QMatmul : public CpuOnly {
 public:
  QMatmul(mx::Stream s, int64_t n, int group_size, int bits) : CpuOnly(s), n_(n), group_size_(group_size), bits_(bits) {}
  const char* name() const override { return "MlxNbQMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const QMatmul&>(other);
    return o.n_ == n_ && o.group_size_ == group_size_ && o.bits_ == bits_;
  }
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& x = in[0];
    auto& out = outs[0];
    alloc(out);
    const int64_t K = x.shape(-1), M = K ? x.size() / K : 0;
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([x = x.data<float>(), w = packed_view(in, bits_, group_size_), M, N = n_, K,
                  o = out.data<float>()]() { run_qmatmul(x, w, M, N, K, o); });
  }

 private:
  int64_t n_;
  int group_size_, bits_;
};

// Rows of a packed weight, dequantized: the lookup of a quantized embedding.
class QGather : public CpuOnly {
 public:
  QGather(mx::Stream s, int group_size, int bits) : CpuOnly(s), group_size_(group_size), bits_(bits) {}
  const char* name() const override { return "MlxNbQGather"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const QGather&>(other);
    return o.group_size_ == group_size_ && o.bits_ == bits_;
  }
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& out = outs[0];
    alloc(out);
    const int64_t K = out.shape(-1), nb = K / kBlock;
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([ids = in[0].data<int32_t>(), n = static_cast<int64_t>(in[0].size()),
                  w = packed_view(in, bits_, group_size_), K, nb, o = out.data<float>()]() {
      const int64_t ng = K / w.group_size, bpg = w.group_size / kBlock, bb = kLanes * kBlock * w.bits / 8;
      for (int64_t r = 0; r < n; ++r) {
        const int64_t t = ids[r] / kLanes, lane = ids[r] % kLanes;
        for (int64_t b = 0; b < nb; ++b) {
          const uint8_t* blk = w.q + (t * nb + b) * bb;
          const int64_t si = (t * ng + b / bpg) * kLanes + lane;
          const float sc = scale_at(w.scales, w.half, si), bi = scale_at(w.biases, w.half, si);
          for (int k = 0; k < kBlock; ++k)
            o[r * K + b * kBlock + k] = sc * static_cast<float>(packed_q(blk, w.bits, static_cast<int>(lane), k)) + bi;
        }
      }
    });
  }

 private:
  int group_size_, bits_;
};

// ---------------------------------------------------------------------------------------------
// Row-wise float kernels: RMSNorm, SiLU gate, softmax family, exp

enum class RowKind { kRmsNorm, kSiluMul, kSiluGate, kSoftmax, kLogSoftmax, kLogSumExp, kExp };

class RowOp : public CpuOnly {
 public:
  RowOp(mx::Stream s, RowKind kind, float eps = 0.0f) : CpuOnly(s), kind_(kind), eps_(eps) {}
  const char* name() const override {
    switch (kind_) {
      case RowKind::kRmsNorm: return "MlxNbRMSNorm";
      case RowKind::kSiluMul: return "MlxNbSiluMul";
      case RowKind::kSiluGate: return "MlxNbSiluGate";
      case RowKind::kSoftmax: return "MlxNbSoftmax";
      case RowKind::kLogSoftmax: return "MlxNbLogSoftmax";
      case RowKind::kLogSumExp: return "MlxNbLogSumExp";
      default: return "MlxNbExp";
    }
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const RowOp&>(other);
    return o.kind_ == kind_ && o.eps_ == eps_;
  }
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& x = in[0];
    auto& out = outs[0];
    alloc(out);
    const int64_t n = x.ndim() ? x.shape(-1) : 1, rows = n ? x.size() / n : 0;
    const float* b = in.size() > 1 ? in[1].data<float>() : nullptr;
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([kind = kind_, eps = eps_, x = x.data<float>(), b, o = out.data<float>(), rows, n]() {
      const Isa& k = isa();
      for_rows(rows, n, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const float* xr = x + r * n;
          switch (kind) {
            case RowKind::kRmsNorm: k.rms_norm(xr, b, o + r * n, n, eps); break;
            case RowKind::kSiluMul: k.silu_mul(xr, b + r * n, o + r * n, n); break;
            case RowKind::kSiluGate: k.silu_mul(xr, xr + n / 2, o + r * (n / 2), n / 2); break;
            case RowKind::kSoftmax: k.softmax(xr, o + r * n, n); break;
            case RowKind::kLogSoftmax: k.sub_scalar(xr, k.logsumexp(xr, n), o + r * n, n); break;
            case RowKind::kLogSumExp: o[r] = k.logsumexp(xr, n); break;
            case RowKind::kExp: k.exp(xr, o + r * n, n); break;
          }
        }
      });
    });
  }

 private:
  RowKind kind_;
  float eps_;
};

mx::array row_op(const std::string& op, RowKind kind, const mx::array& x, std::vector<mx::array> extra,
                 mx::StreamOrDevice s, float eps = 0.0f, bool keep_last = true) {
  check_float(op, x);
  if (x.ndim() == 0) fail(op, "expects an array with at least one dimension");
  auto stream = mx::to_stream(s);
  std::vector<mx::array> inputs{as_f32(x, s)};
  for (auto& e : extra) inputs.push_back(as_f32(e, s));
  auto shape = x.shape();
  if (!keep_last) shape.back() = 1;
  auto out = mx::array(shape, mx::float32, std::make_shared<RowOp>(stream, kind, eps), std::move(inputs));
  return back_to(out, x.dtype(), s);
}

// ---------------------------------------------------------------------------------------------
// RoPE

struct RopeTable {
  std::vector<int32_t> offsets;
  int64_t L = -1;
  int dims = 0;
  float base = 0, scale = 0;
  std::vector<float> freqs;
  std::vector<float> cos, sin;  // [offsets][L][dims / 2]
};

// The table for these positions, reused while the next call asks for the same ones (every layer of a
// step does, for queries and keys).
const RopeTable& rope_table(const int32_t* off, int64_t n_off, int64_t L, int dims, float base, float scale,
                            const float* freqs) {
  thread_local RopeTable t;
  const int half = dims / 2;
  const bool same = t.L == L && t.dims == dims && t.base == base && t.scale == scale &&
                    t.offsets.size() == static_cast<size_t>(n_off) &&
                    std::equal(off, off + n_off, t.offsets.begin()) &&
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

class Rope : public CpuOnly {
 public:
  Rope(mx::Stream s, int dims, bool traditional, float base, float scale)
      : CpuOnly(s), dims_(dims), traditional_(traditional), base_(base), scale_(scale) {}
  const char* name() const override { return "MlxNbRoPE"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const Rope&>(other);
    return o.dims_ == dims_ && o.traditional_ == traditional_ && o.base_ == base_ && o.scale_ == scale_;
  }
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& x = in[0];
    auto& out = outs[0];
    alloc(out);
    const int64_t D = x.shape(-1), L = x.shape(-2), B = x.shape(0), H = x.size() / (B * L * D);
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([x = x.data<float>(), off = in[1].data<int32_t>(), n_off = static_cast<int64_t>(in[1].size()),
                  freqs = in.size() > 2 ? in[2].data<float>() : nullptr, o = out.data<float>(), B, H, L, D,
                  dims = dims_, trad = traditional_, base = base_, scale = scale_]() {
      const RopeTable& t = rope_table(off, n_off, L, dims, base, scale, freqs);
      const int half = dims / 2;
      for_rows(B * H, L * D, [&](int64_t r0, int64_t r1) {
        for (int64_t bh = r0; bh < r1; ++bh) {
          const int64_t b = n_off == 1 ? 0 : bh / H;
          for (int64_t l = 0; l < L; ++l) {
            const float* xr = x + (bh * L + l) * D;
            float* yr = o + (bh * L + l) * D;
            const float* c = t.cos.data() + (b * L + l) * half;
            const float* s = t.sin.data() + (b * L + l) * half;
            const int64_t step = trad ? 1 : half;  // partner of element i
            for (int i = 0; i < half; ++i) {
              const int64_t i1 = trad ? 2 * i : i, i2 = i1 + step;
              const float x1 = xr[i1], x2 = xr[i2];
              yr[i1] = x1 * c[i] - x2 * s[i];
              yr[i2] = x1 * s[i] + x2 * c[i];
            }
            if (dims < D) std::memcpy(yr + dims, xr + dims, (D - dims) * sizeof(float));
          }
        }
      });
    });
  }

 private:
  int dims_;
  bool traditional_;
  float base_, scale_;
};

// Checks a packed weight (see isa.h) for n outputs of k inputs; returns its scales and biases in one dtype.
std::pair<mx::array, mx::array> check_packed(const std::string& op, const mx::array& packed, const mx::array& scales,
                                             const mx::array& biases, int64_t n, int64_t k, int group_size, int bits,
                                             mx::StreamOrDevice s) {
  if (bits != 4 && bits != 8) fail(op, "supports 4- and 8-bit weights, got " + std::to_string(bits));
  if (group_size < kBlock || group_size % kBlock) fail(op, "group_size must be a multiple of 32");
  if (k <= 0 || k % group_size) fail(op, "the input size must be a positive multiple of group_size");
  const int64_t tiles = (n + kLanes - 1) / kLanes;
  const mx::Shape pshape{static_cast<int>(tiles), static_cast<int>(k / kBlock), kLanes * kBlock * bits / 8};
  const mx::Shape sshape{static_cast<int>(tiles), static_cast<int>(k / group_size), kLanes};
  if (packed.dtype() != mx::uint8 || packed.shape() != pshape)
    fail(op, "the packed weight must be uint8 [ceil(N / 16), K / 32, 16 * 32 * bits / 8]: pack it with pack_weights");
  if (scales.shape() != sshape || biases.shape() != sshape)
    fail(op, "scales and biases must be [ceil(N / 16), K / group_size, 16]: pack them with pack_weights");
  auto prep = [&](const mx::array& a) {
    const bool ok = a.dtype() == mx::float32 || a.dtype() == mx::float16;
    return mx::contiguous(ok ? a : mx::astype(a, mx::float32, s), false, s);
  };
  mx::array sc = prep(scales), bi = prep(biases);
  if (sc.dtype() != bi.dtype()) bi = mx::astype(bi, sc.dtype(), s);
  return {sc, bi};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public operations

mx::array qmatmul(const mx::array& x, const mx::array& packed, const mx::array& scales, const mx::array& biases,
                  int n, int group_size, int bits, mx::StreamOrDevice s) {
  const std::string op = "qmatmul";
  check_float(op, x);
  if (x.ndim() < 1) fail(op, "x must have at least one dimension");
  const int64_t K = x.shape(-1);
  auto [sc, bi] = check_packed(op, packed, scales, biases, n, K, group_size, bits, s);
  auto shape = x.shape();
  shape.back() = n;
  auto out = mx::array(shape, mx::float32, std::make_shared<QMatmul>(mx::to_stream(s), n, group_size, bits),
                       {as_f32(x, s), mx::contiguous(packed, false, s), sc, bi});
  return back_to(out, x.dtype(), s);
}

mx::array qgather(const mx::array& ids, const mx::array& packed, const mx::array& scales, const mx::array& biases,
                  int n, int k, int group_size, int bits, mx::StreamOrDevice s) {
  const std::string op = "qgather";
  if (!mx::issubdtype(ids.dtype(), mx::integer)) fail(op, "ids must be integers");
  auto [sc, bi] = check_packed(op, packed, scales, biases, n, k, group_size, bits, s);
  // Out-of-range ids are clipped, as MLX's take does for an embedding.
  auto idx = mx::contiguous(mx::clip(mx::astype(ids, mx::int32, s), mx::array(0), mx::array(n - 1), s), false, s);
  auto shape = ids.shape();
  shape.push_back(k);
  return mx::array(shape, mx::float32, std::make_shared<QGather>(mx::to_stream(s), group_size, bits),
                   {idx, mx::contiguous(packed, false, s), sc, bi});
}

mx::array rms_norm(const mx::array& x, const mx::array& weight, float eps, mx::StreamOrDevice s) {
  if (weight.ndim() != 1 || (x.ndim() && weight.size() != static_cast<size_t>(x.shape(-1))))
    fail("rms_norm", "weight must be 1-D with the size of x's last axis");
  return row_op("rms_norm", RowKind::kRmsNorm, x, {weight}, s, eps);
}

mx::array silu_mul(const mx::array& gate, const mx::array& up, mx::StreamOrDevice s) {
  if (gate.shape() != up.shape()) fail("silu_mul", "gate and up must have the same shape");
  return row_op("silu_mul", RowKind::kSiluMul, gate, {up}, s);
}

mx::array silu_gate(const mx::array& x, mx::StreamOrDevice s) {
  if (x.ndim() == 0 || x.shape(-1) % 2) fail("silu_gate", "the last axis must hold gate then up, of equal sizes");
  check_float("silu_gate", x);
  auto shape = x.shape();
  shape.back() /= 2;
  auto out = mx::array(shape, mx::float32, std::make_shared<RowOp>(mx::to_stream(s), RowKind::kSiluGate),
                       {as_f32(x, s)});
  return back_to(out, x.dtype(), s);
}

mx::array softmax(const mx::array& x, mx::StreamOrDevice s) { return row_op("softmax", RowKind::kSoftmax, x, {}, s); }
mx::array log_softmax(const mx::array& x, mx::StreamOrDevice s) {
  return row_op("log_softmax", RowKind::kLogSoftmax, x, {}, s);
}
mx::array logsumexp(const mx::array& x, mx::StreamOrDevice s) {
  return row_op("logsumexp", RowKind::kLogSumExp, x, {}, s, 0.0f, /*keep_last=*/false);
}
mx::array exp(const mx::array& x, mx::StreamOrDevice s) { return row_op("exp", RowKind::kExp, x, {}, s); }

mx::array rope(const mx::array& x, int dims, bool traditional, std::optional<float> base, float scale,
               const mx::array& offset, const std::optional<mx::array>& freqs, mx::StreamOrDevice s) {
  const std::string op = "rope";
  check_float(op, x);
  if (x.ndim() < 3) fail(op, "x must have at least 3 dimensions");
  if (dims <= 0 || dims % 2 || dims > x.shape(-1)) fail(op, "dims must be even, positive and at most x's last axis");
  if (base.has_value() == freqs.has_value()) fail(op, "give exactly one of base and freqs");
  if (!mx::issubdtype(offset.dtype(), mx::integer) || offset.ndim() > 1 ||
      (offset.size() != 1 && offset.size() != static_cast<size_t>(x.shape(0))))
    fail(op, "offset must be an integer scalar or one per batch row");
  std::vector<mx::array> inputs{as_f32(x, s), mx::contiguous(mx::astype(mx::reshape(offset, {-1}, s), mx::int32, s), false, s)};
  if (freqs) {
    if (freqs->ndim() != 1 || freqs->size() != static_cast<size_t>(dims / 2)) fail(op, "freqs must have dims / 2 entries");
    inputs.push_back(as_f32(*freqs, s));
  }
  auto out = mx::array(x.shape(), mx::float32,
                       std::make_shared<Rope>(mx::to_stream(s), dims, traditional, base.value_or(0.0f), scale),
                       std::move(inputs));
  return back_to(out, x.dtype(), s);
}

}  // namespace mlxnb
