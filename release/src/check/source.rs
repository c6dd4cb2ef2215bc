//! The gates on the source tree and the bundle built from it: `version`, `bundle`, `keys`,
//! `cubins`.

use std::path::Path;

use bundler::Manifest;
use prebuilt::cubin::validate_cubin;
use prebuilt::error_chain;
use prebuilt::index::SkipReason;
use prebuilt::Bundle;

use super::{CheckOptions, Run};
use crate::library::check_bundle_current;

pub(super) fn check_version(run: &mut Run, manifest: &Manifest, tag_prefix: &str) {
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

pub(super) fn check_bundle(
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
            jobs: options.jobs,
            torch: Some(torch.to_owned()),
            toolchains: options.toolchains.clone(),
            ..bundler::BundleOptions::new(&options.manifest, &options.bundle, &options.cache_dir)
        });
        match bundled {
            Ok(summary) => run.built.push(format!(
                "the missing bundle {} ({} compiled)",
                options.bundle.display(),
                summary.compiled().len()
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
    let mut failed = Vec::new();
    let mut allowed = 0;
    let mut skips = 0;
    let allow_failed = &manifest.release.allow_failed;
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
                let label = format!("{name}/{build}/{arch}");
                match skipped {
                    // A target that failed to compile is not a skip the release may carry,
                    // unless the manifest allows it by name.
                    Some(skip) => match skip.why() {
                        SkipReason::Failed(_)
                            if allow_failed.iter().any(|a| *a == label || a == name) =>
                        {
                            allowed += 1;
                        }
                        SkipReason::Failed(why) => {
                            failed.push((format!("`{name}` {build}/{arch}"), why));
                        }
                        _ => skips += 1,
                    },
                    None if !built => missing.push(format!("`{name}` {build}/{arch}")),
                    None => {}
                }
            }
        }
    }
    let cells =
        manifest.kernels.len() * manifest.library.cuda_builds.len() * manifest.library.archs.len();
    if let Some((first, why)) = failed.first() {
        // The same error usually fails every target of a kernel: its log is shown once.
        let targets: Vec<&str> = failed.iter().map(|(target, _)| target.as_str()).collect();
        run.fail(
            "bundle",
            format!(
                "{} failed to compile: {}; the error of {first}: {why}",
                match failed.len() {
                    1 => "1 target".to_owned(),
                    n => format!("{n} targets"),
                },
                targets.join(", "),
            ),
            "fix the build (`kwheel dev bundle-kernels` prints each error), or allow a target \
             to fail by name in the manifest's `[release] allow-failed` (`kernel` or \
             `kernel/cu129/sm_90a`)",
        );
    } else if missing.is_empty() {
        let allowed_text = if allowed > 0 {
            format!(", {allowed} failed target(s) allowed by `[release] allow-failed`")
        } else {
            String::new()
        };
        run.pass(
            "bundle",
            format!(
                "{} kernels × {} archs × {} CUDA builds: {} variants, {skips} skip(s) with \
                 reasons{allowed_text}",
                manifest.kernels.len(),
                manifest.library.archs.len(),
                manifest.library.cuda_builds.len(),
                cells - skips - allowed
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

pub(super) fn check_keys(run: &mut Run, manifest: &Manifest, options: &CheckOptions, torch: &str) {
    match check_bundle_current(manifest, &options.bundle, torch, options.toolchains.as_deref()) {
        Ok(()) => run.pass("keys", "every bundled key matches the current sources"),
        Err(error) => run.fail(
            "keys",
            error_chain(&error),
            "rebuild with `kwheel dev bundle-kernels`; `kwheel dev explain <kernel> --against <bundle>` shows what changed",
        ),
    }
}

pub(super) fn check_cubins(run: &mut Run, bundle: &Bundle) {
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
