//! Metadata that comes from outside (a bundle's index, a shard manifest, a store, a wheel),
//! parsed into types that cannot name a file outside the folder they are joined to, and the
//! caps that keep every size read from a file or the network a limit, not an allocation.
//!
//! | type | holds | refuses |
//! | --- | --- | --- |
//! | [`Digest`] | a sha256, 64 lowercase hex digits | anything else (upper case, multi-byte characters, `..`, `/`) |
//! | [`KernelName`] | a kernel's name, an identifier (`layernorm_bf16`) | separators, `..`, dots, control characters, empty or over [`MAX_NAME_LEN`] |
//! | [`ArtifactPath`] | a relative path of `/`-separated normal components | absolute paths, `..`, `.`, empty components, `\`, control characters |
//! | [`LittleEndianFields`] | the integers of a binary record, by offset | a field past the end (`None`, never a panic) |
//!
//! [`check_index`] runs every check over a parsed index before any of its paths is joined;
//! [`read_regular_file`] reads only a regular file and never more than a cap. A file refused
//! for what it is (not a regular file, over a cap, a link out of its folder) is an
//! [`std::io::Error`] holding a [`RefusedFile`], so callers that report I/O still can, and the
//! CLI tells it apart from a failure to read ([`is_refusal`]): a refusal is a verification
//! failure, exit code 4. [`Unreadable`] is the one failure to read a file that the bundler's and
//! the release machinery's errors carry.
//! `docs/security.md` gives the threat model and the caps.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use crate::index::{Index, KernelRecord, StoredFile};

/// A file that could not be read (or was refused: [`is_refusal`] tells which), with its path.
#[derive(Debug, thiserror::Error)]
#[error("cannot read `{}`", path.display())]
pub struct Unreadable {
    /// The file.
    pub path: PathBuf,
    /// The cause.
    #[source]
    pub source: std::io::Error,
}

impl Unreadable {
    /// The failure to read `path`, as `map_err` takes it: `.map_err(Unreadable::at(&path))?`.
    pub fn at(path: &Path) -> impl FnOnce(std::io::Error) -> Unreadable {
        let path = path.to_owned();
        move |source| Unreadable { path, source }
    }
}

/// Little-endian fields of bytes from outside (a wheel's zip records, a cubin's line table),
/// each read bounds-checked: `None` where the field runs past the end.
#[derive(Clone, Copy, Debug)]
pub struct LittleEndianFields<'a>(pub &'a [u8]);

impl LittleEndianFields<'_> {
    fn array<const N: usize>(&self, at: usize) -> Option<[u8; N]> {
        self.0.get(at..at.checked_add(N)?)?.try_into().ok()
    }

    /// The `u16` at byte `at`.
    pub fn u16(&self, at: usize) -> Option<u16> {
        self.array(at).map(u16::from_le_bytes)
    }

    /// The `u32` at byte `at`.
    pub fn u32(&self, at: usize) -> Option<u32> {
        self.array(at).map(u32::from_le_bytes)
    }

    /// The `u64` at byte `at`.
    pub fn u64(&self, at: usize) -> Option<u64> {
        self.array(at).map(u64::from_le_bytes)
    }
}

/// Largest cubin (uncompressed) or stored artifact kwheel reads: a limit checked before any
/// memory is reserved for it, and what the loader may hold for one cubin. The largest of
/// FlashInfer's 15,970 production cubins is 624,480 bytes; 64 MiB leaves about 100 times that
/// for larger kernels and `-G`/`-lineinfo` builds (docs/security.md, Caps).
pub const MAX_ARTIFACT_SIZE: u64 = 64 << 20;
/// Largest zstd dictionary (the writer trains at most 112 KiB).
pub const MAX_DICTIONARY_SIZE: u64 = 16 << 20;
/// Largest `index.json` or `shard.json` (a 16,000-variant index is 18 MB).
pub const MAX_INDEX_SIZE: u64 = 128 << 20;
/// Largest shipped kernel source file.
pub const MAX_SOURCE_SIZE: u64 = 64 << 20;
/// Longest kernel name.
pub const MAX_NAME_LEN: usize = 128;
/// Longest relative path inside a bundle.
pub const MAX_PATH_LEN: usize = 1024;

/// Untrusted metadata that does not pass: what it is, the value (escaped, shortened) and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} `{value}` {reason}")]
pub struct Untrusted {
    /// What the value is (`the digest of kernel `x` (cu129/sm_90a)`).
    pub what: String,
    /// The value, with control characters escaped and at most 80 characters.
    pub value: String,
    /// Why it is refused.
    pub reason: String,
}

impl Untrusted {
    pub(crate) fn new(
        what: impl Into<String>,
        value: &str,
        reason: impl Into<String>,
    ) -> Untrusted {
        Untrusted {
            what: what.into(),
            value: Untrusted::shown(value),
            reason: reason.into(),
        }
    }

    /// `value` as a message shows it: control characters escaped, at most 80 characters.
    fn shown(value: &str) -> String {
        let mut shown: String = value.chars().take(80).collect::<String>();
        if shown.len() < value.len() {
            shown.push('…');
        }
        shown.escape_debug().to_string()
    }

    /// The same refusal, said of `what`.
    pub(crate) fn of(mut self, what: impl Into<String>) -> Untrusted {
        self.what = what.into();
        self
    }
}

/// How many names a message lists before "and N more".
pub const LISTED_NAMES: usize = 8;

/// `names` for a message, backquoted: at most [`LISTED_NAMES`] of them, then `and N more`, so a
/// bundle of many names (or a crafted one) never makes an error text grow with its size.
/// `none` when there is none.
pub fn listed_names<S: AsRef<str>>(names: &[S]) -> String {
    if names.is_empty() {
        return "none".to_owned();
    }
    let mut listed: Vec<String> = names
        .iter()
        .take(LISTED_NAMES)
        .map(|name| format!("`{}`", Untrusted::shown(name.as_ref())))
        .collect();
    if names.len() > LISTED_NAMES {
        listed.push(format!("and {} more", names.len() - LISTED_NAMES));
    }
    listed.join(", ")
}

/// A file refused for what it is rather than for a failure to read it: not a regular file
/// (a FIFO, a device, a folder), over a cap, or reached through a symbolic link that leads out
/// of its folder. Carried inside an [`std::io::Error`]; see [`is_refusal`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RefusedFile(String);

/// An [`std::io::Error`] of `kind` that is a [`RefusedFile`] saying `message`.
pub fn refusal(kind: std::io::ErrorKind, message: impl Into<String>) -> std::io::Error {
    std::io::Error::new(kind, RefusedFile(message.into()))
}

/// Whether `error` is a refusal ([`RefusedFile`]) rather than a failure to read.
pub fn is_refusal(error: &std::io::Error) -> bool {
    error
        .get_ref()
        .is_some_and(|inner| inner.is::<RefusedFile>())
}

/// A sha256 digest: exactly 64 lowercase hex digits.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(String);

impl Digest {
    /// Parses `text`, refusing anything but 64 lowercase hex digits.
    pub fn parse(text: &str) -> Result<Digest, Untrusted> {
        Digest::check(text)?;
        Ok(Digest(text.to_owned()))
    }

    /// What [`Digest::parse`] checks, without keeping the text.
    fn check(text: &str) -> Result<(), Untrusted> {
        if text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            Ok(())
        } else {
            Err(Untrusted::new(
                "digest",
                text,
                "is not a sha256 (64 lowercase hex digits)",
            ))
        }
    }

    /// The digest's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Its first two hex digits, the shard directory of content-addressed layouts.
    pub fn prefix(&self) -> &str {
        &self.0[..2]
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A kernel's name: an identifier (`[A-Za-z_][A-Za-z0-9_]*`), as the manifest requires, so it
/// is one path component and never `.` or `..`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KernelName(String);

impl KernelName {
    /// Parses `text`, refusing anything but an identifier of at most [`MAX_NAME_LEN`] bytes.
    pub fn parse(text: &str) -> Result<KernelName, Untrusted> {
        KernelName::check(text)?;
        Ok(KernelName(text.to_owned()))
    }

    /// What [`KernelName::parse`] checks, without keeping the text.
    fn check(text: &str) -> Result<(), Untrusted> {
        let mut chars = text.chars();
        let identifier = matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
            && chars.all(|c| c == '_' || c.is_ascii_alphanumeric());
        if !identifier {
            return Err(Untrusted::new(
                "kernel name",
                text,
                "is not an identifier (letters, digits and `_`, not starting with a digit)",
            ));
        }
        if text.len() > MAX_NAME_LEN {
            return Err(Untrusted::new(
                "kernel name",
                text,
                format!("is longer than {MAX_NAME_LEN} bytes"),
            ));
        }
        Ok(())
    }

    /// The name's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for KernelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A path relative to a folder: `/`-separated normal components, so joining it to the folder
/// names something inside it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ArtifactPath(String);

impl ArtifactPath {
    /// Parses `text`, refusing absolute paths, `..`, `.`, empty components, `\`, control
    /// characters, and paths over [`MAX_PATH_LEN`] bytes.
    pub fn parse(text: &str) -> Result<ArtifactPath, Untrusted> {
        ArtifactPath::check(text)?;
        Ok(ArtifactPath(text.to_owned()))
    }

    /// What [`ArtifactPath::parse`] checks, without keeping the text.
    fn check(text: &str) -> Result<(), Untrusted> {
        // The common case in one pass over the bytes; anything else gets the checks below,
        // in their order, for the refusal's reason.
        if ArtifactPath::is_plain(text) {
            return Ok(());
        }
        let refuse = |reason: &str| Err(Untrusted::new("path", text, reason));
        if text.is_empty() {
            return refuse("is empty");
        }
        if text.len() > MAX_PATH_LEN {
            return refuse(&format!("is longer than {MAX_PATH_LEN} bytes"));
        }
        if text.starts_with('/') {
            return refuse("is absolute");
        }
        if text.contains('\\') {
            return refuse("contains `\\`");
        }
        if text.chars().any(char::is_control) {
            return refuse("contains a control character");
        }
        for component in text.split('/') {
            match component {
                "" => return refuse("has an empty component"),
                "." | ".." => return refuse(&format!("has a `{component}` component")),
                _ => {}
            }
        }
        Ok(())
    }

    /// Whether `text` passes [`ArtifactPath::check`] as printable ASCII without a backslash: not
    /// empty nor over [`MAX_PATH_LEN`], not absolute, no empty, `.` or `..` component.
    fn is_plain(text: &str) -> bool {
        let bytes = text.as_bytes();
        (1..=MAX_PATH_LEN).contains(&bytes.len())
            && bytes
                .iter()
                .all(|&byte| (b' '..b'\x7f').contains(&byte) && byte != b'\\')
            && bytes
                .split(|&byte| byte == b'/')
                .all(|component| !matches!(component, b"" | b"." | b".."))
    }

    /// The path's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `root` joined with this path: lexically inside `root`.
    pub fn join_to(&self, root: &Path) -> PathBuf {
        root.join(&self.0)
    }
}

impl fmt::Display for ArtifactPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks every name, path, digest and size of an index before anything of it is used:
/// kernel names are identifiers, stored paths and source paths are [`ArtifactPath`]s, digests
/// are [`Digest`]s, sizes are within the caps.
pub fn check_index(index: &Index) -> Result<(), Untrusted> {
    if let Some(dictionary) = &index.dictionary {
        check_stored(dictionary, MAX_DICTIONARY_SIZE, "the dictionary")?;
    }
    // A digest names one content, so one size: two records that disagree cannot both be
    // right, and a reader that checks a shared artifact once must not take the first claim.
    let mut sizes: BTreeMap<&str, (u64, &str)> = BTreeMap::new();
    for (name, record) in &index.kernels {
        check_kernel(name, record)?;
        for variant in &record.variants {
            let artifact = &variant.artifact;
            let (size, first) = *sizes
                .entry(&artifact.digest)
                .or_insert((artifact.size, name));
            if size != artifact.size {
                return Err(Untrusted::new(
                    format!("the size of `{name}` ({})", variant.label()),
                    &artifact.size.to_string(),
                    format!(
                        "is not the {size} bytes recorded for the same digest {} (kernel `{first}`)",
                        artifact.digest
                    ),
                ));
            }
        }
    }
    for (name, record) in &index.modules {
        KernelName::parse(name).map_err(|e| e.of("an extension module's name".to_owned()))?;
        for variant in &record.variants {
            let what = || format!("extension module `{name}` ({})", variant.label());
            check_stored_as(&variant.artifact, MAX_ARTIFACT_SIZE, &what)?;
            Digest::check(&variant.key).map_err(|e| e.of(format!("the key of {}", what())))?;
        }
    }
    Ok(())
}

/// [`check_index`] for one kernel: its name, its artifacts, its keys and its source paths.
pub fn check_kernel(name: &str, record: &KernelRecord) -> Result<(), Untrusted> {
    KernelName::check(name)?;
    for variant in &record.variants {
        // Named only in a refusal: every first load checks its kernel's record.
        let what = || format!("`{name}` ({})", variant.label());
        check_stored_as(&variant.artifact, MAX_ARTIFACT_SIZE, &what)?;
        Digest::check(&variant.key).map_err(|e| e.of(format!("the key of {}", what())))?;
        // Values the compiler computed are only ever of what the kernel's inputs declare.
        let declared = &record.inputs.computed;
        let undeclared = variant
            .functions
            .iter()
            .flat_map(|function| function.computed.keys())
            .find(|constant| !declared.constants.contains_key(*constant))
            .map(|constant| ("computed constant", constant))
            .or_else(|| {
                let structs = variant.structs.keys();
                structs
                    .into_iter()
                    .find(|name| !declared.structs.contains_key(*name))
                    .map(|name| ("struct layout", name))
            });
        if let Some((kind, value)) = undeclared {
            return Err(Untrusted {
                what: format!("a {kind} of {}", what()),
                value: value.clone(),
                reason: "is not among the kernel's declared `computed` inputs".to_owned(),
            });
        }
    }
    for (stable, digest) in &record.inputs.files {
        Digest::check(digest)
            .map_err(|e| e.of(format!("the digest of input `{stable}` of `{name}`")))?;
    }
    if !record.inputs.requires.is_empty() {
        // Parsed once here, so that no caller of a checked record meets text that does not
        // parse (the bundler wrote it checked; a crafted index may not be).
        crate::requires::check(&record.inputs.requires, &record.constants).map_err(|refused| {
            Untrusted {
                what: "the requirements of kernel".to_owned(),
                value: name.to_owned(),
                reason: format!("do not check: {refused}"),
            }
        })?;
    }
    if let Some(recipe) = &record.recipe {
        // Shipped sources are joined under `sources/`: each must stay there.
        for stable in record.inputs.files.keys() {
            ArtifactPath::check(stable)
                .map_err(|e| e.of(format!("source path of kernel `{name}`")))?;
        }
        ArtifactPath::check(&recipe.source)
            .map_err(|e| e.of(format!("the translation unit of kernel `{name}`")))?;
        for dir in &recipe.include_dirs {
            // `.` (the sources root itself) is an include directory; nothing else that is
            // not a plain relative path is.
            if dir != "." {
                ArtifactPath::check(dir)
                    .map_err(|e| e.of(format!("include directory of kernel `{name}`")))?;
            }
        }
    }
    Ok(())
}

/// Checks a stored file's digest, path and sizes (`what` names it in the refusal).
pub fn check_stored(stored: &StoredFile, cap: u64, what: &str) -> Result<(), Untrusted> {
    check_stored_as(stored, cap, &|| what.to_owned())
}

/// [`check_stored`], the name made only for a refusal: what every first load checks.
pub fn check_stored_as(
    stored: &StoredFile,
    cap: u64,
    what: &dyn Fn() -> String,
) -> Result<(), Untrusted> {
    Digest::check(&stored.digest).map_err(|e| e.of(format!("the digest of {}", what())))?;
    if let Some(dictionary) = &stored.dictionary {
        Digest::check(dictionary).map_err(|e| e.of(format!("the dictionary of {}", what())))?;
    }
    // A bundle being written has no stored path yet; one read from disk always has.
    if !stored.path.is_empty() {
        ArtifactPath::check(&stored.path).map_err(|e| e.of(format!("the path of {}", what())))?;
    }
    for (size, name) in [(stored.size, "size"), (stored.stored_size, "stored size")] {
        if size > cap {
            return Err(Untrusted::new(
                format!("the {name} of {}", what()),
                &size.to_string(),
                format!("is over the {cap}-byte cap"),
            ));
        }
    }
    Ok(())
}

/// Opens `path` for reading only if it is a regular file, looked at before opening (opening a
/// FIFO for reading blocks until a writer comes) and again after (it may have been swapped).
pub fn open_regular_file(path: &Path) -> std::io::Result<std::fs::File> {
    let refuse_kind = |metadata: std::fs::Metadata| -> std::io::Result<()> {
        if metadata.is_file() {
            Ok(())
        } else {
            Err(refusal(
                std::io::ErrorKind::InvalidInput,
                "not a regular file",
            ))
        }
    };
    refuse_kind(std::fs::metadata(path)?)?;
    let file = std::fs::File::open(path)?;
    refuse_kind(file.metadata()?)?;
    Ok(file)
}

/// Reads the regular file at `path`, refusing anything else (a FIFO, a device such as
/// `/dev/zero`, a directory) and anything over `cap` bytes, without reserving more than the
/// file holds.
pub fn read_regular_file(path: &Path, cap: u64) -> std::io::Result<Vec<u8>> {
    read_opened(open_regular_file(path)?, cap)
}

/// Reads the opened `file` whole if it is a regular file of at most `cap` bytes, judged by the
/// handle's own `fstat`; reserves what that says and reads at most one byte past the cap, so a
/// file that grows while it is read is refused, not followed.
pub fn read_opened(file: std::fs::File, cap: u64) -> std::io::Result<Vec<u8>> {
    use std::io::ErrorKind;
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(refusal(ErrorKind::InvalidInput, "not a regular file"));
    }
    let too_large = |size: u64| {
        refusal(
            ErrorKind::InvalidData,
            format!("{size} bytes, over the {cap}-byte cap"),
        )
    };
    if metadata.len() > cap {
        return Err(too_large(metadata.len()));
    }
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    file.take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// `relative` under `root`, refused when a symbolic link on the way leads outside `root`.
/// A path that does not exist yet resolves to itself (the caller reports it missing).
pub fn resolve_inside(root: &Path, relative: &ArtifactPath) -> std::io::Result<PathBuf> {
    let path = relative.join_to(root);
    let Ok(resolved) = path.canonicalize() else {
        return Ok(path);
    };
    check_resolved_inside(root, &resolved)?;
    Ok(path)
}

/// Refuses `resolved` (a path with every link resolved: a canonical path, or where the kernel
/// says a file was opened) unless it lies inside `root`, as reached through its own links.
pub(crate) fn check_resolved_inside(root: &Path, resolved: &Path) -> std::io::Result<()> {
    if resolved.starts_with(root.canonicalize()?) {
        return Ok(());
    }
    Err(refusal(
        std::io::ErrorKind::InvalidInput,
        format!(
            "a symbolic link leads out of the bundle, to `{}`",
            resolved.display()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn computed_values_must_be_declared_by_the_kernels_inputs() {
        let mut record = crate::testing::record(&["cu130/sm_90a"], &[]);
        let variant = &mut record.variants[0];
        variant.key = "0".repeat(64);
        variant.artifact.digest = "1".repeat(64);
        variant.artifact.path = crate::bundle::artifact_path(&variant.artifact.digest);
        variant.functions.push(crate::index::Function {
            name: "k".into(),
            symbol: "k".into(),
            param_sizes: vec![8],
            computed: BTreeMap::from([("smem".to_owned(), 1024)]),
        });
        let refused = check_kernel("k", &record).unwrap_err().to_string();
        assert!(refused.contains("smem"), "{refused}");
        record
            .inputs
            .computed
            .constants
            .insert("smem".into(), "sizeof(S)".into());
        check_kernel("k", &record).unwrap();
    }

    #[test]
    fn digests_are_64_lowercase_hex_only() {
        let good = "ab".repeat(32);
        assert_eq!(Digest::parse(&good).unwrap().prefix(), "ab");
        for bad in [
            "".to_owned(),
            "/tmp/x".to_owned(),
            "../../x".to_owned(),
            "AB".repeat(32),
            format!("é{}", "a".repeat(62)),
            "a".repeat(63),
            "a".repeat(65),
        ] {
            let error = Digest::parse(&bad).unwrap_err();
            assert!(error.to_string().contains("sha256"), "{error}");
        }
    }

    #[test]
    fn kernel_names_are_single_components() {
        KernelName::parse("layernorm_bf16").unwrap();
        for bad in [
            "",
            "..",
            "../../escape",
            "/tmp/x",
            "a/b",
            "a.b",
            "1x",
            "a\0b",
        ] {
            assert!(KernelName::parse(bad).is_err(), "{bad:?}");
        }
        assert!(KernelName::parse(&"k".repeat(MAX_NAME_LEN + 1)).is_err());
    }

    #[test]
    fn artifact_paths_stay_inside() {
        ArtifactPath::parse("artifacts/ab/ab.cubin.zst").unwrap();
        for bad in [
            "",
            "/dev/zero",
            "../x",
            "a/../../x",
            "a//b",
            "./a",
            "a\\b",
            "a/\nb",
        ] {
            assert!(ArtifactPath::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_regular_files_are_read_and_never_past_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"12345").unwrap();
        assert_eq!(read_regular_file(&file, 5).unwrap(), b"12345");
        let error = read_regular_file(&file, 4).unwrap_err();
        assert!(error.to_string().contains("cap"), "{error}");
        let error = read_regular_file(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert!(error.to_string().contains("not a regular file"), "{error}");
        assert!(read_regular_file(dir.path(), 1 << 20).is_err());
    }
}
