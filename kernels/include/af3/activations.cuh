// Pointwise activations in fp32, shared by the gating kernels.
//
// AF3_FAST_EXP=1 (a manifest define) switches to the hardware exponential `__expf`, a few
// ulp of fp32 away from `expf`: invisible once the result is rounded to bf16.
#pragma once

#ifndef AF3_FAST_EXP
#define AF3_FAST_EXP 0
#endif

namespace af3 {

__device__ __forceinline__ float exp_f32(float x) {
#if AF3_FAST_EXP
  return __expf(x);
#else
  return expf(x);
#endif
}

// 1 / (1 + e^-x): for very negative x, e^-x overflows to +inf and the quotient is exactly 0.
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

__device__ __forceinline__ float silu(float x) { return x * sigmoid(x); }

}  // namespace af3
