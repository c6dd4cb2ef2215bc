// Warp- and block-wide reductions for the row kernels (one block per row).
//
// block_sum / block_max return the reduced value to every thread of the block, so callers
// need no extra broadcast. They may be called back to back: each call first waits until the
// previous call's readers are done with the shared scratch.
#pragma once

#include "af3/common.cuh"

namespace af3 {

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename Op>
__device__ __forceinline__ float warp_reduce(float value, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

template <int BlockSize, typename Op>
__device__ __forceinline__ float block_reduce(float value, Op op, float identity) {
  static_assert(BlockSize % 32 == 0, "block reductions need whole warps");
  static_assert(BlockSize <= 1024, "a block has at most 1024 threads");
  constexpr int kWarps = BlockSize / 32;
  __shared__ float partial[kWarps];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  value = warp_reduce(value, op);
  __syncthreads();  // the previous call's readers are done with `partial`
  if (lane == 0) {
    partial[warp] = value;
  }
  __syncthreads();
  // Every warp reduces the per-warp partials itself, so all threads end with the total.
  value = lane < kWarps ? partial[lane] : identity;
  return warp_reduce(value, op);
}

template <int BlockSize>
__device__ __forceinline__ float block_sum(float value) {
  return block_reduce<BlockSize>(value, SumOp(), 0.0f);
}

template <int BlockSize>
__device__ __forceinline__ float block_max(float value) {
  return block_reduce<BlockSize>(value, MaxOp(), __int_as_float(0xff800000));  // -inf
}

}  // namespace af3
