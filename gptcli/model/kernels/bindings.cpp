// The Python module of the compiled kernels (gptcli/model/kernels/native.py builds it from every .cpp here).

#include <torch/extension.h>

namespace gpt1 {
torch::Tensor gelu_forward(const torch::Tensor& x);
torch::Tensor gelu_backward(const torch::Tensor& grad, const torch::Tensor& x);
torch::Tensor dropout_apply(const torch::Tensor& x, int64_t seed, int64_t threshold, double scale, torch::Tensor out,
                            bool vector);
bool dropout_vectorised();
torch::Tensor dropout_mask(torch::Tensor out, int64_t seed, int64_t threshold);
}  // namespace gpt1

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gelu_forward", &gpt1::gelu_forward, "GPT-1's tanh-GELU of a float32 or bfloat16 CPU tensor (gelu.cpp)");
  m.def("gelu_backward", &gpt1::gelu_backward, "the gradient of gelu_forward's input given its output's");
  m.def("dropout_apply", &gpt1::dropout_apply, "x * scale where the (seed, threshold) mask keeps it, else 0, into out",
        py::arg("x"), py::arg("seed"), py::arg("threshold"), py::arg("scale"), py::arg("out"), py::arg("vector") = true);
  m.def("dropout_vectorised", &gpt1::dropout_vectorised, "whether dropout_apply has its AVX-512 loop");
  m.def("dropout_mask", &gpt1::dropout_mask, "the (seed, threshold) keep mask, 1 or 0, into out");
}
