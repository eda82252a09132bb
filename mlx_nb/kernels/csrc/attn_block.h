// Scaled dot-product attention for a block of query rows (isa.h's AttnBlock), written once over an
// instruction set's vector operations. A block is the query rows that read one KV head of one batch
// row (the heads sharing it, the positions of a prompt chunk): keys are visited a chunk of 64 at a
// time for all of them, so a chunk is read from memory once per block instead of once per row, and a
// quantized chunk (MLX's affine quantization: 4 or 8 bits per value in uint32 words, a float scale
// and bias per `group` values of a key) is dequantized once, into a small float buffer.
//
// A row's result depends only on its own keys, in order: scores are each key's own dot product (16
// or 4 keys at once, each key's sum made as alone), and the weighted sum of
// the values goes over keys in order with one running sum per output, carried across chunks in
// memory (a float in a register and in memory are the same value). So how rows are grouped into
// blocks, where chunk boundaries fall and how much left padding a batch adds change nothing.
#pragma once

#include <cmath>
#include <vector>

#include "attn_row.h"
#include "isa.h"
#include "simd_tail.h"

namespace mlxnb {

// Quantized keys (or values) j0 .. j0 + n - 1 as floats, n rows of D at `out`.
inline void dequant_keys(const AttnBlock& a, bool values, int64_t j0, int64_t n, float* out) {
  const uint32_t* words = values ? a.vw : a.kw;
  const float* scales = values ? a.vs : a.ks;
  const float* biases = values ? a.vb : a.kb;
  const int64_t ws = values ? a.vw_stride : a.kw_stride, ss = values ? a.vs_stride : a.ks_stride;
  const int64_t D = a.D, G = a.group;
  for (int64_t i = 0; i < n; ++i) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(words + (j0 + i) * ws);
    const float* s = scales + (j0 + i) * ss;
    const float* b = biases + (j0 + i) * ss;
    float* o = out + i * D;
    for (int64_t g = 0; g < D / G; ++g) {
      const float sc = s[g], bc = b[g];
      float* og = o + g * G;
      if (a.bits == 8) {
        const uint8_t* q = bytes + g * G;
        for (int64_t d = 0; d < G; ++d) og[d] = std::fma(sc, static_cast<float>(q[d]), bc);
      } else {  // 4 bits: value 2k in byte k's low half, 2k + 1 in its high half
        const uint8_t* q = bytes + g * G / 2;
        for (int64_t d = 0; d < G / 2; ++d) {
          og[2 * d] = std::fma(sc, static_cast<float>(q[d] & 15), bc);
          og[2 * d + 1] = std::fma(sc, static_cast<float>(q[d] >> 4), bc);
        }
      }
    }
  }
}

// Keys (or values) j0 .. j0 + n - 1 as floats: where they are for a float cache, else dequantized
// into `buf`; `stride` is the distance between keys.
inline const float* chunk_at(const AttnBlock& a, bool values, int64_t j0, int64_t n, float* buf, int64_t& stride) {
  if (a.bits == 0) {
    stride = values ? a.vf_stride : a.kf_stride;
    return (values ? a.vf : a.kf) + j0 * stride;
  }
  dequant_keys(a, values, j0, n, buf);
  stride = a.D;
  return buf;
}

template <class V>
void attn_block_t(const AttnBlock& a) {
  constexpr int64_t kChunk = 64;  // keys at a time: 64 x D floats stay in L1/L2
  const int64_t D = a.D, rows = a.rows;
  int64_t S = 0;
  for (int64_t r = 0; r < rows; ++r) S = std::max(S, a.limit[r]);
  thread_local std::vector<float> buf, scores, inv;
  thread_local std::vector<uint8_t> live;
  buf.resize(kChunk * D);
  scores.resize(rows * S);
  inv.assign(rows, 0.0f);
  live.assign(rows, 0);
  auto kept = [&](int64_t r, int64_t j) { return !a.keep[r] || a.keep[r][j * a.mask_stride]; };
  auto any_kept = [&](int64_t j0, int64_t j1) {  // whether a chunk holds a key some row reads
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = j0; j < std::min(j1, a.limit[r]); ++j)
        if (kept(r, j)) return true;
    return false;
  };
  // scores: each key's dot product with each row's query, then its scale and mask
  for (int64_t j0 = 0; j0 < S; j0 += kChunk) {
    const int64_t j1 = std::min(S, j0 + kChunk);
    const bool read = any_kept(j0, j1);
    int64_t ks = 0;
    const float* k = read ? chunk_at(a, false, j0, j1 - j0, buf.data(), ks) : nullptr;
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
      // four rows at once over the keys all of them read, three keys at a time
      int64_t shared = j0;
      if (read && r0 + 4 <= rows) {
        int64_t end4 = j1;
        const float* qs[4];
        float* outs[4];
        for (int i = 0; i < 4; ++i) end4 = std::min(end4, a.limit[r0 + i]), qs[i] = a.q[r0 + i];
        for (; shared + 3 <= end4; shared += 3) {
          for (int i = 0; i < 4; ++i) outs[i] = scores.data() + (r0 + i) * S + shared;
          dot_tile<V>(qs, k + (shared - j0) * ks, ks, D, outs);
        }
      }
      for (int64_t r = r0; r < std::min(rows, r0 + 4); ++r) {
        float* sc = scores.data() + r * S;
        const int64_t end = std::min(j1, a.limit[r]);
        int64_t j = shared;
        if (read && D % V::W == 0)
          for (; j + 16 <= end; j += 16)
            if (!V::dot16(a.q[r], k + (j - j0) * ks, ks, D, sc + j)) break;
        for (; read && j + 4 <= end; j += 4) dot4<V>(a.q[r], k + (j - j0) * ks, ks, D, sc + j);
        for (; read && j < end; ++j) sc[j] = dot_row<V>(a.q[r], k + (j - j0) * ks, D);
        if (read && !a.keep[r] && !a.add_mask[r]) {  // no mask: the scale alone, a vector at a time
          const typename V::reg sv = V::set1(a.scale);
          map1<V::W>(sc + j0, sc + j0, end - j0, [&](const float* x, float* y) { V::store(y, V::mul(V::load(x), sv)); });
          continue;
        }
        for (j = j0; j < end; ++j) {
          if (!read || !kept(r, j)) {
            sc[j] = -INFINITY;
            continue;
          }
          float s = sc[j] * a.scale;
          if (a.add_mask[r]) s += a.add_mask[r][j * a.mask_stride];
          sc[j] = s;
        }
      }
    }
  }
  // softmax per row
  for (int64_t r = 0; r < rows; ++r) {
    float* sc = scores.data() + r * S;
    const int64_t n = a.limit[r];
    float lanes[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    for (int64_t j = 0; j < n; ++j) lanes[j & 7] = sc[j] > lanes[j & 7] ? sc[j] : lanes[j & 7];  // the max: any order
    float m = lanes[0];
    for (float x : lanes) m = x > m ? x : m;
    for (int64_t d = 0; d < D; ++d) a.out[r][d] = 0.0f;
    if (m == -INFINITY) continue;
    const typename V::reg mv = V::set1(m);
    map1<V::W>(sc, sc, n, [&](const float* x, float* y) { V::store(y, V::exp(V::sub(V::load(x), mv))); }, -INFINITY);
    // The sum in eight lanes counted from the row's first kept key (left padding before it shifts
    // nothing; masked keys add exact zeros), added up in a fixed order.
    int64_t first = 0;
    while (first < n && sc[first] == 0.0f) ++first;
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = first; j < n; ++j) part[(j - first) & 7] += sc[j];
    const float sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    inv[r] = 1.0f / sum;
    live[r] = 1;
  }
  // the weighted sum of the values, chunk by chunk
  for (int64_t j0 = 0; j0 < S; j0 += kChunk) {
    const int64_t j1 = std::min(S, j0 + kChunk);
    bool needed = false;
    for (int64_t r = 0; r < rows && !needed; ++r)
      for (int64_t j = j0; live[r] && j < std::min(j1, a.limit[r]); ++j)
        if (scores[r * S + j] != 0.0f) {
          needed = true;
          break;
        }
    if (!needed) continue;
    int64_t vs = 0;
    const float* v = chunk_at(a, true, j0, j1 - j0, buf.data(), vs);
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
      int64_t common = 0;  // keys of this chunk the four rows all read: summed for the four at once
      if (r0 + 4 <= rows && live[r0] && live[r0 + 1] && live[r0 + 2] && live[r0 + 3]) {
        common = j1 - j0;
        const float* ps[4];
        float* outs[4];
        for (int i = 0; i < 4; ++i) {
          common = std::min(common, a.limit[r0 + i] - j0);
          ps[i] = scores.data() + (r0 + i) * S + j0, outs[i] = a.out[r0 + i];
        }
        common = std::max<int64_t>(common, 0);
        if (common > 0) accumulate_tile<V>(ps, common, v, vs, D, outs);
      }
      for (int64_t r = r0; r < std::min(rows, r0 + 4); ++r) {
        const int64_t n = std::min(j1, a.limit[r]) - j0 - common;
        if (live[r] && n > 0) accumulate<V>(scores.data() + r * S + j0 + common, n, v + common * vs, vs, D, a.out[r]);
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    if (live[r])
      for (int64_t d = 0; d < D; ++d) a.out[r][d] *= inv[r];
}

}  // namespace mlxnb
