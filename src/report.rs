//! Build failures as a user reads them: one compile error once, with the targets it hit, a
//! few lines of it on the terminal and the whole log in a file.
//!
//! The same syntax error fails every arch × CUDA build of a kernel; the compilers' logs then
//! differ only in the scratch directory the source was copied to (`/tmp/kwheel-<hex>/`), so
//! logs equal once that is removed are one error.

use std::collections::BTreeMap;
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
}

/// Groups `(target, error)` pairs by their error, in the order each error was first met. A
/// first line `failed to compile `k` for <target>:` names the target better than the caller's
/// label (it has the compiler), and is not part of the error.
pub(crate) fn group_errors(errors: &[(String, String)]) -> Vec<ErrorGroup> {
    let mut order: Vec<String> = Vec::new();
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (target, error) in errors {
        let error = without_scratch_dirs(error);
        let (first, rest) = error.split_once('\n').unwrap_or((&error, ""));
        let named = first
            .split_once(" for ")
            .and_then(|(_, target)| target.strip_suffix(':'))
            .filter(|_| first.contains("failed to compile"));
        let (target, log) = match named {
            Some(named) => (named.to_owned(), rest.trim().to_owned()),
            None => (target.clone(), error.trim().to_owned()),
        };
        if !groups.contains_key(&log) {
            order.push(log.clone());
        }
        groups.entry(log).or_default().push(target);
    }
    order
        .into_iter()
        .map(|log| ErrorGroup {
            targets: groups.remove(&log).unwrap_or_default(),
            log,
        })
        .collect()
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

    #[test]
    fn errors_in_the_entry_code_point_at_entries_in_the_manifest() {
        let groups = group_errors(&[
            (
                "sm_90a (cu129, nvrtc 12.9.86)".to_owned(),
                "__nv_name_map(2): error: identifier \"scal\" is undefined\n".to_owned(),
            ),
            (
                "sm_90a (cu130, nvcc 13.0.88)".to_owned(),
                "kwheel-entries.cu(5): error: identifier \"scal\" is undefined\n".to_owned(),
            ),
        ]);
        let text = render_groups(&groups, None);
        assert!(
            text.contains("`entries` in kernels.toml") && text.contains("does not know `scal`"),
            "{text}"
        );
        let syntax = group_errors(&[(
            "sm_90a (cu130, nvcc 13.0.88)".to_owned(),
            "swiglu/swiglu.cu(40): error: expected a declaration\n".to_owned(),
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
            (
                "sm_90a (cu129)".to_owned(),
                format!(
                    "failed to compile `k` for sm_90a (cu129, nvrtc 12.9.86):\n{}",
                    log(&format!("{tmp}/kwheel-375704efe3d99801/"))
                ),
            ),
            (
                "sm_90a (cu130)".to_owned(),
                format!(
                    "failed to compile `k` for sm_90a (cu130, nvcc 13.0.88):\n{}",
                    log("")
                ),
            ),
            (
                "sm_100a (cu130)".to_owned(),
                "the cubin has no entry `k`".to_owned(),
            ),
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
