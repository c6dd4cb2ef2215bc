//! Wheel file names: `{name}-{version}(-{build})?-{python}-{abi}-{platform}.whl`, parsed,
//! normalized, and their compressed tag sets expanded.

use std::fmt;
use std::str::FromStr;

use crate::Error;

/// A wheel file name: `{name}-{version}(-{build})?-{python}-{abi}-{platform}.whl`.
///
/// Each tag may be a compressed set (`py2.py3`); [`WheelFilename::tags`] expands them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WheelFilename {
    name: String,
    version: String,
    build: Option<String>,
    python: Vec<String>,
    abi: Vec<String>,
    platform: Vec<String>,
}

impl WheelFilename {
    /// The file name of distribution `name` at `version` with these (possibly compressed) tags.
    /// The name is normalized (`af3-kernels` → `af3_kernels`) and `-` in the version escaped.
    pub fn new(
        name: &str,
        version: &str,
        python: &str,
        abi: &str,
        platform: &str,
    ) -> Result<WheelFilename, Error> {
        check_name(name)?;
        Ok(WheelFilename {
            name: normalize_name(name),
            version: escape_version(version)?,
            build: None,
            python: split_tag("python tag", python)?,
            abi: split_tag("abi tag", abi)?,
            platform: split_tag("platform tag", platform)?,
        })
    }

    /// Parses a wheel file name (without directories).
    pub fn parse(file_name: &str) -> Result<WheelFilename, Error> {
        let invalid = |reason: &str| Error::InvalidName {
            what: "file name",
            value: file_name.to_owned(),
            reason: reason.to_owned(),
        };
        let stem = file_name
            .strip_suffix(".whl")
            .ok_or_else(|| invalid("it does not end in `.whl`"))?;
        let parts: Vec<&str> = stem.split('-').collect();
        let (name, version, build, python, abi, platform) = match parts[..] {
            [name, version, python, abi, platform] => (name, version, None, python, abi, platform),
            [name, version, build, python, abi, platform] => {
                if !build.starts_with(|c: char| c.is_ascii_digit()) {
                    return Err(invalid("its build tag does not start with a digit"));
                }
                (name, version, Some(build), python, abi, platform)
            }
            _ => {
                return Err(invalid(
                    "it needs five or six `-`-separated parts: name, version, (build,) python, \
                     abi and platform tags",
                ))
            }
        };
        check_name(name).map_err(|_| invalid("its distribution name is not valid"))?;
        if version.is_empty() || !version.chars().all(is_version_char) {
            return Err(invalid("its version is not valid"));
        }
        Ok(WheelFilename {
            name: name.to_owned(),
            version: version.to_owned(),
            build: build.map(str::to_owned),
            python: split_tag("python tag", python)?,
            abi: split_tag("abi tag", abi)?,
            platform: split_tag("platform tag", platform)?,
        })
    }

    /// The distribution name as the file name spells it (normalized when built by [`Self::new`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The version as the file name spells it (`-` escaped to `_`).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The build tag, if any.
    pub fn build(&self) -> Option<&str> {
        self.build.as_deref()
    }

    /// The python tags (`py3`).
    pub fn python_tags(&self) -> &[String] {
        &self.python
    }

    /// The abi tags (`none`).
    pub fn abi_tags(&self) -> &[String] {
        &self.abi
    }

    /// The platform tags (`manylinux_2_28_x86_64`).
    pub fn platform_tags(&self) -> &[String] {
        &self.platform
    }

    /// Every `python-abi-platform` combination the name stands for, in order.
    pub fn tags(&self) -> Vec<String> {
        let mut tags = Vec::new();
        for python in &self.python {
            for abi in &self.abi {
                for platform in &self.platform {
                    tags.push(format!("{python}-{abi}-{platform}"));
                }
            }
        }
        tags
    }

    /// The `.dist-info` directory of the wheel (`af3_kernels-0.1.0.dist-info`).
    pub fn dist_info(&self) -> String {
        format!("{}-{}.dist-info", normalize_name(&self.name), self.version)
    }

    /// Whether the wheel installs into purelib: only platform-independent wheels do.
    pub fn is_purelib(&self) -> bool {
        self.platform.iter().all(|platform| platform == "any")
    }
}

impl fmt::Display for WheelFilename {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.name, self.version)?;
        if let Some(build) = &self.build {
            write!(f, "-{build}")?;
        }
        write!(
            f,
            "-{}-{}-{}.whl",
            self.python.join("."),
            self.abi.join("."),
            self.platform.join(".")
        )
    }
}

impl FromStr for WheelFilename {
    type Err = Error;

    fn from_str(file_name: &str) -> Result<WheelFilename, Error> {
        WheelFilename::parse(file_name)
    }
}

/// The normalized form of a distribution name for file names: lowercase, every run of `-`,
/// `_` and `.` one `_` (`Af3.Kernels` → `af3_kernels`).
pub fn normalize_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut after_separator = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !after_separator {
                out.push('_');
            }
            after_separator = true;
        } else {
            out.push(c.to_ascii_lowercase());
            after_separator = false;
        }
    }
    out
}

fn check_name(name: &str) -> Result<(), Error> {
    let ok = name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidName {
            what: "distribution name",
            value: name.to_owned(),
            reason: "use ASCII letters, digits, `-`, `_` and `.`, starting and ending with a \
                     letter or digit"
                .into(),
        })
    }
}

fn is_version_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '!' | '_')
}

pub(super) fn escape_version(version: &str) -> Result<String, Error> {
    let escaped = version.replace('-', "_");
    if escaped.is_empty() || !escaped.chars().all(is_version_char) {
        return Err(Error::InvalidName {
            what: "version",
            value: version.to_owned(),
            reason: "use ASCII letters, digits, `.`, `+`, `!`, `-` and `_`".into(),
        });
    }
    Ok(escaped)
}

fn split_tag(what: &'static str, tag: &str) -> Result<Vec<String>, Error> {
    let parts: Vec<String> = tag.split('.').map(str::to_owned).collect();
    let ok = parts
        .iter()
        .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    if !ok {
        return Err(Error::InvalidName {
            what,
            value: tag.to_owned(),
            reason: "a tag is ASCII letters, digits and `_`; `.` separates a set of tags".into(),
        });
    }
    Ok(parts)
}
