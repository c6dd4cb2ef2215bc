//! The records of `kernels.idx`, in binary: what one kernel's load needs in as few bytes as
//! it takes, and key inputs split so an include graph shared by thousands of kernels is
//! stored once.
//!
//! Every number is an unsigned LEB128 varint; a string is its length then its UTF-8 bytes; a
//! digest is a tag byte (0: the next 32 bytes are a sha256, written as 64 lowercase hex digits;
//! 1: a string, for a value that is not one) then its bytes. Short strings that many records
//! repeat (arches, builds, torch pins, compilers, family dictionary digests, the reasons of
//! skipped targets, the folders of include graphs' files) are written once, as the file's
//! vocabulary, and named by their position. The vocabulary is its word count, then each word
//! as a digest (a family's digest takes 33 bytes): an open indexes it in one pass and decodes
//! only the words a record names.
//!
//! ```text
//! load record    recipe        u8 0 | 1, then source, include-dir count, include dirs
//!                constants     count, then (name, tag 0 int | 1 float | 2 bool | 3 string, value)
//!                function sets count, then per set: count, then (name; symbol-is-name
//!                              u8, [symbol], parameter count, parameter sizes, computed
//!                              constant count, then (name, zigzag value)). A set's first
//!                              name is a head, an offset and a length of the kernel's own
//!                              name, and a tail (head + kernel[offset..][..length] + tail);
//!                              each next one, the bytes it shares with the one before, then
//!                              the rest
//!                variants      count, then (arch, build, torch, compiler kind, compiler
//!                              version: vocabulary ids; key, artifact digest: digests; size,
//!                              stored size; path u8 0 canonical | 1 then the path; family
//!                              dictionary: 0 none | 1 + vocabulary id; function set id;
//!                              struct count, then (name, size, align, field count, then
//!                              (name, offset, size)))
//!                skips         count, then (arch, build, reason: vocabulary ids; kind: 0
//!                              declared | 1 unsupported | 2 stub | 3 failed), the kind
//!                              only in a file of `LOOKUP_FORMAT` (format 7 has none: the
//!                              reason's first words give it)
//! inputs record  entries (u8 0: the names of the first variant's functions, in order, as the
//!                load record has them | 1 then the names), defines (count, then name,
//!                value), flags, nvcc flags, nvrtc flags,
//!                C++ standard, preamble, targets (count, then arch, defines, flags, nvcc
//!                flags, nvrtc flags), requirements (inputs, then count, then (condition,
//!                reason: u8 0 none | 1 then the reason)), computed (template, constants
//!                as name, expression pairs, then struct count, then (name, fields))
//! graph record   count, then (folder: 0 none | 1 + vocabulary id, then the rest of the stable
//!                path after the folder's `/`; digest): the kernel's include graph
//! ```
//!
//! The reader takes every count, length and id as untrusted: nothing is reserved from a
//! count, a length past the record's end or an id past the vocabulary is refused, and a
//! record must be read to its last byte. Everything it makes (each string, word copied out of
//! the vocabulary, function, variant and map entry, with what it holds besides its bytes) is
//! charged to a [`Decoded`] budget before it is made: one kernel's in a lookup, one for all
//! of them in a whole-index read, so what a file decodes to is bounded by the cap, not by how
//! often its records name what they share. The records it returns are checked as `index.json`'s
//! are ([`crate::untrusted::check_kernel`]) by the caller.

use std::collections::BTreeMap;

use crate::bundle::artifact_path;
use crate::index::{
    CompilerRecord, ComputedInputs, Constant, FieldLayout, Function, KernelInputs, KernelRecord,
    Requirement, Requirements, Skip, SkipKind, SourceRecipe, StoredFile, StructLayout,
    TargetInputs, Variant,
};

/// A signed value as an unsigned varint's number: 0, -1, 1, -2 → 0, 1, 2, 3.
fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

/// The value [`zigzag`] wrote.
fn unzigzag(number: u64) -> i64 {
    ((number >> 1) as i64) ^ -((number & 1) as i64)
}

mod reader;
mod words;
use reader::names_budget;
pub(super) use reader::{Decoded, HELD};
pub(super) use reader::{In, Read};
pub(super) use words::{Vocabulary, Words};

/// A kernel's load record, decoded: everything of its record but its key inputs.
pub(super) struct Load {
    pub recipe: Option<SourceRecipe>,
    pub constants: BTreeMap<String, Constant>,
    pub variants: Vec<Variant>,
    pub skipped: Vec<Skip>,
}

/// Bytes being written.
#[derive(Default)]
struct Out(Vec<u8>);

impl Out {
    fn number(&mut self, mut value: u64) {
        loop {
            let byte = (value & 0x7f) as u8;
            value >>= 7;
            if value == 0 {
                self.0.push(byte);
                return;
            }
            self.0.push(byte | 0x80);
        }
    }

    fn text(&mut self, text: &str) {
        self.number(text.len() as u64);
        self.0.extend_from_slice(text.as_bytes());
    }

    fn texts(&mut self, texts: &[String]) {
        self.number(texts.len() as u64);
        for text in texts {
            self.text(text);
        }
    }

    fn map(&mut self, map: &BTreeMap<String, String>) {
        self.number(map.len() as u64);
        for (name, value) in map {
            self.text(name);
            self.text(value);
        }
    }

    fn digest(&mut self, digest: &str) {
        match raw_digest(digest) {
            Some(raw) => {
                self.0.push(0);
                self.0.extend_from_slice(&raw);
            }
            None => {
                self.0.push(1);
                self.text(digest);
            }
        }
    }
}

fn raw_digest(text: &str) -> Option<[u8; 32]> {
    let hex = |byte: u8| match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        _ => None,
    };
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut raw = [0u8; 32];
    for (at, pair) in bytes.chunks_exact(2).enumerate() {
        raw[at] = (hex(pair[0])? << 4) | hex(pair[1])?;
    }
    Some(raw)
}

/// How many leading bytes `name` shares with `previous`, ending on a character boundary.
fn shared_prefix(previous: &str, name: &str) -> usize {
    let mut shared = previous
        .bytes()
        .zip(name.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    while !name.is_char_boundary(shared) {
        shared -= 1;
    }
    shared
}

/// The longest run of bytes `name` and `kernel` share, as (where in `name`, where in
/// `kernel`, length), cut to character boundaries; `None` below 4 bytes. A kernel's entry is
/// mostly named after it (`layernorm_bf16`, FlashInfer's `gemm_Bfloat16_…` in kernel
/// `k00000_Gemm_Bfloat16_…`): the record then holds the entry's name in a few bytes.
fn shared_with_kernel(name: &str, kernel: &str) -> Option<(usize, usize, usize)> {
    const SHORTEST: usize = 4;
    let (name_bytes, kernel_bytes) = (name.as_bytes(), kernel.as_bytes());
    // Quadratic in the two lengths: names past this are written out instead.
    if name_bytes.len().saturating_mul(kernel_bytes.len()) > 1 << 20 {
        return None;
    }
    let mut best = (0, 0, 0);
    let mut previous = vec![0usize; kernel_bytes.len() + 1];
    let mut row = vec![0usize; kernel_bytes.len() + 1];
    for (i, a) in name_bytes.iter().enumerate() {
        for (j, b) in kernel_bytes.iter().enumerate() {
            row[j + 1] = if a == b { previous[j] + 1 } else { 0 };
            if row[j + 1] > best.2 {
                best = (i + 1 - row[j + 1], j + 1 - row[j + 1], row[j + 1]);
            }
        }
        std::mem::swap(&mut previous, &mut row);
    }
    let (mut at, mut from, mut length) = best;
    while length > 0 && !(name.is_char_boundary(at) && kernel.is_char_boundary(from)) {
        (at, from, length) = (at + 1, from + 1, length - 1);
    }
    while length > 0 && !name.is_char_boundary(at + length) {
        length -= 1;
    }
    (length >= SHORTEST).then_some((at, from, length))
}

/// The load record of kernel `kernel`'s `record`.
pub(super) fn encode_load(kernel: &str, record: &KernelRecord, words: &Vocabulary) -> Vec<u8> {
    let mut out = Out::default();
    match &record.recipe {
        None => out.0.push(0),
        Some(recipe) => {
            out.0.push(1);
            out.text(&recipe.source);
            out.texts(&recipe.include_dirs);
        }
    }
    out.number(record.constants.len() as u64);
    for (name, constant) in &record.constants {
        out.text(name);
        match constant {
            Constant::Integer(value) => {
                out.0.push(0);
                out.number(*value as u64);
            }
            Constant::Float(value) => {
                out.0.push(1);
                out.0.extend_from_slice(&value.to_bits().to_le_bytes());
            }
            Constant::Bool(value) => out.0.extend_from_slice(&[2, u8::from(*value)]),
            Constant::String(value) => {
                out.0.push(3);
                out.text(value);
            }
        }
    }
    // Variants of one kernel mostly export the same functions: each distinct set once.
    let mut sets: Vec<&Vec<Function>> = Vec::new();
    for variant in &record.variants {
        if !sets.contains(&&variant.functions) {
            sets.push(&variant.functions);
        }
    }
    out.number(sets.len() as u64);
    for set in &sets {
        out.number(set.len() as u64);
        let mut previous: Option<&str> = None;
        for function in set.iter() {
            let name = function.name.as_str();
            match previous {
                None => {
                    // Nothing shared: the whole name as the head, an empty piece and tail.
                    let (at, from, length) =
                        shared_with_kernel(name, kernel).unwrap_or((name.len(), 0, 0));
                    out.text(&name[..at]);
                    out.number(from as u64);
                    out.number(length as u64);
                    out.text(&name[at + length..]);
                }
                // Entries of one kernel mostly share a long prefix (`gemm_…`,
                // `gemm_…GetSmemSize`).
                Some(previous) => {
                    let shared = shared_prefix(previous, name);
                    out.number(shared as u64);
                    out.text(&name[shared..]);
                }
            }
            previous = Some(name);
            if function.symbol == function.name {
                out.0.push(1);
            } else {
                out.0.push(0);
                out.text(&function.symbol);
            }
            out.number(function.param_sizes.len() as u64);
            for size in &function.param_sizes {
                out.number(u64::from(*size));
            }
            out.number(function.computed.len() as u64);
            for (name, value) in &function.computed {
                out.text(name);
                out.number(zigzag(*value));
            }
        }
    }
    out.number(record.variants.len() as u64);
    for variant in &record.variants {
        for word in [
            &variant.arch.to_string(),
            &variant.cuda.to_string(),
            &variant.torch,
            &variant.compiler.kind,
            &variant.compiler.version,
        ] {
            out.number(words.id(word));
        }
        out.digest(&variant.key);
        let artifact = &variant.artifact;
        out.digest(&artifact.digest);
        out.number(artifact.size);
        out.number(artifact.stored_size);
        if artifact.path == artifact_path(&artifact.digest) {
            out.0.push(0);
        } else {
            out.0.push(1);
            out.text(&artifact.path);
        }
        match &artifact.dictionary {
            None => out.number(0),
            Some(family) => out.number(1 + words.id(family)),
        }
        let set = sets.iter().position(|set| *set == &variant.functions);
        out.number(set.expect("every variant's set was written") as u64);
        out.number(variant.structs.len() as u64);
        for (name, layout) in &variant.structs {
            out.text(name);
            out.number(layout.size);
            out.number(layout.align);
            out.number(layout.fields.len() as u64);
            for field in &layout.fields {
                out.text(&field.name);
                out.number(field.offset);
                out.number(field.size);
            }
        }
    }
    out.number(record.skipped.len() as u64);
    for skip in &record.skipped {
        out.number(words.id(&skip.arch.to_string()));
        out.number(words.id(&skip.cuda.to_string()));
        out.number(words.id(&skip.reason));
        out.number(skip_kind_number(skip.kind));
    }
    out.0
}

/// The inputs record of `record`: its key inputs but the include graph. Entries that are the
/// names of the first variant's functions (as they mostly are) are not written again.
pub(super) fn encode_inputs(record: &KernelRecord) -> Vec<u8> {
    let inputs = &record.inputs;
    let mut out = Out::default();
    if inputs.entries == function_names(&record.variants) {
        out.0.push(0);
    } else {
        out.0.push(1);
        out.texts(&inputs.entries);
    }
    out.map(&inputs.defines);
    out.texts(&inputs.flags);
    out.texts(&inputs.nvcc_flags);
    out.texts(&inputs.nvrtc_flags);
    out.text(&inputs.cxx_std);
    out.text(&inputs.preamble);
    out.number(inputs.targets.len() as u64);
    for (arch, target) in &inputs.targets {
        out.text(&arch.to_string());
        out.map(&target.defines);
        out.texts(&target.flags);
        out.texts(&target.nvcc_flags);
        out.texts(&target.nvrtc_flags);
    }
    out.texts(&inputs.requires.inputs);
    out.number(inputs.requires.rules.len() as u64);
    for rule in &inputs.requires.rules {
        out.text(&rule.when);
        match &rule.reason {
            None => out.0.push(0),
            Some(reason) => {
                out.0.push(1);
                out.text(reason);
            }
        }
    }
    out.text(&inputs.computed.template);
    out.map(&inputs.computed.constants);
    out.number(inputs.computed.structs.len() as u64);
    for (name, fields) in &inputs.computed.structs {
        out.text(name);
        out.texts(fields);
    }
    out.0
}

/// The graph record of an include graph (`KernelInputs::files`).
pub(super) fn encode_graph(files: &BTreeMap<String, String>, words: &Vocabulary) -> Vec<u8> {
    let mut out = Out::default();
    out.number(files.len() as u64);
    for (stable, digest) in files {
        match stable.rsplit_once('/') {
            None => {
                out.number(0);
                out.text(stable);
            }
            Some((folder, name)) => {
                out.number(1 + words.id(folder));
                out.text(name);
            }
        }
        out.digest(digest);
    }
    out.0
}

/// A digest's 32 bytes as 64 lowercase hex digits, then one allocation (a `format!` per byte,
/// or `hex::encode`'s per-character pushes, cost more than the rest of a record).
fn hex_digest(raw: &[u8]) -> String {
    let text = hex_on_stack(raw);
    std::str::from_utf8(&text)
        .expect("hex digits are ASCII")
        .to_owned()
}

/// A digest's 32 bytes as 64 lowercase hex digits, on the stack.
fn hex_on_stack(raw: &[u8]) -> [u8; 64] {
    let mut text = [0u8; 64];
    hex::encode_to_slice(raw, &mut text).expect("64 digits for 32 bytes");
    text
}

/// Reads the load record of kernel `kernel`; its skips name their kind when `skip_kinds` (a
/// file of [`super::LOOKUP_FORMAT`]).
pub(super) fn decode_load(
    kernel: &str,
    bytes: &[u8],
    words: &Words,
    skip_kinds: bool,
    decoded: &Decoded,
) -> Read<Load> {
    let budget = names_budget(bytes);
    let mut input = In::new(bytes, decoded);
    let recipe = if input.flag()? {
        Some(SourceRecipe {
            source: input.text()?,
            include_dirs: input.texts()?,
        })
    } else {
        None
    };
    let mut constants = BTreeMap::new();
    for _ in 0..input.count()? {
        input.held(std::mem::size_of::<Constant>() as u64)?;
        let name = input.text()?;
        let constant = match input.byte()? {
            0 => Constant::Integer(input.number()? as i64),
            1 => {
                let bits = input.take(8)?.try_into().expect("8 bytes");
                Constant::Float(f64::from_bits(u64::from_le_bytes(bits)))
            }
            2 => Constant::Bool(input.flag()?),
            3 => Constant::String(input.text()?),
            other => return Err(format!("has constant kind {other}")),
        };
        if constants.insert(name, constant).is_some() {
            return Err("names a constant twice".to_owned());
        }
    }
    let mut sets = Vec::new();
    // Bytes of names repeated from earlier ones: a few bytes each in the record, so bounded
    // apart from its length (names each one byte longer than the last would grow as its
    // square).
    let mut repeated = 0u64;
    for _ in 0..input.count()? {
        let mut set: Vec<Function> = Vec::new();
        for _ in 0..input.count()? {
            let name = match set.last() {
                None => {
                    let head = input.text()?;
                    let (from, length) = (input.number()?, input.number()?);
                    let piece = usize::try_from(from)
                        .ok()
                        .zip(usize::try_from(length).ok())
                        .and_then(|(from, length)| kernel.get(from..from.checked_add(length)?))
                        .ok_or_else(|| {
                            format!(
                                "takes {length} bytes at {from} of the kernel's name of {} bytes",
                                kernel.len()
                            )
                        })?;
                    repeated = repeated.saturating_add(length);
                    input.held(length)?;
                    format!("{head}{piece}{}", input.text()?)
                }
                Some(previous) => {
                    let previous = previous.name.as_str();
                    let shared = input.number()?;
                    repeated = repeated.saturating_add(shared);
                    let prefix = usize::try_from(shared)
                        .ok()
                        .and_then(|shared| previous.get(..shared))
                        .ok_or_else(|| {
                            format!(
                                "shares {shared} bytes with a name of {} bytes",
                                previous.len()
                            )
                        })?;
                    input.held(shared)?;
                    format!("{prefix}{}", input.text()?)
                }
            };
            if repeated > budget {
                return Err(format!(
                    "repeats more than {budget} bytes of its function names"
                ));
            }
            let symbol = if input.flag()? {
                input.held(name.len() as u64)?;
                name.clone()
            } else {
                input.text()?
            };
            input.held(std::mem::size_of::<Function>() as u64)?;
            let params = input.count()?;
            input.held(4 * params)?;
            let param_sizes = (0..params)
                .map(|_| {
                    let size = input.number()?;
                    u32::try_from(size).map_err(|_| format!("has a parameter of {size} bytes"))
                })
                .collect::<Read<Vec<u32>>>()?;
            let mut computed = BTreeMap::new();
            for _ in 0..input.count()? {
                input.held(8)?;
                let constant = input.text()?;
                if computed
                    .insert(constant, unzigzag(input.number()?))
                    .is_some()
                {
                    return Err("names a computed constant twice".to_owned());
                }
            }
            set.push(Function {
                name,
                symbol,
                param_sizes,
                computed,
            });
        }
        // What a variant's copy of the set takes: its names, their strings, the parameters.
        let bytes: u64 = set
            .iter()
            .map(|function| {
                (function.name.len() + function.symbol.len() + 4 * function.param_sizes.len())
                    as u64
                    + 3 * HELD
                    + std::mem::size_of::<Function>() as u64
            })
            .sum::<u64>()
            + HELD;
        sets.push((set, bytes));
    }
    // Each variant holds its own copy of its set: bounded in all as the names are.
    let mut copied = 0u64;
    let mut variants = Vec::new();
    for _ in 0..input.count()? {
        input.held(std::mem::size_of::<Variant>() as u64)?;
        let arch = input.parsed(words)?;
        let cuda = input.parsed(words)?;
        let torch = input.word(words)?.into_owned();
        let compiler = CompilerRecord {
            kind: input.word(words)?.into_owned(),
            version: input.word(words)?.into_owned(),
        };
        let key = input.digest()?;
        let digest = input.digest()?;
        let (size, stored_size) = (input.number()?, input.number()?);
        let path = if input.flag()? {
            // Written out only when it is not the canonical one; an index being built has no
            // path yet, one read from disk always has.
            let path = input.text()?;
            if path.is_empty() {
                return Err("gives a variant an empty artifact path".to_owned());
            }
            path
        } else {
            let path = artifact_path(&digest);
            input.held(path.len() as u64)?;
            path
        };
        let dictionary = match input.number()? {
            0 => None,
            id => Some(
                input
                    .copied(words.get(id - 1), || {
                        format!("names dictionary {id} of {}", words.len())
                    })?
                    .into_owned(),
            ),
        };
        let set = input.number()?;
        let (functions, bytes) = sets
            .get(usize::try_from(set).unwrap_or(usize::MAX))
            .ok_or_else(|| format!("names function set {set} of {}", sets.len()))?;
        copied = copied.saturating_add(*bytes);
        if copied > budget {
            return Err(format!(
                "gives its variants more than {budget} bytes of function names"
            ));
        }
        decoded.charge(*bytes)?;
        let functions = functions.clone();
        let mut structs = BTreeMap::new();
        for _ in 0..input.count()? {
            input.held(std::mem::size_of::<StructLayout>() as u64)?;
            let name = input.text()?;
            let size = input.number()?;
            let align = input.number()?;
            let mut fields = Vec::new();
            for _ in 0..input.count()? {
                input.held(std::mem::size_of::<FieldLayout>() as u64)?;
                fields.push(FieldLayout {
                    name: input.text()?,
                    offset: input.number()?,
                    size: input.number()?,
                });
            }
            let layout = StructLayout {
                size,
                align,
                fields,
            };
            if structs.insert(name, layout).is_some() {
                return Err("names a struct twice".to_owned());
            }
        }
        variants.push(Variant {
            arch,
            cuda,
            torch,
            compiler,
            key,
            artifact: StoredFile {
                digest,
                size,
                path,
                stored_size,
                dictionary,
            },
            functions,
            structs,
        });
    }
    let mut skipped = Vec::new();
    for _ in 0..input.count()? {
        input.held(std::mem::size_of::<Skip>() as u64)?;
        let arch = input.parsed(words)?;
        let cuda = input.parsed(words)?;
        let reason = input.word(words)?.into_owned();
        let kind = match skip_kinds {
            true => {
                let number = input.number()?;
                *usize::try_from(number)
                    .ok()
                    .and_then(|at| SkipKind::ALL.get(at))
                    .ok_or_else(|| format!("names skip kind {number}, which is not one"))?
            }
            // Format 7 wrote no kind: its writers put it in the reason's first words.
            false => SkipKind::of_legacy_reason(&reason),
        };
        skipped.push(Skip {
            arch,
            cuda,
            kind,
            reason,
        });
    }
    input.end()?;
    Ok(Load {
        recipe,
        constants,
        variants,
        skipped,
    })
}

/// The number a load record writes `kind` as: its place in [`SkipKind::ALL`].
fn skip_kind_number(kind: SkipKind) -> u64 {
    SkipKind::ALL
        .iter()
        .position(|each| *each == kind)
        .expect("every kind is listed") as u64
}

/// The names of the first variant's functions, in order: what an inputs record's entries
/// mostly are.
fn function_names(variants: &[Variant]) -> Vec<String> {
    variants.first().map_or_else(Vec::new, |variant| {
        variant
            .functions
            .iter()
            .map(|function| function.name.clone())
            .collect()
    })
}

/// Reads an inputs record, whose entries may be `load`'s function names; its `files` are left
/// empty for the graph record to fill.
pub(super) fn decode_inputs(bytes: &[u8], load: &Load, decoded: &Decoded) -> Read<KernelInputs> {
    let mut input = In::new(bytes, decoded);
    let entries = if input.flag()? {
        input.texts()?
    } else {
        let names = function_names(&load.variants);
        let bytes: u64 = names.iter().map(|name| name.len() as u64 + HELD).sum();
        decoded.charge(bytes + HELD)?;
        names
    };
    let mut inputs = KernelInputs {
        entries,
        files: BTreeMap::new(),
        defines: input.map()?,
        flags: input.texts()?,
        nvcc_flags: input.texts()?,
        nvrtc_flags: input.texts()?,
        cxx_std: input.text()?,
        preamble: input.text()?,
        targets: BTreeMap::new(),
        requires: Requirements::default(),
        computed: ComputedInputs::default(),
    };
    for _ in 0..input.count()? {
        input.held(std::mem::size_of::<TargetInputs>() as u64)?;
        let arch = input.text()?;
        let arch = arch
            .parse()
            .map_err(|_| format!("names `{arch}` where an arch goes"))?;
        let target = TargetInputs {
            defines: input.map()?,
            flags: input.texts()?,
            nvcc_flags: input.texts()?,
            nvrtc_flags: input.texts()?,
        };
        if inputs.targets.insert(arch, target).is_some() {
            return Err("names a target twice".to_owned());
        }
    }
    inputs.requires.inputs = input.texts()?;
    for _ in 0..input.count()? {
        input.held(std::mem::size_of::<Requirement>() as u64)?;
        let when = input.text()?;
        let reason = if input.flag()? {
            Some(input.text()?)
        } else {
            None
        };
        inputs.requires.rules.push(Requirement { when, reason });
    }
    inputs.computed.template = input.text()?;
    inputs.computed.constants = input.map()?;
    for _ in 0..input.count()? {
        input.held(0)?;
        let name = input.text()?;
        let fields = input.texts()?;
        if inputs.computed.structs.insert(name, fields).is_some() {
            return Err("names a struct twice".to_owned());
        }
    }
    input.end()?;
    Ok(inputs)
}

/// Reads a graph record.
pub(super) fn decode_graph(
    bytes: &[u8],
    words: &Words,
    decoded: &Decoded,
) -> Read<BTreeMap<String, String>> {
    let mut input = In::new(bytes, decoded);
    let mut files = BTreeMap::new();
    for _ in 0..input.count()? {
        // The map's node, beside its two strings.
        input.held(0)?;
        let stable = match input.number()? {
            0 => input.text()?,
            id => {
                let folder = input.copied(words.get(id - 1), || {
                    format!("names folder {id} of {}", words.len())
                })?;
                format!("{folder}/{}", input.text()?)
            }
        };
        let digest = input.digest()?;
        if files.insert(stable, digest).is_some() {
            return Err("names a file twice".to_owned());
        }
    }
    input.end()?;
    Ok(files)
}
