// Per-row scaling, out[r, c] = in[r, c] * scale[r], for fp32 and bf16 tensors (fp32 math,
// one rounding for bf16). Used to apply per-token masks and weights.
//
// A templated __global__ cannot be extern "C": its entries are the mangled names of the
// explicit instantiations below, which callers reach through the name expressions
// "scale_rows<float>" and "scale_rows<__nv_bfloat16>".
#include <cuda_bf16.h>

#include "af3/common.cuh"

#ifndef BLOCK_SIZE
#error "BLOCK_SIZE must be defined: kernels.toml passes it as -DBLOCK_SIZE=<threads per block>"
#endif

template <typename T>
__global__ void __launch_bounds__(BLOCK_SIZE)
    scale_rows(T* __restrict__ out, const T* __restrict__ in, const float* __restrict__ scale,
               int rows, int cols) {
  const af3::index_t total = static_cast<af3::index_t>(rows) * cols;
  for (af3::index_t i = af3::global_thread_index(); i < total; i += af3::grid_stride()) {
    const af3::index_t row = i / cols;
    out[i] = af3::from_float<T>(af3::to_float(in[i]) * scale[row]);
  }
}

template __global__ void scale_rows<float>(float*, const float*, const float*, int, int);
template __global__ void scale_rows<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*,
                                                   const float*, int, int);
