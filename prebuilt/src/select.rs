//! Variant selection: which cubin of a kernel this process may load, as a pure function.
//!
//! The loader asks the CUDA driver and torch once, builds a [`DeviceQuery`], and calls
//! [`select_variant`]; `dev coverage` builds the same query from command-line flags and calls
//! [`coverage`]. Nothing here touches a GPU, so every rule is tested on a CPU.
//!
//! A variant fits when it passes every check, in this order (the first failure is the
//! variant's [`RefusalReason`]):
//!
//! | check | a variant fits when |
//! | --- | --- |
//! | arch | `sm_XYa` and the device is exactly `X.Y`; `sm_XYf` or plain `sm_XY` and the device is `X.z`, `z ≥ Y`; `compute_XY` (PTX) and the device is `≥ X.Y` |
//! | CUDA build | the variant's build equals the runtime's (torch's) build |
//! | driver | the driver supports at least the variant's CUDA version |
//! | torch | the runtime's torch version matches the variant's pin (when it is checked) |
//! | PTX JIT | the variant is a cubin, or the policy lets the driver compile PTX ([`PtxJitPolicy`]) |
//!
//! Among the variants that fit, the most specific kind wins (an exact `a` cubin over a family
//! cubin over a plain cubin over PTX), then the higher SM, then the earlier in the index.
//! Targets the bundler skipped are always refused, with the bundler's reason.
//! `docs/loader.md` is the full contract, with NVIDIA's rules behind the arch check.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::index::{Index, KernelRecord, Variant};
use crate::{Arch, ArchKind, CudaBuild};

/// NVIDIA's table of the oldest Linux driver release for each CUDA version, newest first:
/// `(release, CUDA major, CUDA minor)`. A release between two rows supports the lower one.
const DRIVER_RELEASES: [(u32, u32, u32); 19] = [
    (580, 13, 0),
    (575, 12, 9),
    (570, 12, 8),
    (560, 12, 6),
    (555, 12, 5),
    (550, 12, 4),
    (545, 12, 3),
    (535, 12, 2),
    (530, 12, 1),
    (525, 12, 0),
    (520, 11, 8),
    (515, 11, 7),
    (510, 11, 6),
    (495, 11, 5),
    (470, 11, 4),
    (465, 11, 3),
    (460, 11, 2),
    (455, 11, 1),
    (450, 11, 0),
];

/// The CUDA version a driver supports (`cuDriverGetVersion` 13000 → 13.0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DriverVersion {
    /// CUDA major version.
    pub major: u32,
    /// CUDA minor version.
    pub minor: u32,
}

impl DriverVersion {
    /// The version as `cuDriverGetVersion` reports it: 12090 → 12.9, 13000 → 13.0.
    pub fn from_api(version: i32) -> DriverVersion {
        let version = u32::try_from(version).unwrap_or(0);
        DriverVersion {
            major: version / 1000,
            minor: version % 1000 / 10,
        }
    }

    /// The CUDA version a driver release (the number before the first dot, `580`) supports,
    /// by NVIDIA's table; `None` for a release older than the table (CUDA 11.0, release 450).
    /// A release newer than the table's last row maps to that row, which may under-report it.
    pub fn from_release(release: u32) -> Option<DriverVersion> {
        DRIVER_RELEASES
            .iter()
            .find(|(oldest, ..)| release >= *oldest)
            .map(|&(_, major, minor)| DriverVersion { major, minor })
    }

    /// Parses a CUDA version (`13.0`, `12.9.1`) or a driver release (`580.65.06`, `575`),
    /// the latter mapped by [`DriverVersion::from_release`]. A first number of 100 or more is
    /// a release.
    pub fn parse(text: &str) -> Result<DriverVersion, SelectError> {
        let invalid = || SelectError::Driver {
            text: text.to_owned(),
        };
        let numbers = dotted_numbers(text.trim()).ok_or_else(invalid)?;
        match numbers[..] {
            [release, ..] if release >= 100 => {
                if numbers.len() > 3 {
                    return Err(invalid());
                }
                DriverVersion::from_release(release).ok_or_else(|| SelectError::DriverRelease {
                    text: text.to_owned(),
                    release,
                })
            }
            [major, minor] | [major, minor, _] => Ok(DriverVersion { major, minor }),
            _ => Err(invalid()),
        }
    }

    /// Whether this driver runs code built with `build`'s toolkit.
    pub fn supports(self, build: CudaBuild) -> bool {
        (self.major, self.minor) >= (build.major, build.minor)
    }
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The oldest driver release that supports `build`, by NVIDIA's table (`cu129` → 575);
/// `None` when the build is outside the table.
pub fn minimum_release(build: CudaBuild) -> Option<u32> {
    let wanted = (build.major, build.minor);
    let &(_, oldest_major, oldest_minor) = DRIVER_RELEASES.last()?;
    if wanted < (oldest_major, oldest_minor) {
        return None;
    }
    DRIVER_RELEASES
        .iter()
        .rev()
        .find(|&&(_, major, minor)| (major, minor) >= wanted)
        .map(|&(release, ..)| release)
}

/// `"12.9.1"` → `[12, 9, 1]`; `None` unless every dot-separated part is a number.
fn dotted_numbers(text: &str) -> Option<Vec<u32>> {
    text.split('.')
        .map(|part| {
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            part.parse().ok()
        })
        .collect()
}

/// What the running process has (or a simulated one, for `dev coverage`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceQuery {
    /// The device's compute capability, `(9, 0)` for an H100 or H200.
    pub capability: (u32, u32),
    /// The CUDA version the driver supports.
    pub driver: DriverVersion,
    /// The runtime's CUDA build: the one torch was built for.
    pub cuda: CudaBuild,
    /// The runtime's torch version (`2.13.0+cu129`); `None` skips the torch check.
    pub torch: Option<String>,
}

impl DeviceQuery {
    /// Parses a device as `sm_90` / `sm_100` (an SM number; a trailing `a` is accepted) or as
    /// a compute capability `9.0` / `10.3`.
    pub fn parse_device(text: &str) -> Result<(u32, u32), SelectError> {
        let invalid = || SelectError::Device {
            text: text.to_owned(),
        };
        let trimmed = text.trim();
        if let Some(rest) = trimmed.strip_prefix("sm_") {
            let digits = rest.strip_suffix('a').unwrap_or(rest);
            if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid());
            }
            let sm: u32 = digits.parse().map_err(|_| invalid())?;
            return Ok((sm / 10, sm % 10));
        }
        match dotted_numbers(trimmed).as_deref() {
            Some(&[major, minor]) if major > 0 && minor < 10 => Ok((major, minor)),
            _ => Err(invalid()),
        }
    }

    /// The compute capability as `9.0`.
    pub fn device(&self) -> String {
        format!("{}.{}", self.capability.0, self.capability.1)
    }
}

/// Whether what `arch` builds runs on a device of compute capability `capability`.
///
/// An arch-specific (`sm_XYa`) cubin runs only on exactly `X.Y`; a family (`sm_XYf`) or plain
/// (`sm_XY`) cubin runs on `X.z` for any `z ≥ Y`; `compute_XY` PTX runs on every device of
/// capability `X.Y` or later, major or minor, because the driver compiles it for the device.
pub fn runs_on(arch: Arch, capability: (u32, u32)) -> bool {
    let (major, minor) = arch.capability();
    match arch.kind {
        ArchKind::Specific => capability == (major, minor),
        ArchKind::Family | ArchKind::Plain => capability.0 == major && capability.1 >= minor,
        ArchKind::Ptx => capability >= (major, minor),
    }
}

/// Whether the driver may compile a PTX variant for the device (its "PTX JIT"), which costs
/// a compile on the first load of each kernel (then the driver's own cache serves it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PtxJitPolicy {
    /// Read `<PACKAGE>_PTX_JIT`: `0`, `false`, `no` or `off` forbid PTX; anything else, or
    /// unset, allows it.
    #[default]
    FromEnvironment,
    /// PTX variants may load.
    Allowed,
    /// PTX variants never load: they are refused, saying so.
    Forbidden,
}

impl PtxJitPolicy {
    /// What this policy means for `package`: `None` when PTX may load, else the setting that
    /// forbids it (`AF3_KERNELS_PTX_JIT=0`), for the refusal to name.
    pub fn forbidden_by(self, package: &str) -> Option<String> {
        let variable = ptx_jit_variable(package);
        match self {
            PtxJitPolicy::Allowed => None,
            PtxJitPolicy::Forbidden => Some(format!("the loader's policy (as {variable}=0 would)")),
            PtxJitPolicy::FromEnvironment => {
                let value = std::env::var(&variable).ok()?;
                let forbids = matches!(
                    value.trim().to_ascii_lowercase().as_str(),
                    "0" | "false" | "no" | "off"
                );
                forbids.then(|| format!("{variable}={value}"))
            }
        }
    }
}

/// The variable that controls PTX loading for a package: `af3-kernels` → `AF3_KERNELS_PTX_JIT`.
pub fn ptx_jit_variable(package: &str) -> String {
    format!("{}_PTX_JIT", crate::env::package_prefix(package))
}

/// Whether a torch version (`2.13.1+cu129`) matches a pin (`2.13.*`, `2.13.0`, `==2.13.*`).
///
/// The version's local label (`+cu129`) is ignored. A wildcard pin matches on whole release
/// numbers (`2.13.10` matches `2.13.*`, `2.130.0` does not) and ignores pre-, post- and dev
/// suffixes; an exact pin needs the same release (missing numbers count as 0) and the same
/// suffix. `*` matches every version; any other pin matches nothing.
pub fn torch_matches(pin: &str, version: &str) -> bool {
    let pin = pin.trim();
    let pin = pin.strip_prefix("==").unwrap_or(pin).trim();
    let version = version.trim();
    let public = version
        .split_once('+')
        .map_or(version, |(public, _)| public);
    let Some(version) = Release::parse(public) else {
        return false;
    };
    if pin == "*" {
        return true;
    }
    if let Some(prefix) = pin.strip_suffix(".*") {
        return match dotted_numbers(prefix) {
            Some(prefix) => prefix
                .iter()
                .enumerate()
                .all(|(position, number)| version.number(position) == *number),
            None => false,
        };
    }
    match Release::parse(pin) {
        Some(pin) => {
            let length = pin.numbers.len().max(version.numbers.len());
            (0..length).all(|position| pin.number(position) == version.number(position))
                && pin.suffix.eq_ignore_ascii_case(version.suffix)
        }
        None => false,
    }
}

/// A public version split into its release numbers and whatever follows (`rc1`, `dev2025`).
struct Release<'t> {
    numbers: Vec<u32>,
    suffix: &'t str,
}

impl<'t> Release<'t> {
    fn parse(text: &'t str) -> Option<Release<'t>> {
        let end = text
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(text.len());
        let numbers = dotted_numbers(text[..end].trim_end_matches('.'))?;
        let suffix = text[end..].trim_start_matches(['.', '-', '_']);
        Some(Release { numbers, suffix })
    }

    /// The release number at `position`, 0 past the end (PEP 440 zero padding).
    fn number(&self, position: usize) -> u32 {
        self.numbers.get(position).copied().unwrap_or(0)
    }
}

/// The variant a kernel loads, and why it fits.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice<'i> {
    /// The chosen variant.
    pub variant: &'i Variant,
    /// Why it fits: `sm_90a cubin for a 9.0 device, cu129, driver 13.0 ≥ 12.9, torch
    /// 2.13.0+cu129 matches 2.13.*`.
    pub reason: String,
}

/// A variant, or a skipped target, that does not fit, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The variant's label, `cu129/sm_100a`.
    pub variant: String,
    /// The first check it failed.
    pub reason: RefusalReason,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.variant, self.reason)
    }
}

/// Why a variant does not fit: the first check it failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefusalReason {
    /// The variant is PTX and passes every other check, but the policy forbids the driver's
    /// PTX JIT.
    PtxJitForbidden {
        /// The setting that forbids it: `AF3_KERNELS_PTX_JIT=0`.
        by: String,
    },
    /// The cubin's architecture does not run on the device.
    Arch {
        /// The cubin's architecture.
        arch: Arch,
        /// The device's compute capability.
        device: (u32, u32),
    },
    /// The variant was built for another CUDA build than the runtime's.
    CudaBuild {
        /// The variant's build.
        variant: CudaBuild,
        /// The runtime's (torch's) build.
        runtime: CudaBuild,
    },
    /// The driver is older than the toolkit that built the cubin.
    Driver {
        /// The CUDA version the cubin needs.
        needs: CudaBuild,
        /// The CUDA version the driver supports.
        driver: DriverVersion,
    },
    /// The runtime's torch version is outside the variant's pin.
    Torch {
        /// The variant's pin.
        pin: String,
        /// The runtime's torch version.
        runtime: String,
    },
    /// The target was never built.
    Skipped {
        /// The bundler's reason.
        reason: String,
    },
    /// The variant fits, but only the bundle's store has it and downloading is forbidden.
    NotDownloaded {
        /// The store.
        store: String,
        /// The variable that forbids downloading: `AF3_KERNELS_NO_DOWNLOAD`.
        variable: String,
    },
}

impl fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RefusalReason::Arch { arch, device } => {
                let (major, minor) = arch.capability();
                match arch.kind {
                    ArchKind::Specific => write!(
                        f,
                        "{arch} cubins run only on compute capability {major}.{minor}"
                    )?,
                    ArchKind::Plain => write!(
                        f,
                        "{arch} cubins run only on compute capability {major}.{minor} or a later \
                         {major}.x"
                    )?,
                    ArchKind::Family => write!(
                        f,
                        "{arch} cubins run only on their family, compute capability \
                         {major}.{minor} or a later {major}.x"
                    )?,
                    ArchKind::Ptx => write!(
                        f,
                        "{arch} PTX runs only on compute capability {major}.{minor} or later"
                    )?,
                }
                write!(f, ", this device is {}.{}", device.0, device.1)
            }
            RefusalReason::PtxJitForbidden { by } => write!(
                f,
                "fits, but {by} forbids the driver's PTX JIT, which would compile this PTX for \
                 the device on first load"
            ),
            RefusalReason::CudaBuild { variant, runtime } => write!(
                f,
                "built for CUDA {} ({variant}), the runtime is CUDA {} ({runtime})",
                variant.version(),
                runtime.version()
            ),
            RefusalReason::Driver { needs, driver } => {
                let version = needs.version();
                write!(
                    f,
                    "built with CUDA {version}, which needs a driver for CUDA ≥ {version}"
                )?;
                if let Some(release) = minimum_release(*needs) {
                    write!(f, " (release ≥ {release})")?;
                }
                write!(f, ", this driver supports {driver}")
            }
            RefusalReason::Torch { pin, runtime } => {
                write!(f, "built for torch {pin}, the runtime has torch {runtime}")
            }
            RefusalReason::Skipped { reason } => write!(f, "not built: {reason}"),
            RefusalReason::NotDownloaded { store, variable } => write!(
                f,
                "fits, but is only in the store ({store}) and {variable}=1 forbids downloading it"
            ),
        }
    }
}

/// No variant of a kernel fits: every refusal, one per variant and per skipped target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoFit {
    /// The kernel.
    pub kernel: String,
    /// The variants in index order, then the skipped targets in index order.
    pub refusals: Vec<Refusal>,
}

impl fmt::Display for NoFit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.refusals.is_empty() {
            return write!(
                f,
                "no prebuilt variant of `{}` fits: the bundle has none",
                self.kernel
            );
        }
        write!(f, "no prebuilt variant of `{}` fits:", self.kernel)?;
        for refusal in &self.refusals {
            write!(f, "\n  {refusal}")?;
        }
        Ok(())
    }
}

impl std::error::Error for NoFit {}

/// A device or driver string that cannot be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// Not a device.
    #[error(
        "`{text}` is not a device (expected an SM number like `sm_90` or a compute capability \
         like `9.0`)"
    )]
    Device {
        /// The text given.
        text: String,
    },
    /// Not a driver version.
    #[error(
        "`{text}` is not a driver version (expected a CUDA version like `13.0` or a driver \
         release like `580.65.06`)"
    )]
    Driver {
        /// The text given.
        text: String,
    },
    /// Not a device of a fleet.
    #[error(
        "`{text}` is not a fleet device (expected a known GPU ({known}), `NAME=9.0`, a compute \
         capability like `10.3` or an SM number like `sm_103`)"
    )]
    FleetDevice {
        /// The text given.
        text: String,
        /// The GPU names known.
        known: String,
    },
    /// A driver release older than the release table.
    #[error(
        "driver release `{text}` ({release}) predates CUDA 11.0 (release 450); give the CUDA \
         version it supports instead, like `10.2`"
    )]
    DriverRelease {
        /// The text given.
        text: String,
        /// Its release number.
        release: u32,
    },
}

/// Picks the variant of `kernel` that this process loads, or says why each one does not fit.
/// PTX variants may load; [`select_variant_with`] takes a policy that forbids them.
pub fn select_variant<'i>(
    kernel: &str,
    record: &'i KernelRecord,
    query: &DeviceQuery,
) -> Result<Choice<'i>, NoFit> {
    select_variant_with(kernel, record, query, None)
}

/// [`select_variant`], with PTX variants refused when `ptx_forbidden_by` names the setting
/// that forbids the driver's PTX JIT (see [`PtxJitPolicy::forbidden_by`]).
pub fn select_variant_with<'i>(
    kernel: &str,
    record: &'i KernelRecord,
    query: &DeviceQuery,
    ptx_forbidden_by: Option<&str>,
) -> Result<Choice<'i>, NoFit> {
    let (chosen, refusals) = evaluate(record, query, ptx_forbidden_by);
    chosen.ok_or_else(|| NoFit {
        kernel: kernel.to_owned(),
        refusals,
    })
}

/// Checks every variant and skipped target: the preferred variant that fits, and every
/// refusal in index order.
fn evaluate<'i>(
    record: &'i KernelRecord,
    query: &DeviceQuery,
    ptx_forbidden_by: Option<&str>,
) -> (Option<Choice<'i>>, Vec<Refusal>) {
    let mut best: Option<&Variant> = None;
    let mut refusals = Vec::new();
    for variant in &record.variants {
        match check(variant, query, ptx_forbidden_by) {
            // Strictly greater: on a tie the earlier variant stays, so the choice never
            // depends on anything but the index.
            Ok(()) => {
                if best.is_none_or(|best| preference(variant) > preference(best)) {
                    best = Some(variant);
                }
            }
            Err(reason) => refusals.push(Refusal {
                variant: variant.label(),
                reason,
            }),
        }
    }
    for skip in &record.skipped {
        refusals.push(Refusal {
            variant: format!("{}/{}", skip.cuda, skip.arch),
            reason: RefusalReason::Skipped {
                reason: skip.reason.clone(),
            },
        });
    }
    let choice = best.map(|variant| Choice {
        variant,
        reason: fit_reason(variant, query),
    });
    (choice, refusals)
}

/// The most specific kind first (arch-specific, family, plain, PTX), then the higher SM.
fn preference(variant: &Variant) -> (ArchKind, u32) {
    (variant.arch.kind, variant.arch.sm)
}

/// The checks in contract order; the first failure is the refusal.
fn check(
    variant: &Variant,
    query: &DeviceQuery,
    ptx_forbidden_by: Option<&str>,
) -> Result<(), RefusalReason> {
    if !runs_on(variant.arch, query.capability) {
        return Err(RefusalReason::Arch {
            arch: variant.arch,
            device: query.capability,
        });
    }
    if variant.cuda != query.cuda {
        return Err(RefusalReason::CudaBuild {
            variant: variant.cuda,
            runtime: query.cuda,
        });
    }
    if !query.driver.supports(variant.cuda) {
        return Err(RefusalReason::Driver {
            needs: variant.cuda,
            driver: query.driver,
        });
    }
    if let Some(torch) = &query.torch {
        if !torch_matches(&variant.torch, torch) {
            return Err(RefusalReason::Torch {
                pin: variant.torch.clone(),
                runtime: torch.clone(),
            });
        }
    }
    // Last: the refusal says the variant would otherwise load.
    if let (true, Some(by)) = (variant.arch.is_ptx(), ptx_forbidden_by) {
        return Err(RefusalReason::PtxJitForbidden { by: by.to_owned() });
    }
    Ok(())
}

fn fit_reason(variant: &Variant, query: &DeviceQuery) -> String {
    let device = query.device();
    // "an 8.6 device", "a 9.0 device": the article follows how the number is read.
    let article = match query.capability.0 {
        8 | 11 | 18 => "an",
        _ => "a",
    };
    let torch = match &query.torch {
        Some(torch) => format!("torch {torch} matches {}", variant.torch),
        None => "torch not checked".to_owned(),
    };
    let what = match variant.arch.kind {
        ArchKind::Specific | ArchKind::Plain => format!("{} cubin", variant.arch),
        ArchKind::Family => format!("{} family cubin", variant.arch),
        ArchKind::Ptx => format!("{} PTX", variant.arch),
    };
    let jit = if variant.arch.is_ptx() {
        ", compiled by the driver on first load (its PTX JIT; cached in its compute cache)"
    } else {
        ""
    };
    format!(
        "{what} for {article} {device} device{jit}, {}, driver {} ≥ {}, {torch}",
        variant.cuda,
        query.driver,
        variant.cuda.version()
    )
}

/// `dev coverage`: per kernel, what would load and why, or why nothing would.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoverageReport {
    /// The device's compute capability, `9.0`.
    pub device: String,
    /// The runtime's CUDA build, `cu129`.
    pub cuda: String,
    /// The CUDA version the driver supports, `13.0`.
    pub driver: String,
    /// The runtime's torch version; `None` when it is not checked.
    pub torch: Option<String>,
    /// Every kernel of the index, by name.
    pub kernels: BTreeMap<String, KernelCoverage>,
}

/// One kernel's line of a [`CoverageReport`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelCoverage {
    /// The label of the variant that loads (`cu129/sm_90a`), or `None`.
    pub loads: Option<String>,
    /// Why it fits, or a summary of why nothing does.
    pub reason: String,
    /// Every variant and skipped target that does not fit, as (label, reason), in the order
    /// of [`NoFit::refusals`].
    pub refusals: Vec<(String, String)>,
    /// Where the cubin that loads is (wheel, cache or store), when the report was made on a
    /// bundle on disk ([`crate::fetch::coverage`]); `None` from the index alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<crate::fetch::ArtifactLocation>,
}

/// Runs [`select_variant`]'s rules for every kernel of `index`.
pub fn coverage(index: &Index, query: &DeviceQuery) -> CoverageReport {
    coverage_with(index, query, None)
}

/// [`coverage`] under a PTX policy, as [`select_variant_with`].
pub fn coverage_with(
    index: &Index,
    query: &DeviceQuery,
    ptx_forbidden_by: Option<&str>,
) -> CoverageReport {
    let kernels = index
        .kernels
        .iter()
        .map(|(name, record)| {
            let (choice, refusals) = evaluate(record, query, ptx_forbidden_by);
            let (loads, reason) = match choice {
                Some(choice) => (Some(choice.variant.label()), choice.reason),
                None => (None, nothing_fits(record)),
            };
            let refusals = refusals
                .iter()
                .map(|refusal| (refusal.variant.clone(), refusal.reason.to_string()))
                .collect();
            let coverage = KernelCoverage {
                loads,
                reason,
                refusals,
                location: None,
            };
            (name.clone(), coverage)
        })
        .collect();
    CoverageReport {
        device: query.device(),
        cuda: query.cuda.to_string(),
        driver: query.driver.to_string(),
        torch: query.torch.clone(),
        kernels,
    }
}

fn nothing_fits(record: &KernelRecord) -> String {
    let plural =
        |count: usize, noun: &str| format!("{count} {noun}{}", if count == 1 { "" } else { "s" });
    match (record.variants.len(), record.skipped.len()) {
        (0, 0) => "nothing fits: the bundle has no variant".to_owned(),
        (variants, 0) => format!("nothing fits: {} refused", plural(variants, "variant")),
        (0, skipped) => format!("nothing fits: {} not built", plural(skipped, "target")),
        (variants, skipped) => format!(
            "nothing fits: {} refused, {} not built",
            plural(variants, "variant"),
            plural(skipped, "target")
        ),
    }
}

impl fmt::Display for CoverageReport {
    /// A header naming the query, an aligned table (kernel, loads, why), and the refusals
    /// under every kernel that loads nothing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let torch = self.torch.as_deref().unwrap_or("not checked");
        writeln!(
            f,
            "device {}, CUDA build {}, driver {}, torch {torch}",
            self.device, self.cuda, self.driver
        )?;
        fn loads(coverage: &KernelCoverage) -> &str {
            coverage.loads.as_deref().unwrap_or("none")
        }
        let width = |text: &str| text.chars().count();
        let kernel_width = self
            .kernels
            .keys()
            .map(|name| width(name))
            .chain([width("kernel")])
            .max()
            .unwrap_or(0);
        let loads_width = self
            .kernels
            .values()
            .map(|coverage| width(loads(coverage)))
            .chain([width("loads")])
            .max()
            .unwrap_or(0);
        // The `where` column only for reports made on a bundle on disk.
        let locations = self.kernels.values().any(|k| k.location.is_some());
        let where_width = if locations {
            self.kernels
                .values()
                .map(|k| k.location.map_or(1, |l| width(&l.to_string())))
                .chain([width("where")])
                .max()
                .unwrap_or(0)
                + 2
        } else {
            0
        };
        let place = |coverage: &KernelCoverage| -> String {
            if !locations {
                return String::new();
            }
            let text = coverage
                .location
                .map_or_else(|| "-".to_owned(), |location| location.to_string());
            format!("{text:width$}", width = where_width)
        };
        writeln!(f)?;
        let header = if locations {
            format!("{:where_width$}", "where")
        } else {
            String::new()
        };
        write!(
            f,
            "{:kernel_width$}  {:loads_width$}  {header}why",
            "kernel", "loads"
        )?;
        for (name, coverage) in &self.kernels {
            write!(
                f,
                "\n{name:kernel_width$}  {:loads_width$}  {}{}",
                loads(coverage),
                place(coverage),
                coverage.reason
            )?;
            if coverage.loads.is_none() {
                for (variant, reason) in &coverage.refusals {
                    write!(f, "\n  {variant}: {reason}")?;
                }
            }
        }
        writeln!(f)
    }
}

/// GPUs a fleet may name, with their compute capabilities (NVIDIA's CUDA GPUs table).
pub const KNOWN_DEVICES: [(&str, (u32, u32)); 12] = [
    ("H100", (9, 0)),
    ("H200", (9, 0)),
    ("GH200", (9, 0)),
    ("B200", (10, 0)),
    ("GB200", (10, 0)),
    ("B300", (10, 3)),
    ("GB300", (10, 3)),
    ("Thor", (11, 0)),
    ("RTX-PRO-6000", (12, 0)),
    ("RTX-5090", (12, 0)),
    ("GB10", (12, 1)),
    ("DGX-Spark", (12, 1)),
];

/// One device of a fleet: a name for the table and its compute capability.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetDevice {
    /// The name the table shows: `B300`, or the capability itself.
    pub name: String,
    /// The compute capability, `(10, 3)`.
    pub capability: (u32, u32),
}

impl FleetDevice {
    /// Parses a known GPU (`B300`, case-insensitive), `NAME=10.3`, or a device as
    /// [`DeviceQuery::parse_device`] reads it (`10.3`, `sm_103`).
    pub fn parse(text: &str) -> Result<FleetDevice, SelectError> {
        let text = text.trim();
        let invalid = || SelectError::FleetDevice {
            text: text.to_owned(),
            known: KNOWN_DEVICES
                .iter()
                .map(|(name, _)| *name)
                .collect::<Vec<_>>()
                .join(", "),
        };
        if let Some((name, device)) = text.split_once('=') {
            let capability = DeviceQuery::parse_device(device).map_err(|_| invalid())?;
            if name.trim().is_empty() {
                return Err(invalid());
            }
            return Ok(FleetDevice {
                name: name.trim().to_owned(),
                capability,
            });
        }
        if let Some(&(name, capability)) = KNOWN_DEVICES
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(text))
        {
            return Ok(FleetDevice {
                name: name.to_owned(),
                capability,
            });
        }
        let capability = DeviceQuery::parse_device(text).map_err(|_| invalid())?;
        Ok(FleetDevice {
            name: format!("{}.{}", capability.0, capability.1),
            capability,
        })
    }
}

/// `dev coverage --fleet`: what every kernel loads on each device of a fleet, with one
/// [`CoverageReport`] per device for the reasons.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetReport {
    /// The runtime's CUDA build, `cu130`.
    pub cuda: String,
    /// The CUDA version the driver supports.
    pub driver: String,
    /// The runtime's torch version; `None` when it is not checked.
    pub torch: Option<String>,
    /// The setting that forbids PTX, when one does.
    pub ptx_forbidden_by: Option<String>,
    /// The devices in the order given, each with its report.
    pub devices: Vec<FleetEntry>,
}

/// One device's column of a [`FleetReport`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetEntry {
    /// The device.
    pub device: FleetDevice,
    /// What each kernel loads there, and why.
    pub report: CoverageReport,
}

/// Runs [`coverage_with`] for each device of `fleet`; `query` gives the CUDA build, driver and
/// torch (its capability is replaced by each device's).
pub fn fleet_coverage(
    index: &Index,
    fleet: &[FleetDevice],
    query: &DeviceQuery,
    ptx_forbidden_by: Option<&str>,
) -> FleetReport {
    let devices = fleet
        .iter()
        .map(|device| {
            let query = DeviceQuery {
                capability: device.capability,
                ..query.clone()
            };
            FleetEntry {
                device: device.clone(),
                report: coverage_with(index, &query, ptx_forbidden_by),
            }
        })
        .collect();
    FleetReport {
        cuda: query.cuda.to_string(),
        driver: query.driver.to_string(),
        torch: query.torch.clone(),
        ptx_forbidden_by: ptx_forbidden_by.map(str::to_owned),
        devices,
    }
}

impl fmt::Display for FleetReport {
    /// A header naming the build, driver and torch; one row per kernel and one column per
    /// device, each cell the target that loads (`sm_100f`, `compute_90` for PTX) or `none`;
    /// then what the kinds mean.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let torch = self.torch.as_deref().unwrap_or("not checked");
        write!(
            f,
            "CUDA build {}, driver {}, torch {torch}",
            self.cuda, self.driver
        )?;
        if let Some(by) = &self.ptx_forbidden_by {
            write!(f, ", PTX forbidden by {by}")?;
        }
        writeln!(f, "\n")?;
        let width = |text: &str| text.chars().count();
        let kernels: Vec<&String> = self
            .devices
            .first()
            .map(|entry| entry.report.kernels.keys().collect())
            .unwrap_or_default();
        let cell = |entry: &FleetEntry, kernel: &str| -> String {
            match entry
                .report
                .kernels
                .get(kernel)
                .and_then(|k| k.loads.as_deref())
            {
                // Every variant that fits is of the runtime's build: the header names it.
                Some(label) => label
                    .split_once('/')
                    .map_or(label, |(_, arch)| arch)
                    .to_owned(),
                None => "none".to_owned(),
            }
        };
        let headers: Vec<String> = self
            .devices
            .iter()
            .map(|entry| {
                let (major, minor) = entry.device.capability;
                let capability = format!("{major}.{minor}");
                if entry.device.name == capability {
                    capability
                } else {
                    format!("{} ({capability})", entry.device.name)
                }
            })
            .collect();
        let kernel_width = kernels
            .iter()
            .map(|name| width(name))
            .chain([width("kernel")])
            .max()
            .unwrap_or(0);
        let widths: Vec<usize> = self
            .devices
            .iter()
            .zip(&headers)
            .map(|(entry, header)| {
                kernels
                    .iter()
                    .map(|kernel| width(&cell(entry, kernel)))
                    .chain([width(header)])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let row = |first: &str, cells: Vec<String>| -> String {
            let mut line = format!("{first:kernel_width$}");
            for (text, width) in cells.iter().zip(&widths) {
                line.push_str(&format!("  {text:width$}"));
            }
            line.trim_end().to_owned()
        };
        writeln!(f, "{}", row("kernel", headers.clone()))?;
        for kernel in &kernels {
            let cells = self
                .devices
                .iter()
                .map(|entry| cell(entry, kernel))
                .collect();
            writeln!(f, "{}", row(kernel, cells))?;
        }
        writeln!(
            f,
            "\nsm_XYa: arch-specific cubin (exactly X.Y); sm_XYf: family cubin (X.Y and later X.z); \
             sm_XY: plain cubin (X.Y and later X.z);\ncompute_XY: PTX the driver compiles on \
             first load; none: nothing fits (`dev coverage --device` says why)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{CompilerRecord, KernelInputs, Skip, StoredFile};

    fn arch(text: &str) -> Arch {
        text.parse().unwrap()
    }

    fn build(text: &str) -> CudaBuild {
        text.parse().unwrap()
    }

    fn variant(label: &str) -> Variant {
        let (cuda, target) = label.split_once('/').unwrap();
        Variant {
            arch: arch(target),
            cuda: build(cuda),
            torch: "2.13.*".to_owned(),
            compiler: CompilerRecord {
                kind: "nvrtc".to_owned(),
                version: "12.9.86".to_owned(),
            },
            key: format!("key-{label}"),
            artifact: StoredFile {
                digest: format!("digest-{label}"),
                size: 1,
                path: format!("artifacts/{label}.cubin.zst"),
                stored_size: 1,
            },
            functions: Vec::new(),
        }
    }

    fn record(variants: &[&str], skipped: &[(&str, &str)]) -> KernelRecord {
        KernelRecord {
            inputs: KernelInputs::default(),
            recipe: None,
            constants: BTreeMap::new(),
            variants: variants.iter().map(|label| variant(label)).collect(),
            skipped: skipped
                .iter()
                .map(|(label, reason)| {
                    let (cuda, target) = label.split_once('/').unwrap();
                    Skip {
                        arch: arch(target),
                        cuda: build(cuda),
                        reason: (*reason).to_owned(),
                    }
                })
                .collect(),
        }
    }

    const SKIP_REASON: &str = "tcgen05 needs CUDA 13";

    /// Both builds × sm_90a/sm_100a; one kernel missing cu129/sm_100a; one with plain sm_80.
    fn index() -> Index {
        let kernels = [
            (
                "layernorm",
                record(
                    &[
                        "cu129/sm_90a",
                        "cu129/sm_100a",
                        "cu130/sm_90a",
                        "cu130/sm_100a",
                    ],
                    &[],
                ),
            ),
            (
                "moe_gate",
                record(
                    &["cu129/sm_90a", "cu130/sm_90a", "cu130/sm_100a"],
                    &[("cu129/sm_100a", SKIP_REASON)],
                ),
            ),
            (
                "scale",
                record(
                    &["cu129/sm_80", "cu129/sm_90a", "cu130/sm_80", "cu130/sm_90a"],
                    &[],
                ),
            ),
        ];
        Index {
            format: crate::index::INDEX_FORMAT,
            store: None,
            package: "af3-kernels".to_owned(),
            torch: "2.13.*".to_owned(),
            dictionary: None,
            kernels: kernels
                .into_iter()
                .map(|(name, record)| (name.to_owned(), record))
                .collect(),
        }
    }

    fn query(device: &str, cuda: &str, driver: &str, torch: Option<&str>) -> DeviceQuery {
        DeviceQuery {
            capability: DeviceQuery::parse_device(device).unwrap(),
            driver: DriverVersion::parse(driver).unwrap(),
            cuda: build(cuda),
            torch: torch.map(str::to_owned),
        }
    }

    /// Selects `kernel`: the chosen label, or the refusals as `label: kind`.
    fn outcome(kernel: &str, query: &DeviceQuery) -> Result<String, Vec<String>> {
        let index = index();
        match select_variant(kernel, &index.kernels[kernel], query) {
            Ok(choice) => Ok(choice.variant.label()),
            Err(no_fit) => Err(no_fit
                .refusals
                .iter()
                .map(|refusal| {
                    let kind = match refusal.reason {
                        RefusalReason::Arch { .. } => "arch",
                        RefusalReason::PtxJitForbidden { .. } => "ptx forbidden",
                        RefusalReason::CudaBuild { .. } => "cuda",
                        RefusalReason::Driver { .. } => "driver",
                        RefusalReason::Torch { .. } => "torch",
                        RefusalReason::Skipped { .. } => "skipped",
                        RefusalReason::NotDownloaded { .. } => "not downloaded",
                    };
                    format!("{}: {kind}", refusal.variant)
                })
                .collect()),
        }
    }

    #[test]
    fn picks_by_device_build_driver_and_torch() {
        let torch = Some("2.13.0+cu129");
        #[rustfmt::skip]
        let table = [
            // device, runtime build, driver, torch, kernel, expected variant
            ("sm_90",  "cu129", "13.0", torch, "layernorm", "cu129/sm_90a"),
            ("9.0",    "cu130", "13.0", torch, "layernorm", "cu130/sm_90a"),
            ("sm_100", "cu129", "13.0", torch, "layernorm", "cu129/sm_100a"),
            ("10.0",   "cu130", "580",  torch, "layernorm", "cu130/sm_100a"),
            ("sm_90",  "cu129", "12.9", torch, "moe_gate",  "cu129/sm_90a"),
            ("sm_100", "cu130", "13.0", torch, "moe_gate",  "cu130/sm_100a"),
            ("9.0",    "cu129", "575",  None,  "scale",     "cu129/sm_90a"),
            ("8.0",    "cu129", "12.9", torch, "scale",     "cu129/sm_80"),
            ("8.6",    "cu129", "12.9", torch, "scale",     "cu129/sm_80"),
            ("8.9",    "cu130", "13.0", torch, "scale",     "cu130/sm_80"),
            ("9.0",    "cu129", "13.0", Some("2.13.1+cu129"), "layernorm", "cu129/sm_90a"),
            ("9.0",    "cu129", "13.0", Some("2.13.10"),      "layernorm", "cu129/sm_90a"),
        ];
        for (device, cuda, driver, torch, kernel, expected) in table {
            let query = query(device, cuda, driver, torch);
            assert_eq!(
                outcome(kernel, &query),
                Ok(expected.to_owned()),
                "{device} {cuda} driver {driver} torch {torch:?} {kernel}"
            );
        }
    }

    #[test]
    fn refuses_devices_without_a_cubin_on_every_variant() {
        for device in ["8.6", "8.9", "10.3", "12.0", "sm_120", "sm_103", "7.5"] {
            for kernel in ["layernorm", "moe_gate"] {
                let refusals = outcome(kernel, &query(device, "cu129", "13.0", None)).unwrap_err();
                let arch_refusals = refusals.iter().filter(|r| r.ends_with(": arch")).count();
                assert_eq!(
                    arch_refusals,
                    index().kernels[kernel].variants.len(),
                    "{device} {kernel}: {refusals:?}"
                );
            }
        }
        let query = query("10.3", "cu129", "13.0", None);
        let no_fit = select_variant("layernorm", &index().kernels["layernorm"], &query)
            .unwrap_err()
            .to_string();
        assert!(
            no_fit.contains(
                "cu129/sm_100a: sm_100a cubins run only on compute capability 10.0, this device \
                 is 10.3"
            ),
            "{no_fit}"
        );
    }

    #[test]
    fn runs_on_follows_the_arch_rules() {
        #[rustfmt::skip]
        let table = [
            ("sm_90a", (9, 0), true), ("sm_90a", (9, 1), false), ("sm_90a", (8, 9), false),
            ("sm_100a", (10, 0), true), ("sm_100a", (10, 3), false), ("sm_100a", (12, 0), false),
            ("sm_80", (8, 0), true), ("sm_80", (8, 6), true), ("sm_80", (8, 9), true),
            ("sm_80", (9, 0), false), ("sm_80", (7, 5), false), ("sm_86", (8, 0), false),
            ("sm_100", (10, 3), true), ("sm_100", (12, 0), false),
            ("sm_100f", (10, 0), true), ("sm_100f", (10, 3), true), ("sm_100f", (11, 0), false),
            ("sm_100f", (9, 0), false), ("sm_103f", (10, 0), false), ("sm_120f", (12, 1), true),
            ("sm_121f", (12, 0), false), ("compute_90", (9, 0), true), ("compute_90", (12, 1), true),
            ("compute_90", (13, 0), true), ("compute_90", (8, 9), false),
            ("compute_100", (9, 0), false), ("compute_100", (10, 3), true),
        ];
        for (target, capability, expected) in table {
            assert_eq!(
                runs_on(arch(target), capability),
                expected,
                "{target} on {capability:?}"
            );
        }
    }

    #[test]
    fn prefers_arch_specific_then_higher_sm_then_index_order() {
        let query = query("9.0", "cu129", "13.0", None);
        let table: &[(&[&str], &str)] = &[
            (&["cu129/sm_90", "cu129/sm_90a"], "cu129/sm_90a"),
            (&["cu129/sm_90a", "cu129/sm_90"], "cu129/sm_90a"),
            (&["cu129/sm_90"], "cu129/sm_90"),
        ];
        for (variants, expected) in table {
            let record = record(variants, &[]);
            let choice = select_variant("k", &record, &query).unwrap();
            assert_eq!(choice.variant.label(), *expected, "{variants:?}");
        }
        let query = DeviceQuery {
            capability: (8, 9),
            ..query
        };
        let record = record(&["cu129/sm_80", "cu129/sm_86", "cu129/sm_89"], &[]);
        let choice = select_variant("k", &record, &query).unwrap();
        assert_eq!(choice.variant.label(), "cu129/sm_89");
        // Two identical candidates: the first in the index wins.
        let mut record = record;
        record.variants[2].key = "second".to_owned();
        record.variants.push(variant("cu129/sm_89"));
        let choice = select_variant("k", &record, &query).unwrap();
        assert_eq!(choice.variant.key, "second");
    }

    #[test]
    fn runtime_build_must_match_exactly() {
        // A cu129 runtime never gets a cu130 cubin, even where only cu130 would fit the arch.
        let record = record(&["cu130/sm_90a"], &[]);
        let cu129 = query("9.0", "cu129", "13.0", None);
        let no_fit = select_variant("k", &record, &cu129).unwrap_err();
        assert_eq!(
            no_fit.refusals[0].reason.to_string(),
            "built for CUDA 13.0 (cu130), the runtime is CUDA 12.9 (cu129)"
        );
        assert_eq!(
            outcome("layernorm", &query("9.0", "cu128", "13.0", None)),
            Err(vec![
                "cu129/sm_90a: cuda".to_owned(),
                "cu129/sm_100a: arch".to_owned(),
                "cu130/sm_90a: cuda".to_owned(),
                "cu130/sm_100a: arch".to_owned(),
            ])
        );
    }

    #[test]
    fn driver_must_support_the_variants_toolkit() {
        #[rustfmt::skip]
        let table = [
            ("cu129", "12.8", false), ("cu129", "570.86.10", false), ("cu129", "12.9", true),
            ("cu129", "575.51.03", true), ("cu129", "13.0", true),
            ("cu130", "12.9", false), ("cu130", "575", false), ("cu130", "13.0", true),
            ("cu130", "580.65.06", true), ("cu130", "13.1", true),
        ];
        for (cuda, driver, fits) in table {
            let result = outcome("layernorm", &query("9.0", cuda, driver, None));
            let expected = if fits {
                Ok(format!("{cuda}/sm_90a"))
            } else {
                Err([
                    "cu129/sm_90a",
                    "cu129/sm_100a",
                    "cu130/sm_90a",
                    "cu130/sm_100a",
                ]
                .iter()
                .map(|label| {
                    let kind = match () {
                        _ if label.ends_with("sm_100a") => "arch",
                        _ if !label.starts_with(cuda) => "cuda",
                        _ => "driver",
                    };
                    format!("{label}: {kind}")
                })
                .collect())
            };
            assert_eq!(result, expected, "{cuda} driver {driver}");
        }
        let reason = RefusalReason::Driver {
            needs: build("cu130"),
            driver: DriverVersion {
                major: 12,
                minor: 9,
            },
        };
        assert_eq!(
            reason.to_string(),
            "built with CUDA 13.0, which needs a driver for CUDA ≥ 13.0 (release ≥ 580), this \
             driver supports 12.9"
        );
    }

    #[test]
    fn driver_versions_parse_from_cuda_versions_releases_and_the_api() {
        let version = |major, minor| DriverVersion { major, minor };
        #[rustfmt::skip]
        let table = [
            ("13.0", version(13, 0)), ("12.9", version(12, 9)), ("12.9.1", version(12, 9)),
            ("575.51.03", version(12, 9)), ("580", version(13, 0)), ("570", version(12, 8)),
            ("580.65.06", version(13, 0)), ("590.44.01", version(13, 0)),
            ("565.57.01", version(12, 6)), ("525.60.13", version(12, 0)),
            ("470.42.01", version(11, 4)), (" 12.8 ", version(12, 8)),
        ];
        for (text, expected) in table {
            assert_eq!(DriverVersion::parse(text), Ok(expected), "{text}");
        }
        for text in [
            "",
            "13",
            "abc",
            "13.x",
            "580.65.06.1",
            "12..9",
            "-12.9",
            "12.9rc",
            "v13.0",
        ] {
            let error = DriverVersion::parse(text).unwrap_err();
            assert_eq!(
                error.to_string(),
                format!(
                    "`{text}` is not a driver version (expected a CUDA version like `13.0` or a \
                     driver release like `580.65.06`)"
                )
            );
        }
        assert!(matches!(
            DriverVersion::parse("418.67"),
            Err(SelectError::DriverRelease { release: 418, .. })
        ));
        assert_eq!(DriverVersion::from_api(12090), version(12, 9));
        assert_eq!(DriverVersion::from_api(13000), version(13, 0));
        assert_eq!(DriverVersion::from_api(12080), version(12, 8));
        assert_eq!(DriverVersion::from_api(-1), version(0, 0));
        assert_eq!(minimum_release(build("cu129")), Some(575));
        assert_eq!(minimum_release(build("cu130")), Some(580));
        assert_eq!(minimum_release(build("cu127")), Some(570));
        assert_eq!(minimum_release(build("cu131")), None);
        assert_eq!(minimum_release(build("cu102")), None);
    }

    #[test]
    fn devices_parse_as_sm_numbers_or_capabilities() {
        #[rustfmt::skip]
        let table = [
            ("sm_90", (9, 0)), ("sm_100", (10, 0)), ("sm_103", (10, 3)), ("sm_120", (12, 0)),
            ("sm_86", (8, 6)), ("sm_90a", (9, 0)), ("9.0", (9, 0)), ("10.3", (10, 3)),
            ("12.0", (12, 0)),
        ];
        for (text, expected) in table {
            assert_eq!(DeviceQuery::parse_device(text), Ok(expected), "{text}");
        }
        for text in [
            "",
            "sm_9",
            "sm90",
            "sm_9x",
            "9",
            "9.10",
            "0.5",
            "H200",
            "compute_90",
        ] {
            assert_eq!(
                DeviceQuery::parse_device(text),
                Err(SelectError::Device {
                    text: text.to_owned()
                }),
                "{text}"
            );
        }
    }

    #[test]
    fn torch_must_match_the_pin() {
        assert_eq!(
            outcome(
                "layernorm",
                &query("9.0", "cu130", "13.0", Some("2.11.0+cu130"))
            ),
            Err(vec![
                "cu129/sm_90a: cuda".to_owned(),
                "cu129/sm_100a: arch".to_owned(),
                "cu130/sm_90a: torch".to_owned(),
                "cu130/sm_100a: arch".to_owned(),
            ])
        );
        let reason = RefusalReason::Torch {
            pin: "2.13.*".to_owned(),
            runtime: "2.11.0+cu130".to_owned(),
        };
        assert_eq!(
            reason.to_string(),
            "built for torch 2.13.*, the runtime has torch 2.11.0+cu130"
        );
        // None skips the check: torch 2.11 would be refused, no torch version is not.
        assert_eq!(
            outcome("layernorm", &query("9.0", "cu130", "13.0", None)),
            Ok("cu130/sm_90a".to_owned())
        );
    }

    #[test]
    fn torch_pins_match_whole_release_numbers() {
        #[rustfmt::skip]
        let table = [
            ("2.13.*", "2.13.0", true), ("2.13.*", "2.13.1+cu129", true),
            ("2.13.*", "2.13.10", true), ("2.13.*", "2.13", true),
            ("2.13.*", "2.13.0.dev20260101+cu130", true), ("2.13.*", "2.13.0rc1", true),
            ("2.13.*", "2.130.0", false), ("2.13.*", "2.1.3", false), ("2.13.*", "2.12.9", false),
            ("2.13.*", "2.11.0+cu130", false), ("2.13.*", "3.13.0", false),
            ("==2.13.*", "2.13.2", true), ("== 2.13.*", "2.13.2", true),
            ("2.13.0", "2.13.0+cu129", true), ("2.13.0", "2.13", true), ("2.13", "2.13.0", true),
            ("2.13.0", "2.13.1", false), ("2.13.0", "2.13.0rc1", false),
            ("2.13.0rc1", "2.13.0rc1+cu129", true), ("==2.13.0", "2.13.0", true),
            ("*", "2.11.0", true), ("2.*", "2.13.0", true),
            ("", "2.13.0", false), (">=2.13", "2.13.0", false), ("2.13.*", "", false),
            ("2.13.*", "garbage", false), ("x.*", "2.13.0", false),
        ];
        for (pin, version, expected) in table {
            assert_eq!(torch_matches(pin, version), expected, "{pin} vs {version}");
        }
    }

    #[test]
    fn skipped_targets_are_refusals_with_their_reason() {
        assert_eq!(
            outcome("moe_gate", &query("10.0", "cu129", "13.0", None)),
            Err(vec![
                "cu129/sm_90a: arch".to_owned(),
                "cu130/sm_90a: arch".to_owned(),
                "cu130/sm_100a: cuda".to_owned(),
                "cu129/sm_100a: skipped".to_owned(),
            ])
        );
        let record = &index().kernels["moe_gate"];
        let no_fit =
            select_variant("moe_gate", record, &query("10.0", "cu129", "13.0", None)).unwrap_err();
        assert_eq!(
            no_fit.refusals[3].to_string(),
            format!("cu129/sm_100a: not built: {SKIP_REASON}")
        );
    }

    #[test]
    fn no_fit_lists_every_variant() {
        let record = &index().kernels["moe_gate"];
        let query = query("8.6", "cu129", "13.0", Some("2.13.0+cu129"));
        let no_fit = select_variant("moe_gate", record, &query).unwrap_err();
        assert_eq!(
            no_fit.to_string(),
            "no prebuilt variant of `moe_gate` fits:
  cu129/sm_90a: sm_90a cubins run only on compute capability 9.0, this device is 8.6
  cu130/sm_90a: sm_90a cubins run only on compute capability 9.0, this device is 8.6
  cu130/sm_100a: sm_100a cubins run only on compute capability 10.0, this device is 8.6
  cu129/sm_100a: not built: tcgen05 needs CUDA 13"
        );
        let error: &dyn std::error::Error = &no_fit;
        assert!(error.source().is_none());
        let empty = select_variant("k", &record_with_nothing(), &query).unwrap_err();
        assert_eq!(
            empty.to_string(),
            "no prebuilt variant of `k` fits: the bundle has none"
        );
        let plain = select_variant("scale", &index().kernels["scale"], &query)
            .unwrap()
            .variant
            .label();
        assert_eq!(plain, "cu129/sm_80");
        let query = DeviceQuery {
            capability: (9, 0),
            cuda: build("cu130"),
            ..query
        };
        let reason = RefusalReason::Arch {
            arch: arch("sm_86"),
            device: query.capability,
        };
        assert_eq!(
            reason.to_string(),
            "sm_86 cubins run only on compute capability 8.6 or a later 8.x, this device is 9.0"
        );
    }

    fn record_with_nothing() -> KernelRecord {
        record(&[], &[])
    }

    #[test]
    fn choice_says_why_it_fits() {
        let index = index();
        let query = query("9.0", "cu129", "13.0", Some("2.13.0+cu129"));
        let choice = select_variant("layernorm", &index.kernels["layernorm"], &query).unwrap();
        assert_eq!(
            choice.reason,
            "sm_90a cubin for a 9.0 device, cu129, driver 13.0 ≥ 12.9, torch 2.13.0+cu129 \
             matches 2.13.*"
        );
        let query = DeviceQuery {
            capability: (8, 6),
            torch: None,
            ..query
        };
        let choice = select_variant("scale", &index.kernels["scale"], &query).unwrap();
        assert_eq!(
            choice.reason,
            "sm_80 cubin for an 8.6 device, cu129, driver 13.0 ≥ 12.9, torch not checked"
        );
    }

    /// Every kind of target, all built with CUDA 13.0: `a`, `f`, plain and PTX.
    const EVERY_KIND: [&str; 6] = [
        "cu130/compute_90",
        "cu130/sm_90",
        "cu130/sm_90a",
        "cu130/sm_100f",
        "cu130/sm_100a",
        "cu130/sm_120",
    ];

    /// The choice's label and reason, or every refusal as `label: reason`.
    fn explained(record: &KernelRecord, device: &str, ptx_forbidden_by: Option<&str>) -> String {
        let query = query(device, "cu130", "13.0", None);
        match select_variant_with("k", record, &query, ptx_forbidden_by) {
            Ok(choice) => format!("{}: {}", choice.variant.label(), choice.reason),
            Err(no_fit) => no_fit.to_string(),
        }
    }

    #[test]
    fn every_device_gets_the_most_specific_kind_that_runs_on_it() {
        let every_kind = record(&EVERY_KIND, &[]);
        let tail = "cu130, driver 13.0 ≥ 13.0, torch not checked";
        let ptx = "compiled by the driver on first load (its PTX JIT; cached in its compute cache)";
        #[rustfmt::skip]
        let table = [
            // H100/H200: the exact `a` cubin over plain sm_90 and PTX.
            ("9.0", format!("cu130/sm_90a: sm_90a cubin for a 9.0 device, {tail}")),
            // B200: the exact `a` cubin over the family one.
            ("10.0", format!("cu130/sm_100a: sm_100a cubin for a 10.0 device, {tail}")),
            // B300: sm_100a is 10.0 only; the family cubin runs on 10.3.
            ("10.3", format!("cu130/sm_100f: sm_100f family cubin for a 10.3 device, {tail}")),
            // Thor: no cubin of major 11, so the driver compiles the PTX.
            ("11.0", format!("cu130/compute_90: compute_90 PTX for an 11.0 device, {ptx}, {tail}")),
            // RTX PRO 6000 and GB10: the plain sm_120 cubin, on 12.0 and on the later 12.1.
            ("12.0", format!("cu130/sm_120: sm_120 cubin for a 12.0 device, {tail}")),
            ("12.1", format!("cu130/sm_120: sm_120 cubin for a 12.1 device, {tail}")),
            // A GPU that does not exist yet: only PTX runs on it.
            ("13.0", format!("cu130/compute_90: compute_90 PTX for a 13.0 device, {ptx}, {tail}")),
        ];
        for (device, expected) in table {
            assert_eq!(explained(&every_kind, device, None), expected, "{device}");
        }
    }

    #[test]
    fn refusals_explain_each_kind() {
        let every_kind = record(&EVERY_KIND, &[]);
        // 8.9 predates every target: each refusal says what its kind runs on.
        assert_eq!(
            explained(&every_kind, "8.9", None),
            "no prebuilt variant of `k` fits:
  cu130/compute_90: compute_90 PTX runs only on compute capability 9.0 or later, this device is 8.9
  cu130/sm_90: sm_90 cubins run only on compute capability 9.0 or a later 9.x, this device is 8.9
  cu130/sm_90a: sm_90a cubins run only on compute capability 9.0, this device is 8.9
  cu130/sm_100f: sm_100f cubins run only on their family, compute capability 10.0 or a later 10.x, this device is 8.9
  cu130/sm_100a: sm_100a cubins run only on compute capability 10.0, this device is 8.9
  cu130/sm_120: sm_120 cubins run only on compute capability 12.0 or a later 12.x, this device is 8.9"
        );
        // Without PTX, Thor (11.0) and a future 13.0 get nothing; a family cubin covers 12.1.
        let no_ptx = record(&["cu130/sm_90a", "cu130/sm_100f", "cu130/sm_120f"], &[]);
        let family_refusals = |device: &str| {
            format!(
                "no prebuilt variant of `k` fits:
  cu130/sm_90a: sm_90a cubins run only on compute capability 9.0, this device is {device}
  cu130/sm_100f: sm_100f cubins run only on their family, compute capability 10.0 or a later 10.x, this device is {device}
  cu130/sm_120f: sm_120f cubins run only on their family, compute capability 12.0 or a later 12.x, this device is {device}"
            )
        };
        assert_eq!(explained(&no_ptx, "11.0", None), family_refusals("11.0"));
        assert_eq!(explained(&no_ptx, "13.0", None), family_refusals("13.0"));
        assert_eq!(
            explained(&no_ptx, "12.1", None),
            "cu130/sm_120f: sm_120f family cubin for a 12.1 device, cu130, driver 13.0 ≥ 13.0, \
             torch not checked"
        );
    }

    #[test]
    fn a_policy_can_forbid_the_drivers_ptx_jit() {
        let every_kind = record(&EVERY_KIND, &[]);
        let by = Some("AF3_KERNELS_PTX_JIT=0");
        // Where a cubin fits, nothing changes.
        assert!(explained(&every_kind, "9.0", by).starts_with("cu130/sm_90a: "));
        assert!(explained(&every_kind, "10.3", by).starts_with("cu130/sm_100f: "));
        // Where only PTX fits, the refusal names the setting.
        let no_fit = explained(&every_kind, "11.0", by);
        assert!(
            no_fit.contains(
                "cu130/compute_90: fits, but AF3_KERNELS_PTX_JIT=0 forbids the driver's PTX JIT, \
                 which would compile this PTX for the device on first load"
            ),
            "{no_fit}"
        );
        // PTX that does not run on the device is refused for that first.
        let no_fit = explained(&every_kind, "8.9", by);
        assert!(no_fit.contains(
            "cu130/compute_90: compute_90 PTX runs only on compute capability 9.0 or later"
        ));
    }

    #[test]
    fn ptx_jit_policy_reads_its_variable() {
        assert_eq!(ptx_jit_variable("af3-kernels"), "AF3_KERNELS_PTX_JIT");
        assert_eq!(ptx_jit_variable("my.lib"), "MY_LIB_PTX_JIT");
        assert_eq!(PtxJitPolicy::Allowed.forbidden_by("af3-kernels"), None);
        assert_eq!(
            PtxJitPolicy::Forbidden
                .forbidden_by("af3-kernels")
                .as_deref(),
            Some("the loader's policy (as AF3_KERNELS_PTX_JIT=0 would)")
        );
        // A package name no other test uses, so its variable is this test's alone.
        let package = "kwheel-ptx-policy-test";
        for (value, forbidden) in [("0", true), ("off", true), (" No ", true), ("1", false)] {
            std::env::set_var("KWHEEL_PTX_POLICY_TEST_PTX_JIT", value);
            assert_eq!(
                PtxJitPolicy::FromEnvironment.forbidden_by(package),
                forbidden.then(|| format!("KWHEEL_PTX_POLICY_TEST_PTX_JIT={value}")),
                "{value:?}"
            );
        }
        std::env::remove_var("KWHEEL_PTX_POLICY_TEST_PTX_JIT");
        assert_eq!(PtxJitPolicy::FromEnvironment.forbidden_by(package), None);
    }

    #[test]
    fn prefers_kind_before_sm() {
        let query = query("10.3", "cu130", "13.0", None);
        let table: &[(&[&str], &str)] = &[
            (&["cu130/sm_100", "cu130/sm_100f"], "cu130/sm_100f"),
            (&["cu130/sm_100f", "cu130/sm_100"], "cu130/sm_100f"),
            (&["cu130/compute_100", "cu130/sm_100"], "cu130/sm_100"),
            (
                &["cu130/compute_90", "cu130/compute_100"],
                "cu130/compute_100",
            ),
            (&["cu130/sm_103", "cu130/sm_100f"], "cu130/sm_100f"),
            (&["cu130/sm_103a", "cu130/sm_100f"], "cu130/sm_103a"),
            (&["cu130/sm_100a", "cu130/compute_100"], "cu130/compute_100"),
        ];
        for (variants, expected) in table {
            let record = record(variants, &[]);
            let choice = select_variant("k", &record, &query).unwrap();
            assert_eq!(choice.variant.label(), *expected, "{variants:?}");
        }
    }

    #[test]
    fn fleet_devices_parse_by_name_or_capability() {
        let device = |name: &str, capability| FleetDevice {
            name: name.to_owned(),
            capability,
        };
        #[rustfmt::skip]
        let table = [
            ("H100", device("H100", (9, 0))), ("b300", device("B300", (10, 3))),
            ("GB10", device("GB10", (12, 1))), ("thor", device("Thor", (11, 0))),
            ("RTX-PRO-6000", device("RTX-PRO-6000", (12, 0))),
            ("next=13.0", device("next", (13, 0))), ("10.3", device("10.3", (10, 3))),
            ("sm_121", device("12.1", (12, 1))),
        ];
        for (text, expected) in table {
            assert_eq!(FleetDevice::parse(text), Ok(expected), "{text}");
        }
        for text in ["", "X100", "=9.0", "next=13", "H100=H200"] {
            let error = FleetDevice::parse(text).unwrap_err().to_string();
            assert!(
                error.starts_with(&format!(
                    "`{text}` is not a fleet device (expected a known GPU (H100, H200,"
                )),
                "{error}"
            );
        }
    }

    #[test]
    fn fleet_table_snapshot() {
        let mut index = index();
        index
            .kernels
            .insert("every_kind".to_owned(), record(&EVERY_KIND, &[]));
        index
            .kernels
            .insert("wgmma".to_owned(), record(&["cu130/sm_90a"], &[]));
        index.kernels.remove("scale");
        let fleet: Vec<FleetDevice> = [
            "H200",
            "B200",
            "B300",
            "Thor",
            "RTX-PRO-6000",
            "GB10",
            "13.0",
        ]
        .iter()
        .map(|text| FleetDevice::parse(text).unwrap())
        .collect();
        let report = fleet_coverage(&index, &fleet, &query("9.0", "cu130", "13.0", None), None);
        assert_eq!(
            report.to_string(),
            "\
CUDA build cu130, driver 13.0, torch not checked

kernel      H200 (9.0)  B200 (10.0)  B300 (10.3)  Thor (11.0)  RTX-PRO-6000 (12.0)  GB10 (12.1)  13.0
every_kind  sm_90a      sm_100a      sm_100f      compute_90   sm_120               sm_120       compute_90
layernorm   sm_90a      sm_100a      none         none         none                 none         none
moe_gate    sm_90a      sm_100a      none         none         none                 none         none
wgmma       sm_90a      none         none         none         none                 none         none

sm_XYa: arch-specific cubin (exactly X.Y); sm_XYf: family cubin (X.Y and later X.z); sm_XY: plain cubin (X.Y and later X.z);
compute_XY: PTX the driver compiles on first load; none: nothing fits (`dev coverage --device` says why)
"
        );
        assert_eq!(report.devices[2].report.device, "10.3");
        let forbidden = fleet_coverage(
            &index,
            &fleet,
            &query("9.0", "cu130", "13.0", None),
            Some("AF3_KERNELS_PTX_JIT=0"),
        );
        let every_kind = |report: &FleetReport, device: usize| {
            report.devices[device].report.kernels["every_kind"]
                .loads
                .clone()
        };
        assert_eq!(every_kind(&forbidden, 3), None);
        assert_eq!(every_kind(&report, 3), Some("cu130/compute_90".to_owned()));
        assert!(forbidden
            .to_string()
            .starts_with("CUDA build cu130, driver 13.0, torch not checked, PTX forbidden by AF3_KERNELS_PTX_JIT=0\n"));
        let json = serde_json::to_string(&report).unwrap();
        assert_eq!(serde_json::from_str::<FleetReport>(&json).unwrap(), report);
    }

    #[test]
    fn coverage_json_round_trips() {
        let index = index();
        let report = coverage(&index, &query("sm_90", "cu129", "575.51.03", None));
        let json = serde_json::to_string_pretty(&report).unwrap();
        let back: CoverageReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back, report);
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "device": "9.0",
                "cuda": "cu129",
                "driver": "12.9",
                "torch": null,
                "kernels": {
                    "layernorm": {
                        "loads": "cu129/sm_90a",
                        "reason": "sm_90a cubin for a 9.0 device, cu129, driver 12.9 ≥ 12.9, \
                                   torch not checked",
                        "refusals": [
                            ["cu129/sm_100a", "sm_100a cubins run only on compute capability \
                                               10.0, this device is 9.0"],
                            ["cu130/sm_90a", "built for CUDA 13.0 (cu130), the runtime is \
                                              CUDA 12.9 (cu129)"],
                            ["cu130/sm_100a", "sm_100a cubins run only on compute capability \
                                               10.0, this device is 9.0"],
                        ],
                    },
                    "moe_gate": {
                        "loads": "cu129/sm_90a",
                        "reason": "sm_90a cubin for a 9.0 device, cu129, driver 12.9 ≥ 12.9, \
                                   torch not checked",
                        "refusals": [
                            ["cu130/sm_90a", "built for CUDA 13.0 (cu130), the runtime is \
                                              CUDA 12.9 (cu129)"],
                            ["cu130/sm_100a", "sm_100a cubins run only on compute capability \
                                               10.0, this device is 9.0"],
                            ["cu129/sm_100a", "not built: tcgen05 needs CUDA 13"],
                        ],
                    },
                    "scale": {
                        "loads": "cu129/sm_90a",
                        "reason": "sm_90a cubin for a 9.0 device, cu129, driver 12.9 ≥ 12.9, \
                                   torch not checked",
                        "refusals": [
                            ["cu129/sm_80", "sm_80 cubins run only on compute capability 8.0 \
                                             or a later 8.x, this device is 9.0"],
                            ["cu130/sm_80", "sm_80 cubins run only on compute capability 8.0 \
                                             or a later 8.x, this device is 9.0"],
                            ["cu130/sm_90a", "built for CUDA 13.0 (cu130), the runtime is \
                                              CUDA 12.9 (cu129)"],
                        ],
                    },
                },
            })
        );
    }

    #[test]
    fn coverage_table_snapshot() {
        let index = index();
        let report = coverage(
            &index,
            &query("sm_100", "cu129", "13.0", Some("2.13.0+cu129")),
        );
        assert_eq!(
            report.to_string(),
            "\
device 10.0, CUDA build cu129, driver 13.0, torch 2.13.0+cu129

kernel     loads          why
layernorm  cu129/sm_100a  sm_100a cubin for a 10.0 device, cu129, driver 13.0 ≥ 12.9, torch 2.13.0+cu129 matches 2.13.*
moe_gate   none           nothing fits: 3 variants refused, 1 target not built
  cu129/sm_90a: sm_90a cubins run only on compute capability 9.0, this device is 10.0
  cu130/sm_90a: sm_90a cubins run only on compute capability 9.0, this device is 10.0
  cu130/sm_100a: built for CUDA 13.0 (cu130), the runtime is CUDA 12.9 (cu129)
  cu129/sm_100a: not built: tcgen05 needs CUDA 13
scale      none           nothing fits: 4 variants refused
  cu129/sm_80: sm_80 cubins run only on compute capability 8.0 or a later 8.x, this device is 10.0
  cu129/sm_90a: sm_90a cubins run only on compute capability 9.0, this device is 10.0
  cu130/sm_80: sm_80 cubins run only on compute capability 8.0 or a later 8.x, this device is 10.0
  cu130/sm_90a: sm_90a cubins run only on compute capability 9.0, this device is 10.0
"
        );
    }
}
