// Element access shared by every kernel of the library: bf16 <-> fp32 conversion, typed
// loads/stores for the templated kernels, and grid-stride indexing.
//
// Only <cuda_bf16.h> comes from the toolkit: NVRTC has no host C++ headers, so nothing
// from the C or C++ standard library may be included here.
#pragma once

#include <cuda_bf16.h>

namespace af3 {

// Row and element counts are `int` at the kernel boundary; products of two of them are
// computed in 64 bits so that rows * cols may exceed 2^31.
typedef long long index_t;

__device__ __forceinline__ float to_float(float value) { return value; }

__device__ __forceinline__ float to_float(__nv_bfloat16 value) { return __bfloat162float(value); }

// Conversion back from the fp32 the kernels compute in. bf16 rounds to nearest even, which
// is what the CPU references in `kernels/reference` implement bit for bit.
template <typename T>
__device__ __forceinline__ T from_float(float value);

template <>
__device__ __forceinline__ float from_float<float>(float value) {
  return value;
}

template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float value) {
  return __float2bfloat16_rn(value);
}

__device__ __forceinline__ float load_bf16(const __nv_bfloat16* data, index_t index) {
  return __bfloat162float(data[index]);
}

__device__ __forceinline__ void store_bf16(__nv_bfloat16* data, index_t index, float value) {
  data[index] = __float2bfloat16_rn(value);
}

__device__ __forceinline__ index_t global_thread_index() {
  return static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ index_t grid_stride() {
  return static_cast<index_t>(gridDim.x) * blockDim.x;
}

}  // namespace af3
