// The op's schema, its CPU implementation and its Meta (fake) one, which keeps a
// torch.compile graph whole through it.
#include <cmath>
#include <cstdint>
#include <cstring>

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include "gated_residual.h"

namespace af3_native {
namespace {

float bf16_to_float(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

// Round to nearest even, as __float2bfloat16_rn does on the GPU; NaN stays NaN.
uint16_t float_to_bf16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof word);
  if (std::isnan(value)) return static_cast<uint16_t>((word >> 16) | 0x40);
  word += 0x7fff + ((word >> 16) & 1);
  return static_cast<uint16_t>(word >> 16);
}

float gated(float x, float gate, float residual) {
  return residual + x * (1.0f / (1.0f + std::exp(-gate)));
}

Tensor gated_residual_cpu(const Tensor& x, const Tensor& gate, const Tensor& residual) {
  check_gated_residual(x, gate, residual);
  Tensor out = torch::stable::empty_like(x);
  const int64_t count = x.numel();
  if (x.scalar_type() == ScalarType::Float) {
    const float* xs = static_cast<const float*>(x.data_ptr());
    const float* gs = static_cast<const float*>(gate.data_ptr());
    const float* rs = static_cast<const float*>(residual.data_ptr());
    float* os = static_cast<float*>(out.data_ptr());
    for (int64_t i = 0; i < count; ++i) os[i] = gated(xs[i], gs[i], rs[i]);
  } else {
    const uint16_t* xs = static_cast<const uint16_t*>(x.data_ptr());
    const uint16_t* gs = static_cast<const uint16_t*>(gate.data_ptr());
    const uint16_t* rs = static_cast<const uint16_t*>(residual.data_ptr());
    uint16_t* os = static_cast<uint16_t*>(out.data_ptr());
    for (int64_t i = 0; i < count; ++i) {
      os[i] = float_to_bf16(gated(bf16_to_float(xs[i]), bf16_to_float(gs[i]), bf16_to_float(rs[i])));
    }
  }
  return out;
}

// No checks: under torch.compile with dynamic shapes the sizes are symbolic, which the stable
// ABI cannot read (numel() throws); the real implementations check when the graph runs.
Tensor gated_residual_meta(const Tensor& x, const Tensor&, const Tensor&) {
  return torch::stable::empty_like(x);
}

}  // namespace
}  // namespace af3_native

STABLE_TORCH_LIBRARY(af3_native, m) {
  m.def("gated_residual(Tensor x, Tensor gate, Tensor residual) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(af3_native, CPU, m) {
  m.impl("gated_residual", TORCH_BOX(&af3_native::gated_residual_cpu));
}

STABLE_TORCH_LIBRARY_IMPL(af3_native, Meta, m) {
  m.impl("gated_residual", TORCH_BOX(&af3_native::gated_residual_meta));
}
