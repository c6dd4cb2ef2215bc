//! The writer's vocabulary: the names of everything it writes into a folder, by which an
//! existing folder is recognised as kwheel's to replace or remove.
//!
//! | folder | replaced or removed when every entry is |
//! | --- | --- |
//! | a bundle | `index.json` that [`parse_index`] accepts, `kernels.idx`, `dictionary.zdict` when the index has one, `artifacts/xx/<digest>.cubin.zst` (`.so.zst` for an extension module) and `dictionaries/xx/<digest>.zst` for the digests it records, `sources/<path>` for the sources it lists |
//! | a shard | `shard.json` that the merge accepts, `cubins/xx/<digest>.cubin` for its variants, `sources/<path>` for its sources |
//! | an extraction | `.kwheel-extraction`, and the files it lists, each of its listed size |
//! | a staging folder (a killed run's) | `.kwheel-staging`, the names above (by the index or shard file when one is already written, else by their shape), and the writer's temporary files beside them |
//!
//! Only regular files and folders count: a symbolic link, a FIFO or a device anywhere makes the
//! folder foreign, whatever it is called. Names come from digests, never from the paths an
//! index records, so an index cannot vouch for a file the writer would not have written.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use prebuilt::bundle::{
    artifact_path, dictionary_path, parse_index, ARTIFACTS_DIR, DICTIONARIES_DIR, DICTIONARY_FILE,
    INDEX_FILE, SOURCES_DIR,
};
use prebuilt::index::Index;
use prebuilt::lookup::LOOKUP_FILE;
use prebuilt::untrusted::{read_regular_file, MAX_INDEX_SIZE};

use super::{Replaceable, EXTRACTION_MARKER, STAGING_MARKER};
use crate::shard_file::{CUBINS_DIR, SHARD_FILE};

/// The relative paths of the files the writer makes in one folder, and the folders on the
/// way to them.
#[derive(Debug, Default)]
pub(super) struct Vocabulary {
    files: BTreeSet<PathBuf>,
    dirs: BTreeSet<PathBuf>,
}

impl Vocabulary {
    fn insert(&mut self, relative: &str) {
        let path = PathBuf::from(relative);
        for ancestor in path.ancestors().skip(1) {
            if !ancestor.as_os_str().is_empty() {
                self.dirs.insert(ancestor.to_owned());
            }
        }
        self.files.insert(path);
    }

    fn accepts(&self, relative: &Path, is_dir: bool) -> bool {
        if is_dir {
            self.dirs.contains(relative)
        } else {
            self.files.contains(relative)
        }
    }
}

/// The files kwheel writes for the bundle (with [`Replaceable::Shard`], the shard) at `dir`,
/// read from its index (shard file); an error saying why when that file is missing or is not
/// kwheel's.
pub(super) fn vocabulary(dir: &Path, kind: Replaceable) -> Result<Vocabulary, String> {
    match kind {
        Replaceable::Shard => {
            let files = crate::shard_file::shard_files(dir).map_err(|error| {
                format!(
                    "has no kwheel `{SHARD_FILE}` ({})",
                    prebuilt::error_chain(&error)
                )
            })?;
            let mut vocabulary = Vocabulary::default();
            for file in &files {
                vocabulary.insert(file);
            }
            Ok(vocabulary)
        }
        _ => {
            let path = dir.join(INDEX_FILE);
            let bytes = read_regular_file(&path, MAX_INDEX_SIZE)
                .map_err(|error| format!("has no readable kwheel `{INDEX_FILE}` ({error})"))?;
            let index = parse_index(&path, &bytes).map_err(|error| {
                format!(
                    "its `{INDEX_FILE}` is not a kwheel index ({})",
                    prebuilt::error_chain(&error)
                )
            })?;
            Ok(bundle_vocabulary(&index))
        }
    }
}

/// Every file [`super::write_bundle`] writes for `index`.
fn bundle_vocabulary(index: &Index) -> Vocabulary {
    let mut vocabulary = Vocabulary::default();
    vocabulary.insert(INDEX_FILE);
    vocabulary.insert(LOOKUP_FILE);
    if index.dictionary.is_some() {
        vocabulary.insert(DICTIONARY_FILE);
    }
    for record in index.kernels.values() {
        for variant in &record.variants {
            vocabulary.insert(&artifact_path(&variant.artifact.digest));
            if let Some(family) = &variant.artifact.dictionary {
                vocabulary.insert(&dictionary_path(family));
            }
        }
        for stable in record.inputs.files.keys() {
            vocabulary.insert(&format!("{SOURCES_DIR}/{stable}"));
        }
    }
    for record in index.modules.values() {
        for variant in &record.variants {
            vocabulary.insert(&prebuilt::module::module_path(&variant.artifact.digest));
        }
        // The module's own files ship for the JIT fallback; torch's (`[1]/…`) do not.
        for stable in record.inputs.files.keys().filter(|s| !s.starts_with('[')) {
            vocabulary.insert(&format!("{SOURCES_DIR}/{stable}"));
        }
    }
    vocabulary
}

/// The first entry under `root` (sorted by name, depth first) that `vocabulary` does not
/// name; `None` when there is none.
pub(super) fn foreign_to(root: &Path, vocabulary: &Vocabulary) -> Option<PathBuf> {
    first_foreign(root, root, &|relative, is_dir| {
        vocabulary.accepts(relative, is_dir)
    })
}

/// Largest [`EXTRACTION_MARKER`] read: a line per cubin, for hundreds of thousands of them.
const MAX_EXTRACTION_MARKER: u64 = 64 << 20;

/// The first entry under `root` that the extraction there did not write: anything but its
/// [`EXTRACTION_MARKER`] and the files the marker lists with their sizes (and the folders on
/// the way to them). An error saying why when `root` holds no marker kwheel wrote.
pub(super) fn foreign_to_extraction(root: &Path) -> Result<Option<PathBuf>, String> {
    let path = root.join(EXTRACTION_MARKER);
    let missing = |error: std::io::Error| match error.kind() {
        std::io::ErrorKind::NotFound => format!("no `{EXTRACTION_MARKER}`"),
        _ => format!("no `{EXTRACTION_MARKER}` that kwheel can read ({error})"),
    };
    // Regular files only (a link in its place is refused), capped.
    let bytes = read_regular_file_no_link(&path, MAX_EXTRACTION_MARKER).map_err(missing)?;
    let text = String::from_utf8(bytes).map_err(|_| {
        format!("a `{EXTRACTION_MARKER}` that is not one kwheel writes (not UTF-8)")
    })?;
    let mut listed = std::collections::BTreeMap::new();
    for line in text.lines() {
        let parsed = line
            .split_once(' ')
            .and_then(|(size, relative)| Some((size.parse::<u64>().ok()?, relative)))
            .filter(|(_, relative)| shaped_like_extraction(Path::new(relative), false));
        let Some((size, relative)) = parsed else {
            return Err(format!(
                "a `{EXTRACTION_MARKER}` that is not one kwheel writes (line `{}`)",
                line.escape_debug()
            ));
        };
        listed.insert(PathBuf::from(relative), size);
    }
    let mut vocabulary = Vocabulary::default();
    for relative in listed.keys() {
        vocabulary.insert(&relative.to_string_lossy());
    }
    let accept = |relative: &Path, is_dir: bool| {
        if is_dir {
            return vocabulary.accepts(relative, true);
        }
        relative == Path::new(EXTRACTION_MARKER)
            || listed.get(relative).is_some_and(|&size| {
                std::fs::symlink_metadata(root.join(relative))
                    .is_ok_and(|metadata| metadata.is_file() && metadata.len() == size)
            })
    };
    Ok(first_foreign(root, root, &accept))
}

/// The regular file at `path`, opened without following a link in its place (nor waiting on
/// a FIFO) and read whole, at most `cap` bytes.
fn read_regular_file_no_link(path: &Path, cap: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK;
        options.custom_flags(flags.bits() as i32);
    }
    let file = options.open(path)?;
    let metadata = file.metadata()?;
    if !metadata.is_file() || metadata.len() > cap {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("not a regular file of at most {cap} bytes"),
        ));
    }
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    file.take(cap).read_to_end(&mut bytes)?;
    Ok(bytes)
}

fn shaped_like_extraction(relative: &Path, is_dir: bool) -> bool {
    let parts: Vec<&str> = relative
        .components()
        .map(|component| match component {
            Component::Normal(name) => name.to_str().unwrap_or("."),
            _ => ".",
        })
        .collect();
    if parts.iter().any(|part| part.starts_with('.')) {
        return false;
    }
    match (parts.len(), is_dir) {
        (1 | 2, true) => true,
        (3, false) => parts[2].ends_with(".cubin") || parts[2].ends_with(".ptx"),
        // An extension module: `modules/<module>/<build>/<cpu>.so`.
        (3, true) => parts[0] == "modules",
        (4, false) => parts[0] == "modules" && parts[3].ends_with(".so"),
        _ => false,
    }
}

/// Whether the leftover `dir` (holding the staging marker) is a killed run's staging folder
/// for a `kind` output, so that removing it loses nothing kwheel did not write; else why not,
/// naming the entry.
pub(super) fn staging_leftover(dir: &Path, kind: Replaceable) -> Result<(), String> {
    // Once the index (shard file) is written, it names every file; before, names go by shape.
    let written = match kind {
        Replaceable::Extracted => None,
        _ => [Replaceable::Bundle, Replaceable::Shard]
            .into_iter()
            .find_map(|kind| vocabulary(dir, kind).ok()),
    };
    let accept = |relative: &Path, is_dir: bool| {
        let named = |relative: &Path, is_dir: bool| match (&written, kind) {
            (Some(vocabulary), _) => vocabulary.accepts(relative, is_dir),
            (None, Replaceable::Extracted) => shaped_like_extraction(relative, is_dir),
            (None, _) => shaped_like_output(relative, is_dir),
        };
        relative == Path::new(STAGING_MARKER)
            || (kind == Replaceable::Extracted && relative == Path::new(EXTRACTION_MARKER))
            || named(relative, is_dir)
            || (!is_dir && temporary_of(relative).is_some_and(|file| named(&file, false)))
    };
    match first_foreign(dir, dir, &accept) {
        None => Ok(()),
        Some(entry) => Err(format!(
            "it is named like a staging folder of kwheel's but holds `{}`, which kwheel does \
             not write there",
            entry.strip_prefix(dir).unwrap_or(&entry).display()
        )),
    }
}

/// Whether `relative` has the shape of a file (`is_dir`: a folder) the writer makes in a
/// bundle or shard, by name alone: what a staging folder holds before its index names it.
fn shaped_like_output(relative: &Path, is_dir: bool) -> bool {
    let parts: Vec<&str> = relative
        .components()
        .map(|component| match component {
            Component::Normal(name) => name.to_str().unwrap_or("\0"),
            _ => "\0",
        })
        .collect();
    let hex = |text: &str, len: usize| {
        text.len() == len
            && text
                .bytes()
                .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
    };
    let digest_file = |prefix: &str, name: &str, suffix: &str| {
        name.strip_suffix(suffix)
            .is_some_and(|digest| hex(digest, 64) && digest.starts_with(prefix))
    };
    let suffix = |dir: &str| match dir {
        ARTIFACTS_DIR => Some(".cubin.zst"),
        DICTIONARIES_DIR => Some(".zst"),
        CUBINS_DIR => Some(".cubin"),
        _ => None,
    };
    match (parts.as_slice(), is_dir) {
        ([name], false) => [INDEX_FILE, LOOKUP_FILE, DICTIONARY_FILE, SHARD_FILE].contains(name),
        ([name], true) => *name == SOURCES_DIR || suffix(name).is_some(),
        // Source paths are the library's own; inside `sources/` any file or folder will do.
        ([first, ..], _) if *first == SOURCES_DIR => true,
        ([dir, prefix], true) => suffix(dir).is_some() && hex(prefix, 2),
        ([dir, prefix, name], false) => {
            hex(prefix, 2)
                && (suffix(dir).is_some_and(|suffix| digest_file(prefix, name, suffix))
                    || (*dir == ARTIFACTS_DIR && digest_file(prefix, name, ".so.zst")))
        }
        _ => false,
    }
}

/// The file a temporary file of [`prebuilt::cache::PendingFile`] stands for:
/// `dir/.<name>.<pid>.<random>.tmp` → `dir/<name>` (`<random>` letters and digits; older
/// writers counted, `dir/.<name>.<pid>.<n>.tmp`).
fn temporary_of(relative: &Path) -> Option<PathBuf> {
    let name = relative.file_name()?.to_str()?;
    let inner = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let mut parts = inner.rsplitn(3, '.');
    let (random, pid, file) = (parts.next()?, parts.next()?, parts.next()?);
    let digits = |text: &str| !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit());
    let alphanumeric =
        !random.is_empty() && random.bytes().all(|byte| byte.is_ascii_alphanumeric());
    (alphanumeric && digits(pid) && !file.is_empty()).then(|| relative.with_file_name(file))
}

/// The first entry under `dir` (relative to `root`) that `accept` refuses, or that is neither
/// a regular file nor a folder (a link is never followed); entries in name order.
fn first_foreign(root: &Path, dir: &Path, accept: &dyn Fn(&Path, bool) -> bool) -> Option<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Some(dir.to_owned());
    };
    let mut entries: Vec<_> = match entries.collect::<Result<Vec<_>, _>>() {
        Ok(entries) => entries,
        Err(_) => return Some(dir.to_owned()),
    };
    entries.sort_by_key(|entry| entry.file_name());
    for entry in entries {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            return Some(path);
        };
        let relative = path.strip_prefix(root).unwrap_or(&path);
        if kind.is_dir() && accept(relative, true) {
            if let Some(foreign) = first_foreign(root, &path, accept) {
                return Some(foreign);
            }
        } else if !(kind.is_file() && accept(relative, false)) {
            return Some(path);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_files_stand_for_the_file_they_replace() {
        assert_eq!(
            temporary_of(Path::new("artifacts/ab/.x.cubin.zst.123.4.tmp")),
            Some(PathBuf::from("artifacts/ab/x.cubin.zst"))
        );
        assert_eq!(
            temporary_of(Path::new(".index.json.9.0.tmp")),
            Some(PathBuf::from("index.json"))
        );
        assert_eq!(
            temporary_of(Path::new(".kernels.idx.4242.aZ09bQ.tmp")),
            Some(PathBuf::from("kernels.idx"))
        );
        for not in [
            ".index.json.tmp",
            "index.json.1.2.tmp",
            ".x.a.2.tmp",
            "..1.2.tmp",
            ".x.1.a-b.tmp",
        ] {
            assert_eq!(temporary_of(Path::new(not)), None, "{not}");
        }
    }

    #[test]
    fn output_shapes_are_named_by_digests() {
        let digest = format!("ab{}", "0".repeat(62));
        let shaped = |path: &str, is_dir| shaped_like_output(Path::new(path), is_dir);
        assert!(shaped(&format!("artifacts/ab/{digest}.cubin.zst"), false));
        assert!(shaped(&format!("cubins/ab/{digest}.cubin"), false));
        assert!(shaped(&format!("dictionaries/ab/{digest}.zst"), false));
        assert!(shaped("sources/layernorm/layernorm.cu", false));
        assert!(shaped("index.json", false));
        assert!(!shaped(&format!("artifacts/cd/{digest}.cubin.zst"), false));
        assert!(!shaped("artifacts/ab/thesis.tex", false));
        assert!(!shaped("thesis.tex", false));
        assert!(!shaped("index.json", true));
        assert!(!shaped("sources", false));
    }
}
