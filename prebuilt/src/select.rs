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

use std::fmt;

use crate::device::{minimum_release, DeviceQuery, DriverVersion};
use crate::index::{KernelRecord, Variant};
use crate::target::{Arch, ArchKind, CudaBuild};

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

/// A torch pin: a PEP 440 version specifier set (`==2.13.*`, `>=2.9`, `~=2.11`,
/// `>=2.11,<2.14`), read the way pip reads a wheel's `Requires-Dist`, so the pin the loader
/// checks is the requirement pip installed against. A bare version (`2.13.*`, `2.13.0`)
/// means `==` that version; `*` means any torch.
///
/// One implementation for both ends: the manifest's pin is parsed here when the manifest is
/// read, `Requires-Dist` is [`TorchPin::requirement`], and selection is
/// [`TorchPin::matches`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TorchPin {
    /// The specifiers; `None` for `*` and for [`NO_TORCH`].
    specifiers: Option<pep440_rs::VersionSpecifiers>,
    /// Whether the library uses torch at all: `false` for [`NO_TORCH`].
    uses_torch: bool,
}

/// The pin of a library whose kernels never touch torch (`torch = "none"`): its wheel requires
/// no torch, and any torch, or none, loads its variants.
pub const NO_TORCH: &str = "none";

/// A torch pin that is not a PEP 440 specifier set.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid torch pin `{pin}`: {reason} (write a PEP 440 specifier such as `2.13.*`, \
     `==2.13.*`, `>=2.9`, `~=2.11` or `>=2.11,<2.14`)"
)]
pub struct InvalidPin {
    /// The pin as written.
    pub pin: String,
    /// What the parser found wrong.
    pub reason: String,
}

impl TorchPin {
    /// Parses a pin; see the type's docs for the forms taken.
    pub fn parse(pin: &str) -> Result<TorchPin, InvalidPin> {
        let text = pin.trim();
        let invalid = |reason: String| InvalidPin {
            pin: pin.to_owned(),
            reason,
        };
        if text == "*" || text == NO_TORCH {
            return Ok(TorchPin {
                specifiers: None,
                uses_torch: text != NO_TORCH,
            });
        }
        if text.is_empty() {
            return Err(invalid("it is empty".to_owned()));
        }
        let text = if text.starts_with(|c: char| c.is_ascii_digit()) {
            format!("=={text}")
        } else {
            text.to_owned()
        };
        let specifiers: pep440_rs::VersionSpecifiers =
            text.parse()
                .map_err(|error: pep440_rs::VersionSpecifiersParseError| {
                    invalid(
                        error
                            .to_string()
                            .lines()
                            .next()
                            .unwrap_or_default()
                            .to_owned(),
                    )
                })?;
        if specifiers.is_empty() {
            return Err(invalid("it has no specifier".to_owned()));
        }
        Ok(TorchPin {
            specifiers: Some(specifiers),
            uses_torch: true,
        })
    }

    /// Whether a torch version (`2.13.1+cu129`, as `torch.__version__` gives it) satisfies the
    /// pin. An unparsable version satisfies nothing but `*`.
    pub fn matches(&self, version: &str) -> bool {
        let Some(specifiers) = &self.specifiers else {
            return true;
        };
        version
            .trim()
            .parse::<pep440_rs::Version>()
            .is_ok_and(|version| specifiers.contains(&version))
    }

    /// The wheel's requirement on torch: `torch==2.13.*`, `torch>=2.9`; `torch` for `*`; none
    /// for [`NO_TORCH`].
    pub fn requirement(&self) -> Option<String> {
        match (&self.specifiers, self.uses_torch) {
            (_, false) => None,
            (Some(specifiers), true) => Some(format!("torch{specifiers}")),
            (None, true) => Some("torch".to_owned()),
        }
    }

    /// Whether the library uses torch: every pin but [`NO_TORCH`].
    pub fn uses_torch(&self) -> bool {
        self.uses_torch
    }
}

/// Whether a torch version (`2.13.1+cu129`) matches a pin (`2.13.*`, `==2.13.*`, `>=2.9`):
/// [`TorchPin::matches`]; an invalid pin matches nothing.
pub fn torch_matches(pin: &str, version: &str) -> bool {
    TorchPin::parse(pin).is_ok_and(|pin| pin.matches(version))
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
    select_available(kernel, record, query, ptx_forbidden_by, &|_| Ok(()))
        .map(|(choice, ())| choice)
}

/// [`select_variant_with`], where `available` says whether a variant's bytes can be had here
/// (a slim wheel leaves some in its store, which a policy may forbid downloading from), and
/// where (`L`, a location). It is asked last, of variants that pass every other check; its
/// refusal is the variant's, in index order with the others, and the preferred available
/// variant is chosen, returned with the location `available` found for it.
pub fn select_available<'i, L>(
    kernel: &str,
    record: &'i KernelRecord,
    query: &DeviceQuery,
    ptx_forbidden_by: Option<&str>,
    available: &dyn Fn(&Variant) -> Result<L, RefusalReason>,
) -> Result<(Choice<'i>, L), NoFit> {
    let (chosen, refused) = choose(record, query, ptx_forbidden_by, available);
    match chosen {
        Some((variant, found)) => Ok((
            Choice {
                variant,
                reason: fit_reason(variant, query),
            },
            found,
        )),
        // Labelled only when they are the answer: a first load that fits names none.
        None => Err(NoFit {
            kernel: kernel.to_owned(),
            refusals: refusals(record, refused),
        }),
    }
}

/// Checks every variant and skipped target: the preferred variant that fits, and every
/// refusal in index order.
pub(crate) fn evaluate<'i>(
    record: &'i KernelRecord,
    query: &DeviceQuery,
    ptx_forbidden_by: Option<&str>,
) -> (Option<Choice<'i>>, Vec<Refusal>) {
    let (chosen, refused) = choose(record, query, ptx_forbidden_by, &|_| Ok(()));
    let choice = chosen.map(|(variant, ())| Choice {
        variant,
        reason: fit_reason(variant, query),
    });
    (choice, refusals(record, refused))
}

/// Each variant refused, with its reason, in index order.
type Refused<'i> = Vec<(&'i Variant, RefusalReason)>;

/// The preferred variant that fits, and each variant refused with its reason, in index order.
fn choose<'i, L>(
    record: &'i KernelRecord,
    query: &DeviceQuery,
    ptx_forbidden_by: Option<&str>,
    available: &dyn Fn(&Variant) -> Result<L, RefusalReason>,
) -> (Option<(&'i Variant, L)>, Refused<'i>) {
    let mut best: Option<(&Variant, L)> = None;
    let mut refused = Vec::new();
    for variant in &record.variants {
        match check(variant, query, ptx_forbidden_by).and_then(|()| available(variant)) {
            // Strictly greater: on a tie the earlier variant stays, so the choice never
            // depends on anything but the index.
            Ok(found) => {
                if best
                    .as_ref()
                    .is_none_or(|(best, _)| preference(variant) > preference(best))
                {
                    best = Some((variant, found));
                }
            }
            Err(reason) => refused.push((variant, reason)),
        }
    }
    (best, refused)
}

/// The refusals of `refused` (from [`choose`]), then one per skipped target of `record`.
fn refusals(record: &KernelRecord, refused: Vec<(&Variant, RefusalReason)>) -> Vec<Refusal> {
    let variants = refused.into_iter().map(|(variant, reason)| Refusal {
        variant: variant.label(),
        reason,
    });
    let skipped = record.skipped.iter().map(|skip| Refusal {
        variant: format!("{}/{}", skip.cuda, skip.arch),
        reason: RefusalReason::Skipped {
            reason: skip.reason.clone(),
        },
    });
    variants.chain(skipped).collect()
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
        _ if variant.torch == NO_TORCH => "no torch needed".to_owned(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

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
            ("", "2.13.0", false), ("2.13.*", "", false),
            ("2.13.*", "garbage", false), ("x.*", "2.13.0", false),
            // Operators, as pip reads them; the local label (`+cu130`) never stops a match.
            (">=2.13", "2.13.0", true), (">=2.9", "2.11.0+cu130", true),
            (">=2.9", "2.8.1", false), ("~=2.11", "2.11.0+cu130", true),
            ("~=2.11", "2.12.3", true), ("~=2.11", "3.0.0", false),
            ("==2.11.*", "2.11.0+cu130", true), (">=2.11,<2.14", "2.13.4", true),
            (">=2.11,<2.14", "2.14.0", false), ("!=2.11.0", "2.11.0+cu130", false),
            ("< 2.12", "2.11.0", true),
        ];
        for (pin, version, expected) in table {
            assert_eq!(torch_matches(pin, version), expected, "{pin} vs {version}");
        }
    }

    #[test]
    fn torch_pins_are_pep440_specifiers() {
        for (pin, requirement) in [
            ("2.13.*", "torch==2.13.*"),
            ("==2.11.*", "torch==2.11.*"),
            ("  2.13.0 ", "torch==2.13.0"),
            (">=2.9", "torch>=2.9"),
            ("~=2.11", "torch~=2.11"),
            (">=2.11,<2.14", "torch>=2.11, <2.14"),
            ("*", "torch"),
        ] {
            let parsed = TorchPin::parse(pin).unwrap_or_else(|error| panic!("{error}"));
            assert_eq!(parsed.requirement().as_deref(), Some(requirement), "{pin}");
            // The requirement pip sees reads back as the same pin.
            let back = TorchPin::parse(requirement.trim_start_matches("torch").trim());
            if pin != "*" {
                assert_eq!(back.as_ref().ok(), Some(&parsed), "{requirement}");
            }
        }
        for pin in [
            "",
            ">=",
            "2.13.*.*",
            "=>2.9",
            "torch>=2.9",
            ">=2.9;",
            "latest",
            "2.x",
        ] {
            let error = TorchPin::parse(pin).expect_err(pin).to_string();
            assert!(
                error.starts_with(&format!("invalid torch pin `{pin}`")),
                "{error}"
            );
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
}
