// Backward of the output gate out = x * sigmoid(gate), elementwise over `count` bf16 values,
// fp32 math, both gradients in one pass over the inputs:
//
//   s          = sigmoid(gate)
//   grad_x     = grad_out * s
//   grad_gate  = grad_out * x * s * (1 - s)
//
// Grid-stride, one element per thread, the same geometry as the forward kernel.
#include <cuda_bf16.h>

#include "af3/activations.cuh"
#include "af3/common.cuh"

#ifndef BLOCK_SIZE
#error "BLOCK_SIZE must be defined: kernels.toml passes it as -DBLOCK_SIZE=<threads per block>"
#endif

extern "C" __global__ void __launch_bounds__(BLOCK_SIZE)
    sigmoid_gate_backward(__nv_bfloat16* __restrict__ grad_x,
                          __nv_bfloat16* __restrict__ grad_gate,
                          const __nv_bfloat16* __restrict__ grad_out,
                          const __nv_bfloat16* __restrict__ x,
                          const __nv_bfloat16* __restrict__ gate, int count) {
  for (af3::index_t i = af3::global_thread_index(); i < count; i += af3::grid_stride()) {
    const float g = af3::load_bf16(grad_out, i);
    const float s = af3::sigmoid(af3::load_bf16(gate, i));
    af3::store_bf16(grad_x, i, g * s);
    af3::store_bf16(grad_gate, i, g * af3::load_bf16(x, i) * (s * (1.0f - s)));
  }
}
