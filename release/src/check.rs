//! `kwheel release check`: the release checklist as one command.
//!
//! Each gate verifies one promise of a release and reports ✔, ✘ or a skip, with the reason and,
//! when it fails, the fix. A gate never crashes the check: a broken tree is a failing gate. The
//! check builds only what is missing (and says so); with `no_rebuild` a missing artifact is a
//! failure instead. The gates and the commands behind them are listed in
//! `docs/release-checklist.md`.
//!
//! | gate | passes when |
//! | --- | --- |
//! | `version` | the version is semver, above the last release, and stated the same everywhere |
//! | `bundle` | the bundle exists (or was just built) and covers the whole matrix or declares each skip |
//! | `keys` | every bundled key matches the current sources |
//! | `cubins` | every artifact verifies against its digest and validates as a cubin for its target |
//! | `reproducible` | two builds of the wheel are byte-identical |
//! | `wheel` | `wheel verify` and the manylinux audit pass on the wheel |
//! | `install` | the wheels install into a fresh venv and every kernel selects on simulated devices |
//! | `gpu` | with a GPU: every kernel loads prebuilt with the JIT disabled |
//! | `size` | the wheel is within the size budget |
//! | `publish` | optional: the artifacts and wheels are in the store and read back intact |

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use bundler::{BuildToolchain, Manifest};
use prebuilt::cubin::validate_cubin;
use prebuilt::error_chain;
use prebuilt::Bundle;
use serde::Serialize;

use crate::library::{build_library_wheel, check_bundle_current, LibraryWheelOptions};
use crate::verify::verify_wheel;

/// PyPI's default limit on one file, the default size budget.
pub const DEFAULT_SIZE_BUDGET: u64 = 100 * 1000 * 1000;

/// What `release check` checks.
#[derive(Clone)]
pub struct CheckOptions {
    /// The kernel manifest.
    pub manifest: PathBuf,
    /// The bundle.
    pub bundle: PathBuf,
    /// The directory holding the wheels.
    pub wheels: PathBuf,
    /// Override of the manifest's torch pin.
    pub torch: Option<String>,
    /// A missing bundle or wheel fails its gate instead of being built.
    pub no_rebuild: bool,
    /// Largest acceptable wheel, in bytes.
    pub size_budget: u64,
    /// Release tags are `<prefix><version>`.
    pub tag_prefix: String,
    /// The build cache, for what must be built.
    pub cache_dir: PathBuf,
    /// Parallel compile jobs, for what must be built.
    pub jobs: usize,
    /// Toolchains; `None` discovers them.
    pub toolchains: Option<Vec<BuildToolchain>>,
    /// The kwheel workspace to build the runtime wheel from when the wheel directory lacks
    /// one; `None` uses only a runtime wheel already there (and skips the install gate
    /// without one).
    pub runtime_workspace: Option<PathBuf>,
    /// The Python interpreter that makes the fresh environment.
    pub python: PathBuf,
    /// Publish the bundle's artifacts and the wheels to this store and verify them by
    /// download (the optional `publish` gate); `None` skips it.
    pub publish: Option<String>,
}

impl CheckOptions {
    /// The defaults of `kwheel release check` for the manifest at `manifest`.
    pub fn new(manifest: impl Into<PathBuf>) -> CheckOptions {
        let wheel = LibraryWheelOptions::new(PathBuf::new());
        CheckOptions {
            manifest: manifest.into(),
            bundle: wheel.bundle,
            wheels: wheel.out,
            torch: None,
            no_rebuild: false,
            size_budget: DEFAULT_SIZE_BUDGET,
            tag_prefix: "v".to_owned(),
            cache_dir: wheel.cache_dir,
            jobs: wheel.jobs,
            toolchains: None,
            runtime_workspace: crate::runtime::source_workspace(),
            python: PathBuf::from("python3"),
            publish: None,
        }
    }
}

/// How a gate ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GateStatus {
    /// The promise holds.
    Pass,
    /// The promise is broken.
    Fail,
    /// The gate could not run here (with the reason).
    Skip,
}

/// One line of the checklist.
#[derive(Clone, Debug, Serialize)]
pub struct Gate {
    /// The gate's name.
    pub name: &'static str,
    /// How it ended.
    pub status: GateStatus,
    /// What was found.
    pub reason: String,
    /// How to fix a failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// The whole checklist.
#[derive(Clone, Debug, Serialize)]
pub struct Checklist {
    /// The gates, in order.
    pub gates: Vec<Gate>,
    /// What the check built because it was missing.
    pub built: Vec<String>,
}

impl Checklist {
    /// Whether every gate passed or was skipped.
    pub fn passed(&self) -> bool {
        self.gates.iter().all(|g| g.status != GateStatus::Fail)
    }

    /// The gate named `name`.
    pub fn gate(&self, name: &str) -> Option<&Gate> {
        self.gates.iter().find(|g| g.name == name)
    }
}

impl fmt::Display for Checklist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for built in &self.built {
            writeln!(f, "  built {built}")?;
        }
        let width = self.gates.iter().map(|g| g.name.len()).max().unwrap_or(0);
        for gate in &self.gates {
            let mark = match gate.status {
                GateStatus::Pass => "✔",
                GateStatus::Fail => "✘",
                GateStatus::Skip => "-",
            };
            writeln!(f, "{mark} {:<width$}  {}", gate.name, gate.reason)?;
            if let Some(fix) = &gate.fix {
                writeln!(f, "  {:<width$}  fix: {fix}", "")?;
            }
        }
        let failed = self
            .gates
            .iter()
            .filter(|g| g.status == GateStatus::Fail)
            .count();
        if failed == 0 {
            writeln!(f, "release check passed")
        } else {
            writeln!(f, "release check failed: {failed} gate(s)")
        }
    }
}

struct Run {
    gates: Vec<Gate>,
    built: Vec<String>,
}

impl Run {
    fn pass(&mut self, name: &'static str, reason: impl Into<String>) {
        self.push(name, GateStatus::Pass, reason.into(), None);
    }

    fn fail(&mut self, name: &'static str, reason: impl Into<String>, fix: impl Into<String>) {
        self.push(name, GateStatus::Fail, reason.into(), Some(fix.into()));
    }

    fn skip(&mut self, name: &'static str, reason: impl Into<String>) {
        self.push(name, GateStatus::Skip, reason.into(), None);
    }

    fn push(
        &mut self,
        name: &'static str,
        status: GateStatus,
        reason: String,
        fix: Option<String>,
    ) {
        self.gates.push(Gate {
            name,
            status,
            reason,
            fix,
        });
    }
}

/// Runs every gate.
pub fn release_check(options: &CheckOptions) -> Checklist {
    let mut run = Run {
        gates: Vec::new(),
        built: Vec::new(),
    };
    let manifest = match Manifest::load(&options.manifest) {
        Ok(manifest) => manifest,
        Err(error) => {
            run.fail(
                "manifest",
                format!("{:#}", error_chain(&error)),
                "fix the manifest",
            );
            return Checklist {
                gates: run.gates,
                built: run.built,
            };
        }
    };
    let torch = options
        .torch
        .clone()
        .unwrap_or_else(|| manifest.library.torch.clone());

    check_version(&mut run, &manifest, &options.tag_prefix);
    let bundle = check_bundle(&mut run, &manifest, options, &torch);
    match &bundle {
        Some(bundle) => {
            check_keys(&mut run, &manifest, options, &torch);
            check_cubins(&mut run, bundle);
        }
        None => {
            for name in ["keys", "cubins"] {
                run.skip(name, "no bundle to check");
            }
        }
    }
    let wheel = if bundle.is_some() {
        check_reproducible(&mut run, options)
    } else {
        run.skip("reproducible", "no bundle to build wheels from");
        None
    };
    match &wheel {
        Some(wheel) => {
            check_wheel(&mut run, wheel);
            check_install(&mut run, &manifest, options, wheel);
        }
        None => {
            for name in ["wheel", "install"] {
                run.skip(name, "no wheel to check");
            }
        }
    }
    match &bundle {
        Some(bundle) => check_gpu(&mut run, bundle),
        None => run.skip("gpu", "no bundle to load from"),
    }
    match &wheel {
        Some(wheel) => check_size(&mut run, wheel, options.size_budget),
        None => run.skip("size", "no wheel to measure"),
    }
    match (&options.publish, &wheel) {
        (None, _) => run.skip(
            "publish",
            "optional: give --publish <store URL> to publish and verify",
        ),
        (Some(_), None) => run.skip("publish", "no wheel to publish"),
        (Some(store), Some(_)) if run.gates.iter().any(|g| g.status == GateStatus::Fail) => run
            .skip(
                "publish",
                format!("not publishing to {store}: an earlier gate failed"),
            ),
        (Some(store), Some(_)) => check_publish(&mut run, options, store),
    }
    Checklist {
        gates: run.gates,
        built: run.built,
    }
}

fn check_version(run: &mut Run, manifest: &Manifest, tag_prefix: &str) {
    let stated = &manifest.library.version;
    let version = match semver::Version::parse(stated) {
        Ok(version) => version,
        Err(error) => {
            return run.fail(
                "version",
                format!(
                    "`{stated}` in {} is not semver: {error}",
                    manifest.path.display()
                ),
                "state the version as MAJOR.MINOR.PATCH",
            )
        }
    };
    // Every other place the project states its version must agree.
    let mut places = vec![(manifest.path.display().to_string(), stated.clone())];
    if let Some(package) = &manifest.library.python_package {
        let init = manifest.root.join(package).join("__init__.py");
        if let Ok(text) = std::fs::read_to_string(&init) {
            if let Some(found) = python_version(&text) {
                places.push((init.display().to_string(), found));
            }
        }
    }
    let disagreeing: Vec<String> = places
        .iter()
        .filter(|(_, found)| found != stated)
        .map(|(place, found)| format!("{place} says {found}"))
        .collect();
    if !disagreeing.is_empty() {
        return run.fail(
            "version",
            format!("the manifest says {stated}, but {}", disagreeing.join(", ")),
            "state one version everywhere",
        );
    }
    match last_release(&manifest.root, tag_prefix) {
        Ok(Some((last, source))) if version <= last => run.fail(
            "version",
            format!("{version} is not above the last release {last} ({source})"),
            format!("raise `version` in {} above {last}", manifest.path.display()),
        ),
        Ok(Some((last, source))) => run.pass(
            "version",
            format!(
                "{version}, above the last release {last} ({source}), stated the same in {} place(s)",
                places.len()
            ),
        ),
        Ok(None) => run.pass(
            "version",
            format!(
                "{version}, the first release (no `{tag_prefix}*` tag), stated the same in {} place(s)",
                places.len()
            ),
        ),
        Err(reason) => run.fail("version", reason, "fix the release tags"),
    }
}

/// `__version__ = "…"` in a Python file.
fn python_version(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let rest = line.trim().strip_prefix("__version__")?.trim_start();
        let rest = rest.strip_prefix('=')?.trim();
        let quote = rest.chars().next().filter(|c| *c == '"' || *c == '\'')?;
        let inner = &rest[1..];
        Some(inner[..inner.find(quote)?].to_owned())
    })
}

/// The highest released version: the latest `<prefix>X.Y.Z` git tag, or, outside git, the
/// version recorded in `last-release` beside the manifest.
fn last_release(
    root: &Path,
    tag_prefix: &str,
) -> Result<Option<(semver::Version, String)>, String> {
    let output = std::process::Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["tag", "--list", &format!("{tag_prefix}*")])
        .output();
    match output {
        Ok(output) if output.status.success() => {
            let text = String::from_utf8_lossy(&output.stdout);
            Ok(text
                .lines()
                .filter_map(|tag| {
                    let version = semver::Version::parse(tag.strip_prefix(tag_prefix)?).ok()?;
                    Some((version, format!("tag {tag}")))
                })
                .max_by(|a, b| a.0.cmp(&b.0)))
        }
        _ => {
            let recorded = root.join("last-release");
            match std::fs::read_to_string(&recorded) {
                Ok(text) => semver::Version::parse(text.trim())
                    .map(|v| Some((v, recorded.display().to_string())))
                    .map_err(|error| format!("{}: not semver: {error}", recorded.display())),
                Err(_) => Ok(None),
            }
        }
    }
}

fn check_bundle(
    run: &mut Run,
    manifest: &Manifest,
    options: &CheckOptions,
    torch: &str,
) -> Option<Bundle> {
    let index = options.bundle.join(prebuilt::bundle::INDEX_FILE);
    if !index.is_file() {
        if options.no_rebuild {
            run.fail(
                "bundle",
                format!("no bundle at {} (--no-rebuild)", options.bundle.display()),
                "run `kwheel dev bundle-kernels`",
            );
            return None;
        }
        let bundled = bundler::bundle_kernels(&bundler::BundleOptions {
            manifest: options.manifest.clone(),
            out: options.bundle.clone(),
            cache_dir: options.cache_dir.clone(),
            jobs: options.jobs,
            only: Vec::new(),
            require: false,
            torch: Some(torch.to_owned()),
            progress: false,
            toolchains: options.toolchains.clone(),
        });
        match bundled {
            Ok(summary) => run.built.push(format!(
                "the missing bundle {} ({} compiled)",
                options.bundle.display(),
                summary.compiled.len()
            )),
            Err(error) => {
                run.fail(
                    "bundle",
                    format!(
                        "the bundle was missing and could not be built: {}",
                        error_chain(&error)
                    ),
                    "fix the build error, then run `kwheel dev bundle-kernels`",
                );
                return None;
            }
        }
    }
    let bundle = match Bundle::open(&options.bundle) {
        Ok(bundle) => bundle,
        Err(error) => {
            run.fail(
                "bundle",
                error_chain(&error),
                "rebuild it with `kwheel dev bundle-kernels`",
            );
            return None;
        }
    };
    let mut missing = Vec::new();
    let mut skips = 0;
    for (name, spec) in &manifest.kernels {
        let Some(record) = bundle.index().kernels.get(name) else {
            missing.push(format!("`{name}` (not in the bundle)"));
            continue;
        };
        let _ = spec;
        for build in &manifest.library.cuda_builds {
            for arch in &manifest.library.archs {
                let built = record
                    .variants
                    .iter()
                    .any(|v| v.cuda == *build && v.arch == *arch);
                let skipped = record
                    .skipped
                    .iter()
                    .find(|s| s.cuda == *build && s.arch == *arch && !s.reason.is_empty());
                if skipped.is_some() {
                    skips += 1;
                }
                if !built && skipped.is_none() {
                    missing.push(format!("`{name}` {build}/{arch}"));
                }
            }
        }
    }
    let cells =
        manifest.kernels.len() * manifest.library.cuda_builds.len() * manifest.library.archs.len();
    if missing.is_empty() {
        run.pass(
            "bundle",
            format!(
                "{} kernels × {} archs × {} CUDA builds: {} variants, {skips} declared skip(s) with reasons",
                manifest.kernels.len(),
                manifest.library.archs.len(),
                manifest.library.cuda_builds.len(),
                cells - skips
            ),
        );
    } else {
        run.fail(
            "bundle",
            format!(
                "the matrix has holes with no declared reason: {}",
                missing.join(", ")
            ),
            "rebuild with `kwheel dev bundle-kernels` (without --only)",
        );
    }
    Some(bundle)
}

fn check_keys(run: &mut Run, manifest: &Manifest, options: &CheckOptions, torch: &str) {
    match check_bundle_current(manifest, &options.bundle, torch, options.toolchains.as_deref()) {
        Ok(()) => run.pass("keys", "every bundled key matches the current sources"),
        Err(error) => run.fail(
            "keys",
            error_chain(&error),
            "rebuild with `kwheel dev bundle-kernels`; `kwheel dev explain <kernel> --against <bundle>` shows what changed",
        ),
    }
}

fn check_cubins(run: &mut Run, bundle: &Bundle) {
    let mut problems = Vec::new();
    let mut count = 0;
    for (name, record) in &bundle.index().kernels {
        for variant in &record.variants {
            count += 1;
            let symbols: Vec<&str> = variant
                .functions
                .iter()
                .map(|f| f.symbol.as_str())
                .collect();
            let checked = bundle
                .read_artifact(name, variant)
                .map_err(|e| error_chain(&e))
                .and_then(|cubin| {
                    validate_cubin(&cubin, variant.arch, &symbols)
                        .map_err(|e| format!("`{name}` ({}): {e}", variant.label()))
                });
            if let Err(problem) = checked {
                problems.push(problem);
            }
        }
    }
    if problems.is_empty() {
        run.pass(
            "cubins",
            format!("{count} cubins verify against their digests and validate for their targets"),
        );
    } else {
        run.fail(
            "cubins",
            problems.join("; "),
            "rebuild the bundle with `kwheel dev bundle-kernels` into a fresh directory",
        );
    }
}

/// Builds the wheel twice into scratch directories and compares; writes the release wheel
/// into the wheel directory only when it is missing. Returns the release wheel's path.
fn check_reproducible(run: &mut Run, options: &CheckOptions) -> Option<PathBuf> {
    let scratch = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(error) => {
            run.fail(
                "reproducible",
                format!("no scratch directory: {error}"),
                "free disk space",
            );
            return None;
        }
    };
    let build = |out: PathBuf| {
        build_library_wheel(&LibraryWheelOptions {
            manifest: options.manifest.clone(),
            bundle: options.bundle.clone(),
            out,
            torch: options.torch.clone(),
            ship_sources: true,
            cache_dir: options.cache_dir.clone(),
            jobs: options.jobs,
            progress: false,
            toolchains: options.toolchains.clone(),
            ship: None,
            store: None,
            recipes_only: false,
        })
    };
    let mut digests = Vec::new();
    for n in 0..2 {
        match build(scratch.path().join(format!("build-{n}"))) {
            Ok(built) => match std::fs::read(&built.path) {
                Ok(bytes) => digests.push((
                    built.filename.to_string(),
                    prebuilt::key::sha256_hex(&bytes),
                )),
                Err(error) => {
                    run.fail(
                        "reproducible",
                        format!("{}: {error}", built.path.display()),
                        "retry",
                    );
                    return None;
                }
            },
            Err(error) => {
                run.fail(
                    "reproducible",
                    format!("the wheel does not build: {}", error_chain(&error)),
                    "run `kwheel dev build-wheel` to see the error",
                );
                return None;
            }
        }
    }
    let (name, first) = digests[0].clone();
    if first != digests[1].1 {
        run.fail(
            "reproducible",
            format!(
                "two builds of {name} differ: sha256 {} and {}",
                &first[..12],
                &digests[1].1[..12]
            ),
            "find the nondeterministic input (a time, an unordered map, a host path)",
        );
        return None;
    }
    let released = options.wheels.join(&name);
    if !released.is_file() {
        if options.no_rebuild {
            run.fail(
                "reproducible",
                format!("no wheel {} (--no-rebuild)", released.display()),
                "run `kwheel dev build-wheel`",
            );
            return None;
        }
        if let Err(error) = std::fs::create_dir_all(&options.wheels)
            .and_then(|()| std::fs::copy(scratch.path().join("build-0").join(&name), &released))
        {
            run.fail(
                "reproducible",
                format!("{}: {error}", released.display()),
                "check permissions",
            );
            return None;
        }
        run.built
            .push(format!("the missing wheel {}", released.display()));
    }
    match std::fs::read(&released) {
        Ok(bytes) if prebuilt::key::sha256_hex(&bytes) == first => run.pass(
            "reproducible",
            format!("two builds of {name} are byte-identical (sha256 {}), and so is the wheel in {}", &first[..12], options.wheels.display()),
        ),
        Ok(bytes) => run.fail(
            "reproducible",
            format!(
                "{} (sha256 {}) differs from a fresh build of the same inputs (sha256 {}): it was edited or built from other inputs",
                released.display(),
                &prebuilt::key::sha256_hex(&bytes)[..12],
                &first[..12]
            ),
            "delete it and run `kwheel dev build-wheel`",
        ),
        Err(error) => run.fail("reproducible", format!("{}: {error}", released.display()), "rebuild it"),
    }
    Some(released)
}

fn check_wheel(run: &mut Run, wheel: &Path) {
    match verify_wheel(wheel) {
        Ok(report) if report.problems.is_empty() => run.pass(
            "wheel",
            format!(
                "{}: RECORD, tags, zip hygiene, {} bundle(s) and the manylinux_2_28 audit pass",
                wheel.display(),
                report.bundles.len()
            ),
        ),
        Ok(report) => run.fail(
            "wheel",
            report
                .problems
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join("; "),
            "rebuild the wheel with `kwheel dev build-wheel`",
        ),
        Err(error) => run.fail("wheel", error_chain(&error), "rebuild the wheel"),
    }
}

/// The simulated devices and CUDA builds the install gate selects for.
const SIMULATED: [(&str, &str); 4] = [
    ("sm_90", "12.9"),
    ("sm_90", "13.0"),
    ("sm_100", "12.9"),
    ("sm_100", "13.0"),
];

/// Installs the library wheel and the kwheel runtime wheel into a fresh virtual environment,
/// with no index, and asks the installed package to select every kernel for simulated
/// devices: each must select, or be refused only because its manifest declares the target
/// skipped.
fn check_install(run: &mut Run, manifest: &Manifest, options: &CheckOptions, wheel: &Path) {
    let runtime = match runtime_wheel(run, options) {
        Ok(Some(runtime)) => runtime,
        Ok(None) => return run.skip("install", "no kwheel runtime wheel and no kwheel sources to build one"),
        Err(reason) => {
            return run.fail(
                "install",
                reason,
                "run `kwheel release build-kwheel` (it builds kwheel's wheel with cargo zigbuild; `bash ci/setup` installs zig)",
            )
        }
    };
    let Some(module) = manifest
        .library
        .python_package
        .as_deref()
        .and_then(|p| Path::new(p).file_name())
        .map(|n| n.to_string_lossy().into_owned())
    else {
        return run.skip("install", "the manifest names no Python package");
    };
    match install_and_select(options, wheel, &runtime, &module) {
        Ok(summary) => run.pass("install", summary),
        Err(reason) => run.fail(
            "install",
            reason,
            "install both wheels into a fresh venv and call select() to see the error",
        ),
    }
}

/// The runtime wheel in the wheel directory, built there first when missing (and allowed).
fn runtime_wheel(run: &mut Run, options: &CheckOptions) -> Result<Option<PathBuf>, String> {
    let existing = std::fs::read_dir(&options.wheels).ok().and_then(|entries| {
        entries.flatten().map(|e| e.path()).find(|p| {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            // This machine's: the install gate runs it here.
            let host =
                crate::runtime::RuntimeArch::host().unwrap_or(crate::runtime::RuntimeArch::X86_64);
            crate::runtime::runtime_wheel_filename(host)
                .is_ok_and(|wheel| name == wheel.to_string())
        })
    });
    if let Some(existing) = existing {
        return Ok(Some(existing));
    }
    let Some(workspace) = &options.runtime_workspace else {
        return Ok(None);
    };
    if options.no_rebuild {
        return Err(format!(
            "no kwheel runtime wheel in {} (--no-rebuild)",
            options.wheels.display()
        ));
    }
    let built = crate::runtime::build_runtime_wheel(&crate::runtime::RuntimeWheelOptions::new(
        workspace,
        &options.wheels,
    ))
    .map_err(|error| format!("the runtime wheel does not build: {}", error_chain(&error)))?;
    run.built.push(format!(
        "the missing runtime wheel {}",
        built.path.display()
    ));
    Ok(Some(built.path))
}

const SELECT_SCRIPT: &str = r#"
import json, sys
package = __import__(sys.argv[1])
simulated = json.loads(sys.argv[2])
results = []
for name in sorted(package.status()):
    for device, cuda in simulated:
        try:
            chosen = package.select(name, device, cuda=cuda, driver="13.0")
            results.append([name, device, cuda, str(chosen), []])
        except Exception as error:
            refusals = [list(r) for r in getattr(error, "refusals", [])] or [["", str(error)]]
            results.append([name, device, cuda, None, refusals])
print(json.dumps(results))
"#;

fn install_and_select(
    options: &CheckOptions,
    wheel: &Path,
    runtime: &Path,
    module: &str,
) -> Result<String, String> {
    let scratch = tempfile::tempdir().map_err(|e| format!("no scratch directory: {e}"))?;
    let venv = scratch.path().join("venv");
    let run_command = |command: &mut std::process::Command, what: &str| {
        let output = command
            .output()
            .map_err(|e| format!("{what}: cannot run {:?}: {e}", command.get_program()))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(format!(
                "{what} failed: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    };
    run_command(
        std::process::Command::new(&options.python)
            .arg("-m")
            .arg("venv")
            .arg(&venv),
        "creating a venv",
    )?;
    let python = venv.join("bin").join("python");
    run_command(
        std::process::Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-index",
                "--no-deps",
                "--disable-pip-version-check",
            ])
            .arg(wheel)
            .arg(runtime),
        "pip install of both wheels",
    )?;
    let simulated = serde_json::to_string(&SIMULATED).expect("serializes");
    let output = run_command(
        std::process::Command::new(&python)
            .arg("-c")
            .arg(SELECT_SCRIPT)
            .arg(module)
            .arg(simulated)
            .current_dir(scratch.path()),
        "select() from the installed package",
    )?;
    type Row = (
        String,
        String,
        String,
        Option<String>,
        Vec<(String, String)>,
    );
    let rows: Vec<Row> = serde_json::from_str(output.trim())
        .map_err(|e| format!("unexpected output of select(): {e}: {output}"))?;
    if rows.is_empty() {
        return Err("the installed package lists no kernels".to_owned());
    }
    let mut selected = 0;
    let mut declared = 0;
    let mut failures = Vec::new();
    for (name, device, cuda, chosen, refusals) in &rows {
        if chosen.is_some() {
            selected += 1;
        } else if refusals.iter().any(|(variant, reason)| {
            // The target this device would load is the one the manifest declares skipped.
            *variant == format!("cu{}/{device}a", cuda.replace('.', ""))
                && reason.contains("not built: declared")
        }) {
            declared += 1;
        } else {
            let reasons: Vec<String> = refusals.iter().map(|(v, r)| format!("{v}: {r}")).collect();
            failures.push(format!(
                "`{name}` on {device} with CUDA {cuda}: {}",
                reasons.join("; ")
            ));
        }
    }
    if failures.is_empty() {
        Ok(format!(
            "both wheels install into a fresh venv; {selected} of {} selections for sm_90/sm_100 × CUDA 12.9/13.0 load, {declared} refused only by a declared skip",
            rows.len()
        ))
    } else {
        Err(failures.join("; "))
    }
}

fn check_gpu(run: &mut Run, bundle: &Bundle) {
    let driver = match prebuilt::driver::Driver::get() {
        Ok(driver) => driver,
        Err(error) => return run.skip("gpu", format!("no GPU here: {error}")),
    };
    if !matches!(driver.device_count(), Ok(n) if n > 0) {
        return run.skip("gpu", "no GPU here: the driver sees no device");
    }
    let options = prebuilt::RegistryOptions {
        jit: prebuilt::JitPolicy::Disabled,
        ..prebuilt::RegistryOptions::default()
    };
    let registry = match prebuilt::Registry::open_with(bundle.root(), options) {
        Ok(registry) => registry,
        Err(error) => return run.fail("gpu", error_chain(&error), "see the error"),
    };
    let mut loaded = BTreeMap::new();
    let mut failures = Vec::new();
    for name in bundle.index().kernels.keys() {
        match registry.load(name) {
            Ok(kernel) => {
                loaded.insert(name.clone(), kernel.provenance().to_string());
            }
            Err(error) => failures.push(error_chain(&error)),
        }
    }
    if failures.is_empty() {
        run.pass(
            "gpu",
            format!(
                "{} kernels load prebuilt with the JIT disabled",
                loaded.len()
            ),
        );
    } else {
        run.fail(
            "gpu",
            failures.join("; "),
            "build the variants this GPU needs",
        );
    }
}

/// Publishes the bundle's artifacts and every wheel in the wheel directory; the publisher
/// verifies each object by downloading it again.
fn check_publish(run: &mut Run, options: &CheckOptions, store: &str) {
    let wheels: Vec<PathBuf> = std::fs::read_dir(&options.wheels)
        .map(|entries| {
            let mut wheels: Vec<PathBuf> = entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "whl"))
                .collect();
            wheels.sort();
            wheels
        })
        .unwrap_or_default();
    let published = crate::publish::publish(&crate::publish::PublishOptions {
        bundles: vec![options.bundle.clone()],
        wheels,
        ..crate::publish::PublishOptions::new(store)
    });
    match published {
        Ok(report) => run.pass(
            "publish",
            format!(
                "{} objects in {store} and verified by download ({} uploaded now)",
                report.objects.len(),
                report.uploaded()
            ),
        ),
        Err(error) => run.fail(
            "publish",
            error_chain(&error),
            "check the store URL and $KWHEEL_STORE_TOKEN, then rerun",
        ),
    }
}

fn check_size(run: &mut Run, wheel: &Path, budget: u64) {
    let size = std::fs::metadata(wheel).map(|m| m.len()).unwrap_or(0);
    if size <= budget {
        return run.pass(
            "size",
            format!("{size} bytes, within the budget of {budget}"),
        );
    }
    let largest = largest_entries(wheel).unwrap_or_default();
    run.fail(
        "size",
        format!(
            "{size} bytes, over the budget of {budget}; largest: {}",
            largest.join(", ")
        ),
        "ship fewer variants in the wheel, or raise --size-budget",
    );
}

fn largest_entries(wheel: &Path) -> Option<Vec<String>> {
    let file = std::fs::File::open(wheel).ok()?;
    let mut archive = zip::ZipArchive::new(file).ok()?;
    let mut entries = Vec::new();
    for n in 0..archive.len() {
        let entry = archive.by_index(n).ok()?;
        entries.push((entry.compressed_size(), entry.name().to_owned()));
    }
    entries.sort_by(|a, b| b.cmp(a));
    Some(
        entries
            .into_iter()
            .take(5)
            .map(|(size, name)| format!("{name} ({size} bytes)"))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_version_is_read_from_either_quote() {
        assert_eq!(
            python_version("x = 1\n__version__ = \"0.1.0\"\n").as_deref(),
            Some("0.1.0")
        );
        assert_eq!(
            python_version("__version__='2.0.0' # c").as_deref(),
            Some("2.0.0")
        );
        assert_eq!(python_version("version = \"1\""), None);
    }
}
