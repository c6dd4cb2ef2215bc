//! The JIT fallback for extension modules: when no shipped build of a module fits the running
//! torch, CUDA build or CPU, build it from the sources the bundle ships (`sources/`, each file
//! checked against the index's sha256) with the recipe the bundler used (translation units,
//! ABI, include dirs, defines, flags, C++ standard, archs), against the running torch's
//! headers and libraries, and cache the shared library under the user's JIT cache.
//!
//! ```text
//! ${KWHEEL_JIT_CACHE:-${XDG_CACHE_HOME:-~/.cache}/kwheel/jit}/
//! └── modules-v1/                     layout version (MODULE_CACHE_LAYOUT)
//!     └── 5a/                         first two hex digits of the key
//!         ├── 5a0d…e1.so              the module, renamed into place whole
//!         ├── 5a0d…e1.json            key, digest, size, compilers; renamed into place last
//!         ├── 5a0d…e1.lock            locked (flock) by the process building the key
//!         └── .5a0d…e1.so.<pid>.<random>.tmp   a write in progress
//! ```
//!
//! The key is [`module_key`] over the index's inputs, torch's CUDA build, the CPU, the exact
//! running torch (`==2.11.0+cu130`: its headers and libraries are what the module is built
//! against) and both compilers with their exact versions. Many processes, killed ones, the lock
//! and its timeout behave as for kernels ([`super::compile_cached`], `docs/jit.md`).

use std::collections::BTreeMap;
use std::process::Command;

use super::cache::{lock_entry, lock_timeout_from};
use super::sources::verify_sources;
use super::*;
use crate::bundle::SOURCES_DIR;
use crate::index::{ModuleInputs, ModuleRecord};
use crate::module::compile::cuda_runtime_dirs;
use crate::module::fatbin::module_device_code;
use crate::module::{build_module, module_key, Abi, ModuleKeyInputs, ModuleRecipe};
use crate::module_coverage::{has_device_code, jit_archs, visible_module_devices, JitArchs};
use crate::untrusted::MAX_ARTIFACT_SIZE;

/// The module cache's layout directory. Bump it when the entry format or file names change.
pub const MODULE_CACHE_LAYOUT: &str = "modules-v1";

/// What building one module for this process needs.
#[derive(Clone, Copy, Debug)]
pub struct ModuleJitRequest<'a> {
    /// The bundle directory (its `sources/` holds the module's files).
    pub bundle_root: &'a Path,
    /// The module's name.
    pub name: &'a str,
    /// Its index record.
    pub record: &'a ModuleRecord,
    /// `torch.__version__` (`2.11.0+cu130`).
    pub torch_version: &'a str,
    /// The running torch's package folder (`…/site-packages/torch`): headers and libraries.
    pub torch_dir: &'a Path,
    /// torch's CUDA build.
    pub cuda: CudaBuild,
    /// The running Python's `Python.h` folder, which a classic-ABI module's
    /// `<torch/extension.h>` includes (`None` where it has no headers).
    pub python_include: Option<&'a Path>,
    /// The CPU architecture (`x86_64`).
    pub cpu: &'a str,
    /// The JIT cache directory ([`default_cache_dir`]).
    pub cache_dir: &'a Path,
    /// The archs to build for: the declared ones that run on the visible devices, else all
    /// of them ([`crate::module_coverage::jit_archs`]). In the key, so two arch sets are two
    /// entries.
    pub archs: &'a JitArchs,
}

/// A module built (or found built) by the JIT.
#[derive(Clone, Debug)]
pub struct ModuleJitOutput {
    /// Its key.
    pub key: String,
    /// The shared library's bytes, read once and verified.
    pub bytes: Vec<u8>,
    /// Whether this call built it (else another process had).
    pub compiled: bool,
    /// What it was built for (`cu130/x86_64`).
    pub label: String,
}

/// An nvcc and a host compiler, found and versioned.
#[derive(Clone, Debug)]
pub struct ModuleCompilers {
    /// nvcc.
    pub nvcc: PathBuf,
    /// nvcc's exact version (`13.0.88`).
    pub nvcc_version: String,
    /// The host C++ compiler (`g++`, as found on `PATH`).
    pub cxx: PathBuf,
    /// Its `--version` first line less the program's name, as the bundler records it.
    pub cxx_version: String,
}

/// The cache entry's metadata: an entry exists once this is in place.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct ModuleEntry {
    key: String,
    module: String,
    digest: String,
    size: u64,
    compilers: Vec<CompilerRecord>,
}

/// Finds nvcc of CUDA `build` (`CUDA_HOME`, then `PATH`, as the kernel JIT's search) and
/// `g++` on `PATH`; an error naming every place looked at otherwise.
pub fn find_module_compilers(
    module: &str,
    build: CudaBuild,
    search: &CompilerSearch,
) -> Result<ModuleCompilers, JitError> {
    let mut searched = Vec::new();
    let mut nvcc = None;
    for candidate in search.candidates() {
        if candidate.kind != CompilerKind::Nvcc {
            continue;
        }
        match nvcc_version(&candidate.location) {
            Ok(version) if CudaBuild::from_version(&version).ok() == Some(build) => {
                nvcc = Some((candidate.location.clone(), version));
                break;
            }
            Ok(version) => searched.push(format!(
                "{} ({}): nvcc {version}, not {build}",
                candidate.location.display(),
                candidate.origin
            )),
            Err(error) => searched.push(format!(
                "{} ({}): {error}",
                candidate.location.display(),
                candidate.origin
            )),
        }
    }
    if searched.is_empty() && nvcc.is_none() {
        searched.push(format!(
            "CUDA_HOME ({}) and PATH: no nvcc",
            search
                .cuda_home
                .as_ref()
                .map_or_else(|| "unset".to_owned(), |home| home.display().to_string())
        ));
    }
    let Some((nvcc, nvcc_version)) = nvcc else {
        return Err(JitError::NoModuleCompiler {
            module: module.to_owned(),
            build,
            missing: format!("no nvcc of CUDA {}.{}", build.major, build.minor),
            searched,
        });
    };
    let cxx = crate::env::programs_on_path("g++", search.path.as_deref())
        .into_iter()
        .next()
        .ok_or_else(|| JitError::NoModuleCompiler {
            module: module.to_owned(),
            build,
            missing: "no host C++ compiler `g++`".into(),
            searched: vec!["PATH: no g++".into()],
        })?;
    let output = Command::new(&cxx).arg("--version").output();
    let cxx_version = output
        .ok()
        .filter(|output| output.status.success())
        .and_then(|output| {
            crate::module::compile::compiler_version_line(&String::from_utf8_lossy(&output.stdout))
        })
        .ok_or_else(|| JitError::NoModuleCompiler {
            module: module.to_owned(),
            build,
            missing: format!("`{} --version` printed no version", cxx.display()),
            searched: vec![format!("PATH: {}", cxx.display())],
        })?;
    Ok(ModuleCompilers {
        nvcc,
        nvcc_version,
        cxx,
        cxx_version,
    })
}

/// The archs to build `record` for on this machine: [`jit_archs`] over the visible GPUs as
/// NVML reads them, without a CUDA context (all the declared ones where NVML cannot say).
pub fn visible_jit_archs(record: &ModuleRecord) -> JitArchs {
    let devices = visible_module_devices();
    jit_archs(record, devices.as_deref().map_err(String::as_str))
}

/// The key of `request` built with `compilers` ([`module_key`], the exact torch as its
/// target, the archs it builds for in place of the declared ones: all of them give the
/// shipped recipe's key inputs, a subset another key).
pub fn module_jit_key(request: &ModuleJitRequest<'_>, compilers: &ModuleCompilers) -> String {
    module_key(&ModuleKeyInputs {
        name: request.name,
        abi: request.record.abi,
        inputs: &built_inputs(request),
        cuda: request.cuda,
        cpu: request.cpu,
        torch: &format!("=={}", request.torch_version),
        compilers: &compiler_records(compilers),
    })
}

/// The index's inputs with the archs `request` builds for.
fn built_inputs(request: &ModuleJitRequest<'_>) -> ModuleInputs {
    ModuleInputs {
        archs: request.archs.archs().to_vec(),
        ..request.record.inputs.clone()
    }
}

fn compiler_records(compilers: &ModuleCompilers) -> Vec<CompilerRecord> {
    vec![
        CompilerRecord {
            kind: "nvcc".into(),
            version: compilers.nvcc_version.clone(),
        },
        CompilerRecord {
            kind: "g++".into(),
            version: compilers.cxx_version.clone(),
        },
    ]
}

/// The module of `request`: from the JIT cache, else built with `compilers` and cached.
/// Safe across processes: one builds, the others wait on the key's lock and read its entry.
/// `progress` hears what a build is doing (it takes tens of seconds).
pub fn build_module_cached(
    request: &ModuleJitRequest<'_>,
    compilers: &ModuleCompilers,
    progress: &dyn Fn(&str),
) -> Result<ModuleJitOutput, JitError> {
    check_module_inputs(request.name, &request.record.inputs)?;
    let timeout = lock_timeout_from(|name| std::env::var_os(name))?;
    let key = module_jit_key(request, compilers);
    let label = format!("{}/{}", request.cuda, request.cpu);
    let dir = request
        .cache_dir
        .join(MODULE_CACHE_LAYOUT)
        .join(key.get(..2).unwrap_or("00"));
    let paths = (
        dir.join(format!("{key}.so")),
        dir.join(format!("{key}.json")),
    );
    let found = |compiled| {
        read_module_entry(&paths.0, &paths.1, &key).map(|bytes| ModuleJitOutput {
            key: key.clone(),
            bytes,
            compiled,
            label: label.clone(),
        })
    };
    if let Some(hit) = found(false) {
        return Ok(hit);
    }
    create_module_dirs(request.cache_dir, &dir)?;
    let lock_path = dir.join(format!("{key}.lock"));
    let lock = lock_entry(request.name, &lock_path, timeout)?;
    if let Some(hit) = found(false) {
        return Ok(hit);
    }
    super::cache::remove_leftovers(&dir, &KernelKey(key.clone()));
    let sources = request.bundle_root.join(SOURCES_DIR);
    let library_files: BTreeMap<String, String> = request
        .record
        .inputs
        .files
        .iter()
        .filter(|(stable, _)| !stable.starts_with('['))
        .map(|(stable, digest)| (stable.clone(), digest.clone()))
        .collect();
    verify_sources(request.name, &sources, &library_files)?;
    progress(&format!(
        "building extension module `{}` for torch {} ({label}) from its shipped sources with \
         nvcc {} and g++ {}, {}",
        request.name,
        request.torch_version,
        compilers.nvcc_version,
        compilers.cxx_version,
        request.archs
    ));
    let bytes = compile_module(request, &key, compilers, &sources, progress)?;
    let digest = sha256_hex(&bytes);
    let entry = ModuleEntry {
        key: key.clone(),
        module: request.name.to_owned(),
        digest,
        size: bytes.len() as u64,
        compilers: compiler_records(compilers),
    };
    let mut metadata = serde_json::to_string_pretty(&entry).expect("an entry serializes");
    metadata.push('\n');
    let cache_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| JitError::Cache {
            action: "write",
            path,
            source,
        }
    };
    write_atomically(&paths.0, &bytes).map_err(cache_error(&paths.0))?;
    write_atomically(&paths.1, metadata.as_bytes()).map_err(cache_error(&paths.1))?;
    let _ = fs4::fs_std::FileExt::unlock(&lock);
    progress(&format!(
        "built extension module `{}` ({} bytes), cached as {}",
        request.name,
        bytes.len(),
        paths.0.display()
    ));
    Ok(ModuleJitOutput {
        key,
        bytes,
        compiled: true,
        label,
    })
}

/// Checks what the module's recipe puts on a compiler's command line as the kernel JIT
/// checks a kernel's ([`check_flags`], [`check_define`]): flags and defines from the list
/// that cannot name a file, a folder or a program, a C++ standard, and include dirs that stay
/// under `sources/`. The first refusal, before anything is looked for or run.
pub fn check_module_inputs(module: &str, inputs: &ModuleInputs) -> Result<(), JitError> {
    let refused = |refused| JitError::UnsafeInput {
        kernel: module.to_owned(),
        refused,
    };
    check_flags("nvcc_flags", &inputs.nvcc_flags).map_err(refused)?;
    check_flags("cxx_flags", &inputs.cxx_flags).map_err(refused)?;
    for (name, value) in &inputs.defines {
        check_define(name, Some(value)).map_err(refused)?;
    }
    check_flags("cxx_std", &[format!("-std={}", inputs.cxx_std)]).map_err(refused)?;
    let plain = |dir: &str| {
        !dir.is_empty()
            && !dir.starts_with(['/', '-'])
            && dir.split('/').all(|part| part != "..")
            && dir
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-/+".contains(c))
    };
    for (stable, dir) in inputs
        .sources
        .iter()
        .map(|source| ("sources", source))
        .chain(inputs.include_dirs.iter().map(|dir| ("include_dirs", dir)))
    {
        if !plain(dir) {
            return Err(refused(RefusedInput {
                field: stable,
                value: dir.escape_debug().to_string(),
                reason: "which is not a plain relative path inside the bundle's sources".into(),
            }));
        }
    }
    Ok(())
}

/// The cached module's bytes when its `.json` names `key` and the `.so` has the size and
/// sha256 it records; anything else is a miss.
fn read_module_entry(library: &Path, metadata: &Path, key: &str) -> Option<Vec<u8>> {
    let regular = |path: &Path| fs::symlink_metadata(path).ok().is_some_and(|m| m.is_file());
    if !regular(metadata) || !regular(library) {
        return None;
    }
    let text = crate::untrusted::read_regular_file(metadata, 1 << 20).ok()?;
    let entry: ModuleEntry = serde_json::from_slice(&text).ok()?;
    if entry.key != key {
        return None;
    }
    let bytes =
        crate::untrusted::read_regular_file(library, entry.size.min(MAX_ARTIFACT_SIZE)).ok()?;
    (bytes.len() as u64 == entry.size && sha256_hex(&bytes) == entry.digest).then_some(bytes)
}

/// Creates `<cache>/modules-v1/<shard>/`, refusing a link in place of either folder.
fn create_module_dirs(cache_dir: &Path, shard: &Path) -> Result<(), JitError> {
    fs::create_dir_all(shard).map_err(|source| JitError::Cache {
        action: "create",
        path: shard.to_path_buf(),
        source,
    })?;
    for dir in [&cache_dir.join(MODULE_CACHE_LAYOUT), shard] {
        let is_dir = fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir());
        if !is_dir {
            return Err(JitError::Cache {
                action: "use",
                path: dir.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "not a folder: the JIT cache never follows a link out of its root; remove it",
                ),
            });
        }
    }
    Ok(())
}

/// Compiles every translation unit of `request` (in `sources`, on relative paths) and links
/// the module with the bundler's recipe ([`crate::module::compile`]).
fn compile_module(
    request: &ModuleJitRequest<'_>,
    key: &str,
    compilers: &ModuleCompilers,
    sources: &Path,
    progress: &dyn Fn(&str),
) -> Result<Vec<u8>, JitError> {
    let inputs = &request.record.inputs;
    let torch_include = request.torch_dir.join("include");
    let toolkit = crate::compile::work::toolkit_root(&compilers.nvcc);
    let recipe = ModuleRecipe {
        name: request.name.to_owned(),
        key: key.to_owned(),
        abi: request.record.abi,
        folder: sources.to_path_buf(),
        sources: inputs.sources.clone(),
        include_dirs: inputs
            .include_dirs
            .iter()
            .map(PathBuf::from)
            .chain([
                torch_include.clone(),
                torch_include.join("torch/csrc/api/include"),
            ])
            .collect(),
        toolkit_include_dirs: [toolkit.join("include"), toolkit.join("include/cccl")]
            .into_iter()
            .filter(|dir| dir.is_dir())
            .collect(),
        system_dirs: match request.record.abi {
            Abi::Torch => request
                .python_include
                .map(Path::to_path_buf)
                .into_iter()
                .collect(),
            Abi::Stable => Vec::new(),
        },
        defines: inputs.defines.clone(),
        nvcc_flags: inputs.nvcc_flags.clone(),
        cxx_flags: inputs.cxx_flags.clone(),
        cxx_std: inputs.cxx_std.clone(),
        archs: request.archs.archs().to_vec(),
        torch_package: request.torch_dir.to_path_buf(),
        cuda_lib_dirs: cuda_runtime_dirs(&compilers.nvcc, request.torch_dir),
        nvcc: compilers.nvcc.clone(),
        ccbin: None,
        cxx: compilers.cxx.clone(),
    };
    let bytes = build_module(&recipe, progress).map_err(|source| JitError::ModuleCompile {
        module: request.name.to_owned(),
        build: request.cuda,
        source: Box::new(source),
    })?;
    // Checked as the bundler checks a module it ships: a cubin of each arch built for (PTX
    // for `compute_XX`), each read as a cubin of its SM.
    if has_device_code(inputs) {
        module_device_code(&bytes, &recipe.archs).map_err(|source| JitError::ModuleDeviceCode {
            module: request.name.to_owned(),
            build: request.cuda,
            source: Box::new(source),
        })?;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> ModuleRecord {
        ModuleRecord {
            abi: Abi::Stable,
            inputs: crate::index::ModuleInputs {
                sources: vec!["csrc/ops.cpp".into()],
                cxx_std: "c++17".into(),
                ..Default::default()
            },
            variants: Vec::new(),
            skipped: Vec::new(),
        }
    }

    fn compilers() -> ModuleCompilers {
        ModuleCompilers {
            nvcc: PathBuf::from("/cuda/bin/nvcc"),
            nvcc_version: "13.0.88".into(),
            cxx: PathBuf::from("/usr/bin/g++"),
            cxx_version: "(Debian 12.2.0-14+deb12u1) 12.2.0".into(),
        }
    }

    #[test]
    fn the_key_follows_the_running_torch_and_both_compilers_but_not_the_folders() {
        let record = record();
        let archs = JitArchs::Declared {
            archs: Vec::new(),
            why: "NVML could not be loaded".into(),
        };
        let request = |torch_version, torch_dir, cache_dir| ModuleJitRequest {
            bundle_root: Path::new("/site/pkg/_prebuilt"),
            name: "_C",
            record: &record,
            torch_version,
            torch_dir,
            cuda: "cu130".parse().unwrap(),
            python_include: None,
            cpu: "x86_64",
            cache_dir,
            archs: &archs,
        };
        let base = module_jit_key(
            &request("2.11.0+cu130", Path::new("/a/torch"), Path::new("/c1")),
            &compilers(),
        );
        // Where torch and the cache live is not an input; torch's version is.
        assert_eq!(
            module_jit_key(
                &request("2.11.0+cu130", Path::new("/b/torch"), Path::new("/c2")),
                &compilers()
            ),
            base
        );
        assert_ne!(
            module_jit_key(
                &request("2.12.0+cu130", Path::new("/a/torch"), Path::new("/c1")),
                &compilers()
            ),
            base
        );
        let mut other = compilers();
        other.nvcc_version = "13.0.48".into();
        let at = request("2.11.0+cu130", Path::new("/a/torch"), Path::new("/c1"));
        assert_ne!(module_jit_key(&at, &other), base);
        let mut other = compilers();
        other.cxx_version = "13.2.0".into();
        assert_ne!(module_jit_key(&at, &other), base);
    }

    /// A system CUDA install (`/usr/local/cuda`) keeps its runtime in `lib64/`: the JIT looked
    /// in `lib/` only and could not link a module on a GPU machine with such an nvcc.
    #[test]
    fn the_cuda_runtime_of_a_system_install_or_of_torchs_wheels_is_found() {
        let root = tempfile::tempdir().unwrap();
        let toolkit = root.path().join("cuda");
        let site = root.path().join("site");
        std::fs::create_dir_all(toolkit.join("lib64")).unwrap();
        std::fs::create_dir_all(site.join("torch")).unwrap();
        std::fs::create_dir_all(site.join("nvidia/cu13/lib")).unwrap();
        std::fs::write(site.join("nvidia/cu13/lib/libcudart.so.13"), b"").unwrap();
        let dirs = cuda_runtime_dirs(&toolkit.join("bin/nvcc"), &site.join("torch"));
        assert_eq!(
            crate::module::compile::find_cuda_runtime(&dirs),
            Some(site.join("nvidia/cu13/lib/libcudart.so.13"))
        );
        std::fs::write(toolkit.join("lib64/libcudart.so.13"), b"").unwrap();
        assert_eq!(
            crate::module::compile::find_cuda_runtime(&dirs),
            Some(toolkit.join("lib64/libcudart.so.13"))
        );
    }

    #[test]
    fn the_archs_built_for_are_in_the_key() {
        let mut record = record();
        record.inputs.archs = ["sm_90a", "sm_100a"]
            .map(|arch| arch.parse().unwrap())
            .to_vec();
        let key = |archs: &JitArchs| {
            module_jit_key(
                &ModuleJitRequest {
                    bundle_root: Path::new("/site/pkg/_prebuilt"),
                    name: "_C",
                    record: &record,
                    torch_version: "2.11.0+cu130",
                    torch_dir: Path::new("/a/torch"),
                    cuda: "cu130".parse().unwrap(),
                    python_include: None,
                    cpu: "x86_64",
                    cache_dir: Path::new("/c1"),
                    archs,
                },
                &compilers(),
            )
        };
        let declared = JitArchs::Declared {
            archs: record.inputs.archs.clone(),
            why: "NVML could not be loaded".into(),
        };
        let hopper = JitArchs::Fitting {
            archs: vec!["sm_90a".parse().unwrap()],
            devices: vec!["cuda:0 (NVIDIA H100 80GB HBM3, compute capability 9.0)".into()],
        };
        let blackwell = JitArchs::Fitting {
            archs: vec!["sm_100a".parse().unwrap()],
            devices: vec!["cuda:0 (NVIDIA B200, compute capability 10.0)".into()],
        };
        let keys = [key(&declared), key(&hopper), key(&blackwell)];
        assert_ne!(keys[0], keys[1]);
        assert_ne!(keys[0], keys[2]);
        assert_ne!(keys[1], keys[2]);
        // Why the archs were chosen is not an input: the same archs are the same entry.
        let both = JitArchs::Fitting {
            archs: record.inputs.archs.clone(),
            devices: vec!["cuda:0".into(), "cuda:1".into()],
        };
        assert_eq!(key(&both), keys[0]);
    }

    #[test]
    fn no_nvcc_names_the_build_and_where_it_looked() {
        let search = CompilerSearch {
            cuda_home: Some(PathBuf::from("/nowhere/cuda")),
            path: Some("/nowhere/bin".into()),
            ..CompilerSearch::default()
        };
        let error = find_module_compilers("_C", "cu130".parse().unwrap(), &search).unwrap_err();
        assert_eq!(
            error.to_string(),
            "cannot build extension module `_C` for cu130: no nvcc of CUDA 13.0; looked in \
             CUDA_HOME (/nowhere/cuda) and PATH: no nvcc; install the CUDA cu130 compiler \
             (nvcc) and a host C++ compiler (g++), set CUDA_HOME, or install a torch the \
             module was built for"
        );
    }

    #[test]
    fn a_recipe_that_could_name_a_file_or_a_program_is_refused() {
        let inputs = |change: fn(&mut ModuleInputs)| {
            let mut inputs = record().inputs;
            inputs.include_dirs = vec!["csrc".into()];
            inputs.cxx_flags = vec!["-O3".into()];
            change(&mut inputs);
            check_module_inputs("_C", &inputs).map_err(|error| error.to_string())
        };
        assert!(inputs(|_| {}).is_ok());
        let refused = [
            inputs(|i| i.cxx_flags.push("-fplugin=/tmp/evil.so".into())),
            inputs(|i| i.nvcc_flags.push("--compiler-bindir=/tmp".into())),
            inputs(|i| {
                i.defines.insert("X".into(), "$(touch /tmp/x)".into());
            }),
            inputs(|i| i.include_dirs.push("../../etc".into())),
            inputs(|i| i.include_dirs.push("/usr/include".into())),
            inputs(|i| i.sources.push("-o/tmp/x".into())),
        ];
        for refusal in refused {
            let text = refusal.unwrap_err();
            assert!(
                text.starts_with("`_C` is not compiled from its shipped sources"),
                "{text}"
            );
        }
    }
}
