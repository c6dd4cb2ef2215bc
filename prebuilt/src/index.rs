//! The bundle index: what every kernel is, which variants were built, and what they hold.
//!
//! The index is the contract between the bundler and the loader. It is JSON, written with
//! sorted keys (`BTreeMap`) so that identical inputs give identical bytes. See
//! `docs/bundle-format.md` for the field reference.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{Arch, CudaBuild};

mod skip;
pub(crate) use skip::kind_legacy_skips;
pub use skip::{Skip, SkipKind, SkipReason};

/// Version of the index layout. Bump it when a field changes meaning or a required field is
/// added; readers refuse an index whose format they do not know.
pub const INDEX_FORMAT: u32 = 1;

/// The format of an index that records a [`Index::store`] (a slim wheel's). Format 1 indexes
/// stay byte for byte what they were; a reader that predates the store refuses a format 2
/// index by its format, saying which version reads it, instead of failing on a field it does
/// not know.
pub const STORE_INDEX_FORMAT: u32 = 2;
/// The index format of a bundle whose artifacts are compressed against family dictionaries
/// ([`StoredFile::dictionary`]): a reader of format 2 could not decompress them, so it must
/// refuse the index. A store may be recorded too.
pub const FAMILY_INDEX_FORMAT: u32 = 3;
/// The index format of a bundle where an artifact's prefix is another shipped cubin (its
/// artifact, a plain frame), not a dictionary file: a reader of format 3 would look for a
/// dictionary that is not there, so it must refuse the index.
pub const REFERENCE_INDEX_FORMAT: u32 = 4;
/// The index format of a bundle where a kernel declares [`Requirements`]: a reader of format 4
/// would refuse the field it does not know (and could not check what callers pass), so it is
/// told by the format instead. Whatever else the index records may be there too.
pub const REQUIRES_INDEX_FORMAT: u32 = 5;
/// The index format of a bundle with a skipped target: each [`Skip`] names its [`SkipKind`]
/// (`kind`), which a reader of format 5 would refuse as a field it does not know, so it is
/// told by the format instead. A skip of an older index has no `kind`: its reason's first
/// words give it ([`SkipKind::of_legacy_reason`]), as the writers of those formats put them.
/// Whatever else the index records may be there too; an index without skips keeps its
/// format and its bytes.
pub const SKIP_KIND_INDEX_FORMAT: u32 = 6;

/// The whole index of a bundle (`index.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Index {
    /// [`INDEX_FORMAT`] of the writer.
    pub format: u32,
    /// The kernel library's Python package name, as in its manifest (`af3-kernels`).
    pub package: String,
    /// The torch version pin the variants were built against (`2.13.*`).
    pub torch: String,
    /// The store that holds every artifact, for a bundle that leaves some out (a slim wheel's):
    /// the base URL of a server speaking the bazel-remote HTTP protocol, where a cubin is
    /// `<store>/cas/<its sha256>`. Absent (and not written) otherwise. See
    /// `docs/distribution.md`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// The zstd dictionary every artifact was compressed with, if one was trained.
    pub dictionary: Option<StoredFile>,
    /// Every kernel of the manifest, by name.
    pub kernels: BTreeMap<String, KernelRecord>,
    /// Every extension module of the manifest, by name ([`crate::module`]); absent (and not
    /// written) when there is none, so an index without modules keeps its bytes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub modules: BTreeMap<String, ModuleRecord>,
}

/// One kernel: its key inputs that do not depend on the target, its constants, its variants.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelRecord {
    /// The target-independent inputs of the kernel's key.
    pub inputs: KernelInputs,
    /// How to compile the kernel from the shipped sources; absent for precompiled cubins.
    pub recipe: Option<SourceRecipe>,
    /// The manifest's exported constants, so callers never hard-code a block size.
    pub constants: BTreeMap<String, Constant>,
    /// Built variants, sorted by (CUDA build, arch).
    pub variants: Vec<Variant>,
    /// Targets of the matrix that were not built, and why.
    pub skipped: Vec<Skip>,
}

/// The inputs of a kernel's key that are the same for every target.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelInputs {
    /// Entry points as declared: `extern "C"` names or name expressions (`scale<float>`).
    pub entries: Vec<String>,
    /// Every file of the include graph, by stable path, with the sha256 of its content.
    /// For a precompiled cubin, the cubin files themselves.
    pub files: BTreeMap<String, String>,
    /// Preprocessor defines, constants included (`-DNAME=value`).
    pub defines: BTreeMap<String, String>,
    /// Extra compiler flags, in order.
    pub flags: Vec<String>,
    /// Flags for nvcc only (and the `nvcc+ptxas` route), after `flags`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvcc_flags: Vec<String>,
    /// Flags for NVRTC only, after `flags`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvrtc_flags: Vec<String>,
    /// The C++ standard (`c++17`).
    pub cxx_std: String,
    /// C++ text compiled after the source and before the entries are named (the manifest's
    /// `preamble`: a `using namespace` that the entries' name expressions rely on, say).
    /// Absent when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub preamble: String,
    /// What one target architecture adds (the manifest's `targets.<arch>` tables), by arch;
    /// [`KernelInputs::for_arch`] merges it. Absent when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub targets: BTreeMap<Arch, TargetInputs>,
    /// What the kernel requires of the values it is called with (the manifest's `inputs` and
    /// `requires`), checked by [`crate::requires`]. Absent when empty.
    #[serde(default, skip_serializing_if = "Requirements::is_empty")]
    pub requires: Requirements,
    /// The constants the compiler computes and the struct layouts it reports (the manifest's
    /// `template`, `computed` and `structs`). Absent when empty.
    #[serde(default, skip_serializing_if = "ComputedInputs::is_empty")]
    pub computed: ComputedInputs,
}

/// What a kernel asks the compiler to compute while building each variant
/// ([`crate::compile::computed`]): constant expressions, per entry when they name the
/// kernel's template parameters, and the layouts of C structs, per arch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComputedInputs {
    /// The kernel's template parameter list (`typename Ktraits`) that each entry's template
    /// arguments bind to; empty: every expression is evaluated as written, once.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub template: String,
    /// Each constant's C++ expression, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub constants: BTreeMap<String, String>,
    /// Each C struct whose layout is checked at launch, with the fields checked, in order.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub structs: BTreeMap<String, Vec<String>>,
}

impl ComputedInputs {
    /// Whether nothing is computed.
    pub fn is_empty(&self) -> bool {
        self.template.is_empty() && self.constants.is_empty() && self.structs.is_empty()
    }
}

/// What a kernel requires of the values it is called with: the names of those values and the
/// conditions over them and the kernel's constants, in the language of [`crate::requires`]
/// (`dim % BLOCK_M == 0`). See `docs/manifest.md`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requirements {
    /// The names of the values a caller passes (`dim`, `hidden_dim`, `mxfp8`), in order.
    pub inputs: Vec<String>,
    /// The conditions, in the order they are checked: the first one that fails is reported.
    pub rules: Vec<Requirement>,
}

impl Requirements {
    /// Whether the kernel declares neither inputs nor conditions.
    pub fn is_empty(&self) -> bool {
        self.inputs.is_empty() && self.rules.is_empty()
    }
}

/// One condition a kernel requires.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requirement {
    /// The condition, an expression that must be true (`dim % BLOCK_M == 0`).
    pub when: String,
    /// Why, in words, for the message of a refusal (`dim must be a multiple of BLOCK_M`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What a kernel's inputs add for one target architecture: defines over the kernel's, flags
/// after the kernel's of the same kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetInputs {
    /// Defines that add to (or replace the value of) the kernel's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub defines: BTreeMap<String, String>,
    /// Flags for every compiler, after the kernel's `flags`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<String>,
    /// Flags for nvcc only, after the kernel's `nvcc_flags`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvcc_flags: Vec<String>,
    /// Flags for NVRTC only, after the kernel's `nvrtc_flags`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvrtc_flags: Vec<String>,
}

impl TargetInputs {
    /// Whether it adds nothing.
    pub fn is_empty(&self) -> bool {
        self.defines.is_empty()
            && self.flags.is_empty()
            && self.nvcc_flags.is_empty()
            && self.nvrtc_flags.is_empty()
    }
}

impl KernelInputs {
    /// The inputs that `arch` compiles with: the kernel's, with that arch's [`TargetInputs`]
    /// merged in (its defines over the kernel's, its flags after the kernel's) and no
    /// `targets` left. The key, the bundler's compile and the JIT's all go through this one
    /// merge, so they agree on what a target compiled with.
    pub fn for_arch(&self, arch: Arch) -> KernelInputs {
        let mut inputs = self.clone();
        inputs.targets.clear();
        if let Some(target) = self.targets.get(&arch) {
            inputs.defines.extend(target.defines.clone());
            inputs.flags.extend(target.flags.iter().cloned());
            inputs.nvcc_flags.extend(target.nvcc_flags.iter().cloned());
            inputs
                .nvrtc_flags
                .extend(target.nvrtc_flags.iter().cloned());
        }
        inputs
    }

    /// Whether any target compiles with nvcc-only flags (the kernel's or an arch's): such a
    /// kernel is meant for nvcc, which NVRTC would not honour.
    pub fn has_nvcc_flags(&self) -> bool {
        !self.nvcc_flags.is_empty() || self.targets.values().any(|t| !t.nvcc_flags.is_empty())
    }

    /// The flags `compiler` (nvcc, the `nvcc+ptxas` route, NVRTC) gets: `flags`, then its own.
    pub fn flags_for(&self, compiler: &CompilerRecord) -> Vec<String> {
        let own = match compiler.compiler_kind() {
            Some(CompilerKind::Nvrtc) => &self.nvrtc_flags,
            Some(CompilerKind::Nvcc | CompilerKind::NvccPtxas) => &self.nvcc_flags,
            Some(CompilerKind::Precompiled) | None => return self.flags.clone(),
        };
        self.flags.iter().chain(own).cloned().collect()
    }
}

/// What the JIT fallback needs beyond [`KernelInputs`] to compile shipped sources.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceRecipe {
    /// The translation unit, by stable path (a key of [`KernelInputs::files`]).
    pub source: String,
    /// Include directories in `-I` order, as stable paths relative to the bundle's `sources/`.
    pub include_dirs: Vec<String>,
}

/// A constant exported by the manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Constant {
    /// An integer, such as a block size.
    Integer(i64),
    /// A floating-point number.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A string.
    String(String),
}

impl std::fmt::Display for Constant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Constant::Integer(value) => write!(f, "{value}"),
            Constant::Float(value) => write!(f, "{value:?}"),
            Constant::Bool(value) => write!(f, "{}", u8::from(*value)),
            Constant::String(value) => write!(f, "{value}"),
        }
    }
}

/// What produced a variant's cubin.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompilerRecord {
    /// `nvcc`, `nvrtc`, `nvcc+ptxas`, or `cubin` for a precompiled cubin taken as it is; a
    /// module's host compiler by its own name. Kept as the text written, which keys hash
    /// ([`crate::key`], [`crate::module`]); decisions read [`CompilerRecord::compiler_kind`].
    pub kind: String,
    /// The compiler's exact version (`13.0.88`); empty for a precompiled cubin.
    pub version: String,
}

/// Which compiler built a cubin; its text (`nvcc`, `nvrtc`, `nvcc+ptxas`, `cubin`) is the
/// index's `compiler.kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompilerKind {
    /// The `nvcc` driver, run as a process.
    Nvcc,
    /// NVRTC, the runtime compiler library, loaded into this process.
    Nvrtc,
    /// A newer toolkit's nvcc emitting PTX, assembled by this build's own `ptxas`: how a build
    /// whose packages carry `ptxas` but no nvcc (CUDA 12.9) compiles code with host parts. The
    /// bundler's route only; the JIT runs NVRTC or nvcc.
    #[serde(rename = "nvcc+ptxas")]
    NvccPtxas,
    /// No compiler: a precompiled cubin the manifest lists, taken as it is.
    #[serde(rename = "cubin")]
    Precompiled,
}

impl CompilerKind {
    /// The index's spelling: `nvcc`, `nvrtc`, `nvcc+ptxas`, `cubin`.
    pub fn as_str(self) -> &'static str {
        match self {
            CompilerKind::Nvcc => "nvcc",
            CompilerKind::Nvrtc => "nvrtc",
            CompilerKind::NvccPtxas => "nvcc+ptxas",
            CompilerKind::Precompiled => "cubin",
        }
    }

    /// The kind an index spells `text`, if it is one.
    pub fn parse(text: &str) -> Option<CompilerKind> {
        [
            CompilerKind::Nvcc,
            CompilerKind::Nvrtc,
            CompilerKind::NvccPtxas,
            CompilerKind::Precompiled,
        ]
        .into_iter()
        .find(|kind| kind.as_str() == text)
    }

    /// The index's record of this compiler at `version`.
    pub fn record(self, version: &str) -> CompilerRecord {
        CompilerRecord {
            kind: self.as_str().to_owned(),
            version: version.to_owned(),
        }
    }
}

impl fmt::Display for CompilerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl CompilerRecord {
    /// The compiler [`CompilerRecord::kind`] names; `None` for a kind that is not one of
    /// kwheel's CUDA compilers (a module's host compiler).
    pub fn compiler_kind(&self) -> Option<CompilerKind> {
        CompilerKind::parse(&self.kind)
    }
}

impl std::fmt::Display for CompilerRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.version.is_empty() {
            f.write_str(&self.kind)
        } else {
            write!(f, "{} {}", self.kind, self.version)
        }
    }
}

/// One built cubin of a kernel: a (CUDA build, arch) cell of the matrix.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// The target, whose spelling records its kind: `sm_90a` (an arch-specific cubin),
    /// `sm_100f` (a family cubin), `sm_90` (a plain cubin), `compute_90` (PTX, which the
    /// artifact then holds instead of a cubin).
    pub arch: Arch,
    /// The CUDA build whose toolkit compiled it.
    pub cuda: CudaBuild,
    /// The torch pin of the build.
    pub torch: String,
    /// The compiler and its exact version.
    pub compiler: CompilerRecord,
    /// The variant's key (hex sha256), see [`crate::key`].
    pub key: String,
    /// The cubin, as stored in the bundle.
    pub artifact: StoredFile,
    /// The entry functions in the cubin, in the order of the kernel's entries.
    pub functions: Vec<Function>,
    /// The layout of each struct the kernel names (`structs`), as this variant's compile
    /// computed it. Absent when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub structs: BTreeMap<String, StructLayout>,
}

/// A C struct's layout as the compiler of one variant computed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StructLayout {
    /// `sizeof`.
    pub size: u64,
    /// `alignof`.
    pub align: u64,
    /// The fields the manifest names, in its order.
    pub fields: Vec<FieldLayout>,
}

/// One field of a [`StructLayout`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldLayout {
    /// The field's name.
    pub name: String,
    /// `offsetof`.
    pub offset: u64,
    /// `sizeof` the field.
    pub size: u64,
}

impl Variant {
    /// `cu129/sm_90a`, how messages name a variant.
    pub fn label(&self) -> String {
        format!("{}/{}", self.cuda, self.arch)
    }
}

/// A file stored content-addressed in the bundle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredFile {
    /// sha256 of the uncompressed bytes: what is verified before use.
    pub digest: String,
    /// Size of the uncompressed bytes.
    pub size: u64,
    /// Path of the stored (compressed) file, relative to the bundle root.
    pub path: String,
    /// Size of the stored file.
    pub stored_size: u64,
    /// For an artifact compressed against its family's dictionary: the sha256 of the
    /// dictionary's raw content, stored at [`crate::bundle::dictionary_path`]. Absent (and not
    /// written) for a plain frame or one compressed with the bundle's trained `dictionary`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dictionary: Option<String>,
}

/// An entry function of a cubin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Function {
    /// The entry as the manifest declares it (`scale<float>`).
    pub name: String,
    /// The symbol in the cubin (mangled for templates).
    pub symbol: String,
    /// Each parameter's size in bytes, in order, from the cubin's `.nv.info`.
    pub param_sizes: Vec<u32>,
    /// The value of each constant the compiler computed for this entry (`computed`). Absent
    /// when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub computed: BTreeMap<String, i64>,
}

impl Index {
    /// Records `store` (or none), and the format that goes with the index's contents.
    pub fn set_store(&mut self, store: Option<String>) {
        self.store = store;
        self.format = self.required_format();
    }

    /// The oldest format whose readers can read this index: [`SKIP_KIND_INDEX_FORMAT`] when a
    /// kernel has a skipped target, [`REQUIRES_INDEX_FORMAT`] when a kernel declares
    /// requirements, [`REFERENCE_INDEX_FORMAT`] when an
    /// artifact's prefix is another artifact, [`FAMILY_INDEX_FORMAT`] when it is a dictionary,
    /// [`STORE_INDEX_FORMAT`] with a store, else [`INDEX_FORMAT`], so an index without the newer features stays readable by older
    /// readers byte for byte.
    pub fn required_format(&self) -> u32 {
        let artifacts = || self.kernels.values().flat_map(|record| &record.variants);
        let digests: std::collections::BTreeSet<&str> =
            artifacts().map(|v| v.artifact.digest.as_str()).collect();
        let prefixes = || artifacts().filter_map(|v| v.artifact.dictionary.as_deref());
        if self
            .kernels
            .values()
            .any(|record| !record.skipped.is_empty())
        {
            SKIP_KIND_INDEX_FORMAT
        } else if self
            .kernels
            .values()
            .any(|record| !record.inputs.requires.is_empty())
        {
            REQUIRES_INDEX_FORMAT
        } else if prefixes().any(|prefix| digests.contains(prefix)) {
            REFERENCE_INDEX_FORMAT
        } else if prefixes().next().is_some() {
            FAMILY_INDEX_FORMAT
        } else if self.store.is_some() {
            STORE_INDEX_FORMAT
        } else {
            INDEX_FORMAT
        }
    }

    /// Serializes the index as the bundle stores it: pretty JSON with a final newline.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("index serializes");
        text.push('\n');
        text
    }
}

// Extension modules: how they are keyed, chosen and read is in `crate::module`.

/// Which torch ABI a module is built against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Abi {
    /// LibTorch's stable ABI (`torch/csrc/stable`, `STABLE_TORCH_LIBRARY`): one module serves
    /// every torch from its target version on.
    Stable,
    /// ATen and `TORCH_LIBRARY`: one module per torch minor.
    Torch,
}

impl fmt::Display for Abi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Abi::Stable => "stable",
            Abi::Torch => "torch",
        })
    }
}

/// One extension module: its key inputs, its variants, and the targets not built.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleRecord {
    /// The ABI it is built against.
    pub abi: Abi,
    /// The inputs of its key that are the same for every variant.
    pub inputs: ModuleInputs,
    /// Built variants, sorted by (CUDA build, CPU arch).
    pub variants: Vec<ModuleVariant>,
    /// Targets not built, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<ModuleSkip>,
}

/// The inputs of a module's key that do not depend on the CUDA build or CPU arch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleInputs {
    /// The translation units, as the manifest lists them (stable paths).
    pub sources: Vec<String>,
    /// Every file the units include, by stable path, with its sha256.
    pub files: BTreeMap<String, String>,
    /// Preprocessor defines (`-DNAME=value`).
    pub defines: BTreeMap<String, String>,
    /// Flags for nvcc.
    pub nvcc_flags: Vec<String>,
    /// Flags for the host compiler.
    pub cxx_flags: Vec<String>,
    /// The C++ standard (`c++17`).
    pub cxx_std: String,
    /// The device code's targets.
    pub archs: Vec<Arch>,
    /// The include directories, relative to the library (the bundle's `sources/` for the
    /// JIT), in `-I` order; torch's follow them. Not in the key: the include graph (`files`)
    /// records what they resolved to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include_dirs: Vec<String>,
}

/// One built module.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleVariant {
    /// The CUDA build it links against.
    pub cuda: CudaBuild,
    /// The CPU architecture (`x86_64`, `aarch64`).
    pub cpu: String,
    /// The torch versions it serves, as a PEP 440 specifier set: `>=2.11` for the stable
    /// ABI, `==2.11.*` for the classic one.
    pub torch: String,
    /// Every compiler that built it (nvcc, the host compiler), with its exact version.
    pub compilers: Vec<CompilerRecord>,
    /// Its key.
    pub key: String,
    /// The compressed shared library.
    pub artifact: StoredFile,
    /// What its fatbin holds for each target: the declared archs, and any other the fatbin
    /// carries (`docs/extensions.md`). Absent in indexes written before it was recorded.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub device_code: BTreeMap<Arch, ModuleDeviceCode>,
}

/// What a module's fatbin holds for one target, read from its cubins (or PTX) when the module
/// was built: the facts `release diff` compares between two builds of a module.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleDeviceCode {
    /// Its images in the fatbin: one per translation unit with device code.
    pub images: u32,
    /// Kernel entries over those images.
    pub kernels: u32,
    /// The entries whose bodies only report and abort on this target (libraries guard
    /// arch-specific kernels with `#if __CUDA_ARCH__`), by symbol, sorted. Not an error.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stubs: Vec<String>,
    /// The most registers per thread of any entry (cubins only: PTX has none yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_registers: Option<u32>,
    /// The largest stack frame per thread of any entry, in bytes (spills show here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_stack_bytes: Option<u32>,
    /// The most static shared memory of any entry, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_static_shared_bytes: Option<u64>,
}

impl fmt::Display for ModuleDeviceCode {
    /// `147 kernels in 1 image, 2 stubs, up to 255 registers, 24-byte stack, 1024 bytes of
    /// static shared memory`; stub names are listed where they are.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural = |count: u32| if count == 1 { "" } else { "s" };
        write!(
            f,
            "{} kernel{} in {} image{}, {} stub{}",
            self.kernels,
            plural(self.kernels),
            self.images,
            plural(self.images),
            self.stubs.len(),
            plural(self.stubs.len().try_into().unwrap_or(u32::MAX)),
        )?;
        if let Some(registers) = self.max_registers {
            write!(f, ", up to {registers} registers")?;
        }
        if let Some(stack) = self.max_stack_bytes {
            write!(f, ", {stack}-byte stack")?;
        }
        if let Some(shared) = self.max_static_shared_bytes {
            write!(f, ", {shared} bytes of static shared memory")?;
        }
        Ok(())
    }
}

impl ModuleVariant {
    /// `cu130/x86_64`.
    pub fn label(&self) -> String {
        format!("{}/{}", self.cuda, self.cpu)
    }
}

/// A target of a module that was not built.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModuleSkip {
    /// The CUDA build.
    pub cuda: CudaBuild,
    /// The CPU architecture.
    pub cpu: String,
    /// Why.
    pub reason: String,
}

/// Where a variant's cubin is, as seen from this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ArtifactLocation {
    /// In the bundle (the wheel).
    Bundle,
    /// In the user's artifact cache (fetched before).
    Cache,
    /// Only in the store: fetched on first load.
    Store,
    /// Nowhere: the bundle lacks it and records no store.
    Missing,
}

impl ArtifactLocation {
    /// Whether loading it needs no network.
    pub fn is_local(self) -> bool {
        matches!(self, ArtifactLocation::Bundle | ArtifactLocation::Cache)
    }
}

impl fmt::Display for ArtifactLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ArtifactLocation::Bundle => "local (bundle)",
            ArtifactLocation::Cache => "local (cache)",
            ArtifactLocation::Store => "remote",
            ArtifactLocation::Missing => "missing",
        })
    }
}
