// A mixture-of-experts layer's matmuls: every row of x goes through the packed weight of the expert
// it chose (experts stacked along the tiles: expert e owns tiles e * T .. e * T + T - 1). Rows are
// grouped by expert, so each chosen expert's weight is read once per call for all the rows that
// chose it; each row's arithmetic is the dense kernel's, whatever the other rows chose.
#include "common.h"
#include "isa.h"
#include "ops.h"
#include "packed.h"

namespace mlxnb {
namespace {

// The packed weight of expert e alone (tiles_per tiles of K inputs).
QWeight expert_view(const QWeight& w, int64_t K, int64_t tiles_per, int64_t e) {
  const int64_t nb = K / kBlock;
  const int64_t unit = w.scheme == kAffine ? w.group_size : w.scheme == kSym ? kBlock : 256;
  const int64_t scale_items = tiles_per * (K / unit) * kLanes, scale_bytes = w.half ? 2 : 4;
  QWeight v = w;
  v.q = w.q + e * tiles_per * nb * block_bytes(w.bits);
  v.scales = static_cast<const uint8_t*>(w.scales) + e * scale_items * scale_bytes;
  if (w.biases) v.biases = static_cast<const uint8_t*>(w.biases) + e * scale_items * scale_bytes;
  if (w.sub) v.sub = w.sub + e * tiles_per * nb * 2 * kLanes;
  return v;
}

struct ExpertScratch {
  std::vector<int8_t> q, gq;
  std::vector<float> d, sum, half, gd, gsum, ghalf, x, out;
  std::vector<int64_t> order, start;
};

void run_experts(const mx::array& xa, const mx::array& ea, const QWeight& w, int digits, int64_t R, int64_t N,
                 int64_t K, int64_t E, float* out) {
  thread_local ExpertScratch scratch;
  ExpertScratch& sc = scratch;
  const float* x = row_major(xa, sc.x);
  std::vector<int32_t> ebuf;
  const int32_t* ex = row_major(ea, ebuf);
  const int64_t nb = K / kBlock, tiles = (N + kLanes - 1) / kLanes;
  const Isa& k = isa();
  sc.q.resize(R * K * digits);
  sc.d.resize(R * nb);
  sc.sum.resize(R * nb);
  sc.half.resize(R * nb * 2);
  for_rows(R, K, [&](int64_t r0, int64_t r1) {
    k.quantize_rows(x + r0 * K, r1 - r0, K, digits, sc.q.data() + r0 * K * digits, sc.d.data() + r0 * nb,
                    sc.sum.data() + r0 * nb, sc.half.data() + r0 * nb * 2);
  });
  // rows grouped by expert (counting sort: stable, so a row's place in its group is fixed by the rows before it)
  sc.start.assign(E + 1, 0);
  for (int64_t r = 0; r < R; ++r) sc.start[ex[r] + 1]++;
  for (int64_t e = 0; e < E; ++e) sc.start[e + 1] += sc.start[e];
  sc.order.resize(R);
  {
    std::vector<int64_t> fill(sc.start.begin(), sc.start.end() - 1);
    for (int64_t r = 0; r < R; ++r) sc.order[fill[ex[r]]++] = r;
  }
  sc.gq.resize(R * K * digits);
  sc.gd.resize(R * nb);
  sc.gsum.resize(R * nb);
  sc.ghalf.resize(R * nb * 2);
  for (int64_t i = 0; i < R; ++i) {
    const int64_t r = sc.order[i];
    std::memcpy(sc.gq.data() + i * K * digits, sc.q.data() + r * K * digits, K * digits);
    std::memcpy(sc.gd.data() + i * nb, sc.d.data() + r * nb, nb * sizeof(float));
    std::memcpy(sc.gsum.data() + i * nb, sc.sum.data() + r * nb, nb * sizeof(float));
    std::memcpy(sc.ghalf.data() + i * nb * 2, sc.half.data() + r * nb * 2, nb * 2 * sizeof(float));
  }
  sc.out.resize(R * N);
  // one task per (expert with rows, chunk of tiles)
  struct Task {
    int64_t e, t0, t1;
  };
  std::vector<Task> tasks;
  const int64_t per = std::max<int64_t>(1, tiles / 4);
  for (int64_t e = 0; e < E; ++e)
    if (sc.start[e + 1] > sc.start[e])
      for (int64_t t = 0; t < tiles; t += per) tasks.push_back({e, t, std::min(tiles, t + per)});
  auto run = [&](int64_t i) {
    const Task& task = tasks[i];
    const int64_t first = sc.start[task.e], rows = sc.start[task.e + 1] - first;
    const QActs acts{sc.gq.data() + first * K * digits, sc.gd.data() + first * nb, sc.gsum.data() + first * nb,
                     sc.ghalf.data() + first * nb * 2, digits};
    const QGemm g{acts, expert_view(w, K, tiles, task.e), rows, N, K, sc.out.data() + first * N};
    k.qgemm(g, task.t0, task.t1);
  };
  auto& pool = Pool::instance();
  if (pool.threads() == 1 || R * N * K < (1 << 17)) {
    for (size_t i = 0; i < tasks.size(); ++i) run(static_cast<int64_t>(i));
  } else {
    pool.parallel_for(static_cast<int64_t>(tasks.size()), run);
  }
  for (int64_t i = 0; i < R; ++i) std::memcpy(out + sc.order[i] * N, sc.out.data() + i * N, N * sizeof(float));
}

class QMatmulExperts : public CpuOnly {
 public:
  QMatmulExperts(mx::Stream s, int64_t n, int64_t experts, Layout layout)
      : CpuOnly(s), n_(n), experts_(experts), layout_(layout) {}
  const char* name() const override { return "MlxNbQMatmulExperts"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    auto& o = static_cast<const QMatmulExperts&>(other);
    return o.n_ == n_ && o.experts_ == experts_ && o.layout_ == layout_;
  }
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outs) override {
    auto& out = outs[0];
    alloc(out);
    const int64_t K = in[0].shape(-1), R = in[0].size() / std::max<int64_t>(K, 1);
    auto& enc = mx::cpu::get_command_encoder(stream());
    enc.dispatch([x = in[0], e = in[1], w = packed_view(in, 2, layout_), digits = layout_.digits, R, N = n_, K,
                  E = experts_, o = out.data<float>()]() { run_experts(x, e, w, digits, R, N, K, E, o); });
  }

 private:
  int64_t n_, experts_;
  Layout layout_;
};

}  // namespace

mx::array qmatmul_experts(const mx::array& x, const mx::array& experts, const mx::array& packed,
                          const mx::array& scales, const std::optional<mx::array>& biases, int n, int num_experts,
                          int group_size, int bits, int scheme, int zero, const std::optional<mx::array>& sub,
                          int digits, mx::StreamOrDevice s) {
  const std::string op = "qmatmul_experts";
  check_float(op, x);
  if (x.ndim() != 2) fail(op, "x must be [rows, K]");
  if (experts.ndim() != 1 || experts.shape(0) != x.shape(0)) fail(op, "experts must be [rows]: one expert a row");
  if (!mx::issubdtype(experts.dtype(), mx::integer)) fail(op, "experts must be integers");
  if (n % kLanes) fail(op, "each expert's outputs must be a multiple of 16");
  const Layout layout{bits, group_size, scheme, zero, digits};
  auto weight = check_packed(op, packed, scales, biases, sub, static_cast<int64_t>(n) * num_experts, x.shape(1),
                             layout, s);
  // Out-of-range experts are clipped, as a gather clips its indices.
  auto idx = mx::clip(mx::astype(experts, mx::int32, s), mx::array(0), mx::array(num_experts - 1), s);
  std::vector<mx::array> inputs{as_f32(x, s), idx};
  inputs.insert(inputs.end(), weight.begin(), weight.end());
  auto out = mx::array({x.shape(0), n}, mx::float32,
                       std::make_shared<QMatmulExperts>(mx::to_stream(s), n, num_experts, layout), std::move(inputs));
  return back_to(out, x.dtype(), s);
}

}  // namespace mlxnb
