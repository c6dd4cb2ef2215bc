//! The shipped sources as the JIT reads them: each file of the include graph a regular file
//! inside the bundle's `sources/` after symbolic links, at most [`MAX_SOURCE_SIZE`] bytes, and
//! the sha256 the index records; the include directories inside `sources/` too; and nothing
//! under `sources/` that a compiler could block on (a FIFO, a device, a socket) or that leads
//! out of the bundle, since the compiler opens headers itself, also ones the index does not
//! list.

use std::io;

use super::*;
use crate::untrusted::{read_regular_file, resolve_inside, ArtifactPath, MAX_SOURCE_SIZE};

/// Most entries the JIT looks at under `sources/` before it refuses the tree.
const MAX_SOURCE_ENTRIES: usize = 100_000;

/// The bytes of the shipped file `stable` of `kernel` under `sources` (a bundle's
/// `sources/`), read checked: inside the bundle after links, a regular file, at most
/// [`MAX_SOURCE_SIZE`].
pub(super) fn read_source(kernel: &str, sources: &Path, stable: &str) -> Result<Vec<u8>, JitError> {
    let path = sources.join(stable);
    let failed = |source: io::Error| JitError::SourceRead {
        kernel: kernel.to_owned(),
        stable: stable.to_owned(),
        path: path.clone(),
        source,
    };
    let (bundle_root, relative) = in_bundle(sources, stable);
    let relative = ArtifactPath::parse(&relative)
        .map_err(|refusal| failed(io::Error::new(io::ErrorKind::InvalidInput, refusal)))?;
    let inside = resolve_inside(bundle_root, &relative).map_err(failed)?;
    read_regular_file(&inside, MAX_SOURCE_SIZE).map_err(failed)
}

/// The bundle root above `sources`, and `relative` (under `sources`) as a path relative to
/// it: so a `sources/` linked out of the bundle is refused too.
fn in_bundle<'a>(sources: &'a Path, relative: &str) -> (&'a Path, String) {
    let name = sources
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| SOURCES_DIR.to_owned());
    let root = sources.parent().unwrap_or(sources);
    if relative.is_empty() {
        (root, name)
    } else {
        (root, format!("{name}/{relative}"))
    }
}

/// Checks every shipped file of the include graph against the digest the index records.
pub(super) fn verify_sources(
    kernel: &str,
    sources: &Path,
    files: &BTreeMap<String, String>,
) -> Result<(), JitError> {
    for (stable, expected) in files {
        let actual = sha256_hex(&read_source(kernel, sources, stable)?);
        if actual != *expected {
            return Err(JitError::SourceMismatch {
                kernel: kernel.to_owned(),
                stable: stable.clone(),
                path: sources.join(stable),
                expected: expected.clone(),
                actual,
            });
        }
    }
    Ok(())
}

/// Checks what the compiler will open on its own under `sources` (a bundle's `sources/`):
/// every include directory of `recipe` is inside the bundle after links, and everything under
/// `sources/` is a folder, a regular file of at most [`MAX_SOURCE_SIZE`], or a link that stays
/// inside the bundle.
pub(super) fn check_source_tree(
    kernel: &str,
    sources: &Path,
    recipe: &SourceRecipe,
) -> Result<(), JitError> {
    let refused = |path: PathBuf, source: io::Error| JitError::SourceTree {
        kernel: kernel.to_owned(),
        path,
        source,
    };
    // `relative` under `sources` stays inside the bundle after links.
    let inside = |relative: &str| -> io::Result<()> {
        let (bundle_root, relative) = in_bundle(sources, relative);
        let relative = ArtifactPath::parse(&relative)
            .map_err(|refusal| io::Error::new(io::ErrorKind::InvalidInput, refusal))?;
        resolve_inside(bundle_root, &relative).map(drop)
    };
    inside("").map_err(|error| refused(sources.to_path_buf(), error))?;
    for dir in &recipe.include_dirs {
        let relative = if dir == "." { "" } else { dir.as_str() };
        inside(relative).map_err(|error| refused(sources.join(relative), error))?;
    }
    let mut pending = vec![sources.to_path_buf()];
    let mut seen = 0usize;
    while let Some(dir) = pending.pop() {
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            // No `sources/` at all: the reads of the files report what is missing.
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(refused(dir, error)),
        };
        for entry in entries {
            let entry = entry.map_err(|error| refused(dir.clone(), error))?;
            seen += 1;
            if seen > MAX_SOURCE_ENTRIES {
                return Err(refused(
                    sources.to_path_buf(),
                    io::Error::other(format!("holds more than {MAX_SOURCE_ENTRIES} entries")),
                ));
            }
            let path = entry.path();
            let kind = entry
                .file_type()
                .map_err(|error| refused(path.clone(), error))?;
            let metadata = if kind.is_symlink() {
                let relative = path.strip_prefix(sources).unwrap_or(&path);
                inside(&relative.to_string_lossy())
                    .map_err(|error| refused(path.clone(), error))?;
                match fs::metadata(&path) {
                    Ok(metadata) => metadata,
                    // A dangling link: nothing for the compiler to open.
                    Err(_) => continue,
                }
            } else {
                entry
                    .metadata()
                    .map_err(|error| refused(path.clone(), error))?
            };
            if metadata.is_dir() {
                // A link to a folder inside names what the walk reaches anyway.
                if !kind.is_symlink() {
                    pending.push(path);
                }
            } else if !metadata.is_file() {
                return Err(refused(path, not_regular()));
            } else if metadata.len() > MAX_SOURCE_SIZE {
                let size = metadata.len();
                return Err(refused(
                    path,
                    io::Error::other(format!(
                        "{size} bytes, over the {MAX_SOURCE_SIZE}-byte cap of a shipped source"
                    )),
                ));
            }
        }
    }
    Ok(())
}

fn not_regular() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "not a regular file or folder (a FIFO, a device or a socket would block or flood the \
         compiler)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn recipe() -> SourceRecipe {
        SourceRecipe {
            source: "k.cu".into(),
            include_dirs: vec![".".into(), "include".into()],
        }
    }

    /// A bundle root whose `sources/` holds `k.cu` and `include/h.cuh`.
    fn bundle() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let sources = dir.path().join(SOURCES_DIR);
        fs::create_dir_all(sources.join("include")).unwrap();
        fs::write(sources.join("k.cu"), b"#include \"h.cuh\"\n").unwrap();
        fs::write(sources.join("include/h.cuh"), b"// h\n").unwrap();
        dir
    }

    fn files(root: &Path) -> BTreeMap<String, String> {
        ["k.cu", "include/h.cuh"]
            .into_iter()
            .map(|stable| {
                let bytes = fs::read(root.join(SOURCES_DIR).join(stable)).unwrap();
                (stable.to_owned(), sha256_hex(&bytes))
            })
            .collect()
    }

    #[test]
    fn a_shipped_bundle_reads_and_verifies() {
        let bundle = bundle();
        let root = bundle.path();
        let sources = root.join(SOURCES_DIR);
        verify_sources("k", &sources, &files(root)).unwrap();
        check_source_tree("k", &sources, &recipe()).unwrap();
        assert_eq!(
            read_source("k", &sources, "k.cu").unwrap(),
            b"#include \"h.cuh\"\n"
        );
    }

    #[test]
    fn case_9_a_fifo_source_is_refused_not_waited_on() {
        let bundle = bundle();
        let root = bundle.path();
        let files = files(root);
        let header = root.join(SOURCES_DIR).join("include/h.cuh");
        fs::remove_file(&header).unwrap();
        let status = std::process::Command::new("mkfifo")
            .arg(&header)
            .status()
            .unwrap();
        assert!(status.success());
        let started = std::time::Instant::now();
        let error = verify_sources("k", &root.join(SOURCES_DIR), &files).unwrap_err();
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        let message = error_chain(&error);
        assert!(
            message.contains("`include/h.cuh` of `k`") && message.contains("not a regular file"),
            "{message}"
        );
        // Not listed in the index, the compiler would still open it: the tree is refused.
        let error = check_source_tree("k", &root.join(SOURCES_DIR), &recipe()).unwrap_err();
        assert!(
            error_chain(&error).contains("FIFO"),
            "{}",
            error_chain(&error)
        );
    }

    #[test]
    fn case_9_a_dev_zero_source_is_refused_not_read() {
        let bundle = bundle();
        let root = bundle.path();
        let files = files(root);
        let header = root.join(SOURCES_DIR).join("include/h.cuh");
        fs::remove_file(&header).unwrap();
        // A link to /dev/zero leads out of the bundle; refused before it is opened.
        symlink("/dev/zero", &header).unwrap();
        let error = error_chain(&verify_sources("k", &root.join(SOURCES_DIR), &files).unwrap_err());
        assert!(error.contains("leads out of the bundle"), "{error}");
        let error =
            error_chain(&check_source_tree("k", &root.join(SOURCES_DIR), &recipe()).unwrap_err());
        assert!(error.contains("leads out of the bundle"), "{error}");
    }

    #[test]
    fn case_9_a_source_linked_out_of_the_bundle_is_refused() {
        let bundle = bundle();
        let root = bundle.path();
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("h.cuh");
        // The same bytes, so the digest agrees: the link alone is what is refused.
        fs::copy(root.join(SOURCES_DIR).join("include/h.cuh"), &secret).unwrap();
        let files = files(root);
        fs::remove_file(root.join(SOURCES_DIR).join("include/h.cuh")).unwrap();
        symlink(&secret, root.join(SOURCES_DIR).join("include/h.cuh")).unwrap();
        let error = error_chain(&verify_sources("k", &root.join(SOURCES_DIR), &files).unwrap_err());
        assert!(error.contains("leads out of the bundle"), "{error}");

        // An include directory linked out is refused too, whatever it holds.
        let bundle = self::bundle();
        let root = bundle.path();
        fs::remove_dir_all(root.join(SOURCES_DIR).join("include")).unwrap();
        symlink(outside.path(), root.join(SOURCES_DIR).join("include")).unwrap();
        let error =
            error_chain(&check_source_tree("k", &root.join(SOURCES_DIR), &recipe()).unwrap_err());
        assert!(
            error.contains("include") && error.contains("leads out of the bundle"),
            "{error}"
        );
    }

    #[test]
    fn case_9_an_oversized_source_is_refused_at_the_cap() {
        let bundle = bundle();
        let root = bundle.path();
        let header = root.join(SOURCES_DIR).join("include/h.cuh");
        let file = fs::File::create(&header).unwrap();
        // Sparse: the size is over the cap without writing 64 MiB.
        file.set_len(MAX_SOURCE_SIZE + 1).unwrap();
        let error =
            error_chain(&read_source("k", &root.join(SOURCES_DIR), "include/h.cuh").unwrap_err());
        assert!(error.contains("cap"), "{error}");
    }
}
