// Hopper warpgroup MMA (wgmma) building blocks: shared-memory matrix descriptors and the
// fence / commit / wait protocol. Every instruction here exists only on sm_90a; including
// this header for any other target is a compile error rather than a ptxas failure.
//
// Descriptor layout (PTX ISA, "Matrix Descriptor Format"), 64 bits:
//
//   bits  0..13  start address in shared memory, >> 4
//   bits 16..29  leading dimension byte offset (LBO), >> 4
//   bits 32..45  stride dimension byte offset (SBO), >> 4
//   bits 49..51  matrix base offset (0: only swizzled layouts use it)
//   bits 62..63  swizzle mode (0: none, the "interleaved" layout used here)
//
// Without swizzling, a K-major operand is a grid of 8x8 bf16 "core matrices", each 8 rows
// of 16 contiguous bytes (128 bytes in all). LBO is the byte distance between core
// matrices that are neighbours along K, SBO the distance between neighbours along M (or N).
#pragma once

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "af3/wgmma.cuh needs sm_90a: wgmma.mma_async exists only on the Hopper arch-specific target"
#endif

namespace af3 {
namespace wgmma {

__device__ __forceinline__ unsigned long long matrix_descriptor(const void* shared,
                                                                unsigned leading_byte_offset,
                                                                unsigned stride_byte_offset) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  unsigned long long descriptor = 0;
  descriptor |= static_cast<unsigned long long>((address & 0x3ffffu) >> 4);
  descriptor |= static_cast<unsigned long long>((leading_byte_offset & 0x3ffffu) >> 4) << 16;
  descriptor |= static_cast<unsigned long long>((stride_byte_offset & 0x3ffffu) >> 4) << 32;
  return descriptor;
}

// Makes ordinary shared-memory stores of this thread visible to the async proxy (the
// tensor cores read operands through it). Each writing thread issues it before the barrier.
__device__ __forceinline__ void fence_shared_for_async_proxy() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Orders earlier register and shared-memory accesses before the next wgmma.mma_async.
__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most `Pending` committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}

// D (64x8 fp32) = A (64x16 bf16, K-major) * B (16x8 bf16, K-major) + (accumulate ? D : 0).
// Both operands are read from shared memory through their descriptors. Accumulator fragment
// of thread t (warp w = t / 32, group g = (t % 32) / 4, pair q = t % 4):
//   d[0] = D[16w + g][2q]      d[1] = D[16w + g][2q + 1]
//   d[2] = D[16w + g + 8][2q]  d[3] = D[16w + g + 8][2q + 1]
__device__ __forceinline__ void mma_m64n8k16_f32_bf16(float (&d)[4],
                                                      unsigned long long a_descriptor,
                                                      unsigned long long b_descriptor,
                                                      int accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(a_descriptor), "l"(b_descriptor), "r"(accumulate)
      : "memory");
}

}  // namespace wgmma
}  // namespace af3
