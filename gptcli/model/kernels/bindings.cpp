// The Python module of the compiled kernels (gptcli/model/kernels/native.py builds it from every .cpp here).

// <torch/python.h>: pybind11 and its Tensor casters, without the C++ frontend <torch/extension.h> adds, which makes
// this file markedly quicker to compile.
#include <torch/python.h>

#include "vector.h"

namespace gpt1 {
torch::Tensor gelu_forward(const torch::Tensor& x);
torch::Tensor gelu_backward(const torch::Tensor& grad, const torch::Tensor& x);
torch::Tensor dropout_apply(const torch::Tensor& x, int64_t seed, int64_t threshold, double scale, torch::Tensor out,
                            bool vector);
torch::Tensor dropout_mask(torch::Tensor out, int64_t seed, int64_t threshold);
std::vector<torch::Tensor> nll_forward(const torch::Tensor& logits, const torch::Tensor& targets, int64_t classes,
                                       int64_t ignore);
torch::Tensor nll_backward(const torch::Tensor& logits, const torch::Tensor& targets, const torch::Tensor& lse,
                           const torch::Tensor& weight, int64_t classes, torch::Tensor out);
torch::Tensor softmax_backward(torch::Tensor dp, const torch::Tensor& d, const torch::Tensor& p);
torch::Tensor softmax_forward(torch::Tensor s, const std::optional<torch::Tensor>& d, int64_t seed, int64_t threshold,
                              int64_t causal_offset);
bool fused_attention_available();
void fused_attention_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             torch::Tensor out, torch::Tensor lse, int64_t seed, int64_t threshold, double scale,
                             int64_t rows);
void fused_attention_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& out, const torch::Tensor& grad, const torch::Tensor& lse,
                              torch::Tensor dq, torch::Tensor dk, torch::Tensor dv, int64_t seed, int64_t threshold,
                              double scale, int64_t rows);
torch::Tensor transpose_bf16(const torch::Tensor& x, torch::Tensor out);
torch::Tensor transpose_f32(const torch::Tensor& x, torch::Tensor out);
torch::Tensor column_sums(const torch::Tensor& x, torch::Tensor out);
}  // namespace gpt1

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gelu_forward", &gpt1::gelu_forward, "GPT-1's tanh-GELU of a float32 or bfloat16 CPU tensor (gelu.cpp)");
  m.def("gelu_backward", &gpt1::gelu_backward, "the gradient of gelu_forward's input given its output's");
  m.def("dropout_apply", &gpt1::dropout_apply, "x * scale where the (seed, threshold) mask keeps it, else 0, into out",
        py::arg("x"), py::arg("seed"), py::arg("threshold"), py::arg("scale"), py::arg("out"), py::arg("vector") = true);
  m.def("dropout_mask", &gpt1::dropout_mask, "the (seed, threshold) keep mask, 1 or 0, into out");
  m.def("nll_forward", &gpt1::nll_forward, "(nll, lse) per row of the logits' first `classes` columns (loss.cpp)",
        py::arg("logits"), py::arg("targets"), py::arg("classes"), py::arg("ignore"));
  m.def("nll_backward", &gpt1::nll_backward, "the logits' gradient weight * (softmax - one_hot(target)) into out",
        py::arg("logits"), py::arg("targets"), py::arg("lse"), py::arg("weight"), py::arg("classes"), py::arg("out"));
  m.def("softmax_backward", &gpt1::softmax_backward, "ds = d*dp - p*rowsum(d*dp), over dp (softmax.cpp)",
        py::arg("dp"), py::arg("d"), py::arg("p"));
  m.def("softmax_forward", &gpt1::softmax_forward,
        "p = softmax(s) over s, causal from causal_offset (< 0: none), and d = p where the dropout mask keeps it "
        "(softmax.cpp)",
        py::arg("s"), py::arg("d"), py::arg("seed"), py::arg("threshold"), py::arg("causal_offset"));
  m.def("fused_attention_available", &gpt1::fused_attention_available,
        "whether fused_attention_forward/backward run here: vector loops built and a BLAS sgemm_ to call");
  m.def("fused_attention_forward", &gpt1::fused_attention_forward,
        "out and lse of float32 causal attention over blocks of `rows` queries (fused_attention.cpp)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("seed"),
        py::arg("threshold"), py::arg("scale"), py::arg("rows"));
  m.def("fused_attention_backward", &gpt1::fused_attention_backward,
        "dq, dk, dv of fused_attention_forward from the output's gradient (fused_attention.cpp)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("grad"), py::arg("lse"), py::arg("dq"),
        py::arg("dk"), py::arg("dv"), py::arg("seed"), py::arg("threshold"), py::arg("scale"), py::arg("rows"));
  m.def("transpose_bf16", &gpt1::transpose_bf16, "x[:, :out.size(0)].t() of a contiguous 2-D bfloat16 x into "
        "out, bfloat16 or float32 (transpose.cpp)", py::arg("x"), py::arg("out"));
  m.def("transpose_f32", &gpt1::transpose_f32, "x[:, :out.size(0)].t() of a contiguous 2-D float32 x into a "
        "float32 out (transpose.cpp)", py::arg("x"), py::arg("out"));
  m.def("column_sums", &gpt1::column_sums, "x.sum(0) in float32, each column in row order, of a contiguous 2-D "
        "bfloat16 or float32 x into out (column_sums.cpp)", py::arg("x"), py::arg("out"));
  m.def("vectorised", [] { return GPT1_VECTOR_ROWS == 1; },
        "whether the vector loops were built, with AVX-512 or AVX2 (vector.h): the loss, softmax_forward and "
        "softmax_backward, dropout_apply's");
  m.def("vector_isa", [] { return std::string(GPT1_AVX512 ? "avx512" : GPT1_AVX2 ? "avx2" : ""); },
        "the vector instructions the loops were built with: avx512, avx2 or ''");
}
