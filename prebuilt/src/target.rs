//! Compile targets: GPU architectures (`sm_90a`) and CUDA builds (`cu129`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A compile target as spelled in a manifest: `sm_90a`, `sm_100f`, `sm_90`, `compute_90`.
///
/// Its [`ArchKind`] says which devices run what it builds (NVIDIA's rules, cited in
/// `docs/loader.md`):
///
/// | spelling | kind | runs on |
/// | --- | --- | --- |
/// | `sm_XYa` | [`ArchKind::Specific`] | exactly compute capability `X.Y` |
/// | `sm_XYf` | [`ArchKind::Family`] | `X.z`, `z ≥ Y`: the family (`sm_100f` on 10.0 and 10.3) |
/// | `sm_XY` | [`ArchKind::Plain`] | `X.z`, `z ≥ Y` |
/// | `compute_XY` | [`ArchKind::Ptx`] | any `≥ X.Y`, once the driver has compiled the PTX |
///
/// The derived order is by SM, then by kind from the least to the most specific, so a sorted
/// list keeps `sm_90` before `sm_90a` as it always did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Arch {
    /// The SM number: major × 10 + minor (90 for `sm_90a`, 100 for `sm_100f`).
    pub sm: u32,
    /// What the target builds and which devices run it.
    pub kind: ArchKind,
}

/// The kind of a compile target, from the least specific to the most.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ArchKind {
    /// `compute_XY`: PTX, compiled by the driver for the device it loads on.
    Ptx,
    /// `sm_XY`: a cubin for `X.Y` and later minors of the same major.
    Plain,
    /// `sm_XYf`: a cubin with the family's features, for `X.Y` and later minors of its major.
    Family,
    /// `sm_XYa`: a cubin with the architecture-specific features (wgmma, tcgen05) of exactly
    /// `X.Y`.
    Specific,
}

impl ArchKind {
    /// How the kind is named in messages: `arch-specific`, `family`, `plain`, `PTX`.
    pub fn describe(self) -> &'static str {
        match self {
            ArchKind::Ptx => "PTX",
            ArchKind::Plain => "plain",
            ArchKind::Family => "family",
            ArchKind::Specific => "arch-specific",
        }
    }
}

impl Arch {
    /// The compute capability `(major, minor)` this target is built for.
    pub fn capability(self) -> (u32, u32) {
        (self.sm / 10, self.sm % 10)
    }

    /// Whether this is an architecture-specific (`a`) target.
    pub fn is_specific(self) -> bool {
        self.kind == ArchKind::Specific
    }

    /// Whether this target builds PTX (`compute_XY`) rather than a cubin.
    pub fn is_ptx(self) -> bool {
        self.kind == ArchKind::Ptx
    }

    /// What the target builds: `cubin` or `PTX`.
    pub fn artifact(self) -> &'static str {
        if self.is_ptx() {
            "PTX"
        } else {
            "cubin"
        }
    }

    /// The same SM with another kind.
    pub fn with_kind(self, kind: ArchKind) -> Arch {
        Arch { kind, ..self }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sm = self.sm;
        match self.kind {
            ArchKind::Ptx => write!(f, "compute_{sm}"),
            ArchKind::Plain => write!(f, "sm_{sm}"),
            ArchKind::Family => write!(f, "sm_{sm}f"),
            ArchKind::Specific => write!(f, "sm_{sm}a"),
        }
    }
}

/// A string that is not an architecture (`sm_90a`) or a CUDA build (`cu129`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a valid {what} (expected {expected})")]
pub struct ParseTargetError {
    text: String,
    what: &'static str,
    expected: &'static str,
}

impl ParseTargetError {
    /// The same error, saying `expected` is what was expected.
    pub(crate) fn expecting(self, expected: &'static str) -> ParseTargetError {
        ParseTargetError { expected, ..self }
    }
}

impl FromStr for Arch {
    type Err = ParseTargetError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = || ParseTargetError {
            text: text.to_owned(),
            what: "architecture",
            expected: "`sm_` and a number, optionally followed by `a` or `f`, like `sm_90a` or \
                       `sm_100f`; or `compute_` and a number for PTX, like `compute_90`",
        };
        let (digits, kind) = if let Some(digits) = text.strip_prefix("compute_") {
            // Arch- and family-specific PTX (`compute_90a`) runs on no more devices than the
            // cubin it would become, so it is not a target here: ship `sm_90a` instead.
            (digits, ArchKind::Ptx)
        } else {
            let rest = text.strip_prefix("sm_").ok_or_else(error)?;
            if let Some(digits) = rest.strip_suffix('a') {
                (digits, ArchKind::Specific)
            } else if let Some(digits) = rest.strip_suffix('f') {
                (digits, ArchKind::Family)
            } else {
                (rest, ArchKind::Plain)
            }
        };
        if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(error());
        }
        let sm = digits.parse().map_err(|_| error())?;
        Ok(Arch { sm, kind })
    }
}

/// A CUDA build of the toolkit and of torch: `cu129` is CUDA 12.9, `cu130` is CUDA 13.0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaBuild {
    /// CUDA major version.
    pub major: u32,
    /// CUDA minor version.
    pub minor: u32,
}

impl CudaBuild {
    /// The dotted version, `12.9`.
    pub fn version(self) -> String {
        format!("{}.{}", self.major, self.minor)
    }

    /// The build for a dotted CUDA version such as `12.9` or `13.0.88` (extra parts ignored).
    pub fn from_version(text: &str) -> Result<Self, ParseTargetError> {
        let error = || ParseTargetError {
            text: text.to_owned(),
            what: "CUDA version",
            expected: "a dotted version like `12.9`",
        };
        let mut parts = text.split('.');
        let major = parts
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(error)?;
        let minor = parts
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(error)?;
        if minor > 9 {
            return Err(error());
        }
        Ok(CudaBuild { major, minor })
    }
}

impl fmt::Display for CudaBuild {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cu{}{}", self.major, self.minor)
    }
}

impl FromStr for CudaBuild {
    type Err = ParseTargetError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = || ParseTargetError {
            text: text.to_owned(),
            what: "CUDA build",
            expected: "`cu` and the CUDA version without its dot, like `cu129`",
        };
        let digits = text.strip_prefix("cu").ok_or_else(error)?;
        if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(error());
        }
        let (major, minor) = digits.split_at(digits.len() - 1);
        Ok(CudaBuild {
            major: major.parse().map_err(|_| error())?,
            minor: minor.parse().map_err(|_| error())?,
        })
    }
}

macro_rules! serde_via_display {
    ($type:ty) => {
        impl Serialize for $type {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $type {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

serde_via_display!(Arch);
serde_via_display!(CudaBuild);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_round_trips() {
        for text in [
            "sm_90a",
            "sm_100a",
            "sm_86",
            "sm_120",
            "sm_100f",
            "sm_121f",
            "compute_90",
            "compute_120",
        ] {
            assert_eq!(text.parse::<Arch>().unwrap().to_string(), text);
        }
        #[rustfmt::skip]
        let table = [
            ("sm_100a", 100, ArchKind::Specific, (10, 0)),
            ("sm_103f", 103, ArchKind::Family, (10, 3)),
            ("sm_120", 120, ArchKind::Plain, (12, 0)),
            ("compute_90", 90, ArchKind::Ptx, (9, 0)),
        ];
        for (text, sm, kind, capability) in table {
            let arch: Arch = text.parse().unwrap();
            assert_eq!(
                (arch.sm, arch.kind, arch.capability()),
                (sm, kind, capability)
            );
        }
        assert!("sm_90a".parse::<Arch>().unwrap().is_specific());
        assert!("compute_90".parse::<Arch>().unwrap().is_ptx());
    }

    #[test]
    fn arch_sorts_by_sm_then_from_least_to_most_specific() {
        let mut archs: Vec<Arch> = [
            "sm_100a",
            "sm_90a",
            "compute_90",
            "sm_100f",
            "sm_90",
            "sm_100",
        ]
        .iter()
        .map(|text| text.parse().unwrap())
        .collect();
        archs.sort();
        let sorted: Vec<String> = archs.iter().map(ToString::to_string).collect();
        assert_eq!(
            sorted,
            [
                "compute_90",
                "sm_90",
                "sm_90a",
                "sm_100",
                "sm_100f",
                "sm_100a"
            ]
        );
    }

    #[test]
    fn arch_rejects_garbage() {
        for text in [
            "sm90a",
            "sm_",
            "sm_9",
            "sm_90b",
            "sm_90af",
            "compute_90a",
            "compute_100f",
            "compute_",
            "ptx_90",
            "",
        ] {
            let error = text.parse::<Arch>().unwrap_err().to_string();
            assert!(
                error.contains("not a valid architecture"),
                "{text}: {error}"
            );
        }
    }

    #[test]
    fn cuda_build_round_trips() {
        let build: CudaBuild = "cu129".parse().unwrap();
        assert_eq!(
            (build.major, build.minor, build.version()),
            (12, 9, "12.9".into())
        );
        assert_eq!("cu130".parse::<CudaBuild>().unwrap().to_string(), "cu130");
        assert_eq!(
            CudaBuild::from_version("13.0.88").unwrap().to_string(),
            "cu130"
        );
        assert!("cuda12".parse::<CudaBuild>().is_err());
        assert!("cu1".parse::<CudaBuild>().is_err());
    }
}
