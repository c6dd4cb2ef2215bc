//! The `nvcc+ptxas` route's two steps: which of a kernel's flags reach the build's `ptxas`, and
//! the PTX ISA lowering between the newer nvcc and the older `ptxas`.
//!
//! `nvcc -cubin` runs its own `ptxas` with options it derives from its flags; the route runs
//! `nvcc -ptx` with every flag of the kernel and then another build's `ptxas`, so it derives
//! those options itself, as nvcc does (read from `nvcc -dryrun -cubin` of CUDA 13.0, flag by
//! flag, for every option of `nvcc --help`):
//!
//! | flag | ptxas gets |
//! | --- | --- |
//! | `-maxrregcount=N` | `-maxrregcount=N` |
//! | `-lineinfo` | `--generate-line-info` |
//! | `-G` | `-g --dont-merge-basicblocks --return-at-end`; with `-dopt=on`, `--generate-line-info` |
//! | `--fmad=false` | `--fmad false` |
//! | `-Xptxas A,B`, `--ptxas-options=A,B` | `A B` |
//! | `--resource-usage` | `-v` |
//! | `-w` | `-w` |
//! | `--Werror=all-warnings` | `--warning-as-error` |
//! | `--extensible-whole-program` | `-ewp` |
//! | `--Ofast-compile=L` | `--Ofast-compile=L` |
//! | `--split-compile=N` | `-split-compile=N` |
//! | `--device-stack-protector=B` | `--device-stack-protector=B` |
//! | `--entries=E` | `-e=E` |
//! | `--compile-as-tools-patch` | `-astoolspatch` |
//! | anything else: `-std`, `-O<n>`, `-D`, `-U`, `-I`, `-isystem`, `-Xcompiler`, `-forward-unknown-to-host-compiler` and the host flags it forwards, `--use_fast_math`, `--ftz`, `--prec-div`, `--expt-*`, `-ftemplate-*`, `-Xcicc`, `-Xcudafe`, diagnostics, `-Xnvlink`, `-l`, `-shared`, … | nothing: the PTX step obeys them (fast math and rounding are decided in the PTX), or they are for host code or for a link that a cubin has none of |
//!
//! A flag is refused by name ([`UnhonouredFlag`]), with what to do instead, only where the
//! route cannot make the cubin nvcc would: it names targets, which come from the manifest
//! (`-arch`, `-gencode`), asks for relocatable or link-time device code (`-rdc=true`, `-dc`,
//! `-dlto`), instruments device code in a way this build's `ptxas` cannot (`--sanitize`), or
//! chooses what nvcc writes and where (`-o`, `-c`, `-fatbin`, `-E`, an options file).

use std::fmt;

/// A flag the `nvcc+ptxas` route cannot pass on faithfully.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnhonouredFlag {
    /// The flag as the manifest spells it.
    pub flag: String,
    /// Why, and what to do instead.
    pub reason: &'static str,
}

impl fmt::Display for UnhonouredFlag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` {}", self.flag, self.reason)
    }
}

/// What a flag does on the route.
enum Effect {
    /// Only the PTX step reads it (or nothing that makes a cubin does).
    FrontEnd,
    /// ptxas gets these options (and nvcc the flag too).
    Ptxas(Vec<String>),
    /// `-G`: ptxas's debug options, which `-dopt=on` anywhere among the flags changes.
    DeviceDebug,
    /// Refused.
    Refuse(&'static str),
}

/// nvcc's options that take a value, which may be the next word (`-maxrregcount 32`,
/// `-diag-suppress 3189`) as well as `=`-joined: every such option of `nvcc --help` (13.0),
/// long and short, and the undocumented `-Xcicc` and `-Xcudafe`.
const VALUE_OPTIONS: &[&str] = &[
    "output-file",
    "o",
    "pre-include",
    "include",
    "library",
    "l",
    "define-macro",
    "D",
    "undefine-macro",
    "U",
    "include-path",
    "I",
    "system-include",
    "isystem",
    "library-path",
    "L",
    "output-directory",
    "odir",
    "dependency-output",
    "MF",
    "compiler-bindir",
    "ccbin",
    "archiver-binary",
    "arbin",
    "cudart",
    "cudadevrt",
    "libdevice-directory",
    "ldir",
    "target-directory",
    "target-dir",
    "optimization-info",
    "opt-info",
    "optimize",
    "O",
    "Ofast-compile",
    "Ofc",
    "dopt",
    "ftemplate-backtrace-limit",
    "ftemplate-depth",
    "x",
    "std",
    "machine",
    "m",
    "compiler-options",
    "Xcompiler",
    "linker-options",
    "Xlinker",
    "archive-options",
    "Xarchive",
    "ptxas-options",
    "Xptxas",
    "nvlink-options",
    "Xnvlink",
    "fatbin-options",
    "Xfatbin",
    "Xcicc",
    "Xcudafe",
    "static-global-template-stub",
    "device-entity-has-hidden-visibility",
    "threads",
    "t",
    "split-compile",
    "split-compile-extended",
    "fdevice-time-trace",
    "keep-dir",
    "time",
    "run-args",
    "input-drive-prefix",
    "idp",
    "dependency-drive-prefix",
    "ddp",
    "drive-prefix",
    "dp",
    "dependency-target-name",
    "MT",
    "gpu-architecture",
    "arch",
    "gpu-code",
    "code",
    "generate-code",
    "gencode",
    "relocatable-device-code",
    "rdc",
    "entries",
    "e",
    "maxrregcount",
    "ftz",
    "prec-div",
    "prec-sqrt",
    "fmad",
    "default-stream",
    "Werror",
    "diag-error",
    "diag-suppress",
    "diag-warn",
    "host-linker-script",
    "hls",
    "brief-diagnostics",
    "brief-diag",
    "jump-table-density",
    "jtd",
    "device-stack-protector",
    "compress-mode",
    "frandom-seed",
    "sanitize",
    "options-file",
    "optf",
];

/// The options the build's `ptxas` gets for `flags` (the kernel's `flags` then `nvcc-flags`,
/// as nvcc gets them), in order, or the first flag the route cannot honour.
pub fn ptxas_options(flags: &[String]) -> Result<Vec<String>, UnhonouredFlag> {
    let mut options = Vec::new();
    let mut device_debug = None;
    let mut optimized_debug = false;
    let mut words = flags.iter().peekable();
    while let Some(flag) = words.next() {
        let body = flag.trim_start_matches('-');
        if body.len() == flag.len() {
            return Err(UnhonouredFlag {
                flag: flag.clone(),
                reason: "is not an option (the source is the manifest's): leave it out, or list \
                         the file in the kernel's `sources`",
            });
        }
        let (name, mut value) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (body, None),
        };
        if value.is_none() && VALUE_OPTIONS.contains(&name) {
            value = words.next().cloned();
        }
        let shown = match &value {
            Some(value) if !flag.contains('=') => format!("{flag} {value}"),
            _ => flag.clone(),
        };
        if name == "dopt" {
            optimized_debug = value.as_deref() == Some("on");
        }
        match effect(name, value.as_deref()) {
            Effect::FrontEnd => {}
            Effect::Ptxas(more) => options.extend(more),
            // Placed where `-G` is; its options wait for every `-dopt`.
            Effect::DeviceDebug => {
                device_debug.get_or_insert(options.len());
            }
            Effect::Refuse(reason) => {
                return Err(UnhonouredFlag {
                    flag: shown,
                    reason,
                })
            }
        }
    }
    if let Some(at) = device_debug {
        // nvcc 13.0: `-G` alone gives ptxas unoptimized debug code; with `-dopt=on`, optimized
        // code with line info only.
        let debug: &[&str] = if optimized_debug {
            &["--generate-line-info"]
        } else {
            &["-g", "--dont-merge-basicblocks", "--return-at-end"]
        };
        options.splice(at..at, debug.iter().map(|option| (*option).to_owned()));
    }
    Ok(options)
}

/// What to do instead of a target flag.
const TARGETS: &str = "names targets, which come from the manifest: leave it out and list the \
                       target in `archs` (or a kernel's `arch`)";
/// What to do instead of a flag for relocatable or link-time device code.
const RELOCATABLE: &str = "asks for relocatable or link-time device code, which a loadable \
                           cubin is not: leave it out (each kernel's cubin is loaded whole)";
/// What to do instead of a flag that decides nvcc's output.
const OUTPUT: &str = "chooses what nvcc writes or where, which the build decides: leave it out";

fn effect(name: &str, value: Option<&str>) -> Effect {
    let one = |option: &str| Effect::Ptxas(vec![option.to_owned()]);
    match name {
        "maxrregcount" => match value.and_then(|v| v.parse::<u32>().ok()) {
            Some(count) => Effect::Ptxas(vec![format!("-maxrregcount={count}")]),
            None => Effect::Refuse("needs a register count"),
        },
        "lineinfo" | "generate-line-info" => one("--generate-line-info"),
        "G" | "device-debug" => Effect::DeviceDebug,
        "fmad" => match value {
            // ptxas fuses by default; nvcc tells it only when not to.
            Some("true") => Effect::FrontEnd,
            Some("false") => Effect::Ptxas(vec!["--fmad".to_owned(), "false".to_owned()]),
            _ => Effect::Refuse("takes `true` or `false`"),
        },
        "Xptxas" | "ptxas-options" => Effect::Ptxas(
            value
                .unwrap_or_default()
                .split(',')
                .filter(|option| !option.is_empty())
                .map(str::to_owned)
                .collect(),
        ),
        "resource-usage" | "res-usage" => one("-v"),
        "w" | "disable-warnings" => one("-w"),
        "Werror" => match value {
            Some(kinds) if kinds.split(',').any(|kind| kind == "all-warnings") => {
                one("--warning-as-error")
            }
            _ => Effect::FrontEnd,
        },
        "extensible-whole-program" | "ewp" => one("-ewp"),
        "Ofast-compile" | "Ofc" => match value {
            Some(level @ ("0" | "min" | "mid" | "max")) => {
                Effect::Ptxas(vec![format!("--Ofast-compile={level}")])
            }
            _ => Effect::Refuse("takes `0`, `min`, `mid` or `max`"),
        },
        "split-compile" => match value.and_then(|v| v.parse::<u32>().ok()) {
            Some(threads) => Effect::Ptxas(vec![format!("-split-compile={threads}")]),
            None => Effect::Refuse("needs a number of threads"),
        },
        "device-stack-protector" => match value {
            Some(value @ ("true" | "false")) => {
                Effect::Ptxas(vec![format!("--device-stack-protector={value}")])
            }
            _ => Effect::Refuse("takes `true` or `false`"),
        },
        "entries" | "e" => match value {
            Some(entries) if !entries.is_empty() => Effect::Ptxas(vec![format!("-e={entries}")]),
            _ => Effect::Refuse("needs the entries to keep"),
        },
        "compile-as-tools-patch" | "astoolspatch" => one("-astoolspatch"),
        "sanitize" => Effect::Refuse(
            "instruments device code through nvcc's own ptxas, which this build's ptxas cannot \
             do: leave it out of this build, or build with a CUDA build that has its own nvcc",
        ),
        "arch" | "gpu-architecture" | "code" | "gpu-code" | "gencode" | "generate-code" => {
            Effect::Refuse(TARGETS)
        }
        "rdc" | "relocatable-device-code" => match value {
            Some("false") => Effect::FrontEnd,
            _ => Effect::Refuse(RELOCATABLE),
        },
        "dc" | "device-c" | "dw" | "device-w" | "dlink" | "device-link" | "r"
        | "relocatable-link" | "dlto" | "dlink-time-opt" | "lto" | "ltoir" => {
            Effect::Refuse(RELOCATABLE)
        }
        "o"
        | "output-file"
        | "odir"
        | "output-directory"
        | "c"
        | "compile"
        | "cubin"
        | "ptx"
        | "fatbin"
        | "cuda"
        | "optix-ir"
        | "E"
        | "preprocess"
        | "M"
        | "MM"
        | "generate-dependencies"
        | "generate-nonsystem-dependencies"
        | "lib"
        | "link"
        | "run"
        | "dryrun"
        | "fdevice-syntax-only" => Effect::Refuse(OUTPUT),
        "optf" | "options-file" => Effect::Refuse(
            "reads more flags from a file, which the route cannot see: write them in the \
             manifest's `nvcc-flags` instead",
        ),
        // `-jobserver` and the rest: nvcc's PTX step obeys them, and nvcc gives its own ptxas
        // nothing that changes the cubin for them.
        _ => Effect::FrontEnd,
    }
}

/// The PTX ISA of a `.version X.Y` line.
pub fn ptx_isa(ptx: &str) -> Option<(u32, u32)> {
    let line = ptx
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with(".version"))?;
    let (major, minor) = line.strip_prefix(".version")?.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// `ptx` with its `.version` lowered to `max` when it is newer. Only the header changes: PTX
/// that uses nothing newer assembles the same; PTX that does is refused by ptxas, which the
/// executor reports as [`super::CompileFailure::NewerPtx`].
pub fn lower_ptx_isa(ptx: &str, max: (u32, u32)) -> String {
    match ptx_isa(ptx) {
        Some(isa) if isa > max => {
            let mut out = String::with_capacity(ptx.len());
            let mut done = false;
            for line in ptx.split_inclusive('\n') {
                if !done && line.trim_start().starts_with(".version") {
                    out.push_str(&format!(".version {}.{}\n", max.0, max.1));
                    done = true;
                } else {
                    out.push_str(line);
                }
            }
            out
        }
        _ => ptx.to_owned(),
    }
}

/// The newest PTX ISA a `ptxas` of CUDA `version` assembles, as (major, minor): CUDA 12.9 reads
/// PTX ISA 8.8, 12.8 reads 8.7. `None` for a version this table does not know.
pub fn max_ptx_isa(version: &str) -> Option<(u32, u32)> {
    let build = crate::CudaBuild::from_version(version).ok()?;
    match (build.major, build.minor) {
        (12, 9) => Some((8, 8)),
        (12, 8) => Some((8, 7)),
        (13, 0) => Some((9, 0)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(flags: &[&str]) -> Result<Vec<String>, UnhonouredFlag> {
        let flags: Vec<String> = flags.iter().map(|flag| flag.to_string()).collect();
        ptxas_options(&flags)
    }

    #[test]
    fn ptxas_options_are_what_nvcc_gives_its_own_ptxas() {
        assert_eq!(
            options(&[
                "-maxrregcount=50",
                "--maxrregcount",
                "40",
                "-lineinfo",
                "-G",
                "--fmad=false",
                "-Xptxas",
                "-v,-O2",
                "--ptxas-options=-dlcm=ca",
                "-Xptxas=-O1",
                "--resource-usage",
                "-w",
                "--Werror=all-warnings",
            ])
            .unwrap(),
            [
                "-maxrregcount=50",
                "-maxrregcount=40",
                "--generate-line-info",
                "-g",
                "--dont-merge-basicblocks",
                "--return-at-end",
                "--fmad",
                "false",
                "-v",
                "-O2",
                "-dlcm=ca",
                "-O1",
                "-v",
                "-w",
                "--warning-as-error",
            ]
        );
    }

    #[test]
    fn front_end_flags_give_ptxas_nothing() {
        // nvcc 13.0's `-dryrun` gives its ptxas nothing for these: fast math, ftz and precise
        // division are decided in the PTX.
        assert_eq!(
            options(&[
                "--use_fast_math",
                "-ftz=true",
                "--prec-div=false",
                "-O3",
                "-DX=1",
                "-std=c++20",
                "-Xcompiler",
                "-fPIC",
                "--expt-relaxed-constexpr",
                "-diag-suppress",
                "177",
                "--Werror=reorder",
            ])
            .unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn flags_the_route_cannot_honour_are_named() {
        let refused = |flags: &[&str]| options(flags).unwrap_err().to_string();
        assert_eq!(
            refused(&["-rdc=true"]),
            "`-rdc=true` asks for relocatable or link-time device code, which a loadable cubin \
             is not: leave it out (each kernel's cubin is loaded whole)"
        );
        assert_eq!(
            refused(&["-gencode", "arch=compute_90a,code=sm_90a"]),
            "`-gencode arch=compute_90a,code=sm_90a` names targets, which come from the \
             manifest: leave it out and list the target in `archs` (or a kernel's `arch`)"
        );
        assert!(refused(&["-v", "--sanitize=memcheck"])
            .starts_with("`--sanitize=memcheck` instruments device code through nvcc's own"));
        assert!(refused(&["-o", "k.o"]).starts_with("`-o k.o` chooses what nvcc writes"));
        assert!(refused(&["--fatbin"]).starts_with("`--fatbin` chooses what nvcc writes"));
        assert!(refused(&["-optf", "flags.txt"]).starts_with("`-optf flags.txt` reads more"));
        assert!(refused(&["-maxrregcount=many"]).starts_with("`-maxrregcount=many` needs"));
        assert!(refused(&["kernel.cu"]).starts_with("`kernel.cu` is not an option"));
        // Relocatable code turned off is what a cubin is anyway.
        assert_eq!(options(&["-rdc=false"]).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn flags_nvcc_gives_its_own_ptxas_reach_this_builds_ptxas() {
        // What `nvcc -dryrun -cubin` of CUDA 13.0 gives ptxas for each.
        assert_eq!(
            options(&[
                "--Ofast-compile=max",
                "-split-compile",
                "4",
                "--device-stack-protector=true",
                "--entries=k",
                "-astoolspatch",
                "--fmad=true",
            ])
            .unwrap(),
            [
                "--Ofast-compile=max",
                "-split-compile=4",
                "--device-stack-protector=true",
                "-e=k",
                "-astoolspatch",
            ]
        );
        // `-G` with `-dopt=on`, in either order, is optimized code with line info.
        for flags in [["-G", "-dopt=on"], ["--dopt=on", "-G"]] {
            assert_eq!(
                options(&["-lineinfo", flags[0], flags[1], "-w"]).unwrap(),
                ["--generate-line-info", "--generate-line-info", "-w"]
            );
        }
        assert_eq!(
            options(&["-lineinfo", "-G", "-w"]).unwrap(),
            [
                "--generate-line-info",
                "-g",
                "--dont-merge-basicblocks",
                "--return-at-end",
                "-w"
            ]
        );
    }

    #[test]
    fn host_and_front_end_flags_go_to_the_ptx_step_only() {
        // ThunderKittens' Makefile: host-compiler flags, forwarded ones, link flags.
        assert_eq!(
            options(&[
                "-forward-unknown-to-host-compiler",
                "-ftemplate-backtrace-limit=0",
                "-Xcompiler=-fPIE",
                "-fPIC",
                "-march=native",
                "-Wno-psabi",
                "-diag-suppress",
                "3189",
                "-Xnvlink=--verbose",
                "-lcuda",
                "-l",
                "cublas",
                "-shared",
                "-x",
                "cu",
                "-jobserver",
            ])
            .unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn ptx_isa_is_lowered_in_the_header_only() {
        let ptx = "//\n.version 9.0\n.target sm_90a\n.address_size 64\n// .version 9.0\n";
        assert_eq!(ptx_isa(ptx), Some((9, 0)));
        let lowered = lower_ptx_isa(ptx, (8, 8));
        assert_eq!(
            lowered,
            "//\n.version 8.8\n.target sm_90a\n.address_size 64\n// .version 9.0\n"
        );
        assert_eq!(lower_ptx_isa(&lowered, (8, 8)), lowered);
        assert_eq!(max_ptx_isa("12.9.86"), Some((8, 8)));
        assert_eq!(max_ptx_isa("11.8"), None);
    }
}
