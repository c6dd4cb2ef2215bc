// Softmax of triangle attention with pair bias and key mask, over the last dimension.
//
//   logits [batch, heads, n, n] fp32   (query i, key j)
//   bias   [heads, n, n]        fp32   pair bias, shared by the batch
//   mask   [batch, n]           fp32   key mask: 0 masks key j out, anything else keeps it
//   out    [batch, heads, n, n] fp32
//
//   x[j]   = fma(logits[b, h, i, j], scale, bias[h, i, j])   for kept keys
//   out[j] = exp(x[j] - max_k x[k]) / sum_k exp(x[k] - max)   for kept keys, exactly 0 otherwise
//
// A row whose keys are all masked is all zeros (not NaN). Masking is applied by exclusion
// rather than by adding a large negative bias, so masked probabilities are exactly 0 and a
// fully masked row cannot turn into a uniform distribution.
//
// One block of BLOCK_SIZE threads per (b, h, i) row, launched as a 1-D grid of
// batch * heads * n blocks.
#include "af3/common.cuh"
#include "af3/reduce.cuh"

#ifndef BLOCK_SIZE
#error "BLOCK_SIZE must be defined: kernels.toml passes it as -DBLOCK_SIZE=<threads per block>"
#endif

extern "C" __global__ void __launch_bounds__(BLOCK_SIZE)
    masked_softmax_pair_bias(float* __restrict__ out, const float* __restrict__ logits,
                             const float* __restrict__ bias, const float* __restrict__ mask,
                             int batch, int heads, int n, float scale) {
  const af3::index_t row = blockIdx.x;  // flattened (b, h, i)
  if (row >= static_cast<af3::index_t>(batch) * heads * n) {
    return;  // uniform across the block
  }
  const af3::index_t query = row % n;
  const af3::index_t head = (row / n) % heads;
  const af3::index_t item = row / (static_cast<af3::index_t>(n) * heads);

  const float* row_logits = logits + row * n;
  const float* row_bias = bias + (head * n + query) * n;
  const float* key_mask = mask + item * n;
  float* row_out = out + row * n;
  const float negative_infinity = __int_as_float(0xff800000);

  float maximum = negative_infinity;
  for (int j = threadIdx.x; j < n; j += BLOCK_SIZE) {
    if (key_mask[j] != 0.0f) {
      maximum = fmaxf(maximum, __fmaf_rn(row_logits[j], scale, row_bias[j]));
    }
  }
  maximum = af3::block_max<BLOCK_SIZE>(maximum);
  if (maximum == negative_infinity) {
    // Every key is masked (block-uniform, since all threads hold the same maximum).
    for (int j = threadIdx.x; j < n; j += BLOCK_SIZE) {
      row_out[j] = 0.0f;
    }
    return;
  }

  float sum = 0.0f;
  for (int j = threadIdx.x; j < n; j += BLOCK_SIZE) {
    if (key_mask[j] != 0.0f) {
      sum += expf(__fmaf_rn(row_logits[j], scale, row_bias[j]) - maximum);
    }
  }
  sum = af3::block_sum<BLOCK_SIZE>(sum);

  for (int j = threadIdx.x; j < n; j += BLOCK_SIZE) {
    const float probability =
        key_mask[j] != 0.0f ? expf(__fmaf_rn(row_logits[j], scale, row_bias[j]) - maximum) / sum
                            : 0.0f;
    row_out[j] = probability;
  }
}
