//! Whether an extension module's device code runs on a device, and what `status()` says of a
//! module: pure functions over the index's record, tested on a CPU.
//!
//! A module's fatbin holds one image per declared arch (`ModuleInputs::archs`: SASS for
//! `sm_90a`, `sm_100f`, `sm_90`; PTX for `compute_90`, [`crate::module::compile::gencode`]),
//! and an image runs on a device by the rules a kernel's cubin follows ([`runs_on`]):
//!
//! | declared | covers |
//! | --- | --- |
//! | `sm_90a` | 9.0 only |
//! | `sm_100f`, `sm_100` | 10.x |
//! | `compute_90` | 9.0 and later, compiled by the driver on first load |
//!
//! A module with no CUDA unit has no device code, and covers every device. The device is read
//! from NVML ([`crate::nvml`]) when the process has not initialised CUDA, so neither `import`
//! nor `status()` creates a context (`docs/extensions.md`).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::index::{ModuleInputs, ModuleRecord};
use crate::module::compile::is_cuda_source;
use crate::module::{select_module, select_module_where, ModuleHost};
use crate::select::runs_on;
use crate::target::Arch;

/// A device as a module's check names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleDevice {
    /// Its CUDA ordinal.
    pub ordinal: u32,
    /// Its name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// Its compute capability.
    pub capability: (u32, u32),
}

impl fmt::Display for ModuleDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (major, minor) = self.capability;
        write!(
            f,
            "cuda:{} ({}, compute capability {major}.{minor})",
            self.ordinal, self.name
        )
    }
}

impl From<crate::nvml::NvmlDevice> for ModuleDevice {
    fn from(device: crate::nvml::NvmlDevice) -> ModuleDevice {
        ModuleDevice {
            ordinal: device.ordinal,
            name: device.name,
            capability: device.capability,
        }
    }
}

/// The visible GPUs from NVML ([`crate::nvml::visible_devices`]), without a CUDA context,
/// else why NVML cannot say, on one line.
pub fn visible_module_devices() -> Result<Vec<ModuleDevice>, String> {
    crate::nvml::visible_devices()
        .map(|devices| devices.into_iter().map(ModuleDevice::from).collect())
        .map_err(|error| crate::error_chain(&error))
}

/// Whether a module of these inputs has device code at all (a CUDA translation unit).
pub fn has_device_code(inputs: &ModuleInputs) -> bool {
    inputs.sources.iter().any(|source| is_cuda_source(source))
}

/// The declared archs whose image runs on a device of `capability`, in declared order.
pub fn covering_archs(archs: &[Arch], capability: (u32, u32)) -> Vec<Arch> {
    archs
        .iter()
        .copied()
        .filter(|arch| runs_on(*arch, capability))
        .collect()
}

/// Whether the module of `record` can run its device code on a device of `capability`: it has
/// none, or one of its declared archs runs there.
pub fn module_covers(record: &ModuleRecord, capability: (u32, u32)) -> bool {
    !has_device_code(&record.inputs) || !covering_archs(&record.inputs.archs, capability).is_empty()
}

/// `sm_90a, sm_100a`.
pub fn arch_list(archs: &[Arch]) -> String {
    match archs.is_empty() {
        true => "none".to_owned(),
        false => archs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// `sm_90` for 9.0: the device's own arch, as the status names what covers it.
fn device_sm((major, minor): (u32, u32)) -> String {
    format!("sm_{major}{minor}")
}

/// The warning for module `name` of `record`, loaded as `variant`, when some of `devices` (the
/// visible ones, from NVML) are not covered by its archs: the first launch of one of its CUDA
/// ops there would fail with CUDA's bare "no kernel image is available". `None` when every
/// device is covered.
pub fn uncovered_warning(
    name: &str,
    variant: &str,
    record: &ModuleRecord,
    devices: &[ModuleDevice],
) -> Option<String> {
    let uncovered: Vec<String> = devices
        .iter()
        .filter(|device| !module_covers(record, device.capability))
        .map(ToString::to_string)
        .collect();
    if uncovered.is_empty() {
        return None;
    }
    Some(format!(
        "extension module `{name}` ({variant}) has no device code for {}: its archs are {}; \
         its CUDA ops will fail there with \"no kernel image is available\" (install a build \
         of the library with one of these devices' archs)",
        uncovered.join(" or "),
        arch_list(&record.inputs.archs)
    ))
}

/// A module's line of a `dev coverage` report: the build that the runtime's CUDA build, torch
/// and CPU load, and whether the fatbin recorded for it (`ModuleVariant::device_code`) holds an
/// image that runs on the device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleCoverage {
    /// The label of the build that loads and whose device code runs there (`cu130/x86_64`);
    /// `None` when no build fits or its fatbin has nothing for the device.
    pub loads: Option<String>,
    /// The archs of that build's fatbin that run on the device, in order; empty for a module
    /// without device code, or when nothing loads.
    pub covering: Vec<Arch>,
    /// Why it runs there, or why not.
    pub reason: String,
    /// When no build fits: each build and skipped target, and why it does not fit.
    pub refusals: Vec<String>,
}

/// [`ModuleCoverage`] of `record` for a device of `capability` in a process whose torch has
/// CUDA build `cuda` and runs on `cpu`; `torch` `None` leaves the torch range unchecked. The
/// build is chosen by [`select_module_where`], the import's rule.
pub fn module_coverage(
    record: &ModuleRecord,
    capability: (u32, u32),
    cuda: crate::CudaBuild,
    cpu: &str,
    torch: Option<&str>,
) -> ModuleCoverage {
    let variant = match select_module_where(record, cpu, Some(cuda), torch) {
        Ok(variant) => variant,
        Err(refusals) => {
            return ModuleCoverage {
                loads: None,
                covering: Vec::new(),
                reason: match torch {
                    Some(torch) => {
                        format!("nothing fits: no build for {cuda}, torch {torch}, {cpu}")
                    }
                    None => format!("nothing fits: no build for {cuda}, {cpu}"),
                },
                refusals,
            }
        }
    };
    let label = variant.label();
    let (major, minor) = capability;
    let fits = |covering: Vec<Arch>, reason: String| ModuleCoverage {
        loads: Some(label.clone()),
        covering,
        reason,
        refusals: Vec::new(),
    };
    if !has_device_code(&record.inputs) {
        return fits(
            Vec::new(),
            "it has no device code: it fits every GPU".to_owned(),
        );
    }
    // What the fatbin holds, as the bundler read it; an index written before fatbins were
    // read has only the declared archs, which the bundler checked the fatbin held.
    let (fatbin, source): (Vec<Arch>, &str) = match variant.device_code.is_empty() {
        false => (
            variant.device_code.keys().copied().collect(),
            "its fatbin holds",
        ),
        true => (
            record.inputs.archs.clone(),
            "its fatbin was not read when bundled; it declares",
        ),
    };
    let covering = covering_archs(&fatbin, capability);
    if covering.is_empty() {
        return ModuleCoverage {
            loads: None,
            covering,
            reason: format!(
                "{label}: {source} {}, none of which runs on {major}.{minor}: its CUDA ops \
                 fail there with \"no kernel image is available\"",
                arch_list(&fatbin)
            ),
            refusals: Vec::new(),
        };
    }
    let reason = format!(
        "{source} {}; {} runs on {major}.{minor}",
        arch_list(&fatbin),
        arch_list(&covering)
    );
    fits(covering, reason)
}

/// How a module came into this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleSource {
    /// A shipped build, loaded at import.
    Shipped,
    /// Built at import by the JIT fallback.
    JitCompiled,
    /// Read at import from the JIT cache.
    JitCache,
}

impl ModuleSource {
    /// `module`, `jit-compiled`, `jit-cache`: the binding's and `provenance()`'s words.
    pub fn parse(text: &str) -> Option<ModuleSource> {
        match text {
            "module" => Some(ModuleSource::Shipped),
            "jit-compiled" => Some(ModuleSource::JitCompiled),
            "jit-cache" => Some(ModuleSource::JitCache),
            _ => None,
        }
    }

    fn provenance(self) -> &'static str {
        match self {
            ModuleSource::Shipped => "module",
            ModuleSource::JitCompiled => "jit-compiled",
            ModuleSource::JitCache => "jit-cache",
        }
    }

    fn how(self) -> &'static str {
        match self {
            ModuleSource::Shipped => "loaded at import",
            ModuleSource::JitCompiled => "built at import by the JIT fallback",
            ModuleSource::JitCache => "read at import from the JIT cache",
        }
    }
}

/// Whether this process has the module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModuleLoad<'a> {
    /// Loaded, as `variant` (`cu130/x86_64`), against torch `torch`.
    Loaded {
        /// The variant's label.
        variant: &'a str,
        /// How.
        source: ModuleSource,
        /// `torch.__version__`.
        torch: &'a str,
    },
    /// Not loaded; `host` is what the process offers, `None` when it has not imported torch.
    NotLoaded {
        /// The running torch, its CUDA build and the CPU.
        host: Option<ModuleHost<'a>>,
    },
}

/// What the process knows of the device a status is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceSight {
    /// Read (from NVML, or from torch where CUDA is initialised).
    Seen(ModuleDevice),
    /// Not read, and why (no NVML, no such device).
    Unseen(String),
}

/// What `status()` says of a module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModuleStatus {
    /// Loaded, and its device code runs on the device (or the device could not be read).
    Available {
        /// `module cu130/x86_64`, `jit-compiled cu130/x86_64`.
        variant: String,
        /// How it came and what covers the device.
        reason: String,
    },
    /// Not loaded, or loaded without device code for the device.
    Unavailable {
        /// Why, in a sentence a user can act on.
        reason: String,
    },
}

impl ModuleStatus {
    /// Whether it is available.
    pub fn is_available(&self) -> bool {
        matches!(self, ModuleStatus::Available { .. })
    }
}

impl fmt::Display for ModuleStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModuleStatus::Available { variant, reason } => {
                write!(f, "available: {variant}: {reason}")
            }
            ModuleStatus::Unavailable { reason } => write!(f, "unavailable: {reason}"),
        }
    }
}

/// The status of module `name` of `record` in a process where it is `load`ed (or not), for a
/// device as `sight` has it. The reasons a module does not load are [`select_module`]'s, the
/// words of the `NoFitError` an import raises.
pub fn module_status(
    name: &str,
    record: &ModuleRecord,
    load: &ModuleLoad<'_>,
    sight: &DeviceSight,
) -> ModuleStatus {
    let (variant, source, torch) = match load {
        ModuleLoad::Loaded {
            variant,
            source,
            torch,
        } => (*variant, *source, *torch),
        ModuleLoad::NotLoaded { host: None } => {
            return ModuleStatus::Unavailable {
                reason: format!(
                    "extension module `{name}` is not loaded: this process has not imported \
                     torch, and a module loads with it (`kwheel.open` at the package's import)"
                ),
            }
        }
        ModuleLoad::NotLoaded { host: Some(host) } => {
            let reason = match select_module(name, record, host) {
                Ok(variant) => format!(
                    "extension module `{name}` is not loaded in this process: {} fits {host}, \
                     and `kwheel.open` of its package loads it",
                    variant.label()
                ),
                Err(refusal) => refusal.to_string(),
            };
            return ModuleStatus::Unavailable { reason };
        }
    };
    let loaded = format!("{} (torch {torch})", source.how());
    let variant = format!("{} {variant}", source.provenance());
    if !has_device_code(&record.inputs) {
        return ModuleStatus::Available {
            variant,
            reason: format!("{loaded}; it has no device code"),
        };
    }
    let archs = &record.inputs.archs;
    match sight {
        DeviceSight::Unseen(why) => ModuleStatus::Available {
            variant,
            reason: format!(
                "{loaded}; the device was not checked against its archs ({}): {why}",
                arch_list(archs)
            ),
        },
        DeviceSight::Seen(device) => {
            let covering = covering_archs(archs, device.capability);
            match covering.is_empty() {
                false => ModuleStatus::Available {
                    variant,
                    reason: format!(
                        "{loaded}; its fatbin covers {} ({}) on {device}",
                        device_sm(device.capability),
                        arch_list(&covering)
                    ),
                },
                true => ModuleStatus::Unavailable {
                    reason: format!(
                        "extension module `{name}` ({variant}, {loaded}) has no device code for \
                         {device}: its archs are {}; its CUDA ops fail there with \"no kernel \
                         image is available\"",
                        arch_list(archs)
                    ),
                },
            }
        }
    }
}

/// The archs the module JIT builds for, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JitArchs {
    /// The declared archs that run on the visible devices.
    Fitting {
        /// Those archs, in declared order.
        archs: Vec<Arch>,
        /// The devices, as [`ModuleDevice`] names them.
        devices: Vec<String>,
    },
    /// Every declared arch, and why not fewer.
    Declared {
        /// The declared archs.
        archs: Vec<Arch>,
        /// Why (no NVML, no visible device, none of them fits).
        why: String,
    },
}

impl JitArchs {
    /// The archs to build for.
    pub fn archs(&self) -> &[Arch] {
        match self {
            JitArchs::Fitting { archs, .. } | JitArchs::Declared { archs, .. } => archs,
        }
    }
}

impl fmt::Display for JitArchs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JitArchs::Fitting { archs, devices } => {
                write!(
                    f,
                    "for {} (the declared archs that run on {})",
                    arch_list(archs),
                    devices.join(", ")
                )
            }
            JitArchs::Declared { archs, why } => {
                write!(f, "for every declared arch, {} ({why})", arch_list(archs))
            }
        }
    }
}

/// Which of the module's declared archs the module JIT builds for: those that run on one of
/// `devices` (the visible ones, read from NVML), else all of them, saying why: the module has
/// no device code, NVML could not say (`devices` is `Err` with its reason), it shows no
/// device, or none of the archs runs on one (the import's warning names the devices).
pub fn jit_archs(record: &ModuleRecord, devices: Result<&[ModuleDevice], &str>) -> JitArchs {
    let declared = &record.inputs.archs;
    let declared_with = |why: String| JitArchs::Declared {
        archs: declared.clone(),
        why,
    };
    if !has_device_code(&record.inputs) {
        return declared_with("it has no device code".to_owned());
    }
    let devices = match devices {
        Err(why) => return declared_with(why.to_owned()),
        Ok([]) => return declared_with("NVML shows no visible device".to_owned()),
        Ok(devices) => devices,
    };
    let names: Vec<String> = devices.iter().map(ToString::to_string).collect();
    let archs: Vec<Arch> = declared
        .iter()
        .copied()
        .filter(|arch| {
            devices
                .iter()
                .any(|device| runs_on(*arch, device.capability))
        })
        .collect();
    match archs.is_empty() {
        true => declared_with(format!("none of them runs on {}", names.join(", "))),
        false => JitArchs::Fitting {
            archs,
            devices: names,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{Abi, ModuleInputs, ModuleSkip, ModuleVariant, StoredFile};

    fn arch(text: &str) -> Arch {
        text.parse().unwrap()
    }

    fn archs(texts: &[&str]) -> Vec<Arch> {
        texts.iter().map(|text| arch(text)).collect()
    }

    fn record(declared: &[&str]) -> ModuleRecord {
        ModuleRecord {
            abi: Abi::Stable,
            inputs: ModuleInputs {
                sources: vec!["csrc/ops.cpp".into(), "csrc/ops.cu".into()],
                cxx_std: "c++17".into(),
                archs: archs(declared),
                ..Default::default()
            },
            variants: vec![ModuleVariant {
                cuda: "cu130".parse().unwrap(),
                cpu: "x86_64".into(),
                torch: ">=2.11".into(),
                compilers: Vec::new(),
                key: "k".repeat(64),
                artifact: StoredFile {
                    digest: "d".repeat(64),
                    size: 1,
                    path: crate::module::module_path(&"d".repeat(64)),
                    stored_size: 1,
                    dictionary: None,
                },
                device_code: Default::default(),
            }],
            skipped: vec![ModuleSkip {
                cuda: "cu129".parse().unwrap(),
                cpu: "x86_64".into(),
                reason: "no nvcc".into(),
            }],
        }
    }

    fn device(capability: (u32, u32)) -> ModuleDevice {
        let name = match capability {
            (9, 0) => "NVIDIA H100 80GB HBM3",
            (10, 0) => "NVIDIA B200",
            (10, 3) => "NVIDIA B300",
            _ => "NVIDIA A100-SXM4-80GB",
        };
        ModuleDevice {
            ordinal: 0,
            name: name.into(),
            capability,
        }
    }

    #[test]
    fn archs_cover_devices_by_the_cubin_rules() {
        let declared = archs(&["sm_90a", "sm_100f", "compute_90"]);
        assert_eq!(
            covering_archs(&declared, (9, 0)),
            archs(&["sm_90a", "compute_90"])
        );
        assert_eq!(
            covering_archs(&declared, (10, 3)),
            archs(&["sm_100f", "compute_90"])
        );
        assert_eq!(covering_archs(&declared, (8, 0)), Vec::<Arch>::new());
        // sm_90a runs on 9.0 only; PTX on any later device.
        assert_eq!(
            covering_archs(&archs(&["sm_90a"]), (10, 0)),
            Vec::<Arch>::new()
        );
        assert_eq!(
            covering_archs(&archs(&["compute_90"]), (12, 0)),
            archs(&["compute_90"])
        );
        assert!(module_covers(&record(&["sm_90a", "sm_100a"]), (10, 0)));
        assert!(!module_covers(&record(&["sm_90a", "sm_100a"]), (10, 3)));
        // No CUDA unit: no device code, nothing to miss.
        let mut host_only = record(&["sm_90a"]);
        host_only
            .inputs
            .sources
            .retain(|source| source.ends_with(".cpp"));
        assert!(module_covers(&host_only, (8, 0)));
    }

    #[test]
    fn a_loaded_module_is_available_where_its_archs_cover_the_device() {
        let record = record(&["sm_90a", "sm_100a"]);
        let loaded = ModuleLoad::Loaded {
            variant: "cu130/x86_64",
            source: ModuleSource::Shipped,
            torch: "2.11.0+cu130",
        };
        let status = |sight| module_status("_C", &record, &loaded, &sight).to_string();
        assert_eq!(
            status(DeviceSight::Seen(device((9, 0)))),
            "available: module cu130/x86_64: loaded at import (torch 2.11.0+cu130); its fatbin \
             covers sm_90 (sm_90a) on cuda:0 (NVIDIA H100 80GB HBM3, compute capability 9.0)"
        );
        assert_eq!(
            status(DeviceSight::Seen(device((8, 0)))),
            "unavailable: extension module `_C` (module cu130/x86_64, loaded at import (torch \
             2.11.0+cu130)) has no device code for cuda:0 (NVIDIA A100-SXM4-80GB, compute \
             capability 8.0): its archs are sm_90a, sm_100a; its CUDA ops fail there with \"no \
             kernel image is available\""
        );
        assert_eq!(
            status(DeviceSight::Unseen("NVML could not be loaded".into())),
            "available: module cu130/x86_64: loaded at import (torch 2.11.0+cu130); the device \
             was not checked against its archs (sm_90a, sm_100a): NVML could not be loaded"
        );
        let jit = ModuleLoad::Loaded {
            variant: "cu130/x86_64",
            source: ModuleSource::JitCache,
            torch: "2.11.0+cu130",
        };
        assert!(
            module_status("_C", &record, &jit, &DeviceSight::Seen(device((10, 0))))
                .to_string()
                .starts_with(
                    "available: jit-cache cu130/x86_64: read at import from the JIT cache"
                )
        );
    }

    #[test]
    fn a_module_not_loaded_says_why_in_the_import_s_words() {
        let record = record(&["sm_90a"]);
        let sight = DeviceSight::Seen(device((9, 0)));
        let status = |host| module_status("_C", &record, &ModuleLoad::NotLoaded { host }, &sight);
        let host = |torch, cuda: Option<&str>| ModuleHost {
            torch,
            cuda: cuda.map(|cuda| cuda.parse().unwrap()),
            cpu: "x86_64",
        };
        assert_eq!(
            status(Some(host("2.10.0+cu130", Some("cu130")))).to_string(),
            "unavailable: extension module `_C` has no build for torch 2.10.0+cu130 (cu130) on \
             x86_64: cu130/x86_64 serves torch >=2.11; cu129/x86_64 was not built: no nvcc"
        );
        assert_eq!(
            status(Some(host("2.11.0+cu130", Some("cu130")))).to_string(),
            "unavailable: extension module `_C` is not loaded in this process: cu130/x86_64 fits \
             torch 2.11.0+cu130 (cu130) on x86_64, and `kwheel.open` of its package loads it"
        );
        assert!(!status(None).is_available());
    }

    #[test]
    fn the_warning_names_every_uncovered_device_and_the_archs() {
        let record = record(&["sm_90a"]);
        let mut second = device((10, 3));
        second.ordinal = 1;
        assert_eq!(
            uncovered_warning("_C", "cu130/x86_64", &record, &[device((9, 0))]),
            None
        );
        assert_eq!(
            uncovered_warning("_C", "cu130/x86_64", &record, &[device((9, 0)), second]).unwrap(),
            "extension module `_C` (cu130/x86_64) has no device code for cuda:1 (NVIDIA B300, \
             compute capability 10.3): its archs are sm_90a; its CUDA ops will fail there with \
             \"no kernel image is available\" (install a build of the library with one of these \
             devices' archs)"
        );
    }

    #[test]
    fn the_jit_builds_the_declared_archs_that_fit_the_visible_devices() {
        let record = record(&["sm_90a", "sm_100a", "compute_90"]);
        let declared = record.inputs.archs.clone();
        let h100 = [device((9, 0))];
        let chosen = jit_archs(&record, Ok(&h100));
        assert_eq!(chosen.archs(), archs(&["sm_90a", "compute_90"]));
        assert_eq!(
            chosen.to_string(),
            "for sm_90a, compute_90 (the declared archs that run on cuda:0 (NVIDIA H100 80GB \
             HBM3, compute capability 9.0))"
        );
        let mixed = [device((9, 0)), device((10, 0))];
        assert_eq!(jit_archs(&record, Ok(&mixed)).archs(), declared);
        let fallback = jit_archs(&record, Err("NVML could not be loaded"));
        assert_eq!(fallback.archs(), declared);
        assert_eq!(
            fallback.to_string(),
            "for every declared arch, sm_90a, sm_100a, compute_90 (NVML could not be loaded)"
        );
        assert_eq!(jit_archs(&record, Ok(&[])).archs(), declared);
        let only_a = self::record(&["sm_90a"]);
        assert!(jit_archs(&only_a, Ok(&[device((8, 0))]))
            .to_string()
            .contains("none of them runs on cuda:0 (NVIDIA A100-SXM4-80GB"));
        // A host-only module keeps its declared archs (and so its key) on any machine.
        let mut host_only = self::record(&["sm_90a", "sm_100a"]);
        host_only
            .inputs
            .sources
            .retain(|source| source.ends_with(".cpp"));
        assert_eq!(
            jit_archs(&host_only, Ok(&h100)).archs(),
            archs(&["sm_90a", "sm_100a"])
        );
    }
}
