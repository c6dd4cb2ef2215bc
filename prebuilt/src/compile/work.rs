//! The folder a compile runs in: named by the key, at the same absolute path on every machine,
//! with the library's files and the toolkit reached through links inside it, so that nothing a
//! compiler writes into a cubin names the machine, the checkout or a temp folder.
//!
//! ```text
//! /tmp/kwheel-<first 16 hex digits of the key>/    the compile's cwd (and nvcc's TMPDIR)
//! ├── src/                     the library as a bundle's `sources/` lays it out
//! │   ├── <entry> -> …         a link per top-level entry of the library root (the JIT: of
//! │   │                        the bundle's `sources/`)
//! │   └── [n] -> …             include dir n, when it is outside the library root
//! ├── cuda -> …                the toolkit nvcc runs from (its `bin/..`)
//! ├── include/<n> -> …         NVRTC's toolkit include dirs
//! ├── kwheel-entries.cu        the entry probes, when an entry is a name expression
//! └── kernel.cubin, kernel.ptx, …
//! /tmp/kwheel-<…>.lock         locked (flock) while the folder is in use, holder's pid inside
//! ```
//!
//! What compilers embed, as measured with nvcc 13.0 and NVRTC 12.9: `__FILE__` is the path as
//! the compile spells it (relative here: `src/k/k.cu`); `-lineinfo`/`-G` line tables name files
//! by absolute path from the cwd, so by `/tmp/kwheel-<key>/src/…` and `…/cuda/include/…`;
//! nvcc's internal-linkage prefix (`_GLOBAL__N__<hash>`) hashes the real path of the compiled
//! file, which [`super::execute`] sets with cicc's `--orig_src_path_name`, and may end in a
//! number drawn from the process id, which `-frandom-seed=kwheel-<…>` (this folder's name)
//! replaces for nvcc and NVRTC; NVRTC's program
//! name is its `__FILE__` and the base of its quoted includes, so it is given the absolute
//! path inside this folder. `/tmp` rather than `$TMPDIR`, because the folder's path is part of
//! the output. The folder is removed when the compile ends; one left by a killed process is
//! removed by the next compile of that key, under the lock.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

// Called by path: `File` has inherent lock methods of the same names in newer Rust.
use fs4::fs_std::FileExt;

use super::CompileFailure;

/// Where the work folders are: the same on every machine, since their path is in the output.
pub const WORK_ROOT: &str = "/tmp";

/// The library's files as a compile sees them under `src/`: the layout of a bundle's
/// `sources/` (stable paths: relative to the library root, or `[n]/…` under include dir `n`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceTree {
    /// The folder whose entries appear under `src/`: the library root, or a bundle's `sources/`.
    pub root: PathBuf,
    /// Include dirs outside the root, by their index `n`, appearing as `src/[n]`.
    pub outside: Vec<(usize, PathBuf)>,
}

impl SourceTree {
    /// A bundle's `sources/`, which already has the `[n]` folders.
    pub fn shipped(sources: &Path) -> SourceTree {
        SourceTree {
            root: absolute(sources),
            outside: Vec::new(),
        }
    }
}

/// A work folder in use: removed, and its lock released, when dropped.
pub(crate) struct WorkDir {
    path: PathBuf,
    lock: File,
}

impl WorkDir {
    /// Takes the folder of `key`, waiting while another compile of the same key has it, and
    /// lays out `tree` under `src/`.
    pub(crate) fn create(key: &str, tree: &SourceTree) -> Result<WorkDir, CompileFailure> {
        let name: String = key.chars().take(16).collect();
        let path = Path::new(WORK_ROOT).join(format!("kwheel-{name}"));
        let lock_path = path.with_extension("lock");
        let io = |action: &'static str, at: &Path| {
            let at = at.to_path_buf();
            move |source| CompileFailure::Io {
                action,
                path: at,
                source,
            }
        };
        // `/tmp` is shared: the lock must be a regular file of ours (never a link planted
        // there), its wait ends, and the folder is created fresh, private, and checked to be
        // the one made (not a link swapped in).
        let lock = crate::cache::lock_file(&lock_path, lock_timeout()).map_err(|failure| {
            CompileFailure::Io {
                action: "lock the work dir",
                path: lock_path.clone(),
                source: std::io::Error::other(failure.to_string()),
            }
        })?;
        match fs::symlink_metadata(&path) {
            Ok(metadata) if metadata.is_dir() => {
                fs::remove_dir_all(&path).map_err(io("remove the leftover work dir", &path))?
            }
            Ok(_) => fs::remove_file(&path).map_err(io("remove the leftover", &path))?,
            Err(_) => {}
        }
        {
            use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
            fs::DirBuilder::new()
                .mode(0o700)
                .create(&path)
                .map_err(io("create the work dir", &path))?;
            let made = fs::symlink_metadata(&path).map_err(io("create the work dir", &path))?;
            // The lock file was made by this process: the folder's owner must be the same.
            let ours = lock.metadata().is_ok_and(|lock| lock.uid() == made.uid());
            if !made.is_dir() || !ours {
                return Err(CompileFailure::Io {
                    action: "create the work dir",
                    path: path.clone(),
                    source: std::io::Error::other("it is not the private folder just created"),
                });
            }
        }
        let work = WorkDir { path, lock };
        work.lay_out(tree)?;
        Ok(work)
    }

    fn lay_out(&self, tree: &SourceTree) -> Result<(), CompileFailure> {
        let src = self.path.join("src");
        fs::create_dir(&src).map_err(|source| CompileFailure::Io {
            action: "create",
            path: src.clone(),
            source,
        })?;
        let root = absolute(&tree.root);
        let entries = fs::read_dir(&root).map_err(|source| CompileFailure::Io {
            action: "list the library root",
            path: root.clone(),
            source,
        })?;
        for entry in entries {
            let entry = entry.map_err(|source| CompileFailure::Io {
                action: "list the library root",
                path: root.clone(),
                source,
            })?;
            self.link(&entry.path(), &src.join(entry.file_name()))?;
        }
        for (n, dir) in &tree.outside {
            self.link(&absolute(dir), &src.join(format!("[{n}]")))?;
        }
        Ok(())
    }

    /// A link at `at` (inside this folder) to `target`.
    pub(crate) fn link(&self, target: &Path, at: &Path) -> Result<(), CompileFailure> {
        if let Some(parent) = at.parent() {
            fs::create_dir_all(parent).map_err(|source| CompileFailure::Io {
                action: "create",
                path: parent.to_path_buf(),
                source,
            })?;
        }
        std::os::unix::fs::symlink(target, at).map_err(|source| CompileFailure::Io {
            action: "link",
            path: at.to_path_buf(),
            source,
        })
    }

    /// Links the toolkit `nvcc` runs from ([`toolkit_root`]) at `cuda/` in this folder, and
    /// gives nvcc's path through that link: run from there, the toolkit headers it names in
    /// line tables are `…/cuda/include/…` wherever the toolkit is.
    pub(crate) fn link_toolkit(&self, nvcc: &Path) -> Result<PathBuf, CompileFailure> {
        self.link(&toolkit_root(nvcc), &self.path.join("cuda"))?;
        Ok(self
            .path
            .join("cuda")
            .join("bin")
            .join(nvcc.file_name().unwrap_or_default()))
    }

    /// The folder.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        // Links are removed, never followed.
        let _ = fs::remove_dir_all(&self.path);
        let _ = FileExt::unlock(&self.lock);
    }
}

/// How long a compile waits for another one of the same key: `KWHEEL_JIT_LOCK_TIMEOUT` (whole
/// seconds), else [`DEFAULT_LOCK_TIMEOUT`].
fn lock_timeout() -> std::time::Duration {
    std::env::var(crate::env::JIT_LOCK_TIMEOUT_ENV)
        .ok()
        .and_then(|value| value.trim().parse().ok())
        .map_or(DEFAULT_LOCK_TIMEOUT, std::time::Duration::from_secs)
}

/// How long a compile waits for the work folder of its key when no timeout is set: longer
/// than any real compile.
pub const DEFAULT_LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// The toolkit nvcc runs from: its `bin/..`.
pub(crate) fn toolkit_root(nvcc: &Path) -> PathBuf {
    absolute(nvcc)
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// A path that does not depend on the working directory.
pub(crate) fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unique_key() -> String {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.subsec_nanos());
        format!("{:08x}{:08x}", std::process::id(), nanos)
    }

    /// `/tmp` is shared: a link planted where a key's lock goes is refused, and what it points
    /// at is untouched; the folder made is private to its owner.
    #[test]
    fn a_planted_lock_link_is_refused_and_the_folder_is_private() {
        let library = tempfile::tempdir().unwrap();
        fs::write(library.path().join("k.cu"), b"").unwrap();
        let tree = SourceTree {
            root: library.path().to_owned(),
            outside: Vec::new(),
        };

        let key = unique_key();
        let lock = Path::new(WORK_ROOT).join(format!("kwheel-{key}.lock"));
        let victim = library.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, &lock).unwrap();
        let failure = WorkDir::create(&key, &tree).err().expect("refused");
        let _ = fs::remove_file(&lock);
        assert!(
            failure.to_string().contains("lock the work dir"),
            "{failure}"
        );
        assert_eq!(fs::read(&victim).unwrap(), b"precious");

        let key = unique_key();
        let work = WorkDir::create(&key, &tree).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        let mode = fs::symlink_metadata(work.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "{mode:o}");
        assert!(work.path().join("src/k.cu").exists());
        let path = work.path().to_owned();
        drop(work);
        assert!(!path.exists(), "removed when the compile ends");
        let _ = fs::remove_file(path.with_extension("lock"));
    }
}
