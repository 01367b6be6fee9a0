// A transposed copy of a bf16 matrix, into bf16 or float32: what the AMX weight gradient (linear.py) needs; and of
// a float32 matrix, for oneDNN's float32 products on CPUs with full-width AVX-512 (onednn.py).
//
// oneDNN runs a bf16 product whose left operand is a transposed view (autograd's weight gradient gᵀ·x, which
// contracts over the positions, the rows of both operands) far below its speed on a dense operand; a dense
// transposed copy of the narrower operand makes the product the fast kind. PyTorch's own `.t().contiguous()` of a
// bf16 matrix copies element by element, many times slower than a plain copy, which ate the product's gain; here
// 16 × 16 tiles are transposed in AVX-512 registers, widened to 32-bit lanes (bf16 → float is a 16-bit shift, and
// back is exact since the values were bf16), so one routine writes either dtype. Outside AVX-512 (and for the tails
// of rows and columns that do not fill a tile) a plain tiled scalar loop computes the same copy: it is exact either
// way, only the speed differs.

#include <cstdint>
#include <type_traits>

#include "vector.h"

namespace gpt1 {
namespace {

constexpr int64_t kTile = 16;

// Scalar copy of src's block [r0, r1) × [c0, c1) into dst transposed (dst[c][r] = src[r][c]): bf16 bits or floats
// as they are, or bf16 widened by elementwise.h's load.
template <typename Src, typename Out>
void scalar_block(const Src* src, int64_t cols, Out* dst, int64_t rows, int64_t r0, int64_t r1, int64_t c0,
                  int64_t c1) {
  for (int64_t c = c0; c < c1; ++c)
    for (int64_t r = r0; r < r1; ++r) {
      if constexpr (std::is_same_v<Out, float> && std::is_same_v<Src, uint16_t>)
        dst[c * rows + r] = load(src, r * cols + c);
      else
        dst[c * rows + r] = src[r * cols + c];
    }
}

#if GPT1_AVX512
// The 16 × 16 tile of 32-bit lanes in v transposed in place: the classic three stages (32-bit unpacks, 64-bit
// unpacks, two 128-bit lane shuffles).
inline void transpose16(__m512i v[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    v[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    v[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    v[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    v[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(v[i], v[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(v[i], v[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(v[i + 8], v[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(v[i + 8], v[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    v[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    v[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
  }
}

// One full tile: src's rows r..r+15, columns c..c+15 into dst's rows c..c+15, columns r..r+15. A float32 source
// is moved as its bits (no arithmetic: NaN payloads, signed zeros and subnormals as they are).
template <typename Src, typename Out>
inline void tile(const Src* src, int64_t cols, Out* dst, int64_t rows, bool stream) {
  constexpr bool wide = std::is_same_v<Src, float>;
  __m512i v[16];
  for (int i = 0; i < 16; ++i) {
    if constexpr (wide)
      v[i] = _mm512_loadu_si512(src + i * cols);
    else
      v[i] = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i * cols)));
  }
  transpose16(v);
  for (int i = 0; i < 16; ++i) {
    if constexpr (std::is_same_v<Out, float>) {
      const __m512i bits = wide ? v[i] : _mm512_slli_epi32(v[i], 16);
      if (stream)
        _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i * rows), bits);
      else
        _mm512_storeu_si512(dst + i * rows, bits);
    }
    else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i * rows), _mm512_cvtepi32_epi16(v[i]));
    }
  }
}
#endif

// The tile at src's rows [r, r + 16), columns [c0, c1) into dst: the vector form where it is a full tile.
template <typename Src, typename Out>
inline void block(const Src* src, int64_t rows, int64_t cols, Out* dst, int64_t r, int64_t r1, int64_t c0,
                  int64_t c1, bool stream) {
#if GPT1_AVX512
  if (c1 - c0 == kTile && r1 - r == kTile) {
    tile(src + r * cols + c0, cols, dst + c0 * rows + r, rows, stream);
    return;
  }
#endif
  scalar_block(src, cols, dst, rows, r, r1, c0, c1);
}

// dst (used × rows) = the first `used` columns of src (rows × cols), transposed. Parallel over bands of 64 source
// columns (four tiles side by side, so each 128-byte run of a source row is read once, whole), each walking down
// the rows: a band writes 64 destination rows, a few dozen pages, and reads each source row's run once. Strips of
// 16 source rows read end to end instead wrote across the whole destination per strip (a 3 KB stride in the output
// layer's 40,478 × 768 gradient: a new page every row); bands of 16 columns read every source line twice. A float32
// destination whose rows are whole 64-byte lines is written with streaming stores, which skip reading each line
// before overwriting it: the output layer's gradient the most markedly.
constexpr int64_t kBand = 4 * kTile;

template <typename Src, typename Out>
void transpose(const Src* src, int64_t rows, int64_t cols, int64_t used, Out* dst) {
  const int64_t bands = (used + kBand - 1) / kBand;
  const bool stream = std::is_same_v<Out, float> && rows % kTile == 0 && reinterpret_cast<uintptr_t>(dst) % 64 == 0;
  at::parallel_for(0, bands, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t band_end = std::min(used, (b + 1) * kBand);
      for (int64_t r = 0; r < rows; r += kTile)
        for (int64_t c0 = b * kBand; c0 < band_end; c0 += kTile)
          block(src, rows, cols, dst, r, std::min(rows, r + kTile), c0, std::min(band_end, c0 + kTile), stream);
    }
#if GPT1_AVX512
    _mm_sfence();
#endif
  });
}

}  // namespace

// out = x[:, :out.size(0)].t() for a contiguous 2-D bf16 x, written into a contiguous out of x's transposed shape
// (or fewer rows: the padded output layer's gradient drops its padding so), bf16 or float32.
at::Tensor transpose_bf16(const at::Tensor& x, at::Tensor out) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kBFloat16 && x.device().is_cpu(),
              "x must be a contiguous 2-D bfloat16 CPU tensor");
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.device().is_cpu() && out.size(0) <= x.size(1) &&
                  out.size(1) == x.size(0),
              "out must be contiguous, of x's transposed shape (or fewer rows)");
  const auto* src = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const int64_t rows = x.size(0), cols = x.size(1), used = out.size(0);
  if (out.scalar_type() == at::kFloat)
    transpose(src, rows, cols, used, out.data_ptr<float>());
  else if (out.scalar_type() == at::kBFloat16)
    transpose(src, rows, cols, used, reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()));
  else
    TORCH_CHECK(false, "out must be bfloat16 or float32");
  return out;
}

// out = x[:, :out.size(0)].t() for a contiguous 2-D float32 x, into a contiguous float32 out: the same tiles and
// bands as the bf16 source's, for oneDNN's float32 products (onednn.py), which copy a transposed view themselves
// far slower (PyTorch's strided copy).
at::Tensor transpose_f32(const at::Tensor& x, at::Tensor out) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "x must be a contiguous 2-D float32 CPU tensor");
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.device().is_cpu() && out.scalar_type() == at::kFloat &&
                  out.size(0) <= x.size(1) && out.size(1) == x.size(0),
              "out must be contiguous float32, of x's transposed shape (or fewer rows)");
  transpose(x.data_ptr<float>(), x.size(0), x.size(1), out.size(0), out.data_ptr<float>());
  return out;
}

}  // namespace gpt1
