//! The kernel manifest (`kernels.toml`): the library's defaults and one table per kernel.
//!
//! ```toml
//! [library]
//! package = "af3-kernels"
//! archs = ["sm_90a", "sm_100a"]
//! cuda-builds = ["cu129", "cu130"]
//! torch = "2.13.*"
//! cxx-std = "c++17"
//! include-dirs = ["include"]
//!
//! [kernels.layernorm_bf16]
//! sources = ["layernorm/layernorm.cu"]
//! entries = ["layernorm_bf16"]
//! constants = { BLOCK_SIZE = 256 }
//!
//! inputs = ["rows", "cols"]                   # what a caller passes, by name
//! requires = [
//!   { when = "cols <= 8192", reason = "a row is staged in shared memory" },
//! ]
//!
//! [kernels.layernorm_bf16.targets.sm_100a]   # this arch only
//! defines = { LN_BLACKWELL = "1" }
//! ```
//!
//! `requires` conditions (the language of [`prebuilt::requires`]) are parsed and checked here,
//! against `inputs` and the kernel's constants: an unknown name or a type error is an error at
//! the condition's line.
//!
//! Defines are layered from the least to the most specific: torch's (`torch = true`), the
//! library's, the library's for the target arch, the kernel's constants and defines, the
//! kernel's for the target arch; a more specific value replaces a less specific one. Flags are
//! appended in that order too (library, kernel, library for the arch, kernel for the arch).
//!
//! Paths are relative to the manifest's directory. The field reference is in
//! `docs/manifest.md`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use prebuilt::index::{Constant, Requirement, Requirements, TargetInputs};
use prebuilt::{Arch, CudaBuild};
use serde::Deserialize;

mod extension;
use crate::Error;
use extension::check_extension;
pub use extension::{is_cuda_source, ExtensionSpec, EXTENSION_SOURCES};

/// A parsed and checked manifest.
#[derive(Clone, Debug)]
pub struct Manifest {
    /// The manifest file.
    pub path: PathBuf,
    /// The directory paths are relative to.
    pub root: PathBuf,
    /// Library-wide settings and defaults.
    pub library: Library,
    /// The kernels, by name.
    pub kernels: BTreeMap<String, KernelSpec>,
    /// The extension modules, by name (`[extensions.<name>]`, see [`crate::extension`]).
    pub extensions: BTreeMap<String, ExtensionSpec>,
    /// The `[release]` table: what `release check --against` holds a new release to.
    pub release: ReleasePolicy,
    /// The `[wheel]` table: how `dev build-wheel` cuts the wheel.
    pub wheel: WheelSettings,
}

/// The `[wheel]` table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct WheelSettings {
    /// The largest wheel file (`100MiB`): what does not fit goes into companion part wheels
    /// (`docs/registry-sized-wheels.md`); `dev build-wheel --max-file-size` overrides it.
    pub max_file_size: Option<String>,
}

/// The `[release]` table: the policy `kwheel release check --against OLD` applies to
/// `release diff OLD <this bundle>`. Every field is optional; an absent one allows the change.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ReleasePolicy {
    /// The most registers any entry of any target may gain.
    pub max_register_increase: Option<u32>,
    /// `false`: no entry may gain a stack frame (local memory or register spills).
    pub allow_spills: Option<bool>,
    /// `false`: no device of `fleet` may lose a kernel it loaded.
    pub allow_coverage_loss: Option<bool>,
    /// `false`: no target may stop being built.
    pub allow_removed: Option<bool>,
    /// `false`: no entry's parameter layout may change.
    pub allow_abi_break: Option<bool>,
    /// `false`: no kernel's requirements (`requires`, `inputs`) may gain or change a condition.
    pub allow_requirement_change: Option<bool>,
    /// The devices whose coverage is compared (`H100`, `B200`, as `dev coverage --fleet`).
    #[serde(default)]
    pub fleet: Vec<String>,
    /// Targets `release check` lets fail to compile, by name: a kernel (`gemm`, every
    /// target of it) or one target (`gemm/cu129/sm_90a`). Any other failed target fails the
    /// check's `bundle` gate.
    #[serde(default)]
    pub allow_failed: Vec<String>,
}

/// The `[library]` table.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Library {
    /// The Python package name (`af3-kernels`); also names the `<PACKAGE>_JIT_FALLBACK` switch.
    pub package: String,
    /// Architectures every kernel is built for unless it narrows them.
    pub archs: Vec<Arch>,
    /// CUDA builds every kernel is built with.
    pub cuda_builds: Vec<CudaBuild>,
    /// The library's version, as its wheel states it.
    #[serde(default = "default_version")]
    pub version: String,
    /// The torch version pin (`2.13.*`).
    pub torch: String,
    /// The Python package directory that the wheel ships with `_prebuilt/` inside it.
    pub python_package: Option<String>,
    /// Default C++ standard.
    #[serde(default = "default_cxx_std")]
    pub cxx_std: String,
    /// Default include directories.
    #[serde(default)]
    pub include_dirs: Vec<String>,
    /// Default extra compiler flags, for every compiler.
    #[serde(default)]
    pub flags: Vec<String>,
    /// Default extra flags for nvcc only (after `flags`); also for the `nvcc+ptxas` route.
    #[serde(default)]
    pub nvcc_flags: Vec<String>,
    /// Default extra flags for NVRTC only (after `flags`).
    #[serde(default)]
    pub nvrtc_flags: Vec<String>,
    /// Default preprocessor defines, under each kernel's constants and defines.
    #[serde(default)]
    pub defines: BTreeMap<String, String>,
    /// Compiles every source kernel as `torch.utils.cpp_extension` compiles an extension
    /// (torch's include dirs and defines; see [`crate::torch`]). Named apart from `torch`,
    /// which is the pin here; a kernel's `torch` overrides it.
    #[serde(default)]
    pub torch_extension: bool,
    /// Default preamble: C++ text compiled after each kernel's source, before its entries are
    /// named (a `using namespace`).
    pub preamble: Option<String>,
    /// What one target arch adds for every kernel (`[library.targets.sm_100a]`).
    #[serde(default)]
    pub targets: BTreeMap<Arch, TargetSpec>,
    /// Which compiler a CUDA build without its own nvcc (CUDA 12.9 from its wheels) uses.
    #[serde(default)]
    pub compiler: CompilerChoice,
    /// The store a release publishes artifacts to and slim wheels fetch them from
    /// (`https://cache.example.com`, bazel-remote HTTP protocol); see `docs/distribution.md`.
    pub store: Option<String>,
}

fn default_version() -> String {
    "0.0.0".to_owned()
}

fn default_cxx_std() -> String {
    "c++17".to_owned()
}

/// One `[kernels.<name>]` table.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct KernelSpec {
    /// The translation unit to compile (exactly one), unless `cubins` is given.
    #[serde(default)]
    pub sources: Vec<String>,
    /// Precompiled cubins to take instead of compiling.
    #[serde(default)]
    pub cubins: Vec<PrecompiledCubin>,
    /// Entry points: `extern "C"` names or name expressions (`scale<float>`).
    pub entries: Vec<String>,
    /// Exported constants, also passed as defines.
    #[serde(default)]
    pub constants: BTreeMap<String, Constant>,
    /// Extra preprocessor defines.
    #[serde(default)]
    pub defines: BTreeMap<String, String>,
    /// Extra compiler flags (after the library's).
    #[serde(default)]
    pub flags: Vec<String>,
    /// Extra flags for nvcc only (after the library's `nvcc-flags`).
    #[serde(default)]
    pub nvcc_flags: Vec<String>,
    /// Extra flags for NVRTC only (after the library's `nvrtc-flags`).
    #[serde(default)]
    pub nvrtc_flags: Vec<String>,
    /// Overrides the library's `compiler` choice.
    pub compiler: Option<CompilerChoice>,
    /// Narrows the library's architectures: the others are declared skips.
    pub arch: Option<Vec<Arch>>,
    /// Narrows the library's CUDA builds: the others are declared skips.
    pub cuda_builds: Option<Vec<CudaBuild>>,
    /// Overrides the library's include directories.
    pub include_dirs: Option<Vec<String>>,
    /// Overrides the library's C++ standard.
    pub cxx_std: Option<String>,
    /// Keeps a target whose every entry is a stub that only reports and aborts there (see
    /// `docs/toolchains.md`); without it such a target is a skip, never a variant.
    #[serde(default)]
    pub allow_stub: bool,
    /// Compiles the kernel as a torch extension (`true`) or not (`false`); overrides the
    /// library's `torch-extension`.
    pub torch: Option<bool>,
    /// Overrides the library's `preamble`.
    pub preamble: Option<String>,
    /// What one target arch adds for this kernel (`[kernels.x.targets.sm_100a]`), after the
    /// library's for that arch.
    #[serde(default)]
    pub targets: BTreeMap<Arch, TargetSpec>,
    /// The names of the values a caller passes (`dim`, `mxfp8`), that `requires` reads.
    #[serde(default)]
    pub inputs: Vec<String>,
    /// Conditions the kernel requires of its inputs, over them and its constants.
    #[serde(default)]
    pub requires: Vec<RequirementSpec>,
}

/// One `requires` entry: `{ when = "dim % BLOCK_M == 0", reason = "..." }`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequirementSpec {
    /// The condition, with where it is in the manifest (for errors).
    pub when: toml::Spanned<String>,
    /// Why, in words.
    pub reason: Option<String>,
}

/// A `targets.<arch>` table: defines and flags for that target arch only; each is optional.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct TargetSpec {
    /// Defines for this arch, over the level's own.
    pub defines: BTreeMap<String, String>,
    /// Flags for every compiler, for this arch.
    pub flags: Vec<String>,
    /// Flags for nvcc only, for this arch.
    pub nvcc_flags: Vec<String>,
    /// Flags for NVRTC only, for this arch.
    pub nvrtc_flags: Vec<String>,
}

/// A level's three flag lists (`flags`, `nvcc-flags`, `nvrtc-flags`) by manifest key.
fn flag_lists<'a>(
    flags: &'a [String],
    nvcc_flags: &'a [String],
    nvrtc_flags: &'a [String],
) -> [(&'static str, &'a [String]); 3] {
    [
        ("flags", flags),
        ("nvcc-flags", nvcc_flags),
        ("nvrtc-flags", nvrtc_flags),
    ]
}

/// The first of a level's flag lists that passes an include path, as [`include_path_flag`]
/// words it, each list named by `key` of its manifest key.
fn include_path_in(
    lists: [(&'static str, &[String]); 3],
    key: impl Fn(&str) -> String,
) -> Option<String> {
    lists
        .into_iter()
        .find_map(|(field, flags)| include_path_flag(&key(field), flags))
}

/// Which compiler a CUDA build that has NVRTC and `ptxas` but no nvcc of its own uses (the
/// CUDA 12.9 wheels). Builds with nvcc always use it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompilerChoice {
    /// NVRTC when the kernel's include graph stays inside its include dirs and the toolkit;
    /// nvcc (the newer toolkit's front end, this build's `ptxas`) when it reaches a system
    /// header such as `<cstdio>`, a sign of host code NVRTC cannot compile.
    #[default]
    Auto,
    /// Always NVRTC.
    Nvrtc,
    /// Always nvcc: the newer toolkit's nvcc emits PTX, this build's `ptxas` assembles it.
    Nvcc,
}

/// A precompiled cubin listed in a manifest.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PrecompiledCubin {
    /// The architecture it was built for.
    pub arch: Arch,
    /// The CUDA build it was built with.
    pub cuda: CudaBuild,
    /// Its path, relative to the manifest's directory.
    pub path: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestFile {
    library: Library,
    #[serde(default)]
    kernels: BTreeMap<String, KernelSpec>,
    #[serde(default)]
    extensions: BTreeMap<String, ExtensionSpec>,
    #[serde(default)]
    release: ReleasePolicy,
    #[serde(default)]
    wheel: WheelSettings,
}

impl Manifest {
    /// Reads and checks the manifest at `path`.
    pub fn load(path: &Path) -> Result<Manifest, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses and checks manifest text that was read from `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Manifest, Error> {
        let file: ManifestFile = toml::from_str(text).map_err(|source| {
            let (line, column) = source
                .span()
                .map(|span| line_column(text, span.start))
                .unwrap_or((1, 1));
            Error::ManifestSyntax {
                path: path.to_owned(),
                line,
                column,
                message: source.message().to_owned(),
            }
        })?;
        let root = path
            .parent()
            .map(Path::to_owned)
            .unwrap_or_else(|| PathBuf::from("."));
        let root = if root.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            root
        };
        let manifest = Manifest {
            path: path.to_owned(),
            root,
            library: file.library,
            kernels: file.kernels,
            extensions: file.extensions,
            release: file.release,
            wheel: file.wheel,
        };
        manifest.check(text)?;
        Ok(manifest)
    }

    fn check(&self, text: &str) -> Result<(), Error> {
        for (name, extension) in &self.extensions {
            let library = &self.library;
            if let Some(message) = check_extension(
                name,
                extension,
                &library.archs,
                &library.cuda_builds,
                &self.kernels,
            ) {
                let needle = format!("[extensions.{name}]");
                let line = text
                    .lines()
                    .position(|l| l.trim_start().starts_with(&needle))
                    .map_or(1, |n| n + 1);
                return Err(Error::ExtensionInvalid {
                    path: self.path.clone(),
                    line,
                    extension: name.clone(),
                    message,
                });
            }
        }
        let invalid = |kernel: Option<&str>, message: String| {
            let needle = kernel.map_or("[library]".to_owned(), |k| format!("[kernels.{k}]"));
            let line = text
                .lines()
                .position(|l| l.trim_start().starts_with(&needle))
                .map_or(1, |n| n + 1);
            Error::ManifestInvalid {
                path: self.path.clone(),
                line,
                kernel: kernel.map(str::to_owned),
                message,
            }
        };
        let library = &self.library;
        if !is_package_name(&library.package) {
            return Err(invalid(
                None,
                format!(
                    "package `{}` is not a valid Python package name",
                    library.package
                ),
            ));
        }
        if let Err(error) = prebuilt::select::TorchPin::parse(&library.torch) {
            return Err(invalid(None, format!("`torch`: {error}")));
        }
        let library_flags = flag_lists(&library.flags, &library.nvcc_flags, &library.nvrtc_flags);
        if let Some(message) = include_path_in(library_flags, str::to_owned) {
            return Err(invalid(None, message));
        }
        if library.archs.is_empty() || library.cuda_builds.is_empty() {
            return Err(invalid(
                None,
                "`archs` and `cuda-builds` must not be empty".into(),
            ));
        }
        if let Some(message) = check_defines("defines", &library.defines)
            .or_else(|| check_preamble(library.preamble.as_deref()))
            .or_else(|| check_targets(&library.targets, &library.archs, "the library's `archs`"))
        {
            return Err(invalid(None, message));
        }
        if library.torch_extension && library.compiler == CompilerChoice::Nvrtc {
            return Err(invalid(None, TORCH_NEEDS_NVCC.into()));
        }
        for allowed in &self.release.allow_failed {
            let kernel = allowed.split('/').next().unwrap_or_default();
            let parts = allowed.split('/').count();
            if !self.kernels.contains_key(kernel) || (parts != 1 && parts != 3) {
                let line = text
                    .lines()
                    .position(|l| l.contains("allow-failed"))
                    .map_or(1, |n| n + 1);
                return Err(Error::ManifestInvalid {
                    path: self.path.clone(),
                    line,
                    kernel: None,
                    message: format!(
                        "`[release] allow-failed` names `{allowed}`, which is neither a kernel of \
                         the manifest nor one of its targets (`kernel/cu129/sm_90a`)"
                    ),
                });
            }
        }
        for (name, kernel) in &self.kernels {
            if !is_identifier(name) {
                return Err(invalid(
                    Some(name),
                    format!("kernel name `{name}` must be a C identifier"),
                ));
            }
            let kernel_flags = flag_lists(&kernel.flags, &kernel.nvcc_flags, &kernel.nvrtc_flags);
            if let Some(message) = include_path_in(kernel_flags, str::to_owned) {
                return Err(invalid(Some(name), message));
            }
            let archs = kernel.arch.as_deref().unwrap_or(&library.archs);
            let narrowed = if kernel.arch.is_some() {
                "the kernel's `arch`"
            } else {
                "the library's `archs`"
            };
            if let Some(message) = check_preamble(kernel.preamble.as_deref())
                .or_else(|| check_targets(&kernel.targets, archs, narrowed))
            {
                return Err(invalid(Some(name), message));
            }
            // A constant is exported as one value: no arch of the kernel may give it another
            // (the library's arch tables yield to the kernel's own constants and defines).
            let per_arch = kernel
                .targets
                .iter()
                .flat_map(|(arch, target)| target.defines.keys().map(move |d| (arch, d)));
            // Nor may a flag: `-DBLOCK_M=64` would compile one value and export another.
            let levels = [
                (
                    "",
                    &library.flags,
                    &library.nvcc_flags,
                    &library.nvrtc_flags,
                ),
                ("", &kernel.flags, &kernel.nvcc_flags, &kernel.nvrtc_flags),
            ]
            .into_iter()
            .map(|(at, f, nvcc, nvrtc)| (at.to_owned(), flag_lists(f, nvcc, nvrtc)));
            let targets = [&library.targets, &kernel.targets]
                .into_iter()
                .flat_map(|targets| targets.iter())
                .filter(|(arch, _)| archs.contains(arch))
                .map(|(arch, t)| {
                    let lists = flag_lists(&t.flags, &t.nvcc_flags, &t.nvrtc_flags);
                    (format!("targets.{arch}."), lists)
                });
            for (at, lists) in levels.chain(targets) {
                let key = |field: &str| format!("{at}{field}");
                if let Some(message) = constant_flag_in(lists, key, &kernel.constants) {
                    return Err(invalid(Some(name), message));
                }
            }
            for (arch, define) in per_arch {
                if kernel.constants.contains_key(define) {
                    return Err(invalid(
                        Some(name),
                        format!(
                            "`targets.{arch}` defines `{define}`, which is a constant of the \
                             kernel: a constant is exported with one value for every target"
                        ),
                    ));
                }
            }
            if !kernel.cubins.is_empty() {
                let compile_only = [
                    ("torch", kernel.torch == Some(true)),
                    ("preamble", kernel.preamble.is_some()),
                    ("targets", !kernel.targets.is_empty()),
                ];
                if let Some((key, _)) = compile_only.iter().find(|(_, set)| *set) {
                    return Err(invalid(
                        Some(name),
                        format!("`{key}` applies to compiled sources, not to `cubins`"),
                    ));
                }
            }
            if self.torch_of(kernel) && self.compiler_of(kernel) == CompilerChoice::Nvrtc {
                return Err(invalid(Some(name), TORCH_NEEDS_NVCC.into()));
            }
            if let Some(builds) = &kernel.cuda_builds {
                if let Some(build) = builds
                    .iter()
                    .find(|build| !library.cuda_builds.contains(build))
                {
                    return Err(invalid(
                        Some(name),
                        format!(
                            "`cuda-builds` names {build}, which is not one of the library's \
                             `cuda-builds`"
                        ),
                    ));
                }
                if builds.is_empty() {
                    return Err(invalid(
                        Some(name),
                        "`cuda-builds` must not be empty".into(),
                    ));
                }
            }
            if kernel.entries.is_empty() {
                return Err(invalid(
                    Some(name),
                    "`entries` must list at least one entry point".into(),
                ));
            }
            match (kernel.sources.len(), kernel.cubins.is_empty()) {
                (1, true) => {
                    let source = &kernel.sources[0];
                    // The bundle ships its sources under their manifest-relative paths, and
                    // the key and the JIT find them there: a source outside the library root
                    // would build a bundle that no reader opens.
                    let inside = std::path::Path::new(source).components().all(|component| {
                        matches!(
                            component,
                            std::path::Component::Normal(_) | std::path::Component::CurDir
                        )
                    });
                    if !inside {
                        return Err(invalid(
                            Some(name),
                            format!(
                                "source `{source}` is not inside the library's folder (absolute,                                  or through `..`): put a one-line `.cu` beside the manifest that                                  `#include`s it from an include dir"
                            ),
                        ));
                    }
                    if !TRANSLATION_UNITS.iter().any(|ext| source.ends_with(ext)) {
                        return Err(invalid(
                            Some(name),
                            format!(
                                "source `{source}` is not a translation unit nvcc and NVRTC \
                                 compile as CUDA ({})",
                                TRANSLATION_UNITS.join(", ")
                            ),
                        ));
                    }
                }
                (0, false) => {}
                (0, true) => {
                    return Err(invalid(
                        Some(name),
                        "give either `sources` or `cubins`".into(),
                    ))
                }
                (_, true) => {
                    return Err(invalid(
                        Some(name),
                        "`sources` takes exactly one translation unit; include the others from it"
                            .into(),
                    ))
                }
                (_, false) => {
                    return Err(invalid(
                        Some(name),
                        "give either `sources` or `cubins`, not both".into(),
                    ))
                }
            }
            for constant in kernel.constants.keys().chain(kernel.defines.keys()) {
                if !is_identifier(constant) {
                    return Err(invalid(
                        Some(name),
                        format!("constant or define `{constant}` must be a C identifier"),
                    ));
                }
            }
            if let Some(duplicate) = kernel
                .constants
                .keys()
                .find(|c| kernel.defines.contains_key(*c))
            {
                return Err(invalid(
                    Some(name),
                    format!("`{duplicate}` is both a constant and a define"),
                ));
            }
            let requirements = Self::requirements_of(kernel);
            if let Err(refused) = prebuilt::requires::check(&requirements, &kernel.constants) {
                let mut error = invalid(Some(name), refused.to_string());
                if let Error::ManifestInvalid { line, .. } = &mut error {
                    *line = match refused.number.checked_sub(1) {
                        Some(rule) => line_column(text, kernel.requires[rule].when.span().start).0,
                        None => key_line(text, *line, "inputs"),
                    };
                }
                return Err(error);
            }
        }
        Ok(())
    }

    /// What a kernel requires of its inputs, as the index records it.
    pub fn requirements_of(kernel: &KernelSpec) -> Requirements {
        Requirements {
            inputs: kernel.inputs.clone(),
            rules: kernel
                .requires
                .iter()
                .map(|rule| Requirement {
                    when: rule.when.get_ref().clone(),
                    reason: rule.reason.clone(),
                })
                .collect(),
        }
    }

    /// Absolute include directories of a kernel, in `-I` order.
    pub fn include_dirs_of(&self, kernel: &KernelSpec) -> Vec<PathBuf> {
        kernel
            .include_dirs
            .as_ref()
            .unwrap_or(&self.library.include_dirs)
            .iter()
            .map(|dir| self.root.join(dir))
            .collect()
    }

    /// A kernel's preprocessor defines for every arch: the library's, then its constants, then
    /// its defines (torch's, for `torch = true`, are added under them when planning).
    pub fn defines_of(&self, kernel: &KernelSpec) -> BTreeMap<String, String> {
        let mut defines = self.library.defines.clone();
        defines.extend(
            kernel
                .constants
                .iter()
                .map(|(name, value)| (name.clone(), value.to_string())),
        );
        defines.extend(kernel.defines.clone());
        defines
    }

    /// What each arch the kernel builds for adds ([`TargetInputs`], merged over
    /// [`Manifest::defines_of`] and the flags when compiling for it): the library's
    /// `targets.<arch>` (less its defines the kernel sets itself), then the kernel's. Archs
    /// that add nothing are left out.
    pub fn targets_of(&self, kernel: &KernelSpec) -> BTreeMap<Arch, TargetInputs> {
        let archs = kernel.arch.as_deref().unwrap_or(&self.library.archs);
        let own = |name: &String| {
            kernel.constants.contains_key(name) || kernel.defines.contains_key(name)
        };
        let mut targets = BTreeMap::new();
        for arch in archs {
            let mut target = TargetInputs::default();
            for spec in [self.library.targets.get(arch), kernel.targets.get(arch)]
                .into_iter()
                .flatten()
            {
                target.flags.extend(spec.flags.iter().cloned());
                target.nvcc_flags.extend(spec.nvcc_flags.iter().cloned());
                target.nvrtc_flags.extend(spec.nvrtc_flags.iter().cloned());
            }
            if let Some(spec) = self.library.targets.get(arch) {
                let defines = spec.defines.iter().filter(|(name, _)| !own(name));
                target
                    .defines
                    .extend(defines.map(|(n, v)| (n.clone(), v.clone())));
            }
            if let Some(spec) = kernel.targets.get(arch) {
                target.defines.extend(spec.defines.clone());
            }
            if !target.is_empty() {
                targets.insert(*arch, target);
            }
        }
        targets
    }

    /// A kernel's preamble: its own, else the library's, else none (empty).
    pub fn preamble_of(&self, kernel: &KernelSpec) -> String {
        kernel
            .preamble
            .clone()
            .or_else(|| self.library.preamble.clone())
            .unwrap_or_default()
    }

    /// Whether a kernel compiles as a torch extension: its `torch`, else the library's
    /// `torch-extension`; never for precompiled cubins.
    pub fn torch_of(&self, kernel: &KernelSpec) -> bool {
        kernel.cubins.is_empty() && kernel.torch.unwrap_or(self.library.torch_extension)
    }

    /// A kernel's compiler flags: the library's, then its own.
    pub fn flags_of(&self, kernel: &KernelSpec) -> Vec<String> {
        [&self.library.flags[..], &kernel.flags].concat()
    }

    /// A kernel's nvcc-only flags: the library's, then its own.
    pub fn nvcc_flags_of(&self, kernel: &KernelSpec) -> Vec<String> {
        [&self.library.nvcc_flags[..], &kernel.nvcc_flags].concat()
    }

    /// A kernel's NVRTC-only flags: the library's, then its own.
    pub fn nvrtc_flags_of(&self, kernel: &KernelSpec) -> Vec<String> {
        [&self.library.nvrtc_flags[..], &kernel.nvrtc_flags].concat()
    }

    /// A kernel's compiler choice for builds without their own nvcc.
    pub fn compiler_of(&self, kernel: &KernelSpec) -> CompilerChoice {
        kernel.compiler.unwrap_or(self.library.compiler)
    }

    /// The CUDA builds a kernel is built with: the library's, narrowed by its `cuda-builds`.
    pub fn cuda_builds_of<'a>(&'a self, kernel: &'a KernelSpec) -> &'a [CudaBuild] {
        kernel
            .cuda_builds
            .as_deref()
            .unwrap_or(&self.library.cuda_builds)
    }

    /// A kernel's C++ standard.
    pub fn cxx_std_of(&self, kernel: &KernelSpec) -> String {
        kernel
            .cxx_std
            .clone()
            .unwrap_or_else(|| self.library.cxx_std.clone())
    }

    /// The package name as an environment-variable prefix: `af3-kernels` → `AF3_KERNELS`.
    pub fn env_prefix(&self) -> String {
        prebuilt::env::package_prefix(&self.library.package)
    }
}

/// What a torch-extension kernel with `compiler = "nvrtc"` is told.
const TORCH_NEEDS_NVCC: &str = "`torch = true` needs nvcc: torch's headers include host code \
                                and C++ library headers that NVRTC cannot compile; use \
                                `compiler = \"auto\"` (which picks nvcc) or `\"nvcc\"`";

/// The endings of a translation unit: nvcc is told `-x cu` for all but `.cu`.
const TRANSLATION_UNITS: &[&str] = &[".cu", ".cuh", ".h", ".hpp"];

/// The message for the first define of `defines` (the manifest key `key`) that is not a C
/// identifier, if any.
fn check_defines(key: &str, defines: &BTreeMap<String, String>) -> Option<String> {
    defines
        .keys()
        .find(|name| !is_identifier(name))
        .map(|name| format!("`{key}` names `{name}`, which must be a C identifier"))
}

/// A preamble goes into a source file: no NUL.
fn check_preamble(preamble: Option<&str>) -> Option<String> {
    preamble
        .filter(|text| text.contains('\0'))
        .map(|_| "`preamble` holds a NUL character".to_owned())
}

/// The message for the first fault of a `targets` table: an arch that is not built
/// (`archs`, named by `which`), a define that is not an identifier, an include-path flag.
fn check_targets(
    targets: &BTreeMap<Arch, TargetSpec>,
    archs: &[Arch],
    which: &str,
) -> Option<String> {
    targets.iter().find_map(|(arch, target)| {
        if !archs.contains(arch) {
            let list: Vec<String> = archs.iter().map(ToString::to_string).collect();
            return Some(format!(
                "`targets.{arch}` names {arch}, which is not one of {which} ({})",
                list.join(", ")
            ));
        }
        let key = |field: &str| format!("targets.{arch}.{field}");
        check_defines(&key("defines"), &target.defines).or_else(|| {
            let lists = flag_lists(&target.flags, &target.nvcc_flags, &target.nvrtc_flags);
            include_path_in(lists, key)
        })
    })
}

/// The message for the first flag among `lists` that defines or undefines one of a kernel's
/// `constants` (`-DBLOCK_M=64`, `-D BLOCK_M`, `--define-macro=BLOCK_M`, `-UBLOCK_M`), if any.
fn constant_flag_in(
    lists: [(&'static str, &[String]); 3],
    key: impl Fn(&str) -> String,
    constants: &BTreeMap<String, prebuilt::index::Constant>,
) -> Option<String> {
    lists.into_iter().find_map(|(field, flags)| {
        let mut pieces = flags.iter().flat_map(|flag| flag.split_whitespace());
        while let Some(piece) = pieces.next() {
            let glued = ["--define-macro=", "--undefine-macro=", "-D", "-U"]
                .iter()
                .find_map(|option| piece.strip_prefix(option));
            let (shown, value) = match glued {
                _ if ["-D", "-U", "--define-macro", "--undefine-macro"].contains(&piece) => {
                    match pieces.next() {
                        Some(value) => (format!("{piece} {value}"), value),
                        None => continue,
                    }
                }
                Some(value) => (piece.to_owned(), value),
                None => continue,
            };
            let name = value.split('=').next().unwrap_or_default();
            if constants.contains_key(name) {
                return Some(format!(
                    "`{}` holds `{shown}`, which sets `{name}`, a constant of the kernel: a \
                     constant is compiled and exported with the one value `constants` gives it",
                    key(field)
                ));
            }
        }
        None
    })
}

/// The line of `key = …` in the table whose header is on line `header` (1-based), or
/// `header` when the table does not spell it there.
fn key_line(text: &str, header: usize, key: &str) -> usize {
    text.lines()
        .enumerate()
        .skip(header)
        .take_while(|(_, line)| !line.trim_start().starts_with('['))
        .find(|(_, line)| {
            line.trim_start()
                .strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map_or(header, |(n, _)| n + 1)
}

fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |n| n + 1) + 1;
    (line, column)
}

/// Compiler options that add a header search path or a forced include. A header found
/// through one would be read by the compiler but not by the include scanner, so it would
/// escape the key: the manifest's `include-dirs` is the one way to name them.
const INCLUDE_PATH_FLAGS: &[&str] = &[
    "-I",
    "--include-path",
    "-isystem",
    "--system-include",
    "-idirafter",
    "-iquote",
    "-include",
    "--pre-include",
    "-imacros",
    "--options-file",
    "-optf",
];

/// The message for the first include-path option in `flags` (the manifest key `key`), if any.
pub(crate) fn include_path_flag(key: &str, flags: &[String]) -> Option<String> {
    let is_include_path = |piece: &str| {
        INCLUDE_PATH_FLAGS.iter().find(|option| {
            piece == **option
                || piece.starts_with(&format!("{option}="))
                // The short forms glue the value on: `-Iinclude`, `-isystem/usr/x`.
                || (!option.starts_with("--") && piece.starts_with(**option))
        })
    };
    flags.iter().find_map(|flag| {
        // Options handed on to the host compiler or ptxas: `-Xcompiler=-I/x,-O2`.
        let passed_on = if flag.starts_with("-X") || flag.starts_with("--compiler-options") {
            flag.split_once('=').map_or("", |(_, value)| value)
        } else {
            ""
        };
        let option =
            is_include_path(flag).or_else(|| passed_on.split(',').find_map(is_include_path))?;
        Some(format!(
            "`{key}` holds `{flag}`: headers found through `{option}` would be compiled but not \
             hashed into the key; list the directory in `include-dirs` instead (a forced \
             include is an `#include` at the top of the source)"
        ))
    })
}

pub(crate) fn is_identifier(text: &str) -> bool {
    let mut chars = text.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

fn is_package_name(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && text.starts_with(|c: char| c.is_ascii_alphanumeric())
}
