//! The library's folder as a wheel ships it: every file inside the manifest's root, and
//! the Python package the wheel is built around.

use super::*;

/// Refuses a manifest that names a path outside its root, lexically (absolute, or `..` past
/// the root) or after symbolic links: the Python package, every include dir, source and
/// cubin. A build from source (an sdist, a recipes-only wheel) ships only what is under the
/// root, so this runs before either collects a file.
pub(crate) fn check_inside_root(manifest: &Manifest) -> Result<(), Error> {
    let library = &manifest.library;
    let mut named: Vec<(String, &str)> = Vec::new();
    if let Some(package) = &library.python_package {
        named.push(("library.python-package".to_owned(), package));
    }
    for dir in &library.include_dirs {
        named.push(("library.include-dirs".to_owned(), dir));
    }
    for (name, spec) in &manifest.kernels {
        for source in &spec.sources {
            named.push((format!("kernels.{name}.sources"), source));
        }
        for dir in spec.include_dirs.iter().flatten() {
            named.push((format!("kernels.{name}.include-dirs"), dir));
        }
        for cubin in &spec.cubins {
            named.push((format!("kernels.{name}.cubins"), &cubin.path));
        }
    }
    for (key, relative) in named {
        let outside = |reason: String| Error::OutsideRoot {
            manifest: manifest.path.clone(),
            key: key.clone(),
            path: relative.to_owned(),
            reason,
        };
        let path = Path::new(relative);
        if path.is_absolute() {
            return Err(outside("is absolute".to_owned()));
        }
        let mut depth = 0usize;
        for component in path.components() {
            match component {
                std::path::Component::ParentDir if depth == 0 => {
                    return Err(outside("leads above the manifest's directory".to_owned()))
                }
                std::path::Component::ParentDir => depth -= 1,
                std::path::Component::Normal(_) => depth += 1,
                _ => {}
            }
        }
        // A path that does not exist is reported missing by the step that needs it.
        if let Ok(resolved) = manifest.root.join(path).canonicalize() {
            check_file_inside(manifest, &key, relative, &resolved)?;
        }
    }
    Ok(())
}

/// Refuses `path` (what `named` under manifest key `key` resolves to) when, after symbolic
/// links, it lies outside the manifest's directory.
pub(crate) fn check_file_inside(
    manifest: &Manifest,
    key: &str,
    named: &str,
    path: &Path,
) -> Result<(), Error> {
    let root = manifest
        .root
        .canonicalize()
        .unwrap_or_else(|_| manifest.root.clone());
    let resolved = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    if resolved.starts_with(&root) {
        Ok(())
    } else {
        Err(Error::OutsideRoot {
            manifest: manifest.path.clone(),
            key: key.to_owned(),
            path: named.to_owned(),
            reason: format!("resolves to `{}`", resolved.display()),
        })
    }
}

/// The manifest's Python package directory, checked.
pub(crate) fn python_package_dir(manifest: &Manifest) -> Result<PathBuf, Error> {
    let relative =
        manifest
            .library
            .python_package
            .as_ref()
            .ok_or_else(|| Error::NoPythonPackage {
                manifest: manifest.path.clone(),
            })?;
    let dir = manifest.root.join(relative);
    let invalid = |reason: &str| Error::PythonPackage {
        path: dir.clone(),
        manifest: manifest.path.clone(),
        reason: reason.to_owned(),
    };
    if !dir.is_dir() {
        return Err(invalid("is not a directory"));
    }
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let identifier = name.starts_with(|c: char| c == '_' || c.is_ascii_alphabetic())
        && name.chars().all(|c| c == '_' || c.is_ascii_alphanumeric());
    if !identifier {
        return Err(invalid(
            "is not named like an importable package (a Python identifier)",
        ));
    }
    if dir.join(PREBUILT_DIR).exists() {
        return Err(invalid(
            "already has a `_prebuilt/`, which the wheel fills from the bundle",
        ));
    }
    Ok(dir)
}

/// The package's files under `import_name/`, without caches and hidden files.
pub(super) fn python_package_files(
    manifest: &Manifest,
    dir: &Path,
    import_name: &str,
) -> Result<Vec<WheelFile>, Error> {
    let mut files = Vec::new();
    let shown = |name: &str| !name.starts_with('.') && name != "__pycache__";
    for (relative, path) in files_under(dir, shown)? {
        if relative.ends_with(".pyc") || relative.ends_with(".pyo") {
            continue;
        }
        files.push(WheelFile::from_disk(
            format!("{import_name}/{relative}"),
            path,
        )?);
    }
    if files.is_empty() {
        return Err(Error::PythonPackage {
            path: dir.to_owned(),
            manifest: manifest.path.clone(),
            reason: "holds no files".into(),
        });
    }
    Ok(files)
}
