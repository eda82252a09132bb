// Plumbing shared by the operations: argument checks, float32 views of inputs, row-parallel loops
// and the base of our CPU-only primitives.
#pragma once

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "pool.h"

namespace mx = mlx::core;

namespace mlxnb {

[[noreturn]] inline void fail(const std::string& op, const std::string& what) {
  throw std::invalid_argument("[mlx_nb." + op + "] " + what);
}

inline void check_float(const std::string& op, const mx::array& a) {
  if (!mx::issubdtype(a.dtype(), mx::floating)) fail(op, "expects a floating-point array");
}

// Kernels compute in float32; other float inputs are cast on the way in and the result cast back.
inline mx::array as_f32(const mx::array& a, mx::StreamOrDevice s) {
  return a.dtype() == mx::float32 ? a : mx::astype(a, mx::float32, s);
}

inline mx::array back_to(const mx::array& out, mx::Dtype dtype, mx::StreamOrDevice s) {
  return dtype == mx::float32 ? out : mx::astype(out, dtype, s);
}

// The elements of `a` in row-major order, read when the kernel runs: its own buffer when it is
// row-contiguous (the usual case), else a strided copy into `buf`. Taking views this way instead of
// adding MLX `contiguous` ops keeps a decode step's graph short.
template <typename T>
const T* row_major(const mx::array& a, std::vector<T>& buf) {
  if (a.flags().row_contiguous) return a.data<T>();
  buf.resize(a.size());
  const T* src = a.data<T>();
  const auto& shape = a.shape();
  const auto& strides = a.strides();
  const int nd = a.ndim();
  std::vector<int64_t> idx(nd, 0);
  int64_t off = 0;
  const int64_t inner = nd ? shape[nd - 1] : 1, inner_stride = nd ? strides[nd - 1] : 1;
  for (size_t i = 0; i < a.size(); i += inner) {
    for (int64_t j = 0; j < inner; ++j) buf[i + j] = src[off + j * inner_stride];
    for (int d = nd - 2; d >= 0; --d) {
      off += strides[d];
      if (++idx[d] < shape[d]) break;
      off -= strides[d] * shape[d];
      idx[d] = 0;
    }
  }
  return buf.data();
}

// For arrays a kernel indexes directly (packed weights): as they are when already evaluated and
// row-contiguous (packing makes them so), else through MLX's contiguous op.
inline mx::array contiguous_weight(const mx::array& a, mx::StreamOrDevice s) {
  if (a.status() != mx::array::unscheduled && a.flags().row_contiguous) return a;
  return mx::contiguous(a, false, s);
}

// Rows of `n` split into contiguous chunks over the pool when the work (rows * n elements) is at
// least `min_work`: below it, handing work to another thread costs more than it saves.
template <class F>
void for_rows(int64_t rows, int64_t n, F&& f, int64_t min_work = 1 << 15) {
  auto& pool = Pool::instance();
  if (rows < 2 || rows * n < min_work || pool.threads() == 1) {
    f(0, rows);
    return;
  }
  const int64_t tasks = std::min<int64_t>(rows, pool.threads() * 4);
  const int64_t per = (rows + tasks - 1) / tasks;
  pool.parallel_for((rows + per - 1) / per, [&](int64_t t) { f(t * per, std::min(rows, (t + 1) * per)); });
}

class CpuOnly : public mx::Primitive {
 public:
  using mx::Primitive::Primitive;
  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error(std::string("[mlx_nb] ") + name() + " runs on the CPU only");
  }
};

inline void alloc(mx::array& out) { out.set_data(mx::allocator::malloc(out.nbytes())); }

}  // namespace mlxnb
