//! The `nvcc+ptxas` route's two steps: which of a kernel's flags reach the build's `ptxas`, and
//! the PTX ISA lowering between the newer nvcc and the older `ptxas`.
//!
//! `nvcc -cubin` runs its own `ptxas` with options it derives from its flags; the route runs
//! `nvcc -ptx` and then another build's `ptxas`, so it derives those options itself, as nvcc
//! does (read from `nvcc -dryrun` of CUDA 13.0):
//!
//! | flag | nvcc (PTX step) | ptxas |
//! | --- | --- | --- |
//! | `-maxrregcount=N` | `-maxreg N` | `-maxrregcount=N` |
//! | `-lineinfo` | line info | `--generate-line-info` |
//! | `-G` | debug PTX | `-g --dont-merge-basicblocks --return-at-end` |
//! | `--fmad=B` | `-fmad` | `--fmad B` |
//! | `-Xptxas A,B`, `--ptxas-options=A,B` | (ignored) | `A B` |
//! | `--resource-usage` | | `-v` |
//! | `-w` | no warnings | `-w` |
//! | `--Werror=all-warnings` | | `--warning-as-error` |
//! | `--extensible-whole-program` | | `-ewp` |
//! | `--use_fast_math`, `--ftz`, `--prec-div`, `--prec-sqrt` | in the PTX (`.ftz`, `div.approx`, …) | nothing: nvcc passes ptxas none of them |
//! | `-O<n>`, `-D`, `-U`, `-I`, `-std`, `-Xcompiler`, `-Xcicc`, `--expt-*`, diagnostics, … | as given | nothing |
//!
//! Any other flag is refused by name ([`UnhonouredFlag`]): it may mean something to a step the
//! route does not run (`-rdc`, `-dlto`, `-Xnvlink`), name targets the manifest owns (`-arch`,
//! `-gencode`), or be one whose effect on ptxas is not known.

use std::fmt;

/// A flag the `nvcc+ptxas` route cannot pass on faithfully.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnhonouredFlag {
    /// The flag as the manifest spells it.
    pub flag: String,
    /// Why.
    pub reason: &'static str,
}

impl fmt::Display for UnhonouredFlag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` {}", self.flag, self.reason)
    }
}

/// What a flag does on the route.
enum Effect {
    /// Only the PTX step reads it.
    FrontEnd,
    /// ptxas gets these options (and nvcc the flag too).
    Ptxas(Vec<String>),
    /// Refused.
    Refuse(&'static str),
}

/// Options whose value may be the next word (`-maxrregcount 32`) as well as `=`-joined.
const VALUE_OPTIONS: &[&str] = &[
    "arch",
    "gpu-architecture",
    "code",
    "gpu-code",
    "gencode",
    "generate-code",
    "I",
    "D",
    "U",
    "maxrregcount",
    "fmad",
    "Xptxas",
    "ptxas-options",
    "ftz",
    "prec-div",
    "prec-sqrt",
    "std",
    "Xcompiler",
    "compiler-options",
    "Xcicc",
    "Xcudafe",
    "diag-suppress",
    "diag-warn",
    "diag-error",
    "Werror",
    "optimize",
    "define-macro",
    "undefine-macro",
    "include-path",
    "system-include",
    "pre-include",
    "isystem",
    "include",
];

/// The options the build's `ptxas` gets for `flags` (the kernel's `flags` then `nvcc-flags`,
/// as nvcc gets them), in order, or the first flag the route cannot honour.
pub fn ptxas_options(flags: &[String]) -> Result<Vec<String>, UnhonouredFlag> {
    let mut options = Vec::new();
    let mut words = flags.iter().peekable();
    while let Some(flag) = words.next() {
        let body = flag.trim_start_matches('-');
        if body.len() == flag.len() {
            return Err(UnhonouredFlag {
                flag: flag.clone(),
                reason: "is not an option (the source is the manifest's)",
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
        match effect(name, value.as_deref()) {
            Effect::FrontEnd => {}
            Effect::Ptxas(more) => options.extend(more),
            Effect::Refuse(reason) => {
                return Err(UnhonouredFlag {
                    flag: shown,
                    reason,
                })
            }
        }
    }
    Ok(options)
}

fn effect(name: &str, value: Option<&str>) -> Effect {
    let one = |option: &str| Effect::Ptxas(vec![option.to_owned()]);
    match name {
        "maxrregcount" => match value.and_then(|v| v.parse::<u32>().ok()) {
            Some(count) => Effect::Ptxas(vec![format!("-maxrregcount={count}")]),
            None => Effect::Refuse("needs a register count"),
        },
        "lineinfo" | "generate-line-info" => one("--generate-line-info"),
        "G" | "device-debug" => Effect::Ptxas(
            ["-g", "--dont-merge-basicblocks", "--return-at-end"]
                .map(str::to_owned)
                .to_vec(),
        ),
        "fmad" => match value {
            Some(value @ ("true" | "false")) => {
                Effect::Ptxas(vec!["--fmad".to_owned(), value.to_owned()])
            }
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
        // Compiled into the PTX by cicc; nvcc passes ptxas nothing for them.
        "use_fast_math" | "use-fast-math" | "ftz" | "prec-div" | "prec-sqrt" => Effect::FrontEnd,
        // The front end and the host preprocessor only.
        "std"
        | "Xcompiler"
        | "compiler-options"
        | "Xcicc"
        | "Xcudafe"
        | "diag-suppress"
        | "diag-warn"
        | "diag-error"
        | "define-macro"
        | "undefine-macro"
        | "include-path"
        | "system-include"
        | "pre-include"
        | "isystem"
        | "include"
        | "optimize"
        | "expt-relaxed-constexpr"
        | "expt-extended-lambda"
        | "extended-lambda"
        | "restrict"
        | "extra-device-vectorization"
        | "src-in-ptx"
        | "g"
        | "debug"
        | "m64"
        | "display-error-number"
        | "no-display-error-number"
        | "Wreorder"
        | "Wno-deprecated-gpu-targets"
        | "Wno-deprecated-declarations"
        | "Wext-lambda-captures-this"
        | "default-stream"
        | "keep-device-functions"
        | "static-global-template-stub"
        | "no-host-device-initializer-list"
        | "allow-unsupported-compiler"
        | "v"
        | "verbose"
        | "I"
        | "D"
        | "U" => Effect::FrontEnd,
        "arch" | "gpu-architecture" | "code" | "gpu-code" | "gencode" | "generate-code" => {
            Effect::Refuse("names targets, which come from the manifest's `archs`")
        }
        "rdc"
        | "relocatable-device-code"
        | "dc"
        | "device-c"
        | "dlink"
        | "device-link"
        | "dlto"
        | "dlink-time-opt"
        | "lto"
        | "Xnvlink"
        | "linker-options"
        | "Xfatbin"
        | "fatbin-options" => Effect::Refuse(
            "asks for relocatable or link-time device code, which a loadable cubin is not",
        ),
        // `-O3`, `-DNAME`, `-UNAME`, `-Ipath` are one word.
        _ if name.starts_with(['O', 'D', 'U', 'I']) && name.len() > 1 => Effect::FrontEnd,
        _ if name.starts_with("Wno-") => Effect::FrontEnd,
        _ => Effect::Refuse(
            "is not known to the nvcc+ptxas route (nvcc's PTX, then this build's ptxas): it \
             might mean something ptxas must be told, so it is refused rather than dropped; \
             pass ptxas options as `-Xptxas=…`, or use a build with its own nvcc",
        ),
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
        assert!(refused(&["-rdc=true"]).starts_with("`-rdc=true` asks for relocatable"));
        assert!(refused(&["-gencode", "arch=compute_90a,code=sm_90a"])
            .starts_with("`-gencode arch=compute_90a,code=sm_90a` names targets"));
        assert!(refused(&["-v", "--dopt=on"]).starts_with("`--dopt=on` is not known"));
        assert!(refused(&["-maxrregcount=many"]).starts_with("`-maxrregcount=many` needs"));
        assert!(refused(&["kernel.cu"]).starts_with("`kernel.cu` is not an option"));
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
