//! Where a CUDA toolkit keeps its compilers and headers: the one description of a toolkit's
//! layout that the bundler's toolchain discovery, the JIT's compiler search and the tests read.
//!
//! ```text
//! a pip --target folder (one CUDA build)   a site-packages (several)     a toolkit root
//! ├── nvidia/cu13/                         └── nvidia/                   ├── bin/nvcc, bin/ptxas
//! │   ├── bin/nvcc, bin/ptxas                  ├── cu13/ (CUDA 13)       ├── lib64/libnvrtc.so.N
//! │   ├── lib/libnvrtc.so.13                   └── cuda_*/ (CUDA 12)     ├── include/ (+ cub/)
//! │   └── include/ (+ include/cccl/)                                     └── version.json
//! ├── nvidia/cuda_nvrtc/lib/libnvrtc.so.12
//! ├── nvidia/cuda_runtime/include/
//! ├── nvidia/cuda_cccl/include/
//! ├── nvidia/cublas/include/ (+ cufft, curand, cusolver, cusparse: CUDA 12's math libraries)
//! └── nvidia/cuda_nvcc/bin/ptxas
//! ```
//!
//! A layout's components are the folder itself, then its `nvidia/` packages of one CUDA release
//! (`cu13/` for CUDA 13 and later, `cuda_*/` for CUDA 12), in name order; the first component
//! that has a file wins. Include dirs are the runtime headers (`cuda_runtime.h`), then CCCL
//! (`cub/`, under `include/cccl/` in CUDA 13), then each component's `include/` that holds a
//! math library's headers ([`MATH_LIBRARY_HEADERS`]: cuBLAS and cuBLASLt, cuFFT, cuRAND,
//! cuSOLVER, cuSPARSE), in component order. CUDA 13's wheels put those beside the runtime
//! headers (`nvidia/cu13/include`), so they add no folder there; CUDA 12's have one folder each.
//!
//! Where a build's toolchain folder is ([`toolchain_dir`]), first match wins:
//!
//! | source | example |
//! | --- | --- |
//! | `KWHEEL_CUDA_<BUILD>` | `KWHEEL_CUDA_CU129=/usr/local/cuda-12.9` |
//! | `$KWHEEL_TOOLCHAINS/<build>` | `$KWHEEL_TOOLCHAINS/cu129` |
//! | the user cache ([`crate::cache::cache_home`]) | `${XDG_CACHE_HOME:-$HOME/.cache}/kwheel/toolchains/cu129` |

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use crate::cache::cache_dir_from;
use crate::nvrtc::find_libnvrtc;
use crate::CudaBuild;

/// The environment variable that points every build at `$KWHEEL_TOOLCHAINS/<build>`.
pub const TOOLCHAINS_ENV: &str = "KWHEEL_TOOLCHAINS";

/// The variable that points one build at a toolkit: `KWHEEL_CUDA_CU129`.
pub fn toolchain_env_var(build: CudaBuild) -> String {
    format!("KWHEEL_CUDA_{}", build.to_string().to_uppercase())
}

/// Where `build`'s toolchain folder is, in this process's environment (see the module docs).
pub fn toolchain_dir(build: CudaBuild) -> PathBuf {
    toolchain_dir_from(build, |name| std::env::var_os(name))
}

/// [`toolchain_dir`] in the environment `env` describes.
pub fn toolchain_dir_from(build: CudaBuild, env: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    if let Some(dir) = env(&toolchain_env_var(build)).filter(|value| !value.is_empty()) {
        return PathBuf::from(dir);
    }
    cache_dir_from(env, TOOLCHAINS_ENV, "toolchains").join(build.to_string())
}

/// One header of each CUDA math library, by which a folder is known to hold that library's
/// headers: cuBLAS (with cuBLASLt), cuFFT, cuRAND, cuSOLVER, cuSPARSE.
pub const MATH_LIBRARY_HEADERS: [&str; 6] = [
    "cublas_v2.h",
    "cublasLt.h",
    "cufft.h",
    "curand.h",
    "cusolverDn.h",
    "cusparse.h",
];

/// The folders CUDA 12's math-library wheels (`nvidia-cublas-cu12`, …) install under `nvidia/`.
const CUDA_12_MATH_PACKAGES: [&str; 5] = ["cublas", "cufft", "curand", "cusolver", "cusparse"];

/// What a toolkit folder holds, found without running or loading anything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolkitLayout {
    /// The nvcc driver (`bin/nvcc`).
    pub nvcc: Option<PathBuf>,
    /// The assembler (`bin/ptxas`).
    pub ptxas: Option<PathBuf>,
    /// `libnvrtc.so.N` (`lib64/` or `lib/`), the newest major when there are several.
    pub nvrtc: Option<PathBuf>,
    /// The runtime headers, then CCCL, then the math libraries' folders.
    pub include_dirs: Vec<PathBuf>,
}

impl ToolkitLayout {
    /// The layout of `dir`, a pip `--target` folder of one CUDA build or a toolkit root: the
    /// folder and all its `nvidia/cu*` packages.
    pub fn scan(dir: &Path) -> ToolkitLayout {
        let mut components = vec![dir.to_path_buf()];
        components.extend(nvidia_components(&dir.join("nvidia"), |name| {
            name.starts_with("cu")
        }));
        ToolkitLayout::of_components(&components)
    }

    /// The layout of CUDA `major`'s packages in `nvidia_dir` (a site-packages' `nvidia/`, which
    /// may hold several releases): `cu13/` for CUDA 13 and later, `cuda_*/` and the math
    /// libraries' `cublas/`, `cufft/`, `curand/`, `cusolver/`, `cusparse/` for CUDA 12 (and for
    /// an unknown major).
    pub fn scan_release(nvidia_dir: &Path, major: Option<u32>) -> ToolkitLayout {
        let wanted = |name: &str| match major {
            Some(major) if major >= 13 => name == format!("cu{major}"),
            _ => name.starts_with("cuda_") || CUDA_12_MATH_PACKAGES.contains(&name),
        };
        ToolkitLayout::of_components(&nvidia_components(nvidia_dir, wanted))
    }

    /// The layout of `components`, in order: the first that has a file wins.
    pub fn of_components(components: &[PathBuf]) -> ToolkitLayout {
        let mut layout = ToolkitLayout::default();
        let mut runtime = None;
        let mut cccl = None;
        let mut math = Vec::new();
        for component in components {
            let bin = component.join("bin");
            if layout.nvcc.is_none() && bin.join("nvcc").is_file() {
                layout.nvcc = Some(bin.join("nvcc"));
            }
            if layout.ptxas.is_none() && bin.join("ptxas").is_file() {
                layout.ptxas = Some(bin.join("ptxas"));
            }
            if layout.nvrtc.is_none() {
                layout.nvrtc = ["lib64", "lib"]
                    .iter()
                    .find_map(|lib| find_libnvrtc(&component.join(lib)));
            }
            let include = component.join("include");
            if MATH_LIBRARY_HEADERS
                .iter()
                .any(|header| include.join(header).is_file())
            {
                math.push(include.clone());
            }
            if runtime.is_none() && include.join("cuda_runtime.h").is_file() {
                runtime = Some(include.clone());
            }
            if cccl.is_none() {
                if include.join("cccl").join("cub").is_dir() {
                    cccl = Some(include.join("cccl"));
                } else if include.join("cub").is_dir() {
                    cccl = Some(include);
                }
            }
        }
        for dir in [runtime, cccl].into_iter().flatten().chain(math) {
            if !layout.include_dirs.contains(&dir) {
                layout.include_dirs.push(dir);
            }
        }
        layout
    }
}

/// The folders in `nvidia_dir` whose names `wanted` accepts, in name order.
fn nvidia_components(nvidia_dir: &Path, wanted: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(nvidia_dir) else {
        return Vec::new();
    };
    let mut components: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.path().is_dir())
        .filter(|entry| entry.file_name().to_str().is_some_and(&wanted))
        .map(|entry| entry.path())
        .collect();
    components.sort();
    components
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, b"").unwrap();
    }

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| OsString::from(value))
        }
    }

    #[test]
    fn toolchain_dir_prefers_the_per_build_variable_then_the_cache() {
        let cu129: CudaBuild = "cu129".parse().unwrap();
        let cu130: CudaBuild = "cu130".parse().unwrap();
        let pairs = [
            ("KWHEEL_CUDA_CU129", "/opt/cuda-12.9"),
            ("KWHEEL_TOOLCHAINS", "/toolchains"),
        ];
        assert_eq!(
            toolchain_dir_from(cu129, env(&pairs)),
            PathBuf::from("/opt/cuda-12.9")
        );
        assert_eq!(
            toolchain_dir_from(cu130, env(&pairs)),
            PathBuf::from("/toolchains/cu130")
        );
        let pairs = [("HOME", "/home/me"), ("KWHEEL_TOOLCHAINS", "")];
        assert_eq!(
            toolchain_dir_from(cu129, env(&pairs)),
            PathBuf::from("/home/me/.cache/kwheel/toolchains/cu129")
        );
        let pairs = [("HOME", "/home/me"), ("XDG_CACHE_HOME", "/cache")];
        assert_eq!(
            toolchain_dir_from(cu130, env(&pairs)),
            PathBuf::from("/cache/kwheel/toolchains/cu130")
        );
        let pairs = [("HOME", "home/me"), ("XDG_CACHE_HOME", "cache")];
        assert_eq!(
            toolchain_dir_from(cu130, env(&pairs)),
            PathBuf::from(crate::cache::UNWRITABLE_CACHE_HOME).join("kwheel/toolchains/cu130")
        );
    }

    #[test]
    fn a_pip_target_of_each_release_is_understood() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for file in [
            "cu130/nvidia/cu13/bin/nvcc",
            "cu130/nvidia/cu13/bin/ptxas",
            "cu130/nvidia/cu13/lib/libnvrtc.so.13",
            "cu130/nvidia/cu13/include/cuda_runtime.h",
            "cu130/nvidia/cu13/include/cccl/cub/cub.cuh",
            "cu129/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
            "cu129/nvidia/cuda_runtime/include/cuda_runtime.h",
            "cu129/nvidia/cuda_cccl/include/cub/cub.cuh",
            "cu129/nvidia/cuda_nvcc/bin/ptxas",
            "cu130/nvidia/cu13/include/cublas_v2.h",
            "cu130/nvidia/cu13/include/cusparse.h",
            "cu129/nvidia/cusparse/include/cusparse.h",
            "cu129/nvidia/cublas/include/cublasLt.h",
            "cu129/nvidia/cublas/include/cublas_v2.h",
            "cu129/nvidia/cufft/include/cufft.h",
        ] {
            touch(&root.join(file));
        }
        let cu13 = root.join("cu130/nvidia/cu13");
        assert_eq!(
            ToolkitLayout::scan(&root.join("cu130")),
            ToolkitLayout {
                nvcc: Some(cu13.join("bin/nvcc")),
                ptxas: Some(cu13.join("bin/ptxas")),
                nvrtc: Some(cu13.join("lib/libnvrtc.so.13")),
                include_dirs: vec![cu13.join("include"), cu13.join("include/cccl")],
            }
        );
        let nvidia = root.join("cu129/nvidia");
        let cu12 = ToolkitLayout {
            nvcc: None,
            ptxas: Some(nvidia.join("cuda_nvcc/bin/ptxas")),
            nvrtc: Some(nvidia.join("cuda_nvrtc/lib/libnvrtc.so.12")),
            include_dirs: vec![
                nvidia.join("cuda_runtime/include"),
                nvidia.join("cuda_cccl/include"),
                nvidia.join("cublas/include"),
                nvidia.join("cufft/include"),
                nvidia.join("cusparse/include"),
            ],
        };
        assert_eq!(ToolkitLayout::scan(&root.join("cu129")), cu12);
        assert_eq!(ToolkitLayout::scan_release(&nvidia, Some(12)), cu12);
        assert_eq!(
            ToolkitLayout::scan_release(&nvidia, Some(13)),
            ToolkitLayout::default()
        );
    }

    #[test]
    fn a_toolkit_root_is_understood() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for file in [
            "bin/nvcc",
            "lib64/libnvrtc.so",
            "lib64/libnvrtc.so.12",
            "lib64/libnvrtc.so.12.9.86",
            "include/cuda_runtime.h",
            "include/cub/cub.cuh",
        ] {
            touch(&root.join(file));
        }
        let layout = ToolkitLayout::scan(root);
        assert_eq!(layout.nvcc, Some(root.join("bin/nvcc")));
        assert_eq!(layout.nvrtc, Some(root.join("lib64/libnvrtc.so.12")));
        // The runtime headers and CCCL in one folder: listed once.
        assert_eq!(layout.include_dirs, vec![root.join("include")]);
    }
}
