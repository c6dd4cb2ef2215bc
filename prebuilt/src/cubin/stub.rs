//! Stub entries: kernel bodies that, on the target they were compiled for, can do nothing but
//! report and abort.
//!
//! Libraries write kernels for one GPU and compile them for every target in their matrix;
//! where the real body cannot compile, an `#if` leaves a body that says so:
//!
//! ```text
//! #if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000      // CUTLASS, DeepGEMM, ...
//!   ... the real work ...
//! #else
//!   printf("ERROR : Arch conditional MMA instruction used without targeting ... Aborting.\n");
//!   asm("trap;");          // or assert(0 && "..."), or nothing: CUTLASS's kernels return
//! #endif
//! ```
//!
//! Such a cubin loads and launches, then prints and kills the CUDA context (or computes
//! nothing). [`stub_entries`] finds these bodies by reading each entry's `.text.<symbol>`
//! section once, 16 bytes per instruction (every SASS instruction from `sm_75` on). An entry is
//! a stub when all of these hold:
//!
//! - **It does nothing but bookkeeping.** Every instruction is one of a short list of
//!   operations that change nothing outside the thread's registers and stack: moves, integer
//!   arithmetic and comparisons, constant-bank and special-register reads, stores to the
//!   thread's own stack (`STL`, how `printf` arguments are passed), branches and convergence
//!   barriers, `CALL.ABS` (the call through a constant-bank address that reaches the
//!   driver's `vprintf`/`__assertfail`), `BPT` (`trap`, `__trap()`, `__brkpt()`), `EXIT` and
//!   `NOP`. A global, shared or generic load or store, an atomic, a barrier, a TMA or MMA
//!   instruction, a relative call to a device function, or any operation not in the list
//!   makes the entry real. The list is per ISA family, by the operation number in the low 9
//!   bits of each instruction's first word (bits 9–11 choose the operand form), as NVIDIA's
//!   `nvdisasm` names them on cubins of nvcc 13.0, NVRTC 12.9 and ptxas 12.9:
//!
//!   | operation (low 9 bits)                       | `sm_75`–`sm_90` | `sm_100`–`sm_121` |
//!   |----------------------------------------------|-----------------|-------------------|
//!   | `BPT` 0x15c, `EXIT` 0x14d, `NOP` 0x118        | yes             | yes               |
//!   | `BRA` 0x147, `CALL.ABS` 0x143, `LEPC` 0x14e    | yes             | yes               |
//!   | `MOV` 0x002, `CS2R` 0x005, `S2R` 0x119, `S2UR` 0x1c3, `LDC` 0x182, `STL` 0x187 | yes | yes |
//!   | `ISETP` 0x00c, `IADD3` 0x010, `LEA` 0x011, `LOP3` 0x012, `SHF` 0x019, `IMAD` 0x024/0x025 | yes | yes |
//!   | `VOTEU` 0x086, `UFLO` 0x0bd, `POPC` 0x109      | yes             | yes               |
//!   | `HFMA2` (as a move)                           | 0x035           | 0x031             |
//!   | `ULDC` 0x0b9                                  | yes             | —                 |
//!   | `LDCU` 0x1ac                                  | —               | yes               |
//!   | `IADD` 0x035                                  | —               | `sm_120`–`sm_121` |
//!   | `VIADD` 0x036, `ELECT` 0x02f, uniform and predicate ops, `BSSY`/`BSYNC`/`WARPSYNC`, `SHFL`, `LDL` | `sm_90` | yes |
//!
//!   Other targets (PTX, or an SM outside these families) are never called stubs.
//!
//! - **It calls nothing but the reporting functions.** The entry's `EIATTR_EXTERNS`
//!   attribute (0x0f in `.nv.info.<symbol>`: the symbol-table indices of the external functions
//!   it calls) names only `vprintf` and `__assertfail`.
//!
//! - **It reports or aborts.** It calls one of those, or traps. An empty body (`EXIT` alone)
//!   is not a stub: libraries write no-op kernels on purpose.
//!
//! So a real kernel with an `assert` or a `DG_DEVICE_ASSERT` on an error path is never a
//! stub: its body also loads and stores. A kernel whose only job is printing what it computes
//! from its thread index (a "hello" kernel) is one. A kernel that does real work and traps
//! only on some paths (CUTLASS's Blackwell kernels compiled for `sm_90a`, whose MMA atoms
//! become traps) is not found here. The bundler's rule for whole kernels is in
//! `docs/toolchains.md`.

use super::*;

/// The attribute of `.nv.info.<symbol>` that lists the external functions an entry calls.
const EIATTR_EXTERNS: u8 = 0x0f;

/// The external functions a stub may call: the device runtime's `printf` and `assert`.
const REPORT_FUNCTIONS: [&str; 2] = ["__assertfail", "vprintf"];

/// What an instruction is to the stub check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Changes nothing outside the thread's registers and stack.
    Bookkeeping,
    /// A call through an absolute address: the reporting functions.
    Call,
    /// `BPT`: a trap or breakpoint.
    Trap,
    /// `NOP`: padding, not counted.
    Padding,
}

/// (operation, mnemonic, role) for every ISA family from `sm_75` on.
const COMMON: &[(u16, &str, Role)] = &[
    (0x002, "MOV", Role::Bookkeeping),
    (0x005, "CS2R", Role::Bookkeeping),
    (0x00c, "ISETP", Role::Bookkeeping),
    (0x010, "IADD3", Role::Bookkeeping),
    (0x011, "LEA", Role::Bookkeeping),
    (0x012, "LOP3", Role::Bookkeeping),
    (0x019, "SHF", Role::Bookkeeping),
    (0x024, "IMAD", Role::Bookkeeping),
    (0x025, "IMAD.WIDE", Role::Bookkeeping),
    (0x086, "VOTEU", Role::Bookkeeping),
    (0x0bd, "UFLO", Role::Bookkeeping),
    (0x109, "POPC", Role::Bookkeeping),
    (0x118, "NOP", Role::Padding),
    (0x119, "S2R", Role::Bookkeeping),
    (0x143, "CALL.ABS", Role::Call),
    (0x147, "BRA", Role::Bookkeeping),
    (0x14d, "EXIT", Role::Bookkeeping),
    (0x14e, "LEPC", Role::Bookkeeping),
    (0x15c, "BPT", Role::Trap),
    (0x182, "LDC", Role::Bookkeeping),
    (0x187, "STL", Role::Bookkeeping),
    (0x1c3, "S2UR", Role::Bookkeeping),
];

/// Operations of `sm_90` and the Blackwell family that the earlier families encode otherwise
/// or lack.
const HOPPER_ON: &[(u16, &str, Role)] = &[
    (0x003, "P2R", Role::Bookkeeping),
    (0x004, "R2P", Role::Bookkeeping),
    (0x007, "SEL", Role::Bookkeeping),
    (0x016, "PRMT", Role::Bookkeeping),
    (0x01c, "PLOP3", Role::Bookkeeping),
    (0x02f, "ELECT", Role::Bookkeeping),
    (0x036, "VIADD", Role::Bookkeeping),
    (0x082, "UMOV", Role::Bookkeeping),
    (0x083, "UP2UR", Role::Bookkeeping),
    (0x087, "USEL", Role::Bookkeeping),
    (0x08c, "UISETP", Role::Bookkeeping),
    (0x090, "UIADD3", Role::Bookkeeping),
    (0x091, "ULEA", Role::Bookkeeping),
    (0x092, "ULOP3", Role::Bookkeeping),
    (0x096, "UPRMT", Role::Bookkeeping),
    (0x097, "UIADD3", Role::Bookkeeping),
    (0x099, "USHF", Role::Bookkeeping),
    (0x0a4, "UIMAD", Role::Bookkeeping),
    (0x0a5, "UIMAD.WIDE", Role::Bookkeeping),
    (0x0ca, "R2UR", Role::Bookkeeping),
    (0x141, "BSYNC", Role::Bookkeeping),
    (0x145, "BSSY", Role::Bookkeeping),
    (0x148, "WARPSYNC", Role::Bookkeeping),
    (0x183, "LDL", Role::Bookkeeping),
    (0x189, "SHFL", Role::Bookkeeping),
];

/// Turing, Ampere, Ada and Hopper only.
const TURING_TO_HOPPER: &[(u16, &str, Role)] = &[
    (0x035, "HFMA2", Role::Bookkeeping),
    (0x0b9, "ULDC", Role::Bookkeeping),
];

/// The Blackwell family only.
const BLACKWELL: &[(u16, &str, Role)] = &[
    (0x031, "HFMA2", Role::Bookkeeping),
    (0x1ac, "LDCU", Role::Bookkeeping),
];

/// Consumer Blackwell (`sm_120`, `sm_121`) only.
const BLACKWELL_CONSUMER: &[(u16, &str, Role)] = &[(0x035, "IADD", Role::Bookkeeping)];

/// The role of operation `opcode` on SM `sm`, or `None` when it is not bookkeeping there (or
/// the SM's encoding is not one this check reads).
fn role(sm: u32, opcode: u16) -> Option<Role> {
    let tables: &[&[(u16, &str, Role)]] = match sm {
        75..=89 => &[COMMON, TURING_TO_HOPPER],
        90 => &[COMMON, HOPPER_ON, TURING_TO_HOPPER],
        100..=119 => &[COMMON, HOPPER_ON, BLACKWELL],
        120..=121 => &[COMMON, HOPPER_ON, BLACKWELL, BLACKWELL_CONSUMER],
        _ => return None,
    };
    tables
        .iter()
        .flat_map(|table| table.iter())
        .find(|(code, _, _)| *code == opcode)
        .map(|(_, _, role)| *role)
}

/// Whether this check reads the instructions of SM `sm`.
fn reads_sm(sm: u32) -> bool {
    matches!(sm, 75..=90 | 100..=121)
}

/// An entry whose body, on its target, can do nothing but report and abort.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StubEntry {
    /// The entry's symbol.
    pub symbol: String,
    /// The body's instructions, not counting `NOP` padding.
    pub instructions: usize,
    /// Whether it traps (`BPT`).
    pub traps: bool,
    /// The reporting functions it calls (`__assertfail`, `vprintf`), sorted.
    pub reports: Vec<String>,
}

impl StubEntry {
    /// What the body does, for a skip reason: `11 instructions that call vprintf, then trap`.
    pub fn describe(&self) -> String {
        let calls = self.reports.join(" and ");
        let does = match (calls.is_empty(), self.traps) {
            (true, _) => "trap".to_owned(),
            (false, true) => format!("call {calls}, then trap"),
            // `__assertfail` ends the kernel itself.
            (false, false) if self.aborts() => format!("call {calls}"),
            (false, false) => format!("call {calls}, then return"),
        };
        let noun = if self.instructions == 1 {
            "instruction that"
        } else {
            "instructions that"
        };
        format!("{} {noun} {does}", self.instructions)
    }

    /// Whether running it ends the kernel with an error (a trap or a failed `assert`), rather
    /// than printing and returning.
    pub fn aborts(&self) -> bool {
        self.traps || self.reports.iter().any(|report| report == "__assertfail")
    }
}

/// The entries of a cubin whose bodies are stubs (see the module documentation), sorted by
/// symbol. PTX, and cubins for an SM whose instructions this check does not read, have none.
/// One pass over the sections and the symbol table, then one over each entry's instructions.
pub fn stub_entries(bytes: &[u8]) -> Result<Vec<StubEntry>, CubinError> {
    if !is_cubin(bytes) {
        return Ok(Vec::new());
    }
    with_aligned(bytes, aligned_stub_entries)
}

fn aligned_stub_entries(bytes: &[u8]) -> Result<Vec<StubEntry>, CubinError> {
    let endian = LittleEndian;
    let header = elf_header(bytes)?;
    let ident = header.e_ident();
    let sm = sm_from_flags(ident.abi_version, header.e_flags(endian)).unwrap_or(0);
    if !reads_sm(sm) {
        return Ok(Vec::new());
    }
    let sections = elf_sections(header, bytes)?;
    let mut texts = BTreeMap::new();
    let mut infos = BTreeMap::new();
    for section in sections.iter() {
        let name = sections
            .section_name(endian, section)
            .map_err(|error| malformed(format!("cannot read a section name: {error}")))?;
        let (map, function) = if let Some(function) = name.strip_prefix(b".text.") {
            (&mut texts, function)
        } else if let Some(function) = name.strip_prefix(NV_INFO_PREFIX) {
            (&mut infos, function)
        } else {
            continue;
        };
        let data = section.data(endian, bytes).map_err(|error| {
            malformed(format!(
                "cannot read section `{}`: {error}",
                String::from_utf8_lossy(name)
            ))
        })?;
        map.insert(function, data);
    }
    let symbols = sections
        .symbols(endian, bytes, SHT_SYMTAB)
        .map_err(|error| malformed(format!("cannot read the symbol table: {error}")))?;
    let symbol_name = |index: usize| -> Option<&[u8]> {
        let symbol = symbols.symbols().get(index)?;
        symbol.name(endian, symbols.strings()).ok()
    };
    let mut stubs = Vec::new();
    for symbol in symbols.iter() {
        if symbol.st_type() != STT_FUNC || symbol.st_other() & STO_CUDA_ENTRY == 0 {
            continue;
        }
        let name = symbol
            .name(endian, symbols.strings())
            .map_err(|error| malformed(format!("cannot read a symbol name: {error}")))?;
        let (Some(text), Some(info)) = (texts.get(name), infos.get(name)) else {
            continue;
        };
        let Some(reports) = externs(info, &symbol_name) else {
            continue;
        };
        if let Some(stub) = read_body(sm, text, reports) {
            stubs.push(StubEntry {
                symbol: String::from_utf8_lossy(name).into_owned(),
                ..stub
            });
        }
    }
    stubs.sort_by(|a, b| a.symbol.cmp(&b.symbol));
    Ok(stubs)
}

/// The external functions an entry's `.nv.info` says it calls, sorted, when every one is a
/// reporting function; `None` when it calls anything else (or the record cannot be read).
fn externs<'data>(
    info: &[u8],
    symbol_name: &impl Fn(usize) -> Option<&'data [u8]>,
) -> Option<Vec<String>> {
    let records = attributes(info).ok()?;
    let mut names = Vec::new();
    for record in records
        .iter()
        .filter(|record| record.attribute == EIATTR_EXTERNS)
    {
        if !record.value.len().is_multiple_of(4) {
            return None;
        }
        for index in record.value.chunks_exact(4) {
            let index = u32::from_le_bytes(index.try_into().expect("chunks of 4"));
            let name = symbol_name(usize::try_from(index).ok()?)?;
            let name = std::str::from_utf8(name).ok()?;
            if !REPORT_FUNCTIONS.contains(&name) {
                return None;
            }
            names.push(name.to_owned());
        }
    }
    names.sort();
    names.dedup();
    Some(names)
}

/// The stub a body is (its symbol left empty), or `None` when it does real work.
fn read_body(sm: u32, text: &[u8], reports: Vec<String>) -> Option<StubEntry> {
    const INSTRUCTION: usize = 16;
    if text.is_empty() || !text.len().is_multiple_of(INSTRUCTION) {
        return None;
    }
    let mut instructions = 0;
    let mut traps = false;
    let mut calls = false;
    for instruction in text.chunks_exact(INSTRUCTION) {
        let word = u64::from_le_bytes(instruction[..8].try_into().expect("16-byte chunks"));
        let opcode = (word & 0x1ff) as u16;
        match role(sm, opcode)? {
            Role::Padding => continue,
            Role::Bookkeeping => {}
            Role::Call => calls = true,
            Role::Trap => traps = true,
        }
        instructions += 1;
    }
    // A call needs a named target: a `CALL.ABS` with no extern reaches something unknown.
    if calls && reports.is_empty() {
        return None;
    }
    let reports = if calls { reports } else { Vec::new() };
    (traps || !reports.is_empty()).then_some(StubEntry {
        symbol: String::new(),
        instructions,
        traps,
        reports,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/stub");

    /// Each fixture cubin of `stubs.cu` (see its README) and the target it was built for.
    const CUBINS: [(&str, u32); 6] = [
        ("nvcc130_sm_90a.cubin", 90),
        ("nvcc130_sm_100a.cubin", 100),
        ("nvrtc129_sm_90a.cubin", 90),
        ("nvrtc129_sm_100a.cubin", 100),
        ("ptxas129_sm_90a.cubin", 90),
        ("ptxas129_sm_100a.cubin", 100),
    ];

    /// The stubs of `stubs.cu` on sm_90a: (symbol, traps, reporting functions).
    const STUBS_ON_90: [(&str, bool, &[&str]); 6] = [
        ("only100_assert", false, &["__assertfail"]),
        ("only100_deepgemm", true, &["vprintf"]),
        ("only100_invalid_path", true, &["__assertfail", "vprintf"]),
        ("only100_printf", false, &["vprintf"]),
        ("only100_printf_trap", true, &["vprintf"]),
        ("only100_trap", true, &[]),
    ];

    /// The stubs on sm_100a.
    const STUBS_ON_100: [(&str, bool, &[&str]); 2] = [
        ("only90_deepgemm", true, &["vprintf"]),
        ("only90_trap", true, &[]),
    ];

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!("{FIXTURES}/{name}");
        std::fs::read(&path).unwrap_or_else(|error| panic!("cannot read {path}: {error}"))
    }

    fn found(cubin: &[u8]) -> Vec<(String, bool, Vec<String>)> {
        stub_entries(cubin)
            .unwrap()
            .into_iter()
            .map(|stub| (stub.symbol, stub.traps, stub.reports))
            .collect()
    }

    fn expected(stubs: &[(&str, bool, &[&str])]) -> Vec<(String, bool, Vec<String>)> {
        stubs
            .iter()
            .map(|(symbol, traps, reports)| {
                (
                    (*symbol).to_owned(),
                    *traps,
                    reports.iter().map(|r| (*r).to_owned()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn every_compiler_gives_the_same_stubs_and_only_the_stubs() {
        for (file, sm) in CUBINS {
            let cubin = fixture(file);
            let stubs: &[_] = if sm == 90 {
                &STUBS_ON_90
            } else {
                &STUBS_ON_100
            };
            assert_eq!(found(&cubin), expected(stubs), "{file}");
        }
    }

    #[test]
    fn real_kernels_with_assert_and_trap_paths_are_not_stubs() {
        for (file, _) in CUBINS {
            let cubin = fixture(file);
            let info = inspect_cubin(&cubin).unwrap();
            let stubs: Vec<String> = stub_entries(&cubin)
                .unwrap()
                .into_iter()
                .map(|stub| stub.symbol)
                .collect();
            for real in ["checked", "print_value", "empty_kernel"] {
                assert!(info.function(real).is_some(), "{file} lacks {real}");
                assert!(!stubs.contains(&real.to_owned()), "{file}: {real} is real");
            }
        }
    }

    #[test]
    fn the_earlier_fixtures_have_no_stub() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/cubin");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(
                stub_entries(&bytes).unwrap(),
                Vec::new(),
                "{}",
                path.display()
            );
        }
    }

    #[test]
    fn a_stub_is_a_handful_of_instructions() {
        for (file, _) in CUBINS {
            for stub in stub_entries(&fixture(file)).unwrap() {
                assert!(
                    (1..=64).contains(&stub.instructions),
                    "{file}: {} has {} instructions",
                    stub.symbol,
                    stub.instructions
                );
            }
        }
    }

    #[test]
    fn describe_says_what_the_body_does() {
        let stub = |instructions, traps, reports: &[&str]| StubEntry {
            symbol: "k".into(),
            instructions,
            traps,
            reports: reports.iter().map(|r| (*r).to_owned()).collect(),
        };
        assert_eq!(stub(2, true, &[]).describe(), "2 instructions that trap");
        assert_eq!(
            stub(14, true, &["vprintf"]).describe(),
            "14 instructions that call vprintf, then trap"
        );
        assert_eq!(
            stub(9, false, &["__assertfail", "vprintf"]).describe(),
            "9 instructions that call __assertfail and vprintf"
        );
        assert_eq!(
            stub(15, false, &["vprintf"]).describe(),
            "15 instructions that call vprintf, then return"
        );
        assert!(stub(9, false, &["__assertfail"]).aborts());
        assert!(!stub(15, false, &["vprintf"]).aborts());
    }

    /// Rewrites the first instruction of `.text.<symbol>` to `opcode` (low 9 bits).
    fn with_first_opcode(cubin: &[u8], symbol: &str, opcode: u16) -> Vec<u8> {
        let header = FileHeader64::<LittleEndian>::parse(cubin).unwrap();
        let sections = header.sections(LittleEndian, cubin).unwrap();
        let name = format!(".text.{symbol}");
        let (_, section) = sections
            .section_by_name(LittleEndian, name.as_bytes())
            .unwrap();
        let offset = section.sh_offset(LittleEndian) as usize;
        let mut bytes = cubin.to_vec();
        let word = u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap());
        let word = (word & !0x1ff) | u64::from(opcode);
        bytes[offset..offset + 8].copy_from_slice(&word.to_le_bytes());
        bytes
    }

    #[test]
    fn one_store_makes_a_stub_real() {
        // STG (0x186) and an unknown operation both turn the trap stub into a real body.
        for (file, sm) in CUBINS {
            let symbol = if sm == 90 {
                "only100_trap"
            } else {
                "only90_trap"
            };
            let cubin = fixture(file);
            for opcode in [0x186, 0x1ff] {
                let edited = with_first_opcode(&cubin, symbol, opcode);
                let stubs = stub_entries(&edited).unwrap();
                assert!(
                    stubs.iter().all(|stub| stub.symbol != symbol),
                    "{file}: {symbol} with operation {opcode:#x}"
                );
            }
        }
    }

    #[test]
    fn ptx_and_unread_families_have_no_stubs() {
        let ptx = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/cubin/nvcc130_compute_90.ptx"
        ))
        .unwrap();
        assert!(stub_entries(&ptx).unwrap().is_empty());
        assert!(!reads_sm(70) && !reads_sm(95) && !reads_sm(130));
    }

    #[test]
    fn unaligned_bytes_read_the_same() {
        let cubin = fixture("nvcc130_sm_90a.cubin");
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&cubin);
        assert_eq!(
            stub_entries(&shifted[1..]).unwrap(),
            stub_entries(&cubin).unwrap()
        );
    }
}
