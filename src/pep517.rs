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

use std::path::Path;

use crate::cli::{Pep517BuildWheelArgs, Pep517Command, Pep517PrepareMetadataArgs};
use anyhow::{Context, Result};

pub(crate) fn run(command: Pep517Command) -> Result<()> {
    let answer = match command {
        Pep517Command::BuildWheel(args) => build_wheel(args)?,
        Pep517Command::PrepareMetadata(args) => prepare_metadata(args)?,
        Pep517Command::BuildSdist(args) => {
            let manifest = args.manifest.resolve()?;
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
    let manifest = args.manifest.resolve()?;
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
    let manifest = args.manifest.resolve()?;
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
