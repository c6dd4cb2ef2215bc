// The op's CUDA implementation: a grid-stride kernel over fp32 or bf16, fp32 math, launched on
// torch's current stream (so it is captured by CUDA graphs), with the library's own device
// helpers (af3/common.cuh, af3/activations.cuh) that its cubin kernels use too.
#include <algorithm>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include "af3/activations.cuh"
#include "af3/common.cuh"
#include "gated_residual.h"

namespace af3_native {
namespace {

constexpr int kBlock = 256;

template <typename T>
__global__ void __launch_bounds__(kBlock)
    gated_residual_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ gate,
                          const T* __restrict__ residual, af3::index_t count) {
  for (af3::index_t i = af3::global_thread_index(); i < count; i += af3::grid_stride()) {
    const float value = af3::to_float(residual[i]) +
                        af3::to_float(x[i]) * af3::sigmoid(af3::to_float(gate[i]));
    out[i] = af3::from_float<T>(value);
  }
}

template <typename T>
void launch(Tensor& out, const Tensor& x, const Tensor& gate, const Tensor& residual,
            cudaStream_t stream) {
  const int64_t count = x.numel();
  // Grid-stride: at most 8 blocks per SM of a 132-SM part are enough to saturate it.
  const int64_t blocks = std::min<int64_t>((count + kBlock - 1) / kBlock, 132 * 8);
  gated_residual_kernel<T><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(
      static_cast<T*>(out.data_ptr()), static_cast<const T*>(x.data_ptr()),
      static_cast<const T*>(gate.data_ptr()), static_cast<const T*>(residual.data_ptr()), count);
  const cudaError_t error = cudaGetLastError();
  STD_TORCH_CHECK(error == cudaSuccess, "gated_residual: launch failed: ", cudaGetErrorString(error));
}

Tensor gated_residual_cuda(const Tensor& x, const Tensor& gate, const Tensor& residual) {
  check_gated_residual(x, gate, residual);
  Tensor out = torch::stable::empty_like(x);
  if (x.numel() == 0) return out;
  // The dispatcher does not make x's device current for a custom op: a tensor on cuda:1
  // must launch there, on that device's current stream.
  const torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(x.get_device_index(), &stream));
  if (x.scalar_type() == ScalarType::Float) {
    launch<float>(out, x, gate, residual, static_cast<cudaStream_t>(stream));
  } else {
    launch<__nv_bfloat16>(out, x, gate, residual, static_cast<cudaStream_t>(stream));
  }
  return out;
}

}  // namespace
}  // namespace af3_native

STABLE_TORCH_LIBRARY_IMPL(af3_native, CUDA, m) {
  m.impl("gated_residual", TORCH_BOX(&af3_native::gated_residual_cuda));
}
