//! Finding a compiler for the JIT: the places in the module docs of [`crate::jit`], first match
//! per place, ranked by the runtime's CUDA build and what the driver runs.

use super::*;
use crate::compile::ToolkitLayout;

/// A compiler the search found, before it is loaded or run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// NVRTC or nvcc.
    pub kind: CompilerKind,
    /// The library or executable: a path, or for the system library path a bare file name.
    pub location: PathBuf,
    /// Where the search found it: `KWHEEL_NVRTC`, `site-packages`, `CUDA_HOME`, `system`,
    /// `PATH`.
    pub origin: &'static str,
    /// The exact version, when known without loading or running it.
    pub version: Option<String>,
    /// The CUDA major version its file name tells (`libnvrtc.so.12` → 12).
    pub major: Option<u32>,
    /// The toolkit headers to compile with (NVRTC only): runtime headers, then CCCL.
    pub include_dirs: Vec<PathBuf>,
}

impl Candidate {
    /// The CUDA `(major, minor)` of the exact version, when known.
    fn cuda_version(&self) -> Option<(u32, u32)> {
        let build = CudaBuild::from_version(self.version.as_deref()?).ok()?;
        Some((build.major, build.minor))
    }

    /// Whether the driver can load what it builds, as far as is known before loading it.
    fn fits(&self, driver: Option<DriverVersion>) -> bool {
        let Some(driver) = driver else { return true };
        match (self.cuda_version(), self.major) {
            (Some(version), _) => version <= (driver.major, driver.minor),
            (None, Some(major)) => major <= driver.major,
            (None, None) => true,
        }
    }

    fn describe(&self) -> String {
        match &self.version {
            Some(version) => format!(
                "{} {version} ({}, {})",
                self.kind,
                self.location.display(),
                self.origin
            ),
            None => format!(
                "{} ({}, {})",
                self.kind,
                self.location.display(),
                self.origin
            ),
        }
    }
}

/// Where to look for a compiler; see the module docs for the order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompilerSearch {
    /// `KWHEEL_NVRTC`: one libnvrtc, tried first.
    pub nvrtc: Option<PathBuf>,
    /// site-packages directories holding NVIDIA's `nvidia/` packages, in order.
    pub site_packages: Vec<PathBuf>,
    /// A CUDA toolkit root (`CUDA_HOME`, `CUDA_PATH`, else `/usr/local/cuda`).
    pub cuda_home: Option<PathBuf>,
    /// `PATH`, for nvcc.
    pub path: Option<OsString>,
    /// Whether to try libnvrtc by name on the system library path.
    pub system_library_path: bool,
}

impl CompilerSearch {
    /// The search this process's environment describes.
    pub fn from_env() -> CompilerSearch {
        search_from(|name| std::env::var_os(name))
    }

    /// Every compiler that exists where the search looks, in search order. Nothing is loaded
    /// or run; NVRTC versions come from package metadata where it is.
    pub fn candidates(&self) -> Vec<Candidate> {
        let mut candidates = Vec::new();
        if let Some(library) = &self.nvrtc {
            if library.is_file() {
                candidates.push(nvrtc_candidate(library, NVRTC_ENV));
            }
        }
        for site_packages in &self.site_packages {
            for relative in [
                "nvidia/cu13/lib/libnvrtc.so.13",
                "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
            ] {
                let library = site_packages.join(relative);
                if library.is_file() {
                    candidates.push(nvrtc_candidate(&library, "site-packages"));
                }
            }
        }
        if let Some(root) = &self.cuda_home {
            for lib in ["lib64", "lib"] {
                if let Some(library) = nvrtc::find_libnvrtc(&root.join(lib)) {
                    candidates.push(nvrtc_candidate(&library, "CUDA_HOME"));
                    break;
                }
            }
        }
        if self.system_library_path {
            for name in ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"] {
                candidates.push(Candidate {
                    kind: CompilerKind::Nvrtc,
                    location: PathBuf::from(name),
                    origin: "system",
                    version: None,
                    major: soname_major(Path::new(name)),
                    include_dirs: Vec::new(),
                });
            }
        }
        let mut nvccs = Vec::new();
        if let Some(root) = &self.cuda_home {
            nvccs.push((root.join("bin").join("nvcc"), "CUDA_HOME"));
        }
        for nvcc in crate::env::programs_on_path("nvcc", self.path.as_deref()) {
            nvccs.push((nvcc, "PATH"));
        }
        let mut seen = Vec::new();
        for (program, origin) in nvccs {
            let identity = fs::canonicalize(&program).unwrap_or_else(|_| program.clone());
            if program.is_file() && !seen.contains(&identity) {
                seen.push(identity);
                candidates.push(Candidate {
                    kind: CompilerKind::Nvcc,
                    location: program,
                    origin,
                    version: None,
                    major: None,
                    include_dirs: Vec::new(),
                });
            }
        }
        candidates
    }

    /// Finds, loads and returns the compiler to build for `build` on a driver supporting
    /// `driver` (`None`: no driver to respect, as when compiling without a GPU).
    pub fn find(
        &self,
        build: CudaBuild,
        driver: Option<DriverVersion>,
    ) -> Result<JitCompiler, JitError> {
        let mut candidates = self.candidates();
        // Running `nvcc --version` costs tens of milliseconds: only when no NVRTC of the
        // runtime's build is at hand.
        let exact_nvrtc = candidates.iter().any(|candidate| {
            candidate.kind == CompilerKind::Nvrtc
                && candidate.fits(driver)
                && candidate.cuda_version() == Some((build.major, build.minor))
        });
        if !exact_nvrtc {
            for candidate in &mut candidates {
                if candidate.kind == CompilerKind::Nvcc {
                    candidate.version = nvcc_version(&candidate.location).ok();
                }
            }
        }
        let mut searched = self.places();
        for index in rank(&candidates, build, driver) {
            let candidate = &candidates[index];
            match JitCompiler::realize(candidate, driver) {
                Ok(compiler) => return Ok(compiler),
                Err(error) => searched.push(format!(
                    "{}: {}",
                    candidate.describe(),
                    describe_failure(&error)
                )),
            }
        }
        for candidate in &candidates {
            if !candidate.fits(driver) {
                searched.push(format!("{}: newer than the driver", candidate.describe()));
            }
        }
        Err(JitError::NoCompiler {
            build,
            driver,
            searched,
        })
    }

    /// The places the search looks, for the message when nothing is found.
    fn places(&self) -> Vec<String> {
        let show = |path: &Option<PathBuf>| match path {
            Some(path) => path.display().to_string(),
            None => "unset".to_owned(),
        };
        let site_packages: Vec<String> = self
            .site_packages
            .iter()
            .map(|dir| dir.display().to_string())
            .collect();
        let mut places = vec![
            format!("looked in {NVRTC_ENV} ({})", show(&self.nvrtc)),
            format!(
                "site-packages ({})",
                if site_packages.is_empty() {
                    "none known: set VIRTUAL_ENV or KWHEEL_SITE_PACKAGES".to_owned()
                } else {
                    site_packages.join(", ")
                }
            ),
            format!("CUDA_HOME ({})", show(&self.cuda_home)),
        ];
        if self.system_library_path {
            places.push("the system library path".to_owned());
        }
        places.push("nvcc on PATH".to_owned());
        places
    }
}

pub(super) fn search_from(env: impl Fn(&str) -> Option<OsString>) -> CompilerSearch {
    let site_packages = crate::site::environment_site_packages(&env);
    let env = |name: &str| env(name).filter(|value| !value.is_empty());
    let cuda_home = env("CUDA_HOME")
        .or_else(|| env("CUDA_PATH"))
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from("/usr/local/cuda")));
    CompilerSearch {
        nvrtc: env(NVRTC_ENV).map(PathBuf::from),
        site_packages,
        cuda_home,
        path: env("PATH"),
        system_library_path: true,
    }
}

/// The order to try candidates in: those whose CUDA version is the runtime's build first
/// (search order), then the rest the driver supports by version, newest first, then those of
/// unknown version. Candidates newer than the driver are left out.
pub(super) fn rank(
    candidates: &[Candidate],
    build: CudaBuild,
    driver: Option<DriverVersion>,
) -> Vec<usize> {
    let fitting: Vec<usize> = (0..candidates.len())
        .filter(|&index| candidates[index].fits(driver))
        .collect();
    let exact: Vec<usize> = fitting
        .iter()
        .copied()
        .filter(|&index| candidates[index].cuda_version() == Some((build.major, build.minor)))
        .collect();
    let mut known: Vec<usize> = fitting
        .iter()
        .copied()
        .filter(|index| !exact.contains(index) && candidates[*index].cuda_version().is_some())
        .collect();
    // Stable: equal versions keep search order.
    known.sort_by(|&a, &b| {
        candidates[b]
            .cuda_version()
            .cmp(&candidates[a].cuda_version())
    });
    let unknown = fitting
        .iter()
        .copied()
        .filter(|&index| candidates[index].cuda_version().is_none());
    exact.iter().copied().chain(known).chain(unknown).collect()
}

pub(super) fn soname_major(library: &Path) -> Option<u32> {
    library
        .file_name()?
        .to_str()?
        .strip_prefix("libnvrtc.so.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// A libnvrtc at `library`, with its version from package metadata and its toolkit headers.
pub(super) fn nvrtc_candidate(library: &Path, origin: &'static str) -> Candidate {
    let major = soname_major(library);
    // `<site-packages>/nvidia/<component>/lib/libnvrtc.so.N`, or `<toolkit>/lib64/libnvrtc.so.N`.
    let component = library.parent().and_then(Path::parent);
    let nvidia_dir = component
        .and_then(Path::parent)
        .filter(|dir| dir.file_name().is_some_and(|name| name == "nvidia"));
    let (version, layout) = match (component, nvidia_dir) {
        (Some(_), Some(nvidia_dir)) => {
            let site_packages = nvidia_dir.parent().unwrap_or(nvidia_dir);
            (
                nvrtc_package_version(site_packages, major),
                ToolkitLayout::scan_release(nvidia_dir, major),
            )
        }
        (Some(root), None) => (
            nvrtc_package_version(root, None),
            ToolkitLayout::of_components(&[root.to_path_buf()]),
        ),
        _ => (None, ToolkitLayout::default()),
    };
    Candidate {
        kind: CompilerKind::Nvrtc,
        location: library.to_path_buf(),
        origin,
        version,
        major,
        include_dirs: layout.include_dirs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jit::tests::{env, touch};

    #[test]
    fn search_reads_site_packages_from_the_environment() {
        let venv = tempfile::tempdir().unwrap();
        for python in ["python3.11", "python3.12"] {
            fs::create_dir_all(venv.path().join("lib").join(python).join("site-packages")).unwrap();
        }
        let venv_path = venv.path().to_str().unwrap();
        let pairs = [
            ("KWHEEL_SITE_PACKAGES", "/extra/a:/extra/b"),
            ("VIRTUAL_ENV", venv_path),
            ("KWHEEL_NVRTC", "/x/libnvrtc.so.13"),
            ("CUDA_HOME", "/opt/cuda"),
            ("PATH", "/usr/bin"),
        ];
        let search = search_from(env(&pairs));
        assert_eq!(search.nvrtc, Some(PathBuf::from("/x/libnvrtc.so.13")));
        assert_eq!(
            search.site_packages,
            [
                PathBuf::from("/extra/a"),
                PathBuf::from("/extra/b"),
                venv.path().join("lib/python3.12/site-packages"),
                venv.path().join("lib/python3.11/site-packages"),
            ]
        );
        assert_eq!(search.cuda_home, Some(PathBuf::from("/opt/cuda")));
        let search = search_from(env(&[]));
        assert_eq!(search.cuda_home, Some(PathBuf::from("/usr/local/cuda")));
        assert!(search.system_library_path);
    }

    /// A site-packages with the CUDA 13 and 12 NVRTC wheels as pip lays them out.
    fn site_packages() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for file in [
            "nvidia/cu13/lib/libnvrtc.so.13",
            "nvidia/cu13/include/cuda_runtime.h",
            "nvidia/cu13/include/cccl/cub/cub.cuh",
            "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
            "nvidia/cuda_runtime/include/cuda_runtime.h",
            "nvidia/cuda_cccl/include/cub/cub.cuh",
        ] {
            touch(&root.join(file));
        }
        fs::create_dir_all(root.join("nvidia_cuda_nvrtc-13.0.88.dist-info")).unwrap();
        let cu12 = root.join("nvidia_cuda_nvrtc_cu12-12.9.86.dist-info");
        fs::create_dir_all(&cu12).unwrap();
        fs::write(
            cu12.join("METADATA"),
            "Metadata-Version: 2.1\nName: nvidia-cuda-nvrtc-cu12\nVersion: 12.9.86\n\n",
        )
        .unwrap();
        dir
    }

    #[test]
    fn wheel_candidates_carry_their_version_and_headers() {
        let dir = site_packages();
        let root = dir.path();
        let search = CompilerSearch {
            site_packages: vec![root.to_path_buf()],
            ..CompilerSearch::default()
        };
        let candidates = search.candidates();
        assert_eq!(candidates.len(), 2, "{candidates:#?}");
        assert_eq!(candidates[0].version.as_deref(), Some("13.0.88"));
        assert_eq!(
            candidates[0].include_dirs,
            [
                root.join("nvidia/cu13/include"),
                root.join("nvidia/cu13/include/cccl")
            ]
        );
        assert_eq!(candidates[1].version.as_deref(), Some("12.9.86"));
        assert_eq!(
            candidates[1].include_dirs,
            [
                root.join("nvidia/cuda_runtime/include"),
                root.join("nvidia/cuda_cccl/include")
            ]
        );
    }

    #[test]
    fn toolkit_and_path_candidates_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        touch(&root.join("lib64/libnvrtc.so.12"));
        touch(&root.join("lib64/libnvrtc.so.12.9.86"));
        touch(&root.join("include/cuda_runtime.h"));
        touch(&root.join("bin/nvcc"));
        fs::write(
            root.join("version.json"),
            r#"{"cuda_nvrtc": {"version": "12.9.86"}}"#,
        )
        .unwrap();
        let search = CompilerSearch {
            cuda_home: Some(root.to_path_buf()),
            path: Some(std::env::join_paths([root.join("bin")]).unwrap()),
            system_library_path: true,
            ..CompilerSearch::default()
        };
        let found: Vec<(CompilerKind, PathBuf, &str, Option<String>)> = search
            .candidates()
            .into_iter()
            .map(|c| (c.kind, c.location, c.origin, c.version))
            .collect();
        assert_eq!(
            found,
            [
                (
                    CompilerKind::Nvrtc,
                    root.join("lib64/libnvrtc.so.12"),
                    "CUDA_HOME",
                    Some("12.9.86".to_owned())
                ),
                (CompilerKind::Nvrtc, "libnvrtc.so.13".into(), "system", None),
                (CompilerKind::Nvrtc, "libnvrtc.so.12".into(), "system", None),
                (CompilerKind::Nvrtc, "libnvrtc.so".into(), "system", None),
                // The same nvcc through CUDA_HOME and PATH is one candidate.
                (CompilerKind::Nvcc, root.join("bin/nvcc"), "CUDA_HOME", None),
            ]
        );
    }

    fn candidate(kind: CompilerKind, version: Option<&str>, major: Option<u32>) -> Candidate {
        Candidate {
            kind,
            location: PathBuf::from(format!("{kind}-{version:?}")),
            origin: "test",
            version: version.map(str::to_owned),
            major,
            include_dirs: Vec::new(),
        }
    }

    #[test]
    fn the_runtime_build_wins_then_the_newest_the_driver_runs() {
        let candidates = [
            candidate(CompilerKind::Nvrtc, Some("13.0.88"), Some(13)),
            candidate(CompilerKind::Nvrtc, Some("12.9.86"), Some(12)),
            candidate(CompilerKind::Nvrtc, None, Some(13)),
            candidate(CompilerKind::Nvcc, Some("12.8.93"), None),
            candidate(CompilerKind::Nvcc, Some("13.0.88"), None),
        ];
        let cu129: CudaBuild = "cu129".parse().unwrap();
        let cu130: CudaBuild = "cu130".parse().unwrap();
        let driver = |text: &str| Some(DriverVersion::parse(text).unwrap());
        assert_eq!(rank(&candidates, cu130, driver("13.0")), [0, 4, 1, 3, 2]);
        assert_eq!(rank(&candidates, cu129, driver("13.0")), [1, 0, 4, 3, 2]);
        // A 12.9 driver cannot run CUDA 13 cubins: those compilers are never tried.
        assert_eq!(rank(&candidates, cu130, driver("12.9")), [1, 3]);
        assert_eq!(rank(&candidates, cu129, None), [1, 0, 4, 3, 2]);
    }

    #[test]
    fn nothing_found_lists_every_place() {
        let search = CompilerSearch {
            site_packages: vec![PathBuf::from("/nonexistent/site-packages")],
            ..CompilerSearch::default()
        };
        let error = search
            .find(
                "cu130".parse().unwrap(),
                Some(DriverVersion::parse("13.0").unwrap()),
            )
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "no CUDA compiler for cu130 (driver supports CUDA 13.0) was found: looked in \
             KWHEEL_NVRTC (unset); site-packages (/nonexistent/site-packages); CUDA_HOME \
             (unset); nvcc on PATH; install the NVRTC package that matches torch's CUDA (as \
             PyTorch's own dependencies do), or set KWHEEL_NVRTC to a libnvrtc.so"
        );
    }
}
