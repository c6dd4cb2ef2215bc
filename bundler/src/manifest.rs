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

use prebuilt::untrusted::Unreadable;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use prebuilt::index::{ComputedInputs, Constant, Requirement, Requirements, TargetInputs};
use prebuilt::{Arch, CudaBuild};
use serde::Deserialize;

mod check;
use check::line_column;
pub(crate) use check::{include_path_flag, is_identifier};
mod extension;
use crate::error::Error;
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
    /// The kernel's template parameter list (`typename Ktraits`) that each entry's template
    /// arguments bind to in `computed` expressions.
    pub template: Option<String>,
    /// Constants the compiler computes while building each variant, by name: C++ constant
    /// expressions (`sizeof(typename Ktraits::SmemStorage)`), per entry when `template` is set.
    #[serde(default)]
    pub computed: BTreeMap<String, String>,
    /// C structs whose layout the compiler reports per arch, with the fields checked at launch
    /// (`{ ConvParamsBase = ["batch", "dim"] }`).
    #[serde(default)]
    pub structs: BTreeMap<String, Vec<String>>,
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
        let text = std::fs::read_to_string(path).map_err(|source| {
            Error::Read(Unreadable {
                path: path.to_owned(),
                source,
            })
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

    /// What a kernel asks the compiler to compute: its `template`, `computed` and `structs`.
    pub fn computed_of(kernel: &KernelSpec) -> ComputedInputs {
        ComputedInputs {
            template: kernel.template.clone().unwrap_or_default(),
            constants: kernel.computed.clone(),
            structs: kernel.structs.clone(),
        }
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
