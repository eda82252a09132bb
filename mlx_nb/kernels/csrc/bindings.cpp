// The Python module `mlx_nb.kernels._native`: our operations on mlx.core arrays. Import mlx.core
// first (mlx_nb.kernels does): its nanobind domain registers the array type these functions take.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "isa.h"
#include "mlx/version.h"
#include "ops.h"
#include "pool.h"

namespace nb = nanobind;
using namespace nb::literals;

NB_MODULE(_native, m) {
  m.doc() = "mlx-nb's CPU kernels as MLX operations";
  m.def("qmatmul", &mlxnb::qmatmul, "x"_a, "packed"_a, "scales"_a, "biases"_a.none(), nb::kw_only(), "n"_a,
        "group_size"_a, "bits"_a, "scheme"_a = 0, "zero"_a = 0, "sub"_a = nb::none(), "digits"_a = 1,
        "norm_weight"_a = nb::none(),
        "eps"_a = 0.0f, "residual"_a = nb::none(), "gate"_a = false, "bias"_a = nb::none(), "stream"_a = nb::none(),
        "x @ W.T for a packed 4/5/6/8-bit weight, int8 activation blocks; optionally RMSNorm(x) or a SiLU "
        "gate of x's halves first, then a bias and a residual added.");
  m.def("qgather", &mlxnb::qgather, "ids"_a, "packed"_a, "scales"_a, "biases"_a.none(), nb::kw_only(), "n"_a, "k"_a,
        "group_size"_a, "bits"_a, "scheme"_a = 0, "zero"_a = 0, "sub"_a = nb::none(), "stream"_a = nb::none(),
        "Rows of a packed weight, dequantized.");
  m.def("qmatmul_experts", &mlxnb::qmatmul_experts, "x"_a, "experts"_a, "packed"_a, "scales"_a, "biases"_a.none(),
        nb::kw_only(), "n"_a, "num_experts"_a, "group_size"_a, "bits"_a, "scheme"_a = 0, "zero"_a = 0,
        "sub"_a = nb::none(), "digits"_a = 1, "stream"_a = nb::none(),
        "x [rows, K] through each row's expert's packed weight (experts stacked along the tiles).");
  m.def("pack_ggml", &mlxnb::pack_ggml, "raw"_a, "type"_a, "k"_a, nb::kw_only(), "stream"_a = nb::none(),
        "GGUF blocks [rows, bytes] of a ggml type -> [packed, scales, biases, sub] for qmatmul.");
  m.def("ggml_format", &mlxnb::ggml_format, "type"_a,
        "(weights a block, bytes a block, bits, scheme, zero) of a ggml type, or () without a kernel.");
  m.def("rms_norm", &mlxnb::rms_norm, "x"_a, "weight"_a, "eps"_a, nb::kw_only(), "stream"_a = nb::none());
  m.def("rope", &mlxnb::rope, "x"_a, "dims"_a, nb::kw_only(), "traditional"_a, "base"_a.none(), "scale"_a,
        "offset"_a, "freqs"_a = nb::none(), "stream"_a = nb::none(), "mx.fast.rope's contract.");
  m.def("qkv_rope", &mlxnb::qkv_rope, "parts"_a, nb::kw_only(), "heads"_a, "kv_heads"_a, "head_dim"_a, "dims"_a,
        "traditional"_a, "base"_a.none(), "scale"_a, "offset"_a, "freqs"_a = nb::none(), "k_cache"_a = nb::none(),
        "v_cache"_a = nb::none(), "write_at"_a = 0, "stream"_a = nb::none(),
        "Split a fused q/k/v projection (a list of its parts side by side) into heads, RoPE on q and k; with "
        "caches, k and v are the caches with the new keys and values written at write_at.");
  m.def("qkv_rope_cache_copies", &mlxnb::qkv_rope_cache_copies,
        "How many caches qkv_rope copied whole (their buffers could not be donated).");
  m.def("quantized_attention", &mlxnb::quantized_attention, "q"_a, "kw"_a, "ks"_a, "kb"_a, "vw"_a, "vs"_a, "vb"_a,
        nb::kw_only(), "scale"_a, "bits"_a, "group_size"_a, "causal"_a = false, "mask"_a = nb::none(),
        "stream"_a = nb::none(),
        "Scaled dot-product attention over MLX-quantized keys and values; returns [B, L, H * D].");
  m.def("attention", &mlxnb::attention, "q"_a, "k"_a, "v"_a, nb::kw_only(), "scale"_a, "causal"_a = false,
        "mask"_a = nb::none(), "kv_len"_a = -1, "stream"_a = nb::none(),
        "Scaled dot-product attention over the first kv_len keys (all by default); returns [B, L, H * D].");
  m.def("silu_mul", &mlxnb::silu_mul, "gate"_a, "up"_a, nb::kw_only(), "stream"_a = nb::none(), "silu(gate) * up");
  m.def("silu_gate", &mlxnb::silu_gate, "x"_a, nb::kw_only(), "stream"_a = nb::none(),
        "silu(x[..., :H]) * x[..., H:], a fused gate-and-up projection's activation");
  m.def("softmax", &mlxnb::softmax, "x"_a, nb::kw_only(), "stream"_a = nb::none());
  m.def("log_softmax", &mlxnb::log_softmax, "x"_a, nb::kw_only(), "stream"_a = nb::none());
  m.def("gelu", &mlxnb::gelu, "x"_a, nb::kw_only(), "stream"_a = nb::none());
  m.def("logsumexp", &mlxnb::logsumexp, "x"_a, nb::kw_only(), "stream"_a = nb::none());
  m.def("exp", &mlxnb::exp, "x"_a, nb::kw_only(), "stream"_a = nb::none());
  m.def("sample", &mlxnb::sample, "logits"_a, nb::kw_only(), "temperature"_a, "top_p"_a, "top_k"_a, "min_p"_a,
        "uniform"_a, "stream"_a = nb::none(), "A token per row: mlx_lm's sampler semantics, per-row settings.");
  m.def("isa", [] { return std::string(mlxnb::isa().name); }, "The kernel table in use.");
  m.def("isa_list", [] { return std::string(mlxnb::isa_list()); }, "Tables this CPU can run, best first.");
  m.def("set_isa", [](const std::string& name) { return mlxnb::set_isa(name.c_str()); }, "name"_a);
  m.def("threads", [] { return mlxnb::Pool::instance().threads(); });
  m.attr("mlx_version") = std::to_string(MLX_VERSION_MAJOR) + "." + std::to_string(MLX_VERSION_MINOR) + "." +
                          std::to_string(MLX_VERSION_PATCH);
}
