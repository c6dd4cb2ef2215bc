//! PTX artifacts (`compute_XY` targets): the header facts and every `.entry` with its
//! parameter sizes, read from the text.

use super::*;

/// Reads PTX text: its `.version`, `.target`, `.address_size`, `.entry`s with their
/// parameter sizes, and `.func`s (device functions).
pub(super) fn inspect_ptx(bytes: &[u8]) -> Result<Inspection, CubinError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|error| malformed_ptx(format!("the text is not UTF-8: {error}")))?;
    // The driver reads PTX up to a NUL; one at the end is allowed, one inside is not.
    let text = text.trim_end_matches('\0');
    if text.contains('\0') {
        return Err(malformed_ptx("it contains a NUL byte before its end"));
    }
    let code = strip_ptx_comments(text);
    let mut tokens = PtxTokens::new(&code);
    let mut version = None;
    let mut target = None;
    let mut address_size = None;
    let mut functions = Vec::new();
    let mut device_functions = Vec::new();
    while let Some(token) = tokens.next() {
        match token {
            ".version" => {
                let value = tokens.next().unwrap_or_default();
                let valid = value.split_once('.').is_some_and(|(major, minor)| {
                    major.parse::<u32>().is_ok() && minor.parse::<u32>().is_ok()
                });
                if !valid {
                    return Err(malformed_ptx(format!(
                        "`.version {value}` is not a version"
                    )));
                }
                version = Some(value.to_owned());
            }
            ".target" => {
                if version.is_none() {
                    return Err(malformed_ptx("`.target` comes before `.version`"));
                }
                // `.target sm_90` or `.target sm_90, texmode_independent`: the SM comes first.
                let value = tokens.next().unwrap_or_default().trim_end_matches(',');
                target = Some(value.to_owned());
            }
            ".address_size" => address_size = tokens.next().map(str::to_owned),
            ".entry" => {
                let name = tokens
                    .next()
                    .ok_or_else(|| malformed_ptx("`.entry` without a name"))?;
                // `.entry name;` or `.entry name(…);` only declares an entry defined later.
                if let Some((name, params)) = entry_parameters(name, &mut tokens)? {
                    functions.push(CubinFunction {
                        symbol: name,
                        param_sizes: params,
                    });
                }
            }
            ".func" => {
                // `.func (.param .b32 ret) name(…)`: the return parameters come first.
                let mut name = tokens.next().unwrap_or_default();
                if name == "(" {
                    while tokens.next().is_some_and(|token| token != ")") {}
                    name = tokens.next().unwrap_or_default();
                }
                device_functions.push(name.to_owned());
            }
            _ => {}
        }
    }
    let version = version.ok_or_else(|| malformed_ptx("no `.version` directive"))?;
    let target = target.ok_or_else(|| malformed_ptx("no `.target` directive"))?;
    let arch: Arch = target
        .parse()
        .ok()
        .filter(|arch: &Arch| !arch.is_ptx())
        .ok_or_else(|| malformed_ptx(format!("`.target {target}` names no SM")))?;
    if address_size.as_deref() != Some("64") {
        let found = match address_size {
            Some(size) => format!("`.address_size {size}`"),
            None => "no `.address_size` (32, the default)".to_owned(),
        };
        return Err(malformed_ptx(format!(
            "{found}: kernels are loaded as 64-bit code only"
        )));
    }
    if let Some(twice) = sort_by_symbol(&mut functions) {
        return Err(malformed_ptx(format!("`.entry {twice}` is defined twice")));
    }
    device_functions.sort();
    Ok(Inspection {
        info: CubinInfo {
            abi_version: 0,
            elf_flags: 0,
            sm: arch.sm,
            kind: Some(ArchKind::Ptx),
            kind_evidence: format!(".version {version}, .target {target}"),
            functions,
        },
        device_functions,
    })
}

/// PTX without its `//` and `/* */` comments.
pub(super) fn strip_ptx_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |end| &after[end..]);
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |end| &after[end + 2..]);
            out.push(' ');
        } else {
            let next = rest.find('/').map_or(rest.len(), |at| at.max(1));
            out.push_str(&rest[..next]);
            rest = &rest[next..];
        }
    }
    out
}

/// PTX split into words, with `(`, `)`, `,`, `;`, `[`, `]`, `{`, `}` as tokens of their own.
pub(super) struct PtxTokens<'t> {
    rest: &'t str,
}

impl<'t> PtxTokens<'t> {
    fn new(text: &'t str) -> Self {
        PtxTokens { rest: text }
    }
}

impl<'t> Iterator for PtxTokens<'t> {
    type Item = &'t str;

    fn next(&mut self) -> Option<&'t str> {
        const PUNCTUATION: [char; 8] = ['(', ')', ',', ';', '[', ']', '{', '}'];
        self.rest = self.rest.trim_start();
        let first = self.rest.chars().next()?;
        let length = if PUNCTUATION.contains(&first) {
            1
        } else {
            self.rest
                .find(|c: char| c.is_whitespace() || PUNCTUATION.contains(&c))
                .unwrap_or(self.rest.len())
        };
        let (token, rest) = self.rest.split_at(length);
        self.rest = rest;
        Some(token)
    }
}

/// The name and parameter sizes of `.entry name(.param .u64 p0, .param .align 4 .b8 p1[12])`,
/// or `None` for a declaration (`.entry name;`, `.entry name(…);`).
pub(super) fn entry_parameters(
    name: &str,
    tokens: &mut PtxTokens<'_>,
) -> Result<Option<(String, Vec<u32>)>, CubinError> {
    let name = name.to_owned();
    let bad = |what: String| malformed_ptx(format!("in `.entry {name}`: {what}"));
    let mut sizes = Vec::new();
    fn peek<'t>(tokens: &PtxTokens<'t>) -> Option<&'t str> {
        PtxTokens { rest: tokens.rest }.next()
    }
    match peek(tokens) {
        Some(";") => return Ok(None),
        Some("(") => {
            tokens.next();
        }
        _ => return Ok(Some((name, sizes))),
    }
    // One parameter per iteration: `.param`, state space qualifiers, a type, a name, `[n]`.
    loop {
        let mut element = None;
        let mut count = 1u32;
        let mut seen_name = false;
        let end = loop {
            let Some(token) = tokens.next() else {
                return Err(bad("the parameter list is not closed".to_owned()));
            };
            match token {
                ")" | "," => break token,
                "[" => {
                    let number = tokens.next().unwrap_or_default();
                    count = number
                        .parse()
                        .map_err(|_| bad(format!("array size `{number}` is not a number")))?;
                    if tokens.next() != Some("]") {
                        return Err(bad("an array size is not closed".to_owned()));
                    }
                }
                ".align" => {
                    tokens.next();
                }
                _ if token.starts_with('.') => {
                    if let Some(size) = ptx_type_size(token) {
                        element = Some(size);
                    }
                }
                _ => seen_name = true,
            }
        };
        match (element, seen_name) {
            (Some(size), true) => sizes.push(size * count),
            (None, false) if end == ")" && sizes.is_empty() => {}
            (None, _) => return Err(bad(format!("parameter {} has no type", sizes.len()))),
            (Some(_), false) => return Err(bad(format!("parameter {} has no name", sizes.len()))),
        }
        if end == ")" {
            if peek(tokens) == Some(";") {
                return Ok(None);
            }
            return Ok(Some((name, sizes)));
        }
    }
}

/// The size in bytes of a PTX fundamental type (`.u64` → 8).
pub(super) fn ptx_type_size(token: &str) -> Option<u32> {
    Some(match token {
        ".b8" | ".u8" | ".s8" | ".pred" => 1,
        ".b16" | ".u16" | ".s16" | ".f16" | ".bf16" => 2,
        ".b32" | ".u32" | ".s32" | ".f32" | ".f16x2" | ".bf16x2" | ".tf32" => 4,
        ".b64" | ".u64" | ".s64" | ".f64" => 8,
        ".b128" => 16,
        _ => return None,
    })
}
