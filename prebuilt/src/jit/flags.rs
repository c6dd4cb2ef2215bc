//! What the JIT takes from a bundle's index to build a command line, checked: only compiler
//! flags that cannot name a file, a directory or a program, and defines, a C++ standard and
//! recipe paths that cannot smuggle one. A bundle comes from whoever built the wheel; the flags
//! it records are passed to nvcc or NVRTC on the user's machine, so `-MD -MF /anywhere` would
//! write a file there and `--compiler-bindir=/dir` would run the program found there.
//!
//! nvcc runs its sub-tools through a shell, each value inside double quotes: `$` and `` ` ``
//! there still expand (`-DX=$(cmd)` runs `cmd`), and `\` and `"` are nvcc's own escapes. So a
//! define's value, the standard and every recipe path are refused when they hold one of those
//! (or a control character), besides each flag being on the allowlist below.
//!
//! | accepted | forms |
//! | --- | --- |
//! | defines | `-DNAME`, `-DNAME=value`, `-D NAME=value`, `--define-macro=…`; `-UNAME`, `-U NAME`, `--undefine-macro=…` (`NAME` an identifier) |
//! | standard | `-std=c++NN`, `--std=c++NN` (03, 11, 14, 17, 20, 23) |
//! | optimization | `-O0` … `-O3`, `-dopt=on\|off`, `-Ofast-compile=max\|mid\|min\|0` |
//! | code generation | `-lineinfo`, `-G`, `--use_fast_math`, `--ftz=`, `--prec-div=`, `--prec-sqrt=`, `--fmad=` (`true`/`false`), `-maxrregcount=N`, `--extra-device-vectorization`, `--restrict`, `-default-device`, `--device-int128` |
//! | language | `--expt-relaxed-constexpr`, `--expt-extended-lambda`, `--extended-lambda`, `--builtin-move-forward=`, `--builtin-initializer-list=` |
//! | diagnostics | `-w`, `-Wno-<name>`, `-W<name>`, `-Werror[=<names>]`, `--diag-suppress=`/`--diag-warn=`/`--diag-error=<numbers or names>`, `--resource-usage`, `--display-error-number` |
//! | ptxas (`-Xptxas`, `--ptxas-options`) | `-v`, `-O0`…`-O3`, `--maxrregcount=N`, `-warn-spills`, `-warn-lmem-usage`, `-warn-double-usage`, `-dlcm=`, `-dscm=`, `--fmad=`, `--allow-expensive-optimizations=`, `-w`, `-Werror`, … |
//! | cudafe (`-Xcudafe`) | `--diag_suppress=`, `--diag_warning=`, `--diag_error=` (numbers or names), `--display_error_number` |
//!
//! Every spelling takes its value after `=` or as the next argument; a value is checked for its
//! own shape (a number, `true`, a name), so the next argument can never be another flag in
//! disguise. A `-Xptxas`/`-Xcudafe` value is split at commas as nvcc splits it, and each piece
//! must itself be on the sub-tool's list. Everything else is refused: `-I`, `-include`,
//! `--pre-include`, `-o`, `-odir`, `-MD`/`-MF`, `--dependency-output`, `-ccbin`/
//! `--compiler-bindir`, `-Xcompiler`, `-Xlinker`, `--keep-dir`, `--output-directory`,
//! `-optf`/`--options-file`, `@file`, `-run`, `--run-args`, `-lib`, `-L`, `-l`, `--time`,
//! `-arch` (the JIT picks the device's) and any flag not listed. `docs/jit.md` has the list.

use std::fmt;

use crate::index::{KernelInputs, SourceRecipe};

/// One thing in a kernel's index record that the JIT does not pass to a compiler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusedInput {
    /// Where it is in the index: `nvcc_flags`, `defines`, `cxx_std`, `recipe.include_dirs`.
    pub field: &'static str,
    /// The flag or value, escaped and at most 120 characters.
    pub value: String,
    /// Why it is refused.
    pub reason: String,
}

impl fmt::Display for RefusedInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} holds `{}`, {}", self.field, self.value, self.reason)
    }
}

fn refuse(field: &'static str, value: &str, reason: impl Into<String>) -> RefusedInput {
    let mut shown: String = value.chars().take(120).collect();
    if shown.len() < value.len() {
        shown.push('…');
    }
    RefusedInput {
        field,
        value: shown.escape_debug().to_string(),
        reason: reason.into(),
    }
}

/// Every input of `inputs` and `recipe` the JIT refuses, in index order (empty when it would
/// compile the kernel). `wheel verify` lists them all; the JIT stops at the first.
pub fn refused_inputs(inputs: &KernelInputs, recipe: Option<&SourceRecipe>) -> Vec<RefusedInput> {
    let mut refused = Vec::new();
    for (field, flags) in [
        ("flags", &inputs.flags),
        ("nvcc_flags", &inputs.nvcc_flags),
        ("nvrtc_flags", &inputs.nvrtc_flags),
    ] {
        refused.extend(check_flags(field, flags).err());
    }
    for (name, value) in &inputs.defines {
        if let Err(refusal) = check_define(name, Some(value)) {
            refused.push(refusal.of("defines"));
        }
    }
    // An arch's own values reach the same command line: the same checks, naming the arch.
    for (arch, target) in &inputs.targets {
        let in_arch = |mut refusal: RefusedInput| {
            refusal.reason = format!("{} (the {arch} table)", refusal.reason);
            refusal
        };
        for (field, flags) in [
            ("targets.flags", &target.flags),
            ("targets.nvcc_flags", &target.nvcc_flags),
            ("targets.nvrtc_flags", &target.nvrtc_flags),
        ] {
            refused.extend(check_flags(field, flags).err().map(in_arch));
        }
        for (name, value) in &target.defines {
            if let Err(refusal) = check_define(name, Some(value)) {
                refused.push(in_arch(refusal.of("targets.defines")));
            }
        }
    }
    if !is_cxx_std(&inputs.cxx_std) {
        refused.push(refuse(
            "cxx_std",
            &inputs.cxx_std,
            format!(
                "which is not a C++ standard the JIT passes ({})",
                CXX_STDS.join(", ")
            ),
        ));
    }
    if let Some(recipe) = recipe {
        refused.extend(check_recipe_path("recipe.source", &recipe.source).err());
        if !inputs.files.contains_key(&recipe.source) {
            // Every file the compiler is given is checked against its recorded digest.
            refused.push(refuse(
                "recipe.source",
                &recipe.source,
                "which is not among the kernel's files, whose digests the JIT checks",
            ));
        }
        for dir in &recipe.include_dirs {
            refused.extend(check_recipe_path("recipe.include_dirs", dir).err());
        }
    }
    refused
}

/// Checks one list of flags (`field` names it in a refusal): the first flag that is not on
/// the allowlist, or whose value is not of its flag's shape, is refused.
pub fn check_flags(field: &'static str, flags: &[String]) -> Result<(), RefusedInput> {
    let mut arguments = flags.iter();
    while let Some(flag) = arguments.next() {
        check_flag(flag, &mut arguments).map_err(|reason| refuse(field, flag, reason))?;
    }
    Ok(())
}

/// A refusal's reason for a flag that is not on the list.
const NOT_LISTED: &str = "which is not a flag the JIT takes from a bundle (it takes only flags \
                          that cannot name a file, a folder or a program)";

/// Checks `flag`, taking its value from `rest` when it is given as the next argument.
fn check_flag<'a>(flag: &str, rest: &mut impl Iterator<Item = &'a String>) -> Result<(), String> {
    let mut separate = |flag: &str| {
        rest.next()
            .map(String::as_str)
            .ok_or_else(|| format!("which needs a value after `{flag}`"))
    };
    // Defines first: their value may hold `=` and anything a define may.
    for (short, long, undefine) in [
        ("-D", "--define-macro", false),
        ("-U", "--undefine-macro", true),
    ] {
        let value = if flag == short || flag == long {
            Some(separate(flag)?)
        } else if let Some(value) = flag.strip_prefix(&format!("{long}=")) {
            Some(value)
        } else {
            flag.strip_prefix(short)
        };
        if let Some(value) = value {
            let (name, value) = match value.split_once('=') {
                Some((name, value)) if !undefine => (name, Some(value)),
                _ => (value, None),
            };
            return check_define(name, value).map_err(|refusal| refusal.reason);
        }
    }
    if matches!(flag, "-O0" | "-O1" | "-O2" | "-O3") {
        return Ok(());
    }
    if let Some(name) = flag.strip_prefix("-Wno-") {
        return is_word(name).then_some(()).ok_or_else(|| NOT_LISTED.into());
    }
    let (name, attached) = match flag.split_once('=') {
        Some((name, value)) => (name, Some(value)),
        None => (flag, None),
    };
    if name != "-Werror" && name != "--Werror" {
        if let Some(warning) = name.strip_prefix("-W") {
            return (attached.is_none() && is_word(warning))
                .then_some(())
                .ok_or_else(|| NOT_LISTED.into());
        }
    }
    let Some(spec) = FLAGS.iter().find(|spec| spec.names.contains(&name)) else {
        return Err(NOT_LISTED.into());
    };
    let value = match (spec.value, attached) {
        (Value::None, None) => return Ok(()),
        (Value::None, Some(_)) => return Err(format!("but `{name}` takes no value")),
        // `-Werror` alone is a flag; with a value, a list of warning names.
        (Value::Words, None) if name.ends_with("Werror") => return Ok(()),
        (_, Some(value)) => value,
        (_, None) => separate(name)?,
    };
    check_value(spec.value, value)
}

/// Checks a value against the shape its flag takes.
fn check_value(kind: Value, value: &str) -> Result<(), String> {
    let ok = match kind {
        Value::None => false,
        Value::Bool => matches!(value, "true" | "false"),
        Value::Number => !value.is_empty() && value.len() <= 6 && is_digits(value),
        Value::Choice(choices) => choices.contains(&value),
        Value::Std => is_cxx_std(value),
        Value::Words => !value.is_empty() && value.split(',').all(is_word),
        Value::Tool(tool, specs) => {
            // nvcc splits a sub-tool's value at commas; each piece is one of its flags.
            return value.split(',').try_for_each(|piece| {
                check_tool_flag(specs, piece).map_err(|()| {
                    format!("whose {tool} option `{piece}` is not one the JIT passes")
                })
            });
        }
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "whose value `{}` is not {}",
            value.escape_debug(),
            kind.shape()
        ))
    }
}

/// One piece of a `-Xptxas`/`-Xcudafe` value: a flag of `specs`, its value after `=`.
fn check_tool_flag(specs: &[Spec], piece: &str) -> Result<(), ()> {
    let (name, value) = match piece.split_once('=') {
        Some((name, value)) => (name, Some(value)),
        None => (piece, None),
    };
    let spec = specs
        .iter()
        .find(|spec| spec.names.contains(&name))
        .ok_or(())?;
    match (spec.value, value) {
        (Value::None, None) => Ok(()),
        (Value::None, Some(_)) | (_, None) => Err(()),
        (kind, Some(value)) => check_value(kind, value).map_err(|_| ()),
    }
}

/// A define (`NAME` or `NAME=value`) from a bundle: `NAME` an identifier; the value printable
/// ASCII without what nvcc's shell or its own quoting would read (`$`, `` ` ``, `\`, `"`),
/// and no `,-` (nvcc splits a define at commas).
pub fn check_define(name: &str, value: Option<&str>) -> Result<(), RefusedInput> {
    let shown = match value {
        Some(value) => format!("-D{name}={value}"),
        None => format!("-D{name}"),
    };
    if !is_identifier(name) {
        return Err(refuse(
            "flags",
            &shown,
            format!(
                "whose name `{}` is not an identifier (letters, digits and `_`, at most 128)",
                name.escape_debug()
            ),
        ));
    }
    if let Some(value) = value {
        if let Some(reason) = unsafe_text(value, MAX_DEFINE_VALUE) {
            return Err(refuse("flags", &shown, format!("whose value {reason}")));
        }
        if value.contains(",-") {
            return Err(refuse(
                "flags",
                &shown,
                "whose value holds `,-`, which nvcc would split into another argument",
            ));
        }
    }
    Ok(())
}

impl RefusedInput {
    fn of(mut self, field: &'static str) -> RefusedInput {
        self.field = field;
        self
    }
}

/// A path of the recipe (the translation unit or an include directory), joined under the
/// bundle's `sources/` and passed on nvcc's command line: no character nvcc's shell or its
/// quoting reads, and no comma (nvcc splits `-I` values at commas). Whether it stays inside
/// `sources/` after symbolic links is checked on disk when compiling.
fn check_recipe_path(field: &'static str, path: &str) -> Result<(), RefusedInput> {
    if let Some(reason) = unsafe_text(path, crate::untrusted::MAX_PATH_LEN) {
        return Err(refuse(field, path, format!("a path that {reason}")));
    }
    if path.contains(',') {
        return Err(refuse(
            field,
            path,
            "a path with a comma, which nvcc would split into two",
        ));
    }
    Ok(())
}

/// Longest define value the JIT passes.
const MAX_DEFINE_VALUE: usize = 4096;

/// Why `text` cannot go inside one of nvcc's double-quoted shell words, or `None`.
fn unsafe_text(text: &str, max: usize) -> Option<String> {
    if text.len() > max {
        return Some(format!("is longer than {max} bytes"));
    }
    let bad = text
        .chars()
        .find(|&c| !(' '..='~').contains(&c) || matches!(c, '$' | '`' | '\\' | '"'))?;
    Some(if bad.is_ascii_control() || !bad.is_ascii() {
        format!(
            "holds {}, which is not printable ASCII",
            bad.escape_unicode()
        )
    } else {
        format!("holds `{bad}`, which nvcc's shell or its quoting would interpret")
    })
}

/// The C++ standards the JIT passes as `-std=`.
const CXX_STDS: [&str; 6] = ["c++03", "c++11", "c++14", "c++17", "c++20", "c++23"];

fn is_cxx_std(text: &str) -> bool {
    CXX_STDS.contains(&text)
}

fn is_identifier(text: &str) -> bool {
    crate::untrusted::KernelName::parse(text).is_ok()
}

fn is_digits(text: &str) -> bool {
    text.bytes().all(|b| b.is_ascii_digit())
}

/// A diagnostic's name or number: `[A-Za-z0-9_-]+`, not starting with `-`.
fn is_word(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 64
        && !text.starts_with('-')
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// What a flag's value must be.
#[derive(Clone, Copy, Debug)]
enum Value {
    /// No value.
    None,
    /// `true` or `false`.
    Bool,
    /// A decimal number, at most 6 digits.
    Number,
    /// One of these words.
    Choice(&'static [&'static str]),
    /// A C++ standard ([`CXX_STDS`]).
    Std,
    /// Comma-separated diagnostic names or numbers.
    Words,
    /// Options of a sub-tool (its name, its flags).
    Tool(&'static str, &'static [Spec]),
}

impl Value {
    fn shape(self) -> String {
        match self {
            Value::None => "empty".into(),
            Value::Bool => "`true` or `false`".into(),
            Value::Number => "a number".into(),
            Value::Choice(choices) => format!("one of {}", choices.join(", ")),
            Value::Std => format!("a C++ standard ({})", CXX_STDS.join(", ")),
            Value::Words => "a list of diagnostic names or numbers".into(),
            Value::Tool(tool, _) => format!("{tool} options"),
        }
    }
}

/// A flag under every spelling nvcc and NVRTC give it, and its value.
#[derive(Clone, Copy, Debug)]
struct Spec {
    names: &'static [&'static str],
    value: Value,
}

const fn spec(names: &'static [&'static str], value: Value) -> Spec {
    Spec { names, value }
}

/// The allowlist (defines, `-O<n>` and `-W<name>` are matched before it).
const FLAGS: &[Spec] = &[
    spec(&["-lineinfo", "--generate-line-info"], Value::None),
    spec(&["-G", "--device-debug"], Value::None),
    spec(&["--use_fast_math", "-use_fast_math"], Value::None),
    spec(
        &["--expt-relaxed-constexpr", "-expt-relaxed-constexpr"],
        Value::None,
    ),
    spec(
        &[
            "--expt-extended-lambda",
            "-expt-extended-lambda",
            "--extended-lambda",
            "-extended-lambda",
        ],
        Value::None,
    ),
    spec(
        &[
            "--extra-device-vectorization",
            "-extra-device-vectorization",
        ],
        Value::None,
    ),
    spec(
        &["-default-device", "--device-as-default-execution-space"],
        Value::None,
    ),
    spec(&["--restrict", "-restrict"], Value::None),
    spec(&["--device-int128", "-device-int128"], Value::None),
    spec(&["-w", "--disable-warnings"], Value::None),
    spec(&["--resource-usage", "-res-usage"], Value::None),
    spec(
        &[
            "--display-error-number",
            "-err-no",
            "--no-display-error-number",
            "-no-err-no",
        ],
        Value::None,
    ),
    spec(&["-Werror", "--Werror"], Value::Words),
    spec(&["--ftz", "-ftz"], Value::Bool),
    spec(&["--prec-div", "-prec-div"], Value::Bool),
    spec(&["--prec-sqrt", "-prec-sqrt"], Value::Bool),
    spec(&["--fmad", "-fmad"], Value::Bool),
    spec(
        &["--builtin-move-forward", "--builtin-initializer-list"],
        Value::Bool,
    ),
    spec(&["--dopt", "-dopt"], Value::Choice(&["on", "off"])),
    spec(
        &["-Ofast-compile", "--Ofast-compile"],
        Value::Choice(&["max", "mid", "min", "0"]),
    ),
    spec(&["--maxrregcount", "-maxrregcount"], Value::Number),
    spec(&["-std", "--std"], Value::Std),
    spec(
        &[
            "--diag-suppress",
            "-diag-suppress",
            "--diag-warn",
            "-diag-warn",
            "--diag-error",
            "-diag-error",
        ],
        Value::Words,
    ),
    spec(&["-Xptxas", "--ptxas-options"], Value::Tool("ptxas", PTXAS)),
    spec(&["-Xcudafe"], Value::Tool("cudafe++", CUDAFE)),
];

/// ptxas options that name no file: inside `-Xptxas`.
const PTXAS: &[Spec] = &[
    spec(&["-O0", "-O1", "-O2", "-O3"], Value::None),
    spec(&["-v", "--verbose"], Value::None),
    spec(&["-w", "--disable-warnings"], Value::None),
    spec(&["-Werror", "--warning-as-error"], Value::None),
    spec(&["-lineinfo", "--generate-line-info"], Value::None),
    spec(&["-warn-spills", "--warn-on-spills"], Value::None),
    spec(
        &["-warn-lmem-usage", "--warn-on-local-memory-usage"],
        Value::None,
    ),
    spec(
        &["-warn-double-usage", "--warn-on-double-precision-use"],
        Value::None,
    ),
    spec(
        &[
            "-suppress-stack-size-warning",
            "--suppress-stack-size-warning",
        ],
        Value::None,
    ),
    spec(
        &["-disable-optimizer-consts", "--disable-optimizer-constants"],
        Value::None,
    ),
    spec(&["--opt-level"], Value::Choice(&["0", "1", "2", "3"])),
    spec(&["--maxrregcount", "-maxrregcount"], Value::Number),
    spec(
        &["--def-load-cache", "-dlcm"],
        Value::Choice(&["ca", "cg", "cs", "lu", "cv"]),
    ),
    spec(
        &["--def-store-cache", "-dscm"],
        Value::Choice(&["wb", "cg", "cs", "wt"]),
    ),
    spec(&["--fmad", "-fmad"], Value::Bool),
    spec(
        &[
            "--allow-expensive-optimizations",
            "-allow-expensive-optimizations",
        ],
        Value::Bool,
    ),
];

/// cudafe++ options that name no file: inside `-Xcudafe`.
const CUDAFE: &[Spec] = &[
    spec(
        &["--diag_suppress", "--diag_warning", "--diag_error"],
        Value::Words,
    ),
    spec(
        &["--display_error_number", "--no_display_error_number"],
        Value::None,
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn check(flags: &[&str]) -> Result<(), RefusedInput> {
        let flags: Vec<String> = flags.iter().map(|flag| flag.to_string()).collect();
        check_flags("nvcc_flags", &flags)
    }

    #[test]
    fn the_allowlist_accepts_every_listed_spelling() {
        for flags in [
            &[
                "-DA",
                "-DA=1",
                "-D",
                "B=x y",
                "--define-macro=C=2",
                "-UA",
                "-U",
                "B",
            ][..],
            &["-std=c++17", "--std", "c++20", "-O0", "-O3"],
            &["-lineinfo", "--generate-line-info", "-G", "--use_fast_math"],
            &[
                "-use_fast_math",
                "-maxrregcount=64",
                "--maxrregcount",
                "128",
            ],
            &["--expt-relaxed-constexpr", "--expt-extended-lambda"],
            &[
                "-Xptxas",
                "-v",
                "-Xptxas=-v",
                "--ptxas-options=-v,-O3,--maxrregcount=32",
            ],
            &["-Xptxas", "-warn-spills,-warn-lmem-usage,-dlcm=cg"],
            &[
                "--ftz=true",
                "--prec-div=false",
                "--prec-sqrt=true",
                "--fmad",
                "false",
            ],
            &[
                "--extra-device-vectorization",
                "-default-device",
                "--restrict",
            ],
            &["-w", "-Wno-deprecated-gpu-targets", "-Wreorder", "-Werror"],
            &[
                "-Werror=all-warnings",
                "--diag-suppress=177,550",
                "-dopt=on",
            ],
            &[
                "-Xcudafe",
                "--diag_suppress=177",
                "-Xcudafe=--diag_suppress=esa_on_defaulted_function_ignored",
            ],
        ] {
            check(flags).unwrap_or_else(|refused| panic!("{flags:?}: {refused}"));
        }
    }

    #[test]
    fn flags_that_name_a_file_or_a_program_are_refused() {
        for (flags, refused) in [
            (&["-MD", "-MF", "/tmp/x/pwned"][..], "-MD"),
            (
                &["--compiler-bindir=/tmp/evil"],
                "--compiler-bindir=/tmp/evil",
            ),
            (&["-ccbin", "/tmp/evil"], "-ccbin"),
            (&["-I/etc"], "-I/etc"),
            (&["-include", "/etc/passwd"], "-include"),
            (&["--pre-include=/etc/passwd"], "--pre-include=/etc/passwd"),
            (&["-Xcompiler", "-fplugin=/tmp/evil.so"], "-Xcompiler"),
            (&["-Xlinker", "-rpath"], "-Xlinker"),
            (&["--keep-dir", "/tmp"], "--keep-dir"),
            (&["-odir", "/tmp"], "-odir"),
            (&["-o", "/tmp/x"], "-o"),
            (&["--output-directory=/tmp"], "--output-directory=/tmp"),
            (&["--options-file", "/tmp/opts"], "--options-file"),
            (&["-optf=/tmp/opts"], "-optf=/tmp/opts"),
            (&["@/tmp/opts"], "@/tmp/opts"),
            (
                &["--dependency-output=/tmp/x"],
                "--dependency-output=/tmp/x",
            ),
            (&["-run"], "-run"),
            (&["--run-args", "x"], "--run-args"),
            (&["-lib"], "-lib"),
            (&["-L/tmp"], "-L/tmp"),
            (&["-lfoo"], "-lfoo"),
            (&["--time=/tmp/t.csv"], "--time=/tmp/t.csv"),
            (
                &["--fdevice-time-trace=/tmp/t"],
                "--fdevice-time-trace=/tmp/t",
            ),
            (&["-arch=sm_80"], "-arch=sm_80"),
            (&["-Wl,-rpath,/tmp"], "-Wl,-rpath,/tmp"),
            (&["-Wp,-MD,/tmp/x"], "-Wp,-MD,/tmp/x"),
        ] {
            let error = check(flags).unwrap_err();
            assert_eq!(error.value, refused, "{flags:?}: {error}");
            assert_eq!(error.field, "nvcc_flags");
        }
    }

    #[test]
    fn a_value_cannot_smuggle_another_flag() {
        for flags in [
            &["-maxrregcount", "--compiler-bindir=/tmp/evil"][..],
            &["-maxrregcount=32 -ccbin /tmp/evil"],
            &["-std", "c++17 -ccbin /tmp/evil"],
            &["-std=c++17,-ccbin"],
            &["--ftz", "-MD"],
            &["-Xptxas", "-v,--compile-only"],
            &["-Xptxas", "--maxrregcount", "-Xptxas", "32"],
            &["-Xptxas=-v,-o,/tmp/x"],
            &["-Xptxas", "-v -o /tmp/x"],
            &["-Xcudafe", "--diag_suppress=177,--gen_c_file_name=/tmp/x"],
            &["-Werror=all,-ccbin"],
            &["-lineinfo=/tmp/x"],
            &["-D"],
            &["-maxrregcount"],
            &["-DX=$(touch /tmp/pwned)"],
            &["-DX=`touch /tmp/pwned`"],
            &["-D", "X=1\" -ccbin \"/tmp"],
            &["-DX=1\\"],
            &["-DX=1,-ccbin=/tmp/evil"],
            &["-DA;B=1"],
            &["-D-ccbin=1"],
            &["-U", "A=1"],
        ] {
            assert!(check(flags).is_err(), "{flags:?} passed");
        }
    }

    #[test]
    fn defines_standard_and_recipe_paths_are_checked() {
        let mut inputs = KernelInputs {
            cxx_std: "c++17".into(),
            defines: [("BLOCK".to_owned(), "(256 * 2)".to_owned())].into(),
            flags: vec!["-lineinfo".into()],
            nvcc_flags: vec!["-Xptxas".into(), "-v".into()],
            nvrtc_flags: vec!["-default-device".into()],
            files: [("[1]/kernels/k.cu".to_owned(), "ab".repeat(32))].into(),
            ..KernelInputs::default()
        };
        let recipe = SourceRecipe {
            source: "[1]/kernels/k.cu".into(),
            include_dirs: vec![".".into(), "include".into()],
        };
        assert_eq!(refused_inputs(&inputs, Some(&recipe)), []);

        inputs.cxx_std = "c++17 --compiler-bindir=/tmp/evil".into();
        inputs.defines.insert("X".into(), "$(id)".into());
        inputs.defines.insert("a-b".into(), "1".into());
        let bad_recipe = SourceRecipe {
            source: "k$(id).cu".into(),
            include_dirs: vec!["a,b".into()],
        };
        let refused = refused_inputs(&inputs, Some(&bad_recipe));
        let fields: Vec<&str> = refused.iter().map(|r| r.field).collect();
        assert_eq!(
            fields,
            [
                "defines",
                "defines",
                "cxx_std",
                "recipe.source",
                "recipe.source",
                "recipe.include_dirs"
            ],
            "{refused:#?}"
        );
        assert_eq!(
            refused[0].to_string(),
            "defines holds `-DX=$(id)`, whose value holds `$`, which nvcc's shell or its \
             quoting would interpret"
        );
    }

    #[test]
    fn per_arch_flags_and_defines_are_checked() {
        let sm100: crate::Arch = "sm_100a".parse().unwrap();
        let mut inputs = KernelInputs {
            cxx_std: "c++17".into(),
            preamble: "using namespace deep_gemm;".into(),
            ..KernelInputs::default()
        };
        let target = inputs.targets.entry(sm100).or_default();
        target
            .defines
            .insert("KITTENS_BLACKWELL".into(), "1".into());
        target.nvcc_flags.push("-maxrregcount=128".into());
        assert_eq!(
            refused_inputs(&inputs, None),
            [],
            "a preamble is source text"
        );

        let target = inputs.targets.entry(sm100).or_default();
        target.nvcc_flags.push("--compiler-bindir=/tmp/evil".into());
        target.flags.push("-I/etc".into());
        target.defines.insert("Y".into(), "`id`".into());
        let refused = refused_inputs(&inputs, None);
        let fields: Vec<&str> = refused.iter().map(|r| r.field).collect();
        assert_eq!(
            fields,
            ["targets.flags", "targets.nvcc_flags", "targets.defines"],
            "{refused:#?}"
        );
        assert_eq!(
            refused[1].to_string(),
            format!(
                "targets.nvcc_flags holds `--compiler-bindir=/tmp/evil`, {NOT_LISTED} (the \
                 sm_100a table)"
            )
        );
    }
}
