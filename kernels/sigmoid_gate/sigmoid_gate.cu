// Output gating of AlphaFold3's attention and triangle updates: out = x * sigmoid(gate),
// elementwise over `count` bf16 values, fp32 math. Grid-stride, one element per thread.
#include <cuda_bf16.h>

#include "af3/activations.cuh"
#include "af3/common.cuh"

#ifndef BLOCK_SIZE
#error "BLOCK_SIZE must be defined: kernels.toml passes it as -DBLOCK_SIZE=<threads per block>"
#endif

extern "C" __global__ void __launch_bounds__(BLOCK_SIZE)
    sigmoid_gate(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ x,
                 const __nv_bfloat16* __restrict__ gate, int count) {
  for (af3::index_t i = af3::global_thread_index(); i < count; i += af3::grid_stride()) {
    af3::store_bf16(out, i, af3::load_bf16(x, i) * af3::sigmoid(af3::load_bf16(gate, i)));
  }
}
