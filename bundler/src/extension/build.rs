//! Building an extension module: plan (include graph of every translation unit, key), then
//! compile what the build cache lacks with the CUDA build's nvcc (`.cu`, device code for every
//! arch) and the host C++ compiler (`.cpp`), and link one shared library.
//!
//! ```text
//! [extensions._C] ─► scan every unit (torch's headers hashed) ─► key ─► cache hit? ─yes─► module
//!                                                                  └no─► nvcc / g++ -c ─► g++ -shared ─► check ─► cache
//! ```
//!
//! Reproducible byte for byte from any checkout: the compilers run in the library's folder on
//! relative paths, `-ffile-prefix-map` turns the library's and torch's folders into `.` and
//! `torch` (the registration macros expand `__FILE__`), `-frandom-seed` and cudafe's
//! `--orig_src_path_name` take the source's stable path (nvcc otherwise names internal symbols
//! after its absolute path and a temporary file), and the link strips the symbol table, which
//! held nvcc's temporary file names. torch's and CUDA's libraries are linked by name, with no
//! run path: the process that loads the module has loaded them already (torch has).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use prebuilt::index::{CompilerRecord, StoredFile};
use prebuilt::module::{
    module_key, torch_served, Abi, ModuleInputs, ModuleKeyInputs, ModuleRecord, ModuleSkip,
    ModuleVariant,
};
use prebuilt::{Arch, ArchKind, CudaBuild};

use crate::cache::{write_atomically, BuildCache};
use crate::error::Error;
use crate::include::{scan_includes, ScanRoots};
use crate::manifest::{is_cuda_source, ExtensionSpec, Manifest};
use crate::toolchain::{discover, nvcc_command, Toolchain};
use crate::torch::TorchHeaders;

/// The flags every unit is compiled with, before the manifest's: position-independent code
/// for a shared library, optimised as `cpp_extension` builds by default.
const BASE_FLAGS: [&str; 2] = ["-fPIC", "-O2"];

/// The CPU architecture modules are built for: this machine's (no cross compiler is used).
pub fn host_cpu() -> &'static str {
    std::env::consts::ARCH
}

/// An extension module planned: its key inputs and what compiling it needs.
#[derive(Clone, Debug)]
pub struct PlannedModule {
    /// Its name.
    pub name: String,
    /// Its ABI.
    pub abi: Abi,
    /// Its key inputs common to every variant.
    pub inputs: ModuleInputs,
    /// Include directories (absolute), in `-I` order: the manifest's, then torch's.
    pub include_dirs: Vec<PathBuf>,
    /// System include directories (`-isystem`), followed but not hashed: Python's headers
    /// for a classic-ABI module (`<torch/extension.h>` includes `Python.h`).
    pub system_dirs: Vec<PathBuf>,
    /// The library's own files of the include graph (not torch's), by stable path: what the
    /// bundle ships in `sources/` for the JIT fallback to rebuild the module.
    pub shipped: BTreeMap<String, PathBuf>,
}

/// The extension's key inputs and include dirs: every translation unit scanned with torch's
/// headers as library files (hashed) and the toolkit's and host compiler's as external.
pub fn plan_module(
    manifest: &Manifest,
    name: &str,
    spec: &ExtensionSpec,
    torch: &TorchHeaders,
    external_dirs: &[PathBuf],
) -> Result<PlannedModule, Error> {
    let dirs = spec
        .include_dirs
        .as_ref()
        .unwrap_or(&manifest.library.include_dirs);
    // The compilers run in the library's folder: a relative `--manifest` must not leave its
    // include dirs relative to the caller's folder.
    let root = manifest
        .root
        .canonicalize()
        .unwrap_or_else(|_| manifest.root.clone());
    let mut include_dirs: Vec<PathBuf> = dirs.iter().map(|dir| root.join(dir)).collect();
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
            .chain(crate::toolchain::host_include_dirs().compiler)
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
        include_dirs,
        system_dirs,
        shipped,
    })
}

/// The torch the manifest's pin allows (`KWHEEL_TORCH`, else the default folder), whose
/// headers and libraries every module builds against.
pub fn module_torch(manifest: &Manifest) -> Result<TorchHeaders, Error> {
    crate::torch::find_pinned(manifest).map_err(|source| Error::ModuleTorch {
        module: manifest
            .extensions
            .keys()
            .next()
            .cloned()
            .unwrap_or_default(),
        source: Box::new(source),
    })
}

/// The include directories of `build`'s toolkit, which a module's scan follows but does not
/// hash; empty where the build has no toolkit here.
pub fn toolkit_include_dirs(build: CudaBuild) -> Vec<PathBuf> {
    discover(build)
        .map(|toolchain| toolchain.include_dirs)
        .unwrap_or_default()
}

/// What [`build_modules`] made: the index's records and the built files by digest.
#[derive(Debug, Default)]
pub struct BuiltModules {
    /// Every extension's record, by name.
    pub records: BTreeMap<String, ModuleRecord>,
    /// Each module's file in the build cache, by the sha256 of its bytes.
    pub files: BTreeMap<String, PathBuf>,
    /// Modules compiled in this run, as (name, build).
    pub compiled: Vec<(String, CudaBuild)>,
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
    let torch = module_torch(manifest)?;
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
            let toolchain = toolchains.entry(build).or_insert_with(|| {
                discover(build)
                    .map_err(|error| prebuilt::error_chain(&error))
                    .and_then(|toolchain| match toolchain.nvcc {
                        Some(_) => Ok(toolchain),
                        None => Err(format!(
                            "the {build} toolchain has no nvcc front end (its wheels carry \
                             NVRTC and ptxas only), and a module's host half needs one \
                             (docs/extensions.md)"
                        )),
                    })
            });
            let toolchain = match toolchain {
                Ok(toolchain) => toolchain,
                Err(reason) => {
                    skipped.push(ModuleSkip {
                        cuda: build,
                        cpu: host_cpu().to_owned(),
                        reason: reason.clone(),
                    });
                    continue;
                }
            };
            let planned = plan_module(manifest, name, spec, &torch, &toolchain.include_dirs)?;
            built.sources.extend(planned.shipped.clone());
            let served = torch_served(spec.abi, torch_pin).ok_or_else(|| Error::ModuleBuild {
                module: name.clone(),
                build,
                reason: format!(
                    "the torch pin `{torch_pin}` names no version to build the module for; \
                     pin a minor (`2.11.*`)"
                ),
            })?;
            let compilers = vec![
                CompilerRecord {
                    kind: "nvcc".into(),
                    version: toolchain.compiler.version.clone(),
                },
                CompilerRecord {
                    kind: "g++".into(),
                    version: host_cxx_version().map_err(|reason| Error::ModuleBuild {
                        module: name.clone(),
                        build,
                        reason,
                    })?,
                },
            ];
            let key = module_key(&ModuleKeyInputs {
                name,
                abi: spec.abi,
                inputs: &planned.inputs,
                cuda: build,
                cpu: host_cpu(),
                torch: &served,
                compilers: &compilers,
            });
            let path = cache.module_path(&key);
            let bytes = match std::fs::read(&path) {
                Ok(bytes) if check_module(&bytes).is_ok() => bytes,
                _ => {
                    let bytes = compile_module(manifest, &planned, &torch, toolchain)?;
                    check_module(&bytes).map_err(|reason| Error::ModuleBuild {
                        module: name.clone(),
                        build,
                        reason,
                    })?;
                    write_atomically(&path, &bytes)?;
                    built.compiled.push((name.clone(), build));
                    bytes
                }
            };
            let digest = prebuilt::key::sha256_hex(&bytes);
            built.files.insert(digest.clone(), path);
            variants.push(ModuleVariant {
                cuda: build,
                cpu: host_cpu().to_owned(),
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
            });
            record.get_or_insert_with(|| ModuleRecord {
                abi: spec.abi,
                inputs: planned.inputs.clone(),
                variants: Vec::new(),
                skipped: Vec::new(),
            });
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

/// The host C++ compiler's version: its `--version` first line less the program's name
/// (`(Debian 12.2.0-14+deb12u1) 12.2.0`), the distribution's build included.
fn host_cxx_version() -> Result<String, String> {
    let output = Command::new("g++")
        .arg("--version")
        .output()
        .map_err(|error| format!("cannot run the host C++ compiler `g++`: {error}"))?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .next()
        .map(|line| line.trim_start_matches("g++").trim().to_owned())
        .filter(|line| output.status.success() && !line.is_empty())
        .ok_or_else(|| "`g++ --version` printed no version".to_owned())
}

/// nvcc's `-gencode` for a target: SASS for `sm_90a`/`sm_100f`/`sm_90`, PTX for `compute_90`.
fn gencode(arch: Arch) -> String {
    let spelled = arch.to_string();
    match arch.kind {
        ArchKind::Ptx => format!("arch={spelled},code={spelled}"),
        _ => {
            let suffix = spelled.trim_start_matches("sm_");
            format!("arch=compute_{suffix},code=sm_{suffix}")
        }
    }
}

/// Compiles and links `planned` in a temporary folder; the module's bytes.
fn compile_module(
    manifest: &Manifest,
    planned: &PlannedModule,
    torch: &TorchHeaders,
    toolchain: &Toolchain,
) -> Result<Vec<u8>, Error> {
    let fail = |reason: String| Error::ModuleBuild {
        module: planned.name.clone(),
        build: toolchain.build,
        reason,
    };
    let scratch =
        tempfile::tempdir().map_err(|error| fail(format!("no temporary folder: {error}")))?;
    let root = manifest
        .root
        .canonicalize()
        .unwrap_or_else(|_| manifest.root.clone());
    let torch_root = torch.package.parent().unwrap_or(&torch.package).to_owned();
    let prefix_maps = [
        format!("-ffile-prefix-map={}=.", root.display()),
        format!("-ffile-prefix-map={}=torch", torch_root.display()),
    ];
    let inputs = &planned.inputs;
    let mut common: Vec<String> = vec![format!("-std={}", inputs.cxx_std)];
    if planned.abi == Abi::Torch {
        let shim = scratch.path().join("torch-shim");
        prebuilt::module::write_classic_extension_h(&shim)
            .map_err(|error| fail(format!("cannot write {}: {error}", shim.display())))?;
        common.push(format!("-I{}", shim.display()));
    }
    common.extend(
        inputs
            .defines
            .iter()
            .map(|(name, value)| format!("-D{name}={value}")),
    );
    common.extend(
        planned
            .include_dirs
            .iter()
            .chain(&toolchain.include_dirs)
            .map(|dir| format!("-I{}", dir.display())),
    );
    for dir in &planned.system_dirs {
        common.push("-isystem".into());
        common.push(dir.display().to_string());
    }
    let nvcc = toolchain.nvcc.as_ref().expect("a toolchain with nvcc");
    let jobs: Vec<(String, Command)> = inputs
        .sources
        .iter()
        .enumerate()
        .map(|(n, source)| {
            let object = scratch.path().join(format!("{n}.o"));
            let mut command = if is_cuda_source(source) {
                let mut command = nvcc_command(nvcc);
                command.arg("-c").args(&common);
                let host_flags = BASE_FLAGS
                    .iter()
                    .copied()
                    .chain(prefix_maps.iter().map(String::as_str));
                for flag in host_flags {
                    command.arg("-Xcompiler").arg(flag);
                }
                for arch in &inputs.archs {
                    command.arg("-gencode").arg(gencode(*arch));
                }
                command
                    .arg(format!("-frandom-seed={source}"))
                    .arg("-Xcudafe")
                    .arg(format!("--orig_src_path_name={source}"))
                    .args(&inputs.nvcc_flags)
                    .args(
                        inputs
                            .cxx_flags
                            .iter()
                            .flat_map(|flag| ["-Xcompiler", flag]),
                    );
                command
            } else {
                let mut command = Command::new("g++");
                command
                    .arg("-c")
                    .args(BASE_FLAGS)
                    .args(&prefix_maps)
                    .arg(format!("-frandom-seed={source}"))
                    .args(&common)
                    .args(&inputs.cxx_flags);
                command
            };
            command
                .arg(source)
                .arg("-o")
                .arg(&object)
                .current_dir(&root);
            (source.clone(), command)
        })
        .collect();
    let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
        let running: Vec<_> = jobs
            .into_iter()
            .map(|(source, mut command)| scope.spawn(move || run(&mut command, &source)))
            .collect();
        running
            .into_iter()
            .map(|job| {
                job.join()
                    .unwrap_or_else(|_| Err("the compile thread panicked".into()))
            })
            .collect()
    });
    for result in results {
        result.map_err(&fail)?;
    }
    let output = scratch.path().join(format!("{}.so", planned.name));
    let mut link = Command::new("g++");
    link.args(["-shared", "-s"])
        .arg("-o")
        .arg(&output)
        .args((0..inputs.sources.len()).map(|n| scratch.path().join(format!("{n}.o"))))
        .arg(format!("-L{}", torch.package.join("lib").display()))
        .args(["-Wl,--as-needed", "-lc10", "-ltorch_cpu"]);
    if planned.abi == Abi::Torch {
        link.arg("-ltorch");
    }
    if inputs.sources.iter().any(|source| is_cuda_source(source)) {
        let runtime = cuda_runtime(toolchain).ok_or_else(|| {
            fail(format!(
                "no CUDA runtime (`libcudart.so.*`) beside the {} toolkit's headers",
                toolchain.build
            ))
        })?;
        link.arg(format!("-L{}", torch.package.join("lib").display()))
            .arg("-lc10_cuda")
            .arg("-ltorch_cuda")
            .arg(format!("-L{}", runtime.0.display()))
            .arg(format!("-l:{}", runtime.1));
    }
    link.current_dir(scratch.path());
    run(&mut link, "the link").map_err(fail)?;
    std::fs::read(&output).map_err(|source| Error::Read {
        path: output,
        source,
    })
}

/// The CUDA runtime's folder and file name (`libcudart.so.13`) for `toolchain`, found in the
/// `lib` folder beside one of its include folders.
fn cuda_runtime(toolchain: &Toolchain) -> Option<(PathBuf, String)> {
    toolchain.include_dirs.iter().find_map(|include| {
        let lib = include.parent()?.join("lib");
        let mut names: Vec<String> = std::fs::read_dir(&lib)
            .ok()?
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| {
                name.strip_prefix("libcudart.so.")
                    .is_some_and(|major| major.chars().all(|c| c.is_ascii_digit()))
            })
            .collect();
        names.sort();
        Some((lib, names.pop()?))
    })
}

/// Runs a compile or link step; its log on failure, naming `what`.
fn run(command: &mut Command, what: &str) -> Result<(), String> {
    let output = command.output().map_err(|error| {
        format!(
            "cannot run `{}` for {what}: {error}",
            command.get_program().to_string_lossy()
        )
    })?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "`{}` failed on {what} ({}):\n{}{}",
        command.get_program().to_string_lossy(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}

/// Checks that `bytes` are a shared library: an ELF file of type `ET_DYN` for this CPU.
/// (What it needs of glibc and libstdc++ is the wheel audit's to judge.)
pub fn check_module(bytes: &[u8]) -> Result<(), String> {
    if bytes.len() < 20 || &bytes[..4] != b"\x7fELF" {
        return Err("the link wrote no ELF file".into());
    }
    // e_type (offset 16), little-endian: 3 is ET_DYN.
    if bytes[5] != 1 || u16::from_le_bytes([bytes[16], bytes[17]]) != 3 {
        return Err("the link wrote no little-endian shared library (ET_DYN)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gencode_spells_sass_and_ptx_targets() {
        let arch = |text: &str| text.parse::<Arch>().unwrap();
        assert_eq!(gencode(arch("sm_90a")), "arch=compute_90a,code=sm_90a");
        assert_eq!(gencode(arch("sm_100f")), "arch=compute_100f,code=sm_100f");
        assert_eq!(
            gencode(arch("compute_90")),
            "arch=compute_90,code=compute_90"
        );
    }

    #[test]
    fn only_a_shared_library_is_a_module() {
        assert!(check_module(b"not an elf at all!!!").is_err());
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[5] = 1;
        elf[16] = 2; // ET_EXEC
        assert!(check_module(&elf).is_err());
        elf[16] = 3;
        assert_eq!(check_module(&elf), Ok(()));
    }
}
