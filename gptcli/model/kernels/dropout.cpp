// Dropout by a counter-based generator: the keep/drop decision of element i is a hash of (seed, i), so one pass
// draws the mask and applies it, and the backward pass recomputes the same mask from the seed instead of keeping
// it. Compiled by gptcli/model/kernels/native.py (bindings.cpp), used by gptcli/model/kernels/dropout.py.
//
// The hash is SplitMix64's output function on a counter, seed + (c + 1)·γ, i.e. the c-th output of a SplitMix64
// generator started at `seed` (Steele, Lea & Flood 2014; passes BigCrush); each 64-bit output decides two elements
// by its two 32-bit halves: element i of block i / 16 takes counter 8·(i / 16) + i mod 8, its low half for the
// block's first eight elements and its high half for the last eight. An element is kept when its 32 bits are
// ≥ `threshold` = round(p·2³²): dropped with probability threshold/2³², the law of kernels/dropout.py's keep_mask.
// The decisions depend on (seed, i) only, never on the thread count or the instruction set: with AVX-512 a block
// is one vector of 8 hashes and 16 elements, with AVX2 two vectors of 4 hashes (the 64-bit multiplies made of
// 32-bit ones) deciding two vectors of 8 elements, otherwise the scalar loop computes the same bits.

#include "vector.h"

namespace {

using gpt1::kGrain;
using gpt1::load;
using gpt1::store;

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kMix1 = 0xbf58476d1ce4e5b9ULL;
constexpr uint64_t kMix2 = 0x94d049bb133111ebULL;

inline uint32_t draw(uint64_t seed, int64_t i) {  // element i's 32 bits (header comment)
  const int64_t block = i >> 4, lane = i & 15;
  uint64_t z = seed + static_cast<uint64_t>(block * 8 + (lane & 7) + 1) * kGamma;
  z = (z ^ (z >> 30)) * kMix1;
  z = (z ^ (z >> 27)) * kMix2;
  z ^= z >> 31;
  return static_cast<uint32_t>(lane < 8 ? z : z >> 32);
}

template <typename T>
void apply_scalar(const T* x, T* out, int64_t begin, int64_t end, uint64_t seed, uint32_t threshold, float scale) {
  for (int64_t i = begin; i < end; ++i) {
    const float v = load(x, i) * scale;
    store(out, i, draw(seed, i) >= threshold ? v : 0.0f);
  }
}

#if GPT1_AVX512
inline __mmask16 keep16(uint64_t seed, int64_t block, __m512i threshold) {
  const __m512i lanes = _mm512_set_epi64(8, 7, 6, 5, 4, 3, 2, 1);  // counter + 1 of lanes 0..7
  const __m512i c = _mm512_add_epi64(_mm512_set1_epi64(block * 8), lanes);
  __m512i z = _mm512_add_epi64(_mm512_set1_epi64(static_cast<int64_t>(seed)),
                               _mm512_mullo_epi64(c, _mm512_set1_epi64(static_cast<int64_t>(kGamma))));
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), _mm512_set1_epi64(static_cast<int64_t>(kMix1)));
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), _mm512_set1_epi64(static_cast<int64_t>(kMix2)));
  z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
  const __m256i lo = _mm512_cvtepi64_epi32(z), hi = _mm512_cvtepi64_epi32(_mm512_srli_epi64(z, 32));
  const __m512i bits = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  return _mm512_cmpge_epu32_mask(bits, threshold);
}

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
// AVX2 has no 64-bit multiply: a·m mod 2⁶⁴ = a_lo·m_lo + ((a_lo·m_hi + a_hi·m_lo) << 32), three 32 × 32 → 64-bit
// products (vpmuludq) per lane; the m's are constants.
inline __m256i mul64(__m256i a, uint64_t m) {
  const __m256i lo = _mm256_set1_epi64x(static_cast<int64_t>(m & 0xffffffffULL));
  const __m256i hi = _mm256_set1_epi64x(static_cast<int64_t>(m >> 32));
  const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(a, hi), _mm256_mul_epu32(_mm256_srli_epi64(a, 32), lo));
  return _mm256_add_epi64(_mm256_mul_epu32(a, lo), _mm256_slli_epi64(cross, 32));
}

inline __m256i mix(__m256i z) {  // SplitMix64's output function, 4 lanes
  z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), kMix1);
  z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), kMix2);
  return _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
}

// The block's 8 hashes as two vectors of 4, returned as their low halves (elements 0-7) and high halves (8-15),
// each in lane order. The counter's product by γ is a sum: seed + (8·block + 1)·γ, plus lane·γ (constants).
inline void draw16(uint64_t seed, int64_t block, __m256i& low, __m256i& high) {
  const uint64_t base = seed + static_cast<uint64_t>(block * 8 + 1) * kGamma;
  const __m256i b = _mm256_set1_epi64x(static_cast<int64_t>(base));
  const auto step = [](uint64_t k) { return static_cast<int64_t>(k * kGamma); };
  const __m256i a = mix(_mm256_add_epi64(b, _mm256_setr_epi64x(0, step(1), step(2), step(3))));
  const __m256i c = mix(_mm256_add_epi64(b, _mm256_setr_epi64x(step(4), step(5), step(6), step(7))));
  // 32-bit halves of a: a0l a0h a1l a1h | a2l a2h a3l a3h; shuffle_ps takes halves from a and c within each
  // 128-bit lane (a0 a1 c0 c1 | a2 a3 c2 c3), the 64-bit permute restores hash order (a0 a1 a2 a3 c0 c1 c2 c3).
  const __m256 af = _mm256_castsi256_ps(a), cf = _mm256_castsi256_ps(c);
  low = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(af, cf, _MM_SHUFFLE(2, 0, 2, 0))),
                                 _MM_SHUFFLE(3, 1, 2, 0));
  high = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(af, cf, _MM_SHUFFLE(3, 1, 3, 1))),
                                  _MM_SHUFFLE(3, 1, 2, 0));
}

inline __m256 keep8(__m256i bits, __m256i threshold) {  // all-ones where bits ≥ threshold (unsigned): max(b, t) = b
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_max_epu32(bits, threshold), bits));
}

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
torch::Tensor dropout_apply(const torch::Tensor& x, int64_t seed, int64_t threshold, double scale, torch::Tensor out,
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
