//! The crate's floors, checked from its sources: no module imports a module that imports it
//! back (directly or around a circle), selection imports only the index, the targets and the
//! device, and no file's code runs past ~800 lines before its tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules that are the crate's helpers for tests, not part of any floor.
const TEST_ONLY: [&str; 2] = ["testing", "layering"];

/// The crate's top-level modules and, for each, the top-level modules its non-test code names
/// through `crate::`.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph = BTreeMap::new();
    for (module, files) in modules(&src) {
        let mut used = BTreeSet::new();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for name in crate_paths(code_before_tests(&text)) {
                if name != module && graph_member(&src, &name) {
                    used.insert(name);
                }
            }
        }
        graph.insert(module, used);
    }
    graph
}

fn graph_member(src: &Path, name: &str) -> bool {
    !TEST_ONLY.contains(&name)
        && (src.join(format!("{name}.rs")).is_file() || src.join(name).join("mod.rs").is_file())
}

/// `name` → its files: `name.rs`, or every file under `name/`.
fn modules(src: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "lib" || TEST_ONLY.contains(&name.as_str()) {
            continue;
        }
        let files = if path.is_dir() {
            rust_files(&path)
        } else {
            vec![path]
        };
        modules.insert(name, files);
    }
    modules
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files
}

/// The text before a file's `#[cfg(test)]` module.
fn code_before_tests(text: &str) -> &str {
    text.find("\n#[cfg(test)]").map_or(text, |end| &text[..end])
}

/// Every module named as `crate::name` or inside `crate::{a, b::c}`, comments skipped.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in code.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let group = group.split('}').next().unwrap_or_default();
                for item in group.split(',') {
                    names.insert(identifier(item.trim()));
                }
            } else {
                names.insert(identifier(rest));
            }
        }
    }
    names
}

fn identifier(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let graph = imports();
    // Depth-first search for a path from each module back to itself.
    for start in graph.keys() {
        let mut stack: Vec<Vec<&str>> = vec![vec![start.as_str()]];
        let mut seen = BTreeSet::new();
        while let Some(path) = stack.pop() {
            let last = *path.last().unwrap();
            for next in &graph[last] {
                if next == start {
                    panic!("import circle: {} → {start}", path.join(" → "));
                }
                if seen.insert(next.as_str()) {
                    let mut longer = path.clone();
                    longer.push(next);
                    stack.push(longer);
                }
            }
        }
    }
}

#[test]
fn selection_imports_only_the_index_the_targets_and_the_device() {
    let graph = imports();
    let allowed: BTreeSet<String> = ["index", "target", "device"].map(String::from).into();
    let extra: Vec<&String> = graph["select"].difference(&allowed).collect();
    assert!(extra.is_empty(), "select imports {extra:?}");
}

#[test]
fn no_file_runs_past_800_lines_before_its_tests() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let long: Vec<String> = rust_files(&src)
        .into_iter()
        .filter_map(|file| {
            let text = std::fs::read_to_string(&file).unwrap();
            let lines = code_before_tests(&text).lines().count();
            (lines > 800).then(|| format!("{} ({lines} lines)", file.display()))
        })
        .collect();
    assert!(long.is_empty(), "{long:?}");
}

#[test]
fn the_scanner_sees_grouped_and_plain_paths() {
    let code = "use crate::{index::Index, target};\n// crate::commented\nlet x = crate::key::sha256_hex(b);";
    let names: Vec<String> = crate_paths(code).into_iter().collect();
    assert_eq!(names, ["index", "key", "target"]);
}
