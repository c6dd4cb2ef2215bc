//! A folder's files by path relative to it: what tests compare whole trees with (a bundle
//! written twice, a merge against a single build) and what benches list and measure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every file below `root`, by `/`-separated path relative to it, in path order. A folder
/// that cannot be read fails the caller.
pub fn files(root: &Path) -> BTreeMap<String, PathBuf> {
    let mut files = BTreeMap::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let entries = std::fs::read_dir(&folder)
            .unwrap_or_else(|error| panic!("cannot list {}: {error}", folder.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
                continue;
            }
            let parts: Vec<String> = path
                .strip_prefix(root)
                .unwrap()
                .components()
                .map(|part| part.as_os_str().to_string_lossy().into_owned())
                .collect();
            files.insert(parts.join("/"), path);
        }
    }
    files
}

/// The bytes of every file below `root`, named as [`files`] names them.
pub fn bytes(root: &Path) -> BTreeMap<String, Vec<u8>> {
    files(root)
        .into_iter()
        .map(|(name, path)| (name, std::fs::read(path).unwrap()))
        .collect()
}

/// Stamps every file below `root` with the modification time `seconds` after the epoch, as a
/// checkout made at another moment would have it.
pub fn stamp(root: &Path, seconds: u64) {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(seconds);
    for path in files(root).into_values() {
        let file = std::fs::File::options().write(true).open(&path).unwrap();
        file.set_modified(time).unwrap();
    }
}
