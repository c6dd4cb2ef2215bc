//! The `bundle list` table, and its JSON (`bundle list --json`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::index::{Abi, Constant, Index, ModuleDeviceCode, Requirement};
use crate::target::Arch;

/// What `bundle list --json` prints: every kernel, with what a caller reads of it, and every
/// extension module with its builds and what each one's fatbin holds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BundleListing {
    /// The kernel library's package.
    pub package: String,
    /// The torch pin.
    pub torch: String,
    /// Every kernel, by name.
    pub kernels: BTreeMap<String, KernelListing>,
    /// Every extension module, as `<name> (module)` (the table's name for it).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub modules: BTreeMap<String, ModuleListing>,
}

/// One extension module of a [`BundleListing`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModuleListing {
    /// Its ABI: `stable` or `torch`.
    pub abi: Abi,
    /// Its declared archs (the device code inside).
    pub archs: Vec<Arch>,
    /// Its builds: CUDA build, CPU, torch range, compilers, sizes, key, device code.
    pub variants: Vec<ModuleVariantListing>,
    /// The builds not made, and why.
    pub skipped: Vec<ModuleSkipListing>,
}

/// A row of [`ModuleListing::variants`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ModuleVariantListing {
    /// `cu130`.
    pub build: String,
    /// `x86_64`.
    pub cpu: String,
    /// The torch versions it serves (`>=2.11`).
    pub torch: String,
    /// `nvcc 13.0.88`, then the host compiler.
    pub compilers: Vec<String>,
    /// The shared library's size.
    pub size: u64,
    /// Its stored (compressed) size.
    pub stored_size: u64,
    /// Its key, in full.
    pub key: String,
    /// What its fatbin holds for each arch, as the bundler read it (empty for a module without
    /// device code, or one bundled before fatbins were read).
    pub device_code: BTreeMap<Arch, ModuleDeviceCode>,
}

/// A row of [`ModuleListing::skipped`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ModuleSkipListing {
    /// `cu129`.
    pub build: String,
    /// `x86_64`.
    pub cpu: String,
    /// Why it was not built.
    pub reason: String,
}

/// One kernel of a [`BundleListing`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelListing {
    /// Its exported constants.
    pub constants: BTreeMap<String, Constant>,
    /// The names of the values a caller passes, that `requires` reads.
    pub inputs: Vec<String>,
    /// What it requires of them, in the order they are checked.
    pub requires: Vec<Requirement>,
    /// Its variants: build, arch, compiler, sizes, key.
    pub variants: Vec<VariantListing>,
    /// The targets without a variant, and why.
    pub skipped: Vec<SkipListing>,
}

/// A row of [`KernelListing::variants`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VariantListing {
    /// `cu130`.
    pub build: String,
    /// `sm_90a`.
    pub arch: String,
    /// `nvrtc 12.9.86`.
    pub compiler: String,
    /// The cubin's size.
    pub size: u64,
    /// Its stored (compressed) size.
    pub stored_size: u64,
    /// Its key, in full.
    pub key: String,
}

/// A row of [`KernelListing::skipped`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SkipListing {
    /// `cu129`.
    pub build: String,
    /// `sm_100a`.
    pub arch: String,
    /// Why it was not built.
    pub reason: String,
}

impl BundleListing {
    /// The listing of `index`.
    pub fn of(index: &Index) -> BundleListing {
        let kernels = index
            .kernels
            .iter()
            .map(|(name, record)| {
                let variants = record
                    .variants
                    .iter()
                    .map(|variant| VariantListing {
                        build: variant.cuda.to_string(),
                        arch: variant.arch.to_string(),
                        compiler: variant.compiler.to_string(),
                        size: variant.artifact.size,
                        stored_size: variant.artifact.stored_size,
                        key: variant.key.clone(),
                    })
                    .collect();
                let skipped = record
                    .skipped
                    .iter()
                    .map(|skip| SkipListing {
                        build: skip.cuda.to_string(),
                        arch: skip.arch.to_string(),
                        reason: skip.reason.clone(),
                    })
                    .collect();
                let listing = KernelListing {
                    constants: record.constants.clone(),
                    inputs: record.inputs.requires.inputs.clone(),
                    requires: record.inputs.requires.rules.clone(),
                    variants,
                    skipped,
                };
                (name.clone(), listing)
            })
            .collect();
        let modules = index
            .modules
            .iter()
            .map(|(name, record)| {
                let variants = record
                    .variants
                    .iter()
                    .map(|variant| ModuleVariantListing {
                        build: variant.cuda.to_string(),
                        cpu: variant.cpu.clone(),
                        torch: variant.torch.clone(),
                        compilers: variant.compilers.iter().map(ToString::to_string).collect(),
                        size: variant.artifact.size,
                        stored_size: variant.artifact.stored_size,
                        key: variant.key.clone(),
                        device_code: variant.device_code.clone(),
                    })
                    .collect();
                let skipped = record
                    .skipped
                    .iter()
                    .map(|skip| ModuleSkipListing {
                        build: skip.cuda.to_string(),
                        cpu: skip.cpu.clone(),
                        reason: skip.reason.clone(),
                    })
                    .collect();
                let listing = ModuleListing {
                    abi: record.abi,
                    archs: record.inputs.archs.clone(),
                    variants,
                    skipped,
                };
                (format!("{name} (module)"), listing)
            })
            .collect();
        BundleListing {
            package: index.package.clone(),
            torch: index.torch.clone(),
            kernels,
            modules,
        }
    }
}

/// The `bundle list` table: one row per variant and per skip.
pub fn list_bundle(index: &Index) -> String {
    let mut rows = vec![[
        "kernel".to_owned(),
        "build".into(),
        "arch".into(),
        "compiler".into(),
        "size".into(),
        "stored".into(),
        "key".into(),
        "skipped because".into(),
    ]];
    for (kernel, record) in &index.kernels {
        for variant in &record.variants {
            rows.push([
                kernel.clone(),
                variant.cuda.to_string(),
                variant.arch.to_string(),
                variant.compiler.to_string(),
                variant.artifact.size.to_string(),
                variant.artifact.stored_size.to_string(),
                variant.key[..12.min(variant.key.len())].to_owned(),
                String::new(),
            ]);
        }
        for skip in &record.skipped {
            rows.push([
                kernel.clone(),
                skip.cuda.to_string(),
                skip.arch.to_string(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                skip.reason.clone(),
            ]);
        }
    }
    // Extension modules after the kernels: `arch` is the module's CPU.
    for (name, record) in &index.modules {
        let kernel = format!("{name} (module)");
        for variant in &record.variants {
            let compilers: Vec<String> =
                variant.compilers.iter().map(ToString::to_string).collect();
            rows.push([
                kernel.clone(),
                variant.cuda.to_string(),
                variant.cpu.clone(),
                compilers.join(" + "),
                variant.artifact.size.to_string(),
                variant.artifact.stored_size.to_string(),
                variant.key[..12.min(variant.key.len())].to_owned(),
                String::new(),
            ]);
        }
        for skip in &record.skipped {
            let dash = || "-".to_owned();
            let cells = [kernel.clone(), skip.cuda.to_string(), skip.cpu.clone()];
            let [a, b, c] = cells;
            rows.push([a, b, c, dash(), dash(), dash(), dash(), skip.reason.clone()]);
        }
    }
    let mut out = render_table(&rows);
    // What each module's fatbin holds, by build and target, under the table.
    let mut device_code = Vec::new();
    for (name, record) in &index.modules {
        for variant in &record.variants {
            for (arch, code) in &variant.device_code {
                let mut line = format!("  {name} {} {arch}: {code}", variant.label());
                if !code.stubs.is_empty() {
                    let _ = write!(line, " ({})", crate::untrusted::listed_names(&code.stubs));
                }
                device_code.push(line);
            }
        }
    }
    if !device_code.is_empty() {
        out.push_str("\ndevice code of the extension modules:\n");
        for line in device_code {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// `rows` as columns, the first row the header; sizes aligned right.
fn render_table(rows: &[[String; 8]]) -> String {
    let mut widths = [0usize; 8];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (n, (cell, width)) in row.iter().zip(widths).enumerate() {
            if n > 0 {
                line.push_str("  ");
            }
            if n == 4 || n == 5 {
                let _ = write!(line, "{cell:>width$}");
            } else {
                let _ = write!(line, "{cell:<width$}");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{
        Abi, CompilerRecord, ModuleDeviceCode, ModuleInputs, ModuleRecord, ModuleVariant,
        StoredFile, INDEX_FORMAT,
    };

    #[test]
    fn modules_list_their_device_code_by_arch_under_the_table() {
        let code = |kernels, stubs: &[&str], registers| ModuleDeviceCode {
            images: 1,
            kernels,
            stubs: stubs.iter().map(|stub| (*stub).to_owned()).collect(),
            max_registers: registers,
            max_stack_bytes: registers.map(|_| 0),
            max_static_shared_bytes: registers.map(|_| 0),
        };
        let variant = ModuleVariant {
            cuda: "cu130".parse().unwrap(),
            cpu: "x86_64".into(),
            torch: ">=2.11".into(),
            compilers: vec![CompilerRecord {
                kind: "nvcc".into(),
                version: "13.0.88".into(),
            }],
            key: "k".repeat(64),
            artifact: StoredFile {
                digest: "d".repeat(64),
                size: 68960,
                path: String::new(),
                stored_size: 13409,
                dictionary: None,
            },
            device_code: BTreeMap::from([
                ("sm_90a".parse().unwrap(), code(1, &[], Some(16))),
                (
                    "sm_100a".parse().unwrap(),
                    code(2, &["only90_trap"], Some(40)),
                ),
                ("compute_90".parse().unwrap(), code(2, &[], None)),
            ]),
        };
        let index = Index {
            format: INDEX_FORMAT,
            store: None,
            package: "lib".into(),
            torch: "2.11.*".into(),
            dictionary: None,
            kernels: BTreeMap::new(),
            modules: BTreeMap::from([(
                "_C".to_owned(),
                ModuleRecord {
                    abi: Abi::Stable,
                    inputs: ModuleInputs::default(),
                    variants: vec![variant],
                    skipped: Vec::new(),
                },
            )]),
        };
        assert_eq!(
            list_bundle(&index),
            "kernel       build  arch    compiler       size  stored  key           skipped because\n\
             _C (module)  cu130  x86_64  nvcc 13.0.88  68960   13409  kkkkkkkkkkkk\n\
             \n\
             device code of the extension modules:\n  \
             _C cu130/x86_64 compute_90: 2 kernels in 1 image, 0 stubs\n  \
             _C cu130/x86_64 sm_90a: 1 kernel in 1 image, 0 stubs, up to 16 registers, 0-byte \
             stack, 0 bytes of static shared memory\n  \
             _C cu130/x86_64 sm_100a: 2 kernels in 1 image, 1 stub, up to 40 registers, 0-byte \
             stack, 0 bytes of static shared memory (`only90_trap`)\n"
        );
    }
}
