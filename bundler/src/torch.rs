//! torch's headers for kernels that include c10/ATen (`torch = true`): the include dirs and
//! defines `torch.utils.cpp_extension` passes nvcc, read from the torch installation itself, so
//! a kernel written as a torch extension builds with none of them copied into the manifest.
//!
//! | what | where it comes from |
//! | --- | --- |
//! | the torch | `$KWHEEL_TORCH` (a site-packages folder holding `torch/`, or the `torch` package folder), else `${XDG_CACHE_HOME:-~/.cache}/kwheel/torch` (where `ci/setup-torch` installs the pinned one) |
//! | its version | `torch/version.py`'s `__version__`; it must satisfy the manifest's torch pin |
//! | include dirs | `torch/include` and `torch/include/torch/csrc/api/include` (`cpp_extension.include_paths()`), after the kernel's own |
//! | defines and flags | the `-D` entries and flags of `COMMON_NVCC_FLAGS` in that torch's `torch/utils/cpp_extension.py` (torch 2.11: `__CUDA_NO_HALF_OPERATORS__`, `__CUDA_NO_HALF_CONVERSIONS__`, `__CUDA_NO_BFLOAT16_CONVERSIONS__`, `__CUDA_NO_HALF2_OPERATORS__`, `--expt-relaxed-constexpr`), `TORCH_API_INCLUDE_EXTENSION_H`, `TORCH_EXTENSION_NAME` (the kernel's name), and `_GLIBCXX_USE_CXX11_ABI` where that torch's `cpp_extension` passes it (torch 2.11 no longer does) |
//!
//! The include dirs are ordinary include dirs from then on: every torch header the include
//! graph reaches is hashed into the key under a stable name (`[1]/ATen/ATen.h`, never the
//! absolute path) and shipped with the sources for the JIT. Python's own headers (`Python.h`,
//! for `torch/extension.h`) are not provided: binding code is host code, not a kernel's.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The variable that names the torch to take headers from.
pub const TORCH_ENV: &str = "KWHEEL_TORCH";

/// Where a torch for one CPU is looked for: a variable, else a folder of kwheel's cache, and
/// the script that installs one there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TorchPlace {
    /// The variable that names it.
    pub variable: &'static str,
    /// Its folder under `${XDG_CACHE_HOME:-~/.cache}/kwheel`.
    pub folder: &'static str,
    /// The script that installs it there.
    pub setup: &'static str,
}

impl TorchPlace {
    /// How a torch was found here: by the variable, or as the default folder.
    pub fn found_by(&self, named: bool) -> &'static str {
        match named {
            true => self.variable,
            false => "the default folder",
        }
    }

    /// The torch of this machine's CPU: `KWHEEL_TORCH`, `kwheel/torch`.
    pub const HOST: TorchPlace = TorchPlace {
        variable: TORCH_ENV,
        folder: "torch",
        setup: "ci/setup-torch",
    };
    /// The torch aarch64 modules build against on another machine: `KWHEEL_TORCH_AARCH64`,
    /// `kwheel/torch-aarch64`.
    pub const AARCH64: TorchPlace = TorchPlace {
        variable: "KWHEEL_TORCH_AARCH64",
        folder: "torch-aarch64",
        setup: "ci/setup-aarch64",
    };
    /// The torch x86_64 modules build against on another machine.
    pub const X86_64: TorchPlace = TorchPlace {
        variable: "KWHEEL_TORCH_X86_64",
        folder: "torch-x86_64",
        setup: "ci/setup-torch",
    };
}

/// The defines and include dirs of one torch installation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TorchHeaders {
    /// The `torch` package folder.
    pub package: PathBuf,
    /// How it was found: `KWHEEL_TORCH` or the default folder.
    pub found_by: String,
    /// Its version (`2.11.0+cu130`).
    pub version: String,
    /// Its include dirs, in `-I` order.
    pub include_dirs: Vec<PathBuf>,
    /// The defines `cpp_extension` passes nvcc, but `TORCH_EXTENSION_NAME` ([`Self::defines_for`]).
    pub defines: BTreeMap<String, String>,
    /// The other nvcc flags `cpp_extension` passes (`--expt-relaxed-constexpr`).
    pub nvcc_flags: Vec<String>,
    /// Whether `cpp_extension` passes `-DTORCH_EXTENSION_NAME=<name>`.
    extension_name: bool,
}

/// Why no torch headers could be had.
#[derive(Debug, thiserror::Error)]
pub enum TorchError {
    /// Nothing that looks like a torch installation is there.
    #[error(
        "no torch at {} ({}): set {} to a site-packages folder that holds \
         `torch/`, or to the `torch` package folder, of the torch the manifest pins (its \
         `include/` and `utils/cpp_extension.py` are read), or install one there with \
         `bash {}`", path.display(), place.found_by(*named), place.variable, place.setup
    )]
    NotFound {
        /// Where it was looked for.
        path: PathBuf,
        /// Whether its variable named it (else it is the default folder).
        named: bool,
        /// Where it was looked for: [`TorchPlace::HOST`], or another CPU's.
        place: &'static TorchPlace,
    },
    /// A file of the installation could not be read.
    #[error("cannot read {} of the torch at {}", path.display(), package.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The torch package folder.
        package: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The torch found is not one the manifest's pin allows.
    #[error(
        "the torch at {} ({}) is {version}, which the manifest's torch pin `{pin}` does \
         not allow: point {} at the torch the library is released for",
        package.display(), place.found_by(*named), place.variable
    )]
    Pin {
        /// Where it was looked for.
        place: &'static TorchPlace,
        /// The torch package folder.
        package: PathBuf,
        /// Whether its variable named it (else it is the default folder).
        named: bool,
        /// Its version.
        version: String,
        /// The pin.
        pin: String,
    },
    /// The torch found is older than an extension's `torch-target`.
    #[error(
        "the torch at {} ({}) is {version}, older than extension `{extension}`'s \
         `torch-target = \"{target}\"`: its stable headers lack what that torch offers; point \
         {} at torch {target} or newer",
        package.display(), place.found_by(*named), place.variable
    )]
    OlderThanTarget {
        /// Where it was looked for.
        place: &'static TorchPlace,
        /// The torch package folder.
        package: PathBuf,
        /// Whether its variable named it (else it is the default folder).
        named: bool,
        /// Its version.
        version: String,
        /// The extension.
        extension: String,
        /// Its `torch-target`.
        target: String,
    },
    /// A file does not say what kwheel reads from it.
    #[error("{} does not {what}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What was looked for: "set `__version__`".
        what: &'static str,
    },
}

impl TorchHeaders {
    /// The torch `KWHEEL_TORCH` names, else the default one.
    pub fn find() -> Result<TorchHeaders, TorchError> {
        Self::find_from(|name| std::env::var_os(name))
    }

    /// [`Self::find`] with the environment read through `env`.
    pub fn find_from(env: impl Fn(&str) -> Option<OsString>) -> Result<TorchHeaders, TorchError> {
        Self::find_where(env, &TorchPlace::HOST)
    }

    /// The torch `place` names through `env`: its variable, else its default folder.
    pub fn find_where(
        env: impl Fn(&str) -> Option<OsString>,
        place: &'static TorchPlace,
    ) -> Result<TorchHeaders, TorchError> {
        let given = env(place.variable).filter(|value| !value.is_empty());
        let found_by = place.found_by(given.is_some()).to_owned();
        let dir = prebuilt::cache::cache_dir_from(&env, place.variable, place.folder);
        // A site-packages folder holds `torch/`; the package folder holds `include/` itself.
        let package = [dir.join("torch"), dir.clone()]
            .into_iter()
            .find(|candidate| {
                candidate.join("include").is_dir() && candidate.join("version.py").is_file()
            })
            .ok_or(TorchError::NotFound {
                path: dir,
                named: given.is_some(),
                place,
            })?;
        Self::at(&package, found_by)
    }

    /// The headers of the torch package folder `package`.
    pub fn at(package: &Path, found_by: String) -> Result<TorchHeaders, TorchError> {
        let read = |relative: &str| {
            let path = package.join(relative);
            std::fs::read_to_string(&path)
                .map(|text| (text, path.clone()))
                .map_err(|source| TorchError::Read {
                    path,
                    package: package.to_owned(),
                    source,
                })
        };
        let (version_py, version_path) = read("version.py")?;
        let version =
            python_assignment(&version_py, "__version__").ok_or(TorchError::Unreadable {
                path: version_path,
                what: "set `__version__`",
            })?;
        let (extension_py, extension_path) = read("utils/cpp_extension.py")?;
        let flags = python_list(&extension_py, "COMMON_NVCC_FLAGS").ok_or_else(|| {
            TorchError::Unreadable {
                path: extension_path.clone(),
                what: "set `COMMON_NVCC_FLAGS` to a list of strings",
            }
        })?;
        let mut defines = BTreeMap::new();
        let mut nvcc_flags = Vec::new();
        for flag in flags {
            match flag.strip_prefix("-D") {
                Some(define) => {
                    let (name, value) = define.split_once('=').unwrap_or((define, "1"));
                    defines.insert(name.to_owned(), value.to_owned());
                }
                None => nvcc_flags.push(flag),
            }
        }
        if extension_py.contains("-DTORCH_API_INCLUDE_EXTENSION_H") {
            defines.insert("TORCH_API_INCLUDE_EXTENSION_H".to_owned(), "1".to_owned());
        }
        if extension_py.contains("_GLIBCXX_USE_CXX11_ABI") {
            // Older torch passes its build's ABI (`torch._C._GLIBCXX_USE_CXX11_ABI`), which
            // `torch.compiled_with_cxx11_abi()` returns.
            let (init_py, init_path) = read("__init__.py")?;
            let abi = compiled_with_cxx11_abi(&init_py).ok_or(TorchError::Unreadable {
                path: init_path,
                what: "say in `compiled_with_cxx11_abi()` which C++ ABI torch was built with",
            })?;
            defines.insert(
                "_GLIBCXX_USE_CXX11_ABI".to_owned(),
                u8::from(abi).to_string(),
            );
        }
        let include = package.join("include");
        Ok(TorchHeaders {
            package: package.to_owned(),
            found_by,
            version,
            include_dirs: vec![
                include.clone(),
                include
                    .join("torch")
                    .join("csrc")
                    .join("api")
                    .join("include"),
            ],
            defines,
            nvcc_flags,
            extension_name: extension_py.contains("-DTORCH_EXTENSION_NAME="),
        })
    }

    /// The defines for kernel `kernel`: [`Self::defines`] and `TORCH_EXTENSION_NAME=<kernel>`.
    pub fn defines_for(&self, kernel: &str) -> BTreeMap<String, String> {
        let mut defines = self.defines.clone();
        if self.extension_name {
            defines.insert("TORCH_EXTENSION_NAME".to_owned(), kernel.to_owned());
        }
        defines
    }
}

/// The string a top-level `name = '...'` (or `name: T = "..."`) assigns in Python source.
fn python_assignment(text: &str, name: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let (_, value) = rest.split_once('=')?;
        let value = value.trim();
        let quote = value.chars().next().filter(|c| *c == '\'' || *c == '"')?;
        let inner = &value[1..];
        Some(inner[..inner.find(quote)?].to_owned())
    })
}

/// The strings of a top-level `name = [ 'a', "b", ]` list in Python source (comments allowed);
/// `None` when there is no such list or it holds anything but string literals.
fn python_list(text: &str, name: &str) -> Option<Vec<String>> {
    let start = text.lines().position(|line| {
        line.strip_prefix(name)
            .is_some_and(|rest| rest.trim_start().starts_with('='))
    })?;
    let body: String = text
        .lines()
        .skip(start)
        .map(|line| line.split('#').next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    let open = body.find('[')?;
    let close = open + body[open..].find(']')?;
    let mut items = Vec::new();
    for item in body[open + 1..close].split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let quote = item.chars().next().filter(|c| *c == '\'' || *c == '"')?;
        let inner = item.strip_prefix(quote)?.strip_suffix(quote)?;
        items.push(inner.to_owned());
    }
    Some(items)
}

/// What `def compiled_with_cxx11_abi()` returns when it returns a literal.
fn compiled_with_cxx11_abi(text: &str) -> Option<bool> {
    let mut lines = text
        .lines()
        .skip_while(|line| !line.starts_with("def compiled_with_cxx11_abi"));
    lines.next()?;
    let returned = lines.find_map(|line| line.trim().strip_prefix("return "))?;
    match returned.trim() {
        "True" => Some(true),
        "False" => Some(false),
        _ => None,
    }
}

/// The torch `KWHEEL_TORCH` (or the default folder) holds, which the manifest's pin must allow.
pub fn find_pinned(manifest: &crate::Manifest) -> Result<TorchHeaders, TorchError> {
    pinned(manifest, TorchHeaders::find()?, &TorchPlace::HOST)
}

/// `torch` (found at `place`) when the manifest's pin allows it.
fn pinned(
    manifest: &crate::Manifest,
    torch: TorchHeaders,
    place: &'static TorchPlace,
) -> Result<TorchHeaders, TorchError> {
    if !prebuilt::select::torch_matches(&manifest.library.torch, &torch.version) {
        return Err(TorchError::Pin {
            place,
            package: torch.package,
            named: torch.found_by == place.variable,
            version: torch.version,
            pin: manifest.library.torch.clone(),
        });
    }
    Ok(torch)
}

/// The torch every extension module of `manifest` builds against: one the pin allows, or,
/// when every extension names a `torch-target` (stable ABI), any torch at least as new as
/// each target, whose stable headers then serve the older torch too.
pub fn find_for_modules(manifest: &crate::Manifest) -> Result<TorchHeaders, TorchError> {
    serves_modules(manifest, TorchHeaders::find()?, &TorchPlace::HOST)
}

/// `torch` (found at `place`) when it can build every extension module of `manifest`:
/// [`find_for_modules`]'s checks on a torch found elsewhere.
pub fn serves_modules(
    manifest: &crate::Manifest,
    torch: TorchHeaders,
    place: &'static TorchPlace,
) -> Result<TorchHeaders, TorchError> {
    let targets: Vec<(&String, &String)> = manifest
        .extensions
        .iter()
        .filter_map(|(name, spec)| spec.torch_target.as_ref().map(|target| (name, target)))
        .collect();
    if targets.len() < manifest.extensions.len() {
        return pinned(manifest, torch, place);
    }
    let found = prebuilt::module::torch_minor(&torch.version);
    for (name, target) in targets {
        let wanted = prebuilt::module::torch_target_version(target);
        if found.is_none() || found < wanted {
            return Err(TorchError::OlderThanTarget {
                place,
                package: torch.package,
                named: torch.found_by == place.variable,
                version: torch.version,
                extension: name.clone(),
                target: target.clone(),
            });
        }
    }
    Ok(torch)
}

/// The folder of `Python.h` of the `python3` on `PATH`, which a classic-ABI module's `<torch/extension.h>` includes; `None` without one.
/// The module must not call the Python C API (the wheel audit refuses one that does), so any
/// Python 3's headers serve: they are followed, not hashed. Asked once per process.
pub fn python_include_dir() -> Option<PathBuf> {
    static DIR: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let output = std::process::Command::new("python3")
            .args([
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['include'])",
            ])
            .stdin(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|output| output.status.success())?;
        let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        dir.join("Python.h").is_file().then_some(dir)
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpp_extension_lists_are_read() {
        let text = "X = 1\nCOMMON_NVCC_FLAGS = [\n    '-D__CUDA_NO_HALF_OPERATORS__',\n    \
                    \"--expt-relaxed-constexpr\"  # a comment\n]\n";
        assert_eq!(
            python_list(text, "COMMON_NVCC_FLAGS").unwrap(),
            ["-D__CUDA_NO_HALF_OPERATORS__", "--expt-relaxed-constexpr"]
        );
        assert_eq!(
            python_list("COMMON_NVCC_FLAGS = [x]", "COMMON_NVCC_FLAGS"),
            None
        );
        assert_eq!(python_list("OTHER = []", "COMMON_NVCC_FLAGS"), None);
        assert_eq!(
            python_assignment("__version__ = '2.11.0+cu130'\n", "__version__").as_deref(),
            Some("2.11.0+cu130")
        );
        let init = "def compiled_with_cxx11_abi() -> builtins.bool:\n    r\"\"\"doc\"\"\"\n    \
                    return True\n";
        assert_eq!(compiled_with_cxx11_abi(init), Some(true));
        let old = "def compiled_with_cxx11_abi():\n    return _C._GLIBCXX_USE_CXX11_ABI\n";
        assert_eq!(compiled_with_cxx11_abi(old), None);
    }

    #[test]
    fn a_missing_torch_says_how_to_provide_one() {
        let empty = tempfile::tempdir().unwrap();
        let env =
            |name: &str| (name == TORCH_ENV).then(|| OsString::from(empty.path().as_os_str()));
        let error = TorchHeaders::find_from(env).unwrap_err();
        let message = error.to_string();
        assert!(
            message.starts_with(&format!(
                "no torch at {} (KWHEEL_TORCH): set KWHEEL_TORCH to a site-packages folder",
                empty.path().display()
            )),
            "{message}"
        );
    }
}
