// MLX operations backed by our CPU kernels. Each builds an array whose primitive runs the kernel on
// the CPU stream; inputs are taken as float32 (the CPU compute type) and outputs cast back.
#pragma once

#include <optional>

#include "mlx/ops.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace mlxnb {

// x @ W.T for a quantized weight W of n outputs in the kernels' packed layout (isa.h: bits 4/5/6/8,
// `scheme` kAffine / kSym / kKQuant / kQ6K with its `biases`, `sub` and `zero`; mlx_nb.kernels.packing
// makes it from MLX's affine weights, pack_ggml from GGUF's blocks), activations quantized to int8
// in blocks of 32. With norm_weight, x is RMS-normalized first (eps); with gate, x holds [gate, up]
// halves and the matmul reads silu(gate) * up; then bias ([n]) and residual are added. `digits`:
// the activations' int8 digits (isa.h's QActs), 1 as llama.cpp, or 2 for ~15 bits.
mx::array qmatmul(const mx::array& x, const mx::array& packed, const mx::array& scales,
                  const std::optional<mx::array>& biases, int n, int group_size, int bits, int scheme = 0,
                  int zero = 0, const std::optional<mx::array>& sub = std::nullopt, int digits = 1,
                  const std::optional<mx::array>& norm_weight = std::nullopt, float eps = 0.0f,
                  const std::optional<mx::array>& residual = std::nullopt, bool gate = false,
                  const std::optional<mx::array>& bias = std::nullopt, mx::StreamOrDevice s = {});
// Rows `ids` of such a weight (n rows of k), dequantized to float32: a quantized embedding's lookup.
mx::array qgather(const mx::array& ids, const mx::array& packed, const mx::array& scales,
                  const std::optional<mx::array>& biases, int n, int k, int group_size, int bits, int scheme = 0,
                  int zero = 0, const std::optional<mx::array>& sub = std::nullopt, mx::StreamOrDevice s = {});
// x [rows, K] through the packed weight of the expert each row chose (experts [rows]); the weights
// of `num_experts` experts of n outputs each stacked along the tiles. Each chosen expert is read once.
mx::array qmatmul_experts(const mx::array& x, const mx::array& experts, const mx::array& packed,
                          const mx::array& scales, const std::optional<mx::array>& biases, int n, int num_experts,
                          int group_size, int bits, int scheme = 0, int zero = 0,
                          const std::optional<mx::array>& sub = std::nullopt, int digits = 1,
                          mx::StreamOrDevice s = {});
// GGUF blocks of ggml type `type` (raw uint8 [rows, bytes per row], k weights a row) in the packed
// layout: [packed, scales, biases, sub] (biases and sub one element where the type's scheme has none).
std::vector<mx::array> pack_ggml(const mx::array& raw, int type, int k, mx::StreamOrDevice s = {});
// {weights a block, bytes a block, bits, scheme, zero} of ggml type `type`, or {} if it has no kernel.
std::vector<int> ggml_format(int type);
mx::array rms_norm(const mx::array& x, const mx::array& weight, float eps, mx::StreamOrDevice s = {});
// mx.fast.rope's contract: x [B, ..., L, D], offset a scalar or one per batch row.
mx::array rope(const mx::array& x, int dims, bool traditional, std::optional<float> base, float scale,
               const mx::array& offset, const std::optional<mx::array>& freqs, mx::StreamOrDevice s = {});
// Splits a fused projection [B, L, (heads + 2 kv_heads) * head_dim], given whole or as parts side by
// side (each a multiple of head_dim wide), into q [B, heads, L, head_dim], k and v [B, kv_heads, L,
// head_dim], with RoPE (mx.fast.rope's arguments) applied to q and k. With k_cache and v_cache
// (float32 [B, kv_heads, S, head_dim]), k and v are those caches with the new keys and values
// written at columns [write_at, write_at + L), in place when MLX may donate their buffers.
std::vector<mx::array> qkv_rope(const std::vector<mx::array>& parts, int heads, int kv_heads, int head_dim, int dims,
                                bool traditional, std::optional<float> base, float scale, const mx::array& offset,
                                const std::optional<mx::array>& freqs,
                                const std::optional<mx::array>& k_cache = std::nullopt,
                                const std::optional<mx::array>& v_cache = std::nullopt, int write_at = 0,
                                mx::StreamOrDevice s = {});
// How many caches qkv_rope has copied whole because MLX could not donate their buffers (another
// array still held them): a decode step should add none.
int64_t qkv_rope_cache_copies();
// Attention over MLX-quantized keys and values (words, scales, biases); returns [B, L, H * D].
mx::array quantized_attention(const mx::array& q, const mx::array& kw, const mx::array& ks, const mx::array& kb,
                              const mx::array& vw, const mx::array& vs, const mx::array& vb, float scale, int bits,
                              int group_size, bool causal, const std::optional<mx::array>& mask,
                              mx::StreamOrDevice s = {});
// softmax(q k^T * scale + mask) v for q [B, H, L, D], k and v [B, Hk, S, D] (Hk dividing H); mask a
// boolean (true keeps) or additive array broadcasting to [B, H, L, S], or causal (queries aligned to
// the last keys). With kv_len, only the first kv_len keys and values are read (a cache's filled part).
// Returns [B, L, H * D].
mx::array attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale, bool causal,
                    const std::optional<mx::array>& mask, int kv_len = -1, mx::StreamOrDevice s = {});
mx::array silu_mul(const mx::array& gate, const mx::array& up, mx::StreamOrDevice s = {});
// silu(x[..., :H]) * x[..., H:] for x [..., 2H]: the output of a fused gate-and-up projection.
mx::array silu_gate(const mx::array& x, mx::StreamOrDevice s = {});
// Along the last axis.
mx::array softmax(const mx::array& x, mx::StreamOrDevice s = {});
mx::array log_softmax(const mx::array& x, mx::StreamOrDevice s = {});
// gelu(x) = x/2 (1 + erf(x/sqrt 2)), the exact GELU of BERT-style encoders
mx::array gelu(const mx::array& x, mx::StreamOrDevice s = {});
mx::array logsumexp(const mx::array& x, mx::StreamOrDevice s = {});  // keeps the last axis as 1
mx::array exp(const mx::array& x, mx::StreamOrDevice s = {});
// One token per row of logits [B, V] with mlx_lm's make_sampler semantics and per-row settings
// (temperature 0 is argmax), drawn by inverse CDF from `uniform` (one number in [0, 1) per row).
mx::array sample(const mx::array& logits, const mx::array& temperature, const mx::array& top_p, const mx::array& top_k,
                 const mx::array& min_p, const mx::array& uniform, mx::StreamOrDevice s = {});

}  // namespace mlxnb
