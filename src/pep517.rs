//! `kwheel pep517 …`: the build backend's side of PEP 517, after maturin's `maturin pep517`.
//! `kwheel/build.py` reads `pyproject.toml` and the config settings and calls one verb per
//! hook; the verb does the hook's work and prints one JSON object, alone on stdout (notes go
//! to stderr), so the backend reads answers, never messages that may be reworded.
//!
//! | verb | hook | answer |
//! | --- | --- | --- |
//! | `build-wheel` | `build_wheel` | `file_name`, `path`, `verified`, `prebuilt`, `jit_reason` |
//! | `prepare-metadata` | `prepare_metadata_for_build_wheel` | `dist_info` |
//! | `build-sdist` | `build_sdist` | `file_name`, `path`, `verified` |
//!
//! With `--prebuilt` and every CUDA toolchain of the manifest found, the wheel carries real
//! cubins; otherwise it is the recipes-only wheel that JIT-compiles each kernel on first load,
//! and `jit_reason` says why when cubins were asked for.
//!
//! The project is the current directory, where pip runs the backend (an sdist's unpacked
//! folder, a clone): every verb refuses a manifest (`[tool.kwheel] manifest`) that does not
//! lie inside it, as `kwheel.build` does before calling, so an sdist cannot build and ship a
//! library from elsewhere on the machine.

use std::path::{Component, Path, PathBuf};

use crate::cli::{ManifestArg, Pep517BuildWheelArgs, Pep517Command, Pep517PrepareMetadataArgs};
use crate::exit::{CommandFailed, Failure};
use anyhow::{Context, Result};

pub(crate) fn run(command: Pep517Command) -> Result<()> {
    let answer = match command {
        Pep517Command::BuildWheel(args) => build_wheel(args)?,
        Pep517Command::PrepareMetadata(args) => prepare_metadata(args)?,
        Pep517Command::BuildSdist(args) => {
            let manifest = project_manifest(&args.manifest)?;
            let sdist = release::build_sdist(&release::SdistOptions {
                manifest: manifest.clone(),
                out: args.sdist_directory,
            })
            .with_context(|| format!("build-sdist for `{}` failed", manifest.display()))?;
            written(&sdist.path)
        }
    };
    println!("{answer}");
    Ok(())
}

fn build_wheel(args: Pep517BuildWheelArgs) -> Result<serde_json::Value> {
    let manifest = project_manifest(&args.manifest)?;
    let jit_reason = if args.prebuilt {
        missing_toolchains(&manifest)?.map(|missing| {
            let reason = format!(
                "prebuilt cubins were asked for, but the CUDA toolchains are missing \
                 ({missing}); building a wheel that JIT-compiles each kernel on first load"
            );
            eprintln!("kwheel pep517: {reason}");
            reason
        })
    } else {
        None
    };
    let prebuilt = args.prebuilt && jit_reason.is_none();
    // A bundle of its own for this build, gone with it: never one a developer left in the tree.
    let scratch = tempfile::Builder::new()
        .prefix("kwheel-bundle-")
        .tempdir()
        .context("cannot make a folder for the bundle")?;
    let built = release::build_library_wheel(&release::LibraryWheelOptions {
        bundle: scratch.path().join(release::library::PREBUILT_DIR),
        out: args.wheel_directory,
        torch: args.torch,
        recipes_only: !prebuilt,
        ..release::LibraryWheelOptions::new(&manifest)
    })
    .with_context(|| format!("build-wheel for `{}` failed", manifest.display()))?;
    let mut answer = written(&built.path);
    answer["prebuilt"] = prebuilt.into();
    answer["jit_reason"] = jit_reason.into();
    Ok(answer)
}

/// The `.dist-info` of the recipes-only wheel, which compiles nothing: its METADATA and WHEEL
/// are those of the wheel `build-wheel` builds either way, so pip need not bundle twice.
fn prepare_metadata(args: Pep517PrepareMetadataArgs) -> Result<serde_json::Value> {
    let manifest = project_manifest(&args.manifest)?;
    let scratch = tempfile::Builder::new()
        .prefix("kwheel-metadata-")
        .tempdir()
        .context("cannot make a folder for the metadata's wheel")?;
    let built = release::build_library_wheel(&release::LibraryWheelOptions {
        out: scratch.path().to_owned(),
        torch: args.torch,
        recipes_only: true,
        ..release::LibraryWheelOptions::new(&manifest)
    })
    .with_context(|| format!("prepare-metadata for `{}` failed", manifest.display()))?;
    let dist_info = release::wheel::unpack_dist_info(&built.path, &args.metadata_directory)?;
    Ok(serde_json::json!({ "dist_info": dist_info }))
}

/// The manifest `manifest` names (else the default one), refused unless it lies inside the
/// project, the current directory: a relative path without `..` whose every link leads to
/// somewhere inside. Given as found with every link resolved, so the build reads the file
/// that was checked, not whatever a link on the way names later.
fn project_manifest(manifest: &ManifestArg) -> Result<PathBuf> {
    let path = manifest.resolve()?;
    let project = std::env::current_dir()
        .and_then(|dir| dir.canonicalize())
        .context("cannot read the current directory, the project's")?;
    Ok(inside_project(&project, &path)?)
}

/// [`project_manifest`]'s check of `path` against `project` (a canonical path).
fn inside_project(project: &Path, path: &Path) -> Result<PathBuf, CommandFailed> {
    let refuse = |reason: String| {
        CommandFailed::new(
            Failure::Verification,
            format!(
                "`[tool.kwheel] manifest` `{}` {reason}: the kernel manifest must lie inside the \
                 project (`{}`), as a path relative to it without `..` and without a symbolic \
                 link that leads out",
                path.display(),
                project.display()
            ),
        )
    };
    if path.is_absolute() {
        return Err(refuse("is absolute".to_owned()));
    }
    if path
        .components()
        .any(|component| matches!(component, Component::ParentDir))
    {
        return Err(refuse("has a `..` component".to_owned()));
    }
    let joined = project.join(path);
    match joined.canonicalize() {
        Ok(real) if real.starts_with(project) => Ok(real),
        Ok(real) => Err(refuse(format!(
            "leads out of the project through a symbolic link, to `{}`",
            real.display()
        ))),
        // Not there (or a dangling link): the build names what is missing.
        Err(_) => Ok(joined),
    }
}

/// `None` when every CUDA build of the manifest has its toolchain, else each missing one and
/// why (`cu129: …; cu130: …`).
fn missing_toolchains(manifest: &Path) -> Result<Option<String>> {
    let manifest = bundler::Manifest::load(manifest)?;
    let missing: Vec<String> = manifest
        .library
        .cuda_builds
        .iter()
        .filter_map(|&build| {
            let error = bundler::toolchain::discover(build).err()?;
            Some(format!("{build}: {error}"))
        })
        .collect();
    Ok((!missing.is_empty()).then(|| missing.join("; ")))
}

/// The answer for a written and verified archive.
fn written(path: &Path) -> serde_json::Value {
    serde_json::json!({
        "file_name": path.file_name().map(|name| name.to_string_lossy()),
        "path": path,
        "verified": true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_outside_the_project_is_refused_naming_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("project/kernels")).unwrap();
        let project = dir.path().join("project").canonicalize().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::write(project.join("kernels/kernels.toml"), "").unwrap();
        std::fs::write(elsewhere.join("kernels.toml"), "").unwrap();
        std::os::unix::fs::symlink(&elsewhere, project.join("linked")).unwrap();
        std::os::unix::fs::symlink(project.join("kernels"), project.join("inside")).unwrap();
        for (manifest, reason) in [
            (elsewhere.join("kernels.toml"), "is absolute".to_owned()),
            (
                PathBuf::from("../elsewhere/kernels.toml"),
                "has a `..` component".to_owned(),
            ),
            (
                PathBuf::from("kernels/../../elsewhere/kernels.toml"),
                "has a `..` component".to_owned(),
            ),
            (
                PathBuf::from("linked/kernels.toml"),
                format!(
                    "leads out of the project through a symbolic link, to `{}`",
                    elsewhere
                        .canonicalize()
                        .unwrap()
                        .join("kernels.toml")
                        .display()
                ),
            ),
        ] {
            let error = inside_project(&project, &manifest).unwrap_err();
            assert_eq!(error.failure, Failure::Verification);
            let message = error.to_string();
            assert!(
                message.starts_with(&format!(
                    "`[tool.kwheel] manifest` `{}` {reason}: ",
                    manifest.display()
                )),
                "{message}"
            );
        }
        // Inside, also through a link that stays inside: the file itself.
        for manifest in [
            "kernels/kernels.toml",
            "inside/kernels.toml",
            "./kernels/kernels.toml",
        ] {
            assert_eq!(
                inside_project(&project, Path::new(manifest)).unwrap(),
                project.join("kernels/kernels.toml")
            );
        }
    }
}
