//! Building an extension module: plan (include graph of every translation unit, key), then
//! compile what the build cache lacks with the CUDA build's nvcc (`.cu`, device code for every
//! arch) and the host C++ compiler (`.cpp`), and link one shared library.
//!
//! ```text
//! [extensions._C] ─► scan every unit (torch's headers hashed) ─► key ─► cache hit? ─yes─► module
//!                                                                  └no─► nvcc / g++ -c ─► g++ -shared ─► check ─► cache
//! ```
//!
//! Every module built or found in the cache then has its fatbin read: each declared arch must
//! have its cubin (or PTX) and each must read as one, or the build of that module fails; what
//! each arch holds (kernels, stubs, registers) goes to the variant's record.
//!
//! The compile and link are [`prebuilt::module::compile`]'s, the recipe the module JIT runs
//! too: reproducible byte for byte from any checkout (`-ffile-prefix-map`, `-frandom-seed`,
//! cudafe's `--orig_src_path_name`, a stripped symbol table), every unit in its own thread.

use std::collections::BTreeMap;
use std::path::PathBuf;

use prebuilt::index::{CompilerRecord, StoredFile};
use prebuilt::module::fatbin::{module_device_code, FatbinError};
use prebuilt::module::{
    module_key, torch_served, Abi, ModuleDeviceCode, ModuleInputs, ModuleKeyInputs, ModuleRecipe,
    ModuleRecord, ModuleSkip, ModuleVariant,
};
use prebuilt::{Arch, CudaBuild};

use super::cpu::{host_target, module_cpus, HostTarget, HostTargetError};
use crate::cache::{write_atomically, BuildCache};
use crate::error::Error;
use crate::include::{scan_includes, IncludeGraph, ScanRoots};
use crate::manifest::{ExtensionSpec, Manifest};
use crate::toolchain::{discover, Toolchain};

pub use super::cpu::host_cpu;

/// An extension module planned: its key inputs and what compiling it needs.
#[derive(Clone, Debug)]
pub struct PlannedModule {
    /// Its name.
    pub name: String,
    /// Its ABI.
    pub abi: Abi,
    /// Its key inputs common to every variant.
    pub inputs: ModuleInputs,
    /// The library's folder, absolute: the compilers run there, on the sources' relative paths.
    pub folder: PathBuf,
    /// Include directories (absolute), in `-I` order: the manifest's, then torch's.
    pub include_dirs: Vec<PathBuf>,
    /// System include directories (`-isystem`), followed but not hashed: Python's headers
    /// for a classic-ABI module (`<torch/extension.h>` includes `Python.h`).
    pub system_dirs: Vec<PathBuf>,
    /// The library's own files of the include graph (not torch's), by stable path: what the
    /// bundle ships in `sources/` for the JIT fallback to rebuild the module.
    pub shipped: BTreeMap<String, PathBuf>,
    /// The include graph of every translation unit, as scanned (`dev explain` renders it).
    pub graph: IncludeGraph,
}

/// The extension's key inputs and include dirs for `target`'s CPU: every translation unit
/// scanned with torch's headers as library files (hashed) and the toolkit's and host
/// compiler's as external.
pub fn plan_module(
    manifest: &Manifest,
    name: &str,
    spec: &ExtensionSpec,
    target: &HostTarget,
    external_dirs: &[PathBuf],
) -> Result<PlannedModule, Error> {
    let torch = &target.torch;
    let dirs = spec
        .include_dirs
        .as_ref()
        .unwrap_or(&manifest.library.include_dirs);
    // The compilers run in the library's folder: a relative `--manifest` must not leave its
    // include dirs relative to the caller's folder.
    let folder = manifest
        .root
        .canonicalize()
        .unwrap_or_else(|_| manifest.root.clone());
    let mut include_dirs: Vec<PathBuf> = dirs.iter().map(|dir| folder.join(dir)).collect();
    include_dirs.extend(torch.include_dirs.iter().cloned());
    let system_dirs: Vec<PathBuf> = match spec.abi {
        Abi::Torch => crate::torch::python_include_dir().into_iter().collect(),
        Abi::Stable => Vec::new(),
    };
    let roots = ScanRoots {
        root: manifest.root.clone(),
        include_dirs: include_dirs.clone(),
        external_dirs: external_dirs
            .iter()
            .cloned()
            .chain(system_dirs.iter().cloned())
            .chain(target.compiler_dirs.iter().cloned())
            .collect(),
    };
    let sources: Vec<PathBuf> = spec
        .sources
        .iter()
        .map(|source| manifest.root.join(source))
        .collect();
    let graph = scan_includes(&sources, &roots).map_err(|source| Error::Scan {
        kernel: format!("extension {name}"),
        source,
    })?;
    // A classic-ABI module builds as `cpp_extension` builds it: with the defines and nvcc
    // flags its torch passes (`TORCH_API_INCLUDE_EXTENSION_H`, `--expt-relaxed-constexpr`,
    // `__CUDA_NO_HALF_OPERATORS__`…) under the library's own.
    let (mut defines, torch_nvcc_flags) = match spec.abi {
        Abi::Torch => (torch.defines_for(name), torch.nvcc_flags.clone()),
        Abi::Stable => (BTreeMap::new(), Vec::new()),
    };
    defines.extend(manifest.library.defines.clone());
    defines.extend(spec.defines.clone());
    defines.insert("TORCH_EXTENSION_NAME".into(), name.to_owned());
    if let Some(version) = spec
        .torch_target
        .as_deref()
        .and_then(prebuilt::module::torch_target_version)
    {
        defines.insert(
            "TORCH_TARGET_VERSION".into(),
            prebuilt::module::torch_target_define(version),
        );
    }
    let inputs = ModuleInputs {
        sources: spec.sources.clone(),
        files: graph.files().clone(),
        defines,
        nvcc_flags: [
            &torch_nvcc_flags[..],
            &manifest.library.nvcc_flags[..],
            &spec.nvcc_flags,
        ]
        .concat(),
        cxx_flags: spec.cxx_flags.clone(),
        cxx_std: spec
            .cxx_std
            .clone()
            .unwrap_or_else(|| manifest.library.cxx_std.clone()),
        archs: spec
            .arch
            .clone()
            .unwrap_or_else(|| manifest.library.archs.clone()),
        include_dirs: dirs.clone(),
    };
    // torch's headers have bracketed stable names (`[1]/ATen/ATen.h`): the JIT takes them
    // from the running torch, never from the bundle.
    let shipped = graph
        .files()
        .keys()
        .filter(|stable| !stable.starts_with('['))
        .filter_map(|stable| {
            graph
                .absolute_path(stable)
                .map(|path| (stable.clone(), path.to_owned()))
        })
        .collect();
    Ok(PlannedModule {
        name: name.to_owned(),
        abi: spec.abi,
        inputs,
        folder,
        include_dirs,
        system_dirs,
        shipped,
        graph,
    })
}

/// What builds modules for this machine's CPU: its `g++` and the torch every module builds
/// against, with its headers and libraries (`KWHEEL_TORCH`, else the default folder): one the
/// manifest's pin allows, or one at least as new as the `torch-target` of each extension when
/// all of them name one.
pub fn module_host(manifest: &Manifest) -> Result<HostTarget, Error> {
    module_target(manifest, host_cpu())
}

/// [`module_host`] for any CPU ([`host_target`]), its failure as the build's error.
pub fn module_target(manifest: &Manifest, cpu: &str) -> Result<HostTarget, Error> {
    host_target(manifest, cpu).map_err(|error| target_error(manifest, cpu, error))
}

/// Why `cpu` has no host target, as the build's error.
fn target_error(manifest: &Manifest, cpu: &str, error: HostTargetError) -> Error {
    let module = manifest
        .extensions
        .keys()
        .next()
        .cloned()
        .unwrap_or_default();
    match error {
        HostTargetError::Torch(source) => Error::ModuleTorch { module, source },
        error @ (HostTargetError::Compiler(_) | HostTargetError::Named(..)) => {
            Error::ModuleCompiler {
                module,
                cpu: cpu.to_owned(),
                reason: error.to_string(),
            }
        }
    }
}

/// The include directories of `build`'s toolkit, which a module's scan follows but does not
/// hash; empty where the build has no toolkit here.
pub fn toolkit_include_dirs(build: CudaBuild) -> Vec<PathBuf> {
    discover(build)
        .map(|toolchain| toolchain.include_dirs)
        .unwrap_or_default()
}

/// The toolchain that builds modules for `build`: one with an nvcc front end; else why not,
/// the reason its skip records.
pub fn module_toolchain(build: CudaBuild) -> Result<Toolchain, String> {
    discover(build)
        .map_err(|error| prebuilt::error_chain(&error))
        .and_then(|toolchain| match toolchain.nvcc {
            Some(_) => Ok(toolchain),
            None => Err(format!(
                "the {build} toolchain has no nvcc front end (its wheels carry NVRTC and ptxas \
                 only), and a module's host half needs one (docs/extensions.md)"
            )),
        })
}

/// One variant of a module planned for a CUDA build: everything its key is computed from,
/// and the key.
#[derive(Clone, Debug)]
pub struct PlannedVariant {
    /// The module's inputs, include graph and include dirs.
    pub planned: PlannedModule,
    /// The torch versions it serves ([`ModuleVariant::torch`]).
    pub torch: String,
    /// Its compilers with their exact versions: the build's nvcc, the host `g++`.
    pub compilers: Vec<CompilerRecord>,
    /// Its key ([`prebuilt::module::module_key`]).
    pub key: String,
}

/// Plans module `name` for `toolchain`'s CUDA build on `target`'s CPU, against its torch under
/// the pin `torch_pin`, and computes its key: what [`build_modules`] builds and what
/// `dev explain` shows.
pub fn plan_variant(
    manifest: &Manifest,
    name: &str,
    spec: &ExtensionSpec,
    target: &HostTarget,
    torch_pin: &str,
    toolchain: &Toolchain,
) -> Result<PlannedVariant, Error> {
    let build = toolchain.build;
    let planned = plan_module(manifest, name, spec, target, &toolchain.include_dirs)?;
    // A `torch-target` (stable ABI only) is where the module's range starts.
    let from = spec.torch_target.as_deref().unwrap_or(torch_pin);
    let served = torch_served(spec.abi, from).ok_or_else(|| Error::ModuleBuild {
        module: name.to_owned(),
        build: build.to_string(),
        reason: format!(
            "the torch pin `{torch_pin}` names no version to build the module for; pin a minor \
             (`2.11.*`)"
        ),
    })?;
    let compilers = vec![
        CompilerRecord {
            kind: "nvcc".into(),
            version: toolchain.compiler.version.clone(),
        },
        CompilerRecord {
            kind: "g++".into(),
            version: target.cxx_version.clone(),
        },
    ];
    let key = module_key(&ModuleKeyInputs {
        name,
        abi: spec.abi,
        inputs: &planned.inputs,
        cuda: build,
        cpu: &target.cpu,
        torch: &served,
        compilers: &compilers,
    });
    Ok(PlannedVariant {
        planned,
        torch: served,
        compilers,
        key,
    })
}

/// What [`build_modules`] made: the index's records and the built files by digest.
#[derive(Debug, Default)]
pub struct BuiltModules {
    /// Every extension's record, by name.
    pub records: BTreeMap<String, ModuleRecord>,
    /// Each module's file in the build cache, by the sha256 of its bytes.
    pub files: BTreeMap<String, PathBuf>,
    /// Modules compiled in this run, as (name, build, CPU).
    pub compiled: Vec<(String, CudaBuild, String)>,
    /// The library's files of every module's include graph, by stable path: shipped in the
    /// bundle's `sources/` for the JIT fallback (`docs/extensions.md`).
    pub sources: BTreeMap<String, PathBuf>,
}

/// Builds every extension of `manifest` for each of its CUDA builds whose toolchain has nvcc,
/// on this machine's CPU, against the torch the pin `torch_pin` allows; a build without nvcc
/// is a skip with its reason (`docs/extensions.md`).
pub fn build_modules(
    manifest: &Manifest,
    torch_pin: &str,
    cache: &BuildCache,
) -> Result<BuiltModules, Error> {
    let mut built = BuiltModules::default();
    if manifest.extensions.is_empty() {
        return Ok(built);
    }
    // Each CPU's compiler and torch, found when a module first asks for that CPU: this
    // machine's, or one named outright, must serve (an error); another one merely missing is
    // a skip with the reason.
    let mut targets: BTreeMap<String, Result<HostTarget, String>> = BTreeMap::new();
    let mut toolchains: BTreeMap<CudaBuild, Result<Toolchain, String>> = BTreeMap::new();
    for (name, spec) in &manifest.extensions {
        let builds = spec
            .cuda_builds
            .as_deref()
            .unwrap_or(&manifest.library.cuda_builds);
        let mut record: Option<ModuleRecord> = None;
        let mut variants = Vec::new();
        let mut skipped = Vec::new();
        for &build in builds {
            let toolchain = toolchains
                .entry(build)
                .or_insert_with(|| module_toolchain(build));
            for cpu in module_cpus(spec) {
                if !targets.contains_key(&cpu) {
                    let found = match host_target(manifest, &cpu) {
                        Ok(target) => Ok(target),
                        Err(error @ HostTargetError::Named(..)) => {
                            return Err(target_error(manifest, &cpu, error));
                        }
                        Err(error) if cpu == host_cpu() => {
                            return Err(target_error(manifest, &cpu, error));
                        }
                        Err(error) => Err(error.to_string()),
                    };
                    targets.insert(cpu.clone(), found);
                }
                let target = &targets[&cpu];
                let (toolchain, target) = match (&*toolchain, target) {
                    (Ok(toolchain), Ok(target)) => (toolchain, target),
                    (Err(reason), _) | (_, Err(reason)) => {
                        skipped.push(ModuleSkip {
                            cuda: build,
                            cpu,
                            reason: reason.clone(),
                        });
                        continue;
                    }
                };
                let PlannedVariant {
                    planned,
                    torch: served,
                    compilers,
                    key,
                } = plan_variant(manifest, name, spec, target, torch_pin, toolchain)?;
                built.sources.extend(planned.shipped.clone());
                let path = cache.module_path(&key);
                let bytes = match std::fs::read(&path) {
                    Ok(bytes) if check_module(&bytes, &target.cpu).is_ok() => bytes,
                    _ => {
                        let bytes = compile_module(&planned, &key, target, toolchain)?;
                        check_module(&bytes, &target.cpu).map_err(|reason| Error::ModuleBuild {
                            module: name.clone(),
                            build: format!("{build}/{}", target.cpu),
                            reason,
                        })?;
                        write_atomically(&path, &bytes)?;
                        built
                            .compiled
                            .push((name.clone(), build, target.cpu.clone()));
                        bytes
                    }
                };
                let device_code = read_device_code(&bytes, &planned.inputs).map_err(|source| {
                    Error::ModuleDeviceCode {
                        module: name.clone(),
                        build,
                        source: Box::new(source),
                    }
                })?;
                let digest = prebuilt::key::sha256_hex(&bytes);
                built.files.insert(digest.clone(), path);
                variants.push(ModuleVariant {
                    cuda: build,
                    cpu: target.cpu.clone(),
                    torch: served,
                    compilers,
                    key,
                    artifact: StoredFile {
                        digest,
                        size: bytes.len() as u64,
                        path: String::new(),
                        stored_size: 0,
                        dictionary: None,
                    },
                    device_code,
                });
                record.get_or_insert_with(|| ModuleRecord {
                    abi: spec.abi,
                    inputs: planned.inputs.clone(),
                    variants: Vec::new(),
                    skipped: Vec::new(),
                });
            }
        }
        let mut record = record.unwrap_or_else(|| ModuleRecord {
            abi: spec.abi,
            inputs: ModuleInputs::default(),
            variants: Vec::new(),
            skipped: Vec::new(),
        });
        record.variants = variants;
        record.skipped = skipped;
        built.records.insert(name.clone(), record);
    }
    Ok(built)
}

/// Compiles and links `planned` with the CUDA build's nvcc and `g++`
/// ([`prebuilt::module::compile`]); the module's bytes.
fn compile_module(
    planned: &PlannedModule,
    key: &str,
    target: &HostTarget,
    toolchain: &Toolchain,
) -> Result<Vec<u8>, Error> {
    let torch = &target.torch;
    let fail = |source| Error::ModuleCompile {
        module: planned.name.clone(),
        build: toolchain.build,
        cpu: target.cpu.clone(),
        source: Box::new(source),
    };
    let inputs = &planned.inputs;
    let nvcc = toolchain.nvcc.as_deref().expect("a toolchain with nvcc");
    let recipe = ModuleRecipe {
        name: planned.name.clone(),
        key: key.to_owned(),
        abi: planned.abi,
        folder: planned.folder.clone(),
        sources: inputs.sources.clone(),
        include_dirs: planned.include_dirs.clone(),
        toolkit_include_dirs: toolchain.include_dirs.clone(),
        system_dirs: planned.system_dirs.clone(),
        defines: inputs.defines.clone(),
        nvcc_flags: inputs.nvcc_flags.clone(),
        cxx_flags: inputs.cxx_flags.clone(),
        cxx_std: inputs.cxx_std.clone(),
        archs: inputs.archs.clone(),
        torch_package: torch.package.clone(),
        // Another CPU's runtime is the one beside its torch, not the toolkit's own.
        cuda_lib_dirs: match target.cross {
            false => prebuilt::module::compile::cuda_runtime_dirs(nvcc, &torch.package),
            true => prebuilt::module::compile::site_cuda_runtime_dirs(&torch.package),
        },
        nvcc: nvcc.to_path_buf(),
        ccbin: target.cross.then(|| target.cxx.clone()),
        cxx: target.cxx.clone(),
    };
    prebuilt::module::build_module(&recipe, &|_| {}).map_err(fail)
}

/// What a built module's fatbin holds for each target, checked against the targets its
/// inputs declare ([`prebuilt::module::fatbin::module_device_code`]). A module without a `.cu`
/// unit has no device code to declare.
pub fn read_device_code(
    bytes: &[u8],
    inputs: &ModuleInputs,
) -> Result<BTreeMap<Arch, ModuleDeviceCode>, FatbinError> {
    let archs = if prebuilt::module_coverage::has_device_code(inputs) {
        &inputs.archs[..]
    } else {
        &[]
    };
    module_device_code(bytes, archs)
}

/// Checks that `bytes` are a shared library: an ELF file of type `ET_DYN` for this CPU.
/// (What it needs of glibc and libstdc++ is the wheel audit's to judge.)
pub fn check_module(bytes: &[u8], cpu: &str) -> Result<(), String> {
    prebuilt::module::compile::check_shared_library(bytes)?;
    // What the link made must run on the CPU it is shipped for.
    let machine = prebuilt::module::compile::elf_cpu(bytes);
    match machine == cpu {
        true => Ok(()),
        false => Err(format!(
            "the link wrote a library for {machine}, not {cpu}: the compiler for {cpu} is \
             not one"
        )),
    }
}
