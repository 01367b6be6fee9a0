// The vector exponential of this folder's row loops (loss.cpp, softmax.cpp): Cephes' expf (Cody-Waite reduction by
// ln 2 in two parts, a degree-5 polynomial), scaled by 2ⁿ with vscalefps on AVX-512, which also gives the underflow
// to 0 for very negative arguments: within 2 float ulps of the exact exponential over the range that matters, as
// SLEEF's expf (1 ulp) that PyTorch's softmax and log-softmax use. AVX2 has no vscalefps: 2ⁿ is built in the
// exponent bits, as the product of 2^⌊n/2⌋ and 2^(n−⌊n/2⌋), each a normal float for every n the clamp allows
// (−150 … 128), so that y·2ⁿ is rounded once, subnormal results and underflow to 0 included, as vscalefps rounds it.
#pragma once

#include "vector.h"

namespace gpt1 {

// For both vector widths below: the clamp (the largest float argument; below −104 every result rounds
// to 0, and 2ⁿ stays within what the scaling handles), ln 2 in two parts for the reduction, and the degree-5
// polynomial, highest power first.
constexpr float kExpMax = 88.7228394f, kExpMin = -104.0f, kLog2e = 1.44269504088896341f;
constexpr float kExpFloor = -80.0f;  // exp_above's
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpPoly[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                              4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

#if GPT1_AVX512
inline __m512 exp16(__m512 x) {
  // min/max return their second operand when either is NaN: x second keeps a NaN a NaN.
  x = _mm512_min_ps(_mm512_set1_ps(kExpMax), x);
  x = _mm512_max_ps(_mm512_set1_ps(kExpMin), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

// exp(x) for x = score − max ≤ 0 (a softmax's), exactly 0 below kExpFloor: an additive mask's −∞ (the
// shared-prefix grid's) would otherwise take exp through subnormal intermediates, which Intel CPUs compute by
// microcode assists, many times slower (a masked block's softmax fell behind PyTorch's). e^−80
// is 2·10⁻³⁵ of the row's largest term, so a probability of at most that becomes 0 and the others do not move
// beyond float32 roundoff. A NaN stays NaN. (softmax.cpp, fused_attention.cpp)
inline __m512 exp_above(__m512 x) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpFloor), _CMP_NLT_UQ);  // NaN kept
  return _mm512_maskz_mov_ps(keep, exp16(_mm512_max_ps(_mm512_set1_ps(kExpFloor), x)));
}

#endif

#if GPT1_AVX2
inline __m256 exp8(__m256 x) {
  // min/max return their second operand when either is NaN: x second keeps a NaN a NaN.
  x = _mm256_min_ps(_mm256_set1_ps(kExpMax), x);
  x = _mm256_max_ps(_mm256_set1_ps(kExpMin), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n);  // a NaN's garbage exponent leaves y's NaN a NaN
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const __m256 hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(y, lo), hi);
}

// As the AVX-512 form's: exactly 0 below kExpFloor, no subnormal intermediates. A NaN stays NaN (the compare is
// false for it, but NaN AND 0 would give 0: its lanes are kept by the unordered test).
inline __m256 exp_above(__m256 x) {
  const __m256 floor = _mm256_set1_ps(kExpFloor);
  const __m256 keep = _mm256_cmp_ps(x, floor, _CMP_NLT_UQ);
  return _mm256_and_ps(keep, exp8(_mm256_max_ps(floor, x)));
}

#endif

}  // namespace gpt1
