//! The manylinux audit: every host ELF file in a wheel must run on the oldest system its
//! platform tag promises.
//!
//! For each file that starts with the ELF magic:
//!
//! | file | check |
//! | --- | --- |
//! | cubin (`e_machine` 190) | recognised and skipped: the GPU driver loads it, not the system |
//! | host ELF | 64-bit little-endian, for the tag's architecture (x86-64 or aarch64) |
//! | | every `DT_NEEDED` library in the policy's list (the dynamic loader and libpython always pass) |
//! | | every version it needs (`.gnu.version_r`) of a family the policy pins (`GLIBC`, `GLIBCXX`, `CXXABI`, `GCC`, `LIBATOMIC`, `ZLIB`) in the policy's set |
//! | | no undefined symbol the policy blacklists for a library it links |
//!
//! The rules are those of auditwheel's `manylinux_2_28` policy for x86_64 and aarch64, and the
//! tables are auditwheel's own: its `manylinux-policy.json` of [`AUDITWHEEL_VERSION`], vendored
//! as `audit/manylinux-policy.json` and read with serde. Versions
//! are checked by membership, as auditwheel does, and versions needed from the dynamic loader
//! (`ld-linux-x86-64.so.2`) are not checked. A message names the file, the library and the
//! version: `af3_kernels/_kwheel.abi3.so needs GLIBC_2.34 (from libc.so.6), newer than
//! manylinux_2_28 allows (GLIBC_2.28)`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::LazyLock;

use object::elf::{
    FileHeader64, DT_NEEDED, ELFCLASS64, ELFDATA2LSB, ELFDATA2MSB, ELFMAG, EM_AARCH64, EM_X86_64,
    SHT_DYNSYM,
};
use object::read::elf::{Dyn as _, FileHeader as _, Sym as _};
use object::LittleEndian;
use serde::Deserialize;

/// The auditwheel release whose `manylinux-policy.json` the audit's tables come from, the one
/// `ci/setup-tests` installs for the tests that run auditwheel itself.
pub const AUDITWHEEL_VERSION: &str = "6.8.2";

/// auditwheel's `auditwheel/policy/manylinux-policy.json` of [`AUDITWHEEL_VERSION`], cut to
/// what the audit reads: the `manylinux_2_28` policy, and `manylinux_2_31` and `_2_34` for the
/// extension modules a newer host compiler builds ([`module_platform_tag`]), their symbol
/// versions for x86_64 and aarch64 only, every other line as upstream writes it. To move to a newer auditwheel, copy
/// the same lines from its file and change both pins.
const MANYLINUX_POLICY_JSON: &str = include_str!("audit/manylinux-policy.json");

/// A manylinux policy for one architecture.
#[derive(Debug)]
pub struct Policy {
    /// The policy (`manylinux_2_28`).
    pub name: String,
    /// The architecture part of the platform tag (`x86_64`).
    pub architecture: &'static str,
    /// The ELF machine every host ELF must be built for.
    pub machine: u16,
    /// Libraries a host ELF may link (`DT_NEEDED`), besides the dynamic loader and libpython.
    pub libraries: Vec<String>,
    /// For each version family the policy pins, the versions it allows, oldest first.
    pub symbol_versions: BTreeMap<String, Vec<String>>,
    /// Symbols a host ELF must not take from a library, though the library is allowed.
    pub blacklist: BTreeMap<String, Vec<String>>,
}

/// auditwheel's `manylinux_2_28` policy for x86_64.
pub static MANYLINUX_2_28_X86_64: LazyLock<Policy> =
    LazyLock::new(|| vendored_policy("manylinux_2_28", "x86_64", EM_X86_64));

/// auditwheel's `manylinux_2_28` policy for aarch64 (Grace Hopper and Grace Blackwell hosts):
/// the same libraries, the symbol versions aarch64's glibc, libgcc and libstdc++ define.
pub static MANYLINUX_2_28_AARCH64: LazyLock<Policy> =
    LazyLock::new(|| vendored_policy("manylinux_2_28", "aarch64", EM_AARCH64));

/// Every vendored policy for x86_64 and aarch64, oldest first: what a platform tag is audited
/// by, and what an extension module's tag is chosen from.
static VENDORED_POLICIES: LazyLock<Vec<Policy>> = LazyLock::new(|| {
    ["manylinux_2_28", "manylinux_2_31", "manylinux_2_34"]
        .into_iter()
        .flat_map(|name| {
            [("x86_64", EM_X86_64), ("aarch64", EM_AARCH64)]
                .map(|(architecture, machine)| vendored_policy(name, architecture, machine))
        })
        .collect()
});

/// Libraries an extension module links that the process has loaded before it: torch's and
/// CUDA's own (`libc10.so`, `libtorch_cpu.so`, `libcudart.so.13`), external as auditwheel's
/// `--exclude` makes them, never shipped in the wheel.
pub fn is_torch_or_cuda_library(library: &str) -> bool {
    ["libc10", "libtorch", "libcudart.so."]
        .iter()
        .any(|prefix| library.starts_with(prefix))
}

/// The platform tag of an extension module for `cpu` (`x86_64`): the oldest vendored
/// manylinux policy it keeps to, with torch's and CUDA's libraries external; else every
/// violation of the newest policy, each naming `path`.
pub fn module_platform_tag(cpu: &str, path: &str, bytes: &[u8]) -> Result<String, Vec<Violation>> {
    let mut last = Vec::new();
    for policy in VENDORED_POLICIES.iter().filter(|p| p.architecture == cpu) {
        let violations = audit_module(policy, path, bytes);
        if violations.is_empty() {
            return Ok(policy.platform_tag());
        }
        last = violations;
    }
    if last.is_empty() {
        last.push(Violation {
            file: path.to_owned(),
            policy: format!("manylinux ({cpu})"),
            kind: ViolationKind::Malformed {
                message: format!("no manylinux policy for {cpu}"),
            },
        });
    }
    Err(last)
}

/// Audits an extension module against `policy` with torch's and CUDA's libraries external
/// (the module links them by name and finds them in the process: torch loaded them first),
/// and refuses one that calls the Python C API.
pub fn audit_module(policy: &Policy, path: &str, bytes: &[u8]) -> Vec<Violation> {
    audit_host(policy, path, bytes, true)
}

/// A module serves every Python of its wheel's tag (`py3-none`): one that calls the Python C
/// API (pybind11, `Python.h`'s functions) would bind to the Python it was built with.
fn python_api(elf: &HostElf) -> Option<ViolationKind> {
    let mut python = elf.undefined.iter().filter(|symbol| is_python_api(symbol));
    let first = python.next()?;
    Some(ViolationKind::PythonApi {
        symbol: first.clone(),
        more: python.count(),
    })
}

/// A symbol of the Python C API (`PyLong_FromLong`, `_Py_Dealloc`, `PyExc_TypeError`).
fn is_python_api(symbol: &str) -> bool {
    let name = symbol.strip_prefix('_').unwrap_or(symbol);
    name.starts_with("Py") && name[2..].starts_with(|c: char| c.is_ascii_uppercase() || c == '_')
}

fn vendored_policy(name: &str, architecture: &'static str, machine: u16) -> Policy {
    read_policy(MANYLINUX_POLICY_JSON, name, architecture, machine)
        .expect("the vendored manylinux-policy.json holds the policies the audit names")
}

/// One entry of auditwheel's `manylinux-policy.json` (`aliases` and `priority`, which only
/// auditwheel's choice of a tag reads, are left out).
#[derive(Deserialize)]
struct PolicyEntry {
    name: String,
    /// Architecture → version family → allowed versions.
    symbol_versions: BTreeMap<String, BTreeMap<String, Vec<String>>>,
    lib_whitelist: Vec<String>,
    blacklist: BTreeMap<String, Vec<String>>,
}

/// The policy `name` for `architecture` from a file in the format of auditwheel's
/// `manylinux-policy.json` (the vendored cut or auditwheel's whole file).
fn read_policy(
    json: &str,
    name: &str,
    architecture: &'static str,
    machine: u16,
) -> Result<Policy, String> {
    let entries: Vec<PolicyEntry> = serde_json::from_str(json)
        .map_err(|error| format!("not auditwheel's policy format: {error}"))?;
    let mut entry = entries
        .into_iter()
        .find(|entry| entry.name == name)
        .ok_or_else(|| format!("no policy `{name}`"))?;
    let symbol_versions = entry
        .symbol_versions
        .remove(architecture)
        .ok_or_else(|| format!("policy `{name}` has no symbol versions for {architecture}"))?;
    Ok(Policy {
        name: entry.name,
        architecture,
        machine,
        libraries: entry.lib_whitelist,
        symbol_versions,
        blacklist: entry.blacklist,
    })
}

impl Policy {
    /// The platform tag the policy stands for (`manylinux_2_28_x86_64`).
    pub fn platform_tag(&self) -> String {
        format!("{}_{}", self.name, self.architecture)
    }

    /// Whether a host ELF may link `library`.
    pub fn allows_library(&self, library: &str) -> bool {
        is_dynamic_loader(library)
            || is_libpython(library)
            || self.libraries.iter().any(|allowed| allowed == library)
    }

    /// The versions of `family` the policy allows, or `None` when it does not pin the family.
    pub fn versions_of(&self, family: &str) -> Option<&[String]> {
        self.symbol_versions.get(family).map(Vec::as_slice)
    }

    /// The newest numeric version of `family` the policy allows (`2.28` for `GLIBC`).
    pub fn newest(&self, family: &str) -> Option<&str> {
        self.versions_of(family)?
            .iter()
            .filter_map(|version| numeric(version).map(|parts| (parts, version.as_str())))
            .max()
            .map(|(_, version)| version)
    }
}

/// How the files of a wheel are audited, by its platform tag.
#[derive(Clone, Copy, Debug)]
pub enum AuditTarget {
    /// A manylinux tag: host ELFs must keep to the policy.
    Policy(&'static Policy),
    /// `any`: the wheel claims to hold no host code, so a host ELF is a violation.
    PlatformIndependent,
    /// `linux_*`: no promise about the system, nothing to check.
    Unrestricted,
}

impl AuditTarget {
    /// The audit of a platform tag, or `None` for a tag whose policy this audit lacks.
    pub fn for_platform(tag: &str) -> Option<AuditTarget> {
        if tag == "any" {
            Some(AuditTarget::PlatformIndependent)
        } else if tag == MANYLINUX_2_28_X86_64.platform_tag() {
            Some(AuditTarget::Policy(&MANYLINUX_2_28_X86_64))
        } else if tag == MANYLINUX_2_28_AARCH64.platform_tag() {
            Some(AuditTarget::Policy(&MANYLINUX_2_28_AARCH64))
        } else if let Some(policy) = VENDORED_POLICIES.iter().find(|p| p.platform_tag() == tag) {
            Some(AuditTarget::Policy(policy))
        } else if tag.starts_with("linux_") {
            Some(AuditTarget::Unrestricted)
        } else {
            None
        }
    }
}

/// What kind of ELF file a wheel entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElfKind {
    /// A CUDA cubin (`e_machine` 190), which the audit skips.
    Cubin,
    /// A shared library, executable or object for a CPU.
    Host,
}

/// The audit of one file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileAudit {
    /// `None` when the file is not ELF at all.
    pub kind: Option<ElfKind>,
    /// What breaks the policy.
    pub violations: Vec<Violation>,
}

/// One way a file breaks a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The file, by its path inside the wheel.
    pub file: String,
    /// The policy broken (`manylinux_2_28`), or the platform tag (`any`).
    pub policy: String,
    /// What is wrong.
    pub kind: ViolationKind,
}

/// What a [`Violation`] is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ViolationKind {
    /// A host ELF for another architecture or ELF class than the policy's.
    Machine {
        /// What the file is built for (`machine 183, 64-bit little-endian`).
        found: String,
        /// What the policy needs (`x86_64`).
        expected: String,
    },
    /// A linked library the policy does not allow.
    Library {
        /// The `DT_NEEDED` name.
        library: String,
    },
    /// A symbol version the policy does not allow.
    SymbolVersion {
        /// The version needed (`GLIBC_2.34`).
        version: String,
        /// The library it is needed from.
        library: String,
        /// The newest version of its family the policy allows (`GLIBC_2.28`), when the needed
        /// one is newer than that.
        newest: Option<String>,
    },
    /// A symbol the policy blacklists for a library.
    Symbol {
        /// The symbol.
        symbol: String,
        /// The library.
        library: String,
    },
    /// An extension module that calls the Python C API.
    PythonApi {
        /// The first such symbol (`PyLong_FromLong`).
        symbol: String,
        /// How many more there are.
        more: usize,
    },
    /// Host code in a wheel tagged platform-independent.
    HostCode,
    /// An ELF file whose headers cannot be read.
    Malformed {
        /// What could not be read.
        message: String,
    },
}

impl Violation {
    /// The message without the file name.
    pub fn message(&self) -> String {
        let policy = &self.policy;
        match &self.kind {
            ViolationKind::Machine { found, expected } => {
                format!("is an ELF file for {found}, not {expected} as {policy} needs")
            }
            ViolationKind::Library { library } => {
                format!("links `{library}`, which {policy} does not allow (bundle it or link it statically)")
            }
            ViolationKind::SymbolVersion {
                version,
                library,
                newest: Some(newest),
            } => format!("needs {version} (from {library}), newer than {policy} allows ({newest})"),
            ViolationKind::SymbolVersion {
                version,
                library,
                newest: None,
            } => format!("needs {version} (from {library}), which {policy} does not allow"),
            ViolationKind::Symbol { symbol, library } => {
                format!("uses `{symbol}` of {library}, which {policy} does not allow")
            }
            ViolationKind::PythonApi { symbol, more } => {
                let more = match more {
                    0 => String::new(),
                    n => format!(" and {n} more"),
                };
                format!(
                    "calls the Python C API (`{symbol}`{more}), which binds it to the Python it \
                     was built with: an extension module registers its ops with \
                     `TORCH_LIBRARY` or `STABLE_TORCH_LIBRARY` and must not call pybind11 or \
                     `Python.h`'s functions"
                )
            }
            ViolationKind::HostCode => {
                format!("is host code, but the wheel is tagged `{policy}` (platform-independent)")
            }
            ViolationKind::Malformed { message } => format!("is a malformed ELF file: {message}"),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.file, self.message())
    }
}

/// Audits one file of a wheel (`path` is its path inside the wheel) for `target`.
pub fn audit_file(target: &AuditTarget, path: &str, bytes: &[u8]) -> FileAudit {
    if !bytes.starts_with(&ELFMAG) {
        return FileAudit::default();
    }
    if prebuilt::cubin::is_cubin(bytes) {
        return FileAudit {
            kind: Some(ElfKind::Cubin),
            violations: Vec::new(),
        };
    }
    let violations = match target {
        AuditTarget::Policy(policy) => audit_elf(policy, path, bytes),
        AuditTarget::PlatformIndependent => vec![Violation {
            file: path.to_owned(),
            policy: "any".into(),
            kind: ViolationKind::HostCode,
        }],
        AuditTarget::Unrestricted => Vec::new(),
    };
    FileAudit {
        kind: Some(ElfKind::Host),
        violations,
    }
}

/// Audits a host ELF file against `policy`; `path` names it in the violations. A cubin passes.
pub fn audit_elf(policy: &Policy, path: &str, bytes: &[u8]) -> Vec<Violation> {
    audit_host(policy, path, bytes, false)
}

/// [`audit_elf`], and for an extension `module` ([`audit_module`]) the module's rules on the
/// same read of its headers: torch's and CUDA's libraries allowed, the Python C API not.
fn audit_host(policy: &Policy, path: &str, bytes: &[u8], module: bool) -> Vec<Violation> {
    if prebuilt::cubin::is_cubin(bytes) {
        return Vec::new();
    }
    let violation = |kind| Violation {
        file: path.to_owned(),
        policy: policy.name.clone(),
        kind,
    };
    let (class, data) = (bytes.get(4).copied(), bytes.get(5).copied());
    let machine = bytes.get(18..20).map(|m| {
        if data == Some(ELFDATA2MSB) {
            u16::from_be_bytes([m[0], m[1]])
        } else {
            u16::from_le_bytes([m[0], m[1]])
        }
    });
    if class != Some(ELFCLASS64) || data != Some(ELFDATA2LSB) || machine != Some(policy.machine) {
        let found = format!(
            "machine {}, {}-bit {}-endian",
            machine.map_or("?".into(), |m| m.to_string()),
            if class == Some(ELFCLASS64) { 64 } else { 32 },
            if data == Some(ELFDATA2MSB) {
                "big"
            } else {
                "little"
            }
        );
        return vec![violation(ViolationKind::Machine {
            found,
            expected: policy.architecture.to_owned(),
        })];
    }
    match inspect_host_elf(bytes) {
        Ok(elf) => {
            let mut found = check_host_elf(policy, &elf);
            if module {
                found.retain(|kind| {
                    !matches!(kind, ViolationKind::Library { library }
                        if is_torch_or_cuda_library(library))
                });
                found.extend(python_api(&elf));
            }
            found.into_iter().map(violation).collect()
        }
        Err(error) => vec![violation(ViolationKind::Malformed {
            message: error.to_string(),
        })],
    }
}

/// What the audit reads from a host ELF file.
struct HostElf {
    /// `DT_NEEDED` libraries, in order.
    needed: Vec<String>,
    /// (library, version) pairs of `.gnu.version_r`, the dynamic loader's left out.
    versions: Vec<(String, String)>,
    /// Undefined dynamic symbols.
    undefined: Vec<String>,
}

fn inspect_host_elf(bytes: &[u8]) -> object::read::Result<HostElf> {
    let endian = LittleEndian;
    let header = FileHeader64::<LittleEndian>::parse(bytes)?;
    let sections = header.sections(endian, bytes)?;
    let text = |name: &[u8]| String::from_utf8_lossy(name).into_owned();

    let mut needed = Vec::new();
    if let Some((entries, link)) = sections.dynamic(endian, bytes)? {
        let strings = sections.strings(endian, bytes, link)?;
        for entry in entries {
            if entry.tag32(endian) == Some(DT_NEEDED) {
                needed.push(text(entry.string(endian, strings)?));
            }
        }
    }

    let mut versions = Vec::new();
    if let Some((mut needs, link)) = sections.gnu_verneed(endian, bytes)? {
        let strings = sections.strings(endian, bytes, link)?;
        while let Some((need, mut auxiliaries)) = needs.next()? {
            let library = text(need.file(endian, strings)?);
            if is_dynamic_loader(&library) {
                continue;
            }
            while let Some(auxiliary) = auxiliaries.next()? {
                versions.push((library.clone(), text(auxiliary.name(endian, strings)?)));
            }
        }
    }

    let symbols = sections.symbols(endian, bytes, SHT_DYNSYM)?;
    let undefined = symbols
        .iter()
        .skip(1)
        .filter(|symbol| symbol.is_undefined(endian))
        .filter_map(|symbol| symbol.name(endian, symbols.strings()).ok())
        .map(text)
        .collect();
    Ok(HostElf {
        needed,
        versions,
        undefined,
    })
}

fn check_host_elf(policy: &Policy, elf: &HostElf) -> Vec<ViolationKind> {
    let mut found = Vec::new();
    for library in &elf.needed {
        if !policy.allows_library(library) {
            found.push(ViolationKind::Library {
                library: library.clone(),
            });
        }
    }
    let mut versions = elf.versions.clone();
    versions.sort();
    versions.dedup();
    for (library, version) in versions {
        // `GLIBCXX_3.4.30` → family `GLIBCXX`; `GLIBC_PRIVATE` → family `GLIBC`.
        let Some((family, number)) = version.split_once('_') else {
            continue;
        };
        let Some(allowed) = policy.versions_of(family) else {
            continue;
        };
        if allowed.iter().any(|allowed| allowed == number) {
            continue;
        }
        let newest = policy.newest(family).filter(|newest| {
            matches!((numeric(number), numeric(newest)), (Some(needed), Some(newest)) if needed > newest)
        });
        found.push(ViolationKind::SymbolVersion {
            newest: newest.map(|newest| format!("{family}_{newest}")),
            version,
            library,
        });
    }
    for (library, symbols) in &policy.blacklist {
        if !elf.needed.iter().any(|needed| needed == library) {
            continue;
        }
        for symbol in &elf.undefined {
            if symbols.contains(symbol) {
                found.push(ViolationKind::Symbol {
                    symbol: symbol.clone(),
                    library: library.clone(),
                });
            }
        }
    }
    found
}

/// `2.28` → `[2, 28]`; `None` for versions that are not dotted numbers (`PRIVATE`).
fn numeric(version: &str) -> Option<Vec<u32>> {
    version.split('.').map(|part| part.parse().ok()).collect()
}

fn is_dynamic_loader(library: &str) -> bool {
    library.starts_with("ld-linux") || library == "ld64.so.2" || library == "ld64.so.1"
}

/// `libpython3.12.so.1.0`: the interpreter that loads the module provides it.
fn is_libpython(library: &str) -> bool {
    let Some(rest) = library.strip_prefix("libpython") else {
        return false;
    };
    let Some((version, _)) = rest.split_once(".so") else {
        return false;
    };
    let version = version.trim_end_matches('m');
    let mut parts = version.split('.');
    matches!(
        (parts.next(), parts.next(), parts.next()),
        (Some(major), Some(minor), None)
            if !major.is_empty() && !minor.is_empty()
                && major.chars().chain(minor.chars()).all(|c| c.is_ascii_digit())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elf(needed: &[&str], versions: &[(&str, &str)], undefined: &[&str]) -> HostElf {
        HostElf {
            needed: needed.iter().map(|s| (*s).to_owned()).collect(),
            versions: versions
                .iter()
                .map(|(l, v)| ((*l).to_owned(), (*v).to_owned()))
                .collect(),
            undefined: undefined.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn messages(found: Vec<ViolationKind>) -> Vec<String> {
        found
            .into_iter()
            .map(|kind| {
                Violation {
                    file: "m.so".into(),
                    policy: "manylinux_2_28".into(),
                    kind,
                }
                .to_string()
            })
            .collect()
    }

    #[test]
    fn python_c_api_symbols_are_told_from_others() {
        for symbol in [
            "PyLong_FromLong",
            "_Py_Dealloc",
            "PyExc_TypeError",
            "_PyObject_New",
        ] {
            assert!(is_python_api(symbol), "{symbol}");
        }
        for symbol in [
            "Python",
            "Pyramid_init",
            "_ZN3c106detail",
            "py_helper",
            "Py",
        ] {
            assert!(!is_python_api(symbol), "{symbol}");
        }
    }

    #[test]
    fn newest_versions_are_the_policys() {
        let policy = &MANYLINUX_2_28_X86_64;
        assert_eq!(policy.newest("GLIBC"), Some("2.28"));
        assert_eq!(policy.newest("GLIBCXX"), Some("3.4.24"));
        assert_eq!(policy.newest("CXXABI"), Some("1.3.11"));
        assert_eq!(policy.newest("GCC"), Some("7.0.0"));
        assert_eq!(policy.platform_tag(), "manylinux_2_28_x86_64");
    }

    #[test]
    fn versions_are_checked_by_family_and_membership() {
        let found = check_host_elf(
            &MANYLINUX_2_28_X86_64,
            &elf(
                &["libc.so.6", "libstdc++.so.6", "ld-linux-x86-64.so.2"],
                &[
                    ("libc.so.6", "GLIBC_2.2.5"),
                    ("libc.so.6", "GLIBC_2.34"),
                    ("libc.so.6", "GLIBC_PRIVATE"),
                    ("libstdc++.so.6", "GLIBCXX_3.4.30"),
                    ("libstdc++.so.6", "CXXABI_1.3.13"),
                    ("libstdc++.so.6", "CXXABI_TM_1"),
                    ("libfoo.so", "FOO_9"),
                ],
                &[],
            ),
        );
        assert_eq!(
            messages(found),
            [
                "m.so needs GLIBC_2.34 (from libc.so.6), newer than manylinux_2_28 allows (GLIBC_2.28)",
                "m.so needs GLIBC_PRIVATE (from libc.so.6), which manylinux_2_28 does not allow",
                "m.so needs CXXABI_1.3.13 (from libstdc++.so.6), newer than manylinux_2_28 allows (CXXABI_1.3.11)",
                "m.so needs GLIBCXX_3.4.30 (from libstdc++.so.6), newer than manylinux_2_28 allows (GLIBCXX_3.4.24)",
            ]
        );
    }

    #[test]
    fn libraries_outside_the_policy_are_named() {
        let found = check_host_elf(
            &MANYLINUX_2_28_X86_64,
            &elf(
                &[
                    "libc.so.6",
                    "libpython3.12.so.1.0",
                    "libcuda.so.1",
                    "libz.so.1",
                ],
                &[],
                &["deflate", "zcalloc"],
            ),
        );
        assert_eq!(
            messages(found),
            [
                "m.so links `libcuda.so.1`, which manylinux_2_28 does not allow (bundle it or link it statically)",
                "m.so uses `zcalloc` of libz.so.1, which manylinux_2_28 does not allow",
            ]
        );
    }

    #[test]
    fn aarch64_has_its_own_symbol_versions() {
        let policy = &MANYLINUX_2_28_AARCH64;
        assert_eq!(policy.platform_tag(), "manylinux_2_28_aarch64");
        assert_eq!(policy.machine, EM_AARCH64);
        assert_eq!(policy.newest("GLIBC"), Some("2.28"));
        // aarch64's glibc starts at 2.17 (plus the 2.0 base); x86_64's at 2.2.5.
        assert!(policy
            .versions_of("GLIBC")
            .unwrap()
            .iter()
            .any(|v| v == "2.17"));
        assert!(!policy
            .versions_of("GLIBC")
            .unwrap()
            .iter()
            .any(|v| v == "2.2.5"));
        assert!(!policy
            .versions_of("CXXABI")
            .unwrap()
            .iter()
            .any(|v| v == "FLOAT128"));
        assert_eq!(policy.libraries, MANYLINUX_2_28_X86_64.libraries);
        assert!(policy.allows_library("libstdc++.so.6"));
        assert!(!policy.allows_library("libcuda.so.1"));
    }

    /// The vendored file is pinned to the auditwheel that the tests install.
    #[test]
    fn vendored_policy_is_pinned_to_the_tests_auditwheel() {
        let setup = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/setup-tests");
        let script = std::fs::read_to_string(&setup).unwrap();
        let pin = format!("auditwheel_want=\"auditwheel=={AUDITWHEEL_VERSION}\"");
        assert!(
            script.lines().any(|line| line.trim() == pin),
            "{} does not install auditwheel {AUDITWHEEL_VERSION}, whose policy the audit vendors",
            setup.display()
        );
    }

    /// The vendored cut reads as the same policies as auditwheel's whole file, where
    /// `ci/setup-tests` installed it.
    #[test]
    fn vendored_policy_matches_the_installed_auditwheel() {
        let dir = std::env::var_os("KWHEEL_AUDITWHEEL")
            .map(std::path::PathBuf::from)
            .or_else(|| {
                let cache = prebuilt::cache::cache_home().ok()?;
                Some(cache.join("kwheel/auditwheel"))
            })
            .filter(|dir| dir.join("auditwheel").is_dir());
        let Some(dir) = dir else {
            eprintln!("skipped: no auditwheel (`bash ci/setup` installs it)");
            return;
        };
        assert!(
            dir.join(format!("auditwheel-{AUDITWHEEL_VERSION}.dist-info"))
                .is_dir(),
            "{} holds another auditwheel than {AUDITWHEEL_VERSION}",
            dir.display()
        );
        let upstream =
            std::fs::read_to_string(dir.join("auditwheel/policy/manylinux-policy.json")).unwrap();
        for vendored in [&*MANYLINUX_2_28_X86_64, &*MANYLINUX_2_28_AARCH64] {
            let theirs = read_policy(
                &upstream,
                &vendored.name,
                vendored.architecture,
                vendored.machine,
            )
            .unwrap();
            assert_eq!(theirs.libraries, vendored.libraries);
            assert_eq!(theirs.symbol_versions, vendored.symbol_versions);
            assert_eq!(theirs.blacklist, vendored.blacklist);
        }
    }

    #[test]
    fn a_policy_the_file_lacks_is_named() {
        let error =
            read_policy(MANYLINUX_POLICY_JSON, "manylinux_2_28", "ppc64le", 21).unwrap_err();
        assert_eq!(
            error,
            "policy `manylinux_2_28` has no symbol versions for ppc64le"
        );
        let error =
            read_policy(MANYLINUX_POLICY_JSON, "manylinux_2_35", "x86_64", EM_X86_64).unwrap_err();
        assert_eq!(error, "no policy `manylinux_2_35`");
    }

    #[test]
    fn libpython_names_are_recognised() {
        assert!(is_libpython("libpython3.12.so.1.0"));
        assert!(is_libpython("libpython3.7m.so.1.0"));
        assert!(!is_libpython("libpythonic.so"));
    }
}
