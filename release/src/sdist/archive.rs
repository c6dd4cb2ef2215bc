//! An sdist's `.tar.gz`, read the one way every reader agrees on, streamed and bounded.
//!
//! pip unpacks an sdist with Python's `tarfile` (`pip._internal.utils.unpacking.untar_file`),
//! which reads every gzip member of the file as one stream, takes a PAX `path` or a GNU long
//! name over the header's name, joins a ustar prefix whatever the magic says, and treats an
//! old-style regular entry whose name ends in `/` as a directory; tar-rs reads one member and
//! resolves names its own way. So an archive is read only when both must read it alike:
//!
//! | part | must |
//! | --- | --- |
//! | gzip | one member, nothing after it; its CRC-32 and length check |
//! | tar | one stream of 512-byte headers with valid checksums and plain octal numbers, ended by a zero block, followed by zero padding only |
//! | entries | regular files (`0`, or `\0` without a trailing `/`) and directories (`5`, size 0) only; no links, devices, FIFOs, sparse or contiguous files, global or Solaris extended headers |
//! | names | UTF-8 without control characters; at most one override per entry (a PAX `path` or a GNU long name, never both, never two), used only for a name longer than the header holds and starting with the header's name; a ustar prefix only under POSIX `ustar\0` `00` magic; PAX records only `path`, times, ids and a `size` equal to the header's |
//! | paths | each once: no duplicates, no entry inside a file, no two that differ only by letter case |
//!
//! Bounds: the file at most [`MAX_SDIST_SIZE`]; an entry at most [`MAX_SDIST_ENTRY`]; all
//! decompressed bytes (headers and padding included) at most [`MAX_SDIST_CONTENT`] and, past
//! the first [`RATIO_FLOOR`] bytes, at most [`MAX_SDIST_RATIO`] times the compressed bytes
//! read so far, so a gzip bomb stops after a few MiB; at most [`MAX_SDIST_ENTRIES`] entries.
//! Nothing is buffered whole: file contents stream to the caller.

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read};

use flate2::bufread::GzDecoder;

use crate::wheel::path_problem;

/// Largest sdist file read.
pub const MAX_SDIST_SIZE: u64 = 256 << 20;
/// Largest file inside an sdist.
pub const MAX_SDIST_ENTRY: u64 = 64 << 20;
/// Largest decompressed tar stream (headers and padding included).
pub const MAX_SDIST_CONTENT: u64 = 512 << 20;
/// Highest ratio of decompressed to compressed bytes past [`RATIO_FLOOR`] (deflate reaches
/// about 1,000:1 on zeros; sources and cubins stay far below 20:1).
pub const MAX_SDIST_RATIO: u64 = 100;
/// Decompressed bytes read before the ratio applies.
pub const RATIO_FLOOR: u64 = 16 << 20;
/// Most entries in an sdist.
pub const MAX_SDIST_ENTRIES: usize = 100_000;
/// Largest PAX extended header or GNU long name.
const MAX_EXTENSION: u64 = 64 << 10;
const BLOCK: usize = 512;

/// What an entry of the archive is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file of this many bytes; executable when any execute bit is set (pip then
    /// installs it 0755).
    File {
        /// Its size.
        size: u64,
        /// Whether any execute bit is set.
        executable: bool,
    },
    /// A directory.
    Directory,
}

/// One entry of an sdist archive, under the one name every reader gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchiveEntry {
    /// Its full path in the archive (`af3_kernels-0.1.0/kernels.toml`), a directory's
    /// without the trailing `/`.
    pub path: String,
    /// What it is.
    pub kind: EntryKind,
}

/// Counts the compressed bytes the decoder takes.
struct Counted<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buffer)?;
        self.read += n as u64;
        if self.read > MAX_SDIST_SIZE {
            return Err(refusal(format!(
                "the file is over the {MAX_SDIST_SIZE}-byte cap on an sdist"
            )));
        }
        Ok(n)
    }
}

/// The decompressed tar stream, refusing to go past the caps.
struct Inflated<R: Read> {
    decoder: GzDecoder<BufReader<Counted<R>>>,
    total: u64,
}

impl<R: Read> Inflated<R> {
    fn compressed(&self) -> u64 {
        self.decoder.get_ref().get_ref().read
    }
}

impl<R: Read> Read for Inflated<R> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let n = self.decoder.read(buffer)?;
        self.total += n as u64;
        if self.total > MAX_SDIST_CONTENT {
            return Err(refusal(format!(
                "decompresses past the {MAX_SDIST_CONTENT}-byte cap on an sdist"
            )));
        }
        let allowed = RATIO_FLOOR.saturating_add(self.compressed().saturating_mul(MAX_SDIST_RATIO));
        if self.total > allowed {
            return Err(refusal(format!(
                "decompresses {} bytes from {} compressed, more than {MAX_SDIST_RATIO}:1; \
                 refused as a decompression bomb",
                self.total,
                self.compressed()
            )));
        }
        Ok(n)
    }
}

/// A bound or rule the stream broke, told apart from the reader's own I/O errors.
#[derive(Debug)]
struct Refusal(String);

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refusal {}

fn refusal(message: String) -> io::Error {
    io::Error::other(Refusal(message))
}

/// An I/O error as a sentence about the archive.
fn io_error(error: io::Error) -> String {
    if let Some(refusal) = error.get_ref().and_then(|e| e.downcast_ref::<Refusal>()) {
        return refusal.0.clone();
    }
    match error.kind() {
        io::ErrorKind::UnexpectedEof => format!("is cut short: {error}"),
        io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData => {
            format!("is not a valid gzip stream: {error}")
        }
        _ => format!("cannot be read: {error}"),
    }
}

/// Reads the gzipped tar from `compressed`, handing each regular file's bytes to `on_file`
/// (its path, and a reader of exactly its bytes) as it comes; the entries in archive order,
/// or why the archive can be read more than one way or breaks a bound (see the module docs).
pub fn read_archive<R: Read>(
    compressed: R,
    on_file: &mut dyn FnMut(&str, &mut dyn Read) -> io::Result<()>,
) -> Result<Vec<ArchiveEntry>, String> {
    let mut stream = Inflated {
        decoder: GzDecoder::new(BufReader::new(Counted {
            inner: compressed,
            read: 0,
        })),
        total: 0,
    };
    let entries = read_tar(&mut stream, on_file)?;
    // One gzip member: the decoder stops at the end of the first; nothing may follow it.
    let mut rest = stream.decoder.into_inner();
    let buffered = rest.fill_buf().map_err(io_error)?.len();
    if buffered > 0 {
        return Err(format!(
            "bytes follow the first gzip member (another member or trailing data, which \
             Python's tarfile reads on as more of the archive) at compressed byte {}",
            rest.get_ref().read - buffered as u64
        ));
    }
    Ok(entries)
}

/// An extension header waiting for the entry it applies to.
#[derive(Default)]
struct Pending {
    pax: Option<BTreeMap<String, String>>,
    long_name: Option<String>,
}

fn read_tar<R: Read>(
    stream: &mut Inflated<R>,
    on_file: &mut dyn FnMut(&str, &mut dyn Read) -> io::Result<()>,
) -> Result<Vec<ArchiveEntry>, String> {
    let mut entries: Vec<ArchiveEntry> = Vec::new();
    // Every path so far → whether it is a directory.
    let mut paths: BTreeMap<String, bool> = BTreeMap::new();
    // Every path and folder on it so far, by its lower-case form.
    let mut folded: BTreeMap<String, String> = BTreeMap::new();
    let mut pending = Pending::default();
    let mut block = [0u8; BLOCK];
    loop {
        let at = stream.total;
        if !read_block(stream, &mut block).map_err(io_error)? {
            // Python's tarfile reads on into a next gzip member; say so rather than only
            // that this one ended early.
            let more = stream.decoder.get_mut().fill_buf().map_err(io_error)?.len();
            if more > 0 {
                return Err(format!(
                    "bytes follow the first gzip member, whose tar stream ends without its \
                     end-of-archive block: Python's tarfile reads the next member as more of \
                     the archive (at compressed byte {})",
                    stream.compressed() - more as u64
                ));
            }
            return Err("the tar stream ends without its end-of-archive block".to_owned());
        }
        if block.iter().all(|&b| b == 0) {
            if pending.pax.is_some() || pending.long_name.is_some() {
                return Err("an extended header is followed by the end of the archive".into());
            }
            // Zero padding may follow (tar pads to its record size); nothing else.
            let mut rest = [0u8; 8192];
            loop {
                let n = stream.read(&mut rest).map_err(io_error)?;
                if n == 0 {
                    break;
                }
                if rest[..n].iter().any(|&b| b != 0) {
                    return Err(format!(
                        "data follows the tar end-of-archive block (after byte {at}), which \
                         readers that skip zero blocks read as more entries"
                    ));
                }
            }
            return Ok(entries);
        }
        let header =
            Header::parse(&block).map_err(|reason| format!("the header at byte {at} {reason}"))?;
        match header.kind {
            b'x' => {
                if pending.pax.is_some() || pending.long_name.is_some() {
                    return Err(format!(
                        "the header at byte {at} is a second extended header for one entry"
                    ));
                }
                let data = read_extension(stream, header.size)
                    .map_err(|error| format!("the PAX header at byte {at}: {}", io_error(error)))?;
                pending.pax = Some(
                    parse_pax(&data)
                        .map_err(|reason| format!("the PAX header at byte {at} {reason}"))?,
                );
            }
            b'L' => {
                if pending.long_name.is_some() || pending.pax.is_some() {
                    return Err(format!(
                        "the GNU long name at byte {at} follows another extended header for \
                         the same entry: readers disagree on which name wins"
                    ));
                }
                let data = read_extension(stream, header.size).map_err(|error| {
                    format!("the GNU long name at byte {at}: {}", io_error(error))
                })?;
                let name = match data.iter().position(|&b| b == 0) {
                    None => &data[..],
                    Some(n) if n + 1 == data.len() => &data[..n],
                    Some(_) => {
                        return Err(format!(
                            "the GNU long name at byte {at} holds a NUL before its end: \
                             readers cut it at different places"
                        ))
                    }
                };
                let name = std::str::from_utf8(name)
                    .map_err(|_| format!("the GNU long name at byte {at} is not UTF-8"))?;
                pending.long_name = Some(name.to_owned());
            }
            b'0' | 0 | b'5' => {
                let Pending { pax, long_name } = std::mem::take(&mut pending);
                let entry = resolve_entry(&header, pax, long_name)?;
                if entries.len() >= MAX_SDIST_ENTRIES {
                    return Err(format!("holds more than {MAX_SDIST_ENTRIES} entries"));
                }
                claim(&mut paths, &entry)?;
                claim_case(&mut folded, &entry.path)?;
                if let EntryKind::File { size, .. } = entry.kind {
                    let mut data = (&mut *stream).take(size);
                    on_file(&entry.path, &mut data)
                        .map_err(|error| format!("`{}`: {}", entry.path, io_error(error)))?;
                    // Whatever the caller left unread, then the block's padding.
                    io::copy(&mut data, &mut io::sink())
                        .map_err(|error| format!("`{}`: {}", entry.path, io_error(error)))?;
                    if data.limit() > 0 {
                        return Err(format!(
                            "`{}` is cut short by the end of the stream",
                            entry.path
                        ));
                    }
                    skip_padding(stream, size).map_err(io_error)?;
                }
                entries.push(entry);
            }
            kind => {
                let name = header.name.escape_debug().to_string();
                return Err(format!(
                    "`{name}` is {}: an sdist holds regular files and directories only",
                    describe(kind)
                ));
            }
        }
    }
}

fn describe(kind: u8) -> String {
    match kind {
        b'1' => "a hard link".to_owned(),
        b'2' => "a symbolic link".to_owned(),
        b'3' => "a character device".to_owned(),
        b'4' => "a block device".to_owned(),
        b'6' => "a FIFO".to_owned(),
        b'7' => "a contiguous file".to_owned(),
        b'g' => "a global PAX header, which applies to every later entry".to_owned(),
        b'X' => "a Solaris extended header".to_owned(),
        b'K' => "a GNU long link name".to_owned(),
        b'S' => "a GNU sparse file".to_owned(),
        other => format!("of tar type {:?}", char::from(other)),
    }
}

/// Reads one block; `false` at the end of the stream before any byte of it.
fn read_block(stream: &mut impl Read, block: &mut [u8; BLOCK]) -> io::Result<bool> {
    let mut filled = 0;
    while filled < BLOCK {
        let n = stream.read(&mut block[filled..])?;
        if n == 0 {
            return if filled == 0 {
                Ok(false)
            } else {
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the tar stream ends inside a header",
                ))
            };
        }
        filled += n;
    }
    Ok(true)
}

fn skip_padding(stream: &mut impl Read, size: u64) -> io::Result<()> {
    let padding = (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64;
    let skipped = io::copy(&mut stream.take(padding), &mut io::sink())?;
    if skipped < padding {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the tar stream ends inside an entry's padding",
        ));
    }
    Ok(())
}

fn read_extension(stream: &mut impl Read, size: u64) -> io::Result<Vec<u8>> {
    if size > MAX_EXTENSION {
        return Err(refusal(format!(
            "{size} bytes, over the {MAX_EXTENSION}-byte cap on an extended header"
        )));
    }
    let mut data = Vec::with_capacity(size as usize);
    stream.take(size).read_to_end(&mut data)?;
    if (data.len() as u64) < size {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the tar stream ends inside an extended header",
        ));
    }
    skip_padding(stream, size)?;
    Ok(data)
}

/// The fields of one header block that decide what an entry is called and holds.
struct Header {
    kind: u8,
    /// The name as the header holds it: the name field, joined to the ustar prefix when the
    /// magic is POSIX's.
    name: String,
    size: u64,
    mode: u64,
}

impl Header {
    fn parse(block: &[u8; BLOCK]) -> Result<Header, String> {
        let recorded = octal(&block[148..156]).map_err(|r| format!("has a checksum that {r}"))?;
        let computed: u64 = block
            .iter()
            .enumerate()
            .map(|(n, &b)| {
                if (148..156).contains(&n) {
                    32
                } else {
                    u64::from(b)
                }
            })
            .sum();
        if recorded != computed {
            return Err(format!(
                "has checksum {recorded}, not the {computed} its bytes sum to"
            ));
        }
        let kind = block[156];
        let size = octal(&block[124..136]).map_err(|r| format!("has a size that {r}"))?;
        let mode = octal(&block[100..108]).map_err(|r| format!("has a mode that {r}"))?;
        let field = until_nul(&block[..100]);
        let posix = &block[257..263] == b"ustar\0" && &block[263..265] == b"00";
        let prefix = until_nul(&block[345..500]);
        let mut name = field.to_vec();
        if !prefix.is_empty() {
            // Python's tarfile joins the prefix under any magic, tar-rs only under POSIX's.
            if !posix {
                return Err(
                    "has bytes in the ustar prefix field without POSIX ustar magic: readers \
                     disagree on whether they are part of the name"
                        .to_owned(),
                );
            }
            name = [prefix, b"/", field].concat();
        }
        let name =
            String::from_utf8(name).map_err(|_| "has a name that is not UTF-8".to_owned())?;
        Ok(Header {
            kind,
            name,
            size,
            mode,
        })
    }
}

fn until_nul(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..end]
}

/// A numeric header field: octal digits, spaces around them, ended by NUL or the field's end
/// (base-256 and empty fields are refused: readers disagree on them).
fn octal(field: &[u8]) -> Result<u64, String> {
    if field.first().is_some_and(|&b| b & 0x80 != 0) {
        return Err("is in base-256, which an sdist does not need".to_owned());
    }
    let text = until_nul(field);
    let text = std::str::from_utf8(text).map_err(|_| "is not octal digits".to_owned())?;
    let digits = text.trim_matches(' ');
    if digits.is_empty() || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return Err(format!("is not octal digits ({:?})", text));
    }
    u64::from_str_radix(digits, 8).map_err(|_| format!("is out of range ({digits})"))
}

/// The PAX records `path`, times, ids and `size`; anything else is refused.
fn parse_pax(data: &[u8]) -> Result<BTreeMap<String, String>, String> {
    const ALLOWED: [&str; 9] = [
        "path", "size", "mtime", "atime", "ctime", "uid", "gid", "uname", "gname",
    ];
    let mut records = BTreeMap::new();
    let mut rest = data;
    while !rest.is_empty() {
        let space = rest
            .iter()
            .position(|&b| b == b' ')
            .ok_or("has a record without a length")?;
        let length = std::str::from_utf8(&rest[..space])
            .ok()
            .filter(|digits| !digits.starts_with('0') && digits.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|digits| digits.parse::<usize>().ok())
            .ok_or("has a record whose length is not a plain decimal number")?;
        if length <= space + 1 || length > rest.len() || rest[length - 1] != b'\n' {
            return Err("has a record whose length does not end it at a newline".to_owned());
        }
        let record = std::str::from_utf8(&rest[space + 1..length - 1])
            .map_err(|_| "has a record that is not UTF-8".to_owned())?;
        let (key, value) = record.split_once('=').ok_or("has a record without `=`")?;
        if !ALLOWED.contains(&key) {
            return Err(format!(
                "has record `{}`, which an sdist does not need (only path, size, times, ids)",
                key.escape_debug()
            ));
        }
        if records.insert(key.to_owned(), value.to_owned()).is_some() {
            return Err(format!("has record `{key}` twice"));
        }
        rest = &rest[length..];
    }
    Ok(records)
}

/// The entry a header describes, under its one name, or why readers would name it apart.
fn resolve_entry(
    header: &Header,
    pax: Option<BTreeMap<String, String>>,
    long_name: Option<String>,
) -> Result<ArchiveEntry, String> {
    let shown = header.name.escape_debug().to_string();
    let pax = pax.unwrap_or_default();
    if let Some(size) = pax.get("size") {
        if size.parse::<u64>().ok() != Some(header.size) {
            return Err(format!(
                "`{shown}`: its PAX size {size} is not the header's {}: readers would find \
                 the next entry at different places",
                header.size
            ));
        }
    }
    let mut name = header.name.clone();
    if let Some(over) = pax.get("path").cloned().or(long_name) {
        // An override is for a name the header cannot hold: too long (the header holds its
        // start) or not ASCII (Python's tarfile writes `?` for each other character).
        let ascii = ascii_replaced(&over);
        let fits = header.name == over || header.name == ascii;
        let truncation = over.len() > 100
            && !header.name.is_empty()
            && (over.starts_with(&header.name) || ascii.starts_with(&header.name));
        if !fits && !truncation {
            return Err(format!(
                "`{shown}` is renamed `{}` by an extended header: readers that do not apply \
                 it would write another path",
                over.escape_debug()
            ));
        }
        name = over;
    }
    if name.contains('\0') {
        return Err(format!("`{}` holds a NUL", name.escape_debug()));
    }
    let kind = match header.kind {
        b'5' => {
            if header.size != 0 {
                return Err(format!(
                    "`{shown}` is a directory with {} bytes of data: readers disagree on \
                     where the next entry starts",
                    header.size
                ));
            }
            while name.len() > 1 && name.ends_with('/') {
                name.pop();
            }
            EntryKind::Directory
        }
        kind => {
            if kind == 0 && name.ends_with('/') {
                return Err(format!(
                    "`{shown}` is an old-style entry ending in `/`: Python's tarfile makes it \
                     a directory, tar-rs a file"
                ));
            }
            if header.size > MAX_SDIST_ENTRY {
                return Err(format!(
                    "`{shown}` is {} bytes, over the {MAX_SDIST_ENTRY}-byte cap on an sdist \
                     entry",
                    header.size
                ));
            }
            EntryKind::File {
                size: header.size,
                executable: header.mode & 0o111 != 0,
            }
        }
    };
    if let Some(reason) = path_problem(&name) {
        return Err(format!("`{}`: {reason}", name.escape_debug()));
    }
    Ok(ArchiveEntry { path: name, kind })
}

/// `name` with every non-ASCII character as `?`, as Python's tarfile writes a header name it
/// also gives in a PAX record.
fn ascii_replaced(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii() { c } else { '?' })
        .collect()
}

/// Records `path` and the folders on it by their lower-case form, refusing one that differs
/// from an earlier path only by letter case: on the case-insensitive file systems of macOS and
/// Windows the two are one file (or folder), and what pip unpacks depends on archive order.
fn claim_case(folded: &mut BTreeMap<String, String>, path: &str) -> Result<(), String> {
    let ends = path
        .match_indices('/')
        .map(|(at, _)| at)
        .chain(std::iter::once(path.len()));
    for end in ends {
        let part = &path[..end];
        let earlier = folded
            .entry(part.to_lowercase())
            .or_insert_with(|| part.to_owned());
        if earlier != part {
            return Err(format!(
                "`{path}` differs from `{earlier}` only by letter case: they are one path on \
                 case-insensitive file systems, where an unpack keeps one of them"
            ));
        }
    }
    Ok(())
}

/// Records `entry`'s path, refusing a second entry of the same path, an entry inside a
/// file, and a file over entries already inside its path.
fn claim(paths: &mut BTreeMap<String, bool>, entry: &ArchiveEntry) -> Result<(), String> {
    let path = &entry.path;
    let is_dir = entry.kind == EntryKind::Directory;
    if paths.contains_key(path) {
        return Err(format!("`{path}` is in the archive twice"));
    }
    let mut parent = path.as_str();
    while let Some((up, _)) = parent.rsplit_once('/') {
        if paths.get(up) == Some(&false) {
            return Err(format!("`{path}` is inside `{up}`, which is a file"));
        }
        parent = up;
    }
    if !is_dir {
        let under = format!("{path}/");
        if let Some((inside, _)) = paths.range(under.clone()..).next() {
            if inside.starts_with(&under) {
                return Err(format!("`{path}` is a file, but `{inside}` is inside it"));
            }
        }
    }
    paths.insert(path.clone(), is_dir);
    Ok(())
}
