// The attention softmax's forward with its dropout, and its backward through the dropout, each in one pass per row:
// compiled on first use by
// gptcli/model/kernels/native.py (bindings.cpp), used by gptcli/model/kernels/attention.py's hand-written backward.
//
// With p the softmax probabilities of a row, d = p ⊙ mask the dropped-out ones the forward kept (d = p without
// dropout) and dp the gradient of the (unscaled) dropped probabilities, the scores' gradient is
//   ds = d ⊙ dp − p · Σ_row (d ⊙ dp)
// (the softmax's backward of mask ⊙ dp; reference: torch._softmax_backward_data(mask * dp, p), tests/model/
// test_attention.py). PyTorch computes it in three passes over the T × T block (a product, a row sum, a fused
// multiply-add; or a mask and its softmax backward), reading and writing the block six or seven times; here each
// row is read once for its sum and once more, from L1 (a row is at most 512 values), for ds, written over dp.
// float32 or bf16 (sums in float32, one rounding at the store). AVX-512 where the CPU has it, else AVX2's 8 lanes
// (vector.h); elsewhere vectorised() is false and attention.py keeps PyTorch's ops.
//
// The forward (reference: torch.softmax of the scores under the additive causal mask, then dropout_apply of the
// probabilities with scale 1; tests/model/test_native.py) reads each row for its max, exponentiates it once into an
// L1 buffer, and writes p over the scores and the dropped-out d beside it with the mask's bits (mask_bits.h): PyTorch
// took a softmax pass and a dropout pass, and the causal mask as the score product's additive input (a copy of the
// mask into every block of scores). exp is vexp.h's (within 2 float ulps, as SLEEF's expf that PyTorch's softmax
// uses); the sum runs in one vector accumulator and p = e · (1 / sum), so p differs from PyTorch's by float32
// roundoff (a bf16 p by at most one bf16 ulp where the roundoff crosses a rounding boundary).

#include "mask_bits.h"
#include "vexp.h"

#include <limits>
#include <optional>
#include <vector>

namespace {


#if GPT1_AVX512
using gpt1::vec::load16;
using gpt1::vec::store16;
using gpt1::vec::tail;

template <typename T>
void backward_row(T* dp, const T* d, const T* p, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    acc0 = _mm512_fmadd_ps(load16(d + j), load16(dp + j), acc0);
    acc1 = _mm512_fmadd_ps(load16(d + j + 16), load16(dp + j + 16), acc1);
  }
  for (; j < n; j += 16) {
    const __mmask16 k = tail(n - j);
    acc0 = _mm512_fmadd_ps(load16(d + j, k), load16(dp + j, k), acc0);
  }
  const __m512 sum = _mm512_set1_ps(_mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)));
  for (j = 0; j < n; j += 16) {
    const __mmask16 k = tail(n - j);
    const __m512 ds = _mm512_fnmadd_ps(load16(p + j, k), sum, _mm512_mul_ps(load16(d + j, k), load16(dp + j, k)));
    store16(dp + j, ds, k);
  }
}


// One row of the forward (see softmax_forward): its first `visible` scores softmaxed into p over x, the rest 0,
// and d = p where the mask keeps element `flat + j`. `e` holds the row's exponentials (n rounded up to 16 floats).
template <typename T>
void forward_row(T* x, T* d, int64_t n, int64_t visible, int64_t flat, uint64_t seed, uint32_t threshold, float* e) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), zero = _mm512_setzero_ps();
  __m512 m = ninf;
  // max(v, m): a NaN score reaches the sum below through exp(NaN − m) whatever the max keeps.
  for (int64_t j = 0; j < visible; j += 16) {
    const __mmask16 k = tail(visible - j);
    m = _mm512_max_ps(_mm512_mask_mov_ps(ninf, k, load16(x + j, k)), m);
  }
  const __m512 mv = _mm512_set1_ps(_mm512_reduce_max_ps(m));
  __m512 sum = zero;
  int64_t j = 0;
  for (; j < visible; j += 16) {
    const __mmask16 k = tail(visible - j);
    const __m512 v = _mm512_maskz_mov_ps(k, gpt1::exp_above(_mm512_sub_ps(load16(x + j, k), mv)));
    _mm512_storeu_ps(e + j, v);
    sum = _mm512_add_ps(sum, v);
  }
  for (; j < n; j += 16) _mm512_storeu_ps(e + j, zero);
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
  const __m512i t = _mm512_set1_epi32(static_cast<int>(threshold));
  for (j = 0; j < n; j += 16) {
    const __mmask16 k = tail(n - j);
    const __m512 p = _mm512_mul_ps(_mm512_loadu_ps(e + j), inv);
    store16(x + j, p, k);
    // The same value rounded the same way: d holds p's bits or +0, as dropout_apply(p, scale 1) would write.
    if (d != nullptr) store16(d + j, _mm512_maskz_mov_ps(gpt1::keep16_at(seed, flat + j, t), p), k);
  }
}

#elif GPT1_AVX2
using gpt1::vec8::load8;
using gpt1::vec8::load_tail;
using gpt1::vec8::store8;
using gpt1::vec8::store_tail;

template <typename T>
void backward_row(T* dp, const T* d, const T* p, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    acc0 = _mm256_fmadd_ps(load8(d + j), load8(dp + j), acc0);
    acc1 = _mm256_fmadd_ps(load8(d + j + 8), load8(dp + j + 8), acc1);
  }
  for (; j + 8 <= n; j += 8) acc0 = _mm256_fmadd_ps(load8(d + j), load8(dp + j), acc0);
  if (j < n) acc1 = _mm256_fmadd_ps(load_tail(d + j, n - j, 0.0f), load_tail(dp + j, n - j, 0.0f), acc1);
  const __m256 sum = _mm256_set1_ps(gpt1::vec8::reduce_add(_mm256_add_ps(acc0, acc1)));
  for (j = 0; j + 8 <= n; j += 8)
    store8(dp + j, _mm256_fnmadd_ps(load8(p + j), sum, _mm256_mul_ps(load8(d + j), load8(dp + j))));
  if (j < n) {
    const int64_t left = n - j;
    const __m256 ds = _mm256_fnmadd_ps(load_tail(p + j, left, 0.0f), sum,
                                       _mm256_mul_ps(load_tail(d + j, left, 0.0f), load_tail(dp + j, left, 0.0f)));
    store_tail(dp + j, ds, left);
  }
}


template <typename T>
void forward_row(T* x, T* d, int64_t n, int64_t visible, int64_t flat, uint64_t seed, uint32_t threshold, float* e) {
  const float inf = std::numeric_limits<float>::infinity();
  __m256 m = _mm256_set1_ps(-inf);
  int64_t j = 0;
  // max(v, m): a NaN score reaches the sum below through exp(NaN − m) whatever the max keeps.
  for (; j + 8 <= visible; j += 8) m = _mm256_max_ps(load8(x + j), m);
  if (j < visible) m = _mm256_max_ps(load_tail(x + j, visible - j, -inf), m);
  const __m256 mv = _mm256_set1_ps(gpt1::vec8::reduce_max(m));
  __m256 sum = _mm256_setzero_ps();
  for (j = 0; j + 8 <= visible; j += 8) {
    const __m256 v = gpt1::exp_above(_mm256_sub_ps(load8(x + j), mv));
    _mm256_storeu_ps(e + j, v);
    sum = _mm256_add_ps(sum, v);
  }
  if (j < visible) {
    const __m256 v = _mm256_and_ps(gpt1::vec8::lanes_below(visible - j),
                                   gpt1::exp_above(_mm256_sub_ps(load_tail(x + j, visible - j, 0.0f), mv)));
    _mm256_storeu_ps(e + j, v);
    sum = _mm256_add_ps(sum, v);
    j += 8;
  }
  for (; j < n; j += 8) _mm256_storeu_ps(e + j, _mm256_setzero_ps());
  const __m256 inv = _mm256_set1_ps(1.0f / gpt1::vec8::reduce_add(sum));
  for (j = 0; j + 8 <= n; j += 8) {
    const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(e + j), inv);
    store8(x + j, p);
    if (d != nullptr) store8(d + j, _mm256_and_ps(gpt1::keep8_at(seed, flat + j, threshold), p));
  }
  if (j < n) {
    const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(e + j), inv);
    store_tail(x + j, p, n - j);
    if (d != nullptr) store_tail(d + j, _mm256_and_ps(gpt1::keep8_at(seed, flat + j, threshold), p), n - j);
  }
}

#else
template <typename T>
void backward_row(T*, const T*, const T*, int64_t) {
  TORCH_CHECK(false, "built without AVX-512 or AVX2: vectorised() is false");
}

template <typename T>
void forward_row(T*, T*, int64_t, int64_t, int64_t, uint64_t, uint32_t, float*) {
  TORCH_CHECK(false, "built without AVX-512 or AVX2: vectorised() is false");
}
#endif

}  // namespace

namespace gpt1 {

// ds over dp (header comment): dp, d and p contiguous, of one dtype and shape, rows along the last dimension.
at::Tensor softmax_backward(at::Tensor dp, const at::Tensor& d, const at::Tensor& p) {
  check(dp, "dp");
  TORCH_CHECK(dp.is_contiguous() && d.is_contiguous() && p.is_contiguous(), "dp, d and p must be contiguous");
  TORCH_CHECK(d.scalar_type() == dp.scalar_type() && p.scalar_type() == dp.scalar_type(), "one dtype for all three");
  TORCH_CHECK(d.sizes() == dp.sizes() && p.sizes() == dp.sizes(), "one shape for all three");
  const int64_t n = dp.dim() == 0 ? 1 : dp.size(-1);
  const int64_t rows = n == 0 ? 0 : dp.numel() / n;
  dispatch(dp.scalar_type(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* g = static_cast<T*>(dp.data_ptr());
    const T* dd = static_cast<const T*>(d.data_ptr());
    const T* pp = static_cast<const T*>(p.data_ptr());
    at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, n)), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) backward_row(g + r * n, dd + r * n, pp + r * n, n);
    });
  });
  return dp;
}


// The attention's probabilities and their dropout in one pass per row (header comment): s (…, rows, n) contiguous
// scores, overwritten by p = softmax(s) over each row; with causal_offset ≥ 0 row i of each matrix sees columns
// j ≤ causal_offset + i only (the others' p are 0, as under an additive −∞ mask). d, where given, receives p where
// the (seed, threshold) dropout mask keeps element i of the flat tensor, else 0: dropout_apply(p, seed, threshold,
// 1.0)'s bits.
at::Tensor softmax_forward(at::Tensor s, const std::optional<at::Tensor>& d, int64_t seed, int64_t threshold,
                              int64_t causal_offset) {
  check(s, "s");
  TORCH_CHECK(s.is_contiguous() && s.dim() >= 2, "s must be contiguous, with rows along its last dimension");
  TORCH_CHECK(!d || (d->is_contiguous() && d->scalar_type() == s.scalar_type() && d->sizes() == s.sizes()),
              "d must be a contiguous tensor of s's dtype and shape");
  TORCH_CHECK(threshold >= 0 && threshold <= 0xffffffffLL, "threshold must be in [0, 2^32)");
  const int64_t n = s.size(-1), rows_per = s.size(-2);
  const int64_t rows = n == 0 ? 0 : s.numel() / n;
  dispatch(s.scalar_type(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* x = static_cast<T*>(s.data_ptr());
    T* dd = d ? static_cast<T*>(d->data_ptr()) : nullptr;
    at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, n)), [&](int64_t begin, int64_t end) {
      std::vector<float> e((n + 15) / 16 * 16);
      for (int64_t r = begin; r < end; ++r) {
        const int64_t visible = causal_offset < 0 ? n : std::min(n, causal_offset + r % rows_per + 1);
        forward_row(x + r * n, dd ? dd + r * n : nullptr, n, visible, r * n, static_cast<uint64_t>(seed),
                    static_cast<uint32_t>(threshold), e.data());
      }
    });
  });
  return s;
}

}  // namespace gpt1
