// bf16 matrix product on Hopper tensor cores through wgmma.mma_async (sm_90a only):
//
//   c [m, n] fp32 = a [m, k] bf16 * b [k, n] bf16, fp32 accumulation
//
// All three matrices are row-major in global memory. Each block is one warpgroup
// (BLOCK_SIZE = 128 threads) and owns a TILE_M x TILE_N = 64 x 8 tile of C; it walks K in
// steps of TILE_K = 16, one m64n8k16 wgmma per step. Launch with
// grid = (ceil(n / TILE_N), ceil(m / TILE_M), 1). Tails in m, n and k are zero-filled.
//
// Shared-memory layouts (no swizzle, both operands K-major, so imm-trans-a/b = 0):
//
//   A tile, 64 x 16: 8 x 2 core matrices of 8 rows x 8 bf16 (16 bytes per row, 128 bytes
//   per core matrix). Element (row, kk) sits at element offset
//       (row / 8) * 128 + (kk / 8) * 64 + (row % 8) * 8 + (kk % 8)
//   so the K-neighbour core matrix is 128 bytes away (LBO) and the next 8 rows are 256
//   bytes away (SBO).
//
//   B tile, 16 x 8, stored transposed (column n of B becomes a K-contiguous row), which is
//   what "K-major B" means: element (kk, column) sits at element offset
//       (kk / 8) * 64 + column * 8 + (kk % 8)
//   i.e. one column of 2 core matrices, LBO = 128 bytes (SBO = 256 bytes, unused at N = 8).
//
// The transpose of B happens while staging it, so callers keep plain row-major tensors.
#include <cuda_bf16.h>

#include "af3/common.cuh"
#include "af3/wgmma.cuh"

#if !defined(BLOCK_SIZE) || !defined(TILE_M) || !defined(TILE_N) || !defined(TILE_K)
#error "BLOCK_SIZE, TILE_M, TILE_N and TILE_K must be defined by kernels.toml"
#endif
#if BLOCK_SIZE != 128 || TILE_M != 64 || TILE_N != 8 || TILE_K != 16
#error "wgmma_matmul_bf16 is written for one warpgroup (128 threads) and m64n8k16 tiles"
#endif

namespace {

constexpr unsigned kCoreMatrixBytes = 8 * 16;
constexpr unsigned kLeadingByteOffset = kCoreMatrixBytes;     // next core matrix along K
constexpr unsigned kStrideByteOffset = 2 * kCoreMatrixBytes;  // next 8 rows (TILE_K / 8 = 2)

__device__ __forceinline__ int core_matrix_offset(int row, int kk) {
  return (row / 8) * 128 + (kk / 8) * 64 + (row % 8) * 8 + (kk % 8);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(BLOCK_SIZE)
    wgmma_matmul_bf16(float* __restrict__ c, const __nv_bfloat16* __restrict__ a,
                      const __nv_bfloat16* __restrict__ b, int m, int n, int k) {
  __shared__ __align__(128) __nv_bfloat16 a_tile[TILE_M * TILE_K];
  __shared__ __align__(128) __nv_bfloat16 b_tile[TILE_N * TILE_K];

  const int thread = threadIdx.x;
  const int row0 = blockIdx.y * TILE_M;
  const int column0 = blockIdx.x * TILE_N;
  const __nv_bfloat16 zero = __float2bfloat16_rn(0.0f);

  const unsigned long long a_descriptor =
      af3::wgmma::matrix_descriptor(a_tile, kLeadingByteOffset, kStrideByteOffset);
  const unsigned long long b_descriptor =
      af3::wgmma::matrix_descriptor(b_tile, kLeadingByteOffset, kStrideByteOffset);

  float accumulator[4] = {0.0f, 0.0f, 0.0f, 0.0f};

  for (int k0 = 0; k0 < k; k0 += TILE_K) {
    for (int e = thread; e < TILE_M * TILE_K; e += BLOCK_SIZE) {
      const int row = e / TILE_K;
      const int kk = e % TILE_K;
      const int global_row = row0 + row;
      const int global_k = k0 + kk;
      a_tile[core_matrix_offset(row, kk)] =
          global_row < m && global_k < k
              ? a[static_cast<af3::index_t>(global_row) * k + global_k]
              : zero;
    }
    for (int e = thread; e < TILE_K * TILE_N; e += BLOCK_SIZE) {
      const int kk = e / TILE_N;
      const int column = e % TILE_N;  // consecutive threads read one row of B
      const int global_k = k0 + kk;
      const int global_column = column0 + column;
      b_tile[core_matrix_offset(column, kk)] =
          global_k < k && global_column < n
              ? b[static_cast<af3::index_t>(global_k) * n + global_column]
              : zero;
    }
    // The tensor cores read the tiles through the async proxy: make this thread's
    // generic-proxy stores visible to it, then wait for every thread's stores.
    af3::wgmma::fence_shared_for_async_proxy();
    __syncthreads();

    af3::wgmma::fence();
    af3::wgmma::mma_m64n8k16_f32_bf16(accumulator, a_descriptor, b_descriptor, 1);
    af3::wgmma::commit_group();
    af3::wgmma::wait_group<0>();
    __syncthreads();  // the tiles are overwritten by the next step
  }

  // Accumulator fragment: see mma_m64n8k16_f32_bf16 in af3/wgmma.cuh.
  const int warp = thread / 32;
  const int group = (thread % 32) / 4;
  const int pair = thread % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int global_row = row0 + 16 * warp + group + 8 * half;
#pragma unroll
    for (int column = 0; column < 2; ++column) {
      const int global_column = column0 + 2 * pair + column;
      if (global_row < m && global_column < n) {
        c[static_cast<af3::index_t>(global_row) * n + global_column] =
            accumulator[2 * half + column];
      }
    }
  }
}
