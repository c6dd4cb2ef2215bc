//! A bundle directory found and read through its `kernels.idx`: what the tools use on an
//! installed bundle, which ships no `index.json`.

use std::path::{Path, PathBuf};

use super::{Catalog, Lookup, LOOKUP_FILE};
use crate::bundle::{read_index, BundleError, PackageNotFound, PREBUILT_DIR};
use crate::index::Index;
use crate::Bundle;

/// The whole index of a bundle directory, of its `kernels.idx` or of an `index.json`: read
/// from `kernels.idx` wherever the bundle has one (a wheel need ship nothing else), else from
/// `index.json` (a bundle written before `kernels.idx` existed).
pub fn read_bundle_index(path: &Path) -> Result<Index, BundleError> {
    let lookup = if path.is_dir() {
        let lookup = path.join(LOOKUP_FILE);
        // A link in its place is opened (and refused when it leads out).
        std::fs::symlink_metadata(&lookup)
            .is_ok()
            .then(|| crate::bundle::bundle_file(path, LOOKUP_FILE))
            .transpose()?
    } else {
        (path.file_name() == Some(LOOKUP_FILE.as_ref())).then(|| path.to_owned())
    };
    match lookup {
        Some(lookup) => Lookup::open(&lookup)?.index(),
        None => read_index(path),
    }
}

/// Opens the bundle at `root` for the tools that read every kernel (`bundle list`, `dev
/// coverage`, prefetch, `wheel verify`): from its `index.json` where it has one (a bundle
/// directory as `dev bundle-kernels` writes it), else from its `kernels.idx`, all a wheel
/// ships, decoded whole and checked as `index.json` is.
pub fn open_bundle(root: impl Into<PathBuf>) -> Result<Bundle, BundleError> {
    let root = root.into();
    let has = |name: &str| std::fs::symlink_metadata(root.join(name)).is_ok();
    if has(crate::bundle::INDEX_FILE) || !has(LOOKUP_FILE) {
        return Bundle::open(root);
    }
    let index = read_bundle_index(&root)?;
    Ok(Bundle::with_index(root, index))
}

/// Whether `dir` holds a bundle's index: `kernels.idx`, or the `index.json` of a bundle
/// written before it existed.
pub fn holds_bundle(dir: &Path) -> bool {
    [LOOKUP_FILE, crate::bundle::INDEX_FILE]
        .iter()
        .any(|name| dir.join(name).is_file())
}

/// The bundle at `path`, by the one rule both finders keep (this crate's [`find_bundle`] and
/// Python's `kwheel.find_bundle`, which calls it): `path` itself when it holds a bundle
/// ([`holds_bundle`]), else its `_prebuilt/` when that does, else none. The cases are one table,
/// `tests/fixtures/bundle_folders.json`, which both languages' tests pass.
pub fn bundle_at(path: &Path) -> Option<PathBuf> {
    [path.to_path_buf(), path.join(PREBUILT_DIR)]
        .into_iter()
        .find(|candidate| holds_bundle(candidate))
}

/// The bundle a command means: a bundle directory (with `kernels.idx`), a package directory
/// (with `_prebuilt/kernels.idx`), both by [`bundle_at`], or the name of an installed package, looked up in the
/// site-packages of `$KWHEEL_SITE_PACKAGES`, `$VIRTUAL_ENV`, `$CONDA_PREFIX` and
/// `python3`'s own by the package its loader index's meta names (its header and meta read,
/// nothing else).
pub fn find_bundle(package_or_path: &str) -> Result<PathBuf, PackageNotFound> {
    if let Some(bundle) = bundle_at(Path::new(package_or_path)) {
        return Ok(bundle);
    }
    let searched = crate::site::site_packages();
    let wanted = crate::site::normalize_package(package_or_path);
    for site in &searched {
        let Ok(entries) = std::fs::read_dir(site) else {
            continue;
        };
        let mut dirs: Vec<PathBuf> = entries.flatten().map(|entry| entry.path()).collect();
        dirs.sort();
        for dir in dirs {
            let bundle = dir.join(PREBUILT_DIR);
            let package = match Catalog::open(&bundle) {
                Ok(catalog) => catalog.meta().package.clone(),
                Err(_) => continue,
            };
            if crate::site::normalize_package(&package) == wanted {
                return Ok(bundle);
            }
        }
    }
    Err(PackageNotFound {
        package: package_or_path.to_owned(),
        searched,
    })
}

/// Writes `index.json` into a copy of a bundle that ships only `kernels.idx` (a wheel's,
/// extracted), decoded from it, so readers of the whole bundle open it; returns whether it
/// wrote one. A bundle with an `index.json` is left as it is.
pub fn restore_index_json(root: &Path) -> Result<bool, BundleError> {
    let index_json = root.join(crate::bundle::INDEX_FILE);
    if std::fs::symlink_metadata(&index_json).is_ok()
        || std::fs::symlink_metadata(root.join(LOOKUP_FILE)).is_err()
    {
        return Ok(false);
    }
    let index = read_bundle_index(root)?;
    std::fs::write(&index_json, index.to_json()).map_err(|source| BundleError::Write {
        path: index_json.clone(),
        source,
    })?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cases of `tests/fixtures/bundle_folders.json`, which Python's `kwheel.find_bundle`
    /// passes too: one rule in both languages.
    #[test]
    fn bundle_folders_follow_the_shared_table() {
        let table: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/fixtures/bundle_folders.json")).unwrap();
        let cases = table["cases"].as_array().unwrap();
        assert!(cases.len() >= 8);
        for case in cases {
            let name = case["name"].as_str().unwrap();
            let dir = tempfile::tempdir().unwrap();
            let under = |value: &serde_json::Value| dir.path().join(value.as_str().unwrap());
            for folder in case["folders"].as_array().unwrap() {
                std::fs::create_dir_all(under(folder)).unwrap();
            }
            for file in case["files"].as_array().unwrap() {
                let file = under(file);
                std::fs::create_dir_all(file.parent().unwrap()).unwrap();
                std::fs::write(file, b"").unwrap();
            }
            let found = bundle_at(&under(&case["path"]));
            let expected = (!case["found"].is_null()).then(|| under(&case["found"]));
            assert_eq!(found, expected, "{name}");
        }
    }
}
