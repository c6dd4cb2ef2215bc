//! Building from source: the sdist and the recipes-only wheel the build backend ships.

use super::*;

use prebuilt::index::SkipKind;
use release::library::RECIPES_ONLY_REASON;
use release::{build_sdist, verify_sdist, SdistOptions};

fn sdist_of(manifest: &Path, out: &Path) -> release::sdist::Sdist {
    build_sdist(&SdistOptions {
        manifest: manifest.to_owned(),
        out: out.to_owned(),
    })
    .unwrap_or_else(|error| panic!("the sdist builds: {}", chain(&error)))
}

#[test]
fn the_sdist_holds_what_the_backend_needs_and_builds_to_identical_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = copy_library(dir.path());
    let sdist = sdist_of(&manifest, &dir.path().join("one"));
    assert_eq!(
        sdist.path.file_name().unwrap(),
        "af3_kernels-0.1.0.tar.gz",
        "PEP 625: normalized name"
    );
    for expected in [
        "PKG-INFO",
        "pyproject.toml",
        "kernels.toml",
        "include/af3/common.cuh",
        "layernorm/layernorm.cu",
        "python/af3_kernels/__init__.py",
    ] {
        assert!(
            sdist.files.iter().any(|file| file == expected),
            "{expected} in {:?}",
            sdist.files
        );
    }
    assert!(
        !sdist
            .files
            .iter()
            .any(|file| file.starts_with("python/tests/")),
        "only the manifest's Python package: {:?}",
        sdist.files
    );
    let manifest_kernels = bundler::Manifest::load(&manifest).unwrap().kernels.len();
    assert_eq!(sdist.kernels, manifest_kernels);
    let bytes = std::fs::read(&sdist.path).unwrap();
    // Another checkout, another time: the same bytes.
    let other = tempfile::tempdir().unwrap();
    let again = sdist_of(&copy_library(other.path()), &other.path().join("two"));
    assert_eq!(std::fs::read(&again.path).unwrap(), bytes);

    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes.as_slice()));
    let mut names = Vec::new();
    for entry in archive.entries().unwrap() {
        let entry = entry.unwrap();
        let header = entry.header();
        assert_eq!(
            header.mtime().unwrap(),
            315_532_800,
            "SOURCE_DATE_EPOCH default"
        );
        assert_eq!((header.uid().unwrap(), header.gid().unwrap()), (0, 0));
        assert_eq!(header.mode().unwrap(), 0o644);
        names.push(entry.path().unwrap().to_string_lossy().into_owned());
    }
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "entries are sorted");
    assert!(names.iter().all(|n| n.starts_with("af3_kernels-0.1.0/")));
    let pkg_info = entry_of(&bytes, "af3_kernels-0.1.0/PKG-INFO");
    assert!(
        pkg_info.starts_with("Metadata-Version: 2.1\nName: af3-kernels\nVersion: 0.1.0\n")
            && pkg_info.contains("Requires-Dist: kwheel>=0.1.0,<0.2\n"),
        "{pkg_info}"
    );
}

fn entry_of(bytes: &[u8], name: &str) -> String {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes));
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.path().unwrap().to_string_lossy() == name {
            let mut text = String::new();
            entry.read_to_string(&mut text).unwrap();
            return text;
        }
    }
    panic!("no {name}")
}

/// Writes `name` as a gzipped tar of `files` (path, bytes), as another tool might.
fn handmade(dir: &Path, name: &str, files: &[(&str, &[u8])]) -> PathBuf {
    let path = dir.join(name);
    let gzip = flate2::write::GzEncoder::new(
        std::fs::File::create(&path).unwrap(),
        flate2::Compression::fast(),
    );
    let mut builder = tar::Builder::new(gzip);
    for (file, bytes) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, file, *bytes).unwrap();
    }
    builder.into_inner().unwrap().finish().unwrap();
    path
}

#[test]
fn sdist_verification_names_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = copy_library(dir.path());
    let good = sdist_of(&manifest, &dir.path().join("good"));
    let bytes = std::fs::read(&good.path).unwrap();
    let stem = "af3_kernels-0.1.0";
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes.as_slice()));
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = entry.path().unwrap().to_string_lossy().into_owned();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        files.push((name, data));
    }
    // A source the manifest's layernorm compiles is gone, PKG-INFO says another version,
    // and a file sits outside the top directory.
    let mut broken: Vec<(&str, &[u8])> = files
        .iter()
        .filter(|(name, _)| name != &format!("{stem}/layernorm/layernorm.cu"))
        .map(|(name, data)| {
            if name.ends_with("/PKG-INFO") {
                (
                    name.as_str(),
                    b"Metadata-Version: 2.1\nName: af3-kernels\nVersion: 0.2.0\n".as_slice(),
                )
            } else {
                (name.as_str(), data.as_slice())
            }
        })
        .collect();
    broken.push(("stray.txt", b"x"));
    let path = handmade(dir.path(), "af3_kernels-0.1.0.tar.gz", &broken);
    let report = verify_sdist(&path).unwrap();
    let problems = report.problems.join("\n");
    assert!(
        problems.contains("`stray.txt` is outside the top directory"),
        "{problems}"
    );
    assert!(
        problems.contains("PKG-INFO has version `0.2.0`, the file name `0.1.0`"),
        "{problems}"
    );
    assert!(
        problems.contains("kernels.toml: ") && problems.contains("layernorm"),
        "the missing source is named: {problems}"
    );
    let error = report.into_result().unwrap_err().to_string();
    assert!(error.starts_with(&format!("`{}` failed verification:", path.display())));

    // A name PEP 625 does not allow, and no pyproject.toml.
    let bad = handmade(
        dir.path(),
        "AF3-Kernels-0.1.0.tar.gz",
        &[("AF3-Kernels-0.1.0/PKG-INFO", b"")],
    );
    let problems = verify_sdist(&bad).unwrap().problems.join("\n");
    assert!(
        problems.contains("is not `{name}-{version}.tar.gz` with one `-`"),
        "{problems}"
    );
    assert!(problems.contains("pyproject.toml is missing"), "{problems}");
}

#[test]
fn a_library_without_a_kwheel_pyproject_gets_no_sdist() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = copy_library(dir.path());
    let pyproject = manifest.parent().unwrap().join("pyproject.toml");
    std::fs::remove_file(&pyproject).unwrap();
    let options = SdistOptions {
        manifest: manifest.clone(),
        out: dir.path().join("out"),
    };
    let error = build_sdist(&options).unwrap_err().to_string();
    assert!(
        error.contains("pyproject.toml` is missing")
            && error.contains("build-backend = \"kwheel.build\""),
        "{error}"
    );
    std::fs::write(
        &pyproject,
        "[build-system]\nbuild-backend = \"setuptools.build_meta\"\n",
    )
    .unwrap();
    let error = build_sdist(&options).unwrap_err().to_string();
    assert!(
        error.contains("names build backend `setuptools.build_meta`, not `kwheel.build`"),
        "{error}"
    );
    assert!(!dir.path().join("out/af3_kernels-0.1.0.tar.gz").exists());
}

#[test]
fn the_recipes_only_wheel_ships_sources_and_recipes_and_no_cubin() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = copy_library(dir.path());
    let built = build_library_wheel(&LibraryWheelOptions {
        out: dir.path().join("wheels"),
        recipes_only: true,
        // No toolchain: nothing is compiled or checked against a compiler.
        toolchains: Some(Vec::new()),
        ..LibraryWheelOptions::new(&manifest)
    })
    .unwrap_or_else(|error| panic!("{}", chain(&error)));
    assert_eq!(built.filename.to_string(), WHEEL_NAME);
    let bytes = std::fs::read(&built.path).unwrap();
    // The wheel ships the loader index only, which holds the whole index.
    let index = wheel_index(&bytes);
    let planned = bundler::Manifest::load(&manifest).unwrap();
    assert_eq!(index.kernels.len(), planned.kernels.len());
    let names: Vec<String> = entries(&bytes).into_iter().map(|(name, _)| name).collect();
    for (name, record) in &index.kernels {
        assert!(record.variants.is_empty(), "{name}");
        let recipe = record.recipe.as_ref().unwrap();
        assert!(names.contains(&format!("af3_kernels/_prebuilt/sources/{}", recipe.source)));
        for file in record.inputs.files.keys() {
            assert!(
                names.contains(&format!("af3_kernels/_prebuilt/sources/{file}")),
                "{file}"
            );
        }
        let targets = planned.library.archs.len() * planned.library.cuda_builds.len();
        assert_eq!(record.skipped.len(), targets, "{name}: every target listed");
        for skip in &record.skipped {
            let kind = skip.kind;
            assert!(
                (kind == SkipKind::Unsupported && skip.reason == RECIPES_ONLY_REASON)
                    || kind == SkipKind::Declared,
                "{name}: {skip:?}"
            );
        }
    }
    assert!(!names.iter().any(|name| name.contains("/artifacts/")));
    let report = verify_wheel(&built.path).unwrap().into_result().unwrap();
    assert_eq!(report.cubins, 0);
}
