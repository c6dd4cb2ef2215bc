// LayerNorm over the last dimension of a row-major [rows, cols] bf16 tensor.
//
//   out[r, c] = (in[r, c] - mean_r) * rsqrt(var_r + eps) * gamma[c] + beta[c]
//
// One block of BLOCK_SIZE threads per row; statistics in fp32 with the two-pass variance
// (mean first, then the mean of squared deviations), which stays accurate for rows with a
// large mean. The row is re-read from global memory (L1/L2 hits) instead of being staged,
// so any `cols` works without dynamic shared memory.
#include <cuda_bf16.h>

#include "af3/common.cuh"
#include "af3/reduce.cuh"

#ifndef BLOCK_SIZE
#error "BLOCK_SIZE must be defined: kernels.toml passes it as -DBLOCK_SIZE=<threads per block>"
#endif

extern "C" __global__ void __launch_bounds__(BLOCK_SIZE)
    layernorm_bf16(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ in,
                   const __nv_bfloat16* __restrict__ gamma, const __nv_bfloat16* __restrict__ beta,
                   int rows, int cols, float eps) {
  const int row = blockIdx.x;
  if (row >= rows) {
    return;  // uniform across the block, so no barrier is skipped by part of it
  }
  const af3::index_t base = static_cast<af3::index_t>(row) * cols;

  float sum = 0.0f;
  for (int c = threadIdx.x; c < cols; c += BLOCK_SIZE) {
    sum += af3::load_bf16(in, base + c);
  }
  const float mean = af3::block_sum<BLOCK_SIZE>(sum) / static_cast<float>(cols);

  float squares = 0.0f;
  for (int c = threadIdx.x; c < cols; c += BLOCK_SIZE) {
    const float centered = af3::load_bf16(in, base + c) - mean;
    squares += centered * centered;
  }
  const float variance = af3::block_sum<BLOCK_SIZE>(squares) / static_cast<float>(cols);
  const float inverse_std = rsqrtf(variance + eps);

  for (int c = threadIdx.x; c < cols; c += BLOCK_SIZE) {
    const float normalized = (af3::load_bf16(in, base + c) - mean) * inverse_std;
    af3::store_bf16(out, base + c,
                    normalized * af3::load_bf16(gamma, c) + af3::load_bf16(beta, c));
  }
}
