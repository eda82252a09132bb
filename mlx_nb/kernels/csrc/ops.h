// MLX operations backed by our CPU kernels. Each builds an array whose primitive runs the kernel on
// the CPU stream; inputs are taken as float32 (the CPU compute type) and outputs cast back.
#pragma once

#include <optional>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace mlxnb {

// x @ W.T for an affine-quantized weight W of n outputs in the kernels' packed layout (isa.h;
// mlx_nb.kernels.packing makes it from MLX's), activations quantized to int8 in blocks of 32.
mx::array qmatmul(const mx::array& x, const mx::array& packed, const mx::array& scales, const mx::array& biases,
                  int n, int group_size, int bits, mx::StreamOrDevice s = {});
// Rows `ids` of such a weight (n rows of k), dequantized to float32: a quantized embedding's lookup.
mx::array qgather(const mx::array& ids, const mx::array& packed, const mx::array& scales, const mx::array& biases,
                  int n, int k, int group_size, int bits, mx::StreamOrDevice s = {});
mx::array rms_norm(const mx::array& x, const mx::array& weight, float eps, mx::StreamOrDevice s = {});
// mx.fast.rope's contract: x [B, ..., L, D], offset a scalar or one per batch row.
mx::array rope(const mx::array& x, int dims, bool traditional, std::optional<float> base, float scale,
               const mx::array& offset, const std::optional<mx::array>& freqs, mx::StreamOrDevice s = {});
mx::array silu_mul(const mx::array& gate, const mx::array& up, mx::StreamOrDevice s = {});
// silu(x[..., :H]) * x[..., H:] for x [..., 2H]: the output of a fused gate-and-up projection.
mx::array silu_gate(const mx::array& x, mx::StreamOrDevice s = {});
// Along the last axis.
mx::array softmax(const mx::array& x, mx::StreamOrDevice s = {});
mx::array log_softmax(const mx::array& x, mx::StreamOrDevice s = {});
mx::array logsumexp(const mx::array& x, mx::StreamOrDevice s = {});  // keeps the last axis as 1
mx::array exp(const mx::array& x, mx::StreamOrDevice s = {});

}  // namespace mlxnb
