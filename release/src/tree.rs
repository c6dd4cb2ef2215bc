//! Listing a directory tree's files, the way a wheel or an sdist takes them: every file under a
//! directory (symlinks followed, a loop refused), each with its `/`-separated path relative to
//! that directory, sorted by that path so archives come out in the same order on every machine.

use prebuilt::untrusted::Unreadable;
use std::path::{Path, PathBuf};

use crate::Error;

/// Every file under `dir` as (relative path, path on disk), sorted by the relative path.
/// `keep` sees each entry's file name below `dir`; an entry it refuses is left out, and a
/// directory it refuses is not entered. An error names the entry that could not be read.
pub(crate) fn files_under(
    dir: &Path,
    keep: impl Fn(&str) -> bool,
) -> Result<Vec<(String, PathBuf)>, Error> {
    let mut found = Vec::new();
    let walk = walkdir::WalkDir::new(dir)
        .follow_links(true)
        .into_iter()
        .filter_entry(|entry| entry.depth() == 0 || keep(&entry.file_name().to_string_lossy()));
    for entry in walk {
        let entry = entry.map_err(|error| {
            Error::Read(Unreadable {
                path: error.path().unwrap_or(dir).to_owned(),
                source: error.into(),
            })
        })?;
        if entry.file_type().is_dir() {
            continue;
        }
        let relative = entry
            .path()
            .strip_prefix(dir)
            .expect("a walk stays under its root")
            .components()
            .map(|component| component.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/");
        found.push((relative, entry.into_path()));
    }
    // By the whole path, not directory by directory: `a.txt` sorts before `a/b`, as the sorted
    // entries of a wheel's RECORD do.
    found.sort();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_come_sorted_by_their_whole_relative_path_and_filtered_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for path in [
            "a/b",
            "a.txt",
            "a/c/d.py",
            "a/__pycache__/x.pyc",
            ".hidden",
            "z",
        ] {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, path.to_string_lossy().as_bytes()).unwrap();
        }
        let names = |keep: &dyn Fn(&str) -> bool| -> Vec<String> {
            let found = files_under(root, keep).unwrap();
            for (relative, path) in &found {
                assert_eq!(path, &root.join(relative));
            }
            found.into_iter().map(|(relative, _)| relative).collect()
        };
        assert_eq!(
            names(&|_| true),
            [
                ".hidden",
                "a.txt",
                "a/__pycache__/x.pyc",
                "a/b",
                "a/c/d.py",
                "z"
            ]
        );
        assert_eq!(
            names(&|name| !name.starts_with('.') && name != "__pycache__"),
            ["a.txt", "a/b", "a/c/d.py", "z"]
        );
    }

    #[test]
    fn an_unreadable_tree_is_an_error_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        let error = files_under(&missing, |_| true).unwrap_err();
        assert!(
            matches!(&error, Error::Read(Unreadable { path, .. }) if path == &missing),
            "{error:?}"
        );
        // A link that leads back up is a loop, refused rather than followed for ever.
        std::fs::create_dir(dir.path().join("tree")).unwrap();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("tree/up")).unwrap();
        let error = files_under(dir.path(), |_| true).unwrap_err();
        assert!(
            matches!(&error, Error::Read(Unreadable { path, .. }) if path == &dir.path().join("tree/up")),
            "{error:?}"
        );
    }
}
