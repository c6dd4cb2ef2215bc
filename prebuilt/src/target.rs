//! Compile targets: GPU architectures (`sm_90a`) and CUDA builds (`cu129`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A GPU architecture a cubin is compiled for, as spelled in a manifest: `sm_90`, `sm_90a`.
///
/// The `a` suffix marks an architecture-specific target: its cubin runs only on exactly that
/// compute capability, while a plain `sm_XY` cubin runs on `X.z` for any `z ≥ Y`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Arch {
    /// The SM number: major × 10 + minor (90 for `sm_90a`, 100 for `sm_100a`).
    pub sm: u32,
    /// Whether this is the architecture-specific (`a`) target.
    pub specific: bool,
}

impl Arch {
    /// The compute capability `(major, minor)` this target is built for.
    pub fn capability(self) -> (u32, u32) {
        (self.sm / 10, self.sm % 10)
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}{}", self.sm, if self.specific { "a" } else { "" })
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

impl FromStr for Arch {
    type Err = ParseTargetError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = || ParseTargetError {
            text: text.to_owned(),
            what: "architecture",
            expected: "`sm_` and a number, optionally followed by `a`, like `sm_90a`",
        };
        let rest = text.strip_prefix("sm_").ok_or_else(error)?;
        let (digits, specific) = match rest.strip_suffix('a') {
            Some(digits) => (digits, true),
            None => (rest, false),
        };
        if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(error());
        }
        let sm = digits.parse().map_err(|_| error())?;
        Ok(Arch { sm, specific })
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
        for text in ["sm_90a", "sm_100a", "sm_86", "sm_120"] {
            assert_eq!(text.parse::<Arch>().unwrap().to_string(), text);
        }
        let arch: Arch = "sm_100a".parse().unwrap();
        assert_eq!(
            (arch.sm, arch.specific, arch.capability()),
            (100, true, (10, 0))
        );
    }

    #[test]
    fn arch_rejects_garbage() {
        for text in ["sm90a", "sm_", "sm_9", "sm_90b", "compute_90a", ""] {
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
