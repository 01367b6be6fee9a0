// Column sums of a matrix into float32: a linear layer's bias gradient, its output gradient summed over the
// positions (linear.py's AMX form).
//
// Autocast's bias gradient is PyTorch's bf16 sum over the rows (dim 0), which takes several times one pass over
// the gradient and hands back the sum rounded to bf16 (docs/performance.md, "Kernels"). Here each band of 256
// columns keeps 16 float32 vectors of running sums in registers and walks every row once, and the float32 sum
// comes back unrounded. Bands run in parallel; each column is summed in row order, one float32 addition per row,
// in the vector and the scalar form alike, so the result has the same bits whatever the instructions or threads.

#include <algorithm>
#include <cstdint>

#include "vector.h"

namespace gpt1 {
namespace {

constexpr int64_t kBand = 256;

template <typename In>
void band_scalar(const In* src, int64_t rows, int64_t cols, int64_t c0, int64_t c1, float* dst) {
  for (int64_t c = c0; c < c1; ++c) dst[c] = 0.0f;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = c0; c < c1; ++c) dst[c] += load(src, r * cols + c);
}

#if GPT1_AVX512
// A full band: the 16 running sums a fixed count, so they stay in registers.
template <typename In>
void band_vector(const In* src, int64_t rows, int64_t cols, int64_t c0, float* dst) {
  constexpr int kVectors = kBand / 16;
  __m512 acc[kVectors];
  for (int i = 0; i < kVectors; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t r = 0; r < rows; ++r) {
    const In* p = src + r * cols + c0;
    for (int i = 0; i < kVectors; ++i) acc[i] = _mm512_add_ps(acc[i], vec::load16(p + 16 * i));
  }
  for (int i = 0; i < kVectors; ++i) vec::store16(dst + c0 + 16 * i, acc[i]);
}
#endif

template <typename In>
void column_sums(const In* src, int64_t rows, int64_t cols, float* dst) {
  at::parallel_for(0, (cols + kBand - 1) / kBand, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t c0 = b * kBand, c1 = std::min(cols, c0 + kBand);
#if GPT1_AVX512
      if (c1 - c0 == kBand) {
        band_vector(src, rows, cols, c0, dst);
        continue;
      }
#endif
      band_scalar(src, rows, cols, c0, c1, dst);
    }
  });
}

}  // namespace

// out[c] = Σ_r x[r][c] in float32, for a contiguous 2-D bf16 or float32 CPU x and a float32 out of x.size(1).
at::Tensor column_sums(const at::Tensor& x, at::Tensor out) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu() &&
                  (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat),
              "x must be a contiguous 2-D bfloat16 or float32 CPU tensor");
  TORCH_CHECK(out.dim() == 1 && out.is_contiguous() && out.device().is_cpu() && out.scalar_type() == at::kFloat &&
                  out.size(0) == x.size(1),
              "out must be a contiguous float32 vector of x's column count");
  const int64_t rows = x.size(0), cols = x.size(1);
  if (x.scalar_type() == at::kFloat)
    column_sums(x.data_ptr<float>(), rows, cols, out.data_ptr<float>());
  else
    column_sums(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), rows, cols, out.data_ptr<float>());
  return out;
}

}  // namespace gpt1
