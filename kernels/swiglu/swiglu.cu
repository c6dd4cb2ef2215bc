// Fused SwiGLU of the AlphaFold3 transition block.
//
//   in  [rows, 2 * hidden] bf16: a = in[r, 0:hidden], b = in[r, hidden:2 * hidden]
//   out [rows, hidden]     bf16: out[r, c] = silu(a[r, c]) * b[r, c], in fp32
//
// Fusing the split, the activation and the product saves two round trips of the
// [rows, hidden] intermediate through global memory. One thread per output element,
// grid-stride so any grid size is correct.
#include <cuda_bf16.h>

#include "af3/activations.cuh"
#include "af3/common.cuh"

#ifndef BLOCK_SIZE
#error "BLOCK_SIZE must be defined: kernels.toml passes it as -DBLOCK_SIZE=<threads per block>"
#endif

extern "C" __global__ void __launch_bounds__(BLOCK_SIZE)
    swiglu(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ in, int rows,
           int hidden) {
  const af3::index_t total = static_cast<af3::index_t>(rows) * hidden;
  for (af3::index_t i = af3::global_thread_index(); i < total; i += af3::grid_stride()) {
    const af3::index_t row = i / hidden;
    const af3::index_t column = i - row * hidden;
    const af3::index_t a_index = row * 2 * hidden + column;
    const float a = af3::load_bf16(in, a_index);
    const float b = af3::load_bf16(in, a_index + hidden);
    af3::store_bf16(out, i, af3::silu(a) * b);
  }
}
