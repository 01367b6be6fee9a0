// The attention softmax's backward through dropout, in one pass per row: compiled on first use by
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

#include "vector.h"

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

#else
template <typename T>
void backward_row(T*, const T*, const T*, int64_t) {
  TORCH_CHECK(false, "built without AVX-512 or AVX2: vectorised() is false");
}
#endif

}  // namespace

namespace gpt1 {

// ds over dp (header comment): dp, d and p contiguous, of one dtype and shape, rows along the last dimension.
torch::Tensor softmax_backward(torch::Tensor dp, const torch::Tensor& d, const torch::Tensor& p) {
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

}  // namespace gpt1
