//! Coverage: [`crate::select`]'s rules run for every kernel of a bundle, for one device
//! (`dev coverage`) or a fleet of them (`dev coverage --fleet`), with where each chosen
//! artifact is (wheel, cache, store) when the report is made on a bundle on disk.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::bundle::locate;
use crate::bundle::Bundle;
use crate::cache::ArtifactCache;
use crate::device::{DeviceError, DeviceQuery};
use crate::index::{ArtifactLocation, Index, KernelRecord};
use crate::module_coverage::{module_coverage, ModuleCoverage};
use crate::select::evaluate;

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
    /// Every extension module of the index, as `<name> (module)` (the name `bundle list` and
    /// `status()` use), for this machine's CPU: whether its fatbin runs on the device.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub modules: BTreeMap<String, ModuleCoverage>,
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
    /// bundle on disk ([`bundle_coverage`]); `None` from the index alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<ArtifactLocation>,
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
            (
                name.clone(),
                kernel_coverage(record, query, ptx_forbidden_by),
            )
        })
        .collect();
    // Modules are built for the CPU that runs the bundler, and chosen at import by the CPU
    // that runs the process: this machine's.
    let modules = index
        .modules
        .iter()
        .map(|(name, record)| {
            let coverage = module_coverage(
                record,
                query.capability,
                query.cuda,
                std::env::consts::ARCH,
                query.torch.as_deref(),
            );
            (format!("{name} (module)"), coverage)
        })
        .collect();
    CoverageReport {
        device: query.device(),
        cuda: query.cuda.to_string(),
        driver: query.driver.to_string(),
        torch: query.torch.clone(),
        kernels,
        modules,
    }
}

/// One kernel's line of [`coverage_with`]: what loads and why, or why nothing does.
pub fn kernel_coverage(
    record: &KernelRecord,
    query: &DeviceQuery,
    ptx_forbidden_by: Option<&str>,
) -> KernelCoverage {
    let (choice, refusals) = evaluate(record, query, ptx_forbidden_by);
    let (loads, reason) = match choice {
        Some(choice) => (Some(choice.variant.label()), choice.reason),
        None => (None, nothing_fits(record)),
    };
    let refusals = refusals
        .iter()
        .map(|refusal| (refusal.variant.clone(), refusal.reason.to_string()))
        .collect();
    KernelCoverage {
        loads,
        reason,
        refusals,
        location: None,
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

/// A row of the `dev coverage` table: a kernel's or a module's.
struct Row<'a> {
    name: &'a str,
    loads: &'a str,
    /// Where its cubin is (`-` when not known).
    place: String,
    reason: &'a str,
    /// Under a row that loads nothing: each refusal, on its own line.
    refusals: Vec<String>,
}

impl fmt::Display for CoverageReport {
    /// A header naming the query, an aligned table (kernel, loads, why), and the refusals
    /// under every kernel that loads nothing; the extension modules after the kernels.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let torch = self.torch.as_deref().unwrap_or("not checked");
        writeln!(
            f,
            "device {}, CUDA build {}, driver {}, torch {torch}",
            self.device, self.cuda, self.driver
        )?;
        // The `where` column only for reports made on a bundle on disk.
        let locations = self.kernels.values().any(|k| k.location.is_some());
        // Each kernel's row, then each module's.
        let mut rows: Vec<Row<'_>> = Vec::new();
        for (name, coverage) in &self.kernels {
            let refusals = match coverage.loads {
                Some(_) => Vec::new(),
                None => coverage
                    .refusals
                    .iter()
                    .map(|(variant, reason)| format!("{variant}: {reason}"))
                    .collect(),
            };
            rows.push(Row {
                name,
                loads: coverage.loads.as_deref().unwrap_or("none"),
                place: coverage
                    .location
                    .map_or_else(|| "-".to_owned(), |location| location.to_string()),
                reason: &coverage.reason,
                refusals,
            });
        }
        for (name, coverage) in &self.modules {
            rows.push(Row {
                name,
                loads: coverage.loads.as_deref().unwrap_or("none"),
                place: "-".to_owned(),
                reason: &coverage.reason,
                refusals: coverage.refusals.clone(),
            });
        }
        let width = |text: &str| text.chars().count();
        let column = |header: &str, cell: &dyn Fn(&Row<'_>) -> usize| {
            rows.iter()
                .map(cell)
                .chain([width(header)])
                .max()
                .unwrap_or(0)
        };
        let kernel_width = column("kernel", &|row| width(row.name));
        let loads_width = column("loads", &|row| width(row.loads));
        let where_width = column("where", &|row| width(&row.place)) + 2;
        writeln!(f)?;
        let header = match locations {
            true => format!("{:where_width$}", "where"),
            false => String::new(),
        };
        write!(
            f,
            "{:kernel_width$}  {:loads_width$}  {header}why",
            "kernel", "loads"
        )?;
        for Row {
            name,
            loads,
            place,
            reason,
            refusals,
        } in &rows
        {
            let place = match locations {
                true => format!("{place:where_width$}"),
                false => String::new(),
            };
            write!(
                f,
                "\n{name:kernel_width$}  {loads:loads_width$}  {place}{reason}"
            )?;
            for refusal in refusals {
                write!(f, "\n  {refusal}")?;
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
    pub fn parse(text: &str) -> Result<FleetDevice, DeviceError> {
        let text = text.trim();
        let invalid = || DeviceError::FleetDevice {
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
        // The kernels, then the modules (`<name> (module)`).
        let kernels: Vec<&String> = self
            .devices
            .first()
            .map(|entry| {
                let report = &entry.report;
                report.kernels.keys().chain(report.modules.keys()).collect()
            })
            .unwrap_or_default();
        let cell = |entry: &FleetEntry, kernel: &str| -> String {
            // A module's cell: the archs of its fatbin that run there (`any`: no device code).
            if let Some(module) = entry.report.modules.get(kernel) {
                return match (&module.loads, &module.covering[..]) {
                    (None, _) => "none".to_owned(),
                    (Some(_), []) => "any".to_owned(),
                    (Some(_), covering) => crate::module_coverage::arch_list(covering),
                };
            }
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
        )?;
        let modules = self.devices.iter().any(|e| !e.report.modules.is_empty());
        if modules {
            writeln!(
                f,
                "a module's cell: the archs of its fatbin that run there; any: a module without \
                 device code"
            )?;
        }
        Ok(())
    }
}

/// `dev coverage` on a bundle on disk: [`coverage_with`] under the PTX policy, with, for each
/// kernel that loads, where its cubin is (the wheel, the artifact cache, or only the store).
pub fn bundle_coverage(
    bundle: &Bundle,
    query: &DeviceQuery,
    ptx_forbidden_by: Option<&str>,
    cache: &ArtifactCache,
) -> CoverageReport {
    let mut report = coverage_with(bundle.index(), query, ptx_forbidden_by);
    for (name, kernel) in &mut report.kernels {
        let Some(label) = &kernel.loads else { continue };
        let variant = bundle.index().kernels[name]
            .variants
            .iter()
            .find(|variant| &variant.label() == label);
        kernel.location = variant.map(|variant| {
            locate(
                bundle.root(),
                bundle.index().store.as_deref(),
                variant,
                cache,
            )
        });
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

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
