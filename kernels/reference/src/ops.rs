//! One CPU reference per kernel, on plain slices in the kernels' row-major layouts.
//!
//! Each function does the math its kernel does, in the same precision: inputs widened from
//! bf16 exactly, fp32 arithmetic (statistics and sums accumulated in fp32), and a bf16
//! rounding (nearest, ties to even) exactly where the kernel stores bf16. Only the order of
//! fp32 additions and the last ulp of `exp`/`rsqrt` differ from the GPU, which the
//! tolerances in [`Tolerance`](crate::Tolerance) absorb.
//!
//! All functions panic when a slice's length does not match the shape they are given.

use crate::bf16;

/// `1 / (1 + e^-x)`, as `af3::sigmoid` in `include/af3/activations.cuh`.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `x * sigmoid(x)`, as `af3::silu`.
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// LayerNorm over the last dimension of `input` `[rows, cols]` (kernel `layernorm_bf16`).
///
/// `out[r, c] = (in[r, c] - mean) / sqrt(var + eps) * gamma[c] + beta[c]`, with the mean
/// and the two-pass (biased) variance of row `r` in fp32, rounded to bf16 once at the end.
pub fn layernorm_bf16(
    input: &[u16],
    gamma: &[u16],
    beta: &[u16],
    rows: usize,
    cols: usize,
    eps: f32,
) -> Vec<u16> {
    assert_eq!(input.len(), rows * cols, "input is [rows, cols]");
    assert_eq!(gamma.len(), cols, "gamma is [cols]");
    assert_eq!(beta.len(), cols, "beta is [cols]");
    let gamma = bf16::to_f32_slice(gamma);
    let beta = bf16::to_f32_slice(beta);
    let mut out = Vec::with_capacity(input.len());
    for row in input.chunks_exact(cols.max(1)).take(rows) {
        let row = bf16::to_f32_slice(row);
        let mean = row.iter().sum::<f32>() / cols as f32;
        let variance = row.iter().map(|&x| (x - mean) * (x - mean)).sum::<f32>() / cols as f32;
        let inverse_std = 1.0 / (variance + eps).sqrt();
        out.extend(row.iter().enumerate().map(|(c, &x)| {
            let normalized = (x - mean) * inverse_std;
            bf16::from_f32(normalized.mul_add(gamma[c], beta[c]))
        }));
    }
    out
}

/// Fused SwiGLU (kernel `swiglu`): `input` is `[rows, 2 * hidden]`, its first half `a` and
/// second half `b` per row; returns `[rows, hidden]` with `silu(a) * b` rounded to bf16.
pub fn swiglu(input: &[u16], rows: usize, hidden: usize) -> Vec<u16> {
    assert_eq!(
        input.len(),
        rows * 2 * hidden,
        "input is [rows, 2 * hidden]"
    );
    let mut out = Vec::with_capacity(rows * hidden);
    for row in input.chunks_exact((2 * hidden).max(1)).take(rows) {
        let (a, b) = row.split_at(hidden);
        out.extend(
            a.iter()
                .zip(b)
                .map(|(&a, &b)| bf16::from_f32(silu(bf16::to_f32(a)) * bf16::to_f32(b))),
        );
    }
    out
}

/// Triangle-attention softmax with pair bias and key mask (kernel
/// `masked_softmax_pair_bias`), all fp32.
///
/// `logits` and the result are `[batch, heads, n, n]`, `bias` is `[heads, n, n]`, `mask`
/// is `[batch, n]` (a key is kept where the mask is non-zero). For query `i` of head `h`,
/// `x[j] = fma(logits[b, h, i, j], scale, bias[h, i, j])` and the row is
/// `softmax(x)` over the kept keys; masked keys are exactly 0, and a row with no kept key
/// is all zeros.
pub fn masked_softmax_pair_bias(
    logits: &[f32],
    bias: &[f32],
    mask: &[f32],
    batch: usize,
    heads: usize,
    n: usize,
    scale: f32,
) -> Vec<f32> {
    assert_eq!(
        logits.len(),
        batch * heads * n * n,
        "logits are [batch, heads, n, n]"
    );
    assert_eq!(bias.len(), heads * n * n, "bias is [heads, n, n]");
    assert_eq!(mask.len(), batch * n, "mask is [batch, n]");
    let mut out = vec![0.0f32; logits.len()];
    for row in 0..batch * heads * n {
        let query = row % n;
        let head = (row / n) % heads;
        let item = row / (n * heads);
        let row_logits = &logits[row * n..(row + 1) * n];
        let row_bias = &bias[(head * n + query) * n..(head * n + query + 1) * n];
        let key_mask = &mask[item * n..(item + 1) * n];
        let score = |j: usize| row_logits[j].mul_add(scale, row_bias[j]);

        let kept = || (0..n).filter(|&j| key_mask[j] != 0.0);
        let maximum = kept().map(score).fold(f32::NEG_INFINITY, f32::max);
        if maximum == f32::NEG_INFINITY {
            continue; // every key masked: the row stays zero
        }
        let sum: f32 = kept().map(|j| (score(j) - maximum).exp()).sum();
        for j in kept() {
            out[row * n + j] = (score(j) - maximum).exp() / sum;
        }
    }
    out
}

/// `x * sigmoid(gate)` elementwise (kernel `sigmoid_gate`), rounded to bf16.
pub fn sigmoid_gate(x: &[u16], gate: &[u16]) -> Vec<u16> {
    assert_eq!(x.len(), gate.len(), "x and gate have one shape");
    x.iter()
        .zip(gate)
        .map(|(&x, &gate)| bf16::from_f32(bf16::to_f32(x) * sigmoid(bf16::to_f32(gate))))
        .collect()
}

/// The gradients of `x * sigmoid(gate)` (kernel `sigmoid_gate_backward`), each rounded to
/// bf16: `(grad_out * s, grad_out * x * (s * (1 - s)))` with `s = sigmoid(gate)`.
pub fn sigmoid_gate_backward(grad_out: &[u16], x: &[u16], gate: &[u16]) -> (Vec<u16>, Vec<u16>) {
    assert_eq!(grad_out.len(), x.len(), "grad_out and x have one shape");
    assert_eq!(x.len(), gate.len(), "x and gate have one shape");
    grad_out
        .iter()
        .zip(x)
        .zip(gate)
        .map(|((&grad, &x), &gate)| {
            let grad = bf16::to_f32(grad);
            let s = sigmoid(bf16::to_f32(gate));
            (
                bf16::from_f32(grad * s),
                bf16::from_f32(grad * bf16::to_f32(x) * (s * (1.0 - s))),
            )
        })
        .unzip()
}

/// `out[r, c] = input[r, c] * scale[r]` on fp32 (kernel entry `scale_rows<float>`).
pub fn scale_rows_f32(input: &[f32], scale: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    assert_eq!(input.len(), rows * cols, "input is [rows, cols]");
    assert_eq!(scale.len(), rows, "scale is [rows]");
    input
        .iter()
        .enumerate()
        .map(|(i, &x)| x * scale[i / cols])
        .collect()
}

/// `out[r, c] = input[r, c] * scale[r]` on bf16, in fp32 and rounded once (kernel entry
/// `scale_rows<__nv_bfloat16>`).
pub fn scale_rows_bf16(input: &[u16], scale: &[f32], rows: usize, cols: usize) -> Vec<u16> {
    assert_eq!(input.len(), rows * cols, "input is [rows, cols]");
    assert_eq!(scale.len(), rows, "scale is [rows]");
    input
        .iter()
        .enumerate()
        .map(|(i, &x)| bf16::from_f32(bf16::to_f32(x) * scale[i / cols]))
        .collect()
}

/// `c = a * b` with bf16 `a` `[m, k]` and `b` `[k, n]`, fp32 accumulation and fp32 result
/// `[m, n]`, all row-major (kernel `wgmma_matmul_bf16`).
pub fn matmul_bf16(a: &[u16], b: &[u16], m: usize, n: usize, k: usize) -> Vec<f32> {
    assert_eq!(a.len(), m * k, "a is [m, k]");
    assert_eq!(b.len(), k * n, "b is [k, n]");
    let a = bf16::to_f32_slice(a);
    let b = bf16::to_f32_slice(b);
    let mut c = vec![0.0f32; m * n];
    for row in 0..m {
        for column in 0..n {
            // Products of two bf16 values are exact in fp32; only the sum rounds.
            c[row * n + column] = (0..k).map(|i| a[row * k + i] * b[i * n + column]).sum();
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16s(values: &[f32]) -> Vec<u16> {
        bf16::from_f32_slice(values)
    }

    #[test]
    fn layernorm_of_one_to_four() {
        // mean 2.5, variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25, 1 / sqrt(1.25) = 0.894427.
        let out = layernorm_bf16(
            &bf16s(&[1.0, 2.0, 3.0, 4.0]),
            &bf16s(&[1.0; 4]),
            &bf16s(&[0.0; 4]),
            1,
            4,
            0.0,
        );
        let expected = [-1.341_640_8, -0.447_213_6, 0.447_213_6, 1.341_640_8];
        assert_eq!(out, bf16s(&expected));
        // And the bf16 values themselves, worked out by hand: 1.3416 * 128 = 171.7 -> 172.
        assert_eq!(bf16::to_f32(out[3]), 172.0 / 128.0);
        assert_eq!(bf16::to_f32(out[2]), 229.0 / 512.0);
    }

    #[test]
    fn layernorm_applies_gamma_and_beta_per_column() {
        let out = layernorm_bf16(
            &bf16s(&[1.0, 3.0, 10.0, 30.0]),
            &bf16s(&[2.0, 0.5]),
            &bf16s(&[1.0, -1.0]),
            2,
            2,
            0.0,
        );
        // Both rows normalize to [-1, 1]; then [-1 * 2 + 1, 1 * 0.5 - 1].
        assert_eq!(bf16::to_f32_slice(&out), [-1.0, -0.5, -1.0, -0.5]);
    }

    #[test]
    fn layernorm_eps_keeps_a_constant_row_finite() {
        let out = layernorm_bf16(
            &bf16s(&[5.0; 3]),
            &bf16s(&[1.0; 3]),
            &bf16s(&[0.25; 3]),
            1,
            3,
            1e-5,
        );
        assert_eq!(bf16::to_f32_slice(&out), [0.25; 3]);
    }

    #[test]
    fn swiglu_multiplies_silu_of_the_first_half_by_the_second() {
        // silu(0) = 0, silu(1) = 0.7310586, silu(-1) = -0.2689414.
        let out = swiglu(&bf16s(&[0.0, 1.0, 5.0, 2.0, -1.0, 4.0, 3.0, 0.5]), 2, 2);
        // silu(4) = 4 * 0.982_013_8.
        let want = [
            0.0,
            0.731_058_6 * 2.0,
            -0.268_941_4 * 3.0,
            3.928_055_2 * 0.5,
        ];
        assert_eq!(out, bf16s(&want));
    }

    #[test]
    fn sigmoid_gate_of_known_values() {
        let out = sigmoid_gate(
            &bf16s(&[2.0, 2.0, -3.0, 1.0]),
            &bf16s(&[0.0, 100.0, -100.0, 1.0]),
        );
        assert_eq!(bf16::to_f32_slice(&out)[..3], [1.0, 2.0, -0.0]);
        assert_eq!(out[3], bf16::from_f32(0.731_058_6));
    }

    #[test]
    fn sigmoid_gate_backward_of_known_values() {
        // sigmoid(0) = 0.5: grad_x = g / 2, grad_gate = g * x / 4; a saturated gate passes
        // the whole gradient to x and none to the gate.
        let (grad_x, grad_gate) = sigmoid_gate_backward(
            &bf16s(&[1.0, 2.0, 3.0]),
            &bf16s(&[4.0, -2.0, 5.0]),
            &bf16s(&[0.0, 0.0, 100.0]),
        );
        assert_eq!(bf16::to_f32_slice(&grad_x), [0.5, 1.0, 3.0]);
        assert_eq!(bf16::to_f32_slice(&grad_gate), [1.0, -1.0, 0.0]);
    }

    #[test]
    fn sigmoid_gate_backward_matches_a_finite_difference_of_the_forward() {
        let (x, gate, step) = (1.5f32, 0.75f32, 1e-3f32);
        let forward = |gate: f32| x * sigmoid(gate);
        let numeric = (forward(gate + step) - forward(gate - step)) / (2.0 * step);
        let (_, grad_gate) = sigmoid_gate_backward(&bf16s(&[1.0]), &bf16s(&[x]), &bf16s(&[gate]));
        let analytic = bf16::to_f32(grad_gate[0]);
        assert!(
            (analytic - numeric).abs() < numeric.abs() / 128.0,
            "{analytic} vs {numeric}"
        );
    }

    #[test]
    fn softmax_rows_sum_to_one_and_masked_keys_are_exactly_zero() {
        let (batch, heads, n) = (2, 2, 5);
        let mut rng = crate::rng::Rng::new(3);
        let logits = rng.uniform_vec(batch * heads * n * n, -4.0, 4.0);
        let bias = rng.uniform_vec(heads * n * n, -2.0, 2.0);
        let mask = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let out = masked_softmax_pair_bias(&logits, &bias, &mask, batch, heads, n, 0.5);
        for (row, probabilities) in out.chunks_exact(n).enumerate() {
            let item = row / (heads * n);
            let sum: f32 = probabilities.iter().sum();
            if item == 0 {
                assert!((sum - 1.0).abs() < 1e-6, "row {row} sums to {sum}");
                assert_eq!(probabilities[1], 0.0);
                assert_eq!(probabilities[4], 0.0);
                assert!(probabilities[0] > 0.0 && probabilities[3] > 0.0);
            } else {
                assert_eq!(probabilities, [0.0; 5], "fully masked row {row}");
            }
        }
    }

    #[test]
    fn softmax_of_known_values() {
        // Query 0 scores [0, ln 3] after scale and bias, so probabilities [1/4, 3/4];
        // query 1 scores [0, 0], so [1/2, 1/2].
        let ln3 = 3.0f32.ln();
        let logits = [2.0, 4.0, 0.0, 0.0];
        let bias = [-1.0, ln3 - 2.0, 0.0, 0.0];
        let out = masked_softmax_pair_bias(&logits, &bias, &[1.0, 1.0], 1, 1, 2, 0.5);
        let want = [0.25, 0.75, 0.5, 0.5];
        for (got, want) in out.iter().zip(want) {
            assert!((got - want).abs() < 1e-6, "{out:?}");
        }
    }

    #[test]
    fn scale_rows_scales_each_row_by_its_factor() {
        let out = scale_rows_f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2.0, -0.5], 2, 3);
        assert_eq!(out, [2.0, 4.0, 6.0, -2.0, -2.5, -3.0]);
        let out = scale_rows_bf16(&bf16s(&[1.0, 3.0]), &[1.0 / 3.0, 1.0], 2, 1);
        assert_eq!(out, bf16s(&[1.0 / 3.0, 3.0]));
    }

    #[test]
    fn matmul_of_a_small_product() {
        // [[1, 2], [3, 4], [5, 6]] * [[1, 0, -1], [2, 1, 0.5]]
        let a = bf16s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let b = bf16s(&[1.0, 0.0, -1.0, 2.0, 1.0, 0.5]);
        let c = matmul_bf16(&a, &b, 3, 3, 2);
        assert_eq!(c, [5.0, 2.0, 0.0, 11.0, 4.0, -1.0, 17.0, 6.0, -2.0]);
    }
}
