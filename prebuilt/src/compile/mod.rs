//! The one compile recipe and executor, shared by the bundler and the JIT so that a JIT cubin
//! is the cubin the bundler would have built: the compiler kinds, how their exact versions are
//! read, the option lists in order, the entry probes that name templated entries for nvcc, the
//! run itself, and how a compiled cubin's entries are resolved and checked.
//!
//! | piece | used for |
//! | --- | --- |
//! | [`CompilerKind`] | which compiler built a variant; its text is the index's `compiler.kind` |
//! | [`parse_nvcc_version`], [`nvrtc_package_version`], [`host_compiler`], [`nvcc_record`] | the exact versions that enter the key |
//! | [`ToolkitLayout`], [`toolchain_dir`] | where a toolkit keeps nvcc, ptxas, libnvrtc and headers ([`layout`]) |
//! | [`compile`], [`CompilerTool`], [`CompileJob`] | one compile, in the key's work folder ([`execute`], [`work`]), its tools in a fixed memory layout ([`address_space`]), its line tables without file times ([`lines`]) |
//! | [`ToolRunner`], [`Local`], [`compile_with`] | where nvcc and ptxas run: here, or handed elsewhere by the bundler (a build farm) |
//! | [`nvrtc_options`], [`nvcc_arguments`], [`ptxas::ptxas_options`] | the options, in order |
//! | [`entry_probes_source`], [`read_entry_probes`] | the mangled symbol of each name expression under nvcc |
//! | [`computed`] | constants the compiler computes per entry and arch, read back from the output |
//! | [`resolve_entries`] | a cubin's entries as the index records them, validated for the target |

pub mod address_space;
pub mod computed;
pub mod execute;
pub mod layout;
pub mod lines;
pub mod ptxas;
pub mod work;

pub use execute::{
    compile, compile_with, CompileFailure, CompileJob, Compiled, CompilerTool, Local, ToolRun,
    ToolRunner,
};
pub use layout::{toolchain_dir, toolchain_dir_from, toolchain_env_var, ToolkitLayout};
pub use work::SourceTree;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cubin::{inspect_cubin, validate_cubin, CubinError};
pub use crate::index::CompilerKind;
use crate::index::{CompilerRecord, Function};
use crate::target::Arch;

/// The record of a precompiled cubin: kind `cubin`, no version.
pub fn precompiled_record() -> CompilerRecord {
    CompilerKind::Precompiled.record("")
}

/// nvcc, or the host compiler it runs, could not tell its version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("could not run `{} --version`: {detail}", program.display())]
pub struct ProbeError {
    /// The nvcc (or host compiler) executable.
    pub program: PathBuf,
    /// What went wrong.
    pub detail: String,
}

/// NVRTC's exact version from package metadata in `dir`: a wheel's
/// `nvidia_cuda_nvrtc*-X.Y.Z.dist-info` (its `METADATA`, else its name; of CUDA `major` when
/// given), else a toolkit root's `version.json`.
pub fn nvrtc_package_version(dir: &Path, major: Option<u32>) -> Option<String> {
    let mut dist_infos: Vec<(PathBuf, String)> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let name = entry.file_name().into_string().ok()?;
            let (package, version) = name.strip_suffix(".dist-info")?.rsplit_once('-')?;
            let is_nvrtc = package == "nvidia_cuda_nvrtc"
                || package
                    .strip_prefix("nvidia_cuda_nvrtc_cu")
                    .is_some_and(|major| major.bytes().all(|b| b.is_ascii_digit()));
            let same_major = match major {
                Some(major) => version.split('.').next() == Some(major.to_string().as_str()),
                None => true,
            };
            (is_nvrtc && same_major).then(|| (entry.path(), version.to_owned()))
        })
        .collect();
    dist_infos.sort();
    if let Some((path, name_version)) = dist_infos.into_iter().next() {
        let metadata = fs::read_to_string(path.join("METADATA")).unwrap_or_default();
        let version = metadata
            .lines()
            .take_while(|line| !line.is_empty())
            .find_map(|line| line.strip_prefix("Version:"))
            .map(|version| version.trim().to_owned());
        return Some(version.unwrap_or(name_version));
    }
    let manifest = fs::read_to_string(dir.join("version.json")).ok()?;
    let manifest: serde_json::Value = serde_json::from_str(&manifest).ok()?;
    manifest["cuda_nvrtc"]["version"]
        .as_str()
        .map(str::to_owned)
}

/// A `Command` for nvcc (or ptxas) that does not depend on the caller's environment:
/// `NVCC_PREPEND_FLAGS` and the like would change what gets built without changing the key, so
/// only `PATH` is kept, for the host compiler nvcc runs; and the process starts with the memory
/// layout of every other run ([`address_space`]), since ptxas's register assignment follows
/// it. The bundler runs nvcc the same way.
pub fn nvcc_command(nvcc: &Path) -> Command {
    let mut command = Command::new(nvcc);
    command.env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        command.env("PATH", path);
    }
    address_space::with_fixed_layout(&mut command);
    command
}

/// nvcc's exact version, from `nvcc --version`.
pub fn nvcc_version(nvcc: &Path) -> Result<String, ProbeError> {
    probe_version(nvcc, |text| {
        parse_nvcc_version(text).ok_or_else(|| format!("no version in its output:\n{text}"))
    })
}

/// The host compiler nvcc runs to preprocess device code (`gcc` on `PATH`, as nvcc itself finds
/// it), named by the first line of its `--version`: the distribution's build of gcc, and so its
/// libstdc++ and the system headers nvcc reads, is part of every nvcc key. The bundler and the
/// JIT both record it through [`nvcc_record`], so their nvcc keys agree on one machine.
pub fn host_compiler() -> Result<String, ProbeError> {
    probe_version(Path::new("gcc"), |text| {
        parse_host_compiler(text).ok_or_else(|| "it printed nothing".to_owned())
    })
}

/// Runs `program --version` (with [`nvcc_command`]'s environment) and reads its output with
/// `parse`; every failure names the program.
fn probe_version(
    program: &Path,
    parse: impl FnOnce(&str) -> Result<String, String>,
) -> Result<String, ProbeError> {
    let probe = |detail: String| ProbeError {
        program: program.to_path_buf(),
        detail,
    };
    let output = nvcc_command(program)
        .arg("--version")
        .output()
        .map_err(|error| probe(error.to_string()))?;
    if !output.status.success() {
        return Err(probe(format!(
            "{}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    parse(&String::from_utf8_lossy(&output.stdout)).map_err(probe)
}

/// The first line of `gcc --version`, trimmed: `gcc (Debian 12.2.0-14+deb12u1) 12.2.0`.
fn parse_host_compiler(text: &str) -> Option<String> {
    text.lines()
        .next()
        .map(|line| line.trim().to_owned())
        .filter(|line| !line.is_empty())
}

/// The record of an nvcc compile (`kind` is `nvcc`, or `nvcc+ptxas` for the bundler's route
/// through another build's `ptxas`): the compiler's version and the host compiler it
/// preprocessed with, `13.0.88, host gcc (Debian 12.2.0-14+deb12u1) 12.2.0`.
pub fn nvcc_record(kind: CompilerKind, version: &str, host_compiler: &str) -> CompilerRecord {
    kind.record(&format!("{version}, host {host_compiler}"))
}

/// nvcc's exact version from `nvcc --version`: `13.0.88` from
/// `Cuda compilation tools, release 13.0, V13.0.88` (the release, `12.9`, when there is no
/// `V` part). The bundler's toolchain discovery and the JIT's compiler search both use it.
pub fn parse_nvcc_version(text: &str) -> Option<String> {
    let line = text.lines().find(|line| line.contains("release "))?;
    let exact = line
        .split([',', ' '])
        .filter_map(|word| word.strip_prefix('V'))
        .find(|version| version.starts_with(|c: char| c.is_ascii_digit()));
    match exact {
        Some(version) => Some(version.to_owned()),
        None => {
            let release = line.split("release ").nth(1)?;
            Some(release.split(',').next()?.trim().to_owned())
        }
    }
}

/// The target-dependent compile settings both compilers take.
#[derive(Clone, Copy, Debug)]
pub struct CompileOptions<'a> {
    /// The target architecture.
    pub arch: Arch,
    /// The C++ standard, `c++17`.
    pub cxx_std: &'a str,
    /// The kernel's include directories (absolute), in `-I` order.
    pub include_dirs: &'a [PathBuf],
    /// Preprocessor definitions, as `-DNAME=value` in name order.
    pub defines: &'a BTreeMap<String, String>,
    /// Further flags, last and as given.
    pub flags: &'a [String],
}

/// NVRTC's options, in the bundler's order: architecture, standard, the kernel's include
/// dirs, the toolkit's, defines, flags.
pub fn nvrtc_options(
    options: &CompileOptions<'_>,
    toolkit_include_dirs: &[PathBuf],
) -> Vec<String> {
    let mut arguments = vec![
        format!("--gpu-architecture={}", options.arch),
        format!("-std={}", options.cxx_std),
    ];
    let include_dirs = options
        .include_dirs
        .iter()
        .chain(toolkit_include_dirs)
        .map(|dir| format!("-I{}", dir.display()));
    arguments.extend(include_dirs);
    arguments.extend(
        options
            .defines
            .iter()
            .map(|(name, value)| format!("-D{name}={value}")),
    );
    arguments.extend(options.flags.iter().cloned());
    arguments
}

/// nvcc's arguments, in the bundler's order: `-cubin` (`-ptx` for a `compute_XY` target),
/// architecture, standard, include dirs, defines, flags, output, source.
pub fn nvcc_arguments(options: &CompileOptions<'_>, source: &Path, output: &Path) -> Vec<OsString> {
    // A `compute_XY` target's artifact is PTX.
    let output_kind = if options.arch.is_ptx() {
        "-ptx"
    } else {
        "-cubin"
    };
    let mut arguments: Vec<OsString> = vec![
        output_kind.into(),
        format!("-arch={}", options.arch).into(),
        format!("-std={}", options.cxx_std).into(),
    ];
    if !is_cuda_file(source) {
        // nvcc picks the language by extension: a `.cuh` or `.h` translation unit is CUDA too.
        arguments.extend(["-x".into(), "cu".into()]);
    }
    for dir in options.include_dirs {
        let mut flag = OsString::from("-I");
        flag.push(dir);
        arguments.push(flag);
    }
    arguments.extend(
        options
            .defines
            .iter()
            .map(|(name, value)| OsString::from(format!("-D{name}={value}"))),
    );
    arguments.extend(options.flags.iter().map(OsString::from));
    arguments.push("-o".into());
    arguments.push(output.into());
    arguments.push(source.into());
    arguments
}

/// Whether nvcc reads `path` as CUDA by its extension (`.cu`); any other translation unit
/// (`.cuh`, `.h`, `.hpp`) is given `-x cu`.
pub fn is_cuda_file(path: &Path) -> bool {
    path.extension().is_some_and(|extension| extension == "cu")
}

/// The translation unit nvcc compiles when a kernel has name expressions or a preamble: the
/// kernel's source, the preamble, then one probe per name expression (see
/// [`entry_probes_source`]).
pub const ENTRY_PROBES_SOURCE: &str = "kwheel-entries.cu";
/// The PTX nvcc leaves (`-keep`) of [`ENTRY_PROBES_SOURCE`] in its work dir.
pub const ENTRY_PROBES_PTX: &str = "kwheel-entries.ptx";
/// The prefix of the device variables that make nvcc name an entry's symbol.
const PROBE_PREFIX: &str = "__kwheel_entry_";

/// Whether an entry is a name expression (`scale<half>`, `ns::kernel`) rather than a plain
/// `extern "C"` symbol: NVRTC lowers those, and nvcc compiles them through entry probes.
pub fn is_name_expression(entry: &str) -> bool {
    !entry.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// The file name errors in a kernel's preamble are reported under (`kwheel-preamble(2): error`).
pub const PREAMBLE_FILE: &str = "kwheel-preamble";

/// [`ENTRY_PROBES_SOURCE`]'s text: how nvcc is asked for the symbol of a name expression
/// (`scale<half>`, `act<float, &silu>`). It includes `source` (absolute), then the kernel's
/// `preamble` (under a `#line` naming [`PREAMBLE_FILE`], so errors there say so), and stores
/// each entry's address in a device variable; nvcc then instantiates the template exactly as
/// C++ reads the expression (typedefs, `half`, integer and enum arguments, function pointers),
/// and its PTX initializes `__kwheel_entry_<n>` with the mangled symbol ([`read_entry_probes`]).
/// NVRTC does the same with `nvrtcAddNameExpression`, after the same preamble
/// ([`with_preamble`]). Entry `n` is on line `3 + 2n`, with or without a preamble. The
/// bundler and the JIT compile this same text, so their cubins are the same bytes.
pub fn entry_probes_source(source: &Path, preamble: &str, name_expressions: &[String]) -> String {
    let mut text = format!(
        "#include \"{}\"\n",
        source
            .display()
            .to_string()
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
    );
    if !preamble.is_empty() {
        text = with_preamble(&text, preamble, PREAMBLE_FILE);
        text.push_str(&format!("#line 2 \"{ENTRY_PROBES_SOURCE}\"\n"));
    }
    for (n, entry) in name_expressions.iter().enumerate() {
        text.push_str(&format!(
            "// entry `{entry}`\n__device__ void* {PROBE_PREFIX}{n} = (void*)&{entry};\n"
        ));
    }
    text
}

/// `text` followed by `preamble` under `#line 1 "<file>"`: what NVRTC compiles for a kernel
/// with a preamble (`file` the absolute [`PREAMBLE_FILE`] of the work folder, since NVRTC
/// runs in the caller's working directory and `-lineinfo` tables resolve a relative name
/// against it), and the start of nvcc's [`entry_probes_source`] (`file` relative: nvcc runs
/// in the work folder); `text` itself when there is none.
pub fn with_preamble(text: &str, preamble: &str, file: &str) -> String {
    if preamble.is_empty() {
        return text.to_owned();
    }
    let mut out = text.to_owned();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    let file = file.replace('\\', "\\\\").replace('"', "\\\"");
    out.push_str(&format!("#line 1 \"{file}\"\n{preamble}"));
    if !preamble.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// Each name expression with the symbol its probe holds in `ptx` (nvcc's PTX of
/// [`entry_probes_source`]); an entry whose probe is missing is left out.
pub fn read_entry_probes(ptx: &str, name_expressions: &[String]) -> BTreeMap<String, String> {
    name_expressions
        .iter()
        .enumerate()
        .filter_map(|(n, entry)| {
            let needle = format!("{PROBE_PREFIX}{n} = ");
            let line = ptx.lines().find(|line| line.contains(&needle))?;
            let value = line.split_once(&needle)?.1;
            let value = value.trim_end().trim_end_matches(';').trim();
            let value = value
                .strip_prefix("generic(")
                .and_then(|inner| inner.strip_suffix(')'))
                .unwrap_or(value);
            Some((entry.clone(), value.to_owned()))
        })
        .collect()
}

/// Why a compiled cubin's entries cannot be recorded.
#[derive(Debug, thiserror::Error)]
pub enum EntryError {
    /// The output is not a valid cubin (or PTX) for the target.
    #[error(transparent)]
    Invalid(#[from] CubinError),
    /// An entry of the manifest is not among the cubin's functions.
    #[error("entry `{entry}` is not in the output; it has {}", if found.is_empty() { "no entry functions".to_owned() } else { found.join(", ") })]
    Missing {
        /// The entry as the manifest spells it.
        entry: String,
        /// The entries the output has, as a manifest would spell them ([`pasteable_entry`]).
        found: Vec<String>,
    },
    /// A plain entry is the name of several kernels of the output (overloads, or instances of
    /// one template), so it names none of them alone.
    #[error(
        "entry `{entry}` is the name of {} kernels of the output, so it names none of them \
         alone; write the one meant as `entries` takes it: {}",
        candidates.len(),
        candidates.join(", ")
    )]
    Ambiguous {
        /// The entry as the manifest spells it.
        entry: String,
        /// Each kernel of that name, spelled as `entries` takes it.
        candidates: Vec<String>,
    },
}

impl EntryError {
    /// The entry and what the output has instead, for an error about an entry that names no
    /// one kernel: the entries the output has, or for an ambiguous plain name one line per
    /// kernel of that name; else the reason the output is no valid cubin.
    pub fn missing_entry(self) -> Result<(String, Vec<String>), CubinError> {
        match self {
            EntryError::Invalid(source) => Err(source),
            EntryError::Missing { entry, found } => Ok((entry, found)),
            EntryError::Ambiguous { entry, candidates } => {
                let found = candidates
                    .iter()
                    .map(|candidate| {
                        format!("{candidate} (one of the kernels named `{entry}`: write one)")
                    })
                    .collect();
                Ok((entry, found))
            }
        }
    }
}

/// The index's record of each of `entries` in a compiled `cubin` for `arch`: its symbol and
/// its parameter sizes, after validating the cubin for the target with every symbol present as
/// an entry function. A name expression's symbol is the one the compiler gave it in `symbols`,
/// else the mangled symbol that demangles to it; a plain name's is the symbol of that name
/// (an `extern "C"` kernel, or a mangled symbol written out), else that of the one kernel whose
/// demangled name, without namespaces and template arguments, is the entry.
/// The bundler and the JIT both record entries through this.
pub fn resolve_entries(
    cubin: &[u8],
    arch: Arch,
    entries: &[String],
    symbols: &BTreeMap<String, String>,
) -> Result<Vec<Function>, EntryError> {
    let info = inspect_cubin(cubin)?;
    let mut resolved = Vec::new();
    for entry in entries {
        let symbol = if is_name_expression(entry) {
            symbols
                .get(entry)
                .filter(|symbol| info.function(symbol).is_some())
                .cloned()
                .or_else(|| info.resolve_entry(entry))
        } else {
            match info.function(entry) {
                Some(function) => Some(function.symbol.clone()),
                None => resolve_plain_entry(&info, entry)?,
            }
        };
        let symbol = match symbol {
            Some(symbol) => symbol,
            None => {
                return Err(EntryError::Missing {
                    entry: entry.to_owned(),
                    found: info
                        .functions
                        .iter()
                        .map(|function| pasteable_entry(&function.symbol))
                        .collect(),
                })
            }
        };
        resolved.push(symbol);
    }
    let symbol_refs: Vec<&str> = resolved.iter().map(String::as_str).collect();
    let info = validate_cubin(cubin, arch, &symbol_refs)?;
    Ok(entries
        .iter()
        .zip(resolved)
        .map(|(name, symbol)| Function {
            name: name.clone(),
            param_sizes: info
                .function(&symbol)
                .map(|function| function.param_sizes.clone())
                .unwrap_or_default(),
            symbol,
            computed: BTreeMap::new(),
        })
        .collect())
}

/// The symbol of the one C++ kernel of `info` whose `base_name` is the plain `entry`
/// (`gelu_forward` for `gelu_forward(float*, float const*, int)`, a `static` kernel or one in a
/// namespace); `None` when no kernel has that name, an error listing them when several do.
fn resolve_plain_entry(
    info: &crate::cubin::CubinInfo,
    entry: &str,
) -> Result<Option<String>, EntryError> {
    let named: Vec<&str> = info
        .functions
        .iter()
        .map(|function| function.symbol.as_str())
        .filter(|symbol| demangled(symbol).is_some_and(|name| base_name(&name) == entry))
        .collect();
    match named[..] {
        [] => Ok(None),
        [symbol] => Ok(Some(symbol.to_owned())),
        _ => Err(EntryError::Ambiguous {
            entry: entry.to_owned(),
            candidates: entry_spellings(&named),
        }),
    }
}

/// `symbol` demangled without return type and parameters (`ns::scale<float>`); `None` for a
/// symbol that is no C++ name (an `extern "C"` kernel).
fn demangled(symbol: &str) -> Option<String> {
    let parsed = cpp_demangle::Symbol::new(symbol.as_bytes()).ok()?;
    let options = cpp_demangle::DemangleOptions::new()
        .no_return_type()
        .no_params();
    parsed.demangle(&options).ok()
}

/// The unqualified name of a demangled function, without its template arguments:
/// `soft_max_f32` for `soft_max_f32<true, 0, 0, float>`, `k` for `(anonymous namespace)::k` or
/// `ns::k<ns::Tag>`. `::` and `<` inside template arguments or parentheses do not count.
fn base_name(demangled: &str) -> &str {
    let mut depth = 0usize;
    let mut start = 0;
    let mut end = demangled.len();
    let bytes = demangled.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'(' => depth += 1,
            b')' => depth = depth.saturating_sub(1),
            b'<' if depth == 0 => {
                end = at;
                depth += 1;
            }
            b'<' => depth += 1,
            b'>' => depth = depth.saturating_sub(1),
            b':' if depth == 0 && bytes.get(at + 1) == Some(&b':') => {
                start = at + 2;
                end = demangled.len();
                at += 1;
            }
            _ => {}
        }
        at += 1;
    }
    demangled.get(start..end.max(start)).unwrap_or(demangled)
}

/// How `entries` takes each of `symbols`: the name expression that names it
/// ([`pasteable_entry`], without `(anonymous namespace)::`, which C++ cannot write; a
/// non-template `static` kernel as `::name`), or, where that spelling names several of them
/// (overloads differ only in their parameters), the mangled symbol itself, which a plain entry
/// matches exactly.
fn entry_spellings(symbols: &[&str]) -> Vec<String> {
    let spelled: Vec<String> = symbols
        .iter()
        .map(|symbol| {
            let pasted = pasteable_entry(symbol).replace("(anonymous namespace)::", "");
            if is_name_expression(&pasted) {
                pasted
            } else {
                // `::k` is a name expression for a `static` kernel, or one in an anonymous
                // namespace, which nvcc and NVRTC then look up in the translation unit.
                format!("::{pasted}")
            }
        })
        .collect();
    symbols
        .iter()
        .zip(&spelled)
        .map(|(symbol, spelling)| {
            if spelled.iter().filter(|other| *other == spelling).count() > 1 {
                (*symbol).to_owned()
            } else {
                spelling.clone()
            }
        })
        .collect()
}

/// A kernel symbol as a manifest entry would spell it: demangled without parameters, and a
/// function-pointer template argument as `&name` rather than the demangler's `&name(float
/// const&)`. `extern "C"` names and symbols that do not demangle stay as they are.
pub fn pasteable_entry(symbol: &str) -> String {
    let Some(demangled) = demangled(symbol) else {
        return symbol.to_owned();
    };
    // Drop the parameter list after `&qualified::name` (a function pointer argument).
    let mut out = String::with_capacity(demangled.len());
    let mut chars = demangled.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        if c != '&' {
            continue;
        }
        while let Some(&next) = chars.peek() {
            if next == '_' || next == ':' || next.is_ascii_alphanumeric() {
                out.push(next);
                chars.next();
            } else {
                break;
            }
        }
        if chars.peek() == Some(&'(') && !out.ends_with('&') {
            let mut depth = 0;
            for skipped in chars.by_ref() {
                match skipped {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_compiler_is_the_first_line_of_its_version() {
        let text = "gcc (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022 Free Software \
                    Foundation, Inc.\n";
        assert_eq!(
            parse_host_compiler(text).as_deref(),
            Some("gcc (Debian 12.2.0-14+deb12u1) 12.2.0")
        );
        assert_eq!(parse_host_compiler("\n"), None);
        assert_eq!(parse_host_compiler(""), None);
    }

    #[test]
    fn host_compiler_is_found_on_path() {
        // The machine's gcc, as nvcc finds it; where there is none, the probe says so.
        match host_compiler() {
            Ok(host) => assert!(!host.contains('\n') && !host.is_empty(), "{host:?}"),
            Err(error) => assert!(
                error
                    .to_string()
                    .starts_with("could not run `gcc --version`: "),
                "{error}"
            ),
        }
    }

    #[test]
    fn entry_probes_name_each_entry() {
        let entries: Vec<String> = vec!["scale<float>".into(), "ns::k".into()];
        let text = entry_probes_source(Path::new("/src/a \"b\".cu"), "", &entries);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], r#"#include "/src/a \"b\".cu""#);
        // Entry `n` is on line `3 + 2n` (1-based), as nvcc's errors count.
        assert_eq!(
            lines[2],
            "__device__ void* __kwheel_entry_0 = (void*)&scale<float>;"
        );
        assert_eq!(
            lines[4],
            "__device__ void* __kwheel_entry_1 = (void*)&ns::k;"
        );
        let ptx = ".global .align 8 .u64 __kwheel_entry_0 = _Z5scaleIfEvv;\n\
                   .global .align 8 .u64 __kwheel_entry_1 = generic(_ZN2ns1kEv);\n";
        let names = read_entry_probes(ptx, &entries);
        assert_eq!(names["scale<float>"], "_Z5scaleIfEvv");
        assert_eq!(names["ns::k"], "_ZN2ns1kEv");
        assert!(is_name_expression("scale<float>") && is_name_expression("ns::k"));
        assert!(!is_name_expression("layernorm_bf16"));
    }

    /// PTX for compute_90 with one `.entry` per symbol, each taking one pointer: what nvcc
    /// 13.0 writes for a translation unit like ggml's `softmax.cu` and llm.c's kernels.
    fn ptx_with_entries(symbols: &[&str]) -> Vec<u8> {
        let mut ptx = String::from(".version 9.0\n.target sm_90\n.address_size 64\n\n");
        for symbol in symbols {
            ptx.push_str(&format!(
                ".visible .entry {symbol}(\n\t.param .u64 {symbol}_param_0\n)\n{{\n\tret;\n\n}}\n"
            ));
        }
        ptx.into_bytes()
    }

    /// The symbols nvcc 13.0 gives these kernels (`nvcc -ptx -arch=compute_90a`).
    const SOFT_MAX_BACK: &str = "_Z17soft_max_back_f32PKfS0_Pfif";
    const SOFT_MAX_SHARED: &str = "_Z12soft_max_f32ILb1ELi0ELi0EfEvPKfPKT2_Pfi";
    const SOFT_MAX_32: &str = "_Z12soft_max_f32ILb0ELi32ELi32EfEvPKfPKT2_Pfi";
    const GELU_FORWARD: &str = "_Z12gelu_forwardPfPKfi";
    const LAYERNORM_FORWARD: &str = "_ZN4llmc17layernorm_forwardEPf";
    const HIDDEN: &str = "_ZN37_GLOBAL__N__7e89ca40_5_sm_cu_daf73a936hiddenEPf";
    const SCALE_FLOAT: &str = "_Z5scalePf";
    const SCALE_DOUBLE: &str = "_Z5scalePd";

    fn resolve(symbols: &[&str], entries: &[&str]) -> Result<Vec<String>, EntryError> {
        let entries: Vec<String> = entries.iter().map(|entry| entry.to_string()).collect();
        let arch: Arch = "compute_90".parse().unwrap();
        resolve_entries(&ptx_with_entries(symbols), arch, &entries, &BTreeMap::new())
            .map(|functions| functions.into_iter().map(|f| f.symbol).collect())
    }

    #[test]
    fn a_plain_entry_naming_one_cpp_kernel_resolves_to_it() {
        let all = [
            SOFT_MAX_BACK,
            SOFT_MAX_SHARED,
            SOFT_MAX_32,
            GELU_FORWARD,
            LAYERNORM_FORWARD,
            HIDDEN,
            "add",
        ];
        // A `static` kernel, one with external linkage, one in a namespace, one in an
        // anonymous namespace, and an `extern "C"` one.
        assert_eq!(
            resolve(
                &all,
                &[
                    "soft_max_back_f32",
                    "gelu_forward",
                    "layernorm_forward",
                    "hidden",
                    "add"
                ]
            )
            .unwrap(),
            [
                SOFT_MAX_BACK,
                GELU_FORWARD,
                LAYERNORM_FORWARD,
                HIDDEN,
                "add"
            ]
        );
        // The only instance of a template in the output is the one the name names.
        assert_eq!(
            resolve(&[SOFT_MAX_32, "add"], &["soft_max_f32"]).unwrap(),
            [SOFT_MAX_32]
        );
        // A mangled symbol written out is itself.
        assert_eq!(
            resolve(&all, &[SOFT_MAX_SHARED]).unwrap(),
            [SOFT_MAX_SHARED]
        );
    }

    #[test]
    fn an_extern_c_kernel_comes_before_a_cpp_kernel_of_its_name() {
        let symbols = ["_ZN4llmc3addEPf", "add"];
        assert_eq!(resolve(&symbols, &["add"]).unwrap(), ["add"]);
        assert_eq!(
            resolve(&symbols[..1], &["add"]).unwrap(),
            ["_ZN4llmc3addEPf"]
        );
    }

    #[test]
    fn an_ambiguous_plain_entry_lists_each_kernel_as_entries_take_it() {
        let error = resolve(
            &[SOFT_MAX_BACK, SOFT_MAX_SHARED, SOFT_MAX_32],
            &["soft_max_f32"],
        )
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "entry `soft_max_f32` is the name of 2 kernels of the output, so it names none of \
             them alone; write the one meant as `entries` takes it: soft_max_f32<false, 32, \
             32, float>, soft_max_f32<true, 0, 0, float>"
        );
        // Overloads differ only in their parameters: the mangled symbol names each.
        let error = resolve(&[SCALE_FLOAT, SCALE_DOUBLE], &["scale"]).unwrap_err();
        let EntryError::Ambiguous { candidates, .. } = &error else {
            panic!("{error:?}");
        };
        assert_eq!(candidates, &[SCALE_DOUBLE, SCALE_FLOAT]);
        // Each spelling resolves to its one kernel.
        assert_eq!(
            resolve(&[SCALE_FLOAT, SCALE_DOUBLE], &[SCALE_DOUBLE, SCALE_FLOAT]).unwrap(),
            [SCALE_DOUBLE, SCALE_FLOAT]
        );
        let (entry, found) = error.missing_entry().unwrap();
        assert_eq!(entry, "scale");
        assert_eq!(
            found[0],
            "_Z5scalePd (one of the kernels named `scale`: write one)"
        );
    }

    #[test]
    fn a_plain_entry_naming_no_kernel_lists_the_entries() {
        let error = resolve(&[GELU_FORWARD, HIDDEN, "add"], &["gelu_backward"]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "entry `gelu_backward` is not in the output; it has gelu_forward, \
             (anonymous namespace)::hidden, add"
        );
    }

    #[test]
    fn base_names_drop_namespaces_and_template_arguments() {
        assert_eq!(base_name("soft_max_f32<true, 0, 0, float>"), "soft_max_f32");
        assert_eq!(base_name("(anonymous namespace)::hidden"), "hidden");
        assert_eq!(base_name("ns::k<ns::Tag, &ns::f>"), "k");
        assert_eq!(base_name("k<(1)>(0)>"), "k");
        assert_eq!(base_name("gelu_forward"), "gelu_forward");
    }

    #[test]
    fn a_preamble_comes_after_the_source_and_keeps_entry_lines() {
        let entries: Vec<String> = vec!["gemm<GemmType::Normal>".into()];
        let text = entry_probes_source(
            Path::new("src/deep_gemm/impls/sm90_bf16_gemm.cuh"),
            "using namespace deep_gemm;\nusing namespace cute;",
            &entries,
        );
        assert_eq!(
            text,
            "#include \"src/deep_gemm/impls/sm90_bf16_gemm.cuh\"\n\
             #line 1 \"kwheel-preamble\"\n\
             using namespace deep_gemm;\n\
             using namespace cute;\n\
             #line 2 \"kwheel-entries.cu\"\n\
             // entry `gemm<GemmType::Normal>`\n\
             __device__ void* __kwheel_entry_0 = (void*)&gemm<GemmType::Normal>;\n"
        );
        // Without a preamble the unit is what it always was.
        assert_eq!(
            entry_probes_source(Path::new("src/k.cu"), "", &entries),
            "#include \"src/k.cu\"\n// entry `gemm<GemmType::Normal>`\n\
             __device__ void* __kwheel_entry_0 = (void*)&gemm<GemmType::Normal>;\n"
        );
        assert_eq!(with_preamble("k();", "", PREAMBLE_FILE), "k();");
        assert_eq!(
            with_preamble(
                "k();",
                "using namespace a;\n",
                "/tmp/kwheel-0123/kwheel-preamble"
            ),
            "k();\n#line 1 \"/tmp/kwheel-0123/kwheel-preamble\"\nusing namespace a;\n"
        );
    }

    #[test]
    fn a_header_translation_unit_is_compiled_as_cuda() {
        let fixture = OptionsFixture::new();
        let options = fixture.options("sm_90a", "c++17");
        let arguments = |source: &str| nvcc_strings(&options, source, "out.cubin");
        for header in ["src/k.cuh", "src/k.h", "src/k.hpp"] {
            let header_arguments = arguments(header);
            assert_eq!(header_arguments[3..5], ["-x", "cu"], "{header}");
            assert_eq!(header_arguments.last().unwrap(), header);
        }
        assert!(!arguments("src/k.cu").contains(&"-x".to_owned()));
    }

    #[test]
    fn nvcc_version_is_exact() {
        let text = "Cuda compilation tools, release 13.0, V13.0.88\n";
        assert_eq!(parse_nvcc_version(text).as_deref(), Some("13.0.88"));
        assert_eq!(
            parse_nvcc_version("Cuda compilation tools, release 12.9\n").as_deref(),
            Some("12.9")
        );
        assert_eq!(parse_nvcc_version("hello"), None);
    }

    /// The include dirs, defines and flags the option tests compile with.
    struct OptionsFixture {
        include_dirs: Vec<PathBuf>,
        defines: BTreeMap<String, String>,
        flags: Vec<String>,
    }

    impl OptionsFixture {
        fn new() -> OptionsFixture {
            OptionsFixture {
                include_dirs: vec![PathBuf::from("/src/include")],
                defines: BTreeMap::from([
                    ("B".to_owned(), "2".to_owned()),
                    ("A".to_owned(), "x y".to_owned()),
                ]),
                flags: vec!["--use_fast_math".to_owned()],
            }
        }

        fn options<'a>(&'a self, arch: &str, cxx_std: &'a str) -> CompileOptions<'a> {
            CompileOptions {
                arch: arch.parse().unwrap(),
                cxx_std,
                include_dirs: &self.include_dirs,
                defines: &self.defines,
                flags: &self.flags,
            }
        }
    }

    /// nvcc's arguments for `source` into `out`, as strings.
    fn nvcc_strings(options: &CompileOptions, source: &str, out: &str) -> Vec<String> {
        nvcc_arguments(options, Path::new(source), Path::new(out))
            .into_iter()
            .map(|argument| argument.into_string().unwrap())
            .collect()
    }

    #[test]
    fn nvrtc_options_are_the_bundlers() {
        let fixture = OptionsFixture::new();
        let options = fixture.options("sm_100a", "c++20");
        let toolkit = [PathBuf::from("/tk/runtime"), PathBuf::from("/tk/cccl")];
        assert_eq!(
            nvrtc_options(&options, &toolkit),
            [
                "--gpu-architecture=sm_100a",
                "-std=c++20",
                "-I/src/include",
                "-I/tk/runtime",
                "-I/tk/cccl",
                "-DA=x y",
                "-DB=2",
                "--use_fast_math"
            ]
        );
    }

    #[test]
    fn nvcc_arguments_are_the_bundlers() {
        let fixture = OptionsFixture::new();
        let options = fixture.options("sm_90a", "c++17");
        let arguments = nvcc_strings(&options, "/src/k.cu", "/tmp/out.cubin");
        assert_eq!(
            arguments,
            [
                "-cubin",
                "-arch=sm_90a",
                "-std=c++17",
                "-I/src/include",
                "-DA=x y",
                "-DB=2",
                "--use_fast_math",
                "-o",
                "/tmp/out.cubin",
                "/src/k.cu"
            ]
        );
    }
}
