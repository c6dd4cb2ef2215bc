//! The device side of selection: what the running process has (a compute capability, the CUDA
//! version its driver supports, torch's CUDA build) and how the strings that name them parse.
//!
//! Nothing here touches a GPU: the registry fills a [`DeviceQuery`] from the driver, `dev
//! coverage` from its flags, and [`crate::select`] decides with it.

use std::fmt;

use crate::target::{Arch, CudaBuild, ParseTargetError};

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
    pub fn parse(text: &str) -> Result<DriverVersion, DeviceError> {
        let invalid = || DeviceError::Driver {
            text: text.to_owned(),
        };
        let numbers = dotted_numbers(text.trim()).ok_or_else(invalid)?;
        match numbers[..] {
            [release, ..] if release >= 100 => {
                if numbers.len() > 3 {
                    return Err(invalid());
                }
                DriverVersion::from_release(release).ok_or_else(|| DeviceError::DriverRelease {
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
pub(crate) fn dotted_numbers(text: &str) -> Option<Vec<u32>> {
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
    pub fn parse_device(text: &str) -> Result<(u32, u32), DeviceError> {
        let invalid = || DeviceError::Device {
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

    /// A simulated device (`dev coverage`, Python's `Bundle.select`): the driver, when not
    /// given, is just new enough for `cuda`.
    pub fn simulated(
        capability: (u32, u32),
        cuda: CudaBuild,
        driver: Option<DriverVersion>,
        torch: Option<String>,
    ) -> DeviceQuery {
        DeviceQuery {
            capability,
            driver: driver.unwrap_or(DriverVersion {
                major: cuda.major,
                minor: cuda.minor,
            }),
            cuda,
            torch,
        }
    }

    /// The compute capability as `9.0`.
    pub fn device(&self) -> String {
        format!("{}.{}", self.capability.0, self.capability.1)
    }
}

/// A device or driver string that cannot be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
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

/// The exact architecture to JIT for on a device: `sm_90a` on 9.0 and `sm_100a` on 10.0,
/// where the architecture-specific instructions (wgmma, tcgen05) live; plain `sm_XY` elsewhere.
pub fn device_arch(capability: (u32, u32)) -> Arch {
    let sm = capability.0 * 10 + capability.1;
    let kind = if matches!(capability, (9, 0) | (10, 0)) {
        crate::ArchKind::Specific
    } else {
        crate::ArchKind::Plain
    };
    Arch { sm, kind }
}

/// The runtime's CUDA build when torch does not say: the newest of `builds` (a bundle's, in
/// order) that the driver supports (the newest, without a driver), else the oldest; with no
/// build at all, the driver's own version (13.0 without a driver).
pub fn default_build(builds: &[CudaBuild], driver: Option<DriverVersion>) -> CudaBuild {
    let supported = |build: &&CudaBuild| driver.is_none_or(|driver| driver.supports(**build));
    builds
        .iter()
        .rev()
        .find(supported)
        .or_else(|| builds.first())
        .copied()
        .unwrap_or_else(|| {
            driver.map_or(
                CudaBuild {
                    major: 13,
                    minor: 0,
                },
                |driver| CudaBuild {
                    major: driver.major,
                    minor: driver.minor,
                },
            )
        })
}

/// A CUDA build as a user spells it: `cu129`, `12.9` or `12.9.1`.
pub fn parse_cuda_build(text: &str) -> Result<CudaBuild, ParseTargetError> {
    let text = text.trim();
    let parsed = if text.starts_with("cu") {
        text.parse()
    } else {
        CudaBuild::from_version(text)
    };
    parsed.map_err(|error| error.expecting("a CUDA build: `12.9` or `cu129`, `13.0` or `cu130`"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

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
            Err(DeviceError::DriverRelease { release: 418, .. })
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
                Err(DeviceError::Device {
                    text: text.to_owned()
                }),
                "{text}"
            );
        }
    }

    #[test]
    fn device_arch_is_architecture_specific_where_it_matters() {
        let arch = |capability| device_arch(capability).to_string();
        assert_eq!(arch((9, 0)), "sm_90a");
        assert_eq!(arch((10, 0)), "sm_100a");
        assert_eq!(arch((8, 6)), "sm_86");
        assert_eq!(arch((10, 3)), "sm_103");
        assert_eq!(arch((12, 0)), "sm_120");
    }
}
