//! The `[extensions.<name>]` table of the manifest and its checks (see [`crate::extension`]).

use std::collections::BTreeMap;
use std::path::{Component, Path};

pub use prebuilt::module::compile::is_cuda_source;
use prebuilt::module::Abi;
use prebuilt::{Arch, CudaBuild};
use serde::Deserialize;

/// One `[extensions.<name>]` table.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ExtensionSpec {
    /// Its translation units: `.cu` (nvcc, device code for the archs) and `.cpp`/`.cc`/`.cxx`
    /// (the host compiler), relative to the manifest.
    pub sources: Vec<String>,
    /// `stable` (LibTorch stable ABI: one module per CUDA build, for every torch from the
    /// pin's lowest on) or `torch` (ATen and `TORCH_LIBRARY`: one per torch minor too).
    pub abi: Abi,
    /// Include directories, relative to the manifest (the library's when absent).
    pub include_dirs: Option<Vec<String>>,
    /// Extra flags for nvcc (after the library's `nvcc-flags`).
    #[serde(default)]
    pub nvcc_flags: Vec<String>,
    /// Extra flags for the host compiler, for `.cpp` files and nvcc's host side.
    #[serde(default)]
    pub cxx_flags: Vec<String>,
    /// Preprocessor defines (over the library's).
    #[serde(default)]
    pub defines: BTreeMap<String, String>,
    /// Narrows the library's architectures (the device code inside the module).
    pub arch: Option<Vec<Arch>>,
    /// Narrows the library's CUDA builds.
    pub cuda_builds: Option<Vec<CudaBuild>>,
    /// The CPU architectures of the module's host code (`x86_64`, `aarch64`); both when absent
    /// (`extension::cpu`).
    pub cpus: Option<Vec<String>>,
    /// Overrides the library's C++ standard.
    pub cxx_std: Option<String>,
    /// For `abi = "stable"`: the lowest torch the module serves (`2.11`). It is built with
    /// `TORCH_TARGET_VERSION` set to that version, against any torch at hand at least as new,
    /// and serves every torch from it on; without it, the lowest version of the pin.
    pub torch_target: Option<String>,
}

/// The endings of an extension's translation units.
pub const EXTENSION_SOURCES: &[&str] = &[".cu", ".cpp", ".cc", ".cxx"];

/// The first fault of extension `name`, as the message a manifest error carries: its name, its
/// sources, its flags, defines, archs and CUDA builds against the library's.
pub fn check_extension(
    name: &str,
    spec: &ExtensionSpec,
    library_archs: &[Arch],
    library_builds: &[CudaBuild],
    library_torch: &str,
    kernels: &BTreeMap<String, super::KernelSpec>,
) -> Option<String> {
    if !super::is_identifier(name) {
        return Some(format!(
            "extension name `{name}` must be a C identifier (it names the module's file)"
        ));
    }
    if kernels.contains_key(name) {
        return Some(format!(
            "`{name}` names a kernel too: give the extension another name"
        ));
    }
    if spec.sources.is_empty() {
        return Some("`sources` must list at least one translation unit".into());
    }
    for source in &spec.sources {
        let inside = Path::new(source)
            .components()
            .all(|component| matches!(component, Component::Normal(_) | Component::CurDir));
        if !inside {
            return Some(format!(
                "`sources` holds `{source}`, which is not inside the library's folder \
                 (absolute, or through `..`)"
            ));
        }
        if !EXTENSION_SOURCES.iter().any(|end| source.ends_with(end)) {
            return Some(format!(
                "`sources` holds `{source}`, which is not a translation unit ({}): headers are \
                 found through `include-dirs`",
                EXTENSION_SOURCES.join(", ")
            ));
        }
    }
    if let Some(duplicate) = spec
        .sources
        .iter()
        .enumerate()
        .find(|(n, source)| spec.sources[..*n].contains(source))
    {
        return Some(format!("`sources` lists `{}` twice", duplicate.1));
    }
    for (key, flags) in [
        ("nvcc-flags", &spec.nvcc_flags),
        ("cxx-flags", &spec.cxx_flags),
    ] {
        if let Some(message) = super::include_path_flag(key, flags) {
            return Some(message);
        }
    }
    if let Some(define) = spec
        .defines
        .keys()
        .find(|define| !super::is_identifier(define))
    {
        return Some(format!(
            "`defines` names `{define}`, which must be a C identifier"
        ));
    }
    if let Some(archs) = &spec.arch {
        if archs.is_empty() {
            return Some("`arch` must not be empty".into());
        }
        if let Some(arch) = archs.iter().find(|arch| !library_archs.contains(arch)) {
            return Some(format!(
                "`arch` names {arch}, which is not one of the library's `archs`"
            ));
        }
    }
    if let Some(builds) = &spec.cuda_builds {
        if builds.is_empty() {
            return Some("`cuda-builds` must not be empty".into());
        }
        if let Some(build) = builds.iter().find(|build| !library_builds.contains(build)) {
            return Some(format!(
                "`cuda-builds` names {build}, which is not one of the library's `cuda-builds`"
            ));
        }
    }
    if let Some(cpus) = &spec.cpus {
        let known = prebuilt::module::MODULE_CPUS;
        if cpus.is_empty() {
            return Some("`cpus` must not be empty".into());
        }
        if let Some(cpu) = cpus.iter().find(|cpu| !known.contains(&cpu.as_str())) {
            return Some(format!(
                "`cpus` names `{cpu}`, which is not a CPU modules are built for ({})",
                known.join(", ")
            ));
        }
        if let Some((_, cpu)) = cpus
            .iter()
            .enumerate()
            .find(|(n, cpu)| cpus[..*n].contains(cpu))
        {
            return Some(format!("`cpus` lists `{cpu}` twice"));
        }
    }
    if let Some(target) = &spec.torch_target {
        if spec.abi != Abi::Stable {
            return Some(format!(
                "`torch-target = \"{target}\"` is for `abi = \"stable\"` only: a classic \
                 module serves the torch minor it was built against"
            ));
        }
        let Some(version) = prebuilt::module::torch_target_version(target) else {
            return Some(format!(
                "`torch-target = \"{target}\"` must be a torch version `MAJOR.MINOR` (`2.11`)"
            ));
        };
        if prebuilt::module::torch_minor(library_torch).is_some_and(|pin| version > pin) {
            return Some(format!(
                "`torch-target = \"{target}\"` is newer than the library's torch pin \
                 `{library_torch}`: the module must serve the torch the library pins"
            ));
        }
    }
    None
}
