//! Whether an artifact is the one its key names: what a build takes from somewhere it does not
//! control (a remote build cache, a shard directory) must be for the key's kernel, target and
//! toolkit, not merely a valid cubin with the right digest.
//!
//! | the key's record | the artifact must say | where it says it |
//! | --- | --- | --- |
//! | entry symbols | the same symbols, as kernel entries | the symbol table (`STO_CUDA_ENTRY`) |
//! | parameter sizes, where recorded | the same sizes, in order | `.nv.info.<symbol>` |
//! | arch (`sm_90a`, `sm_100f`, `compute_90`) | that SM and that kind | `e_flags`, `.nv.compat`, the tkinfo `-arch` ([`validate_cubin`]) |
//! | CUDA build (`cu130`) | toolkit release 13.0 | `.note.nv.tkinfo` (`Cuda compilation tools, release 13.0, V13.0.88`), else `e_version` (129 for 12.9, ABI 7) |
//! | compiler version (`nvcc 13.0.88`, `nvrtc 12.9.86`, `nvcc+ptxas 13.0.88 + ptxas 12.9.86`) | the same assembler version (`V13.0.88`; `V12.9.86` for the ptxas route) | `.note.nv.tkinfo` |
//!
//! PTX (a `compute_XY` target) carries the front end's version in its header comment (`//
//! Cuda compilation tools, release 13.0, V13.0.88`), checked against the record's first
//! version when it is there. A precompiled cubin (record `cubin`) was taken as the user gave
//! it: only its entries and target are checked, since any older toolkit's cubin loads.
//!
//! This catches a cache that answers with another toolkit's cubin, another target's, or
//! another kernel's; it cannot catch an impostor with the same names, target and toolkit but
//! other code. `kwheel release check --rebuild-sample` does, by recompiling and comparing bytes.

use object::read::elf::{FileHeader, SectionHeader};
use object::LittleEndian;

use super::{
    elf_header, elf_sections, inspect_artifact, validate_cubin, with_aligned, CubinError, CubinInfo,
};
use crate::index::{CompilerRecord, Function};
use crate::{Arch, ArchKind, CudaBuild};

/// What a key says its artifact is.
#[derive(Clone, Copy, Debug)]
pub struct ExpectedCubin<'a> {
    /// The target.
    pub arch: Arch,
    /// The CUDA build whose toolkit built it.
    pub cuda: CudaBuild,
    /// The compiler and its exact version, as the index records it.
    pub compiler: &'a CompilerRecord,
    /// The entries it must have, by symbol; their parameter sizes are compared too.
    pub functions: &'a [Function],
}

/// Which toolkit wrote an artifact, as the artifact says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Toolkit {
    /// The release, `13.0`.
    pub release: CudaBuild,
    /// The exact version, `13.0.88`, when the artifact records one.
    pub version: Option<String>,
    /// Where it was read: `.note.nv.tkinfo "Cuda compilation tools, release 13.0, V13.0.88"`.
    pub evidence: String,
}

/// An artifact that is not the one its key names.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// Not a valid artifact for the key's target, or without one of its entries.
    #[error(transparent)]
    Invalid(#[from] CubinError),
    /// An entry whose parameters differ from the key's record.
    #[error(
        "entry `{symbol}` takes parameters of {found:?} bytes, but the key's record says \
         {expected:?}: it is another kernel's cubin"
    )]
    ParameterSizes {
        /// The entry.
        symbol: String,
        /// The sizes recorded.
        expected: Vec<u32>,
        /// The sizes in the artifact.
        found: Vec<u32>,
    },
    /// Built by another toolkit release than the key's CUDA build.
    #[error(
        "it was built by CUDA {} ({evidence}), but its key is for {expected} ({compiler})",
        .found.version()
    )]
    Toolkit {
        /// The key's CUDA build.
        expected: CudaBuild,
        /// The release the artifact names.
        found: CudaBuild,
        /// Where the artifact names it.
        evidence: String,
        /// The key's compiler record.
        compiler: CompilerRecord,
    },
    /// Assembled by another version than the key's compiler record.
    #[error(
        "it was built by toolkit version {found} ({evidence}), but its key records {compiler}, \
         which writes {expected}"
    )]
    Version {
        /// The version the record implies.
        expected: String,
        /// The version the artifact names.
        found: String,
        /// Where the artifact names it.
        evidence: String,
        /// The key's compiler record.
        compiler: CompilerRecord,
    },
    /// A compiled artifact that names no toolkit at all, which no compiler of kwheel's writes.
    #[error(
        "it does not say which toolkit built it (no `.note.nv.tkinfo`, ELF e_version \
         {e_version}), but its key records {compiler} for {cuda}"
    )]
    NoToolkit {
        /// The ELF `e_version`.
        e_version: u32,
        /// The key's compiler record.
        compiler: CompilerRecord,
        /// The key's CUDA build.
        cuda: CudaBuild,
    },
}

/// Checks that `bytes` is the artifact `expected` describes (see the module docs) and returns
/// what it holds.
pub fn check_identity(
    bytes: &[u8],
    expected: &ExpectedCubin<'_>,
) -> Result<CubinInfo, IdentityError> {
    let symbols: Vec<&str> = expected
        .functions
        .iter()
        .map(|function| function.symbol.as_str())
        .collect();
    let info = validate_cubin(bytes, expected.arch, &symbols)?;
    for function in expected.functions {
        let found = info
            .function(&function.symbol)
            .map(|found| found.param_sizes.clone())
            .unwrap_or_default();
        if found != function.param_sizes {
            return Err(IdentityError::ParameterSizes {
                symbol: function.symbol.clone(),
                expected: function.param_sizes.clone(),
                found,
            });
        }
    }
    let compiler = expected.compiler;
    if compiler.compiler_kind() == Some(crate::index::CompilerKind::Precompiled)
        || compiler.version.is_empty()
    {
        return Ok(info);
    }
    let toolkit = match artifact_toolkit(bytes)? {
        Ok(toolkit) => toolkit,
        Err(e_version) => {
            return Err(IdentityError::NoToolkit {
                e_version,
                compiler: compiler.clone(),
                cuda: expected.cuda,
            })
        }
    };
    let (front_end, assembler) = record_versions(&compiler.version);
    let is_ptx = expected.arch.kind == ArchKind::Ptx;
    // PTX is the front end's text: under the ptxas route that is the newer toolkit's.
    let writer = if is_ptx { front_end } else { assembler };
    let expected_release = match (is_ptx, CudaBuild::from_version(writer)) {
        (true, Ok(release)) => release,
        _ => expected.cuda,
    };
    if toolkit.release != expected_release {
        return Err(IdentityError::Toolkit {
            expected: expected.cuda,
            found: toolkit.release,
            evidence: toolkit.evidence,
            compiler: compiler.clone(),
        });
    }
    if let Some(found) = &toolkit.version {
        if is_exact_version(writer) && found != writer {
            return Err(IdentityError::Version {
                expected: writer.to_owned(),
                found: found.clone(),
                evidence: toolkit.evidence,
                compiler: compiler.clone(),
            });
        }
    }
    Ok(info)
}

/// The toolkit an artifact names: a cubin's `.note.nv.tkinfo`, else its ELF `e_version` where
/// that is a release (ABI 7: 129 for 12.9); PTX's header comment. `Err(e_version)` when it
/// names none.
pub fn artifact_toolkit(bytes: &[u8]) -> Result<Result<Toolkit, u32>, CubinError> {
    let info = inspect_artifact(bytes)?.info;
    if info.kind == Some(ArchKind::Ptx) {
        let text = String::from_utf8_lossy(bytes);
        let header = text
            .lines()
            .take_while(|line| line.trim_start().starts_with("//") || line.trim().is_empty());
        return Ok(header
            .filter_map(|line| tools_line(line.trim_start_matches('/').trim()))
            .next()
            .map(|(release, version, line)| Toolkit {
                release,
                version,
                evidence: format!("PTX header `{line}`"),
            })
            .ok_or(0));
    }
    cubin_toolkit(bytes)
}

fn cubin_toolkit(bytes: &[u8]) -> Result<Result<Toolkit, u32>, CubinError> {
    with_aligned(bytes, aligned_cubin_toolkit)
}

fn aligned_cubin_toolkit(bytes: &[u8]) -> Result<Result<Toolkit, u32>, CubinError> {
    let malformed = |what: String| CubinError::Malformed { what };
    let endian = LittleEndian;
    let header = elf_header(bytes)?;
    let sections = elf_sections(header, bytes)?;
    if let Some((_, section)) = sections.section_by_name(endian, b".note.nv.tkinfo") {
        let note = section
            .data(endian, bytes)
            .map_err(|error| malformed(format!("cannot read `.note.nv.tkinfo`: {error}")))?;
        let found = note
            .split(|&byte| byte == 0)
            .filter_map(|text| std::str::from_utf8(text).ok())
            .find_map(tools_line);
        if let Some((release, version, line)) = found {
            return Ok(Ok(Toolkit {
                release,
                version,
                evidence: format!(".note.nv.tkinfo `{line}`"),
            }));
        }
    }
    let e_version = header.e_version(endian);
    // ABI 7 cubins record the toolkit as major × 10 + minor; ABI 8 ones write 1 there.
    if header.e_ident().abi_version == 7 && (100..1000).contains(&e_version) {
        return Ok(Ok(Toolkit {
            release: CudaBuild {
                major: e_version / 10,
                minor: e_version % 10,
            },
            version: None,
            evidence: format!("ELF e_version {e_version}"),
        }));
    }
    Ok(Err(e_version))
}

/// `(release, exact version, the line)` of `Cuda compilation tools, release 13.0, V13.0.88`.
fn tools_line(line: &str) -> Option<(CudaBuild, Option<String>, String)> {
    let rest = line.strip_prefix("Cuda compilation tools, release ")?;
    let mut parts = rest.split(',').map(str::trim);
    let release = CudaBuild::from_version(parts.next()?).ok()?;
    let version = parts
        .find_map(|part| part.strip_prefix('V'))
        .filter(|version| is_exact_version(version))
        .map(str::to_owned);
    Some((release, version, line.to_owned()))
}

/// The front end's and the assembler's version in a record's version text: `13.0.88, host
/// gcc 12.2.0` → both `13.0.88`; `13.0.88 + ptxas 12.9.86, host …` → `13.0.88`, `12.9.86`.
fn record_versions(version: &str) -> (&str, &str) {
    fn first_word(text: &str) -> &str {
        text.split([',', ' '])
            .find(|word| !word.is_empty())
            .unwrap_or("")
    }
    let front_end = first_word(version);
    let assembler = version
        .split_once("+ ptxas ")
        .map_or(front_end, |(_, rest)| first_word(rest));
    (front_end, assembler)
}

/// `13.0.88`: three dotted numbers, as toolkits print their exact version.
fn is_exact_version(text: &str) -> bool {
    let parts: Vec<&str> = text.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|part| !part.is_empty() && part.bytes().all(|byte| byte.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/cubin");

    fn fixture(name: &str) -> Vec<u8> {
        std::fs::read(format!("{FIXTURES}/{name}")).unwrap()
    }

    fn record(kind: &str, version: &str) -> CompilerRecord {
        CompilerRecord {
            kind: kind.into(),
            version: version.into(),
        }
    }

    fn functions(bytes: &[u8]) -> Vec<Function> {
        super::super::inspect_cubin(bytes)
            .unwrap()
            .functions
            .into_iter()
            .map(|function| Function {
                computed: Default::default(),
                name: function.symbol.clone(),
                symbol: function.symbol,
                param_sizes: function.param_sizes,
            })
            .collect()
    }

    fn check(file: &str, arch: &str, cuda: &str, compiler: &CompilerRecord) -> Result<(), String> {
        let bytes = fixture(file);
        check_recorded(&bytes, arch, cuda, compiler, &functions(&bytes))
    }

    /// [`check_identity`] of `bytes` against a record of `functions`, its error as text.
    fn check_recorded(
        bytes: &[u8],
        arch: &str,
        cuda: &str,
        compiler: &CompilerRecord,
        functions: &[Function],
    ) -> Result<(), String> {
        check_identity(
            bytes,
            &ExpectedCubin {
                arch: arch.parse().unwrap(),
                cuda: cuda.parse().unwrap(),
                compiler,
                functions,
            },
        )
        .map(|_| ())
        .map_err(|error| error.to_string())
    }

    #[test]
    fn every_fixture_names_its_toolkit() {
        let cases = [
            ("nvrtc129_sm_90a.cubin", "12.9", None, "ELF e_version 129"),
            (
                "nvrtc129_sm_100a.cubin",
                "12.9",
                Some("12.9.86"),
                ".note.nv.tkinfo",
            ),
            (
                "nvcc130_sm_90a.cubin",
                "13.0",
                Some("13.0.88"),
                ".note.nv.tkinfo",
            ),
            (
                "nvcc130_sm_100f.cubin",
                "13.0",
                Some("13.0.88"),
                ".note.nv.tkinfo",
            ),
            ("ptxas129_sm_90.cubin", "12.9", None, "ELF e_version 129"),
            (
                "ptxas129_sm_100f.cubin",
                "12.9",
                Some("12.9.86"),
                ".note.nv.tkinfo",
            ),
            (
                "nvcc130_compute_90.ptx",
                "13.0",
                Some("13.0.88"),
                "PTX header",
            ),
        ];
        for (file, release, version, evidence) in cases {
            let toolkit = artifact_toolkit(&fixture(file)).unwrap().unwrap();
            assert_eq!(toolkit.release.version(), release, "{file}");
            assert_eq!(toolkit.version.as_deref(), version, "{file}");
            assert!(
                toolkit.evidence.starts_with(evidence),
                "{file}: {toolkit:?}"
            );
        }
    }

    #[test]
    fn the_keys_own_cubins_pass() {
        let nvcc = record("nvcc", "13.0.88, host gcc (Debian 12.2.0-14) 12.2.0");
        let nvrtc = record("nvrtc", "12.9.86");
        let route = record("nvcc+ptxas", "13.0.88 + ptxas 12.9.86, host gcc 12.2.0");
        check("nvcc130_sm_90a.cubin", "sm_90a", "cu130", &nvcc).unwrap();
        check("nvcc130_sm_100f.cubin", "sm_100f", "cu130", &nvcc).unwrap();
        check("nvrtc129_sm_90a.cubin", "sm_90a", "cu129", &nvrtc).unwrap();
        check("nvrtc129_sm_100a.cubin", "sm_100a", "cu129", &nvrtc).unwrap();
        check("ptxas129_sm_100f.cubin", "sm_100f", "cu129", &route).unwrap();
        check("nvcc130_compute_90.ptx", "compute_90", "cu130", &nvcc).unwrap();
        check("nvcc130_compute_90.ptx", "compute_90", "cu129", &route).unwrap();
        // A precompiled cubin is taken from any toolkit.
        check(
            "nvrtc129_sm_90a.cubin",
            "sm_90a",
            "cu130",
            &record("cubin", ""),
        )
        .unwrap();
    }

    #[test]
    fn another_toolkits_cubin_is_refused() {
        let nvcc = record("nvcc", "13.0.88, host gcc 12.2.0");
        // The cu129 NVRTC cubin under a cu130 nvcc key: by e_version (ABI 7) and by the note.
        let error = check("nvrtc129_sm_90a.cubin", "sm_90a", "cu130", &nvcc).unwrap_err();
        assert!(
            error.contains("built by CUDA 12.9 (ELF e_version 129)")
                && error.contains("key is for cu130 (nvcc 13.0.88"),
            "{error}"
        );
        let error = check("nvrtc129_sm_100a.cubin", "sm_100a", "cu130", &nvcc).unwrap_err();
        assert!(error.contains("release 12.9, V12.9.86"), "{error}");
        // The other way round, and another patch release of the same toolkit.
        let nvrtc = record("nvrtc", "12.9.86");
        let error = check("nvcc130_sm_90a.cubin", "sm_90a", "cu129", &nvrtc).unwrap_err();
        assert!(error.contains("built by CUDA 13.0"), "{error}");
        let other = record("nvrtc", "12.9.41");
        let error = check("nvrtc129_sm_100a.cubin", "sm_100a", "cu129", &other).unwrap_err();
        assert!(
            error.contains("toolkit version 12.9.86") && error.contains("writes 12.9.41"),
            "{error}"
        );
        // The ptxas route's cubin is ptxas 12.9's, not nvcc 13.0's.
        let route = record("nvcc+ptxas", "13.0.88 + ptxas 12.9.86");
        let error = check("nvcc130_sm_100f.cubin", "sm_100f", "cu129", &route).unwrap_err();
        assert!(error.contains("built by CUDA 13.0"), "{error}");
    }

    #[test]
    fn another_targets_or_kernels_cubin_is_refused() {
        let nvcc = record("nvcc", "13.0.88");
        // Same SM, other kind (the `a`/`f` marker), other SM.
        let error = check("nvcc130_sm_100f.cubin", "sm_100a", "cu130", &nvcc).unwrap_err();
        assert!(error.contains("family"), "{error}");
        let error = check("nvcc130_sm_100a.cubin", "sm_90a", "cu130", &nvcc).unwrap_err();
        assert!(error.contains("sm_100"), "{error}");
        // Entries and parameter sizes of another kernel.
        let bytes = fixture("nvcc130_sm_90a.cubin");
        let mut recorded = functions(&bytes);
        recorded[1].param_sizes.push(8);
        let error = check_recorded(&bytes, "sm_90a", "cu130", &nvcc, &recorded).unwrap_err();
        assert!(
            error.contains("entry `kw_axpy` takes parameters of [8, 4, 8] bytes"),
            "{error}"
        );
        recorded[1].symbol = "kw_other".into();
        let error = check_recorded(&bytes, "sm_90a", "cu130", &nvcc, &recorded).unwrap_err();
        assert!(error.contains("no kernel entry `kw_other`"), "{error}");
    }

    #[test]
    fn record_versions_name_front_end_and_assembler() {
        assert_eq!(
            record_versions("13.0.88, host gcc 12.2.0"),
            ("13.0.88", "13.0.88")
        );
        assert_eq!(
            record_versions("13.0.88 + ptxas 12.9.86, host gcc 12.2.0"),
            ("13.0.88", "12.9.86")
        );
        assert_eq!(record_versions("12.9.86"), ("12.9.86", "12.9.86"));
    }
}
