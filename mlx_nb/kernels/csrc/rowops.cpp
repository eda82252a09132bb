// Row-wise float kernels as MLX primitives: RMSNorm, the SiLU gates, the softmax family, exp, GELU.
#include "common.h"
#include "isa.h"
#include "ops.h"

namespace mlxnb {
namespace {

enum class RowKind { kRmsNorm, kSiluMul, kSiluGate, kSoftmax, kLogSoftmax, kLogSumExp, kExp, kGelu };

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
      case RowKind::kGelu: return "MlxNbGelu";
      default: return "MlxNbExp";
    }
  }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const RowOp&>(other);
    return o.kind_ == kind_ && o.eps_ == eps_;
  }
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& out = outs[0];
    alloc(out);
    const int64_t n = in[0].ndim() ? in[0].shape(-1) : 1, rows = n ? in[0].size() / n : 0;
    auto& enc = mx::cpu::get_command_encoder(stream());
    std::optional<mx::array> second;
    if (in.size() > 1) second = in[1];
    enc.dispatch([kind = kind_, eps = eps_, xa = in[0], second, o = out.data<float>(), rows, n]() {
      thread_local std::vector<float> xbuf, bbuf;
      const float* x = row_major(xa, xbuf);
      const float* b = second ? row_major(*second, bbuf) : nullptr;
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
            case RowKind::kGelu: k.gelu(xr, o + r * n, n); break;
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
                 mx::StreamOrDevice s, float eps = 0.0f, int last = -1) {
  check_float(op, x);
  if (x.ndim() == 0) fail(op, "expects an array with at least one dimension");
  std::vector<mx::array> inputs{as_f32(x, s)};
  for (auto& e : extra) inputs.push_back(as_f32(e, s));
  auto shape = x.shape();
  if (last >= 0) shape.back() = last;
  auto out = mx::array(shape, mx::float32, std::make_shared<RowOp>(mx::to_stream(s), kind, eps), std::move(inputs));
  return back_to(out, x.dtype(), s);
}

}  // namespace

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
  return row_op("silu_gate", RowKind::kSiluGate, x, {}, s, 0.0f, x.shape(-1) / 2);
}

mx::array softmax(const mx::array& x, mx::StreamOrDevice s) { return row_op("softmax", RowKind::kSoftmax, x, {}, s); }
mx::array log_softmax(const mx::array& x, mx::StreamOrDevice s) {
  return row_op("log_softmax", RowKind::kLogSoftmax, x, {}, s);
}
mx::array logsumexp(const mx::array& x, mx::StreamOrDevice s) {
  return row_op("logsumexp", RowKind::kLogSumExp, x, {}, s, 0.0f, 1);
}
mx::array exp(const mx::array& x, mx::StreamOrDevice s) { return row_op("exp", RowKind::kExp, x, {}, s); }
mx::array gelu(const mx::array& x, mx::StreamOrDevice s) { return row_op("gelu", RowKind::kGelu, x, {}, s); }

}  // namespace mlxnb
