// GGUF's quantized blocks (ggml's Q4_0 ... Q6_K) repacked into the kernels' layout (isa.h) at load.
// Each block type keeps its own bits and scales: nothing is re-quantized or widened, so the packed
// weight is the file's weight exactly. One MLX primitive with four outputs (packed, scales, biases,
// sub; the ones a scheme has no use for are one element), rows split over the pool by tiles.
#include <cstring>

#include "common.h"
#include "isa.h"
#include "ops.h"

namespace mlxnb {
namespace {

// ggml's type ids (ggml.h's enum ggml_type) and what each becomes here.
struct Format {
  int type;
  const char* name;
  int block_weights, block_bytes, bits, scheme, zero;
};

constexpr Format kFormats[] = {
    {2, "Q4_0", 32, 18, 4, kSym, 8},     {3, "Q4_1", 32, 20, 4, kAffine, 0},  {6, "Q5_0", 32, 22, 5, kSym, 16},
    {7, "Q5_1", 32, 24, 5, kAffine, 0},  {8, "Q8_0", 32, 34, 8, kSym, 128},   {12, "Q4_K", 256, 144, 4, kKQuant, 0},
    {13, "Q5_K", 256, 176, 5, kKQuant, 0}, {14, "Q6_K", 256, 210, 6, kQ6K, 0},
};

const Format* find_format(int type) {
  for (const Format& f : kFormats)
    if (f.type == type) return &f;
  return nullptr;
}

inline uint16_t u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Writes q (< 2^bits) of output o at input k of a packed block (the inverse of isa.h's packed_q).
inline void put_q(uint8_t* blk, int bits, int o, int k, int q) {
  if (bits == 8) {
    blk[(k / 4) * 64 + o * 4 + k % 4] = static_cast<uint8_t>(q);
    return;
  }
  const int h = k / 16, kk = k % 16, j = k / 4;
  blk[(kk / 4) * 64 + o * 4 + kk % 4] |= static_cast<uint8_t>((q & 0x0F) << (4 * h));
  if (bits == 5) blk[256 + o * 4 + k % 4] |= static_cast<uint8_t>(((q >> 4) & 1) << j);
  if (bits == 6) blk[256 + (j / 4) * 64 + o * 4 + k % 4] |= static_cast<uint8_t>(((q >> 4) & 3) << (2 * (j % 4)));
}

// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j (< 8) of a Q4_K / Q5_K block.
inline void scale_min_k4(int j, const uint8_t* s, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

struct Out {
  uint8_t* packed;
  uint16_t* scales;
  uint16_t* biases;
  uint8_t* sub;
};

// Output row n (lane o of tile t) from its raw blocks.
void pack_row(const Format& f, const uint8_t* raw, int64_t K, int64_t t, int o, const Out& out) {
  const int64_t nb = K / kBlock, bb = block_bytes(f.bits);
  uint8_t* tile_q = out.packed + t * nb * bb;
  int q[256];
  for (int64_t sb = 0; sb < K / f.block_weights; ++sb) {
    const uint8_t* x = raw + sb * f.block_bytes;
    const int64_t b0 = sb * f.block_weights / kBlock;  // first 32-input block of this raw block
    switch (f.type) {
      case 2:  // Q4_0: d, 16 bytes of nibbles (inputs i and i + 16)
      case 3:  // Q4_1: d, m, nibbles
      case 6:  // Q5_0: d, 32 high bits, nibbles
      case 7: {  // Q5_1: d, m, 32 high bits, nibbles
        const bool has_min = f.type == 3 || f.type == 7, five = f.bits == 5;
        const uint8_t* qs = x + (has_min ? 4 : 2) + (five ? 4 : 0);
        uint32_t qh = 0;
        if (five) std::memcpy(&qh, x + (has_min ? 4 : 2), 4);
        for (int i = 0; i < 16; ++i) {
          q[i] = (qs[i] & 0x0F) | (five ? ((qh >> i) & 1) << 4 : 0);
          q[i + 16] = (qs[i] >> 4) | (five ? ((qh >> (i + 16)) & 1) << 4 : 0);
        }
        out.scales[(t * nb + b0) * kLanes + o] = u16(x);
        if (has_min) out.biases[(t * nb + b0) * kLanes + o] = u16(x + 2);
        break;
      }
      case 8:  // Q8_0: d, 32 int8
        for (int i = 0; i < 32; ++i) q[i] = static_cast<int>(static_cast<int8_t>(x[2 + i])) + 128;
        out.scales[(t * nb + b0) * kLanes + o] = u16(x);
        break;
      case 12:    // Q4_K: d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
      case 13: {  // Q5_K: the same, then 32 bytes of high bits before the nibbles
        const bool five = f.type == 13;
        const uint8_t* scales = x + 4;
        const uint8_t* qh = x + 16;
        const uint8_t* ql = x + (five ? 48 : 16);
        for (int c = 0; c < 4; ++c) {  // 64 weights: sub-blocks 2c (low nibbles) and 2c + 1 (high)
          for (int l = 0; l < 32; ++l) {
            q[64 * c + l] = (ql[32 * c + l] & 0x0F) | (five ? ((qh[l] >> (2 * c)) & 1) << 4 : 0);
            q[64 * c + 32 + l] = (ql[32 * c + l] >> 4) | (five ? ((qh[l] >> (2 * c + 1)) & 1) << 4 : 0);
          }
        }
        const int64_t si = (t * (K / 256) + sb) * kLanes + o;
        out.scales[si] = u16(x);
        out.biases[si] = u16(x + 2);
        for (int j = 0; j < 8; ++j) {
          int sc, m;
          scale_min_k4(j, scales, sc, m);
          uint8_t* s = out.sub + (t * nb + b0 + j) * 2 * kLanes;
          s[o] = static_cast<uint8_t>(sc);
          s[kLanes + o] = static_cast<uint8_t>(m);
        }
        break;
      }
      case 14: {  // Q6_K: 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales, d
        const uint8_t* ql = x;
        const uint8_t* qh = x + 128;
        const uint8_t* scales = x + 192;
        for (int n = 0; n < 2; ++n) {
          for (int l = 0; l < 32; ++l) {
            const uint8_t a = ql[64 * n + l], c = ql[64 * n + l + 32], h = qh[32 * n + l];
            q[128 * n + l] = (a & 0x0F) | ((h >> 0) & 3) << 4;
            q[128 * n + l + 32] = (c & 0x0F) | ((h >> 2) & 3) << 4;
            q[128 * n + l + 64] = (a >> 4) | ((h >> 4) & 3) << 4;
            q[128 * n + l + 96] = (c >> 4) | ((h >> 6) & 3) << 4;
          }
        }
        out.scales[(t * (K / 256) + sb) * kLanes + o] = u16(x + 208);
        for (int j = 0; j < 16; ++j)  // sub-block j of 16 weights: half j % 2 of block j / 2
          out.sub[(t * nb + b0 + j / 2) * 2 * kLanes + (j % 2) * kLanes + o] = scales[j];
        break;
      }
      default:
        break;
    }
    for (int k = 0; k < f.block_weights; ++k) {
      const int64_t b = b0 + k / kBlock;
      put_q(tile_q + b * bb, f.bits, o, k % kBlock, q[k]);
    }
  }
}

class PackGGML : public CpuOnly {
 public:
  PackGGML(mx::Stream s, int type, int64_t k) : CpuOnly(s), type_(type), k_(k) {}
  const char* name() const override { return "MlxNbPackGGML"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const PackGGML&>(other);
    return o.type_ == type_ && o.k_ == k_;
  }
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    for (auto& o : outs) {
      alloc(o);
      std::memset(o.data<void>(), 0, o.nbytes());  // padding outputs stay zero
    }
    const Format& f = *find_format(type_);
    const int64_t N = in[0].shape(0), row = in[0].shape(1), K = k_;
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([raw_a = in[0], f, N, row, K, out = Out{outs[0].data<uint8_t>(), outs[1].data<uint16_t>(),
                                                         outs[2].data<uint16_t>(), outs[3].data<uint8_t>()}]() {
      const uint8_t* raw = raw_a.data<uint8_t>();
      const int64_t tiles = (N + kLanes - 1) / kLanes;
      for_rows(tiles, K * kLanes, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
          for (int o = 0; o < kLanes && t * kLanes + o < N; ++o) pack_row(f, raw + (t * kLanes + o) * row, K, t, o, out);
      });
    });
  }

 private:
  int type_;
  int64_t k_;
};

}  // namespace

std::vector<mx::array> pack_ggml(const mx::array& raw, int type, int k, mx::StreamOrDevice s) {
  const std::string op = "pack_ggml";
  const Format* f = find_format(type);
  if (!f) fail(op, "ggml type " + std::to_string(type) + " has no kernel: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K do");
  if (raw.dtype() != mx::uint8 || raw.ndim() != 2) fail(op, "raw must be uint8 [rows, bytes per row]");
  if (k <= 0 || k % f->block_weights)
    fail(op, std::string(f->name) + " rows must be a positive multiple of " + std::to_string(f->block_weights));
  if (raw.shape(1) != static_cast<int64_t>(k) / f->block_weights * f->block_bytes)
    fail(op, "raw rows hold " + std::to_string(raw.shape(1)) + " bytes, not the " +
                 std::to_string(k / f->block_weights * f->block_bytes) + " of " + std::to_string(k) + " " + f->name +
                 " weights");
  const int tiles = (raw.shape(0) + kLanes - 1) / kLanes, nb = k / kBlock;
  const bool super = f->block_weights == 256;
  const mx::Shape packed{tiles, nb, block_bytes(f->bits)};
  const mx::Shape scales{tiles, super ? k / 256 : nb, kLanes};
  const bool has_bias = f->scheme == kAffine || f->scheme == kKQuant, has_sub = super;
  const mx::Shape biases = has_bias ? scales : mx::Shape{1};
  const mx::Shape sub = has_sub ? mx::Shape{tiles, nb, 2 * kLanes} : mx::Shape{1};
  return mx::array::make_arrays({packed, scales, biases, sub}, {mx::uint8, mx::float16, mx::float16, mx::uint8},
                                std::make_shared<PackGGML>(mx::to_stream(s), type, k),
                                {contiguous_weight(raw, s)});
}

std::vector<int> ggml_format(int type) {
  const Format* f = find_format(type);
  if (!f) return {};
  return {f->block_weights, f->block_bytes, f->bits, f->scheme, f->zero};
}

}  // namespace mlxnb
