// The packed quantized matmul and the quantized embedding lookup as MLX primitives.
#include <sstream>

#include "common.h"
#include "isa.h"
#include "ops.h"
#include "packed.h"

namespace mlxnb {
namespace {

struct Scratch {
  std::vector<int8_t> q;
  std::vector<float> d, sum, half, x, normed, norm_w, bias, res;
};

// Optional work fused into a matmul: an RMSNorm of x first (the layer's input norm), then a bias
// (qwen2's q/k/v) and a residual (the layer's skip connection) added to the result, in that order;
// each computed as its own op would. Each is an op fewer in a decode step's graph.
struct Fused {
  std::optional<mx::array> norm_weight, bias, residual;
  float eps = 0.0f;
  bool gate = false;  // x holds [gate, up] halves: the matmul reads silu(gate) * up (a SwiGLU's down)
};

void run_qmatmul(const mx::array& xa, const QWeight& w, int digits, int64_t M, int64_t N, int64_t K, float* out,
                 const Fused& f) {
  thread_local Scratch scratch;
  Scratch& sc = scratch;  // the caller's: a lambda body naming a thread_local would get the worker's
  const float* x = row_major(xa, sc.x);
  const int64_t nb = K / kBlock, xk = f.gate ? 2 * K : K;  // x's row length
  sc.q.resize(M * K * digits);
  sc.d.resize(M * nb);
  sc.sum.resize(M * nb);
  sc.half.resize(M * nb * 2);
  const Isa& k = isa();
  const float* nw = f.norm_weight ? row_major(*f.norm_weight, sc.norm_w) : nullptr;
  if (nw || f.gate) sc.normed.resize(M * K);
  for_rows(M, K, [&](int64_t r0, int64_t r1) {
    const float* src = x + r0 * K;
    if (nw) {
      for (int64_t r = r0; r < r1; ++r) k.rms_norm(x + r * K, nw, sc.normed.data() + r * K, K, f.eps);
      src = sc.normed.data() + r0 * K;
    } else if (f.gate) {
      for (int64_t r = r0; r < r1; ++r) k.silu_mul(x + r * xk, x + r * xk + K, sc.normed.data() + r * K, K);
      src = sc.normed.data() + r0 * K;
    }
    k.quantize_rows(src, r1 - r0, K, digits, sc.q.data() + r0 * K * digits, sc.d.data() + r0 * nb,
                    sc.sum.data() + r0 * nb, sc.half.data() + r0 * nb * 2);
  });
  const QGemm g{{sc.q.data(), sc.d.data(), sc.sum.data(), sc.half.data(), digits}, w, M, N, K, out};
  const int64_t tiles = (N + kLanes - 1) / kLanes;
  auto& pool = Pool::instance();
  if (pool.threads() == 1 || M * N * K < (1 << 17)) {
    k.qgemm(g, 0, tiles);
  } else {
    // A few tiles of 16 outputs a task; each output is computed whole by one thread.
    const int64_t per = std::max<int64_t>(1, tiles / (pool.threads() * 4));
    pool.parallel_for((tiles + per - 1) / per, [&](int64_t t) { k.qgemm(g, t * per, std::min(tiles, (t + 1) * per)); });
  }
  if (f.bias) {
    const float* bias = row_major(*f.bias, sc.bias);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < N; ++j) out[r * N + j] = out[r * N + j] + bias[j];
  }
  if (f.residual) {
    const float* res = row_major(*f.residual, sc.res);
    for (int64_t i = 0; i < M * N; ++i) out[i] = out[i] + res[i];
  }
}

class QMatmul : public CpuOnly {
 public:
  QMatmul(mx::Stream s, int64_t n, Layout layout, bool norm, float eps, bool bias, bool residual, bool gate)
      : CpuOnly(s), n_(n), layout_(layout), norm_(norm), eps_(eps), bias_(bias), residual_(residual), gate_(gate) {}
  const char* name() const override { return "MlxNbQMatmul"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const QMatmul&>(other);
    return o.n_ == n_ && o.layout_ == layout_ && o.norm_ == norm_ && o.eps_ == eps_ && o.bias_ == bias_ &&
           o.residual_ == residual_ && o.gate_ == gate_;
  }
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& out = outs[0];
    alloc(out);
    const int64_t K = in[0].shape(-1) / (gate_ ? 2 : 1), M = K ? in[0].size() / (gate_ ? 2 * K : K) : 0;
    Fused f;
    f.gate = gate_;
    size_t next = 1 + weight_inputs(layout_.scheme);
    if (norm_) f.norm_weight = in[next++], f.eps = eps_;
    if (bias_) f.bias = in[next++];
    if (residual_) f.residual = in[next++];
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([x = in[0], w = packed_view(in, 1, layout_), digits = layout_.digits, M, N = n_, K,
                  o = out.data<float>(), f]() {
      run_qmatmul(x, w, digits, M, N, K, o, f);
    });
  }

 private:
  int64_t n_;
  Layout layout_;
  bool norm_;
  float eps_;
  bool bias_, residual_, gate_;
};

// Rows of a packed weight, dequantized: the lookup of a quantized embedding.
class QGather : public CpuOnly {
 public:
  QGather(mx::Stream s, Layout layout) : CpuOnly(s), layout_(layout) {}
  const char* name() const override { return "MlxNbQGather"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return static_cast<const QGather&>(other).layout_ == layout_;
  }
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& out = outs[0];
    alloc(out);
    const int64_t K = out.shape(-1), nb = K / kBlock;
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([ids_a = in[0], w = packed_view(in, 1, layout_), K, nb, o = out.data<float>()]() {
      thread_local std::vector<int32_t> buf;
      const int32_t* ids = row_major(ids_a, buf);
      const int64_t bb = block_bytes(w.bits);
      for (size_t r = 0; r < ids_a.size(); ++r) {
        const int64_t t = ids[r] / kLanes, lane = ids[r] % kLanes;
        for (int64_t b = 0; b < nb; ++b) {
          const uint8_t* blk = w.q + (t * nb + b) * bb;
          const BlockScale s = block_scale(w, K, t, b, static_cast<int>(lane));
          for (int k = 0; k < kBlock; ++k) {
            const float q = static_cast<float>(packed_q(blk, w.bits, static_cast<int>(lane), k));
            o[r * K + b * kBlock + k] = k < 16 ? s.s0 * q + s.b0 : s.s1 * q + s.b1;
          }
        }
      }
    });
  }

 private:
  Layout layout_;
};

}  // namespace

mx::array qmatmul(const mx::array& x, const mx::array& packed, const mx::array& scales,
                  const std::optional<mx::array>& biases, int n, int group_size, int bits, int scheme, int zero,
                  const std::optional<mx::array>& sub, int digits, const std::optional<mx::array>& norm_weight,
                  float eps, const std::optional<mx::array>& residual, bool gate,
                  const std::optional<mx::array>& bias, mx::StreamOrDevice s) {
  const std::string op = "qmatmul";
  check_float(op, x);
  if (x.ndim() < 1) fail(op, "x must have at least one dimension");
  if (gate && (x.shape(-1) % 2 || norm_weight)) fail(op, "gate takes x as [gate, up] halves, without a norm");
  const int64_t K = x.shape(-1) / (gate ? 2 : 1);
  const Layout layout{bits, group_size, scheme, zero, digits};
  auto weight = check_packed(op, packed, scales, biases, sub, n, K, layout, s);
  auto shape = x.shape();
  shape.back() = n;
  std::vector<mx::array> inputs{as_f32(x, s)};
  inputs.insert(inputs.end(), weight.begin(), weight.end());
  if (norm_weight) {
    if (norm_weight->ndim() != 1 || norm_weight->shape(0) != K) fail(op, "norm_weight must be [K]");
    inputs.push_back(as_f32(*norm_weight, s));
  }
  if (bias) {
    if (bias->ndim() != 1 || bias->shape(0) != n) fail(op, "bias must be [n]");
    check_float(op, *bias);
    inputs.push_back(as_f32(*bias, s));
  }
  if (residual) {
    if (residual->shape() != shape) fail(op, "residual must have the output's shape");
    inputs.push_back(as_f32(*residual, s));
  }
  auto out = mx::array(shape, mx::float32,
                       std::make_shared<QMatmul>(mx::to_stream(s), n, layout, norm_weight.has_value(), eps,
                                                 bias.has_value(), residual.has_value(), gate),
                       std::move(inputs));
  return back_to(out, x.dtype(), s);
}

mx::array qgather(const mx::array& ids, const mx::array& packed, const mx::array& scales,
                  const std::optional<mx::array>& biases, int n, int k, int group_size, int bits, int scheme,
                  int zero, const std::optional<mx::array>& sub, mx::StreamOrDevice s) {
  const std::string op = "qgather";
  if (!mx::issubdtype(ids.dtype(), mx::integer)) fail(op, "ids must be integers");
  const Layout layout{bits, group_size, scheme, zero, 1};
  auto weight = check_packed(op, packed, scales, biases, sub, n, k, layout, s);
  // Out-of-range ids are clipped, as MLX's take does for an embedding.
  auto idx = mx::clip(mx::astype(ids, mx::int32, s), mx::array(0), mx::array(n - 1), s);
  auto shape = ids.shape();
  shape.push_back(k);
  std::vector<mx::array> inputs{idx};
  inputs.insert(inputs.end(), weight.begin(), weight.end());
  return mx::array(shape, mx::float32, std::make_shared<QGather>(mx::to_stream(s), layout), std::move(inputs));
}

}  // namespace mlxnb
