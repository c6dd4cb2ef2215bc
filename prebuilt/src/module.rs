//! Extension modules: a library's C++/CUDA torch extension (host launchers, op registration,
//! device code) built into one shared library per CUDA build × CPU arch (LibTorch stable ABI)
//! or per torch minor × CUDA build × CPU arch (classic ATen), shipped beside the cubins.
//!
//! The index records them in [`crate::Index::modules`] (and the loader's `kernels.idx` in its
//! meta); each variant's artifact is the zstd-compressed `.so`, named by the sha256 of the
//! uncompressed bytes ([`module_path`]). See `docs/extensions.md` and `docs/bundle-format.md`.
//! Building one, for the bundler and the module JIT alike, is [`compile`]'s.
//!
//! The module key is sha256 over length-prefixed fields, in this order:
//!
//! | input | why it is in the key |
//! | --- | --- |
//! | [`MODULE_KEY_FORMAT`] | bumping it invalidates every cached module when the key's definition changes |
//! | module name | it names the file and the library's `TORCH_EXTENSION_NAME` |
//! | ABI | stable and classic modules link against different torch symbols |
//! | translation units, in order | they are what is compiled and linked |
//! | include graph of every unit: (stable path, sha256), torch's headers included | any edit to a source, a header or torch's headers changes the code |
//! | defines, nvcc flags, host flags, C++ standard | they change the preprocessed source and the code |
//! | archs | the device code inside the module |
//! | CUDA build | the toolkit's headers and runtime the module links |
//! | CPU arch | the host machine code |
//! | torch target (the torch versions the module serves) | the stable ABI's target version, the classic ABI's minor |
//! | every compiler and its exact version (nvcc, the host compiler) | two compilers emit different code |
//!
//! Stable paths only, no timestamps: moving a checkout keeps the key.

pub mod compile;
pub mod fatbin;

use std::fmt;
use std::path::Path;

use crate::bundle::{read_stored, BundleError, FrameDictionary, ARTIFACTS_DIR};
use crate::index::CompilerRecord;
pub use crate::index::{
    Abi, ModuleDeviceCode, ModuleInputs, ModuleRecord, ModuleSkip, ModuleVariant,
};
use crate::key::KeyHasher;
use crate::select::TorchPin;
use crate::CudaBuild;
pub use compile::{build_module, ModuleCompileError, ModuleRecipe, ModuleStep};

/// The CPU architectures modules are built for when an extension names none (`cpus`), in the
/// order a wheel's tags list them.
pub const MODULE_CPUS: [&str; 2] = ["x86_64", "aarch64"];

/// Version of the module key's definition. Bump it whenever an input is added, removed or
/// encoded differently, or the recipe ([`compile`]) builds other bytes from the same inputs
/// (2: the key's work folder, the key as build id, glibc 2.28 symbols).
pub const MODULE_KEY_FORMAT: u64 = 2;

/// Everything a module variant's key is computed from.
#[derive(Clone, Copy, Debug)]
pub struct ModuleKeyInputs<'a> {
    /// The module's name in the manifest.
    pub name: &'a str,
    /// Its ABI.
    pub abi: Abi,
    /// The inputs common to its variants.
    pub inputs: &'a ModuleInputs,
    /// The CUDA build.
    pub cuda: CudaBuild,
    /// The CPU architecture.
    pub cpu: &'a str,
    /// The torch versions it serves ([`ModuleVariant::torch`]).
    pub torch: &'a str,
    /// Every compiler, with its exact version.
    pub compilers: &'a [CompilerRecord],
}

/// The key of one module variant: lowercase hex sha256 (see the module docs for its inputs).
pub fn module_key(key: &ModuleKeyInputs<'_>) -> String {
    let mut hasher = KeyHasher::new(MODULE_KEY_FORMAT);
    hasher.bytes(key.name.as_bytes());
    hasher.bytes(key.abi.to_string().as_bytes());
    if key.abi == Abi::Torch {
        // What `<torch/extension.h>` reads is kwheel's, not the graph's.
        hasher.bytes(CLASSIC_EXTENSION_H.as_bytes());
    }
    let inputs = key.inputs;
    hasher.strings(&inputs.sources);
    hasher.pairs(&inputs.files);
    hasher.pairs(&inputs.defines);
    hasher.strings(&inputs.nvcc_flags);
    hasher.strings(&inputs.cxx_flags);
    hasher.bytes(inputs.cxx_std.as_bytes());
    let archs: Vec<String> = inputs.archs.iter().map(ToString::to_string).collect();
    hasher.strings(&archs);
    hasher.bytes(key.cuda.to_string().as_bytes());
    hasher.bytes(key.cpu.as_bytes());
    hasher.bytes(key.torch.as_bytes());
    hasher.count(key.compilers.len());
    for compiler in key.compilers {
        hasher.bytes(compiler.kind.as_bytes());
        hasher.bytes(compiler.version.as_bytes());
    }
    hasher.finish()
}

/// What a classic-ABI module's `#include <torch/extension.h>` reads: torch's C++ API
/// without its Python half (`<torch/python.h>`, pybind11, `Python.h`). A module serves every
/// Python its wheel's `py3-none` tag names; pybind11's headers alone leave a module needing
/// symbols of the Python it was built with (`_PyThreadState_UncheckedGet`, gone in 3.13), so
/// the bundler and the module JIT put this header first on the include path. A source that
/// calls pybind11 itself still gets Python's headers, and the wheel audit refuses the module.
pub const CLASSIC_EXTENSION_H: &str = "// kwheel: <torch/extension.h> without its Python half.
#pragma once
#include <torch/all.h>
#include <torch/library.h>
";

/// Writes [`CLASSIC_EXTENSION_H`] as `torch/extension.h` under `dir`, the folder to put first
/// on a classic-ABI module's include path.
pub fn write_classic_extension_h(dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("torch"))?;
    std::fs::write(dir.join("torch/extension.h"), CLASSIC_EXTENSION_H)
}

/// The stored path of a module with this digest: `artifacts/<2 hex>/<digest>.so.zst`.
pub fn module_path(digest: &str) -> String {
    let shard = digest.get(..2).unwrap_or(digest);
    format!("{ARTIFACTS_DIR}/{shard}/{digest}.so.zst")
}

/// The torch versions a module built against the torch pin `pin` serves: the stable ABI
/// serves every torch from the pin's version on (`2.11.*` → `>=2.11`), the classic one the
/// pin's minor only (`2.11.*` → `==2.11.*`). `None` when the pin names no version to start
/// from (`*`, `>=2.9,<3` where the ABI needs one minor).
pub fn torch_served(abi: Abi, pin: &str) -> Option<String> {
    let (major, minor) = torch_minor(pin)?;
    Some(match abi {
        Abi::Stable => format!(">={major}.{minor}"),
        Abi::Torch => format!("=={major}.{minor}.*"),
    })
}

/// The (major, minor) a torch pin or version starts from: `2.11.*`, `==2.11.*`, `2.11` and
/// `2.11.0+cu130` are all (2, 11); `None` for a pin that names no one version (`*`,
/// `>=2.9,<3`).
pub fn torch_minor(text: &str) -> Option<(u32, u32)> {
    let text = text.trim().trim_start_matches("==").trim();
    let mut parts = text.split('.');
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next()?.trim_end_matches('*').parse().ok()?;
    Some((major, minor))
}

/// A stable-ABI module's `torch-target` (`2.11`) as (major, minor); `None` unless it is
/// exactly two dotted numbers.
pub fn torch_target_version(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.split_once('.')?;
    let number = |part: &str| {
        (!part.is_empty() && part.chars().all(|c| c.is_ascii_digit()))
            .then(|| part.parse::<u32>().ok())
            .flatten()
    };
    Some((number(major)?, number(minor)?))
}

/// The value of `TORCH_TARGET_VERSION` for torch `major.minor`, as torch's
/// `torch/csrc/stable/version.h` encodes it (`0x020b000000000000` for 2.11): the stable
/// headers then offer only what that torch has, and the module asks for that ABI at load.
pub fn torch_target_define((major, minor): (u32, u32)) -> String {
    format!(
        "0x{:016x}",
        (u64::from(major) << 56) | (u64::from(minor) << 48)
    )
}

/// What a process offers a module: its torch, torch's CUDA build, its CPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleHost<'a> {
    /// `torch.__version__` (`2.11.0+cu130`).
    pub torch: &'a str,
    /// torch's CUDA build (`torch.version.cuda` as a build, `cu130`); `None` for a CPU torch.
    pub cuda: Option<CudaBuild>,
    /// The CPU architecture (`x86_64`).
    pub cpu: &'a str,
}

impl fmt::Display for ModuleHost<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cuda {
            Some(cuda) => write!(f, "torch {} ({cuda}) on {}", self.torch, self.cpu),
            None => write!(f, "torch {} (no CUDA) on {}", self.torch, self.cpu),
        }
    }
}

/// No variant of a module fits this process.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("extension module `{module}` has no build for {host}: {}", reasons.join("; "))]
pub struct NoModuleFit {
    /// The module.
    pub module: String,
    /// What the process offers, as [`ModuleHost`] words it.
    pub host: String,
    /// Each variant and skipped target with why it does not fit.
    pub reasons: Vec<String>,
}

/// The variant of `record` (module `name`) that `host` loads: the one of its CUDA build and
/// CPU whose torch range holds its torch; else why none fits, naming each variant. A pure
/// function, tested without torch.
pub fn select_module<'r>(
    name: &str,
    record: &'r ModuleRecord,
    host: &ModuleHost<'_>,
) -> Result<&'r ModuleVariant, NoModuleFit> {
    select_module_where(record, host.cpu, host.cuda, Some(host.torch)).map_err(|reasons| {
        NoModuleFit {
            module: name.to_owned(),
            host: host.to_string(),
            reasons,
        }
    })
}

/// [`select_module`]'s rule, with the torch check left out where `torch` is `None` (`dev
/// coverage` without `--torch`): the variant of this CUDA build and CPU whose torch range
/// holds `torch`; else why none fits, one reason per variant and skipped target.
pub fn select_module_where<'r>(
    record: &'r ModuleRecord,
    cpu: &str,
    cuda: Option<CudaBuild>,
    torch: Option<&str>,
) -> Result<&'r ModuleVariant, Vec<String>> {
    let mut reasons = Vec::new();
    for variant in &record.variants {
        let label = variant.label();
        let reason = if variant.cpu != cpu {
            format!("{label} is for {} CPUs", variant.cpu)
        } else if cuda != Some(variant.cuda) {
            match cuda {
                Some(cuda) => format!("{label} links {}, not {cuda}", variant.cuda),
                None => format!("{label} needs a {} torch, not a CPU-only one", variant.cuda),
            }
        } else if torch.is_some_and(|torch| {
            !TorchPin::parse(&variant.torch).is_ok_and(|pin| pin.matches(torch))
        }) {
            format!("{label} serves torch {}", variant.torch)
        } else {
            return Ok(variant);
        };
        reasons.push(reason);
    }
    for skip in &record.skipped {
        reasons.push(format!(
            "{}/{} was not built: {}",
            skip.cuda, skip.cpu, skip.reason
        ));
    }
    if reasons.is_empty() {
        reasons.push("the bundle holds no build of it".into());
    }
    Err(reasons)
}

/// Reads module `name`'s `variant` from the bundle at `root`: its stored file checked,
/// decompressed (at most its recorded size) and verified against its sha256, so the bytes
/// returned are the bytes verified.
pub fn read_module(
    root: &Path,
    name: &str,
    variant: &ModuleVariant,
) -> Result<Vec<u8>, BundleError> {
    read_stored(
        root,
        &variant.artifact,
        FrameDictionary::None,
        name,
        &variant.label(),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::index::StoredFile;

    fn inputs() -> ModuleInputs {
        ModuleInputs {
            sources: vec!["csrc/ops.cpp".into(), "csrc/ops.cu".into()],
            files: BTreeMap::from([("csrc/ops.cpp".into(), "ab".repeat(32))]),
            defines: BTreeMap::from([("FAST".into(), "1".into())]),
            nvcc_flags: vec!["--use_fast_math".into()],
            cxx_flags: vec!["-O3".into()],
            cxx_std: "c++17".into(),
            archs: vec!["sm_90a".parse().unwrap()],
            include_dirs: vec!["csrc".into()],
        }
    }

    fn compilers() -> Vec<CompilerRecord> {
        vec![
            CompilerRecord {
                kind: "nvcc".into(),
                version: "13.0.88".into(),
            },
            CompilerRecord {
                kind: "g++".into(),
                version: "12.2.0".into(),
            },
        ]
    }

    fn key_of(change: impl FnOnce(&mut ModuleInputs, &mut Vec<CompilerRecord>) -> Abi) -> String {
        let mut inputs = inputs();
        let mut compilers = compilers();
        let abi = change(&mut inputs, &mut compilers);
        module_key(&ModuleKeyInputs {
            name: "_C",
            abi,
            inputs: &inputs,
            cuda: "cu130".parse().unwrap(),
            cpu: "x86_64",
            torch: ">=2.11",
            compilers: &compilers,
        })
    }

    #[test]
    fn every_input_changes_the_key() {
        let base = key_of(|_, _| Abi::Stable);
        assert_eq!(base.len(), 64);
        assert_eq!(base, key_of(|_, _| Abi::Stable), "the key is deterministic");
        let changed = [
            key_of(|_, _| Abi::Torch),
            key_of(|i, _| {
                i.sources.reverse();
                Abi::Stable
            }),
            key_of(|i, _| {
                i.files.insert("csrc/ops.cpp".into(), "cd".repeat(32));
                Abi::Stable
            }),
            key_of(|i, _| {
                i.defines.insert("FAST".into(), "0".into());
                Abi::Stable
            }),
            key_of(|i, _| {
                i.nvcc_flags.clear();
                Abi::Stable
            }),
            key_of(|i, _| {
                i.cxx_flags.push("-g".into());
                Abi::Stable
            }),
            key_of(|i, _| {
                i.cxx_std = "c++20".into();
                Abi::Stable
            }),
            key_of(|i, _| {
                i.archs.push("sm_100a".parse().unwrap());
                Abi::Stable
            }),
            key_of(|_, c| {
                c[1].version = "13.1.0".into();
                Abi::Stable
            }),
        ];
        for (n, key) in changed.iter().enumerate() {
            assert_ne!(*key, base, "change {n} keeps the key");
        }
        let inputs = inputs();
        let compilers = compilers();
        let with = |cuda: &str, cpu: &str, torch: &str| {
            module_key(&ModuleKeyInputs {
                name: "_C",
                abi: Abi::Stable,
                inputs: &inputs,
                cuda: cuda.parse().unwrap(),
                cpu,
                torch,
                compilers: &compilers,
            })
        };
        assert_eq!(with("cu130", "x86_64", ">=2.11"), base);
        for key in [
            with("cu129", "x86_64", ">=2.11"),
            with("cu130", "aarch64", ">=2.11"),
            with("cu130", "x86_64", ">=2.12"),
        ] {
            assert_ne!(key, base);
        }
    }

    #[test]
    fn the_stable_abi_serves_newer_torches_and_the_classic_one_its_minor() {
        assert_eq!(
            torch_served(Abi::Stable, "2.11.*").as_deref(),
            Some(">=2.11")
        );
        assert_eq!(
            torch_served(Abi::Stable, "==2.13.*").as_deref(),
            Some(">=2.13")
        );
        assert_eq!(
            torch_served(Abi::Torch, "2.11.*").as_deref(),
            Some("==2.11.*")
        );
        assert_eq!(torch_minor("2.11.0+cu130"), Some((2, 11)));
        assert_eq!(torch_minor("==2.13.*"), Some((2, 13)));
        assert_eq!(torch_minor(">=2.9,<3"), None);
        assert_eq!(torch_target_version("2.11"), Some((2, 11)));
        for text in ["2", "2.11.0", "2.x", ".11", "2.", "v2.11", "2.+1"] {
            assert_eq!(torch_target_version(text), None, "{text}");
        }
        assert_eq!(torch_target_define((2, 11)), "0x020b000000000000");
        assert_eq!(torch_target_define((2, 9)), "0x0209000000000000");
        assert_eq!(torch_served(Abi::Torch, "*"), None);
        assert_eq!(torch_served(Abi::Stable, ">=2.9,<3"), None);
    }

    fn record() -> ModuleRecord {
        let variant = |cuda: &str, cpu: &str, torch: &str| ModuleVariant {
            cuda: cuda.parse().unwrap(),
            cpu: cpu.into(),
            torch: torch.into(),
            compilers: compilers(),
            key: "k".repeat(64),
            artifact: StoredFile {
                digest: "d".repeat(64),
                size: 1,
                path: module_path(&"d".repeat(64)),
                stored_size: 1,
                dictionary: None,
            },
            device_code: BTreeMap::new(),
        };
        ModuleRecord {
            abi: Abi::Stable,
            inputs: inputs(),
            variants: vec![variant("cu130", "x86_64", ">=2.11")],
            skipped: vec![ModuleSkip {
                cuda: "cu129".parse().unwrap(),
                cpu: "x86_64".into(),
                reason: "no nvcc".into(),
            }],
        }
    }

    #[test]
    fn a_module_is_chosen_by_cuda_build_cpu_and_torch_and_refused_with_reasons() {
        let record = record();
        let host = |torch, cuda: Option<&str>, cpu| ModuleHost {
            torch,
            cuda: cuda.map(|cuda| cuda.parse().unwrap()),
            cpu,
        };
        let chosen = select_module(
            "_C",
            &record,
            &host("2.13.0+cu130", Some("cu130"), "x86_64"),
        );
        assert_eq!(chosen.unwrap().label(), "cu130/x86_64");
        let refused = |torch, cuda, cpu| {
            select_module("_C", &record, &host(torch, cuda, cpu))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            refused("2.11.0+cu129", Some("cu129"), "x86_64"),
            "extension module `_C` has no build for torch 2.11.0+cu129 (cu129) on x86_64: \
             cu130/x86_64 links cu130, not cu129; cu129/x86_64 was not built: no nvcc"
        );
        assert!(refused("2.10.0+cu130", Some("cu130"), "x86_64")
            .contains("cu130/x86_64 serves torch >=2.11"));
        assert!(refused("2.11.0", None, "x86_64").contains("needs a cu130 torch"));
        assert!(refused("2.11.0+cu130", Some("cu130"), "aarch64").contains("is for x86_64 CPUs"));
    }
}
