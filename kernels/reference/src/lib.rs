//! CPU references for the embedded default kernel library in `kernels/`, and a generic GPU
//! test case for every kernel entry.
//!
//! This crate owns the meaning of the kernels: what each one computes, in which precision,
//! on which layouts, and how close a GPU result must come. It does not compile, load or
//! launch anything (that is the bundler's and the loader's job) and has no dependencies, so
//! every CPU-only test can use it.
//!
//! | kernel (`kernels.toml`) | entries | reference |
//! | --- | --- | --- |
//! | `layernorm_bf16` | `layernorm_bf16` | [`ops::layernorm_bf16`] |
//! | `swiglu` | `swiglu` | [`ops::swiglu`] |
//! | `masked_softmax_pair_bias` | `masked_softmax_pair_bias` | [`ops::masked_softmax_pair_bias`] |
//! | `sigmoid_gate` | `sigmoid_gate` | [`ops::sigmoid_gate`] |
//! | `sigmoid_gate_backward` | `sigmoid_gate_backward` | [`ops::sigmoid_gate_backward`] |
//! | `scale_rows` | `scale_rows<float>`, `scale_rows<__nv_bfloat16>` | [`ops::scale_rows_f32`], [`ops::scale_rows_bf16`] |
//! | `wgmma_matmul_bf16` (sm_90a only) | `wgmma_matmul_bf16` | [`ops::matmul_bf16`] |
//!
//! | module | what it holds |
//! | --- | --- |
//! | [`bf16`] | bf16 as `u16` bits: round-to-nearest-even from f32, exact widening |
//! | [`rng`] | a deterministic generator for test data |
//! | [`ops`] | one reference function per kernel, on slices |
//! | [`bytes`] | little-endian images of device buffers |
//! | [`cases`](mod@cases) | [`Case`]: arguments, launch geometry and a check, per kernel entry |
//!
//! A GPU test needs nothing kernel-specific: for each of [`cases()`](fn@cases), load the cubin of
//! `case.kernel`, look up `case.entry`, allocate a device buffer per [`Arg::Input`] and
//! [`Arg::Output`], launch with `case.grid` and `case.block`, and hand the output buffers'
//! bytes to `case.check`.
#![deny(missing_docs)]

pub mod bf16;
pub mod bytes;
pub mod cases;
pub mod ops;
pub mod rng;

pub use cases::{cases, Arg, Case, Check, Tolerance, LAUNCH_CONSTANTS};
