//! The kernel library's wheel: its Python package with the bundle inside, after making sure
//! the bundle was built from the sources as they are now.
//!
//! ```text
//! kernels/kernels.toml             [library] package, version, torch, python-package
//! kernels/python/af3_kernels/  ─┐
//! target/kwheel/_prebuilt/     ─┴─► af3_kernels-0.1.0-py3-none-manylinux_2_28_x86_64.manylinux_2_28_aarch64.whl
//!                                   ├── af3_kernels/__init__.py
//!                                   ├── af3_kernels/_prebuilt/{kernels.idx, dictionary.zdict,
//!                                   │                          artifacts/, sources/}
//!                                   └── af3_kernels-0.1.0.dist-info/
//! ```
//!
//! | step | what happens |
//! | --- | --- |
//! | bundle missing | `bundler::bundle_kernels` builds it first (same defaults as `dev bundle-kernels`) |
//! | bundle present | every kernel is planned again (include graph, inputs, compilers found now, torch pin) and compared with the index; any difference refuses the build, naming the kernel and the input |
//! | artifacts | every variant is decompressed and checked against its digest before packing |
//! | sources | shipped under `_prebuilt/sources/` unless turned off, in which case the JIT fallback has nothing to compile |
//! | slim (`ship`) | only the variants the filter names keep their artifacts; the wheel's index still lists every variant and records the store the rest are fetched from (see [`crate::publish`]) |
//! | recipes only (`recipes_only`) | no bundle: an index with every kernel's key inputs and recipe but no variant, and the sources, so the first load JIT-compiles (what the build backend ships for an sdist or git install) |
//! | metadata | `Requires-Dist: torch==<pin>` (the manifest's, or the override) and `kwheel>=<this version>,<<next minor>>` |
//! | after writing | the wheel is verified as `kwheel wheel verify` would; a failure removes it |
//!
//! The wheel holds no native code (cubins are loaded by the driver through the `kwheel`
//! runtime), so one wheel serves both architectures the runtime is built for: its tags are
//! `py3-none-manylinux_2_28_x86_64.manylinux_2_28_aarch64`, any CPython 3 on glibc 2.28+
//! x86-64 or aarch64 (Grace Hopper, Grace Blackwell), the platforms the cubins' CUDA builds
//! ship for. The audit of both policies still runs, so a host ELF slipped into the package
//! fails the build (see `docs/wheel-format.md`).

use prebuilt::untrusted::Unreadable;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use bundler::explain::changes_since;
use bundler::pipeline::{plan_kernel, target_keys};
use bundler::{BuildToolchain, BundleOptions, BundleSummary, Manifest};
use prebuilt::bundle::{read_index, INDEX_FILE, SOURCES_DIR};
use prebuilt::lookup::{encode, LOOKUP_FILE};
use prebuilt::{Bundle, CudaBuild};

use crate::publish::ShipFilter;
use crate::tree::files_under;
use crate::verify::{verify_wheel, VerifyReport};
use crate::wheel::{write_wheel, Metadata, WheelFile, WheelFilename, WheelSpec, KWHEEL_VERSION};
use crate::{Error, StaleKernel};

mod layout;
use layout::python_package_files;
pub(crate) use layout::{check_file_inside, check_inside_root, python_package_dir};

/// Where `dev bundle-kernels` writes the bundle by default, relative to the working directory.
pub const DEFAULT_BUNDLE_DIR: &str = "target/kwheel/_prebuilt";

/// Where wheels are written by default, relative to the working directory.
pub const DEFAULT_WHEEL_DIR: &str = "target/kwheel/wheels";

/// The platform tag of a kernel library's wheel: both architectures of the `kwheel` runtime,
/// since the wheel holds no host code.
pub const PLATFORM_TAG: &str = "manylinux_2_28_x86_64.manylinux_2_28_aarch64";

/// The skip reason of every target in a recipes-only index: what `select()` and `dev
/// coverage` show for it.
pub const RECIPES_ONLY_REASON: &str = "this wheel was built from source (an sdist or git \
     install) and ships no cubins: load() compiles the kernel from the shipped sources on first \
     use (the JIT path)";

/// The Python versions a kernel library's wheel supports: those of the `kwheel` runtime
/// (`cp39-abi3`).
pub const REQUIRES_PYTHON: &str = ">=3.9";

/// The directory of the bundle inside the Python package.
pub const PREBUILT_DIR: &str = "_prebuilt";

/// What `dev build-wheel` does for the kernel library.
#[derive(Clone)]
pub struct LibraryWheelOptions {
    /// The kernel manifest.
    pub manifest: PathBuf,
    /// The bundle to ship; built first when it has no index.
    pub bundle: PathBuf,
    /// The directory the wheel is written to.
    pub out: PathBuf,
    /// Overrides the manifest's torch pin (`2.11.*`), for the bundle and `Requires-Dist`.
    pub torch: Option<String>,
    /// Ship the kernel sources, so the JIT fallback can compile what no cubin fits.
    pub ship_sources: bool,
    /// The build cache, used only when the bundle must be built.
    pub cache_dir: PathBuf,
    /// Parallel compile jobs, used only when the bundle must be built.
    pub jobs: usize,
    /// Who hears of the bundling's progress, when there is no bundle yet; with `None` the
    /// build also says nothing of bundling first.
    pub progress: Option<std::sync::Arc<dyn bundler::Progress>>,
    /// The toolchains to bundle and check keys with; `None` discovers the manifest's builds.
    pub toolchains: Option<Vec<BuildToolchain>>,
    /// Ship only these variants' artifacts (a slim wheel); `None` ships all.
    pub ship: Option<ShipFilter>,
    /// The store a slim wheel's index records; `None` takes the manifest's `[library] store`.
    pub store: Option<String>,
    /// Ship no cubins, only the sources and an index of recipes, so every kernel
    /// JIT-compiles on first load; nothing is bundled and no toolchain is needed.
    pub recipes_only: bool,
    /// The largest wheel file in bytes: what does not fit goes into companion part wheels
    /// ([`crate::wheel::parts`]); `None` takes the manifest's `[wheel] max-file-size`.
    pub max_file_size: Option<u64>,
    /// Warm packs to ship under the bundle's `packs/`, each verified against the bundle.
    pub packs: Vec<PathBuf>,
}

impl LibraryWheelOptions {
    /// Options with the defaults of `dev build-wheel` for the manifest at `manifest`.
    pub fn new(manifest: impl Into<PathBuf>) -> LibraryWheelOptions {
        LibraryWheelOptions {
            manifest: manifest.into(),
            bundle: PathBuf::from(DEFAULT_BUNDLE_DIR),
            out: PathBuf::from(DEFAULT_WHEEL_DIR),
            torch: None,
            ship_sources: true,
            cache_dir: bundler::cache::default_cache_dir(),
            jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
            progress: None,
            toolchains: None,
            ship: None,
            store: None,
            recipes_only: false,
            max_file_size: None,
            packs: Vec::new(),
        }
    }
}

/// A wheel that [`build_library_wheel`] wrote.
#[derive(Debug)]
pub struct BuiltWheel {
    /// The wheel.
    pub path: PathBuf,
    /// Its file name.
    pub filename: WheelFilename,
    /// The bundling run, when the bundle was missing and built first.
    pub bundled: Option<BundleSummary>,
    /// Files in the wheel, `.dist-info` included.
    pub files: usize,
    /// The wheel's size in bytes.
    pub size: u64,
    /// Its verification.
    pub report: VerifyReport,
    /// The companion part wheels it requires, when it was cut to a file size limit.
    pub parts: Vec<BuiltWheel>,
}

/// Builds the kernel library's wheel (see the module docs for the steps).
pub fn build_library_wheel(options: &LibraryWheelOptions) -> Result<BuiltWheel, Error> {
    let manifest = Manifest::load(&options.manifest)?;
    let package_dir = python_package_dir(&manifest)?;
    let torch = options
        .torch
        .clone()
        .unwrap_or_else(|| manifest.library.torch.clone());
    let import_name = package_dir
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    if options.recipes_only {
        check_inside_root(&manifest)?;
        let mut files = python_package_files(&manifest, &package_dir, &import_name)?;
        for file in &files {
            if let crate::wheel::Contents::Disk(path) = &file.contents {
                check_file_inside(&manifest, "library.python-package", &file.path, path)?;
            }
        }
        files.extend(recipe_files(
            &manifest,
            &torch,
            &format!("{import_name}/{PREBUILT_DIR}"),
        )?);
        return write_library_wheel(
            options,
            &manifest,
            &package_dir,
            &torch,
            files,
            None,
            PLATFORM_TAG,
        );
    }

    let bundled = if options.bundle.join(INDEX_FILE).is_file() {
        check_bundle_current(
            &manifest,
            &options.bundle,
            &torch,
            options.toolchains.as_deref(),
        )?;
        None
    } else {
        if options.progress.is_some() {
            tracing::info!(
                "no bundle at `{}`: bundling the kernels of `{}` first",
                options.bundle.display(),
                manifest.path.display()
            );
        }
        Some(bundler::bundle_kernels(&BundleOptions {
            jobs: options.jobs,
            torch: options.torch.clone(),
            progress: options.progress.clone(),
            toolchains: options.toolchains.clone(),
            ..BundleOptions::new(&options.manifest, &options.bundle, &options.cache_dir)
        })?)
    };

    let bundle = Bundle::open(&options.bundle)?;
    for (kernel, record) in &bundle.index().kernels {
        for variant in &record.variants {
            bundle.verify_artifact(kernel, variant)?;
        }
    }

    let store = slim_store(options, &manifest, bundle.index())?;
    let mut files = python_package_files(&manifest, &package_dir, &import_name)?;
    files.extend(bundle_files(
        &bundle,
        &format!("{import_name}/{PREBUILT_DIR}"),
        options.ship_sources,
        options.ship.as_ref(),
        store,
    )?);
    let root = format!("{import_name}/{PREBUILT_DIR}");
    let packs = crate::wheel::warm_pack_files(&bundle, &root, &options.packs)?;
    files.extend(packs);
    let tag = crate::modules::modules_platform_tag(&bundle)?;
    let tag = tag.as_deref().unwrap_or(PLATFORM_TAG);
    write_library_wheel(
        options,
        &manifest,
        &package_dir,
        &torch,
        files,
        bundled,
        tag,
    )
}

/// Writes and verifies the library's wheel from its files.
fn write_library_wheel(
    options: &LibraryWheelOptions,
    manifest: &Manifest,
    package_dir: &Path,
    torch: &str,
    files: Vec<WheelFile>,
    bundled: Option<BundleSummary>,
    platform_tag: &str,
) -> Result<BuiltWheel, Error> {
    let library = &manifest.library;
    let filename = WheelFilename::new(
        &library.package,
        &library.version,
        "py3",
        "none",
        platform_tag,
    )?;
    let metadata = Metadata {
        name: library.package.clone(),
        version: library.version.clone(),
        summary: Some(
            summary(package_dir)
                .unwrap_or_else(|| format!("Prebuilt CUDA kernels of {}", library.package)),
        ),
        requires_python: Some(REQUIRES_PYTHON.to_owned()),
        requires_dist: [kwheel_requirement(KWHEEL_VERSION)]
            .into_iter()
            .chain(torch_requirement(torch)?)
            .collect(),
    };
    let spec = WheelSpec {
        filename,
        metadata,
        files,
        out_dir: options.out.clone(),
        modified: None,
    };
    let limit = crate::wheel::parts::file_size_limit(options.max_file_size, manifest)?;
    match limit {
        Some(limit) => match crate::wheel::parts::split_wheel(&spec, limit)? {
            Some(set) => write_verified_set(set, bundled),
            None => write_verified_wheel(spec, bundled),
        },
        None => write_verified_wheel(spec, bundled),
    }
}

/// Writes the parts of a set, then its main wheel, whose verification checks the whole set;
/// a failure removes every wheel of the set written.
fn write_verified_set(
    set: crate::wheel::parts::WheelSet,
    bundled: Option<BundleSummary>,
) -> Result<BuiltWheel, Error> {
    let mut parts: Vec<BuiltWheel> = Vec::new();
    let remove = |parts: &[BuiltWheel]| {
        for part in parts {
            let _ = std::fs::remove_file(&part.path);
        }
    };
    for spec in set.parts {
        match write_verified_wheel(spec, None) {
            Ok(part) => parts.push(part),
            Err(error) => {
                remove(&parts);
                return Err(error);
            }
        }
    }
    match write_verified_wheel(set.main, bundled) {
        Ok(mut main) => {
            main.parts = parts;
            Ok(main)
        }
        Err(error) => {
            remove(&parts);
            Err(error)
        }
    }
}

/// The runtime a library's wheel needs: `kwheel` of this version or a later compatible one
/// (`kwheel>=0.1.0,<0.2` for 0.1.0; `kwheel>=1.2.0,<2` for 1.2.0), since the index format
/// and the loader's API change only with the minor version before 1.0, the major after.
pub fn kwheel_requirement(version: &str) -> String {
    let mut parts = version.split('.').map(|part| part.parse::<u64>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(0), Some(minor)) => format!("kwheel>={version},<0.{}", minor + 1),
        (Some(major), _) => format!("kwheel>={version},<{}", major + 1),
        _ => format!("kwheel=={version}"),
    }
}

/// The files of a recipes-only bundle under `root/`: an index that lists every kernel with
/// its key inputs, recipe and constants, no variant, and every target of the manifest's
/// matrix skipped with [`RECIPES_ONLY_REASON`]; and every source the JIT fallback compiles.
/// Precompiled-cubin kernels cannot be compiled, so they are refused.
pub fn recipe_files(manifest: &Manifest, torch: &str, root: &str) -> Result<Vec<WheelFile>, Error> {
    let mut index = prebuilt::Index {
        format: prebuilt::index::INDEX_FORMAT,
        package: manifest.library.package.clone(),
        torch: torch.to_owned(),
        store: None,
        dictionary: None,
        kernels: Default::default(),
        modules: Default::default(),
    };
    let mut sources = std::collections::BTreeMap::new();
    for (name, spec) in &manifest.kernels {
        let planned = plan_kernel(manifest, name, spec, &[])?;
        let Some(graph) = &planned.graph else {
            return Err(Error::PythonPackage {
                path: manifest.path.clone(),
                manifest: manifest.path.clone(),
                reason: format!(
                    "lists kernel `{name}` as precompiled cubins, which a wheel built from \
                     source cannot compile: build the wheel with `kwheel dev build-wheel`"
                ),
            });
        };
        for stable in graph.files().keys() {
            if let Some(path) = graph.absolute_path(stable) {
                check_file_inside(manifest, &format!("kernels.{name}"), stable, path)?;
                sources.insert(stable.clone(), path.to_owned());
            }
        }
        let mut skipped = Vec::new();
        for &cuda in &manifest.library.cuda_builds {
            for &arch in &manifest.library.archs {
                // The bundler's words for a target the manifest leaves out, so that tools
                // reading either index tell a declared skip from a missing cubin alike.
                skipped.push(
                    match bundler::pipeline::narrowed_away(spec.arch.as_deref(), arch) {
                        Some(declared) => prebuilt::index::Skip::new(arch, cuda, &declared),
                        None => prebuilt::index::Skip {
                            arch,
                            cuda,
                            kind: prebuilt::index::SkipKind::Unsupported,
                            reason: RECIPES_ONLY_REASON.to_owned(),
                        },
                    },
                );
            }
        }
        index.kernels.insert(
            name.clone(),
            prebuilt::KernelRecord {
                inputs: planned.inputs,
                recipe: planned.recipe,
                constants: spec.constants.clone(),
                variants: Vec::new(),
                skipped,
            },
        );
    }
    index.format = index.required_format();
    let mut files = vec![WheelFile::from_bytes(
        format!("{root}/{LOOKUP_FILE}"),
        encode(&index),
    )];
    for (stable, path) in sources {
        files.push(WheelFile::from_disk(
            format!("{root}/{SOURCES_DIR}/{stable}"),
            path,
        )?);
    }
    Ok(files)
}

/// The wheel's requirement on torch for a pin: `torch==2.13.*` for `2.13.*`, `torch>=2.9` for
/// `>=2.9`, none for `none` ([`prebuilt::select::TorchPin`], the loader's reading of the same
/// pin).
pub fn torch_requirement(pin: &str) -> Result<Option<String>, Error> {
    prebuilt::select::TorchPin::parse(pin)
        .map(|pin| pin.requirement())
        .map_err(|error| Error::Bundler(Box::new(bundler::Error::TorchPin(error))))
}

/// Refuses a bundle whose keys do not match the manifest's kernels as they are now: changed
/// or added or removed files of an include graph, entries, defines, flags, C++ standard, the
/// torch pin, a compiler's version, or the key definition itself. Kernels in the bundle that
/// the manifest no longer has are stale too.
///
/// Compilers are compared for the CUDA builds whose toolchain is found (or given); the other
/// builds are compared on everything else.
pub fn check_bundle_current(
    manifest: &Manifest,
    bundle: &Path,
    torch: &str,
    toolchains: Option<&[BuildToolchain]>,
) -> Result<(), Error> {
    let index = read_index(bundle)?;
    if index.package != manifest.library.package {
        return Err(Error::PackageMismatch {
            bundle: bundle.to_owned(),
            found: index.package,
            expected: manifest.library.package.clone(),
        });
    }
    if std::fs::read(bundle.join(LOOKUP_FILE)).ok() != Some(encode(&index)) {
        return Err(Error::LoaderIndex {
            bundle: bundle.to_owned(),
        });
    }
    let needs_compiler = manifest.kernels.values().any(|k| k.cubins.is_empty());
    let found: Vec<(CudaBuild, Option<BuildToolchain>)> = manifest
        .library
        .cuda_builds
        .iter()
        .map(|&build| {
            let toolchain = match toolchains {
                Some(given) => given.iter().find(|t| t.build == build).cloned(),
                None if needs_compiler => BuildToolchain::discover(build).ok(),
                None => None,
            };
            (build, toolchain)
        })
        .collect();
    let external_dirs: Vec<PathBuf> = found
        .iter()
        .filter_map(|(_, toolchain)| toolchain.as_ref())
        .flat_map(|toolchain| toolchain.include_dirs.iter().cloned())
        .collect();

    let mut stale = StaleKernel::of_each(
        &manifest.kernels,
        &index.kernels,
        |name, spec| {
            let planned = plan_kernel(manifest, name, spec, &external_dirs)?;
            let toolchains: Vec<(CudaBuild, Result<&BuildToolchain, String>)> = found
                .iter()
                .map(|(build, toolchain)| {
                    let toolchain = toolchain.as_ref();
                    (
                        *build,
                        toolchain.ok_or_else(|| format!("no toolchain for {build}")),
                    )
                })
                .collect();
            let targets = target_keys(manifest, spec, &planned, torch, &toolchains);
            let mut changes = changes_since(&index, name, &planned.inputs, torch, &targets);
            if changes.is_empty() {
                // Inputs, torch and compilers agree; a different key means its definition changed.
                let record = &index.kernels[name];
                for target in &targets {
                    let Ok((_, key)) = &target.key else { continue };
                    let recorded = record
                        .variants
                        .iter()
                        .find(|v| v.cuda == target.build && v.arch == target.arch);
                    if let Some(variant) = recorded.filter(|v| v.key != key.0) {
                        changes.push(format!(
                            "key of {}/{}: {} → {} (the key definition changed)",
                            target.build,
                            target.arch,
                            short(&variant.key),
                            short(&key.0)
                        ));
                    }
                }
            }
            Ok(changes)
        },
        "in the bundle but no longer in the manifest",
    )?;
    stale.extend(crate::modules::stale_modules(manifest, &index)?);
    if stale.is_empty() {
        Ok(())
    } else {
        Err(Error::StaleBundle {
            bundle: bundle.to_owned(),
            stale,
        })
    }
}

fn short(key: &str) -> &str {
    &key[..12.min(key.len())]
}

/// The store a slim wheel records: `None` for a wheel that ships every artifact; else the
/// option's or the manifest's store, checked, and an error without one.
fn slim_store(
    options: &LibraryWheelOptions,
    manifest: &Manifest,
    index: &prebuilt::Index,
) -> Result<Option<String>, Error> {
    let Some(filter) = &options.ship else {
        return Ok(None);
    };
    filter.check(index)?;
    let left_out = index
        .kernels
        .values()
        .flat_map(|record| &record.variants)
        .filter(|variant| !filter.ships(variant))
        .count();
    if left_out == 0 {
        return Ok(None);
    }
    let store = options
        .store
        .clone()
        .or_else(|| manifest.library.store.clone())
        .ok_or_else(|| Error::NoStore {
            filter: filter.to_string(),
            left_out,
            manifest: manifest.path.clone(),
        })?;
    let store = prebuilt::fetch::normalize_store_url(&store).map_err(Box::new)?;
    Ok(Some(store))
}

/// The bundle's files under `root/`: the loader index (`kernels.idx`, which holds the whole
/// index: `index.json` stays in the bundle directory, for the build tools), the dictionary, the artifacts of the variants
/// `ship` keeps (all without a filter), and the sources unless left out. With a `store`, the
/// index is the bundle's with the store recorded.
fn bundle_files(
    bundle: &Bundle,
    root: &str,
    ship_sources: bool,
    ship: Option<&ShipFilter>,
    store: Option<String>,
) -> Result<Vec<WheelFile>, Error> {
    let index = bundle.index();
    let mut stored = BTreeSet::new();
    for record in index.kernels.values() {
        for variant in &record.variants {
            if ship.is_none_or(|filter| filter.ships(variant)) {
                stored.insert(variant.artifact.path.clone());
                // The prefix a shipped frame needs (a dictionary or a reference cubin) ships
                // with it.
                if let Some(family) = &variant.artifact.dictionary {
                    stored.extend(prebuilt::bundle::prefix_path(bundle.root(), family));
                }
            }
        }
    }
    if let Some(dictionary) = &index.dictionary {
        if !stored.is_empty() {
            stored.insert(dictionary.path.clone());
        }
    }
    // Modules ship whole, whatever `ship` keeps: the package's import loads them.
    for record in index.modules.values() {
        stored.extend(record.variants.iter().map(|v| v.artifact.path.clone()));
    }
    let mut files = Vec::new();
    if store.is_some() {
        let mut slim = index.clone();
        slim.set_store(store);
        files.push(WheelFile::from_bytes(
            format!("{root}/{LOOKUP_FILE}"),
            encode(&slim),
        ));
    } else {
        stored.insert(LOOKUP_FILE.to_owned());
    }
    for relative in stored {
        files.push(WheelFile::from_disk(
            format!("{root}/{relative}"),
            bundle.root().join(&relative),
        )?);
    }
    let sources = bundle.root().join(SOURCES_DIR);
    if ship_sources && sources.is_dir() {
        for (relative, path) in files_under(&sources, |_| true)? {
            files.push(WheelFile::from_disk(
                format!("{root}/{SOURCES_DIR}/{relative}"),
                path,
            )?);
        }
    }
    Ok(files)
}

/// The first line of the package's docstring, if `__init__.py` opens with one.
pub(crate) fn summary(package_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(package_dir.join("__init__.py")).ok()?;
    let mut lines = text
        .lines()
        .map(str::trim)
        .skip_while(|line| line.is_empty() || line.starts_with('#'));
    let first = lines.next()?;
    let first = first.trim_start_matches(['r', 'R', 'u', 'U']);
    let quote = ["\"\"\"", "'''"]
        .into_iter()
        .find(|quote| first.starts_with(quote))?;
    let rest = &first[quote.len()..];
    let line = if rest.trim().is_empty() {
        lines.next()?
    } else {
        rest
    };
    let line = line.split(quote).next().unwrap_or(line).trim();
    (!line.is_empty()).then(|| line.to_owned())
}

/// Writes a wheel, verifies it (removing it again if it fails), and describes it.
pub(crate) fn write_verified_wheel(
    spec: WheelSpec,
    bundled: Option<BundleSummary>,
) -> Result<BuiltWheel, Error> {
    let filename = spec.filename.clone();
    let file_count = spec.files.len() + 3;
    let path = write_wheel(&spec)?;
    let report = match verify_wheel(&path).and_then(VerifyReport::into_result) {
        Ok(report) => report,
        Err(error) => {
            let _ = std::fs::remove_file(&path);
            return Err(error);
        }
    };
    let size = std::fs::metadata(&path)
        .map_err(Unreadable::at(&path))?
        .len();
    Ok(BuiltWheel {
        path,
        filename,
        bundled,
        files: file_count,
        size,
        report,
        parts: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_requirement_admits_compatible_versions() {
        assert_eq!(kwheel_requirement("0.1.0"), "kwheel>=0.1.0,<0.2");
        assert_eq!(kwheel_requirement("0.12.3"), "kwheel>=0.12.3,<0.13");
        assert_eq!(kwheel_requirement("1.2.0"), "kwheel>=1.2.0,<2");
        assert_eq!(kwheel_requirement("dev"), "kwheel==dev");
    }

    #[test]
    fn torch_pins_become_requirements() {
        let requirement = |pin| torch_requirement(pin).unwrap();
        assert_eq!(requirement("2.13.*").unwrap(), "torch==2.13.*");
        assert_eq!(requirement("==2.11.*").unwrap(), "torch==2.11.*");
        assert_eq!(requirement(">=2.11,<2.14").unwrap(), "torch>=2.11, <2.14");
        assert_eq!(requirement("*").unwrap(), "torch");
        // A library whose kernels never touch torch requires none.
        assert_eq!(requirement("none"), None);
        let error = torch_requirement("latest").unwrap_err().to_string();
        assert!(error.starts_with("invalid torch pin `latest`"), "{error}");
    }

    #[test]
    fn summary_is_the_docstrings_first_line() {
        let dir = tempfile::tempdir().unwrap();
        let init = dir.path().join("__init__.py");
        std::fs::write(&init, "# comment\n\n\"\"\"Fast kernels.\n\nMore.\n\"\"\"\n").unwrap();
        assert_eq!(summary(dir.path()).as_deref(), Some("Fast kernels."));
        std::fs::write(&init, "'''\n  Kernels on a new line.\n'''\n").unwrap();
        assert_eq!(
            summary(dir.path()).as_deref(),
            Some("Kernels on a new line.")
        );
        std::fs::write(&init, "\"\"\"One line.\"\"\"\n").unwrap();
        assert_eq!(summary(dir.path()).as_deref(), Some("One line."));
        std::fs::write(&init, "import os\n").unwrap();
        assert_eq!(summary(dir.path()), None);
    }
}
