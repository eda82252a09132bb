// A packed weight as the primitives take it: its layout (bits, scheme ...) and its arrays among a
// primitive's inputs, checked once where the operation is built.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "isa.h"

namespace mlxnb {

// How a packed weight's q become weights (isa.h's QWeight without the pointers).
struct Layout {
  int bits, group_size, scheme, zero;
  int digits;  // of the activations this weight is multiplied with (isa.h's QActs): 1 or 2
  bool operator==(const Layout&) const = default;
};

// Inputs of a packed weight, in order: packed, scales, then biases (kAffine, kKQuant), then sub
// (kKQuant, kQ6K).
inline bool has_biases(int scheme) { return scheme == kAffine || scheme == kKQuant; }
inline bool has_sub(int scheme) { return scheme == kKQuant || scheme == kQ6K; }
inline size_t weight_inputs(int scheme) { return 2 + has_biases(scheme) + has_sub(scheme); }

// The packed weight's arrays (from inputs[first]) as the kernels read them (packing makes them contiguous).
inline QWeight packed_view(const std::vector<mx::array>& in, size_t first, const Layout& l) {
  size_t i = first + 2;
  const void* biases = has_biases(l.scheme) ? in[i++].data<void>() : nullptr;
  const uint8_t* sub = has_sub(l.scheme) ? in[i++].data<uint8_t>() : nullptr;
  return {in[first].data<uint8_t>(), in[first + 1].data<void>(), biases, sub, in[first + 1].dtype() == mx::float16,
          l.bits, l.group_size, l.scheme, l.zero};
}

// Checks a packed weight (see isa.h) for n outputs of k inputs; returns its arrays as the primitives
// take them (packed, scales, then biases and sub where the scheme has them).
inline std::vector<mx::array> check_packed(const std::string& op, const mx::array& packed, const mx::array& scales,
                                    const std::optional<mx::array>& biases, const std::optional<mx::array>& sub,
                                    int64_t n, int64_t k, const Layout& l, mx::StreamOrDevice s) {
  if (l.bits != 4 && l.bits != 5 && l.bits != 6 && l.bits != 8)
    fail(op, "supports 4-, 5-, 6- and 8-bit weights, got " + std::to_string(l.bits));
  if (l.scheme < kAffine || l.scheme > kQ6K) fail(op, "unknown scheme " + std::to_string(l.scheme));
  if (l.digits != 1 && l.digits != 2) fail(op, "digits must be 1 or 2");
  const int64_t tiles = (n + kLanes - 1) / kLanes, unit = l.scheme == kAffine ? l.group_size
                                                        : l.scheme == kSym ? kBlock : 256;
  if (l.scheme == kAffine && (l.group_size < kBlock || l.group_size % kBlock))
    fail(op, "group_size must be a multiple of 32");
  if (k <= 0 || k % unit) fail(op, "the input size must be a positive multiple of " + std::to_string(unit));
  const mx::Shape pshape{static_cast<int>(tiles), static_cast<int>(k / kBlock), block_bytes(l.bits)};
  const mx::Shape sshape{static_cast<int>(tiles), static_cast<int>(k / unit), kLanes};
  if (packed.dtype() != mx::uint8 || packed.shape() != pshape)
    fail(op, "the packed weight must be uint8 [ceil(N / 16), K / 32, 64 * bits]: pack it with mlx_nb.kernels.packing");
  if (scales.shape() != sshape || (biases && biases->shape() != sshape))
    fail(op, "scales and biases must be [ceil(N / 16), K / unit, 16] for this scheme: pack them with mlx_nb.kernels.packing");
  if (has_biases(l.scheme) != biases.has_value()) fail(op, "biases go with the affine and k-quant schemes only");
  if (has_sub(l.scheme) != sub.has_value()) fail(op, "sub goes with the k-quant and Q6_K schemes only");
  if (sub && (sub->itemsize() != 1 || sub->shape() != mx::Shape{pshape[0], pshape[1], 2 * kLanes}))
    fail(op, "sub must be one byte per entry, [ceil(N / 16), K / 32, 32]");
  if (l.scheme != kAffine && (scales.dtype() != mx::float16 || (biases && biases->dtype() != mx::float16)))
    fail(op, "the ggml schemes keep float16 scales");
  auto prep = [&](const mx::array& a) {
    const bool ok = a.dtype() == mx::float32 || a.dtype() == mx::float16;
    return ok ? a : mx::astype(a, mx::float32, s);
  };
  std::vector<mx::array> out{contiguous_weight(packed, s), contiguous_weight(prep(scales), s)};
  if (biases) {
    mx::array bi = prep(*biases);
    if (bi.dtype() != out[1].dtype()) bi = mx::astype(bi, out[1].dtype(), s);
    out.push_back(contiguous_weight(bi, s));
  }
  if (sub) out.push_back(contiguous_weight(*sub, s));
  return out;
}

}  // namespace mlxnb
