//! The checks a manifest passes when it is read: names, paths, flags, per-arch tables, torch,
//! requirements; each failure names the manifest's line and the kernel.

use super::*;

impl Manifest {
    /// Why `pin` cannot be this library's: it is `none` (no torch at all), but a kernel
    /// compiles as a torch extension or an extension module is built against torch, which
    /// cannot ship in a wheel that requires no torch.
    pub fn needs_torch_under(&self, pin: &prebuilt::select::TorchPin) -> Option<String> {
        if pin.uses_torch() {
            return None;
        }
        let user = self
            .kernels
            .iter()
            .find(|(_, kernel)| self.torch_of(kernel))
            .map(|(name, _)| format!("kernel `{name}` compiles as a torch extension"))
            .or_else(|| {
                let name = self.extensions.keys().next()?;
                Some(format!("extension module `{name}` is built against torch"))
            })?;
        Some(format!(
            "`torch = \"none\"` says the library does not use torch, but {user}: pin the torch \
             it builds against (`torch = \"2.13.*\"`)"
        ))
    }

    pub(super) fn check(&self, text: &str) -> Result<(), Error> {
        for (name, extension) in &self.extensions {
            let library = &self.library;
            if let Some(message) = check_extension(
                name,
                extension,
                &library.archs,
                &library.cuda_builds,
                &library.torch,
                &self.kernels,
            ) {
                let needle = format!("[extensions.{name}]");
                let line = text
                    .lines()
                    .position(|l| l.trim_start().starts_with(&needle))
                    .map_or(1, |n| n + 1);
                return Err(Error::ExtensionInvalid {
                    path: self.path.clone(),
                    line,
                    extension: name.clone(),
                    message,
                });
            }
        }
        let invalid = |kernel: Option<&str>, message: String| {
            let needle = kernel.map_or("[library]".to_owned(), |k| format!("[kernels.{k}]"));
            let line = text
                .lines()
                .position(|l| l.trim_start().starts_with(&needle))
                .map_or(1, |n| n + 1);
            Error::ManifestInvalid {
                path: self.path.clone(),
                line,
                kernel: kernel.map(str::to_owned),
                message,
            }
        };
        let library = &self.library;
        if !is_package_name(&library.package) {
            return Err(invalid(
                None,
                format!(
                    "package `{}` is not a valid Python package name",
                    library.package
                ),
            ));
        }
        let pin = prebuilt::select::TorchPin::parse(&library.torch)
            .map_err(|error| invalid(None, format!("`torch`: {error}")))?;
        if let Some(message) = self.needs_torch_under(&pin) {
            return Err(invalid(None, message));
        }
        let library_flags = flag_lists(&library.flags, &library.nvcc_flags, &library.nvrtc_flags);
        if let Some(message) = include_path_in(library_flags, str::to_owned) {
            return Err(invalid(None, message));
        }
        if library.archs.is_empty() || library.cuda_builds.is_empty() {
            return Err(invalid(
                None,
                "`archs` and `cuda-builds` must not be empty".into(),
            ));
        }
        if let Some(message) = check_defines("defines", &library.defines)
            .or_else(|| check_preamble(library.preamble.as_deref()))
            .or_else(|| check_targets(&library.targets, &library.archs, "the library's `archs`"))
        {
            return Err(invalid(None, message));
        }
        if library.torch_extension && library.compiler == CompilerChoice::Nvrtc {
            return Err(invalid(None, TORCH_NEEDS_NVCC.into()));
        }
        for allowed in &self.release.allow_failed {
            let kernel = allowed.split('/').next().unwrap_or_default();
            let parts = allowed.split('/').count();
            if !self.kernels.contains_key(kernel) || (parts != 1 && parts != 3) {
                let line = text
                    .lines()
                    .position(|l| l.contains("allow-failed"))
                    .map_or(1, |n| n + 1);
                return Err(Error::ManifestInvalid {
                    path: self.path.clone(),
                    line,
                    kernel: None,
                    message: format!(
                        "`[release] allow-failed` names `{allowed}`, which is neither a kernel of \
                         the manifest nor one of its targets (`kernel/cu129/sm_90a`)"
                    ),
                });
            }
        }
        for (name, kernel) in &self.kernels {
            if !is_identifier(name) {
                return Err(invalid(
                    Some(name),
                    format!("kernel name `{name}` must be a C identifier"),
                ));
            }
            let kernel_flags = flag_lists(&kernel.flags, &kernel.nvcc_flags, &kernel.nvrtc_flags);
            if let Some(message) = include_path_in(kernel_flags, str::to_owned) {
                return Err(invalid(Some(name), message));
            }
            let archs = kernel.arch.as_deref().unwrap_or(&library.archs);
            let narrowed = if kernel.arch.is_some() {
                "the kernel's `arch`"
            } else {
                "the library's `archs`"
            };
            if let Some(message) = check_preamble(kernel.preamble.as_deref())
                .or_else(|| check_targets(&kernel.targets, archs, narrowed))
            {
                return Err(invalid(Some(name), message));
            }
            // A constant is exported as one value: no arch of the kernel may give it another
            // (the library's arch tables yield to the kernel's own constants and defines).
            let per_arch = kernel
                .targets
                .iter()
                .flat_map(|(arch, target)| target.defines.keys().map(move |d| (arch, d)));
            // Nor may a flag: `-DBLOCK_M=64` would compile one value and export another.
            let levels = [
                (
                    "",
                    &library.flags,
                    &library.nvcc_flags,
                    &library.nvrtc_flags,
                ),
                ("", &kernel.flags, &kernel.nvcc_flags, &kernel.nvrtc_flags),
            ]
            .into_iter()
            .map(|(at, f, nvcc, nvrtc)| (at.to_owned(), flag_lists(f, nvcc, nvrtc)));
            let targets = [&library.targets, &kernel.targets]
                .into_iter()
                .flat_map(|targets| targets.iter())
                .filter(|(arch, _)| archs.contains(arch))
                .map(|(arch, t)| {
                    let lists = flag_lists(&t.flags, &t.nvcc_flags, &t.nvrtc_flags);
                    (format!("targets.{arch}."), lists)
                });
            for (at, lists) in levels.chain(targets) {
                let key = |field: &str| format!("{at}{field}");
                if let Some(message) = constant_flag_in(lists, key, &kernel.constants) {
                    return Err(invalid(Some(name), message));
                }
            }
            for (arch, define) in per_arch {
                if kernel.constants.contains_key(define) {
                    return Err(invalid(
                        Some(name),
                        format!(
                            "`targets.{arch}` defines `{define}`, which is a constant of the \
                             kernel: a constant is exported with one value for every target"
                        ),
                    ));
                }
            }
            if !kernel.cubins.is_empty() {
                let compile_only = [
                    ("torch", kernel.torch == Some(true)),
                    ("preamble", kernel.preamble.is_some()),
                    ("targets", !kernel.targets.is_empty()),
                    ("template", kernel.template.is_some()),
                    ("computed", !kernel.computed.is_empty()),
                    ("structs", !kernel.structs.is_empty()),
                ];
                if let Some((key, _)) = compile_only.iter().find(|(_, set)| *set) {
                    return Err(invalid(
                        Some(name),
                        format!("`{key}` applies to compiled sources, not to `cubins`"),
                    ));
                }
            }
            if let Some(message) = check_computed(kernel) {
                return Err(invalid(Some(name), message));
            }
            if self.torch_of(kernel) && self.compiler_of(kernel) == CompilerChoice::Nvrtc {
                return Err(invalid(Some(name), TORCH_NEEDS_NVCC.into()));
            }
            if let Some(builds) = &kernel.cuda_builds {
                if let Some(build) = builds
                    .iter()
                    .find(|build| !library.cuda_builds.contains(build))
                {
                    return Err(invalid(
                        Some(name),
                        format!(
                            "`cuda-builds` names {build}, which is not one of the library's \
                             `cuda-builds`"
                        ),
                    ));
                }
                if builds.is_empty() {
                    return Err(invalid(
                        Some(name),
                        "`cuda-builds` must not be empty".into(),
                    ));
                }
            }
            if kernel.entries.is_empty() {
                return Err(invalid(
                    Some(name),
                    "`entries` must list at least one entry point".into(),
                ));
            }
            match (kernel.sources.len(), kernel.cubins.is_empty()) {
                (1, true) => {
                    let source = &kernel.sources[0];
                    // The bundle ships its sources under their manifest-relative paths, and
                    // the key and the JIT find them there: a source outside the library root
                    // would build a bundle that no reader opens.
                    let inside = std::path::Path::new(source).components().all(|component| {
                        matches!(
                            component,
                            std::path::Component::Normal(_) | std::path::Component::CurDir
                        )
                    });
                    if !inside {
                        return Err(invalid(
                            Some(name),
                            format!(
                                "source `{source}` is not inside the library's folder (absolute,                                  or through `..`): put a one-line `.cu` beside the manifest that                                  `#include`s it from an include dir"
                            ),
                        ));
                    }
                    if !TRANSLATION_UNITS.iter().any(|ext| source.ends_with(ext)) {
                        return Err(invalid(
                            Some(name),
                            format!(
                                "source `{source}` is not a translation unit nvcc and NVRTC \
                                 compile as CUDA ({})",
                                TRANSLATION_UNITS.join(", ")
                            ),
                        ));
                    }
                }
                (0, false) => {}
                (0, true) => {
                    return Err(invalid(
                        Some(name),
                        "give either `sources` or `cubins`".into(),
                    ))
                }
                (_, true) => {
                    return Err(invalid(
                        Some(name),
                        "`sources` takes exactly one translation unit; include the others from it"
                            .into(),
                    ))
                }
                (_, false) => {
                    return Err(invalid(
                        Some(name),
                        "give either `sources` or `cubins`, not both".into(),
                    ))
                }
            }
            for constant in kernel.constants.keys().chain(kernel.defines.keys()) {
                if !is_identifier(constant) {
                    return Err(invalid(
                        Some(name),
                        format!("constant or define `{constant}` must be a C identifier"),
                    ));
                }
            }
            if let Some(duplicate) = kernel
                .constants
                .keys()
                .find(|c| kernel.defines.contains_key(*c))
            {
                return Err(invalid(
                    Some(name),
                    format!("`{duplicate}` is both a constant and a define"),
                ));
            }
            let requirements = Self::requirements_of(kernel);
            if let Err(refused) = prebuilt::requires::check(&requirements, &kernel.constants) {
                let mut error = invalid(Some(name), refused.to_string());
                if let Error::ManifestInvalid { line, .. } = &mut error {
                    *line = match refused.number.checked_sub(1) {
                        Some(rule) => line_column(text, kernel.requires[rule].when.span().start).0,
                        None => key_line(text, *line, "inputs"),
                    };
                }
                return Err(error);
            }
        }
        Ok(())
    }
}

/// A level's three flag lists (`flags`, `nvcc-flags`, `nvrtc-flags`) by manifest key.
fn flag_lists<'a>(
    flags: &'a [String],
    nvcc_flags: &'a [String],
    nvrtc_flags: &'a [String],
) -> [(&'static str, &'a [String]); 3] {
    [
        ("flags", flags),
        ("nvcc-flags", nvcc_flags),
        ("nvrtc-flags", nvrtc_flags),
    ]
}

/// The first of a level's flag lists that passes an include path, as [`include_path_flag`]
/// words it, each list named by `key` of its manifest key.
fn include_path_in(
    lists: [(&'static str, &[String]); 3],
    key: impl Fn(&str) -> String,
) -> Option<String> {
    lists
        .into_iter()
        .find_map(|(field, flags)| include_path_flag(&key(field), flags))
}

/// What a torch-extension kernel with `compiler = "nvrtc"` is told.
const TORCH_NEEDS_NVCC: &str = "`torch = true` needs nvcc: torch's headers include host code \
                                and C++ library headers that NVRTC cannot compile; use \
                                `compiler = \"auto\"` (which picks nvcc) or `\"nvcc\"`";

/// The endings of a translation unit: nvcc is told `-x cu` for all but `.cu`.
const TRANSLATION_UNITS: &[&str] = &[".cu", ".cuh", ".h", ".hpp"];

/// The message for the first define of `defines` (the manifest key `key`) that is not a C
/// identifier, if any.
fn check_defines(key: &str, defines: &BTreeMap<String, String>) -> Option<String> {
    defines
        .keys()
        .find(|name| !is_identifier(name))
        .map(|name| format!("`{key}` names `{name}`, which must be a C identifier"))
}

/// A preamble goes into a source file: no NUL.
fn check_preamble(preamble: Option<&str>) -> Option<String> {
    preamble
        .filter(|text| text.contains('\0'))
        .map(|_| "`preamble` holds a NUL character".to_owned())
}

/// The message for the first fault of a `targets` table: an arch that is not built
/// (`archs`, named by `which`), a define that is not an identifier, an include-path flag.
fn check_targets(
    targets: &BTreeMap<Arch, TargetSpec>,
    archs: &[Arch],
    which: &str,
) -> Option<String> {
    targets.iter().find_map(|(arch, target)| {
        if !archs.contains(arch) {
            let list: Vec<String> = archs.iter().map(ToString::to_string).collect();
            return Some(format!(
                "`targets.{arch}` names {arch}, which is not one of {which} ({})",
                list.join(", ")
            ));
        }
        let key = |field: &str| format!("targets.{arch}.{field}");
        check_defines(&key("defines"), &target.defines).or_else(|| {
            let lists = flag_lists(&target.flags, &target.nvcc_flags, &target.nvrtc_flags);
            include_path_in(lists, key)
        })
    })
}

/// The message for the first flag among `lists` that defines or undefines one of a kernel's
/// `constants` (`-DBLOCK_M=64`, `-D BLOCK_M`, `--define-macro=BLOCK_M`, `-UBLOCK_M`), if any.
fn constant_flag_in(
    lists: [(&'static str, &[String]); 3],
    key: impl Fn(&str) -> String,
    constants: &BTreeMap<String, prebuilt::index::Constant>,
) -> Option<String> {
    lists.into_iter().find_map(|(field, flags)| {
        let mut pieces = flags.iter().flat_map(|flag| flag.split_whitespace());
        while let Some(piece) = pieces.next() {
            let glued = ["--define-macro=", "--undefine-macro=", "-D", "-U"]
                .iter()
                .find_map(|option| piece.strip_prefix(option));
            let (shown, value) = match glued {
                _ if ["-D", "-U", "--define-macro", "--undefine-macro"].contains(&piece) => {
                    match pieces.next() {
                        Some(value) => (format!("{piece} {value}"), value),
                        None => continue,
                    }
                }
                Some(value) => (piece.to_owned(), value),
                None => continue,
            };
            let name = value.split('=').next().unwrap_or_default();
            if constants.contains_key(name) {
                return Some(format!(
                    "`{}` holds `{shown}`, which sets `{name}`, a constant of the kernel: a \
                     constant is compiled and exported with the one value `constants` gives it",
                    key(field)
                ));
            }
        }
        None
    })
}

/// The line of `key = …` in the table whose header is on line `header` (1-based), or
/// `header` when the table does not spell it there.
fn key_line(text: &str, header: usize, key: &str) -> usize {
    text.lines()
        .enumerate()
        .skip(header)
        .take_while(|(_, line)| !line.trim_start().starts_with('['))
        .find(|(_, line)| {
            line.trim_start()
                .strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map_or(header, |(n, _)| n + 1)
}

pub(super) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |n| n + 1) + 1;
    (line, column)
}

/// Compiler options that add a header search path or a forced include. A header found
/// through one would be read by the compiler but not by the include scanner, so it would
/// escape the key: the manifest's `include-dirs` is the one way to name them.
const INCLUDE_PATH_FLAGS: &[&str] = &[
    "-I",
    "--include-path",
    "-isystem",
    "--system-include",
    "-idirafter",
    "-iquote",
    "-include",
    "--pre-include",
    "-imacros",
    "--options-file",
    "-optf",
];

/// The message for the first include-path option in `flags` (the manifest key `key`), if any.
pub(crate) fn include_path_flag(key: &str, flags: &[String]) -> Option<String> {
    let is_include_path = |piece: &str| {
        INCLUDE_PATH_FLAGS.iter().find(|option| {
            piece == **option
                || piece.starts_with(&format!("{option}="))
                // The short forms glue the value on: `-Iinclude`, `-isystem/usr/x`.
                || (!option.starts_with("--") && piece.starts_with(**option))
        })
    };
    flags.iter().find_map(|flag| {
        // Options handed on to the host compiler or ptxas: `-Xcompiler=-I/x,-O2`.
        let passed_on = if flag.starts_with("-X") || flag.starts_with("--compiler-options") {
            flag.split_once('=').map_or("", |(_, value)| value)
        } else {
            ""
        };
        let option =
            is_include_path(flag).or_else(|| passed_on.split(',').find_map(is_include_path))?;
        Some(format!(
            "`{key}` holds `{flag}`: headers found through `{option}` would be compiled but not \
             hashed into the key; list the directory in `include-dirs` instead (a forced \
             include is an `#include` at the top of the source)"
        ))
    })
}

pub(crate) fn is_identifier(text: &str) -> bool {
    let mut chars = text.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

fn is_package_name(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && text.starts_with(|c: char| c.is_ascii_alphanumeric())
}

/// What is wrong with a kernel's `template`, `computed` and `structs`, if anything: a constant
/// must be an identifier that no exported constant or other computed value takes, a
/// `template` binds only entries that have template arguments, and a struct names its fields.
fn check_computed(kernel: &KernelSpec) -> Option<String> {
    if let Some(template) = &kernel.template {
        if kernel.computed.is_empty() {
            return Some(
                "`template` names the parameters `computed` binds, but there is no `computed`"
                    .into(),
            );
        }
        if template.trim().is_empty() {
            return Some(
                "`template` is empty; leave it out to evaluate `computed` as written".into(),
            );
        }
        if let Some(entry) = kernel
            .entries
            .iter()
            .find(|entry| prebuilt::compile::computed::template_arguments(entry).is_none())
        {
            return Some(format!(
                "`template = \"{template}\"` binds each entry's template arguments, but entry \
                 `{entry}` has none"
            ));
        }
    }
    for (name, expression) in &kernel.computed {
        if !is_identifier(name) {
            return Some(format!("computed constant `{name}` must be a C identifier"));
        }
        if kernel.constants.contains_key(name) {
            return Some(format!(
                "computed constant `{name}` has the name of an exported constant of the kernel; \
                 a kernel's constants and computed constants are read by name, so each name \
                 may be one of them only"
            ));
        }
        if expression.trim().is_empty() || expression.contains('\n') {
            return Some(format!(
                "computed constant `{name}` must be a C++ expression on one line"
            ));
        }
    }
    for (name, fields) in &kernel.structs {
        let qualified = name.split("::").all(is_identifier);
        if !qualified {
            return Some(format!(
                "struct `{name}` must be a C++ type name (`Params`, `ns::Params`)"
            ));
        }
        if fields.is_empty() {
            return Some(format!("struct `{name}` names no fields to check"));
        }
        if let Some(field) = fields.iter().find(|field| !is_identifier(field)) {
            return Some(format!(
                "field `{field}` of struct `{name}` must be a C identifier"
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(field) = fields.iter().find(|field| !seen.insert(field.as_str())) {
            return Some(format!("struct `{name}` names field `{field}` twice"));
        }
    }
    None
}
