//! Wheels: the binary distribution format (PEP 427 and the living spec that replaced it),
//! written so that the same inputs give the same bytes.
//!
//! ```text
//! af3_kernels-0.1.0-py3-none-manylinux_2_28_x86_64.whl
//! ├── af3_kernels/__init__.py                              deflated, 0644
//! ├── af3_kernels/_prebuilt/artifacts/5a/5a0d…e1.cubin.zst stored: zstd already
//! ├── af3_kernels/_prebuilt/index.json                     deflated
//! └── af3_kernels-0.1.0.dist-info/                         last
//!     ├── METADATA                                         Metadata-Version 2.1, Requires-Dist
//!     ├── WHEEL                                            one `Tag:` per expanded tag
//!     └── RECORD                                           last of all; lists itself as `RECORD,,`
//! ```
//!
//! What makes two writes byte-identical:
//!
//! | what | rule |
//! | --- | --- |
//! | order | entries sorted by path, `.dist-info` after them, `RECORD` the very last |
//! | times | every entry at `SOURCE_DATE_EPOCH` (UTC), else 1980-01-01 00:00:00, the earliest a zip stores |
//! | modes | 0644; 0755 for executables and shared libraries (`.so`, `.so.N`) |
//! | compression | deflate level 9 (pure-Rust miniz_oxide, the same bytes on every CPU); stored for data that is compressed already (`.zst`, `.zdict`, cubins, …) |
//! | entries | files only: no directory entries, no extra fields, no comments |
//!
//! A wheel is written to a hidden temporary file in the output directory and renamed into
//! place, so a reader never sees half a wheel. Before the rename, every host ELF file inside is
//! audited against the policy its platform tag names ([`crate::audit`]).
//!
//! | module | owns |
//! | --- | --- |
//! | this one | [`WheelSpec`], [`WheelFile`] and [`write_wheel`]: the deterministic writer |
//! | `filename` | [`WheelFilename`]: parsing, normalizing and expanding tags |
//! | `dist_info` | the `.dist-info` texts: [`Metadata`], `WHEEL`, `RECORD` |
//! | [`parts`] | cutting a wheel into a registry-sized set: a main wheel and its companion parts |

mod dist_info;
mod filename;
pub mod parts;

use prebuilt::untrusted::Unreadable;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};

use prebuilt::cache::PendingFile;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime, ZipWriter};

use crate::audit::{audit_file, AuditTarget};
use crate::Error;

/// The kwheel version, as `Generator:` and the runtime requirement state it.
pub const KWHEEL_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The `Metadata-Version` written.
pub const METADATA_VERSION: &str = "2.1";

/// The `Wheel-Version` written, and the major version a reader accepts.
pub const WHEEL_VERSION: &str = "1.0";

/// 1980-01-01T00:00:00Z, the earliest time a zip entry can hold: the mtime of every entry
/// when `SOURCE_DATE_EPOCH` is not set.
pub const DEFAULT_EPOCH: u64 = 315_532_800;

/// 2107-12-31T23:59:58Z, the latest time a zip entry can hold.
const LATEST_EPOCH: u64 = 4_354_819_198;

const DEFLATE_LEVEL: i64 = 9;

/// Extensions of data that is compressed already, so deflating it again only costs time.
const STORED_EXTENSIONS: [&str; 9] = [
    "zst", "zdict", "cubin", "gz", "xz", "bz2", "zip", "whl", "png",
];

pub(crate) use dist_info::path_problem;
pub use dist_info::{
    parse_headers, parse_record, record_hash, record_text, wheel_text, Metadata, RecordEntry,
};
use filename::escape_version;
pub use filename::{normalize_name, WheelFilename};

/// Where a file's bytes come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Contents {
    /// Bytes in memory.
    Bytes(Vec<u8>),
    /// A file on disk, read when the wheel is written.
    Disk(PathBuf),
}

/// One file of a wheel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WheelFile {
    /// Its path inside the wheel (`af3_kernels/__init__.py`).
    pub path: String,
    /// Its bytes.
    pub contents: Contents,
    /// Whether it is installed executable (0755). Shared libraries are, whatever this says.
    pub executable: bool,
}

impl WheelFile {
    /// A file with these bytes.
    pub fn from_bytes(path: impl Into<String>, bytes: impl Into<Vec<u8>>) -> WheelFile {
        WheelFile {
            path: path.into(),
            contents: Contents::Bytes(bytes.into()),
            executable: false,
        }
    }

    /// The file at `disk`, executable when its owner may execute it.
    pub fn from_disk(
        path: impl Into<String>,
        disk: impl Into<PathBuf>,
    ) -> Result<WheelFile, Error> {
        let disk = disk.into();
        let metadata = std::fs::metadata(&disk).map_err(|source| {
            Error::Read(Unreadable {
                path: disk.clone(),
                source,
            })
        })?;
        Ok(WheelFile {
            path: path.into(),
            executable: is_executable(&metadata),
            contents: Contents::Disk(disk),
        })
    }

    fn read(&self) -> Result<std::borrow::Cow<'_, [u8]>, Error> {
        match &self.contents {
            Contents::Bytes(bytes) => Ok(bytes.into()),
            Contents::Disk(path) => std::fs::read(path).map(Into::into).map_err(|source| {
                Error::Read(Unreadable {
                    path: path.clone(),
                    source,
                })
            }),
        }
    }

    fn mode(&self) -> u32 {
        if self.executable || is_shared_library(&self.path) {
            0o755
        } else {
            0o644
        }
    }
}

#[cfg(unix)]
fn is_executable(metadata: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    metadata.permissions().mode() & 0o100 != 0
}

#[cfg(not(unix))]
fn is_executable(_: &std::fs::Metadata) -> bool {
    false
}

/// `libx.so` or a versioned `libx.so.1.2`; not a compressed frame of one (`<sha256>.so.zst`).
fn is_shared_library(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.ends_with(".so")
        || name
            .split_once(".so.")
            .is_some_and(|(_, version)| version.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// Everything a wheel is made of.
#[derive(Clone, Debug)]
pub struct WheelSpec {
    /// The file name, which also gives the tags.
    pub filename: WheelFilename,
    /// The core metadata; its name and version must match the file name's.
    pub metadata: Metadata,
    /// The files, in any order; the `.dist-info` files are generated.
    pub files: Vec<WheelFile>,
    /// The directory the wheel is written to (created if missing).
    pub out_dir: PathBuf,
    /// The mtime of every entry, in seconds since 1970; `None` takes `SOURCE_DATE_EPOCH`, else
    /// [`DEFAULT_EPOCH`].
    pub modified: Option<u64>,
}
/// Writes the wheel `spec` describes into its output directory and returns its path.
///
/// Fails without leaving a file behind when a path is unusable, METADATA and the file name
/// disagree, a file cannot be read, or a host ELF file breaks the platform tag's policy.
pub fn write_wheel(spec: &WheelSpec) -> Result<PathBuf, Error> {
    let filename = &spec.filename;
    let metadata_id = format!(
        "{}-{}",
        normalize_name(&spec.metadata.name),
        escape_version(&spec.metadata.version)?
    );
    let filename_id = format!("{}-{}", normalize_name(filename.name()), filename.version());
    if metadata_id != filename_id {
        return Err(Error::NameMismatch {
            metadata: format!("{} {}", spec.metadata.name, spec.metadata.version),
            filename: filename.to_string(),
        });
    }
    let targets: Vec<(String, AuditTarget)> = filename
        .platform_tags()
        .iter()
        .map(|tag| {
            AuditTarget::for_platform(tag)
                .map(|target| (tag.clone(), target))
                .ok_or_else(|| Error::NoPolicy { tag: tag.clone() })
        })
        .collect::<Result<_, _>>()?;

    let dist_info = filename.dist_info();
    let mut files: Vec<&WheelFile> = spec.files.iter().collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    for (n, file) in files.iter().enumerate() {
        let invalid = |reason: String| Error::InvalidEntry {
            path: file.path.clone(),
            reason,
        };
        if let Some(reason) = path_problem(&file.path) {
            return Err(invalid(reason));
        }
        let top = file.path.split('/').next().unwrap_or_default();
        if top.ends_with(".dist-info") {
            return Err(invalid(format!(
                "`{top}/` is reserved: kwheel writes the wheel's own `{dist_info}/`"
            )));
        }
        if n > 0 && files[n - 1].path == file.path {
            return Err(invalid("two files have this path".into()));
        }
    }

    let modified = zip_time(match spec.modified {
        Some(seconds) => seconds,
        None => source_date_epoch()?.unwrap_or(DEFAULT_EPOCH),
    });
    std::fs::create_dir_all(&spec.out_dir).map_err(|source| Error::Write {
        path: spec.out_dir.clone(),
        source,
    })?;
    let target = spec.out_dir.join(filename.to_string());
    let temp = PendingFile::new(&target).map_err(|source| Error::Write {
        path: spec.out_dir.clone(),
        source,
    })?;
    let mut archive = Archive {
        zip: ZipWriter::new(BufWriter::new(temp.as_file())),
        path: &target,
        modified,
        record: Vec::new(),
    };
    let mut violations = Vec::new();
    for file in &files {
        let bytes = file.read()?;
        for (_, target) in &targets {
            violations.extend(audit_file(target, &file.path, &bytes).violations);
        }
        archive.add(&file.path, &bytes, file.mode())?;
    }
    if !violations.is_empty() {
        return Err(Error::Audit {
            wheel: filename.to_string(),
            policy: targets
                .iter()
                .map(|(tag, _)| tag.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            violations,
        });
    }
    archive.add(
        &format!("{dist_info}/METADATA"),
        spec.metadata.to_text().as_bytes(),
        0o644,
    )?;
    archive.add(
        &format!("{dist_info}/WHEEL"),
        wheel_text(filename).as_bytes(),
        0o644,
    )?;
    archive.finish(&format!("{dist_info}/RECORD"))?;

    let write_error = |source| Error::Write {
        path: target.clone(),
        source,
    };
    temp.sync().map_err(write_error)?;
    set_readable(temp.path()).map_err(write_error)?;
    temp.persist().map_err(write_error)?;
    Ok(target)
}

/// The zip being written, and the RECORD rows of what is in it.
struct Archive<'a, W: std::io::Write + std::io::Seek> {
    zip: ZipWriter<W>,
    /// The wheel's final path, for error messages.
    path: &'a Path,
    modified: DateTime,
    record: Vec<RecordEntry>,
}

impl<W: std::io::Write + std::io::Seek> Archive<'_, W> {
    fn add(&mut self, path: &str, bytes: &[u8], mode: u32) -> Result<(), Error> {
        let method = if is_precompressed(path, bytes) {
            CompressionMethod::Stored
        } else {
            CompressionMethod::Deflated
        };
        self.start(path, method, mode)?;
        self.zip
            .write_all(bytes)
            .map_err(|source| self.write_error(source))?;
        self.record.push(RecordEntry {
            path: path.to_owned(),
            hash: record_hash(bytes),
            size: bytes.len().to_string(),
        });
        Ok(())
    }

    fn start(&mut self, path: &str, method: CompressionMethod, mode: u32) -> Result<(), Error> {
        let options = SimpleFileOptions::default()
            .compression_method(method)
            .compression_level((method == CompressionMethod::Deflated).then_some(DEFLATE_LEVEL))
            .last_modified_time(self.modified)
            .unix_permissions(mode);
        self.zip
            .start_file(path, options)
            .map_err(|source| self.zip_error(source))
    }

    /// Writes RECORD (listing itself with no hash or size) and the central directory.
    fn finish(mut self, record_path: &str) -> Result<(), Error> {
        self.record.push(RecordEntry {
            path: record_path.to_owned(),
            hash: String::new(),
            size: String::new(),
        });
        let text = record_text(&self.record);
        self.start(record_path, CompressionMethod::Deflated, 0o644)?;
        self.zip
            .write_all(text.as_bytes())
            .map_err(|source| self.write_error(source))?;
        let path = self.path;
        let mut buffer = self.zip.finish().map_err(|source| Error::Zip {
            path: path.to_owned(),
            source,
        })?;
        buffer.flush().map_err(|source| Error::Write {
            path: path.to_owned(),
            source,
        })
    }

    fn zip_error(&self, source: zip::result::ZipError) -> Error {
        Error::Zip {
            path: self.path.to_owned(),
            source,
        }
    }

    fn write_error(&self, source: std::io::Error) -> Error {
        Error::Write {
            path: self.path.to_owned(),
            source,
        }
    }
}

/// A temp file is created 0600; a wheel (or an sdist) is for others to read.
#[cfg(unix)]
pub(crate) fn set_readable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
}

#[cfg(not(unix))]
pub(crate) fn set_readable(_: &Path) -> std::io::Result<()> {
    Ok(())
}

fn is_precompressed(path: &str, bytes: &[u8]) -> bool {
    let extension = path.rsplit_once('.').map(|(_, e)| e).unwrap_or_default();
    STORED_EXTENSIONS.contains(&extension) || prebuilt::cubin::is_cubin(bytes)
}

/// The wheel files of the warm packs `packs` (`kwheel jit export` wrote them), each read once
/// and verified against `bundle` ([`prebuilt::jit::pack::verify_pack`]), under
/// `<root>/packs/<id>/` where the loader reads them (`docs/warm-packs.md`). The files are the
/// bytes that were verified, never the pack's files read again.
pub fn warm_pack_files(
    bundle: &prebuilt::Bundle,
    root: &str,
    packs: &[PathBuf],
) -> Result<Vec<WheelFile>, Error> {
    use prebuilt::jit::pack::{verify_pack, BUNDLE_PACKS_DIR};
    let mut files = Vec::new();
    for pack in packs {
        let verified = verify_pack(pack, bundle).map_err(Box::new)?;
        let id = verified.id();
        for (relative, bytes) in verified.into_files() {
            let name = format!("{root}/{BUNDLE_PACKS_DIR}/{id}/{relative}");
            files.push(WheelFile::from_bytes(name, bytes));
        }
    }
    Ok(files)
}

/// The `.dist-info` of `wheel` without `RECORD` (which speaks for the wheel's other files),
/// unpacked into `into` as PEP 517's `prepare_metadata_for_build_wheel` leaves it; returns the
/// folder's name (`af3_kernels-0.1.0.dist-info`).
pub fn unpack_dist_info(wheel: &Path, into: &Path) -> Result<String, Error> {
    use std::io::Read as _;
    let read_error = |source| {
        Error::Read(Unreadable {
            path: wheel.to_owned(),
            source,
        })
    };
    let name = wheel.file_name().unwrap_or_default().to_string_lossy();
    let dist_info = WheelFilename::parse(&name)?.dist_info();
    let file = std::fs::File::open(wheel).map_err(read_error)?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| read_error(e.into()))?;
    let folder = into.join(&dist_info);
    let write_error = |path: &Path, source| Error::Write {
        path: path.to_owned(),
        source,
    };
    std::fs::create_dir_all(&folder).map_err(|source| write_error(&folder, source))?;
    for file_name in ["METADATA", "WHEEL"] {
        let mut bytes = Vec::new();
        archive
            .by_name(&format!("{dist_info}/{file_name}"))
            .map_err(|e| read_error(e.into()))?
            .read_to_end(&mut bytes)
            .map_err(read_error)?;
        let path = folder.join(file_name);
        std::fs::write(&path, bytes).map_err(|source| write_error(&path, source))?;
    }
    Ok(dist_info)
}

/// `SOURCE_DATE_EPOCH`, when it is set and not empty.
pub fn source_date_epoch() -> Result<Option<u64>, Error> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(value) if value.trim().is_empty() => Ok(None),
        Ok(value) => value
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| Error::SourceDateEpoch { value }),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(value)) => Err(Error::SourceDateEpoch {
            value: value.to_string_lossy().into_owned(),
        }),
    }
}

/// The zip (DOS) time of `seconds` since 1970 in UTC, clamped to what a zip can hold.
fn zip_time(seconds: u64) -> DateTime {
    let seconds = seconds.clamp(DEFAULT_EPOCH, LATEST_EPOCH);
    let days = (seconds / 86_400) as i64;
    let in_day = seconds % 86_400;
    let (year, month, day) = civil_from_days(days);
    DateTime::from_date_and_time(
        year as u16,
        month as u8,
        day as u8,
        (in_day / 3600) as u8,
        (in_day / 60 % 60) as u8,
        (in_day % 60) as u8,
    )
    .unwrap_or_default()
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_match_known_days() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(3652), (1980, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_786), (2026, 11, 29));
    }

    #[test]
    fn zip_time_is_utc_and_clamped() {
        let time = zip_time(1_764_424_800); // 2025-11-29T14:00:00Z
        assert_eq!(
            (time.year(), time.month(), time.day(), time.hour()),
            (2025, 11, 29, 14)
        );
        let time = zip_time(0);
        assert_eq!((time.year(), time.month(), time.day()), (1980, 1, 1));
    }

    #[test]
    fn record_fields_are_quoted_only_when_needed() {
        let row = |path: &str, hash: &str, size: &str| RecordEntry {
            path: path.into(),
            hash: hash.into(),
            size: size.into(),
        };
        let rows = vec![
            row("a/b.py", "sha256=x", "3"),
            row("a,b.py", "sha256=y", "4"),
            row("say \"hi\".txt", "sha256=z", "5"),
            row("line\rbreak\n.txt", "sha256=w", "6"),
            row("d/RECORD", "", ""),
        ];
        let text = record_text(&rows);
        assert_eq!(
            text,
            "a/b.py,sha256=x,3\n\"a,b.py\",sha256=y,4\n\"say \"\"hi\"\".txt\",sha256=z,5\n\
             \"line\rbreak\n.txt\",sha256=w,6\nd/RECORD,,\n"
        );
        assert_eq!(parse_record(&text).unwrap(), rows);
        // Blank lines and CRLF line ends (a RECORD edited on Windows) read the same.
        let crlf = "a/b.py,sha256=x,3\r\n\r\nd/RECORD,,\r\n";
        assert_eq!(
            parse_record(crlf).unwrap(),
            [rows[0].clone(), rows[4].clone()]
        );
    }

    #[test]
    fn record_rows_need_three_fields() {
        let error = parse_record("a,b\n").unwrap_err();
        assert_eq!(error, "line 1: 2 fields, not 3 (path, hash, size)");
        let error = parse_record("a,b,1\n\nc,d,2,e\n").unwrap_err();
        assert_eq!(error, "line 3: 4 fields, not 3 (path, hash, size)");
    }

    #[test]
    fn paths_that_escape_or_hide_are_refused() {
        for (path, expected) in [
            ("../x", "the path has a `..` component"),
            ("/etc/x", "the path is absolute"),
            ("a\u{1}b", "the path holds control character '\\u{1}'"),
            ("a/", "it is a directory entry; wheels list files only"),
            ("a//b", "the path has an empty component (`//`)"),
        ] {
            assert_eq!(path_problem(path).as_deref(), Some(expected), "{path}");
        }
        assert_eq!(path_problem("af3_kernels/__init__.py"), None);
    }
}
