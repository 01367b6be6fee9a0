// Dropout by a counter-based generator: the keep/drop decision of element i is a hash of (seed, i), so one pass
// draws the mask and applies it, and the backward pass recomputes the same mask from the seed instead of keeping
// it. Compiled by gptcli/model/kernels/native.py (bindings.cpp), used by gptcli/model/kernels/dropout.py.
//
// The hash is SplitMix64's output function on the counter seed + (i + 1)·γ, i.e. the i-th output of a SplitMix64
// generator started at `seed` (Steele, Lea & Flood 2014; passes BigCrush). Element i is kept when the top 32 bits
// of its hash are ≥ `threshold` = round(p·2³²): dropped with probability threshold/2³², the law of
// kernels/dropout.py's keep_mask. The decisions depend on (seed, i) only, never on the thread count.

#include "elementwise.h"

namespace {

using gpt1::kGrain;
using gpt1::load;
using gpt1::store;

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;

inline uint32_t draw(uint64_t seed, int64_t i) {
  uint64_t z = seed + static_cast<uint64_t>(i + 1) * kGamma;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 32);
}

template <typename T>
void apply_loop(const T* x, T* out, int64_t n, uint64_t seed, uint32_t threshold, float scale) {
  // `out` may be `x` (in place): each element is read before it is written, by the same iteration.
  at::parallel_for(0, n, gpt1::kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float v = load(x, i) * scale;
      store(out, i, draw(seed, i) >= threshold ? v : 0.0f);
    }
  });
}

template <typename T>
void mask_loop(T* out, int64_t n, uint64_t seed, uint32_t threshold) {
  at::parallel_for(0, n, gpt1::kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) store(out, i, draw(seed, i) >= threshold ? 1.0f : 0.0f);
  });
}

}  // namespace

namespace gpt1 {

// x · scale where element i of the mask (seed, threshold) keeps it, 0 elsewhere, written into `out` (x itself, or
// a contiguous tensor of x's dtype and shape).
torch::Tensor dropout_apply(const torch::Tensor& x, int64_t seed, int64_t threshold, double scale, torch::Tensor out) {
  check(x, "x");
  TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == x.scalar_type() && out.sizes() == x.sizes(),
              "out must be a contiguous tensor of x's dtype and shape");
  TORCH_CHECK(threshold >= 0 && threshold <= 0xffffffffLL, "threshold must be in [0, 2^32)");
  dispatch(x.scalar_type(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    apply_loop(static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr()), x.numel(),
               static_cast<uint64_t>(seed), static_cast<uint32_t>(threshold), static_cast<float>(scale));
  });
  return out;
}

// The mask itself (1 kept, 0 dropped) in `out`'s dtype: what dropout_apply multiplies by, for tests.
torch::Tensor dropout_mask(torch::Tensor out, int64_t seed, int64_t threshold) {
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
