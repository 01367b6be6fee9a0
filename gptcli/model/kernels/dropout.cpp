// Dropout by a counter-based generator: the keep/drop decision of element i is a hash of (seed, i), so one pass
// draws the mask and applies it, and the backward pass recomputes the same mask from the seed instead of keeping
// it. Compiled by gptcli/model/kernels/native.py (bindings.cpp), used by gptcli/model/kernels/dropout.py.
//
// The hash (SplitMix64 on a counter) is mask_bits.h's. An element is kept when its 32 bits are ≥ `threshold` =
// round(p·2³²): dropped with probability threshold/2³², the law of kernels/dropout.py's keep_mask. The decisions
// depend on (seed, i) only, never on the thread count or the instruction set: with AVX-512 a block is one vector of
// 8 hashes and 16 elements, with AVX2 two vectors of 4 hashes (the 64-bit multiplies made of 32-bit ones) deciding
// two vectors of 8 elements, otherwise the scalar loop computes the same bits.

#include "mask_bits.h"

namespace {

using gpt1::draw;
using gpt1::kGrain;
using gpt1::load;
using gpt1::store;

template <typename T>
void apply_scalar(const T* x, T* out, int64_t begin, int64_t end, uint64_t seed, uint32_t threshold, float scale) {
  for (int64_t i = begin; i < end; ++i) {
    const float v = load(x, i) * scale;
    store(out, i, draw(seed, i) >= threshold ? v : 0.0f);
  }
}

#if GPT1_AVX512
using gpt1::keep16;
using gpt1::vec::load16;
using gpt1::vec::store16;

template <typename T>
void apply_vector(const T* x, T* out, int64_t block_begin, int64_t block_end, uint64_t seed, uint32_t threshold,
                  float scale) {
  const __m512i t = _mm512_set1_epi32(static_cast<int>(threshold));
  const __m512 s = _mm512_set1_ps(scale);
  for (int64_t b = block_begin; b < block_end; ++b)
    store16(out + b * 16, _mm512_maskz_mul_ps(keep16(seed, b, t), load16(x + b * 16), s));
}
#elif GPT1_AVX2
using gpt1::draw16;
using gpt1::keep8;
using gpt1::vec8::load8;
using gpt1::vec8::store8;

template <typename T>
void apply_vector(const T* x, T* out, int64_t block_begin, int64_t block_end, uint64_t seed, uint32_t threshold,
                  float scale) {
  const __m256i t = _mm256_set1_epi32(static_cast<int>(threshold));
  const __m256 s = _mm256_set1_ps(scale);
  for (int64_t b = block_begin; b < block_end; ++b) {
    __m256i low, high;
    draw16(seed, b, low, high);
    // A dropped unit is +0 (the AND clears its bits), as the scalar loop's `keep ? v : 0.0f`.
    store8(out + b * 16, _mm256_and_ps(keep8(low, t), _mm256_mul_ps(load8(x + b * 16), s)));
    store8(out + b * 16 + 8, _mm256_and_ps(keep8(high, t), _mm256_mul_ps(load8(x + b * 16 + 8), s)));
  }
}
#else
template <typename T>
void apply_vector(const T* x, T* out, int64_t block_begin, int64_t block_end, uint64_t seed, uint32_t threshold,
                  float scale) {
  apply_scalar(x, out, block_begin * 16, block_end * 16, seed, threshold, scale);
}
#endif

template <typename T>
void apply_loop(const T* x, T* out, int64_t n, uint64_t seed, uint32_t threshold, float scale, bool vector) {
  // `out` may be `x` (in place): each element is read before it is written, by the same iteration. Whole blocks of
  // 16 go to the vector loop (when built with AVX-512 or AVX2 and `vector`), the tail to the scalar one: the same
  // bits.
  const int64_t blocks = n / 16;
  at::parallel_for(0, blocks, kGrain / 16, [&](int64_t begin, int64_t end) {
    if (vector) apply_vector(x, out, begin, end, seed, threshold, scale);
    else apply_scalar(x, out, begin * 16, end * 16, seed, threshold, scale);
  });
  apply_scalar(x, out, blocks * 16, n, seed, threshold, scale);
}

template <typename T>
void mask_loop(T* out, int64_t n, uint64_t seed, uint32_t threshold) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) store(out, i, draw(seed, i) >= threshold ? 1.0f : 0.0f);
  });
}

}  // namespace

namespace gpt1 {

// x · scale where element i of the mask (seed, threshold) keeps it, 0 elsewhere, written into `out` (x itself, or
// a contiguous tensor of x's dtype and shape).
at::Tensor dropout_apply(const at::Tensor& x, int64_t seed, int64_t threshold, double scale, at::Tensor out,
                            bool vector) {
  check(x, "x");
  TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == x.scalar_type() && out.sizes() == x.sizes(),
              "out must be a contiguous tensor of x's dtype and shape");
  TORCH_CHECK(threshold >= 0 && threshold <= 0xffffffffLL, "threshold must be in [0, 2^32)");
  dispatch(x.scalar_type(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    apply_loop(static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr()), x.numel(),
               static_cast<uint64_t>(seed), static_cast<uint32_t>(threshold), static_cast<float>(scale), vector);
  });
  return out;
}

// The mask itself (1 kept, 0 dropped) in `out`'s dtype: what dropout_apply multiplies by, for tests.
at::Tensor dropout_mask(at::Tensor out, int64_t seed, int64_t threshold) {
  check(out, "out");
  TORCH_CHECK(out.is_contiguous(), "out must be contiguous");
  dispatch(out.scalar_type(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    mask_loop(static_cast<T*>(out.data_ptr()), out.numel(), static_cast<uint64_t>(seed),
              static_cast<uint32_t>(threshold));
  });
  return out;
}

}  // namespace gpt1
