//! Build failures as a user reads them: one compile error once, with the targets it hit, a
//! few lines of it on the terminal and the whole log in a file.
//!
//! The same syntax error fails every arch × CUDA build of a kernel; the compilers' logs then
//! differ only in the scratch directory the source was copied to (`/tmp/kwheel-<hex>/`), so
//! logs equal once that is removed are one error.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Lines of log shown by default for all distinct errors together (at least 2 each), so a
/// summary stays within 15 lines; the rest is in the log file.
const LOG_LINES: usize = 6;

/// Where the full logs go, relative to the current directory.
pub(crate) const LOG_DIR: &str = "target/kwheel/logs";

/// One distinct error and every target it failed.
#[derive(Debug, PartialEq)]
pub(crate) struct ErrorGroup {
    /// `sm_90a (cu129, nvrtc 12.9.86)`, in the order met.
    pub(crate) targets: Vec<String>,
    /// The error without its per-target first line, scratch directories removed.
    pub(crate) log: String,
    /// How many of the targets failed in an earlier build with the same key and were not
    /// compiled again.
    pub(crate) replayed: usize,
}

/// One target's failure as the report groups it.
pub(crate) struct TargetError {
    /// The target as the failure names it (`sm_90a (cu129, nvrtc 12.9.86)`).
    pub(crate) target: String,
    /// What went wrong, without the heading that names the kernel and the target.
    pub(crate) log: String,
    /// Whether it was replayed from the build cache rather than compiled now.
    pub(crate) replayed: bool,
}

impl TargetError {
    /// The failure of a target as the build reports it.
    pub(crate) fn of(failure: &bundler::pipeline::Failure) -> TargetError {
        TargetError {
            target: failure.target.clone(),
            log: failure.log.clone(),
            replayed: failure.replayed,
        }
    }
}

/// Groups failures by their log, in the order each log was first met.
pub(crate) fn group_errors(errors: &[TargetError]) -> Vec<ErrorGroup> {
    let mut groups: Vec<ErrorGroup> = Vec::new();
    for error in errors {
        let log = without_scratch_dirs(&error.log).trim().to_owned();
        let group = match groups.iter().position(|group| group.log == log) {
            Some(at) => &mut groups[at],
            None => {
                groups.push(ErrorGroup {
                    targets: Vec::new(),
                    log,
                    replayed: 0,
                });
                groups.last_mut().expect("just pushed")
            }
        };
        group.targets.push(error.target.clone());
        group.replayed += usize::from(error.replayed);
    }
    groups
}

/// `text` without the scratch directories compilers were run in (`/tmp/kwheel-<hex>/`).
fn without_scratch_dirs(text: &str) -> String {
    let marker = format!("{}/kwheel-", std::env::temp_dir().display());
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(&marker) {
        out.push_str(&rest[..start]);
        let after = &rest[start + marker.len()..];
        let hex = after.bytes().take_while(u8::is_ascii_hexdigit).count();
        if hex > 0 && after[hex..].starts_with('/') {
            rest = &after[hex + 1..];
        } else {
            out.push_str(&marker);
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The groups, each as its targets and its first lines, indented under a heading line.
pub(crate) fn render_groups(groups: &[ErrorGroup], log: Option<&Path>) -> String {
    let mut out = String::new();
    let shown = (LOG_LINES / groups.len().max(1)).max(2);
    for group in groups {
        let _ = writeln!(out, "  {}:", group.targets.join(", "));
        let lines: Vec<&str> = group.log.lines().filter(|l| !l.trim().is_empty()).collect();
        for line in lines.iter().take(shown) {
            let _ = writeln!(out, "    {line}");
        }
        if lines.len() > shown {
            let _ = writeln!(out, "    … {} more lines", lines.len() - shown);
        }
    }
    let replayed: usize = groups.iter().map(|group| group.replayed).sum();
    if replayed > 0 {
        let _ = writeln!(
            out,
            "  {replayed} of these failed this way in an earlier build with the same key and were \
             not compiled again (the full log names each record to delete to compile it again)"
        );
    }
    if let Some(note) = entries_note(groups) {
        let _ = writeln!(out, "  {note}");
    }
    if let Some(log) = log {
        let _ = writeln!(
            out,
            "  the full log: {} (or run again with --verbose)",
            log.display()
        );
    }
    out
}

/// The code NVRTC (`__nv_name_map`) and nvcc (`kwheel-entries.cu`) are given for the entries
/// the manifest declares: an error there is an entry as written in `entries`.
const ENTRY_CODE: [&str; 2] = ["__nv_name_map(", "kwheel-entries.cu("];

/// A note pointing at the manifest when every group's first error is in the generated entry
/// code: the entry it names, as written, is what to fix.
fn entries_note(groups: &[ErrorGroup]) -> Option<String> {
    let mut named = Vec::new();
    for group in groups {
        let first = group.log.lines().find(|line| line.contains("error"))?;
        if !ENTRY_CODE.iter().any(|code| first.contains(code)) {
            return None;
        }
        // `identifier "scal" is undefined`: the name the compiler could not find.
        if let Some(name) = first.split('"').nth(1) {
            if !named.iter().any(|known: &String| known == name) {
                named.push(name.to_owned());
            }
        }
    }
    let names = named
        .iter()
        .map(|name| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ");
    Some(format!(
        "these errors are in the kernel's `entries` in kernels.toml: an entry names no kernel \
         of its source as written{}; run `kwheel dev explain <kernel>` for the source",
        if names.is_empty() {
            String::new()
        } else {
            format!(" (the compiler does not know {names})")
        }
    ))
}

/// Writes `text` to `<LOG_DIR>/<name>.log` (replacing it atomically); the path, or `None`
/// when it cannot be written (the terminal still has the summary).
pub(crate) fn write_log(name: &str, text: &str) -> Option<PathBuf> {
    let path = Path::new(LOG_DIR).join(format!("{name}.log"));
    prebuilt::cache::write_atomically(&path, text.as_bytes()).ok()?;
    Some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(target: &str, log: &str) -> TargetError {
        TargetError {
            target: target.to_owned(),
            log: log.to_owned(),
            replayed: false,
        }
    }

    #[test]
    fn errors_in_the_entry_code_point_at_entries_in_the_manifest() {
        let groups = group_errors(&[
            failed(
                "sm_90a (cu129, nvrtc 12.9.86)",
                "__nv_name_map(2): error: identifier \"scal\" is undefined\n",
            ),
            failed(
                "sm_90a (cu130, nvcc 13.0.88)",
                "kwheel-entries.cu(5): error: identifier \"scal\" is undefined\n",
            ),
        ]);
        let text = render_groups(&groups, None);
        assert!(
            text.contains("`entries` in kernels.toml") && text.contains("does not know `scal`"),
            "{text}"
        );
        let syntax = group_errors(&[failed(
            "sm_90a (cu130, nvcc 13.0.88)",
            "swiglu/swiglu.cu(40): error: expected a declaration\n",
        )]);
        assert!(!render_groups(&syntax, None).contains("entries"));
    }

    #[test]
    fn one_error_on_every_target_is_one_group_naming_them() {
        let tmp = std::env::temp_dir().display().to_string();
        let log = |dir: &str| {
            format!(
                "{dir}src/k.cu(3): error: expected a declaration\n  x;\n  ^\n\n1 error detected \
                 in the compilation of \"{dir}src/k.cu\"."
            )
        };
        let errors = vec![
            failed(
                "sm_90a (cu129, nvrtc 12.9.86)",
                &log(&format!("{tmp}/kwheel-375704efe3d99801/")),
            ),
            failed("sm_90a (cu130, nvcc 13.0.88)", &log("")),
            failed("sm_100a (cu130)", "the cubin has no entry `k`"),
        ];
        let groups = group_errors(&errors);
        assert_eq!(groups.len(), 2, "{groups:?}");
        assert_eq!(
            groups[0].targets,
            [
                "sm_90a (cu129, nvrtc 12.9.86)",
                "sm_90a (cu130, nvcc 13.0.88)"
            ]
        );
        assert_eq!(groups[0].log, log(""));
        assert_eq!(groups[1].targets, ["sm_100a (cu130)"]);
        let text = render_groups(&groups, Some(Path::new("target/kwheel/logs/x.log")));
        assert_eq!(
            text,
            "  sm_90a (cu129, nvrtc 12.9.86), sm_90a (cu130, nvcc 13.0.88):\n    \
             src/k.cu(3): error: expected a declaration\n      x;\n      ^\n    … 1 more lines\n  \
             sm_100a (cu130):\n    the cubin has no entry `k`\n  the full log: \
             target/kwheel/logs/x.log (or run again with --verbose)\n"
        );
    }
}
