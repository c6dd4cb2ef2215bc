//! The `.dist-info` texts: `METADATA`, `WHEEL` and `RECORD`, written and parsed.

use base64::Engine as _;
use sha2::{Digest, Sha256};

use super::{WheelFilename, KWHEEL_VERSION, METADATA_VERSION, WHEEL_VERSION};

/// The core metadata of a distribution (`METADATA`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metadata {
    /// The distribution name as the project spells it (`af3-kernels`).
    pub name: String,
    /// The version (`0.1.0`).
    pub version: String,
    /// A one-line summary.
    pub summary: Option<String>,
    /// The Python versions it supports (`>=3.9`).
    pub requires_python: Option<String>,
    /// Requirements, one `Requires-Dist` line each (`torch==2.13.*`).
    pub requires_dist: Vec<String>,
}

impl Metadata {
    /// The `METADATA` file.
    pub fn to_text(&self) -> String {
        let mut fields = vec![
            ("Metadata-Version", METADATA_VERSION.to_owned()),
            ("Name", self.name.clone()),
            ("Version", self.version.clone()),
        ];
        if let Some(summary) = &self.summary {
            fields.push(("Summary", summary.clone()));
        }
        if let Some(requires_python) = &self.requires_python {
            fields.push(("Requires-Python", requires_python.clone()));
        }
        for requirement in &self.requires_dist {
            fields.push(("Requires-Dist", requirement.clone()));
        }
        headers(&fields)
    }
}

/// The `WHEEL` file of a wheel with this file name.
pub fn wheel_text(filename: &WheelFilename) -> String {
    let mut fields = vec![
        ("Wheel-Version", WHEEL_VERSION.to_owned()),
        ("Generator", format!("kwheel {KWHEEL_VERSION}")),
        ("Root-Is-Purelib", filename.is_purelib().to_string()),
    ];
    if let Some(build) = filename.build() {
        fields.push(("Build", build.to_owned()));
    }
    for tag in filename.tags() {
        fields.push(("Tag", tag));
    }
    headers(&fields)
}

/// `Name: value` lines; a value is kept on one line.
pub(super) fn headers(fields: &[(&str, String)]) -> String {
    let mut out = String::new();
    for (name, value) in fields {
        let value: String = value
            .chars()
            .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
            .collect();
        out.push_str(name);
        out.push_str(": ");
        out.push_str(value.trim());
        out.push('\n');
    }
    out
}

/// Parses `Name: value` lines (METADATA, WHEEL) up to the first blank line, in order.
pub fn parse_headers(text: &str) -> Vec<(String, String)> {
    text.lines()
        .take_while(|line| !line.trim().is_empty())
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            Some((name.trim().to_owned(), value.trim().to_owned()))
        })
        .collect()
}

/// One row of `RECORD`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordEntry {
    /// The path inside the wheel.
    pub path: String,
    /// `sha256=<urlsafe base64, no padding>`, empty for RECORD itself.
    pub hash: String,
    /// The size in bytes, empty for RECORD itself.
    pub size: String,
}

/// The `RECORD` hash of `bytes`: `sha256=` and the urlsafe base64 of the digest, unpadded.
pub fn record_hash(bytes: &[u8]) -> String {
    format!(
        "sha256={}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(bytes))
    )
}

/// Renders RECORD rows as CSV, one `\n`-ended line each, a field quoted only when it holds a
/// comma, a quote or a line break (as Python's `csv` module writes it for pip).
pub fn record_text(entries: &[RecordEntry]) -> String {
    let mut writer = csv::WriterBuilder::new()
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new());
    for entry in entries {
        writer
            .write_record([&entry.path, &entry.hash, &entry.size])
            .expect("writing CSV into memory cannot fail");
    }
    let bytes = writer
        .into_inner()
        .expect("flushing CSV into memory cannot fail");
    String::from_utf8(bytes).expect("CSV of UTF-8 fields is UTF-8")
}

/// Parses `RECORD` CSV into rows, blank lines skipped; an error names the 1-based line.
///
/// One pass: the rows come in order, so each row's line is counted on from the previous
/// row's, never from the start (a RECORD of many short lines would otherwise cost the square
/// of its length).
pub fn parse_record(text: &str) -> Result<Vec<RecordEntry>, String> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(text.as_bytes());
    let mut lines = LineCounter::new(text.as_bytes());
    let mut rows = Vec::new();
    for row in reader.records() {
        let row = row.map_err(|error| match error.position() {
            Some(position) => format!("line {}: {error}", lines.line_at(position)),
            None => error.to_string(),
        })?;
        let line = row.position().map_or(0, |position| lines.line_at(position));
        match row.iter().collect::<Vec<_>>()[..] {
            [path, hash, size] => rows.push(RecordEntry {
                path: path.to_owned(),
                hash: hash.to_owned(),
                size: size.to_owned(),
            }),
            ref fields => {
                return Err(format!(
                    "line {line}: {} fields, not 3 (path, hash, size)",
                    fields.len()
                ))
            }
        }
    }
    Ok(rows)
}

/// The 1-based line of a CSV row, counted on from the last row asked about.
struct LineCounter<'t> {
    bytes: &'t [u8],
    /// Where counting stopped, and the line there.
    offset: usize,
    line: usize,
}

impl<'t> LineCounter<'t> {
    fn new(bytes: &'t [u8]) -> LineCounter<'t> {
        LineCounter {
            bytes,
            offset: 0,
            line: 1,
        }
    }

    /// The line of the row at `position`. The reader gives a row's position from before the
    /// blank lines it skipped, so the row starts at the first byte after them.
    fn line_at(&mut self, position: &csv::Position) -> usize {
        let bytes = self.bytes;
        let mut start =
            usize::try_from(position.byte()).map_or(bytes.len(), |b| b.min(bytes.len()));
        while start < bytes.len() && matches!(bytes[start], b'\r' | b'\n') {
            start += 1;
        }
        if start < self.offset {
            // Never for rows read in order; counted from the start rather than guessed.
            self.offset = 0;
            self.line = 1;
        }
        self.line += bytes[self.offset..start]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        self.offset = start;
        self.line
    }
}

/// Why a path cannot name a file inside a wheel, if it cannot.
pub(crate) fn path_problem(path: &str) -> Option<String> {
    if path.is_empty() {
        return Some("the path is empty".into());
    }
    if let Some(c) = path.chars().find(|c| c.is_control()) {
        return Some(format!("the path holds control character {c:?}"));
    }
    let drive = matches!(path.as_bytes(), [letter, b':', ..] if letter.is_ascii_alphabetic());
    if path.starts_with('/') || drive {
        return Some("the path is absolute".into());
    }
    if path.contains('\\') {
        return Some("the path holds `\\`; wheel paths use `/`".into());
    }
    if path.ends_with('/') {
        return Some("it is a directory entry; wheels list files only".into());
    }
    for component in path.split('/') {
        match component {
            "" => return Some("the path has an empty component (`//`)".into()),
            "." | ".." => return Some(format!("the path has a `{component}` component")),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A RECORD of many short rows is read in one pass (each row's line counted on from the
    /// previous row's): 300,000 rows parse, and an error on the last names its line.
    #[test]
    fn a_record_of_300000_short_lines_parses_in_one_pass() {
        let mut text: String = (0..300_000).map(|n| format!("d/{n},,\n")).collect();
        let rows = parse_record(&text).unwrap();
        assert_eq!(rows.len(), 300_000);
        assert_eq!(rows[299_999].path, "d/299999");
        text.push_str("d/last,,1,extra\n");
        assert_eq!(
            parse_record(&text).unwrap_err(),
            "line 300001: 4 fields, not 3 (path, hash, size)"
        );
    }

    #[test]
    fn lines_are_counted_across_blank_lines_and_crlf() {
        let text = "a,b,1\r\n\r\n\nc,d,2\n\n\"e\nf\",g,3\n\nh,i\n";
        assert_eq!(
            parse_record(text).unwrap_err(),
            "line 9: 2 fields, not 3 (path, hash, size)"
        );
    }
}
