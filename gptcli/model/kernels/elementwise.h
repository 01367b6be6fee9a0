// What the elementwise loops of this folder share: float32 and bf16 loads and stores (bf16 widened to float and
// rounded back to nearest-even, as PyTorch's own kernels do), the dtype dispatch and the argument checks.
#pragma once

// The light ATen headers, not <torch/extension.h>: that one (the whole C++ frontend and pybind11) takes about ten
// times as long to parse per file; bindings.cpp, the Python module, includes <torch/python.h> instead.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <cstdint>
#include <cstring>

namespace gpt1 {

constexpr int64_t kGrain = 16384;  // elements per parallel task

inline float load(const float* p, int64_t i) { return p[i]; }

inline float load(const uint16_t* p, int64_t i) {  // bf16: the top half of a float
  const uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline void store(float* p, int64_t i, float f) { p[i] = f; }

inline void store(uint16_t* p, int64_t i, float f) {  // float to bf16, round to nearest even; NaN stays NaN
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  p[i] = static_cast<uint16_t>(nan ? ((bits >> 16) | 0x40u) : rounded);
}

inline void check(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16,
              name, " must be float32 or bfloat16");
}

// Runs f(float*) or f(uint16_t*)-typed work: `call(tag)` with a null pointer of the element type.
template <typename Fn>
void dispatch(at::ScalarType dtype, Fn call) {
  if (dtype == at::kBFloat16) call(static_cast<uint16_t*>(nullptr)); else call(static_cast<float*>(nullptr));
}

}  // namespace gpt1
