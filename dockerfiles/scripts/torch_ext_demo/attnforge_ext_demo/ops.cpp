// A tiny torch C++ operator, built in the cpu reference stack by torch.utils.cpp_extension with
// g++ so that the linkage smoke check (attnforge/smoke_runner.py) checks a real extension.
// Registered with TORCH_LIBRARY, not pybind11: no Python headers are needed, and the light
// headers keep the compile short.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

namespace {
at::Tensor twice(const at::Tensor& x) { return x.mul(2); }
}  // namespace

TORCH_LIBRARY(attnforge_ext_demo, m) { m.def("twice(Tensor x) -> Tensor", &twice); }
