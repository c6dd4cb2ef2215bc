//! The one reading of a wheel that every command consumes: `wheel verify`, `release diff`,
//! `release check --against` and the parts of a set.
//!
//! | step | how |
//! | --- | --- |
//! | open | once, by the path as given, without following a symbolic link at its end and without waiting on a FIFO (Linux: `O_NOFOLLOW`, `O_NONBLOCK`) |
//! | check the handle | `fstat` of the opened file: a regular file of at most [`MAX_WHEEL_SIZE`] bytes, else refused (exit 4) |
//! | read | those bytes, through that handle, never more than the cap |
//! | verify | [`super::verify_wheel_bytes`]'s checks, keeping the files that passed |
//! | use | only the files of that reading ([`VerifiedWheel::files`]); each name joined to a folder is checked to stay inside it ([`VerifiedWheel::extract`]) |
//!
//! Nothing opens the path again: a wheel replaced on disk after it was checked (a shared
//! wheel folder) changes nothing that is used. Tests prove it through [`after_check`], which
//! runs between the check and the use.

use prebuilt::untrusted::Unreadable;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use prebuilt::untrusted::{refusal, ArtifactPath};

use super::{verify_contents, Reading, VerifyReport, MAX_WHEEL_SIZE};
use crate::Error;

/// A wheel read once and verified: the report, and the bytes of every file that passed the
/// archive checks, by its path inside the wheel.
#[derive(Debug)]
pub struct VerifiedWheel {
    report: VerifyReport,
    files: BTreeMap<String, Vec<u8>>,
    parts: Vec<VerifiedPart>,
}

/// A companion part of a set, as its verified reading holds it: its import package and the
/// files under its `_prebuilt/`, relative to it.
#[derive(Debug)]
pub struct VerifiedPart {
    /// The part's top-level import package (`af3_kernels_kernels_cu130_sm90`).
    pub import: String,
    /// Its `_prebuilt/` files (`artifacts/…`, `part.json`), relative to `_prebuilt/`.
    pub files: BTreeMap<String, Vec<u8>>,
}

impl VerifiedWheel {
    /// Reads the wheel at `path` once and verifies it. Fails only when it cannot be read at
    /// all, or is refused for what it is (a link, not a regular file, over the cap); anything
    /// wrong inside is a problem of [`VerifiedWheel::report`]. Its parts, if it has any, are
    /// verified and then dropped.
    pub fn open(path: &Path) -> Result<VerifiedWheel, Error> {
        open_wheel(path, false)
    }

    /// [`VerifiedWheel::open`], keeping the `_prebuilt/` files of every companion part that
    /// verified ([`VerifiedWheel::parts`]): what a reader of a registry-sized set's bundle
    /// needs.
    pub fn open_set(path: &Path) -> Result<VerifiedWheel, Error> {
        open_wheel(path, true)
    }

    /// What verification found.
    pub fn report(&self) -> &VerifyReport {
        &self.report
    }

    /// The report alone.
    pub fn into_report(self) -> VerifyReport {
        self.report
    }

    /// The verified wheel when it passed, else [`Error::Verification`] listing every problem.
    pub fn into_result(self) -> Result<VerifiedWheel, Error> {
        if self.report.is_ok() {
            Ok(self)
        } else {
            Err(Error::Verification {
                wheel: self.report.wheel,
                problems: self.report.problems,
            })
        }
    }

    /// Every file of the reading that passed the archive checks, by its path in the wheel.
    pub fn files(&self) -> &BTreeMap<String, Vec<u8>> {
        &self.files
    }

    /// The parts kept by [`VerifiedWheel::open_set`], in the order of `parts.json`.
    pub fn parts(&self) -> &[VerifiedPart] {
        &self.parts
    }

    /// Writes every file whose path starts with `prefix` (`af3_kernels/_prebuilt/`) into
    /// `into`, under its path after the prefix; returns how many. Each name is refused unless
    /// it stays inside `into` (normal `/`-separated components only), and a file is never
    /// written over another, nor through a link.
    pub fn extract(&self, prefix: &str, into: &Path) -> Result<usize, Error> {
        let mut written = 0;
        for (name, bytes) in self.files.range(prefix.to_owned()..) {
            let Some(relative) = name.strip_prefix(prefix) else {
                break;
            };
            let target = inside(into, relative).map_err(|reason| Error::OutsideFolder {
                wheel: self.report.wheel.clone(),
                name: name.clone(),
                folder: into.to_owned(),
                reason,
            })?;
            write_new(&target, bytes).map_err(|source| Error::Write {
                path: target.clone(),
                source,
            })?;
            written += 1;
        }
        Ok(written)
    }
}

fn open_wheel(path: &Path, keep_parts: bool) -> Result<VerifiedWheel, Error> {
    let bytes = read_wheel_file(path, MAX_WHEEL_SIZE).map_err(|source| {
        Error::Read(Unreadable {
            path: path.to_owned(),
            source,
        })
    })?;
    let (report, files, parts) = verify_contents(path, &bytes, Reading::Main { keep_parts });
    drop(bytes);
    after_check_of(path);
    Ok(VerifiedWheel {
        report,
        files,
        parts,
    })
}

/// The bytes of the regular file at `path`, read once through one handle: a symbolic link at
/// the end of the path, a FIFO, a device or a folder is refused, and so is a file over `cap`
/// bytes, judged by `fstat` of the handle that is read (see the module docs).
pub(crate) fn read_wheel_file(path: &Path, cap: u64) -> std::io::Result<Vec<u8>> {
    prebuilt::untrusted::read_opened(open_no_follow(path)?, cap)
}

/// Opens `path` for reading, refusing a symbolic link at its end, without waiting for a
/// FIFO's writer (the `fstat` that follows refuses it).
#[cfg(target_os = "linux")]
fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    use rustix::fs::{Mode, OFlags, CWD};
    let flags =
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::NOFOLLOW;
    match rustix::fs::openat(CWD, path, flags, Mode::empty()) {
        Ok(fd) => Ok(std::fs::File::from(fd)),
        Err(rustix::io::Errno::LOOP) => Err(link_refusal()),
        Err(errno) => Err(errno.into()),
    }
}

/// Elsewhere: the path is looked at without following a link, opened, and the handle must be
/// the file looked at (a file swapped in between is refused by the `fstat` check).
#[cfg(not(target_os = "linux"))]
fn open_no_follow(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::MetadataExt as _;
    let before = std::fs::symlink_metadata(path)?;
    if before.file_type().is_symlink() {
        return Err(link_refusal());
    }
    if !before.is_file() {
        return Err(refusal(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let file = std::fs::File::open(path)?;
    let after = file.metadata()?;
    if (after.dev(), after.ino()) != (before.dev(), before.ino()) {
        return Err(refusal(
            std::io::ErrorKind::InvalidInput,
            "it was replaced while it was opened",
        ));
    }
    Ok(file)
}

fn link_refusal() -> std::io::Error {
    refusal(
        std::io::ErrorKind::InvalidInput,
        "a symbolic link; give the wheel file itself",
    )
}

/// `folder` joined with `name` (a `/`-separated path from a verified reading), or why it
/// would not stay inside `folder`.
pub(crate) fn inside(folder: &Path, name: &str) -> Result<PathBuf, String> {
    ArtifactPath::parse(name)
        .map(|path| path.join_to(folder))
        .map_err(|error| error.to_string())
}

/// Writes `bytes` to a new file at `path`, creating its folders: a file already there (or a
/// link in its place) is an error, not overwritten or followed.
pub(crate) fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?
        .write_all(bytes)
}

/// What [`after_check`] runs.
type Hook = Box<dyn FnMut(&Path)>;

thread_local! {
    /// The test seam of [`after_check`], per thread so that tests running side by side do not
    /// see each other's.
    static AFTER_CHECK: RefCell<Option<Hook>> = const { RefCell::new(None) };
}

/// A test seam: runs `hook` with the path of every wheel (a main wheel or a part) that this
/// thread reads through [`VerifiedWheel`], after it is checked and before any of it is used,
/// until the guard is dropped. Tests replace the file there to prove that nothing reads the
/// path again.
#[doc(hidden)]
pub fn after_check(hook: impl FnMut(&Path) + 'static) -> AfterCheck {
    AFTER_CHECK.with(|slot| *slot.borrow_mut() = Some(Box::new(hook)));
    AfterCheck(())
}

/// Removes the hook of [`after_check`] when dropped.
#[doc(hidden)]
#[must_use = "the hook is removed when the guard is dropped"]
pub struct AfterCheck(());

impl Drop for AfterCheck {
    fn drop(&mut self) {
        AFTER_CHECK.with(|slot| *slot.borrow_mut() = None);
    }
}

/// Runs the hook of [`after_check`], if this thread has one, for `path`.
pub(super) fn after_check_of(path: &Path) {
    // Taken out while it runs, so a hook that reads a wheel itself does not run again.
    let hook = AFTER_CHECK.with(|slot| slot.borrow_mut().take());
    if let Some(mut hook) = hook {
        hook(path);
        AFTER_CHECK.with(|slot| {
            let mut slot = slot.borrow_mut();
            if slot.is_none() {
                *slot = Some(hook);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_leave_the_folder_are_refused_before_any_join() {
        let folder = Path::new("/scratch");
        assert_eq!(
            inside(folder, "artifacts/ab/x.zst").unwrap(),
            folder.join("artifacts/ab/x.zst")
        );
        for name in [
            "../x",
            "a/../../x",
            "/etc/passwd",
            "a//b",
            "./a",
            "",
            "a\\b",
        ] {
            assert!(inside(folder, name).is_err(), "{name:?}");
        }
    }

    #[test]
    fn a_new_file_is_never_written_over_a_file_or_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let kept = dir.path().join("kept");
        std::fs::write(&kept, b"mine").unwrap();
        let link = dir.path().join("a/link");
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&kept, &link).unwrap();
        for path in [&kept, &link] {
            let error = write_new(path, b"theirs").unwrap_err();
            assert_eq!(error.kind(), std::io::ErrorKind::AlreadyExists, "{error}");
        }
        assert_eq!(std::fs::read(&kept).unwrap(), b"mine");
        write_new(&dir.path().join("b/c/new"), b"new").unwrap();
        assert_eq!(std::fs::read(dir.path().join("b/c/new")).unwrap(), b"new");
    }
}
