// The per-instruction-set kernel table. Each kernels_<isa>.cpp fills one `Isa` with the same
// functions; dispatch.cpp picks the best the CPU runs. Every function computes a row from that row's
// data alone, in a fixed order, so a row's result never depends on how many rows are computed with it.
#pragma once

#include <cstdint>

// For a kernel's per-block helpers: GCC otherwise keeps the 5- and 6-bit unpacking out of line, and
// a block's eight unpacked registers then go through the stack on every call.
#define MLXNB_ALWAYS_INLINE inline __attribute__((always_inline))

namespace mlxnb {

constexpr int kBlock = 32;  // activation block: one int8 scale per 32 values (GGUF's Q8 block)
constexpr int kLanes = 16;  // outputs interleaved in a packed weight (one 512-bit vector of int32 sums)

// Activations of one matmul, quantized row by row in blocks of 32 (see quantize_rows) to one or two
// int8 digits, as the weight's `digits` asks:
//   1: x ~ d * hi, hi = round(x * 127 / amax): llama.cpp's Q8 blocks, what it computes with;
//   2: x ~ d * (254 * hi + lo), lo = round((x * 127 / amax - hi) * 254): ~15 bits of x, for small
//      models, whose greedy choices one digit flips (SmolLM2-135M stops answering "Paris", as it
//      does under llama.cpp), at twice the dot products.
constexpr int kFine = 254;

struct QActs {
  const int8_t* q;   // [M][K/32][32 * digits]: a block's 32 hi digits, then its 32 lo digits
  const float* d;    // [M][K/32] block scale (amax / 127, / 254 more with two digits)
  const float* sum;  // [M][K/32] d * the block's digits summed (254 * hi + lo): the block's sum as
                     // quantized, so the bias term's rounding matches the scale term's and their
                     // errors cancel as in w . x
  const float* half; // [M][K/32][2] the same for the block's first and last 16 values (Q6_K's
                     // scales cover 16 weights)
  int digits;        // 1 or 2
};

// A quantized weight packed for the kernels: outputs in tiles of 16, and within a tile, for each
// 32-input block, the q of 4 consecutive inputs of one output in one 32-bit lane, so a dot product
// instruction sums 4 products per output. q is unsigned, 4, 5, 6 or 8 bits; a block takes 64 * bits bytes:
//   8-bit: chunk j < 8: 16 lanes x bytes (q[o][32b+4j+i], i < 4)                            512 B
//   4-bit: chunk j < 4: 16 lanes x bytes q[o][32b+4j+i] & 15 | (q[o][32b+16+4j+i] & 15) << 4  256 B
//   5-bit: the 4-bit nibbles, then 16 lanes x 4 bytes: bit j of byte i = bit 4 of q[o][32b+4j+i]
//                                                                                        256 + 64 B
//   6-bit: the 4-bit nibbles, then for p < 2, 16 lanes x 4 bytes: bits 2(j-4p), +1 of byte i are
//          bits 4, 5 of q[o][32b+4j+i], j = 4p .. 4p+3                                 256 + 128 B
// Outputs past N are zero. How q becomes a weight (`scheme`; T tiles, K inputs, lanes last):
//   kAffine: w = s * q + b; scales, biases [T][K / group_size][16], float16 or float32 (MLX's
//            affine quantization, GGUF's Q4_1 / Q5_1)
//   kSym:    w = s * (q - zero); scales [T][K / 32][16] float16 (GGUF's Q4_0, Q5_0, Q8_0)
//   kKQuant: w = d * sc * q - dmin * m, 32-weight sub-blocks of 256-weight super-blocks; scales d
//            and biases dmin [T][K / 256][16] float16, sub [T][K / 32][2][16] uint8 (sc, then m)
//            (GGUF's Q4_K, Q5_K)
//   kQ6K:    w = d * sc * (q - 32), 16-weight sub-blocks; scales d [T][K / 256][16] float16, sub
//            [T][K / 16][16] int8 (GGUF's Q6_K)
enum Scheme : int { kAffine = 0, kSym = 1, kKQuant = 2, kQ6K = 3 };

struct QWeight {
  const uint8_t* q;
  const void* scales;
  const void* biases;   // kAffine and kKQuant
  const uint8_t* sub;   // kKQuant and kQ6K
  bool half;            // scales and biases are float16
  int bits;             // 4, 5, 6 or 8
  int group_size;       // kAffine: a multiple of 32
  int scheme;
  int zero;             // kSym's offset
};

inline int block_bytes(int bits) { return kLanes * kBlock * bits / 8; }

struct QGemm {
  QActs x;
  QWeight w;
  int64_t M, N, K;
  float* out;  // [M][N]
};

// The query rows of one batch row and one KV head (attn_block.h): the heads sharing that KV head and
// the positions of a prompt chunk. Row r reads keys 0 .. limit[r] - 1 (and of those only the ones its
// boolean mask keeps, if it has one) and writes D floats at out[r]. Keys and values are float (bits
// 0: key j at kf + j * kf_stride, D contiguous) or MLX's affine quantization (bits 4 or 8: key j's
// words at kw + j * kw_stride, its group scales and biases at ks / kb + j * ks_stride). Keys are
// visited in order and each key's weight is added one at a time, so a row's result depends only on
// its own keys: left padding a batch adds skipped keys, never a change in the sums.
struct AttnBlock {
  const float* const* q;           // [rows] -> [D]
  float* const* out;               // [rows] -> [D]
  const int64_t* limit;            // [rows]
  const float* const* add_mask;    // [rows] -> additive mask entries (stride mask_stride), or nulls
  const uint8_t* const* keep;      // [rows] -> boolean mask entries (nonzero keeps), or nulls
  int64_t mask_stride;
  int64_t rows, D;
  const float* kf;
  const float* vf;
  int64_t kf_stride, vf_stride;
  const uint32_t* kw;
  const float* ks;
  const float* kb;
  const uint32_t* vw;
  const float* vs;
  const float* vb;
  int64_t kw_stride, ks_stride, vw_stride, vs_stride;
  int bits, group;  // bits 0: float keys and values
  float scale;
};

struct Isa {
  const char* name;
  // x [rows][K] -> the QActs arrays for `rows` rows (K a multiple of 32; q holds digits * K per row).
  void (*quantize_rows)(const float* x, int64_t rows, int64_t K, int digits, int8_t* q, float* d, float* sum,
                        float* half);
  // out[m][o] for every row m and every output o of tiles t0 <= t < t1.
  void (*qgemm)(const QGemm& g, int64_t t0, int64_t t1);
  void (*exp)(const float* x, float* y, int64_t n);
  // y = silu(g) * u
  void (*silu_mul)(const float* g, const float* u, float* y, int64_t n);
  // y = x / sqrt(mean(x^2) + eps) * w, one row of n
  void (*rms_norm)(const float* x, const float* w, float* y, int64_t n, float eps);
  // y = softmax(x), one row of n; returns log(sum(exp(x - max))) + max, the row's logsumexp
  float (*softmax)(const float* x, float* y, int64_t n);
  float (*logsumexp)(const float* x, int64_t n);
  // y[i] = x[i] - c
  void (*sub_scalar)(const float* x, float c, float* y, int64_t n);
  // One block of attention's query rows (see AttnBlock).
  void (*attn_block)(const struct AttnBlock& a);
  // y = gelu(x), the exact (erf) form
  void (*gelu)(const float* x, float* y, int64_t n);
};

extern const Isa kPortable;
#if defined(__x86_64__) || defined(_M_X64)
extern const Isa kAvx2;
extern const Isa kAvx512;
#endif

// The table in use: MLX_NB_ISA=portable|avx2|avx512 forces one the CPU supports (other processors,
// aarch64 among them, have the portable table only).
const Isa& isa();
// Switches the table (tests compare them in one process); false if this CPU can't run `name`.
bool set_isa(const char* name);
// Names of the tables this CPU can run, best first.
const char* isa_list();

// Exact IEEE float16 -> float32.
float half_to_float(uint16_t h);
inline float scale_at(const void* p, bool half, int64_t i) {
  return half ? half_to_float(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}
// q of output o (< 16) of a tile at input k (< 32) of a block, from the block's packed bytes.
inline int packed_q(const uint8_t* blk, int bits, int o, int k) {
  if (bits == 8) return blk[(k / 4) * 64 + o * 4 + k % 4];
  const int h = k / 16, kk = k % 16, j = k / 4;
  const uint8_t byte = blk[(kk / 4) * 64 + o * 4 + kk % 4];
  const int low = h ? byte >> 4 : byte & 0x0F;
  if (bits == 4) return low;
  if (bits == 5) return low | ((blk[256 + o * 4 + k % 4] >> j) & 1) << 4;
  return low | ((blk[256 + (j / 4) * 64 + o * 4 + k % 4] >> (2 * (j % 4))) & 3) << 4;
}

// The scale and bias of output o (< 16) of tile t for input block b (of 32), and for Q6_K's
// 16-weight halves the second half's (s1, b1; equal to s0, b0 for the other schemes).
struct BlockScale {
  float s0, b0, s1, b1;
};
inline BlockScale block_scale(const QWeight& w, int64_t K, int64_t t, int64_t b, int o) {
  const int64_t nb = K / kBlock;
  switch (w.scheme) {
    case kSym: {
      const float s = scale_at(w.scales, true, (t * nb + b) * kLanes + o);
      return {s, -s * w.zero, s, -s * w.zero};
    }
    case kKQuant: {
      const int64_t si = (t * (K / 256) + b / 8) * kLanes + o;
      const float d = scale_at(w.scales, true, si), dmin = scale_at(w.biases, true, si);
      const uint8_t* sb = w.sub + (t * nb + b) * 2 * kLanes;
      const float s = d * static_cast<float>(sb[o]), bias = -(dmin * static_cast<float>(sb[kLanes + o]));
      return {s, bias, s, bias};
    }
    case kQ6K: {
      const float d = scale_at(w.scales, true, (t * (K / 256) + b / 8) * kLanes + o);
      const int8_t* sb = reinterpret_cast<const int8_t*>(w.sub) + (t * nb + b) * 2 * kLanes;
      const float s0 = d * static_cast<float>(sb[o]), s1 = d * static_cast<float>(sb[kLanes + o]);
      return {s0, -32.0f * s0, s1, -32.0f * s1};
    }
    default: {
      const int64_t si = (t * (K / w.group_size) + b / (w.group_size / kBlock)) * kLanes + o;
      const float s = scale_at(w.scales, w.half, si), bias = scale_at(w.biases, w.half, si);
      return {s, bias, s, bias};
    }
  }
}

}  // namespace mlxnb
