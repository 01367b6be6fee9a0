// What the vector loops of this folder share. With AVX-512: 16 float32 or bf16 lanes loaded as floats and stored
// back (bf16 rounded to nearest-even, NaN kept a NaN: elementwise.h's scalar store, lane by lane), the first `mask`
// lanes of a row's tail only. GPT1_AVX512 is 1 where the CPU has AVX-512 F, BW (bf16's masked 16-bit loads) and DQ
// (dropout's 64-bit multiplies), as all but the earliest AVX-512 CPUs have. Without it, GPT1_AVX2 is 1 where the
// CPU has AVX2 and FMA (mainstream AVX2 CPUs have both): 8 lanes, and a row's tail (fewer than 8 elements) goes
// through an 8-float buffer, since AVX2 has no masked 16-bit loads. GPT1_VECTOR_ROWS is 1 with either: the
// row loops of loss.cpp and softmax.cpp and dropout.cpp's vector loop exist in both widths (AVX2's 64-bit
// multiplies made of 32-bit ones). Elsewhere the loops' scalar forms (or the callers' PyTorch ops) compute instead.
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

#if !GPT1_AVX512 && defined(__AVX2__) && defined(__FMA__)
#define GPT1_AVX2 1
#include <immintrin.h>

namespace gpt1::vec8 {

// 8 lanes from p widened to float.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// v to p's 8 lanes; bf16 rounded as elementwise.h's scalar store (nearest-even, a NaN stays a NaN).
inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store8(uint16_t* p, __m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i out = _mm256_blendv_epi8(rounded, quiet, nan);  // 32-bit lanes, each ≤ 0xffff
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(out), _mm256_extracti128_si256(out, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

// Each lane's index, 0 … 7.
inline __m256i lane_index() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }

// All-ones in the first `left` lanes (left < 8: a row's tail), zero in the others.
inline __m256 lanes_below(int64_t left) {
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)), lane_index()));
}

// A row's tail: its `left` (< 8) elements widened to float, the other lanes `fill`.
template <typename T>
inline __m256 load_tail(const T* p, int64_t left, float fill) {
  alignas(32) float buf[8];
  for (int i = 0; i < 8; ++i) buf[i] = i < left ? gpt1::load(p, i) : fill;
  return _mm256_load_ps(buf);
}

// The first `left` (< 8) lanes of v to p, each rounded as the scalar store does.
template <typename T>
inline void store_tail(T* p, __m256 v, int64_t left) {
  alignas(32) float buf[8];
  _mm256_store_ps(buf, v);
  for (int64_t i = 0; i < left; ++i) gpt1::store(p, i, buf[i]);
}

inline float reduce_add(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline float reduce_max(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

}  // namespace gpt1::vec8

#else
#define GPT1_AVX2 0
#endif

#define GPT1_VECTOR_ROWS (GPT1_AVX512 || GPT1_AVX2)
