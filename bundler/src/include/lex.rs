//! The lexer: finds `#include` and `#define` directives in a file's bytes, byte by byte, with
//! comments, literals, raw strings and line splices read the way the preprocessor reads them.

use std::fs;
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum IncludeKind {
    /// `#include "x"`.
    Quoted,
    /// `#include <x>`.
    Angle,
    /// `#include_next`, either spelling.
    Next,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) struct Include {
    pub(super) kind: IncludeKind,
    pub(super) name: String,
    /// 1-based line of the `#`.
    pub(super) line: u32,
    /// Whether a conditional (`#if`, `#ifdef`, `#ifndef`) other than an include guard
    /// surrounds it: the scanner evaluates none, so such an include may be one the compiler
    /// never reads (`#ifdef __CUDACC_RTC__` / `#include "target"`, NVRTC's own header).
    pub(super) conditional: bool,
}

#[derive(Debug)]
pub(super) enum BadKind {
    Computed,
    Malformed,
}

#[derive(Debug)]
pub(super) struct BadInclude {
    pub(super) kind: BadKind,
    pub(super) line: u32,
    pub(super) text: String,
}

/// What the lexer collects from one file.
#[derive(Debug, Default)]
pub(super) struct Directives {
    pub(super) includes: Vec<Include>,
    pub(super) macro_includes: Vec<MacroInclude>,
    pub(super) defines: Vec<Define>,
    /// The open conditionals, innermost last: `true` for one that counts, `false` for an
    /// include guard (`#ifndef X` whose next directive is `#define X`).
    conditions: Vec<bool>,
    /// The macro of the `#ifndef` just read, while the next directive may make it a guard.
    guard_candidate: Option<String>,
}

impl Directives {
    /// Whether a counted conditional is open.
    fn in_conditional(&self) -> bool {
        self.conditions.iter().any(|&counts| counts)
    }
}

/// `#include NAME` or `#include NAME(args)`.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct MacroInclude {
    pub(super) line: u32,
    /// The directive's line, for errors.
    pub(super) text: String,
    pub(super) name: String,
    /// `None` without parentheses.
    pub(super) args: Option<Vec<String>>,
}

/// A `#define`, with its replacement when that is a header name.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Define {
    pub(super) name: String,
    pub(super) header: Option<HeaderMacro>,
}

/// A macro whose replacement is `<…>` or `"…"`, such as CUTLASS's
/// `#define CUDA_STD_HEADER(header) <cuda/std/header>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct HeaderMacro {
    /// `None` for an object-like macro.
    pub(super) params: Option<Vec<String>>,
    /// [`IncludeKind::Quoted`] or [`IncludeKind::Angle`].
    pub(super) kind: IncludeKind,
    /// The replacement between the delimiters.
    pub(super) template: String,
}

impl HeaderMacro {
    /// The header `NAME` or `NAME(args)` expands to, or `None` when the call does not fit.
    pub(super) fn expand(&self, args: Option<&[String]>) -> Option<String> {
        let (params, args) = match (&self.params, args) {
            (None, None) => return Some(self.template.clone()),
            (Some(params), Some(args)) if params.len() == args.len() => (params, args),
            (Some(params), Some([only])) if params.is_empty() && only.is_empty() => {
                return Some(self.template.clone())
            }
            _ => return None,
        };
        // Parameters are not replaced inside a string literal.
        if self.kind == IncludeKind::Quoted {
            return Some(self.template.clone());
        }
        let template = self.template.as_bytes();
        let mut out = String::with_capacity(template.len());
        let mut i = 0;
        while i < template.len() {
            let start = i;
            if template[i].is_ascii_alphabetic() || template[i] == b'_' {
                while i < template.len() && is_identifier_byte(template[i]) {
                    i += 1;
                }
                let word = &self.template[start..i];
                match params.iter().position(|param| param == word) {
                    Some(k) => out.push_str(&args[k]),
                    None => out.push_str(word),
                }
            } else {
                i += 1;
                while !self.template.is_char_boundary(i) {
                    i += 1;
                }
                out.push_str(&self.template[start..i]);
            }
        }
        Some(out)
    }
}

/// Parses `#define` after its keyword; returns where ordinary lexing resumes (the body is lexed
/// like any code, so a comment opened there is honoured).
fn define(source: &[u8], after_keyword: usize, out: &mut Directives) -> usize {
    let start = skip_blanks(source, after_keyword);
    let mut end = start;
    while end < source.len() && is_identifier_byte(source[end]) {
        end += 1;
    }
    if start == end || source[start].is_ascii_digit() {
        return start;
    }
    let name = String::from_utf8_lossy(&source[start..end]).into_owned();
    let header = header_macro(source, end);
    out.defines.push(Define { name, header });
    end
}

/// The replacement of the macro whose parameter list (if any) starts at `i`, when it is a
/// header name and nothing else.
fn header_macro(source: &[u8], mut i: usize) -> Option<HeaderMacro> {
    let params = if source.get(i) == Some(&b'(') {
        let mut params = Vec::new();
        i += 1;
        loop {
            i = skip_blanks(source, i);
            let start = i;
            while i < source.len() && is_identifier_byte(source[i]) {
                i += 1;
            }
            let named = start < i;
            if named {
                params.push(String::from_utf8_lossy(&source[start..i]).into_owned());
                i = skip_blanks(source, i);
            }
            match source.get(i) {
                Some(b',') if named => i += 1,
                Some(b')') => {
                    i += 1;
                    break;
                }
                // Variadic, or not a parameter list this lexer understands.
                _ => return None,
            }
        }
        Some(params)
    } else {
        None
    };
    let open = skip_blanks(source, i);
    let (close, kind) = match source.get(open) {
        Some(b'<') => (b'>', IncludeKind::Angle),
        Some(b'"') => (b'"', IncludeKind::Quoted),
        _ => return None,
    };
    let length = source[open + 1..]
        .iter()
        .position(|&byte| byte == close || byte == b'\n')?;
    let end = open + 1 + length;
    if source[end] != close || !at_line_end(source, end + 1) {
        return None;
    }
    Some(HeaderMacro {
        params,
        kind,
        template: String::from_utf8_lossy(&source[open + 1..end]).into_owned(),
    })
}

/// Parses `NAME` or `NAME(args)` at `start`, the rest of the line being blank.
fn macro_include(source: &[u8], start: usize) -> Option<(String, Option<Vec<String>>)> {
    let mut i = start;
    while i < source.len() && is_identifier_byte(source[i]) {
        i += 1;
    }
    let name = String::from_utf8_lossy(&source[start..i]).into_owned();
    let after_name = skip_blanks(source, i);
    let (args, end) = if source.get(after_name) == Some(&b'(') {
        let mut args = Vec::new();
        let mut depth = 0usize;
        let mut arg_start = after_name + 1;
        let mut j = arg_start;
        loop {
            match *source.get(j)? {
                b'\n' => return None,
                b'(' => depth += 1,
                b')' if depth > 0 => depth -= 1,
                b')' => break,
                b',' if depth == 0 => {
                    args.push(trimmed(&source[arg_start..j]));
                    arg_start = j + 1;
                }
                _ => {}
            }
            j += 1;
        }
        args.push(trimmed(&source[arg_start..j]));
        (Some(args), j + 1)
    } else {
        (None, i)
    };
    at_line_end(source, end).then_some((name, args))
}

fn trimmed(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim().to_owned()
}

/// Whether only blanks and comments follow `i` on its line.
fn at_line_end(source: &[u8], i: usize) -> bool {
    let rest = skip_blanks(source, i);
    match source.get(rest) {
        None | Some(b'\n') => true,
        Some(b'/') => source.get(skip_splices(source, rest + 1)) == Some(&b'/'),
        _ => false,
    }
}

/// Bytes that can change the lexer's state in the middle of a line.
const SPECIAL: [bool; 256] = {
    let mut table = [false; 256];
    table[b'\n' as usize] = true;
    table[b'\\' as usize] = true;
    table[b'/' as usize] = true;
    table[b'"' as usize] = true;
    table[b'\'' as usize] = true;
    table
};

fn is_identifier_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'_'
}

/// Horizontal whitespace; `\r` too, so CRLF files read like LF ones.
fn is_blank(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | 0x0b | 0x0c | b'\r')
}

/// Appends the `#include` and `#define` directives of `source` to `out`, in order.
pub(super) fn find_includes(source: &[u8], out: &mut Directives) -> Result<(), BadInclude> {
    let mut lines = LineCounter { at: 0, line: 1 };
    let mut i = 0;
    while i < source.len() {
        // A block comment before the `#` leaves it first on its line, as in the preprocessor.
        i = skip_blanks(source, i);
        if source.get(i) == Some(&b'#') {
            i = directive(source, i, &mut lines, out)?;
        }
        i = skip_rest_of_line(source, i);
    }
    Ok(())
}

/// [`find_includes`] that steps over a directive it cannot take (a computed include in a
/// toolkit header) instead of stopping there.
fn find_includes_lenient(source: &[u8], out: &mut Directives) {
    let mut lines = LineCounter { at: 0, line: 1 };
    let mut i = 0;
    while i < source.len() {
        i = skip_blanks(source, i);
        if source.get(i) == Some(&b'#') {
            if let Ok(next) = directive(source, i, &mut lines, out) {
                i = next;
            }
        }
        i = skip_rest_of_line(source, i);
    }
}

/// The includes of a toolkit or system header whose strict lexing stopped at a directive the
/// scanner refuses in library files; `None` when it cannot be read.
pub(super) fn scan_lenient(path: &Path) -> Option<Directives> {
    let bytes = fs::read(path).ok()?;
    let mut directives = Directives::default();
    find_includes_lenient(&bytes, &mut directives);
    Some(directives)
}

/// Counts lines forward from the last position asked about; directives come in order.
struct LineCounter {
    at: usize,
    line: u32,
}

impl LineCounter {
    fn line_of(&mut self, source: &[u8], position: usize) -> u32 {
        let newlines = source[self.at..position]
            .iter()
            .filter(|&&byte| byte == b'\n')
            .count();
        self.line += newlines as u32;
        self.at = position;
        self.line
    }
}

/// Parses the directive whose `#` is at `hash`; returns where ordinary lexing resumes.
fn directive(
    source: &[u8],
    hash: usize,
    lines: &mut LineCounter,
    out: &mut Directives,
) -> Result<usize, BadInclude> {
    // The directive name, read across line splices into a small buffer: only `include`,
    // `include_next` and `define` matter, so longer names need not be kept.
    let mut keyword = [0u8; 12];
    let mut length = 0;
    let mut end = skip_blanks(source, hash + 1);
    loop {
        match source.get(end) {
            Some(&byte) if is_identifier_byte(byte) => {
                if let Some(slot) = keyword.get_mut(length) {
                    *slot = byte;
                }
                length += 1;
                end += 1;
            }
            Some(b'\\') if splice_len(source, end) > 0 => end += splice_len(source, end),
            _ => break,
        }
    }
    let guard_candidate = out.guard_candidate.take();
    let kind = match keyword.get(..length) {
        Some(b"include") => None,
        Some(b"include_next") => Some(IncludeKind::Next),
        Some(b"define") => {
            let resume = define(source, end, out);
            let defined = out.defines.last().map(|define| &define.name);
            if guard_candidate.is_some() && defined == guard_candidate.as_ref() {
                if let Some(top) = out.conditions.last_mut() {
                    *top = false;
                }
            }
            return Ok(resume);
        }
        Some(b"if" | b"ifdef") => {
            out.conditions.push(true);
            return Ok(hash + 1);
        }
        Some(b"ifndef") => {
            out.conditions.push(true);
            let start = skip_blanks(source, end);
            let mut name_end = start;
            while name_end < source.len() && is_identifier_byte(source[name_end]) {
                name_end += 1;
            }
            if name_end > start {
                out.guard_candidate =
                    Some(String::from_utf8_lossy(&source[start..name_end]).into_owned());
            }
            return Ok(hash + 1);
        }
        Some(b"endif") => {
            out.conditions.pop();
            return Ok(hash + 1);
        }
        _ => return Ok(hash + 1),
    };
    let line = lines.line_of(source, hash);
    let open = skip_blanks(source, end);
    let (close, kind) = match source.get(open) {
        Some(b'"') => (b'"', kind.unwrap_or(IncludeKind::Quoted)),
        Some(b'<') => (b'>', kind.unwrap_or(IncludeKind::Angle)),
        Some(&byte) if byte.is_ascii_alphabetic() || byte == b'_' => {
            let Some((name, args)) = macro_include(source, open) else {
                return Err(bad_include(BadKind::Computed, source, hash, line));
            };
            out.macro_includes.push(MacroInclude {
                line,
                text: directive_text(source, hash),
                name,
                args,
            });
            return Ok(open);
        }
        _ => return Err(bad_include(BadKind::Malformed, source, hash, line)),
    };
    let mut i = open + 1;
    let mut spliced = false;
    loop {
        match source.get(i) {
            None | Some(b'\n') => return Err(bad_include(BadKind::Malformed, source, hash, line)),
            Some(&byte) if byte == close => break,
            Some(b'\\') if splice_len(source, i) > 0 => {
                spliced = true;
                i += splice_len(source, i);
            }
            Some(_) => i += 1,
        }
    }
    let raw = &source[open + 1..i];
    let name = if spliced {
        String::from_utf8_lossy(&remove_splices(raw)).into_owned()
    } else {
        String::from_utf8_lossy(raw).into_owned()
    };
    let conditional = out.in_conditional();
    out.includes.push(Include {
        kind,
        name,
        line,
        conditional,
    });
    // Past the closing delimiter, so `<a/*b.h>` opens no comment.
    Ok(i + 1)
}

fn bad_include(kind: BadKind, source: &[u8], hash: usize, line: u32) -> BadInclude {
    BadInclude {
        kind,
        line,
        text: directive_text(source, hash),
    }
}

/// The logical line of the directive whose `#` is at `hash`, splices removed, for messages.
fn directive_text(source: &[u8], hash: usize) -> String {
    let mut end = hash;
    loop {
        match source[end..].iter().position(|&byte| byte == b'\n') {
            Some(offset) if is_spliced_newline(source, end + offset) => end += offset + 1,
            Some(offset) => {
                end += offset;
                break;
            }
            None => {
                end = source.len();
                break;
            }
        }
    }
    let text = remove_splices(&source[hash..end]);
    String::from_utf8_lossy(&text).trim().to_owned()
}

/// Length of the line splice (backslash, optional blanks, newline) at `i`, or 0 when none.
fn splice_len(source: &[u8], i: usize) -> usize {
    let mut j = i + 1;
    while j < source.len() && matches!(source[j], b' ' | b'\t' | 0x0b | 0x0c | b'\r') {
        j += 1;
    }
    if source.get(i) == Some(&b'\\') && source.get(j) == Some(&b'\n') {
        j + 1 - i
    } else {
        0
    }
}

fn skip_splices(source: &[u8], mut i: usize) -> usize {
    while source.get(i) == Some(&b'\\') {
        match splice_len(source, i) {
            0 => break,
            length => i += length,
        }
    }
    i
}

/// Whether the newline at `newline` ends a line splice rather than the logical line.
fn is_spliced_newline(source: &[u8], newline: usize) -> bool {
    let mut j = newline;
    while j > 0 && matches!(source[j - 1], b' ' | b'\t' | 0x0b | 0x0c | b'\r') {
        j -= 1;
    }
    j > 0 && source[j - 1] == b'\\'
}

fn remove_splices(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match splice_len(bytes, i) {
            0 => {
                out.push(bytes[i]);
                i += 1;
            }
            length => i += length,
        }
    }
    out
}

/// Skips blanks, line splices and block comments; stops at a newline or anything else.
fn skip_blanks(source: &[u8], mut i: usize) -> usize {
    while i < source.len() {
        match source[i] {
            byte if is_blank(byte) => i += 1,
            b'\\' => match splice_len(source, i) {
                0 => return i,
                length => i += length,
            },
            b'/' => {
                let next = skip_splices(source, i + 1);
                if source.get(next) == Some(&b'*') {
                    i = skip_block_comment(source, next + 1);
                } else {
                    return i;
                }
            }
            _ => return i,
        }
    }
    i
}

/// Lexes to the end of the logical line; returns the position just past its newline.
fn skip_rest_of_line(source: &[u8], mut i: usize) -> usize {
    let n = source.len();
    while i < n {
        while i < n && !SPECIAL[source[i] as usize] {
            i += 1;
        }
        if i == n {
            break;
        }
        match source[i] {
            b'\n' => return i + 1,
            b'\\' => i += splice_len(source, i).max(1),
            b'/' => {
                let next = skip_splices(source, i + 1);
                match source.get(next) {
                    Some(b'/') => i = skip_line_comment(source, next + 1),
                    Some(b'*') => i = skip_block_comment(source, next + 1),
                    _ => i += 1,
                }
            }
            b'"' => {
                i = if is_raw_string_prefix(source, i) {
                    skip_raw_string(source, i + 1)
                        .unwrap_or_else(|| skip_quoted(source, i + 1, b'"'))
                } else {
                    skip_quoted(source, i + 1, b'"')
                };
            }
            _ => {
                // `'`: a digit separator in `1'000'000`, else a character literal.
                i = if is_digit_separator(source, i) {
                    i + 1
                } else {
                    skip_quoted(source, i + 1, b'\'')
                };
            }
        }
    }
    n
}

/// Returns the position of the newline that ends a `//` comment whose body starts at `i`.
fn skip_line_comment(source: &[u8], mut i: usize) -> usize {
    loop {
        match source[i.min(source.len())..]
            .iter()
            .position(|&byte| byte == b'\n')
        {
            None => return source.len(),
            Some(offset) if is_spliced_newline(source, i + offset) => i += offset + 1,
            Some(offset) => return i + offset,
        }
    }
}

/// Returns the position just past the `*/` closing a comment whose body starts at `i`.
fn skip_block_comment(source: &[u8], mut i: usize) -> usize {
    while i < source.len() {
        match source[i..].iter().position(|&byte| byte == b'*') {
            None => break,
            Some(offset) => i += offset + 1,
        }
        i = skip_splices(source, i);
        if source.get(i) == Some(&b'/') {
            return i + 1;
        }
    }
    source.len()
}

/// Skips a string or character literal whose body starts at `i`. A literal cannot span lines,
/// so an unterminated one ends before the newline, as the preprocessor reads it.
fn skip_quoted(source: &[u8], mut i: usize, quote: u8) -> usize {
    while i < source.len() {
        match source[i] {
            byte if byte == quote => return i + 1,
            b'\\' => i += splice_len(source, i).max(2),
            b'\n' => return i,
            _ => i += 1,
        }
    }
    source.len()
}

/// Whether the `"` at `quote` opens a raw string: `R`, `LR`, `uR`, `UR` or `u8R` right before it,
/// starting a token.
fn is_raw_string_prefix(source: &[u8], quote: usize) -> bool {
    if quote == 0 || source[quote - 1] != b'R' {
        return false;
    }
    let before = &source[..quote - 1];
    let start = match before {
        [.., b'u', b'8'] => quote - 3,
        [.., b'u' | b'U' | b'L'] => quote - 2,
        _ => quote - 1,
    };
    start == 0 || !is_identifier_byte(source[start - 1])
}

/// Returns the position just past a raw string whose delimiter starts at `i`, or `None` when
/// the delimiter is invalid (then it is lexed as an ordinary string).
fn skip_raw_string(source: &[u8], i: usize) -> Option<usize> {
    let mut open = i;
    while open < source.len()
        && open - i <= 16
        && !matches!(
            source[open],
            b'(' | b')' | b'\\' | b'"' | b' ' | b'\t' | 0x0b | 0x0c | b'\r' | b'\n'
        )
    {
        open += 1;
    }
    if source.get(open) != Some(&b'(') || open - i > 16 {
        return None;
    }
    let delimiter = &source[i..open];
    let mut k = open + 1;
    while let Some(offset) = source[k.min(source.len())..]
        .iter()
        .position(|&byte| byte == b')')
    {
        let close = k + offset;
        let rest = &source[close + 1..];
        if rest.starts_with(delimiter) && rest.get(delimiter.len()) == Some(&b'"') {
            return Some(close + 2 + delimiter.len());
        }
        k = close + 1;
    }
    Some(source.len())
}

/// Whether the `'` at `quote` separates digits of a number (`0x1'ff`) rather than opening a
/// character literal (`u8'a'`, `L'a'`).
fn is_digit_separator(source: &[u8], quote: usize) -> bool {
    let mut start = quote;
    while start > 0
        && (is_identifier_byte(source[start - 1]) || matches!(source[start - 1], b'.' | b'\''))
    {
        start -= 1;
    }
    if start == quote {
        return false;
    }
    let first = source[start];
    first.is_ascii_digit()
        || (first == b'.' && source.get(start + 1).is_some_and(u8::is_ascii_digit))
}
