// The next-token cross-entropy's two passes over the vocabulary-wide logits, row by row with AVX-512: compiled on
// first use by gptcli/model/kernels/native.py (bindings.cpp), used by gptcli/model/kernels/losses.py. AVX2 CPUs
// without AVX-512 run the same passes 8 lanes wide.
//
// Reference: F.cross_entropy(logits[:, :classes].float(), targets, ignore_index=ignore, reduction="none") and its
// gradient (tests/model/test_native.py, tests/model/test_losses.py). Per row r of float32 or bf16 logits x:
//   forward:  lse_r = max_r + log Σ_j exp(x_rj − max_r),   nll_r = lse_r − x_r,target (0 where target = ignore)
//   backward: out_rj = w_r · exp(x_rj − lse_r) − w_r · [j = target],   0 in the padding columns j ≥ classes
// with w_r the upstream gradient of row r (0 for ignored rows), written in the logits' dtype (one rounding).
//
// Why: PyTorch's loss over blocks of rows (losses.py's fallback) reads a block into a contiguous float32 copy,
// log-softmaxes it, and in the backward subtracts, exponentiates and scatters in separate passes: several plain
// copies' worth of memory traffic (docs/performance.md, "Kernels").
// Here each row is read twice in the forward (its max, then its sum of exponentials, the second read from L2: a
// 40,478-wide float32 row is 160 KB) and once in the backward, which writes the gradient directly.
//
// exp is vexp.h's (Cephes' expf, within 2 float ulps, as SLEEF's expf that PyTorch's log-softmax uses). Sums run in 4
// vector accumulators, so the rounding differs from PyTorch's order by float32 roundoff only. Built where the CPU
// has AVX-512 or AVX2 (vector.h); elsewhere vectorised() is false and losses.py computes the same loss with
// PyTorch's ops.

#include "vexp.h"

#include <cmath>
#include <limits>

namespace {

#if GPT1_AVX512
using gpt1::exp16;
using gpt1::vec::tail;
using gpt1::vec::store16;

// 16 lanes from p widened to float, the lanes past `mask` `fill` (the max's -inf).
template <typename T>
inline __m512 load16(const T* p, __mmask16 mask, __m512 fill) {
  return _mm512_mask_mov_ps(fill, mask, gpt1::vec::load16(p, mask));
}

template <typename T>
float row_lse(const T* x, int64_t classes) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m0 = ninf, m1 = ninf;
  int64_t j = 0;
  for (; j + 32 <= classes; j += 32) {
    // max(v, m): a NaN in the row reaches the sum below through exp(NaN − m) whatever the max keeps.
    m0 = _mm512_max_ps(load16(x + j, 0xffff, ninf), m0);
    m1 = _mm512_max_ps(load16(x + j + 16, 0xffff, ninf), m1);
  }
  for (; j < classes; j += 16) m0 = _mm512_max_ps(load16(x + j, tail(classes - j), ninf), m0);
  const float m = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
  const __m512 mv = _mm512_set1_ps(m), zero = _mm512_setzero_ps();
  __m512 s[4] = {zero, zero, zero, zero};
  j = 0;
  for (; j + 64 <= classes; j += 64)
    for (int u = 0; u < 4; ++u)
      s[u] = _mm512_add_ps(s[u], exp16(_mm512_sub_ps(load16(x + j + 16 * u, 0xffff, zero), mv)));
  for (; j < classes; j += 16) {
    const __mmask16 k = tail(classes - j);
    s[0] = _mm512_add_ps(s[0], _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(load16(x + j, k, zero), mv))));
  }
  const float sum = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s[0], s[1]), _mm512_add_ps(s[2], s[3])));
  return m + std::log(sum);
}

template <typename T>
void row_grad(const T* x, T* out, int64_t classes, int64_t width, float lse, float w, int64_t target) {
  const __m512 shift = _mm512_set1_ps(lse), wv = _mm512_set1_ps(w), zero = _mm512_setzero_ps();
  for (int64_t j = 0; j < classes; j += 16) {
    const __mmask16 k = tail(classes - j);
    __m512 g = _mm512_mul_ps(wv, exp16(_mm512_sub_ps(load16(x + j, k, zero), shift)));
    if (target >= j && target < j + 16)  // the target's one-hot term, before the single rounding
      g = _mm512_mask_sub_ps(g, __mmask16(1u << (target - j)), g, wv);
    store16(out + j, g, k);
  }
  for (int64_t j = classes; j < width; j += 16) store16(out + j, zero, tail(width - j));
}

#elif GPT1_AVX2
// The same two passes in 8 lanes (vector.h; the exp's AVX2 form, vexp.h).
using gpt1::exp8;
using gpt1::vec8::lanes_below;
using gpt1::vec8::load8;
using gpt1::vec8::load_tail;
using gpt1::vec8::store8;
using gpt1::vec8::store_tail;

template <typename T>
float row_lse(const T* x, int64_t classes) {
  const float inf = std::numeric_limits<float>::infinity();
  const __m256 ninf = _mm256_set1_ps(-inf);
  __m256 m0 = ninf, m1 = ninf;
  int64_t j = 0;
  for (; j + 16 <= classes; j += 16) {
    // max(v, m): a NaN in the row reaches the sum below through exp(NaN − m) whatever the max keeps.
    m0 = _mm256_max_ps(load8(x + j), m0);
    m1 = _mm256_max_ps(load8(x + j + 8), m1);
  }
  for (; j + 8 <= classes; j += 8) m0 = _mm256_max_ps(load8(x + j), m0);
  if (j < classes) m0 = _mm256_max_ps(load_tail(x + j, classes - j, -inf), m0);
  const float m = gpt1::vec8::reduce_max(_mm256_max_ps(m0, m1));
  const __m256 mv = _mm256_set1_ps(m), zero = _mm256_setzero_ps();
  __m256 s[4] = {zero, zero, zero, zero};
  j = 0;
  for (; j + 32 <= classes; j += 32)
    for (int u = 0; u < 4; ++u) s[u] = _mm256_add_ps(s[u], exp8(_mm256_sub_ps(load8(x + j + 8 * u), mv)));
  for (; j + 8 <= classes; j += 8) s[0] = _mm256_add_ps(s[0], exp8(_mm256_sub_ps(load8(x + j), mv)));
  if (j < classes) {
    const __m256 e = exp8(_mm256_sub_ps(load_tail(x + j, classes - j, 0.0f), mv));
    s[1] = _mm256_add_ps(s[1], _mm256_and_ps(e, lanes_below(classes - j)));
  }
  const float sum =
      gpt1::vec8::reduce_add(_mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3])));
  return m + std::log(sum);
}

// w·exp(x − lse) over 8 lanes starting at column j, less w in the target's lane (before the single rounding).
inline __m256 grad8(__m256 x, __m256 shift, __m256 wv, int64_t j, int64_t target) {
  __m256 g = _mm256_mul_ps(wv, exp8(_mm256_sub_ps(x, shift)));
  if (target >= j && target < j + 8) {
    const __m256i lane = _mm256_set1_epi32(static_cast<int>(target - j));
    const __m256 at = _mm256_castsi256_ps(_mm256_cmpeq_epi32(lane, gpt1::vec8::lane_index()));
    g = _mm256_sub_ps(g, _mm256_and_ps(wv, at));
  }
  return g;
}

template <typename T>
void row_grad(const T* x, T* out, int64_t classes, int64_t width, float lse, float w, int64_t target) {
  const __m256 shift = _mm256_set1_ps(lse), wv = _mm256_set1_ps(w), zero = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= classes; j += 8) store8(out + j, grad8(load8(x + j), shift, wv, j, target));
  if (j < classes) store_tail(out + j, grad8(load_tail(x + j, classes - j, 0.0f), shift, wv, j, target), classes - j);
  for (j = classes; j + 8 <= width; j += 8) store8(out + j, zero);
  if (j < width) store_tail(out + j, zero, width - j);
}

#else
template <typename T>
float row_lse(const T*, int64_t) {
  TORCH_CHECK(false, "built without AVX-512 or AVX2: vectorised() is false");
  return 0.0f;
}

template <typename T>
void row_grad(const T*, T*, int64_t, int64_t, float, float, int64_t) {
  TORCH_CHECK(false, "built without AVX-512 or AVX2: vectorised() is false");
}
#endif

void check_rows(const at::Tensor& logits, const at::Tensor& targets, int64_t classes) {
  gpt1::check(logits, "logits");
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1, "logits must be a matrix of contiguous rows");
  TORCH_CHECK(classes >= 1 && classes <= logits.size(1), "classes must be in [1, logits.size(1)]");
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0) && targets.scalar_type() == at::kLong,
              "targets must be one int64 per row");
}

}  // namespace

namespace gpt1 {

// (nll, lse), float32 per row (header comment); nll is 0 where the target is `ignore`.
std::vector<at::Tensor> nll_forward(const at::Tensor& logits, const at::Tensor& targets, int64_t classes,
                                       int64_t ignore) {
  check_rows(logits, targets, classes);
  const auto tc = targets.contiguous();
  const int64_t rows = logits.size(0), ld = logits.stride(0);
  auto nll = at::empty({rows}, logits.options().dtype(at::kFloat));
  auto lse = at::empty({rows}, logits.options().dtype(at::kFloat));
  const int64_t* t = tc.data_ptr<int64_t>();
  float* nll_p = nll.data_ptr<float>();
  float* lse_p = lse.data_ptr<float>();
  dispatch(logits.scalar_type(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* x = static_cast<const T*>(logits.data_ptr());
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* row = x + r * ld;
        lse_p[r] = row_lse(row, classes);
        TORCH_CHECK(t[r] == ignore || (t[r] >= 0 && t[r] < classes), "target ", t[r], " out of range");
        nll_p[r] = t[r] == ignore ? 0.0f : lse_p[r] - load(row, t[r]);
      }
    });
  });
  return {nll, lse};
}

// The logits' gradient (header comment) into `out` (rows contiguous, logits' dtype and shape: a new tensor, or the
// logits themselves, each element read before it is written); `weight` is float32 per
// row, 0 where the target is ignored (whose `targets` entry may then be anything in range or `ignore`).
at::Tensor nll_backward(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& lse,
                           const at::Tensor& weight, int64_t classes, at::Tensor out) {
  check_rows(logits, targets, classes);
  TORCH_CHECK(out.stride(1) == 1 && out.scalar_type() == logits.scalar_type() && out.sizes() == logits.sizes(),
              "out must be a matrix of contiguous rows, of logits' dtype and shape (logits itself too)");
  TORCH_CHECK(lse.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
              "lse and weight must be float32");
  const auto tc = targets.contiguous(), lc = lse.contiguous(), wc = weight.contiguous();
  const int64_t rows = logits.size(0), ld = logits.stride(0), width = logits.size(1), ldo = out.stride(0);
  const int64_t* t = tc.data_ptr<int64_t>();
  const float* l = lc.data_ptr<float>();
  const float* w = wc.data_ptr<float>();
  dispatch(logits.scalar_type(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* x = static_cast<const T*>(logits.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const int64_t target = (t[r] >= 0 && t[r] < classes) ? t[r] : -1;
        row_grad(x + r * ld, o + r * ldo, classes, width, l[r], w[r], target);
      }
    });
  });
  return out;
}

}  // namespace gpt1
