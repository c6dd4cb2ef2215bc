//! The output folder: what kwheel may replace there, the staging folder beside it, and the
//! swap that puts a finished bundle in its place whole.

use super::*;
use prebuilt::untrusted::Unreadable;

/// Fills a new directory through `fill` in a hidden sibling of `out`, then swaps it into
/// place (see the module docs): `out` must be absent, empty, or hold exactly what kwheel
/// writes for `kind`; concurrent calls on one `out` serialize on its lock.
pub fn stage_directory(
    out: &Path,
    kind: OutputKind,
    fill: impl FnOnce(&Path) -> Result<(), Error>,
) -> Result<(), Error> {
    Output::lock(out, kind.into())?.stage(fill)
}

/// What kwheel writes into an output folder, and so what it may replace there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputKind {
    /// A bundle: `index.json` and the files it names.
    Bundle,
    /// A shard directory: `shard.json` and the files it names.
    Shard,
}

impl From<OutputKind> for Replaceable {
    fn from(kind: OutputKind) -> Replaceable {
        match kind {
            OutputKind::Bundle => Replaceable::Bundle,
            OutputKind::Shard => Replaceable::Shard,
        }
    }
}

/// What an existing output folder must hold to be replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Replaceable {
    /// A bundle by the strict reading of [`vocabulary`].
    Bundle,
    /// A shard by the strict reading of [`vocabulary`].
    Shard,
    /// What `bundle extract` wrote, by its [`EXTRACTION_MARKER`]: the marker and the
    /// `<kernel>/<build>/<arch>.cubin` files it lists.
    Extracted,
}

/// An output folder, locked for this run, recovered from a killed run's leftovers, and
/// checked to be replaceable.
pub(super) struct Output {
    out: PathBuf,
    parent: PathBuf,
    name: String,
    _lock: File,
}

impl Output {
    pub(super) fn lock(out: &Path, replaceable: Replaceable) -> Result<Output, Error> {
        let refuse = |reason: &str| Error::Output {
            path: out.to_owned(),
            reason: reason.to_owned(),
        };
        let name = match out.file_name() {
            Some(name)
                if !matches!(
                    out.components().next_back(),
                    Some(std::path::Component::ParentDir)
                ) =>
            {
                name.to_string_lossy().into_owned()
            }
            _ => {
                return Err(refuse(
                    "it does not name a folder (give a path that ends in a name)",
                ))
            }
        };
        let parent = out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_owned();
        std::fs::create_dir_all(&parent).map_err(|source| Error::Write {
            path: parent.clone(),
            source,
        })?;
        let lock_path = parent.join(format!(".{name}.lock"));
        let lock_error = |source| Error::Write {
            path: lock_path.clone(),
            source,
        };
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(lock_error)?;
        FileExt::lock_exclusive(&lock).map_err(lock_error)?;
        let output = Output {
            out: out.to_owned(),
            parent,
            name,
            _lock: lock,
        };
        output.recover(replaceable)?;
        check_replaceable(out, replaceable)?;
        Ok(output)
    }

    /// Puts back an old bundle a kill left between the two renames, and removes the other
    /// leftovers of killed runs. Only the lock holder calls it, so none is in use.
    fn recover(&self, replaceable: Replaceable) -> Result<(), Error> {
        let Ok(entries) = std::fs::read_dir(&self.parent) else {
            return Ok(());
        };
        let tmp = format!(".{}.tmp-", self.name);
        let old = format!(".{}.old-", self.name);
        let mut leftovers: Vec<(bool, PathBuf)> = entries
            .flatten()
            .filter_map(|entry| {
                let file_name = entry.file_name().to_string_lossy().into_owned();
                let is_old = file_name.starts_with(&old);
                (is_old || file_name.starts_with(&tmp)).then(|| (is_old, entry.path()))
            })
            .collect();
        leftovers.sort();
        for (is_old, path) in leftovers {
            let restorable = is_old && std::fs::symlink_metadata(&self.out).is_err();
            // A folder itself (not a link to one) holding the marker.
            let staging = !is_old
                && std::fs::symlink_metadata(&path).is_ok_and(|metadata| metadata.is_dir())
                && std::fs::symlink_metadata(path.join(STAGING_MARKER))
                    .is_ok_and(|metadata| metadata.is_file());
            let verdict = if staging {
                staging_leftover(&path, replaceable)
            } else {
                check_replaceable(&path, replaceable).map_err(|error| error.to_string())
            };
            if restorable && verdict.is_ok() {
                std::fs::rename(&path, &self.out).map_err(|source| Error::Write {
                    path: self.out.clone(),
                    source,
                })?;
                continue;
            }
            match verdict {
                Ok(()) => {
                    let _ = std::fs::remove_dir_all(&path);
                }
                // Not kwheel's to remove: left as it is, and said so.
                Err(error) => {
                    tracing::warn!("warning: leaving `{}` in place: {error}", path.display())
                }
            }
        }
        Ok(())
    }

    /// Fills a staging sibling through `fill`, then swaps it into place.
    pub(super) fn stage(self, fill: impl FnOnce(&Path) -> Result<(), Error>) -> Result<(), Error> {
        let write_error = |path: &Path| {
            let path = path.to_owned();
            move |source| Error::Write { path, source }
        };
        let staging = tempfile::Builder::new()
            .prefix(&format!(".{}.tmp-", self.name))
            .tempdir_in(&self.parent)
            .map_err(write_error(&self.parent))?;
        let marker = staging.path().join(STAGING_MARKER);
        std::fs::write(&marker, b"").map_err(write_error(&marker))?;
        fill(staging.path())?;
        std::fs::remove_file(&marker).map_err(write_error(&marker))?;
        let staged = staging.keep();
        self.swap_into_place(&staged).inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&staged);
        })
    }

    fn swap_into_place(&self, staged: &Path) -> Result<(), Error> {
        let out = &self.out;
        let write_error = |source| Error::Write {
            path: out.to_owned(),
            source,
        };
        if std::fs::symlink_metadata(out).is_err() {
            return std::fs::rename(staged, out).map_err(write_error);
        }
        if exchange(staged, out).is_ok() {
            // `staged` now holds the old content.
            let _ = std::fs::remove_dir_all(staged);
            return Ok(());
        }
        let old = tempfile::Builder::new()
            .prefix(&format!(".{}.old-", self.name))
            .tempdir_in(&self.parent)
            .map_err(write_error)?
            .keep();
        std::fs::remove_dir(&old).map_err(write_error)?;
        std::fs::rename(out, &old).map_err(write_error)?;
        if let Err(source) = std::fs::rename(staged, out) {
            let _ = std::fs::rename(&old, out);
            return Err(write_error(source));
        }
        let _ = std::fs::remove_dir_all(&old);
        Ok(())
    }
}

/// Swaps two paths in one step (Linux `renameat2` with `RENAME_EXCHANGE`).
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    renameat_with(CWD, a, CWD, b, RenameFlags::EXCHANGE).map_err(std::io::Error::from)
}

#[cfg(not(target_os = "linux"))]
fn exchange(_: &Path, _: &Path) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// Refuses early (before any compile) an output folder that a bundle, or with `shard` a
/// shard, may not replace. The writer checks again under the lock.
pub fn check_output(out: &Path, shard: bool) -> Result<(), Error> {
    let kind = if shard {
        Replaceable::Shard
    } else {
        Replaceable::Bundle
    };
    check_replaceable(out, kind)
}

/// Whether `out` may be replaced: absent, an empty folder, or one holding what kwheel writes
/// there; otherwise an error naming the folder and what is in it.
fn check_replaceable(out: &Path, replaceable: Replaceable) -> Result<(), Error> {
    let refuse = |reason: String| Error::Output {
        path: out.to_owned(),
        reason,
    };
    let metadata = match std::fs::symlink_metadata(out) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(Error::Read(Unreadable {
                path: out.to_owned(),
                source,
            }))
        }
    };
    if metadata.file_type().is_symlink() {
        return Err(refuse(
            "it is a symbolic link; give the folder itself".into(),
        ));
    }
    if !metadata.is_dir() {
        return Err(refuse("it is not a folder".into()));
    }
    let read_error = |source| {
        Error::Read(Unreadable {
            path: out.to_owned(),
            source,
        })
    };
    let mut names = std::fs::read_dir(out)
        .map_err(read_error)?
        .map(|entry| entry.map(|entry| entry.file_name()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(read_error)?;
    if names.is_empty() {
        return Ok(());
    }
    names.sort();
    let foreign = |entry: &Path, what: &str| {
        refuse(format!(
            "it holds `{}`, which kwheel does not write into {what}: kwheel replaces only an \
             empty folder or one it wrote; give a new folder",
            entry.display()
        ))
    };
    match replaceable {
        Replaceable::Bundle | Replaceable::Shard => {
            let (marker, what) = if replaceable == Replaceable::Bundle {
                (INDEX_FILE, "a bundle")
            } else {
                (crate::shard_file::SHARD_FILE, "a shard")
            };
            let files = match vocabulary(out, replaceable) {
                Ok(files) => files,
                Err(reason) => {
                    // Name what is not the index, which the reason speaks of.
                    let named = names
                        .iter()
                        .find(|name| name.as_os_str() != marker)
                        .unwrap_or(&names[0]);
                    return Err(refuse(format!(
                        "it is not empty (it holds `{}`) and {reason}: kwheel replaces only an \
                         empty folder or one it wrote; give a new folder",
                        named.to_string_lossy()
                    )));
                }
            };
            match foreign_to(out, &files) {
                None => Ok(()),
                Some(entry) => Err(foreign(
                    entry.strip_prefix(out).unwrap_or(&entry),
                    &format!("{what} with this `{marker}`"),
                )),
            }
        }
        Replaceable::Extracted => match foreign_to_extraction(out) {
            Ok(None) => Ok(()),
            Ok(Some(foreign)) => Err(refuse(format!(
                "it holds `{}`, which the earlier extraction's `{EXTRACTION_MARKER}` does not \
                 list: kwheel replaces only an empty folder or an earlier extraction, as it \
                 left it; give a new folder",
                foreign.strip_prefix(out).unwrap_or(&foreign).display()
            ))),
            Err(reason) => Err(refuse(format!(
                "it holds `{}` and {reason}: kwheel replaces only an empty folder or an \
                 earlier extraction, which holds the `{EXTRACTION_MARKER}` kwheel writes; \
                 give a new folder",
                names[0].to_string_lossy()
            ))),
        },
    }
}
