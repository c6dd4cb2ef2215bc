//! A GPU test case for every kernel entry, described generically: buffers, scalars, launch
//! geometry, and a check against the CPU reference. A harness runs them all without any
//! kernel-specific code:
//!
//! ```text
//! for case in cases():
//!     module  = load the cubin of `case.kernel`; function = its entry `case.entry`
//!     args    = Input -> device copy of the bytes, Output -> device buffer of that size
//!               (any contents: kernels write every element), I32 / F32 -> the scalar;
//!               pointers are 8 bytes, all in parameter order
//!     launch(function, case.grid, case.block, case.shared_mem_bytes, args)
//!     (case.check)(bytes of every Output buffer, in argument order)?
//! ```
//!
//! Shapes are small and deliberately ragged (37 rows of 300 columns, n = 133 keys, a
//! 100 x 20 x 40 product) so that partial blocks, partial warps and partial tiles run.

use std::fmt;

use crate::{bf16, bytes, ops, rng::Rng};

/// Constants of `kernels.toml` that the launch geometry below relies on, as
/// `(kernel, constant, value)`. A unit test keeps this table equal to the manifest.
pub const LAUNCH_CONSTANTS: &[(&str, &str, u32)] = &[
    ("layernorm_bf16", "BLOCK_SIZE", 256),
    ("swiglu", "BLOCK_SIZE", 256),
    ("masked_softmax_pair_bias", "BLOCK_SIZE", 128),
    ("sigmoid_gate", "BLOCK_SIZE", 256),
    ("sigmoid_gate_backward", "BLOCK_SIZE", 256),
    ("scale_rows", "BLOCK_SIZE", 256),
    ("wgmma_matmul_bf16", "BLOCK_SIZE", 128),
    ("wgmma_matmul_bf16", "TILE_M", 64),
    ("wgmma_matmul_bf16", "TILE_N", 8),
    ("wgmma_matmul_bf16", "TILE_K", 16),
];

/// One kernel parameter, in the kernel's parameter order.
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    /// A device buffer holding these bytes; the kernel receives its pointer (8 bytes).
    Input(Vec<u8>),
    /// A device buffer of `bytes` bytes that the kernel writes; the kernel receives its
    /// pointer, and its contents go to [`Case::check`] after the launch.
    Output {
        /// Size of the buffer.
        bytes: usize,
    },
    /// A 4-byte `int` parameter.
    I32(i32),
    /// A 4-byte `float` parameter.
    F32(f32),
}

/// Compares the output buffers of one launch with the CPU reference.
pub type Check = Box<dyn Fn(&[Vec<u8>]) -> Result<(), String> + Send + Sync>;

/// One launch of one kernel entry with deterministic data, and how to judge its result.
pub struct Case {
    /// The kernel's name in `kernels.toml` (`[kernels.<name>]`).
    pub kernel: &'static str,
    /// The entry as the manifest lists it: an `extern "C"` name or a name expression.
    pub entry: &'static str,
    /// Grid dimensions, in blocks.
    pub grid: [u32; 3],
    /// Block dimensions, in threads; follows the kernel's `BLOCK_SIZE` constant.
    pub block: [u32; 3],
    /// Dynamic shared memory per block.
    pub shared_mem_bytes: u32,
    /// The kernel's parameters, in order.
    pub args: Vec<Arg>,
    /// Takes the bytes of every [`Arg::Output`] buffer, in argument order; `Err` names the
    /// first mismatch with its index, the value got, the value wanted and the tolerance.
    pub check: Check,
}

impl fmt::Debug for Case {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("Case")
            .field("kernel", &self.kernel)
            .field("entry", &self.entry)
            .field("grid", &self.grid)
            .field("block", &self.block)
            .field("shared_mem_bytes", &self.shared_mem_bytes)
            .field("args", &self.args.len())
            .finish_non_exhaustive()
    }
}

/// Every case: at least one per entry of every kernel in `kernels.toml`.
pub fn cases() -> Vec<Case> {
    built().into_iter().map(|built| built.case).collect()
}

/// A case, and for the unit tests the reference's own output bytes, which its check must
/// accept.
struct Built {
    case: Case,
    #[cfg(test)]
    reference_outputs: Vec<Vec<u8>>,
}

fn built() -> Vec<Built> {
    vec![
        layernorm_case(),
        swiglu_case(),
        masked_softmax_case(),
        sigmoid_gate_case(),
        sigmoid_gate_backward_case(),
        scale_rows_f32_case(),
        scale_rows_bf16_case(),
        wgmma_matmul_case(),
    ]
}

/// Assembles a case whose `args` hold one [`Arg::Output`] per `expected`, in order.
fn build(
    kernel: &'static str,
    entry: &'static str,
    grid: [u32; 3],
    block: [u32; 3],
    args: Vec<Arg>,
    expected: Vec<Expected>,
) -> Built {
    #[cfg(test)]
    let reference_outputs = expected.iter().map(Expected::reference_bytes).collect();
    Built {
        case: Case {
            kernel,
            entry,
            grid,
            block,
            shared_mem_bytes: 0,
            args,
            check: check(entry, expected),
        },
        #[cfg(test)]
        reference_outputs,
    }
}

/// How far a GPU value may be from the reference: `|got - want| <= absolute + relative * |want|`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Allowed absolute difference.
    pub absolute: f32,
    /// Allowed difference relative to the wanted value.
    pub relative: f32,
}

impl Tolerance {
    /// Bit-for-bit IEEE results: the kernel does exactly the reference's operations.
    pub const EXACT: Self = Self {
        absolute: 0.0,
        relative: 0.0,
    };
    /// One bf16 ulp (2^-7 relative at most) for a bf16 result whose fp32 value may differ in
    /// its last bits from the reference's and so round to the neighbouring bf16.
    pub const BF16_ULP: Self = Self {
        absolute: 1e-6,
        relative: 1.0 / 128.0,
    };

    /// The largest allowed difference from `want`.
    pub fn bound(&self, want: f32) -> f32 {
        self.absolute + self.relative * want.abs()
    }

    /// Whether `got` is close enough to `want`; NaN never is, infinities only to themselves.
    pub fn allows(&self, got: f32, want: f32) -> bool {
        got == want || (got - want).abs() <= self.bound(want)
    }
}

/// Element type of an output buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Element {
    F32,
    Bf16,
}

/// What one output buffer must hold.
struct Expected {
    element: Element,
    want: Vec<f32>,
    tolerance: Tolerance,
    /// Where the reference is exactly 0, the kernel must be too (masked probabilities).
    zeros_exact: bool,
}

impl Expected {
    fn bf16(want: &[u16], tolerance: Tolerance) -> Self {
        Self {
            element: Element::Bf16,
            want: bf16::to_f32_slice(want),
            tolerance,
            zeros_exact: false,
        }
    }

    fn f32(want: Vec<f32>, tolerance: Tolerance) -> Self {
        Self {
            element: Element::F32,
            want,
            tolerance,
            zeros_exact: false,
        }
    }

    fn bytes(&self) -> usize {
        self.want.len()
            * match self.element {
                Element::F32 => 4,
                Element::Bf16 => 2,
            }
    }

    fn output(&self) -> Arg {
        Arg::Output {
            bytes: self.bytes(),
        }
    }

    #[cfg(test)]
    fn reference_bytes(&self) -> Vec<u8> {
        match self.element {
            Element::F32 => bytes::from_f32s(&self.want),
            Element::Bf16 => bytes::from_u16s(&bf16::from_f32_slice(&self.want)),
        }
    }

    fn compare(&self, entry: &str, output: usize, got: &[u8]) -> Result<(), String> {
        if got.len() != self.bytes() {
            return Err(format!(
                "`{entry}` output {output}: {} bytes, want {}",
                got.len(),
                self.bytes()
            ));
        }
        let got = match self.element {
            Element::F32 => bytes::to_f32s(got),
            Element::Bf16 => bytes::to_u16s(got).map(|bits| bf16::to_f32_slice(&bits)),
        }
        .expect("length checked above");
        for (index, (&got, &want)) in got.iter().zip(&self.want).enumerate() {
            let tolerance = if self.zeros_exact && want == 0.0 {
                Tolerance::EXACT
            } else {
                self.tolerance
            };
            if !tolerance.allows(got, want) {
                return Err(format!(
                    "`{entry}` output {output}, element {index}: got {got:e}, want {want:e}, \
                     tolerance {:e}",
                    tolerance.bound(want)
                ));
            }
        }
        Ok(())
    }
}

/// A check of every output buffer, in order, against its expectation.
fn check(entry: &'static str, expected: Vec<Expected>) -> Check {
    Box::new(move |outputs: &[Vec<u8>]| {
        if outputs.len() != expected.len() {
            return Err(format!(
                "`{entry}`: {} output buffers, want {}",
                outputs.len(),
                expected.len()
            ));
        }
        for (index, (expected, got)) in expected.iter().zip(outputs).enumerate() {
            expected.compare(entry, index, got)?;
        }
        Ok(())
    })
}

/// The value of a constant from [`LAUNCH_CONSTANTS`].
fn constant(kernel: &str, name: &str) -> u32 {
    LAUNCH_CONSTANTS
        .iter()
        .find(|(k, n, _)| *k == kernel && *n == name)
        .map(|(_, _, value)| *value)
        .unwrap_or_else(|| panic!("no constant {name} for kernel {kernel}"))
}

/// A 1-D launch with one thread per element (the kernels also loop, grid-stride).
fn elementwise_geometry(kernel: &str, count: usize) -> ([u32; 3], [u32; 3]) {
    let block = constant(kernel, "BLOCK_SIZE");
    let blocks = count.div_ceil(block as usize);
    ([to_u32(blocks), 1, 1], [block, 1, 1])
}

fn to_u32(value: usize) -> u32 {
    u32::try_from(value).expect("test shapes are small")
}

fn to_i32(value: usize) -> i32 {
    i32::try_from(value).expect("test shapes are small")
}

fn layernorm_case() -> Built {
    const KERNEL: &str = "layernorm_bf16";
    let (rows, cols, eps) = (37, 300, 1e-5);
    let mut rng = Rng::new(0x1a7e_0001);
    // An offset mean and a spread of scales exercise the mean subtraction and the affine.
    let input = rng.uniform_bf16_vec(rows * cols, -2.0, 4.0);
    let gamma = rng.uniform_bf16_vec(cols, 0.5, 1.5);
    let beta = rng.uniform_bf16_vec(cols, -0.5, 0.5);
    let want = ops::layernorm_bf16(&input, &gamma, &beta, rows, cols, eps);
    let expected = Expected::bf16(&want, Tolerance::BF16_ULP);
    build(
        KERNEL,
        "layernorm_bf16",
        [to_u32(rows), 1, 1],
        [constant(KERNEL, "BLOCK_SIZE"), 1, 1],
        vec![
            expected.output(),
            Arg::Input(bytes::from_u16s(&input)),
            Arg::Input(bytes::from_u16s(&gamma)),
            Arg::Input(bytes::from_u16s(&beta)),
            Arg::I32(to_i32(rows)),
            Arg::I32(to_i32(cols)),
            Arg::F32(eps),
        ],
        vec![expected],
    )
}

fn swiglu_case() -> Built {
    const KERNEL: &str = "swiglu";
    let (rows, hidden) = (37, 300);
    let mut rng = Rng::new(0x1a7e_0002);
    let input = rng.uniform_bf16_vec(rows * 2 * hidden, -4.0, 4.0);
    let expected = Expected::bf16(&ops::swiglu(&input, rows, hidden), Tolerance::BF16_ULP);
    let (grid, block) = elementwise_geometry(KERNEL, rows * hidden);
    build(
        KERNEL,
        "swiglu",
        grid,
        block,
        vec![
            expected.output(),
            Arg::Input(bytes::from_u16s(&input)),
            Arg::I32(to_i32(rows)),
            Arg::I32(to_i32(hidden)),
        ],
        vec![expected],
    )
}

fn masked_softmax_case() -> Built {
    const KERNEL: &str = "masked_softmax_pair_bias";
    // n > BLOCK_SIZE, so threads loop over keys; batch item 0 has a random mask, item 1
    // keeps every key, item 2 masks every key (its rows must be all zeros).
    let (batch, heads, n, scale) = (3, 2, 133, 0.25);
    let mut rng = Rng::new(0x1a7e_0003);
    let logits = rng.uniform_vec(batch * heads * n * n, -8.0, 8.0);
    let bias = rng.uniform_vec(heads * n * n, -2.0, 2.0);
    let mut mask = vec![0.0f32; batch * n];
    for (j, keep) in mask[..n].iter_mut().enumerate() {
        *keep = if j == 0 || rng.chance(0.75) { 1.0 } else { 0.0 };
    }
    mask[n..2 * n].fill(1.0);
    let want = ops::masked_softmax_pair_bias(&logits, &bias, &mask, batch, heads, n, scale);
    let expected = Expected {
        zeros_exact: true,
        ..Expected::f32(
            want,
            Tolerance {
                absolute: 1e-6,
                relative: 1e-5,
            },
        )
    };
    build(
        KERNEL,
        "masked_softmax_pair_bias",
        [to_u32(batch * heads * n), 1, 1],
        [constant(KERNEL, "BLOCK_SIZE"), 1, 1],
        vec![
            expected.output(),
            Arg::Input(bytes::from_f32s(&logits)),
            Arg::Input(bytes::from_f32s(&bias)),
            Arg::Input(bytes::from_f32s(&mask)),
            Arg::I32(to_i32(batch)),
            Arg::I32(to_i32(heads)),
            Arg::I32(to_i32(n)),
            Arg::F32(scale),
        ],
        vec![expected],
    )
}

fn sigmoid_gate_case() -> Built {
    const KERNEL: &str = "sigmoid_gate";
    let count = 37 * 300;
    let mut rng = Rng::new(0x1a7e_0004);
    let x = rng.uniform_bf16_vec(count, -3.0, 3.0);
    let gate = rng.uniform_bf16_vec(count, -6.0, 6.0);
    // The kernel is built with AF3_FAST_EXP=1 (`__expf`, a few fp32 ulp from `expf`):
    // still within one bf16 ulp.
    let expected = Expected::bf16(&ops::sigmoid_gate(&x, &gate), Tolerance::BF16_ULP);
    let (grid, block) = elementwise_geometry(KERNEL, count);
    build(
        KERNEL,
        "sigmoid_gate",
        grid,
        block,
        vec![
            expected.output(),
            Arg::Input(bytes::from_u16s(&x)),
            Arg::Input(bytes::from_u16s(&gate)),
            Arg::I32(to_i32(count)),
        ],
        vec![expected],
    )
}

fn sigmoid_gate_backward_case() -> Built {
    const KERNEL: &str = "sigmoid_gate_backward";
    let count = 37 * 300;
    let mut rng = Rng::new(0x1a7e_0008);
    let grad_out = rng.uniform_bf16_vec(count, -2.0, 2.0);
    let x = rng.uniform_bf16_vec(count, -3.0, 3.0);
    let gate = rng.uniform_bf16_vec(count, -6.0, 6.0);
    let (grad_x, grad_gate) = ops::sigmoid_gate_backward(&grad_out, &x, &gate);
    let grad_x = Expected::bf16(&grad_x, Tolerance::BF16_ULP);
    let grad_gate = Expected::bf16(&grad_gate, Tolerance::BF16_ULP);
    let (grid, block) = elementwise_geometry(KERNEL, count);
    build(
        KERNEL,
        "sigmoid_gate_backward",
        grid,
        block,
        vec![
            grad_x.output(),
            grad_gate.output(),
            Arg::Input(bytes::from_u16s(&grad_out)),
            Arg::Input(bytes::from_u16s(&x)),
            Arg::Input(bytes::from_u16s(&gate)),
            Arg::I32(to_i32(count)),
        ],
        vec![grad_x, grad_gate],
    )
}

fn scale_rows_f32_case() -> Built {
    const KERNEL: &str = "scale_rows";
    let (rows, cols) = (37, 300);
    let mut rng = Rng::new(0x1a7e_0005);
    let input = rng.uniform_vec(rows * cols, -2.0, 2.0);
    let scale = rng.uniform_vec(rows, -1.5, 1.5);
    // One fp32 multiplication per element, on both sides.
    let expected = Expected::f32(
        ops::scale_rows_f32(&input, &scale, rows, cols),
        Tolerance::EXACT,
    );
    let (grid, block) = elementwise_geometry(KERNEL, rows * cols);
    build(
        KERNEL,
        "scale_rows<float>",
        grid,
        block,
        vec![
            expected.output(),
            Arg::Input(bytes::from_f32s(&input)),
            Arg::Input(bytes::from_f32s(&scale)),
            Arg::I32(to_i32(rows)),
            Arg::I32(to_i32(cols)),
        ],
        vec![expected],
    )
}

fn scale_rows_bf16_case() -> Built {
    const KERNEL: &str = "scale_rows";
    let (rows, cols) = (37, 300);
    let mut rng = Rng::new(0x1a7e_0006);
    let input = rng.uniform_bf16_vec(rows * cols, -2.0, 2.0);
    let scale = rng.uniform_vec(rows, -1.5, 1.5);
    // One fp32 multiplication and one rounding per element, on both sides.
    let expected = Expected::bf16(
        &ops::scale_rows_bf16(&input, &scale, rows, cols),
        Tolerance::EXACT,
    );
    let (grid, block) = elementwise_geometry(KERNEL, rows * cols);
    build(
        KERNEL,
        "scale_rows<__nv_bfloat16>",
        grid,
        block,
        vec![
            expected.output(),
            Arg::Input(bytes::from_u16s(&input)),
            Arg::Input(bytes::from_f32s(&scale)),
            Arg::I32(to_i32(rows)),
            Arg::I32(to_i32(cols)),
        ],
        vec![expected],
    )
}

fn wgmma_matmul_case() -> Built {
    const KERNEL: &str = "wgmma_matmul_bf16";
    // Two row tiles (the second partial), three column tiles (the last partial) and three
    // K steps (the last partial): every zero-filled edge of the kernel runs.
    let (m, n, k) = (100, 20, 40);
    let mut rng = Rng::new(0x1a7e_0007);
    let a = rng.uniform_bf16_vec(m * k, -1.0, 1.0);
    let b = rng.uniform_bf16_vec(k * n, -1.0, 1.0);
    // Products are exact; the tensor cores add in their own order and precision.
    let expected = Expected::f32(
        ops::matmul_bf16(&a, &b, m, n, k),
        Tolerance {
            absolute: 1e-3,
            relative: 1e-3,
        },
    );
    let tile_m = constant(KERNEL, "TILE_M") as usize;
    let tile_n = constant(KERNEL, "TILE_N") as usize;
    build(
        KERNEL,
        "wgmma_matmul_bf16",
        [to_u32(n.div_ceil(tile_n)), to_u32(m.div_ceil(tile_m)), 1],
        [constant(KERNEL, "BLOCK_SIZE"), 1, 1],
        vec![
            expected.output(),
            Arg::Input(bytes::from_u16s(&a)),
            Arg::Input(bytes::from_u16s(&b)),
            Arg::I32(to_i32(m)),
            Arg::I32(to_i32(n)),
            Arg::I32(to_i32(k)),
        ],
        vec![expected],
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    use super::*;

    fn kernels_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    /// One `[kernels.<name>]` table of `kernels.toml`.
    #[derive(Debug)]
    struct ManifestKernel {
        name: String,
        sources: Vec<String>,
        entries: Vec<String>,
        constants: Vec<(String, u32)>,
    }

    /// Reads the manifest's kernel tables. Enough TOML for this one file, whose arrays and
    /// inline tables each sit on one line; the bundler's parser is the real one.
    fn manifest_kernels() -> Vec<ManifestKernel> {
        let text = std::fs::read_to_string(kernels_dir().join("kernels.toml")).unwrap();
        let quoted = |value: &str| -> Vec<String> {
            value
                .split('"')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect()
        };
        let mut kernels: Vec<ManifestKernel> = Vec::new();
        // Whether the lines read belong to a `[kernels.*]` table (not `[extensions.*]`).
        let mut in_kernel = false;
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') && !line.starts_with("[kernels.") {
                in_kernel = false;
                continue;
            }
            if let Some(name) = line.strip_prefix("[kernels.") {
                in_kernel = true;
                kernels.push(ManifestKernel {
                    name: name.trim_end_matches(']').to_owned(),
                    sources: Vec::new(),
                    entries: Vec::new(),
                    constants: Vec::new(),
                });
                continue;
            }
            let (true, Some(kernel), Some((key, value))) =
                (in_kernel, kernels.last_mut(), line.split_once('='))
            else {
                continue;
            };
            match key.trim() {
                "sources" => kernel.sources = quoted(value),
                "entries" => kernel.entries = quoted(value),
                "constants" => {
                    let inner = value.trim().trim_start_matches('{').trim_end_matches('}');
                    for pair in inner.split(',') {
                        let (name, value) = pair.split_once('=').unwrap();
                        kernel
                            .constants
                            .push((name.trim().to_owned(), value.trim().parse().unwrap()));
                    }
                }
                _ => {}
            }
        }
        kernels
    }

    #[test]
    fn every_manifest_entry_has_a_case_and_every_case_an_entry() {
        let manifest: BTreeSet<(String, String)> = manifest_kernels()
            .into_iter()
            .flat_map(|kernel| {
                let name = kernel.name;
                kernel
                    .entries
                    .into_iter()
                    .map(move |entry| (name.clone(), entry))
            })
            .collect();
        assert!(manifest.len() >= 7, "{manifest:?}");
        let covered: BTreeSet<(String, String)> = cases()
            .iter()
            .map(|case| (case.kernel.to_owned(), case.entry.to_owned()))
            .collect();
        assert_eq!(covered, manifest);
    }

    #[test]
    fn launch_constants_match_the_manifest() {
        let manifest: BTreeSet<(String, String, u32)> = manifest_kernels()
            .into_iter()
            .flat_map(|kernel| {
                let name = kernel.name;
                kernel
                    .constants
                    .into_iter()
                    .map(move |(constant, value)| (name.clone(), constant, value))
            })
            .collect();
        let table: BTreeSet<(String, String, u32)> = LAUNCH_CONSTANTS
            .iter()
            .map(|&(kernel, name, value)| (kernel.to_owned(), name.to_owned(), value))
            .collect();
        assert_eq!(table, manifest);
    }

    #[test]
    fn blocks_follow_block_size_and_grids_cover_the_work() {
        for case in cases() {
            assert_eq!(
                case.block,
                [constant(case.kernel, "BLOCK_SIZE"), 1, 1],
                "{}",
                case.entry
            );
            assert!(case.grid.iter().all(|&blocks| blocks > 0), "{case:?}");
        }
    }

    /// The parameter list of `entry`'s definition in its source: the first `name(` after
    /// the first `__global__`.
    fn parameters(source: &str, entry: &str) -> Vec<String> {
        let name = entry.split('<').next().unwrap();
        let definition = &source[source.find("__global__").unwrap()..];
        let open = definition.find(&format!("{name}(")).unwrap() + name.len() + 1;
        let close = open + definition[open..].find(')').unwrap();
        definition[open..close]
            .split(',')
            .map(|parameter| parameter.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect()
    }

    #[test]
    fn arguments_follow_the_kernel_signatures() {
        let manifest = manifest_kernels();
        for case in cases() {
            let kernel = manifest.iter().find(|k| k.name == case.kernel).unwrap();
            let source = std::fs::read_to_string(kernels_dir().join(&kernel.sources[0])).unwrap();
            let parameters = parameters(&source, case.entry);
            assert_eq!(
                parameters.len(),
                case.args.len(),
                "{}: {parameters:?}",
                case.entry
            );
            for (parameter, arg) in parameters.iter().zip(&case.args) {
                let fits = match arg {
                    Arg::Input(_) => parameter.starts_with("const ") && parameter.contains('*'),
                    Arg::Output { .. } => {
                        !parameter.starts_with("const ") && parameter.contains('*')
                    }
                    Arg::I32(_) => parameter.starts_with("int "),
                    Arg::F32(_) => parameter.starts_with("float "),
                };
                assert!(
                    fits,
                    "{}: parameter `{parameter}` given {arg:?}",
                    case.entry
                );
            }
        }
    }

    #[test]
    fn output_arguments_match_the_reference_outputs() {
        for built in built() {
            let sizes: Vec<usize> = built
                .case
                .args
                .iter()
                .filter_map(|arg| match arg {
                    Arg::Output { bytes } => Some(*bytes),
                    _ => None,
                })
                .collect();
            let reference: Vec<usize> = built.reference_outputs.iter().map(Vec::len).collect();
            assert_eq!(sizes, reference, "{}", built.case.entry);
        }
    }

    #[test]
    fn every_check_accepts_the_reference() {
        for built in built() {
            (built.case.check)(&built.reference_outputs).unwrap();
        }
    }

    #[test]
    fn every_check_rejects_a_perturbed_output() {
        for built in built() {
            let mut outputs = built.reference_outputs.clone();
            let output = &mut outputs[0];
            // Flip the top exponent bit of an element near the middle: far outside any
            // tolerance. Byte 4i + 3 is the high byte of an f32 and of a bf16 alike.
            let high_byte = output.len() / 2 / 4 * 4 + 3;
            output[high_byte] ^= 0x40;
            let error = (built.case.check)(&outputs).unwrap_err();
            assert!(error.contains("element"), "{error}");
            assert!(error.contains("got") && error.contains("want"), "{error}");
            assert!(error.contains("tolerance"), "{error}");
        }
    }

    #[test]
    fn checks_name_the_mismatching_element() {
        let built = layernorm_case();
        let mut outputs = built.reference_outputs.clone();
        let want = bf16::to_f32(u16::from_le_bytes([outputs[0][20], outputs[0][21]]));
        let got = bf16::from_f32(want + 1.0 + want.abs());
        outputs[0][20..22].copy_from_slice(&got.to_le_bytes());
        let error = (built.case.check)(&outputs).unwrap_err();
        assert!(
            error.starts_with("`layernorm_bf16` output 0, element 10: got"),
            "{error}"
        );
    }

    #[test]
    fn bf16_checks_allow_one_ulp_but_not_two() {
        let built = sigmoid_gate_case();
        let reference = bytes::to_u16s(&built.reference_outputs[0]).unwrap();
        let index = reference
            .iter()
            .position(|&bits| bf16::to_f32(bits).abs() > 0.5)
            .unwrap();
        for (step, accepted) in [(1u16, true), (2, false)] {
            let mut bits = reference.clone();
            bits[index] += step; // one ulp away from zero, in either sign
            let outputs = vec![bytes::from_u16s(&bits)];
            assert_eq!((built.case.check)(&outputs).is_ok(), accepted, "{step} ulp");
        }
    }

    #[test]
    fn masked_probabilities_must_be_exactly_zero() {
        let built = masked_softmax_case();
        let mut probabilities = bytes::to_f32s(&built.reference_outputs[0]).unwrap();
        let masked = probabilities.iter().position(|&p| p == 0.0).unwrap();
        probabilities[masked] = 1e-9; // within the absolute tolerance of kept keys
        let error = (built.case.check)(&[bytes::from_f32s(&probabilities)]).unwrap_err();
        assert!(error.contains(&format!("element {masked}:")), "{error}");
    }

    #[test]
    fn softmax_case_masks_some_keys_and_whole_rows() {
        let built = masked_softmax_case();
        let probabilities = bytes::to_f32s(&built.reference_outputs[0]).unwrap();
        let n = 133;
        let rows: Vec<&[f32]> = probabilities.chunks_exact(n).collect();
        let sums: Vec<f32> = rows.iter().map(|row| row.iter().sum()).collect();
        let (first, rest) = sums.split_at(2 * n);
        let (kept, masked) = rest.split_at(2 * n);
        for sum in first.iter().chain(kept) {
            assert!((sum - 1.0).abs() < 1e-5, "{sum}");
        }
        assert!(masked.iter().all(|&sum| sum == 0.0));
        assert!(rows[0].iter().filter(|&&p| p == 0.0).count() > 10);
    }

    #[test]
    fn wrong_buffer_counts_and_sizes_are_reported() {
        let built = swiglu_case();
        let error = (built.case.check)(&[]).unwrap_err();
        assert_eq!(error, "`swiglu`: 0 output buffers, want 1");
        let short = vec![built.reference_outputs[0][2..].to_vec()];
        let error = (built.case.check)(&short).unwrap_err();
        assert_eq!(error, "`swiglu` output 0: 22198 bytes, want 22200");
    }

    #[test]
    fn cases_are_deterministic() {
        let first = cases();
        let second = cases();
        for (first, second) in first.iter().zip(&second) {
            assert_eq!(first.args, second.args, "{}", first.entry);
        }
    }
}
