//! The gates on the wheels built from the bundle: `reproducible`, `wheel`, `parts`, `install`,
//! `size`.

use std::path::{Path, PathBuf};

use bundler::Manifest;
use prebuilt::error_chain;

use super::{CheckOptions, Run};
use crate::library::{build_library_wheel, LibraryWheelOptions};
use crate::verify::{verify_wheel, VerifyReport};

/// Builds the wheel twice into scratch directories and compares; writes the release wheel
/// into the wheel directory only when it is missing. Returns the release wheel's path.
pub(super) fn check_reproducible(run: &mut Run, options: &CheckOptions) -> Option<PathBuf> {
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
            progress: None,
            toolchains: options.toolchains.clone(),
            ship: None,
            store: None,
            recipes_only: false,
            // The manifest's `[wheel] max-file-size`: the release is the set it cuts.
            max_file_size: None,
            packs: Vec::new(),
        })
    };
    // Every wheel of a build (the main wheel first, then its parts), by file name and sha256.
    let mut builds: Vec<Vec<(String, String)>> = Vec::new();
    for n in 0..2 {
        match build(scratch.path().join(format!("build-{n}"))) {
            Ok(built) => {
                let mut wheels = Vec::new();
                for path in std::iter::once(&built.path).chain(built.parts.iter().map(|p| &p.path))
                {
                    match std::fs::read(path) {
                        Ok(bytes) => {
                            wheels.push((file_name(path), prebuilt::key::sha256_hex(&bytes)))
                        }
                        Err(error) => {
                            run.fail(
                                "reproducible",
                                format!("{}: {error}", path.display()),
                                "retry",
                            );
                            return None;
                        }
                    }
                }
                builds.push(wheels);
            }
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
    let name = builds[0][0].0.clone();
    if builds[0] != builds[1] {
        let differ: Vec<String> = builds[0]
            .iter()
            .zip(&builds[1])
            .filter(|(a, b)| a != b)
            .map(|((name, a), (_, b))| format!("{name}: sha256 {} and {}", &a[..12], &b[..12]))
            .collect();
        run.fail(
            "reproducible",
            format!("two builds differ: {}", differ.join("; ")),
            "find the nondeterministic input (a time, an unordered map, a host path)",
        );
        return None;
    }
    let mut mismatched = Vec::new();
    for (wheel, digest) in &builds[0] {
        let released = options.wheels.join(wheel);
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
                .and_then(|()| std::fs::copy(scratch.path().join("build-0").join(wheel), &released))
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
            Ok(bytes) if prebuilt::key::sha256_hex(&bytes) == *digest => {}
            Ok(bytes) => mismatched.push(format!(
                "{} (sha256 {}) differs from a fresh build of the same inputs (sha256 {})",
                released.display(),
                &prebuilt::key::sha256_hex(&bytes)[..12],
                &digest[..12]
            )),
            Err(error) => mismatched.push(format!("{}: {error}", released.display())),
        }
    }
    let released = options.wheels.join(&name);
    if !mismatched.is_empty() {
        run.fail(
            "reproducible",
            format!(
                "{}: it was edited or built from other inputs",
                mismatched.join("; ")
            ),
            "delete it and run `kwheel dev build-wheel`",
        );
    } else if builds[0].len() == 1 {
        run.pass(
            "reproducible",
            format!(
                "two builds of {name} are byte-identical (sha256 {}), and so is the wheel in {}",
                &builds[0][0].1[..12],
                options.wheels.display()
            ),
        );
    } else {
        run.pass(
            "reproducible",
            format!(
                "two builds of {name} and its {} parts are byte-identical, and so are the wheels in {}",
                builds[0].len() - 1,
                options.wheels.display()
            ),
        );
    }
    Some(released)
}

/// The `wheel` gate; the report, for the `parts` gate, when the wheel could be read.
pub(super) fn check_wheel(run: &mut Run, wheel: &Path) -> Option<VerifyReport> {
    match verify_wheel(wheel) {
        Ok(report) if report.problems.is_empty() => {
            run.pass(
                "wheel",
                format!(
                    "{}: RECORD, tags, zip hygiene, {} bundle(s) and the manylinux_2_28 audit pass",
                    wheel.display(),
                    report.bundles.len()
                ),
            );
            Some(report)
        }
        Ok(report) => {
            run.fail(
                "wheel",
                report
                    .problems
                    .iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join("; "),
                "rebuild the wheel with `kwheel dev build-wheel`",
            );
            Some(report)
        }
        Err(error) => {
            run.fail("wheel", error_chain(&error), "rebuild the wheel");
            None
        }
    }
}

/// The `parts` gate: a wheel cut to a file size limit comes with every part, each artifact
/// in exactly one wheel of the set, every file at most the limit, every part pinned.
pub(super) fn check_parts(run: &mut Run, report: &VerifyReport) {
    let Some(set) = &report.set else {
        return run.skip(
            "parts",
            "one wheel holds every artifact (no `[wheel] max-file-size` cut it)",
        );
    };
    if set.problems.is_empty() {
        let largest = set.parts.iter().map(|part| part.size).max().unwrap_or(0);
        let variants: usize = set.parts.iter().map(|part| part.variants).sum();
        run.pass(
            "parts",
            format!(
                "{} parts beside the wheel, each pinned at its version; {variants} variants in \
                 exactly one part each, verified; the largest file {largest} bytes, within the \
                 limit of {}",
                set.parts.len(),
                set.max_file_size
            ),
        );
    } else {
        run.fail(
            "parts",
            set.problems
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join("; "),
            "build the set again with `kwheel dev build-wheel` into one directory",
        );
    }
}

/// The part wheels of the set `report` verified, beside `wheel`.
pub(super) fn part_wheels(wheel: &Path, report: Option<&VerifyReport>) -> Vec<PathBuf> {
    let directory = wheel.parent().unwrap_or(Path::new("."));
    report
        .and_then(|report| report.set.as_ref())
        .map(|set| {
            set.parts
                .iter()
                .map(|part| directory.join(&part.wheel))
                .collect()
        })
        .unwrap_or_default()
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default()
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
pub(super) fn check_install(
    run: &mut Run,
    manifest: &Manifest,
    options: &CheckOptions,
    wheel: &Path,
    parts: &[PathBuf],
) {
    let runtime = match runtime_wheel(run, options) {
        Ok(Some(runtime)) => runtime,
        Ok(None) => {
            return run.incomplete(
                "install",
                format!(
                    "not run: no kwheel runtime wheel in {} and no kwheel sources to build one",
                    options.wheels.display()
                ),
                "put kwheel's wheel (`kwheel release build-kwheel`) into the wheel folder, or \
                 turn the gate off by name with --skip install",
            )
        }
        Err(reason) => {
            return run.fail(
                "install",
                reason,
                "run `kwheel release build-kwheel` (it builds kwheel's wheel with cargo zigbuild; `bash ci/setup-wheel` installs zig and cargo-zigbuild)",
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
    match install_and_select(options, wheel, parts, &runtime, &module) {
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
    # An extension module is no kernel to select: it loads at import where torch is (this
    # venv has none); `wheel verify` has read and audited it.
    if name.endswith(" (module)"):
        continue
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
    parts: &[PathBuf],
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
            .args(parts)
            .arg(runtime),
        "pip install of the wheels",
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
    // The targets the manifest leaves out, as the bundle's index records them.
    let bundle = prebuilt::Bundle::open(&options.bundle)
        .map_err(|error| format!("cannot read the bundle: {}", prebuilt::error_chain(&error)))?;
    let declared_skip = |name: &str, device: &str, cuda: &str| {
        bundle.index().kernels.get(name).is_some_and(|kernel| {
            kernel.skipped.iter().any(|skip| {
                skip.arch.to_string() == format!("{device}a")
                    && skip.cuda.to_string() == format!("cu{}", cuda.replace('.', ""))
                    && skip.kind == prebuilt::index::SkipKind::Declared
            })
        })
    };
    let mut selected = 0;
    let mut declared = 0;
    let mut failures = Vec::new();
    for (name, device, cuda, chosen, refusals) in &rows {
        if chosen.is_some() {
            selected += 1;
        } else if declared_skip(name, device, cuda) {
            // The target this device would load is the one the manifest declares skipped.
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
            "{} install into a fresh venv; {selected} of {} selections for sm_90/sm_100 × CUDA 12.9/13.0 load, {declared} refused only by a declared skip",
            if parts.is_empty() {
                "both wheels".to_owned()
            } else {
                format!("the runtime, the wheel and its {} parts", parts.len())
            },
            rows.len()
        ))
    } else {
        Err(failures.join("; "))
    }
}

pub(super) fn check_size(run: &mut Run, wheel: &Path, parts: &[PathBuf], budget: u64) {
    let size = |path: &Path| std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let over: Vec<&Path> = std::iter::once(wheel)
        .chain(parts.iter().map(PathBuf::as_path))
        .filter(|path| size(path) > budget)
        .collect();
    if over.is_empty() {
        let detail = if parts.is_empty() {
            format!("{} bytes, within the budget of {budget}", size(wheel))
        } else {
            let total: u64 = parts.iter().map(|p| size(p)).sum::<u64>() + size(wheel);
            format!(
                "the wheel {} bytes and each of its {} parts within the budget of {budget} per \
                 file ({total} bytes in all)",
                size(wheel),
                parts.len()
            )
        };
        return run.pass("size", detail);
    }
    let details: Vec<String> = over
        .iter()
        .map(|path| {
            let largest = largest_entries(path).unwrap_or_default();
            format!(
                "{}: {} bytes, over the budget of {budget}; largest: {}",
                file_name(path),
                size(path),
                largest.join(", ")
            )
        })
        .collect();
    run.fail(
        "size",
        details.join("; "),
        "cut the wheel into parts (`[wheel] max-file-size`, see docs/registry-sized-wheels.md), \
         ship fewer variants in the wheel, or raise --size-budget",
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
