// Causal attention fused per block of queries, float32 (gptcli/model/kernels/attention.py: _FusedAttention): the
// scores of a block of FUSED_ROWS queries against every key it can see are computed, softmaxed, dropped out and
// multiplied by v while they are in the core's L2 cache, and the backward pass computes them again from q and k and
// the forward's per-row log-sum-exp instead of reading kept probabilities back. The written-out path
// (_BlockedAttention) keeps the probabilities and their dropped-out copy of every block for the backward pass: at
// GPT-1's 4 × 512 tokens that is 60 MB per layer in float32, written once and read back twice, and the passes over
// it (scores, softmax, dropout, the products) each stream it through memory. Here nothing T × T leaves the cache.
//
// The products are the BLAS's own (sgemm_, the Fortran symbol every BLAS exports and PyTorch's CPU library carries,
// bound weakly: where it is missing available() is false and attention.py keeps the written-out path), one thread
// each inside at::parallel_for: the forward over (batch·head, query block) pairs, the backward over batch·heads
// (the key and value gradients of a head sum over its query blocks).
//
// Per block of queries Q (r × d) seeing keys 0 … n − 1 (n = the block's last query + 1), with α = 1/√d, the mask
// bits of the flat (B·H, T, T) probabilities (mask_bits.h: the bits a (B·H, T, T) dropout mask of this seed draws)
// and s = 1/(1 − p):
//   forward:  S = α Q Kᵀ;  row-wise P = softmax(S) under the causal mask;  lse = max + log Σ exp;
//             O = (P ⊙ keep · s) V
//   backward: P = exp(α Q Kᵀ − lse);  D = rowsum(dO ⊙ O);  dP = dO Vᵀ;  dS = P ⊙ (dP ⊙ keep · s − D);
//             dV += (P ⊙ keep · s)ᵀ dO;  dQ = α dS K;  dK += α dSᵀ Q
// (D = Σ_j P_ij (dP ⊙ keep · s)_ij, the softmax's backward, because O = (P ⊙ keep · s) V). Reference:
// F.scaled_dot_product_attention(..., is_causal=True) and the written-out path (tests/model/test_attention.py).

#include "mask_bits.h"
#include "vexp.h"

#include <cmath>
#include <initializer_list>
#include <limits>
#include <vector>

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc) __attribute__((weak));

namespace {

// Row-major C (m × n) = alpha · op(A) · op(B) + beta · C, op(X) = Xᵀ where t_x. Column-major BLAS computes the
// transpose: Cᵀ = op(B)ᵀ op(A)ᵀ, and a row-major matrix is its own transpose read column-major.
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
  const int LDA = static_cast<int>(lda), LDB = static_cast<int>(ldb), LDC = static_cast<int>(ldc);
  sgemm_(tb ? "T" : "N", ta ? "T" : "N", &N, &M, &K, &alpha, b, &LDB, a, &LDA, &beta, c, &LDC);
}

#if GPT1_AVX512
using gpt1::vec::tail;

// The lanes of j … j + 15 before `visible` (none once j is past it).
inline __mmask16 seen16(int64_t left) { return left <= 0 ? __mmask16(0) : tail(left); }

// Forward of one row (header comment): x holds its n scores (α applied), the first `visible` seen. On return x
// holds P ⊙ keep · s (0 past `visible`); returns the row's log-sum-exp.
float forward_row(float* x, int64_t n, int64_t visible, int64_t flat, uint64_t seed, uint32_t threshold, float scale,
                  bool drop) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m = ninf;
  for (int64_t j = 0; j < visible; j += 16) m = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, tail(visible - j), x + j), m);
  const float mx = _mm512_reduce_max_ps(m);
  const __m512 mv = _mm512_set1_ps(mx);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = tail(n - j), seen = seen16(visible - j) & k;
    const __m512 e = _mm512_maskz_mov_ps(seen, gpt1::exp_above(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), mv)));
    _mm512_mask_storeu_ps(x + j, k, e);
    sum = _mm512_add_ps(sum, e);
  }
  const float total = _mm512_reduce_add_ps(sum);
  const __m512 f = _mm512_set1_ps(scale / total);
  const __m512i t = _mm512_set1_epi32(static_cast<int>(threshold));
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = tail(n - j);
    const __mmask16 keep = drop ? gpt1::keep16_at(seed, flat + j, t) : __mmask16(0xffff);
    _mm512_mask_storeu_ps(x + j, k, _mm512_maskz_mul_ps(keep, _mm512_maskz_loadu_ps(k, x + j), f));
  }
  return mx + std::log(total);
}

// Backward of one row: x holds its n scores (α applied), dp its dP = dO Vᵀ. On return x holds P ⊙ keep · s and dp
// holds dS = P ⊙ (dP ⊙ keep · s − D).
void backward_row(float* x, float* dp, int64_t n, int64_t visible, float lse, float dsum, int64_t flat,
                  uint64_t seed, uint32_t threshold, float scale, bool drop) {
  const __m512 l = _mm512_set1_ps(lse), dv = _mm512_set1_ps(dsum), s = _mm512_set1_ps(scale);
  const __m512i t = _mm512_set1_epi32(static_cast<int>(threshold));
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = tail(n - j), seen = seen16(visible - j) & k;
    const __m512 p = _mm512_maskz_mov_ps(seen, gpt1::exp_above(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), l)));
    const __mmask16 keep = drop ? gpt1::keep16_at(seed, flat + j, t) : __mmask16(0xffff);
    _mm512_mask_storeu_ps(x + j, k, _mm512_maskz_mul_ps(keep, p, s));
    const __m512 g = _mm512_maskz_mul_ps(keep, _mm512_maskz_loadu_ps(k, dp + j), s);
    _mm512_mask_storeu_ps(dp + j, k, _mm512_mul_ps(p, _mm512_sub_ps(g, dv)));
  }
}

float dot(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = tail(n - j);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + j), _mm512_maskz_loadu_ps(k, b + j), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

#elif GPT1_AVX2
using gpt1::vec8::lanes_below;

// AVX2's forms of the three above: 8 lanes, a row's tail through lanes_below and an 8-float buffer.
inline __m256 load_n(const float* p, int64_t left) {
  if (left >= 8) return _mm256_loadu_ps(p);
  alignas(32) float buf[8] = {};
  for (int64_t i = 0; i < left; ++i) buf[i] = p[i];
  return _mm256_load_ps(buf);
}

inline void store_n(float* p, __m256 v, int64_t left) {
  if (left >= 8) return _mm256_storeu_ps(p, v);
  alignas(32) float buf[8];
  _mm256_store_ps(buf, v);
  for (int64_t i = 0; i < left; ++i) p[i] = buf[i];
}

inline __m256 seen8(int64_t left) {
  return left >= 8 ? _mm256_castsi256_ps(_mm256_set1_epi32(-1)) : left <= 0 ? _mm256_setzero_ps() : lanes_below(left);
}

inline __m256 keep8(bool drop, uint64_t seed, int64_t i, uint32_t threshold) {
  return drop ? gpt1::keep8_at(seed, i, threshold) : _mm256_castsi256_ps(_mm256_set1_epi32(-1));
}

float forward_row(float* x, int64_t n, int64_t visible, int64_t flat, uint64_t seed, uint32_t threshold, float scale,
                  bool drop) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < visible; ++j) mx = std::max(mx, x[j]);
  const __m256 mv = _mm256_set1_ps(mx);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; j += 8) {
    const __m256 e = _mm256_and_ps(seen8(visible - j), gpt1::exp_above(_mm256_sub_ps(load_n(x + j, n - j), mv)));
    store_n(x + j, e, n - j);
    sum = _mm256_add_ps(sum, e);
  }
  const float total = gpt1::vec8::reduce_add(sum);
  const __m256 f = _mm256_set1_ps(scale / total);
  for (int64_t j = 0; j < n; j += 8)
    store_n(x + j, _mm256_and_ps(keep8(drop, seed, flat + j, threshold), _mm256_mul_ps(load_n(x + j, n - j), f)),
            n - j);
  return mx + std::log(total);
}

void backward_row(float* x, float* dp, int64_t n, int64_t visible, float lse, float dsum, int64_t flat,
                  uint64_t seed, uint32_t threshold, float scale, bool drop) {
  const __m256 l = _mm256_set1_ps(lse), dv = _mm256_set1_ps(dsum), s = _mm256_set1_ps(scale);
  for (int64_t j = 0; j < n; j += 8) {
    const __m256 p = _mm256_and_ps(seen8(visible - j), gpt1::exp_above(_mm256_sub_ps(load_n(x + j, n - j), l)));
    const __m256 keep = keep8(drop, seed, flat + j, threshold);
    store_n(x + j, _mm256_and_ps(keep, _mm256_mul_ps(p, s)), n - j);
    const __m256 g = _mm256_and_ps(keep, _mm256_mul_ps(load_n(dp + j, n - j), s));
    store_n(dp + j, _mm256_mul_ps(p, _mm256_sub_ps(g, dv)), n - j);
  }
}

float dot(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; j += 8) acc = _mm256_fmadd_ps(load_n(a + j, n - j), load_n(b + j, n - j), acc);
  return gpt1::vec8::reduce_add(acc);
}

#else
float forward_row(float*, int64_t, int64_t, int64_t, uint64_t, uint32_t, float, bool) {
  TORCH_CHECK(false, "built without AVX-512 or AVX2: fused_attention_available() is false");
}
void backward_row(float*, float*, int64_t, int64_t, float, float, int64_t, uint64_t, uint32_t, float, bool) {
  TORCH_CHECK(false, "built without AVX-512 or AVX2: fused_attention_available() is false");
}
float dot(const float*, const float*, int64_t) { return 0.0f; }
#endif

// A (B, H, T, d) float32 view: its base pointer and strides, rows of d contiguous.
struct Heads {
  float* base;
  int64_t sb, sh, st, heads;
  Heads(const at::Tensor& x, const char* name)
      : base(checked(x, name)), sb(x.stride(0)), sh(x.stride(1)), st(x.stride(2)), heads(x.size(1)) {}
  static float* checked(const at::Tensor& x, const char* name) {
    TORCH_CHECK(x.dim() == 4 && x.scalar_type() == at::kFloat && x.device().is_cpu(), name,
                " must be a (B, H, T, d) float32 CPU tensor");
    TORCH_CHECK(x.stride(3) == 1, name, "'s rows must be contiguous (stride 1 along d)");
    return x.data_ptr<float>();
  }
  float* at(int64_t bh, int64_t t = 0) const { return base + (bh / heads) * sb + (bh % heads) * sh + t * st; }
};

// Vector row loops built, and a BLAS sgemm_ bound.
bool available() { return GPT1_VECTOR_ROWS && sgemm_ != nullptr; }

// What both passes check after their Heads views: the build, every other tensor of q's shape, lse, rows.
void check_call(const at::Tensor& q, std::initializer_list<const at::Tensor*> others, const at::Tensor& lse,
                int64_t rows) {
  TORCH_CHECK(available(), "fused attention unavailable in this build");
  for (const at::Tensor* x : others) TORCH_CHECK(x->sizes() == q.sizes(), "every tensor must have q's shape");
  TORCH_CHECK(lse.is_contiguous() && lse.scalar_type() == at::kFloat && lse.numel() == q.numel() / q.size(3),
              "lse must be a contiguous float32 (B, H, T) tensor");
  TORCH_CHECK(rows > 0, "rows must be positive");
}

struct Dropout {
  uint64_t seed;
  uint32_t threshold;
  float scale;
  bool on;
  Dropout(int64_t seed_, int64_t threshold_, double scale_)
      : seed(static_cast<uint64_t>(seed_)), threshold(static_cast<uint32_t>(threshold_)),
        scale(static_cast<float>(scale_)), on(threshold_ > 0) {
    TORCH_CHECK(threshold_ >= 0 && threshold_ < 0x100000000LL, "threshold must be in [0, 2^32)");
  }
};

}  // namespace

namespace gpt1 {

bool fused_attention_available() { return available(); }

// out (B, H, T, d), any row strides, ← the attention of q, k, v (B, H, T, d); lse (B, H, T) contiguous ← each row's
// log-sum-exp of its scaled scores. threshold 0: no dropout; else `scale` = 1/(1 − p) multiplies what it keeps.
void fused_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             at::Tensor out, at::Tensor lse, int64_t seed, int64_t threshold, double scale,
                             int64_t rows) {
  const Heads Q(q, "q"), K(k, "k"), V(v, "v"), O(out, "out");
  check_call(q, {&k, &v, &out}, lse, rows);
  const int64_t bh = q.size(0) * q.size(1), T = q.size(2), d = q.size(3), blocks = (T + rows - 1) / rows;
  const float alpha = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  const Dropout drop(seed, threshold, scale);
  float* L = lse.data_ptr<float>();
  at::parallel_for(0, bh * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(rows * T);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task / blocks, a = (task % blocks) * rows, r = std::min(rows, T - a), n = a + r;
      gemm(false, true, r, n, d, alpha, Q.at(h, a), Q.st, K.at(h), K.st, 0.0f, s.data(), n);
      for (int64_t i = 0; i < r; ++i)
        L[h * T + a + i] = forward_row(s.data() + i * n, n, a + i + 1, (h * T + a + i) * T, drop.seed,
                                       drop.threshold, drop.scale, drop.on);
      gemm(false, false, r, d, n, 1.0f, s.data(), n, V.at(h), V.st, 0.0f, O.at(h, a), O.st);
    }
  });
}

// dq, dk, dv (B, H, T, d), any row strides, ← the gradients of q, k, v given the output's gradient `grad` (the same
// seed, threshold and scale as the forward's, its out and lse).
void fused_attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& out, const at::Tensor& grad, const at::Tensor& lse,
                              at::Tensor dq, at::Tensor dk, at::Tensor dv, int64_t seed, int64_t threshold,
                              double scale, int64_t rows) {
  const Heads Q(q, "q"), K(k, "k"), V(v, "v"), O(out, "out"), G(grad, "grad"), DQ(dq, "dq"), DK(dk, "dk"),
      DV(dv, "dv");
  check_call(q, {&k, &v, &out, &grad, &dq, &dk, &dv}, lse, rows);
  const int64_t bh = q.size(0) * q.size(1), T = q.size(2), d = q.size(3);
  const float alpha = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  const Dropout drop(seed, threshold, scale);
  const float* L = lse.data_ptr<float>();
  if (T == 0) return;  // no rows (and no block to start from)
  at::parallel_for(0, bh, 1, [&](int64_t begin, int64_t end) {
    // The head's key and value gradients accumulate in dense buffers (the BLAS's C reads and writes them once per
    // block; into the projection's strided rows that measured slower) and are written out once. The last block
    // sees every key, so taking the blocks last to first lets its products write the buffers (β = 0): no zeroing.
    std::vector<float> s(rows * T), dp(rows * T), gk(T * d), gv(T * d);
    const int64_t last = (T - 1) / rows * rows;
    for (int64_t h = begin; h < end; ++h) {
      for (int64_t a = last; a >= 0; a -= rows) {
        const int64_t r = std::min(rows, T - a), n = a + r;
        const float beta = a == last ? 0.0f : 1.0f;
        gemm(false, true, r, n, d, alpha, Q.at(h, a), Q.st, K.at(h), K.st, 0.0f, s.data(), n);
        gemm(false, true, r, n, d, 1.0f, G.at(h, a), G.st, V.at(h), V.st, 0.0f, dp.data(), n);
        for (int64_t i = 0; i < r; ++i)
          backward_row(s.data() + i * n, dp.data() + i * n, n, a + i + 1, L[h * T + a + i],
                       dot(G.at(h, a + i), O.at(h, a + i), d), (h * T + a + i) * T, drop.seed, drop.threshold,
                       drop.scale, drop.on);
        gemm(true, false, n, d, r, 1.0f, s.data(), n, G.at(h, a), G.st, beta, gv.data(), d);
        gemm(false, false, r, d, n, alpha, dp.data(), n, K.at(h), K.st, 0.0f, DQ.at(h, a), DQ.st);
        gemm(true, false, n, d, r, alpha, dp.data(), n, Q.at(h, a), Q.st, beta, gk.data(), d);
      }
      for (int64_t t = 0; t < T; ++t) {
        std::copy_n(gk.data() + t * d, d, DK.at(h, t));
        std::copy_n(gv.data() + t * d, d, DV.at(h, t));
      }
    }
  });
}

}  // namespace gpt1
