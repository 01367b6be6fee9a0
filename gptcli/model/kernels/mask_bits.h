// The dropout mask's bits: a counter-based hash of (seed, element index), so that a mask is drawn where it is applied
// and recomputed instead of kept (dropout.cpp applies it; softmax.cpp's attention forward applies it to the
// probabilities it writes). The hash is SplitMix64's output function on a counter, seed + (c + 1)·γ, i.e. the c-th
// output of a SplitMix64 generator started at `seed` (Steele, Lea & Flood 2014; passes BigCrush); each 64-bit output
// decides two elements by its two 32-bit halves: element i of block i / 16 takes counter 8·(i / 16) + i mod 8, its
// low half for the block's first eight elements and its high half for the last eight. An element is kept when its
// 32 bits are ≥ `threshold` = round(p·2³²). The bits depend on (seed, i) only: the vector forms (one vector of 8
// hashes deciding 16 elements with AVX-512, two vectors of 4 with AVX2) draw the scalar draw()'s bits.
#pragma once

#include "vector.h"

namespace gpt1 {

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

// The keep bits of elements i … i + 15, whatever i's alignment: from the one or two blocks of 16 they straddle.
inline __mmask16 keep16_at(uint64_t seed, int64_t i, __m512i threshold) {
  const int64_t block = i >> 4, offset = i & 15;
  const uint32_t lo = keep16(seed, block, threshold);
  if (offset == 0) return static_cast<__mmask16>(lo);
  const uint32_t hi = keep16(seed, block + 1, threshold);
  return static_cast<__mmask16>((lo >> offset) | (hi << (16 - offset)));
}

#endif

#if GPT1_AVX2
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

// All-ones in the lanes of elements i … i + 7 that the mask keeps: half of a block's draw where i is a multiple of
// 8 (the rows of a block of attention probabilities), else element by element.
inline __m256 keep8_at(uint64_t seed, int64_t i, uint32_t threshold) {
  if ((i & 7) == 0) {
    __m256i low, high;
    draw16(seed, i >> 4, low, high);
    return keep8((i & 8) ? high : low, _mm256_set1_epi32(static_cast<int>(threshold)));
  }
  alignas(32) int32_t bits[8];
  for (int k = 0; k < 8; ++k) bits[k] = draw(seed, i + k) >= threshold ? -1 : 0;
  return _mm256_castsi256_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(bits)));
}

#endif

}  // namespace gpt1
