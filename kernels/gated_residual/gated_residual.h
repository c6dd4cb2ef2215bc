// AlphaFold3's gated residual update, out = residual + x * sigmoid(gate), as an extension
// module op on the LibTorch stable ABI: its launcher is C++ (checks, dtype dispatch, grid,
// torch's current stream), registered as `torch.ops.af3_native.gated_residual`.
// What the CPU (ops.cpp) and CUDA (gated_residual.cu) implementations share.
#pragma once

#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

namespace af3_native {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// Same dtype (fp32 or bf16), same number of elements, contiguous, same device.
inline void check_gated_residual(const Tensor& x, const Tensor& gate, const Tensor& residual) {
  const ScalarType dtype = x.scalar_type();
  STD_TORCH_CHECK(dtype == ScalarType::Float || dtype == ScalarType::BFloat16,
                  "gated_residual takes float32 or bfloat16 tensors");
  STD_TORCH_CHECK(gate.scalar_type() == dtype && residual.scalar_type() == dtype,
                  "gated_residual: x, gate and residual must have one dtype");
  STD_TORCH_CHECK(gate.numel() == x.numel() && residual.numel() == x.numel(),
                  "gated_residual: x, gate and residual must have the same number of elements");
  STD_TORCH_CHECK(x.is_contiguous() && gate.is_contiguous() && residual.is_contiguous(),
                  "gated_residual takes contiguous tensors");
  STD_TORCH_CHECK(gate.get_device_index() == x.get_device_index() &&
                      residual.get_device_index() == x.get_device_index(),
                  "gated_residual: x, gate and residual must be on one device");
}

}  // namespace af3_native
