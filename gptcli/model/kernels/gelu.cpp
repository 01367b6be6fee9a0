// GPT-1's GELU (the tanh form) on CPU, forward and backward, in one pass each: compiled on first use by
// gptcli/model/kernels/native.py (bindings.cpp), wrapped for autograd by gptcli/model/kernels/gelu.py.
//
// Reference: F.gelu(x, approximate="tanh") and its backward (PyTorch's GeluKernel.cpp), the same formulas:
//   y  = x/2 · (1 + tanh(u)),                    u = √(2/π) · (x + 0.044715 x³)
//   dy = 1/2 · (1 + tanh(u)) + x/2 · (1 − tanh²(u)) · √(2/π) · (1 + 3 · 0.044715 x²)
// PyTorch evaluates tanh with SLEEF's vectorised tanhf, which costs several times its erf-GELU (docs/performance.md,
// "Kernels"). Here tanh is a rational function (Eigen's fast float tanh: a degree-13 odd polynomial over a degree-6
// even one, u clamped to ±7.9), a few float ulps from tanhf with nothing but multiplies, adds and one division, so the
// compiler vectorises the loops; at::parallel_for spreads them over PyTorch's intra-op threads (built with -fopenmp).

#include "elementwise.h"

namespace {

using gpt1::kGrain;
using gpt1::load;
using gpt1::store;

constexpr float kBeta = 0.7978845608028654f;  // √(2/π)
constexpr float kKappa = 0.044715f;
inline float fast_tanh(float x) {
  // Beyond ±7.9 tanh is ±1 to float precision. A NaN fails both comparisons and stays NaN.
  const float clamp = 7.90531110763549805f;
  x = x < -clamp ? -clamp : (x > clamp ? clamp : x);
  const float x2 = x * x;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 - 8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  return x * p / q;
}

template <typename T>
void forward_loop(const T* __restrict x, T* __restrict y, int64_t n) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float v = load(x, i);
      const float t = fast_tanh(kBeta * (v + kKappa * v * v * v));
      store(y, i, 0.5f * v * (1.0f + t));
    }
  });
}

template <typename T>
void backward_loop(const T* __restrict grad, const T* __restrict x, T* __restrict dx, int64_t n) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float v = load(x, i);
      const float v2 = v * v;
      const float t = fast_tanh(kBeta * (v + kKappa * v2 * v));
      const float slope = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kBeta * (1.0f + 3.0f * kKappa * v2);
      store(dx, i, load(grad, i) * slope);
    }
  });
}

}  // namespace

namespace gpt1 {

at::Tensor gelu_forward(const at::Tensor& x) {
  check(x, "x");
  const auto xc = x.contiguous();
  auto y = at::empty_like(xc, at::MemoryFormat::Contiguous);
  dispatch(xc.scalar_type(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    forward_loop(static_cast<const T*>(xc.data_ptr()), static_cast<T*>(y.data_ptr()), xc.numel());
  });
  return y;
}

at::Tensor gelu_backward(const at::Tensor& grad, const at::Tensor& x) {
  check(x, "x");
  check(grad, "grad");
  TORCH_CHECK(grad.scalar_type() == x.scalar_type(), "grad and x must have one dtype");
  TORCH_CHECK(grad.sizes() == x.sizes(), "grad and x must have one shape");
  const auto xc = x.contiguous();
  const auto gc = grad.contiguous();
  auto dx = at::empty_like(xc, at::MemoryFormat::Contiguous);
  dispatch(xc.scalar_type(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    backward_loop(static_cast<const T*>(gc.data_ptr()), static_cast<const T*>(xc.data_ptr()),
                  static_cast<T*>(dx.data_ptr()), xc.numel());
  });
  return dx;
}

}  // namespace gpt1
