//! `kwheel wheel verify`: re-checks any wheel, whoever wrote it, and lists every problem.
//!
//! | check | a problem when |
//! | --- | --- |
//! | file name | it does not parse as `{name}-{version}(-{build})?-{python}-{abi}-{platform}.whl` |
//! | one reading | the end record, zip64 records, central directory and local headers disagree in any way, or bytes belong to no entry (`zip_directory`) |
//! | zip hygiene | an entry is absolute, has `..`/`.`/empty components, a `\`, a control character, is a directory or a symlink, or appears twice |
//! | `.dist-info` | there is not exactly one, named for the file name's distribution and version, with `METADATA`, `WHEEL` and `RECORD` |
//! | `METADATA` | its `Name`/`Version` are not the file name's |
//! | `WHEEL` | `Wheel-Version` is not 1.x, or its `Tag:` lines differ from the file name's expanded tags |
//! | `RECORD` | a file is unlisted, listed twice, listed but absent, or its hash (sha256/384/512) or size differs; RECORD does not list itself with an empty hash and size |
//! | bundles | under any `…/_prebuilt/index.json`: an artifact or the dictionary is missing, does not decompress, or does not match its digest; a shipped source does not match the index's hash |
//! | warm packs | under a bundle's `packs/`: a pack does not verify against the bundle (as `--add-pack` verifies it), lies in another folder than its `pack.json`'s id, or ships a file its `pack.json` does not list |
//! | audit | a host ELF breaks the platform tag's policy ([`crate::audit`]) |
//! | set | a bundle lists companion part wheels (`_prebuilt/parts.json`): a part is missing beside the wheel, not pinned, fails on its own, holds an artifact another wheel holds too, is over the set's size limit, carries code, entry points or dependencies of its own, or an artifact in it fails its digest (`parts`) |
//!
//! The wheel, and each part of its set, is read once ([`VerifiedWheel`]): opened without
//! following a link, checked by `fstat` to be a regular file under [`MAX_WHEEL_SIZE`], read
//! through that handle; everything after works from that reading, and every command that uses
//! a wheel (`release diff`, `release check --against`) consumes it rather than the path.
//!
//! Entries are read with the zip crate; names, modes, sizes and duplicates come from a walk of
//! the central directory itself, since a zip reader may hide a duplicate or decode a name.
//! Every entry is judged, and checked, under the one name both agree on: an entry whose
//! Info-ZIP Unicode Path extra field (0x7075) names another path than its raw name, or that
//! the zip crate names differently, is a problem and is never read or extracted (an extractor
//! would write the other name). Sizes are limits checked before anything is reserved: the
//! wheel at most [`MAX_WHEEL_SIZE`], an entry at most [`MAX_ENTRY_SIZE`] and
//! [`MAX_ENTRY_RATIO`] times its compressed size, all entries together [`MAX_WHEEL_CONTENT`];
//! inflation stops one byte past the recorded size.
//! Warnings (a should of the spec, such as `.dist-info` last) do not fail verification.
//!
//! | module | checks |
//! | --- | --- |
//! | this one | the file name, zip hygiene, the audit; the report |
//! | `zip_directory` | the central directory as stored, walked without a zip reader |
//! | `dist_info` | `.dist-info`, `METADATA`, `WHEEL`, `RECORD` and its hashes |
//! | `bundles` | every `_prebuilt/` bundle inside, read the way the loader reads it |
//! | `parts` | the set of a registry-sized wheel: its companion parts, found beside it |
//! | `reading` | the one reading of a wheel file that checks and uses share |

mod bundles;
mod dist_info;
mod parts;
mod reading;
mod zip_directory;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::{Cursor, Read as _};
use std::path::{Path, PathBuf};

use bundles::check_bundles;
use dist_info::check_dist_info;
pub use parts::{PartCheck, SetCheck};
#[doc(hidden)]
pub use reading::{after_check, AfterCheck};
pub(crate) use reading::{inside, write_new};
pub use reading::{VerifiedPart, VerifiedWheel};
use zip_directory::{
    central_directory, local_problems, RawEntry, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG,
};

use crate::audit::{audit_file, AuditTarget, ElfKind};
use crate::wheel::{path_problem, WheelFilename};
use crate::Error;

/// Largest wheel file `wheel verify` reads.
pub const MAX_WHEEL_SIZE: u64 = 1 << 30;
/// Largest entry (uncompressed) of a wheel.
pub const MAX_ENTRY_SIZE: u64 = 256 << 20;
/// Largest sum of all entries' uncompressed sizes.
pub const MAX_WHEEL_CONTENT: u64 = 1 << 30;
/// Highest ratio of an entry's uncompressed to compressed size, for entries over 1 MiB
/// (deflate reaches about 1,000:1 on repeated bytes; real wheel files stay far below 100:1).
pub const MAX_ENTRY_RATIO: u64 = 200;

/// A problem with one file of a wheel (or with the wheel, named by its file name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The file, by its path inside the wheel, or the wheel's file name.
    pub file: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file, self.message)
    }
}

/// What verification found in one `_prebuilt/` bundle of a wheel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleCheck {
    /// The bundle's directory inside the wheel (`af3_kernels/_prebuilt/`).
    pub root: String,
    /// Kernels in its index.
    pub kernels: usize,
    /// Variants whose artifacts were decompressed and matched their digests.
    pub variants: usize,
    /// Variants a slim wheel leaves in its store (the index records it): not in the wheel, so
    /// not checked here; `release publish` verifies them in the store.
    pub remote: usize,
    /// Whether it ships kernel sources (without them the JIT fallback cannot run).
    pub sources: bool,
    /// Extension modules decompressed, matched against their digests and audited.
    pub modules: usize,
}

/// Everything [`verify_wheel`] found.
#[derive(Clone, Debug)]
pub struct VerifyReport {
    /// The wheel.
    pub wheel: PathBuf,
    /// Its parsed file name, when it parses.
    pub filename: Option<WheelFilename>,
    /// Files in it.
    pub files: usize,
    /// The paths of the files read, in archive order: what an installer writes when the wheel
    /// passes.
    pub names: Vec<String>,
    /// Its `_prebuilt/` bundles.
    pub bundles: Vec<BundleCheck>,
    /// Host ELF files audited, by path.
    pub host_elfs: Vec<String>,
    /// Cubins recognised (and skipped by the audit).
    pub cubins: usize,
    /// Problems: any makes the wheel fail verification.
    pub problems: Vec<Problem>,
    /// Departures from what the spec recommends, which do not fail it.
    pub warnings: Vec<Problem>,
    /// The registry-sized set this wheel is the main wheel of, checked with it.
    pub set: Option<SetCheck>,
}

impl VerifyReport {
    /// Whether the wheel passed.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    /// The report when the wheel passed, else [`Error::Verification`] listing every problem.
    pub fn into_result(self) -> Result<VerifyReport, Error> {
        if self.is_ok() {
            Ok(self)
        } else {
            Err(Error::Verification {
                wheel: self.wheel,
                problems: self.problems,
            })
        }
    }

    fn problem(&mut self, file: impl Into<String>, message: impl Into<String>) {
        self.problems.push(Problem {
            file: file.into(),
            message: message.into(),
        });
    }

    fn warning(&mut self, file: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(Problem {
            file: file.into(),
            message: message.into(),
        });
    }
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.wheel.file_name().map_or_else(
            || self.wheel.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        writeln!(f, "{name}: {} files", self.files)?;
        if let Some(filename) = &self.filename {
            writeln!(f, "  tags: {}", filename.tags().join(", "))?;
        }
        for bundle in &self.bundles {
            let remote = if bundle.remote > 0 {
                format!(" ({} more in the store)", bundle.remote)
            } else {
                String::new()
            };
            let modules = if bundle.modules > 0 {
                format!(
                    ", {} extension modules verified and audited",
                    bundle.modules
                )
            } else {
                String::new()
            };
            writeln!(
                f,
                "  bundle {}: {} kernels, {} variants verified{remote}{modules}, {}",
                bundle.root,
                bundle.kernels,
                bundle.variants,
                if bundle.sources {
                    "sources shipped"
                } else {
                    "no sources (no JIT fallback)"
                }
            )?;
        }
        if let Some(set) = &self.set {
            writeln!(
                f,
                "  set: {} parts, every file at most {} bytes",
                set.parts.len(),
                set.max_file_size
            )?;
            for part in &set.parts {
                writeln!(
                    f,
                    "  part {}: {} bytes, {} variants verified",
                    part.wheel, part.size, part.variants
                )?;
            }
        }
        writeln!(
            f,
            "  audit: {} host ELF files, {} cubins skipped",
            self.host_elfs.len(),
            self.cubins
        )?;
        for warning in &self.warnings {
            writeln!(f, "  warning: {warning}")?;
        }
        if self.problems.is_empty() {
            writeln!(f, "ok")
        } else {
            writeln!(f, "{} problems:", self.problems.len())?;
            for problem in &self.problems {
                writeln!(f, "  {problem}")?;
            }
            Ok(())
        }
    }
}

/// Verifies the wheel at `path`, read once ([`VerifiedWheel`]). Fails only when it cannot be
/// read at all, or is refused for what it is; everything wrong inside it is a [`Problem`] of
/// the report.
pub fn verify_wheel(path: &Path) -> Result<VerifyReport, Error> {
    VerifiedWheel::open(path).map(VerifiedWheel::into_report)
}

/// The entry names of a zip, read the one way `wheel verify` accepts (see `zip_directory`):
/// an error naming the disagreement when its end records, central directory and local
/// headers could be read two ways. The fuzz target `zip_directory` calls it.
pub fn zip_entry_names(bytes: &[u8]) -> Result<Vec<String>, String> {
    let directory = central_directory(bytes)?;
    if let Some((index, message)) = local_problems(bytes, &directory).into_iter().next() {
        let name = index.map_or_else(
            || "the archive".to_owned(),
            |index| String::from_utf8_lossy(&directory.entries[index].name).into_owned(),
        );
        return Err(format!("{name}: {message}"));
    }
    Ok(directory
        .entries
        .iter()
        .map(|entry| String::from_utf8_lossy(&entry.name).into_owned())
        .collect())
}

/// [`verify_wheel`] on the bytes of the wheel, with `path` naming it (its file name is the
/// wheel's name; parts of a set are looked for beside it). The fuzz target `wheel` calls it.
pub fn verify_wheel_bytes(path: &Path, bytes: &[u8]) -> VerifyReport {
    verify_contents(path, bytes, Reading::Main { keep_parts: false }).0
}

/// What a reading of a wheel is for.
#[derive(Clone, Copy, Debug)]
enum Reading {
    /// A wheel given to verify: the set it is the main wheel of is checked with it, and with
    /// `keep_parts` the verified parts' `_prebuilt/` files are kept.
    Main { keep_parts: bool },
    /// A companion part of a set, checked for the set: a part has no set of its own (a part
    /// that claimed one is refused for the file, and is not followed further).
    Part,
}

/// The files of a wheel that passed the archive checks, by path, and the verified parts of
/// its set (with `keep_parts`).
type Verified = (VerifyReport, BTreeMap<String, Vec<u8>>, Vec<VerifiedPart>);

/// [`verify_wheel_bytes`], returning with the report the files it read and checked, so that
/// what is used is what was verified (and, as `reading` asks, each verified part's
/// `_prebuilt/` files).
fn verify_contents(path: &Path, bytes: &[u8], reading: Reading) -> Verified {
    let wheel_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    let mut report = VerifyReport {
        wheel: path.to_owned(),
        filename: None,
        files: 0,
        names: Vec::new(),
        bundles: Vec::new(),
        host_elfs: Vec::new(),
        cubins: 0,
        problems: Vec::new(),
        warnings: Vec::new(),
        set: None,
    };
    match WheelFilename::parse(&wheel_name) {
        Ok(filename) => report.filename = Some(filename),
        Err(error) => report.problem(&wheel_name, error.to_string()),
    }

    let directory = match central_directory(bytes) {
        Ok(directory) => directory,
        Err(message) => {
            report.problem(
                &wheel_name,
                format!("is not a zip archive every reader reads alike: {message}"),
            );
            return (report, BTreeMap::new(), Vec::new());
        }
    };
    let raw = &directory.entries;
    let mut skip = BTreeSet::new();
    for (index, message) in local_problems(bytes, &directory) {
        match index {
            Some(index) => {
                let name = String::from_utf8_lossy(&raw[index].name).into_owned();
                report.problem(&name, message);
                skip.insert(name);
            }
            None => report.problem(&wheel_name, message),
        }
    }
    let mut seen = BTreeSet::new();
    let mut content = 0u64;
    for entry in raw {
        let name = String::from_utf8_lossy(&entry.name).into_owned();
        if std::str::from_utf8(&entry.name).is_err() {
            report.problem(&name, "the name is not UTF-8");
            skip.insert(name.clone());
        }
        if let Some(unicode) = entry.unicode_path.as_ref().filter(|u| **u != entry.name) {
            report.problem(
                &name,
                format!(
                    "has an Info-ZIP Unicode Path extra field naming `{}`: an extractor \
                     would write that path, not this one",
                    String::from_utf8_lossy(unicode).escape_debug()
                ),
            );
            skip.insert(name.clone());
        }
        content = content.saturating_add(entry.uncompressed_size);
        if entry.uncompressed_size > MAX_ENTRY_SIZE {
            report.problem(
                &name,
                format!(
                    "claims {} bytes, over the {MAX_ENTRY_SIZE}-byte cap on a wheel entry",
                    entry.uncompressed_size
                ),
            );
            skip.insert(name.clone());
        } else if entry.uncompressed_size > 1 << 20
            && entry.uncompressed_size / entry.compressed_size.max(1) > MAX_ENTRY_RATIO
        {
            report.problem(
                &name,
                format!(
                    "inflates {} bytes to {}, more than {MAX_ENTRY_RATIO}:1; refused as a \
                     decompression bomb",
                    entry.compressed_size, entry.uncompressed_size
                ),
            );
            skip.insert(name.clone());
        }
        let mode = (entry.host == 3).then_some(entry.external_attributes >> 16);
        let kind = mode.map(|mode| mode & S_IFMT);
        if kind == Some(S_IFLNK) {
            report.problem(&name, "is a symbolic link; wheels hold regular files only");
            skip.insert(name.clone());
        } else if name.ends_with('/') || kind == Some(S_IFDIR) {
            report.problem(&name, "is a directory entry; wheels list files only");
            skip.insert(name.clone());
        } else if let Some(kind) = kind.filter(|&kind| kind != 0 && kind != S_IFREG) {
            report.problem(
                &name,
                format!("has file type {kind:#o}, not a regular file"),
            );
            skip.insert(name.clone());
        } else if let Some(reason) = path_problem(&name) {
            report.problem(&name, reason);
            skip.insert(name.clone());
        }
        if !seen.insert(name.clone()) {
            report.problem(&name, "appears twice in the archive");
        }
    }
    if content > MAX_WHEEL_CONTENT {
        report.problem(
            &wheel_name,
            format!(
                "holds {content} bytes uncompressed, over the {MAX_WHEEL_CONTENT}-byte cap; \
                 nothing was extracted"
            ),
        );
        return (report, BTreeMap::new(), Vec::new());
    }

    let mut archive = match zip::ZipArchive::new(Cursor::new(bytes)) {
        Ok(archive) => archive,
        Err(error) => {
            report.problem(
                &wheel_name,
                format!("cannot be read as a zip archive: {error}"),
            );
            return (report, BTreeMap::new(), Vec::new());
        }
    };
    // The zip reader's entries, matched to the central directory's by local header offset
    // (the reader may hide a duplicate, so positions can differ).
    let by_offset: BTreeMap<u64, &RawEntry> = raw
        .iter()
        .map(|entry| (entry.local_offset, entry))
        .collect();
    // Path → bytes of every readable regular file, and the archive order.
    let mut contents: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut order = Vec::new();
    for index in 0..archive.len() {
        let mut file = match archive.by_index(index) {
            Ok(file) => file,
            Err(error) => {
                let name = raw
                    .get(index)
                    .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                    .unwrap_or_else(|| format!("entry {index}"));
                report.problem(name, format!("cannot be read: {error}"));
                continue;
            }
        };
        let Some(entry) = by_offset.get(&file.header_start()) else {
            report.problem(
                file.name().escape_debug().to_string(),
                "is not an entry of the central directory",
            );
            continue;
        };
        // The name the hygiene checks judged; the reader must agree on it.
        let name = String::from_utf8_lossy(&entry.name).into_owned();
        if skip.contains(&name) {
            continue;
        }
        if file.name() != name {
            report.problem(
                &name,
                format!(
                    "is named `{}` by the zip reader: an extractor would write that path",
                    file.name().escape_debug()
                ),
            );
            continue;
        }
        let size = entry.uncompressed_size;
        let mut data = Vec::with_capacity(size.min(8 << 20) as usize);
        if let Err(error) = (&mut file).take(size + 1).read_to_end(&mut data) {
            report.problem(&name, format!("cannot be read from the archive: {error}"));
            continue;
        }
        if data.len() as u64 > size {
            report.problem(
                &name,
                format!("inflates past its recorded size of {size} bytes"),
            );
            continue;
        }
        order.push(name.clone());
        contents.insert(name, data);
    }
    report.files = contents.len();
    report.names = order.clone();

    let Some(filename) = report.filename.clone() else {
        return (report, contents, Vec::new());
    };
    check_dist_info(&mut report, &filename, &wheel_name, &order, &contents);
    check_bundles(&mut report, &contents);
    let parts = match reading {
        Reading::Main { keep_parts } => {
            parts::check_set(&mut report, path, bytes.len() as u64, &contents, keep_parts)
        }
        Reading::Part => Vec::new(),
    };
    audit_contents(&mut report, &filename, &contents);
    (report, contents, parts)
}

fn audit_contents(
    report: &mut VerifyReport,
    filename: &WheelFilename,
    contents: &BTreeMap<String, Vec<u8>>,
) {
    let mut targets = Vec::new();
    for tag in filename.platform_tags() {
        match AuditTarget::for_platform(tag) {
            Some(target) => targets.push(target),
            None => report.warning(
                filename.to_string(),
                format!(
                    "no audit policy for platform tag `{tag}`: its host ELF files are not audited"
                ),
            ),
        }
    }
    for (name, bytes) in contents {
        let mut kind = None;
        for target in &targets {
            let audit = audit_file(target, name, bytes);
            kind = kind.or(audit.kind);
            for violation in audit.violations {
                report.problem(name, violation.message());
            }
        }
        let kind = kind.or_else(|| {
            bytes.starts_with(&object::elf::ELFMAG).then(|| {
                if prebuilt::cubin::is_cubin(bytes) {
                    ElfKind::Cubin
                } else {
                    ElfKind::Host
                }
            })
        });
        match kind {
            Some(ElfKind::Cubin) => report.cubins += 1,
            Some(ElfKind::Host) => report.host_elfs.push(name.clone()),
            None => {}
        }
    }
}
