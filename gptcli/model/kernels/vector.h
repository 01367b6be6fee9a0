// What the AVX-512 loops of this folder share: 16 float32 or bf16 lanes loaded as floats and stored back (bf16
// rounded to nearest-even, NaN kept a NaN: elementwise.h's scalar store, lane by lane), the first `mask` lanes of a
// row's tail only. GPT1_AVX512 is 1 where the CPU has AVX-512 F, BW (bf16's masked 16-bit loads) and DQ (dropout's
// 64-bit multiplies), as every AVX-512 CPU since Skylake-SP does; elsewhere the loops' scalar forms compile instead.
#pragma once

#include "elementwise.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define GPT1_AVX512 1
#include <immintrin.h>

namespace gpt1::vec {

constexpr __mmask16 kAll = 0xffff;

// The mask of a row's next 16 lanes when `left` elements remain.
inline __mmask16 tail(int64_t left) { return left >= 16 ? kAll : __mmask16((1u << left) - 1u); }

// 16 lanes from p widened to float: the first lanes of `mask`, the others 0.
inline __m512 load16(const float* p, __mmask16 mask = kAll) { return _mm512_maskz_loadu_ps(mask, p); }
inline __m512 load16(const uint16_t* p, __mmask16 mask = kAll) {
  const __m256i h = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The first lanes of `mask` of v to p.
inline void store16(float* p, __m512 v, __mmask16 mask = kAll) { _mm512_mask_storeu_ps(p, mask, v); }
inline void store16(uint16_t* p, __m512 v, __mmask16 mask = kAll) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  const __m512i out = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), quiet);
  _mm256_mask_storeu_epi16(p, mask, _mm512_cvtepi32_epi16(out));
}

}  // namespace gpt1::vec

#else
#define GPT1_AVX512 0
#endif
