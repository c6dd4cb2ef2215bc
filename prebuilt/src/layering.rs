//! The crates' floors, checked from their sources: no module imports a module that imports it
//! back (directly or around a circle), selection imports only the index, the targets and the
//! device, and no file's code runs past ~800 lines, tests left out.
//!
//! Test code is left out item by item: every `#[cfg(test)]` item (an inline `mod tests { … }`,
//! a `#[cfg(test)] mod load_order;` and the file it names, a test-only `use` or helper),
//! wherever in the file it stands. Nothing else is: a test module at the top of a file does
//! not hide the code below it.
//!
//! | crate | sources | checked here |
//! | --- | --- | --- |
//! | `prebuilt` | `src/` | circles, selection's imports, 800 lines |
//! | `kwheel-python` | `python/src/` | circles, 800 lines (it has no test binary of its own) |
//! | `kwheel` (the CLI) | `../src/` | circles, 800 lines |
//! | `bundler` | `../bundler/src` | circles, 800 lines |
//! | `release` | `../release/src` | circles, 800 lines |
//! | the Python package `kwheel` | `python/kwheel/*.py` | circles among its modules |
//!
//! A Rust module names another as `crate::name`, or as `super::name` where the `super`s climb
//! to the crate root (`super::x` in `src/a.rs`). A Python module imports another at module
//! level with `import kwheel.x`, `from kwheel.x import …`, `from .x import …` or
//! `from . import x`; `from . import name` of a name that is no module of the package imports
//! the package itself (`__init__`). Imports inside a function body are lazy and left out: they
//! run when the function is called, after every module of the package has finished importing,
//! so they cannot meet a half-initialised module the way a module-level circle does, unless
//! one is called while the package is still being imported (today no function-level import
//! names a module of the package: `build.py`'s `tomllib`/`tomli` are the only lazy ones).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Circles the `bundler`, `release` and `kwheel` (CLI) crates have today, `a → b → a`: this
/// test fails when one is added, and when one is gone (so the list is kept true). Today there
/// are none.
const KNOWN_CIRCLES: [&str; 0] = [];

/// One crate's sources: each top-level module and its non-test files.
struct CrateSources {
    name: &'static str,
    src: PathBuf,
    modules: BTreeMap<String, Vec<PathBuf>>,
}

impl CrateSources {
    /// The crate whose `src` directory is `src`, relative to this crate's manifest.
    fn read(name: &'static str, src: &str) -> CrateSources {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(src);
        let test_only = test_only_paths(&src);
        let mut modules: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        for path in rust_files(&src, &test_only) {
            let relative = path.strip_prefix(&src).unwrap();
            let first = relative.components().next().unwrap();
            let first = Path::new(first.as_os_str());
            let module = first.file_stem().unwrap().to_string_lossy().into_owned();
            if module == "lib" || module == "main" {
                continue;
            }
            modules.entry(module).or_default().push(path);
        }
        CrateSources { name, src, modules }
    }

    /// Each top-level module and the top-level modules its non-test code names through
    /// `crate::`.
    fn imports(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut graph = BTreeMap::new();
        for (module, files) in &self.modules {
            let mut used = BTreeSet::new();
            for file in files {
                let text = std::fs::read_to_string(file).unwrap();
                let code = non_test_code(&text);
                let names = crate_paths(&code)
                    .into_iter()
                    .chain(root_paths_through_super(
                        &code,
                        module_depth(&self.src, file),
                    ));
                for name in names {
                    if &name != module && self.modules.contains_key(&name) {
                        used.insert(name);
                    }
                }
            }
            graph.insert(module.clone(), used);
        }
        graph
    }

    /// Every import circle, as `crate: a → b → a`, each once (from its smallest module).
    fn circles(&self) -> Vec<String> {
        circles(self.name, &self.imports())
    }

    /// Files whose non-test code is over 800 lines, with their length.
    fn long_files(&self) -> Vec<String> {
        let mut long = Vec::new();
        for file in self.modules.values().flatten() {
            let text = std::fs::read_to_string(file).unwrap();
            let lines = non_test_code(&text).lines().count();
            if lines > 800 {
                long.push(format!("{} ({lines} lines)", file.display()));
            }
        }
        long
    }
}

/// Every circle of `graph`, as `name: a → b → a`, each once (from its smallest module).
fn circles(name: &str, graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut circles = BTreeSet::new();
    for start in graph.keys() {
        // Depth-first search for a path from `start` back to itself through modules that sort
        // after it, so that each circle is found from its smallest module only.
        let mut stack: Vec<Vec<&str>> = vec![vec![start.as_str()]];
        let mut seen = BTreeSet::new();
        while let Some(path) = stack.pop() {
            let last = *path.last().unwrap();
            for next in graph.get(last).into_iter().flatten() {
                if next == start {
                    circles.insert(format!("{name}: {} → {start}", path.join(" → ")));
                } else if next > start && seen.insert(next.as_str()) {
                    let mut longer = path.clone();
                    longer.push(next);
                    stack.push(longer);
                }
            }
        }
    }
    circles.into_iter().collect()
}

/// How deep below the crate root the module of `file` is: 1 for `src/a.rs` and
/// `src/a/mod.rs`, 2 for `src/a/b.rs`.
fn module_depth(src: &Path, file: &Path) -> usize {
    let relative = file.strip_prefix(src).unwrap();
    let components = relative.components().count();
    if file.file_stem().is_some_and(|stem| stem == "mod") {
        components - 1
    } else {
        components
    }
}

/// Every top-level module named through `super::` from a module `depth` below the root:
/// `super::x` at depth 1, `super::super::x` at depth 2 (and inside `super::{a, b}`).
fn root_paths_through_super(code: &str, depth: usize) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in code.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        let mut from = 0;
        while let Some(at) = line[from..].find("super::").map(|at| from + at) {
            // A path's first `super`: not inside a longer name or after another `::`.
            let before = line[..at].chars().next_back();
            let mut rest = &line[at..];
            let mut climbed = 0;
            while let Some(after) = rest.strip_prefix("super::") {
                rest = after;
                climbed += 1;
            }
            from = line.len() - rest.len();
            let starts_path = !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
            if starts_path && climbed == depth {
                names.extend(group_or_name(rest));
            }
        }
    }
    names
}

/// The first names of `rest` after a path's `::`: each item of `{a, b::c}`, or the one name.
fn group_or_name(rest: &str) -> Vec<String> {
    match rest.strip_prefix('{') {
        Some(group) => group
            .split('}')
            .next()
            .unwrap_or_default()
            .split(',')
            .map(|item| identifier(item.trim()))
            .collect(),
        None => vec![identifier(rest)],
    }
}

/// The files (or directories) of modules declared `#[cfg(test)] mod name;` anywhere under
/// `src`: test code, as a whole.
fn test_only_paths(src: &Path) -> BTreeSet<PathBuf> {
    let mut paths = BTreeSet::new();
    for file in rust_files(src, &BTreeSet::new()) {
        let text = std::fs::read_to_string(&file).unwrap();
        let stem = file.file_stem().unwrap().to_string_lossy();
        let dir = match stem.as_ref() {
            "lib" | "main" | "mod" => file.parent().unwrap().to_path_buf(),
            _ => file.with_extension(""),
        };
        for (start, end) in test_items(&text) {
            // The item after its attributes (`#[cfg(..)]`, `#[doc(hidden)]`, ...).
            let mut item = text[start..end].trim();
            while let Some(rest) = item.strip_prefix("#[") {
                item = rest.split_once(']').map_or("", |(_, after)| after).trim();
            }
            let item = item
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ");
            if let Some(name) = item.strip_prefix("mod ").and_then(|n| n.strip_suffix(';')) {
                paths.insert(dir.join(format!("{}.rs", name.trim())));
                paths.insert(dir.join(name.trim()));
            }
        }
    }
    paths
}

fn rust_files(dir: &Path, excluded: &BTreeSet<PathBuf>) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if excluded.contains(&path) {
            continue;
        }
        if path.is_dir() {
            files.extend(rust_files(&path, excluded));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files
}

/// The code of a file without its `#[cfg(test)]` items.
fn non_test_code(text: &str) -> String {
    let mut code = String::with_capacity(text.len());
    let mut from = 0;
    for (start, end) in test_items(text) {
        code.push_str(&text[from..start]);
        from = end;
    }
    code.push_str(&text[from..]);
    code
}

/// Attributes that make an item test code: the crate's own tests, and the fixture builders it
/// lends other crates' tests through the `testing` feature.
const TEST_ATTRIBUTES: [&str; 2] = ["#[cfg(test)]", "#[cfg(any(test, feature = \"testing\"))]"];

/// The byte ranges of every `#[cfg(test)]` item of `text` that starts a line: from the
/// attribute to the `;` or the closing `}` that ends the item.
fn test_items(text: &str) -> Vec<(usize, usize)> {
    let mut items = Vec::new();
    let mut at = 0;
    while let Some((start, attribute)) = TEST_ATTRIBUTES
        .iter()
        .filter_map(|attribute| Some((at + text[at..].find(attribute)?, attribute.len())))
        .min()
    {
        let line_start = text[..start].rfind('\n').map_or(0, |newline| newline + 1);
        if !text[line_start..start].trim().is_empty() {
            at = start + attribute;
            continue;
        }
        let end = item_end(text, start + attribute);
        items.push((line_start, end));
        at = end;
    }
    items
}

/// Where the item that starts at `start` ends: just past the first `;` outside brackets, or
/// the `}` that closes its first `{`. Strings, characters and comments are skipped.
fn item_end(text: &str, start: usize) -> usize {
    let chars: Vec<(usize, char)> = text[start..].char_indices().collect();
    let at = |index: usize| chars.get(index).map(|&(_, c)| c);
    let (mut braces, mut brackets) = (0usize, 0usize);
    let mut index = 0;
    while let Some(c) = at(index) {
        match c {
            '/' if at(index + 1) == Some('/') => {
                while at(index).is_some_and(|c| c != '\n') {
                    index += 1;
                }
            }
            '/' if at(index + 1) == Some('*') => {
                index += 2;
                while at(index).is_some() && !(at(index) == Some('*') && at(index + 1) == Some('/'))
                {
                    index += 1;
                }
                index += 1;
            }
            'r' if matches!(at(index + 1), Some('"' | '#'))
                && !index
                    .checked_sub(1)
                    .and_then(at)
                    .is_some_and(|c| c.is_alphanumeric() && c != 'b' || c == '_') =>
            {
                let mut hashes = 0;
                index += 1;
                while at(index) == Some('#') {
                    hashes += 1;
                    index += 1;
                }
                if at(index) == Some('"') {
                    index += 1;
                    loop {
                        match at(index) {
                            None => break,
                            Some('"') if (1..=hashes).all(|n| at(index + n) == Some('#')) => {
                                index += hashes;
                                break;
                            }
                            _ => index += 1,
                        }
                    }
                }
            }
            '"' => {
                index += 1;
                while let Some(c) = at(index) {
                    match c {
                        '\\' => index += 2,
                        '"' => break,
                        _ => index += 1,
                    }
                }
            }
            '\'' => {
                // A character literal ('x', '\n', '\u{7f}'), or a lifetime ('a), left as is.
                if at(index + 1) == Some('\\') {
                    index += 2;
                    while at(index).is_some_and(|c| c != '\'') {
                        index += 1;
                    }
                } else if at(index + 2) == Some('\'') {
                    index += 2;
                }
            }
            '(' | '[' => brackets += 1,
            ')' | ']' => brackets = brackets.saturating_sub(1),
            '{' => braces += 1,
            '}' => {
                braces = braces.saturating_sub(1);
                if braces == 0 {
                    return start + chars[index].0 + 1;
                }
            }
            ';' if braces == 0 && brackets == 0 => return start + chars[index].0 + 1,
            _ => {}
        }
        index += 1;
    }
    text.len()
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
            names.extend(group_or_name(rest));
        }
    }
    names
}

fn identifier(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// A Python package's modules (`__init__` for the package itself) and their module-level
/// imports of one another.
struct PythonPackage {
    name: &'static str,
    /// Each module's source.
    modules: BTreeMap<String, String>,
    /// Modules of the package that are no Python file: its native extension.
    native: BTreeSet<String>,
}

impl PythonPackage {
    /// The package `name` whose files are `dir/*.py`, with the native extension that
    /// `extension` (the Rust crate's `lib.rs`) declares with `#[pymodule]`.
    fn read(name: &'static str, dir: &str, extension: &str) -> PythonPackage {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut modules = BTreeMap::new();
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|ext| ext == "py") {
                let module = path.file_stem().unwrap().to_string_lossy().into_owned();
                modules.insert(module, std::fs::read_to_string(&path).unwrap());
            }
        }
        let lib = std::fs::read_to_string(root.join(extension)).unwrap();
        let native = lib
            .split("#[pymodule]")
            .skip(1)
            .filter_map(|after| after.trim_start().strip_prefix("fn "))
            .map(identifier)
            .collect();
        PythonPackage {
            name,
            modules,
            native,
        }
    }

    /// Each module and the modules of the package it imports at module level.
    fn imports(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut graph = BTreeMap::new();
        for (module, text) in &self.modules {
            let mut used = BTreeSet::new();
            for statement in module_level_imports(text) {
                for target in self.targets(&statement) {
                    if &target != module {
                        used.insert(target);
                    }
                }
            }
            graph.insert(module.clone(), used);
        }
        graph
    }

    /// The modules of the package that one import statement imports.
    fn targets(&self, statement: &str) -> Vec<String> {
        let absolute = format!("{}.", self.name);
        let words: Vec<&str> = statement.split_whitespace().collect();
        match words.as_slice() {
            ["import", ..] => statement["import".len()..]
                .split(',')
                .filter_map(|item| item.split_whitespace().next())
                .filter_map(|dotted| {
                    if dotted == self.name {
                        return Some("__init__".to_owned());
                    }
                    let inner = dotted.strip_prefix(&absolute)?;
                    Some(inner.split('.').next().unwrap().to_owned())
                })
                .collect(),
            ["from", from, "import", ..] => {
                let names = statement.split_once(" import ").unwrap().1;
                let names = names.trim().trim_start_matches('(').trim_end_matches(')');
                let names = names
                    .split(',')
                    .filter_map(|item| item.split_whitespace().next());
                if *from == "." || *from == self.name {
                    // `from . import x`: the module `x`, or a name the package itself binds.
                    names
                        .filter(|name| !self.native.contains(*name))
                        .map(|name| match self.modules.contains_key(name) {
                            true => name.to_owned(),
                            false => "__init__".to_owned(),
                        })
                        .collect()
                } else if let Some(inner) = from
                    .strip_prefix('.')
                    .filter(|inner| !inner.starts_with('.'))
                    .or_else(|| from.strip_prefix(&absolute))
                {
                    let module = inner.split('.').next().unwrap();
                    match self.native.contains(module) {
                        true => Vec::new(),
                        false => vec![module.to_owned()],
                    }
                } else {
                    Vec::new()
                }
            }
            _ => Vec::new(),
        }
    }

    fn circles(&self) -> Vec<String> {
        circles(&format!("python package {}", self.name), &self.imports())
    }
}

/// The import statements of a Python module that run when it is imported: every `import` or
/// `from … import` outside a function body (class bodies, `if` and `try` blocks count) and
/// outside triple-quoted strings, each joined onto one line.
fn module_level_imports(text: &str) -> Vec<String> {
    let mut statements = Vec::new();
    // The indentation of the `def` whose body the lines are in, if any.
    let mut function: Option<usize> = None;
    let mut in_string: Option<&str> = None;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if let Some(quote) = in_string {
            if line.matches(quote).count() % 2 == 1 {
                in_string = None;
            }
            continue;
        }
        let code = line.trim_start();
        if code.is_empty() || code.starts_with('#') {
            continue;
        }
        let indent = line.len() - code.len();
        if function.is_some_and(|def| indent <= def) {
            function = None;
        }
        for quote in ["\"\"\"", "'''"] {
            if code.matches(quote).count() % 2 == 1 {
                in_string = Some(quote);
            }
        }
        if function.is_some() {
            continue;
        }
        if code.starts_with("def ") || code.starts_with("async def ") {
            function = Some(indent);
        } else if code.starts_with("import ") || code.starts_with("from ") {
            let mut statement = code.split('#').next().unwrap().trim_end().to_owned();
            // Continued in parentheses or after a backslash.
            while statement.ends_with('\\')
                || statement.matches('(').count() > statement.matches(')').count()
            {
                let Some(next) = lines.next() else { break };
                statement = statement.trim_end_matches('\\').to_owned();
                statement.push(' ');
                statement.push_str(next.split('#').next().unwrap().trim());
            }
            statements.push(statement);
        }
    }
    statements
}

fn python_package() -> PythonPackage {
    PythonPackage::read("kwheel", "python/kwheel", "python/src/lib.rs")
}

fn cli() -> CrateSources {
    CrateSources::read("kwheel", "../src")
}

fn prebuilt() -> CrateSources {
    CrateSources::read("prebuilt", "src")
}

fn python_module() -> CrateSources {
    CrateSources::read("kwheel-python", "python/src")
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    for sources in [prebuilt(), python_module()] {
        let circles = sources.circles();
        assert!(circles.is_empty(), "import circles: {circles:?}");
    }
}

#[test]
fn no_module_of_the_python_package_imports_one_that_imports_it_back() {
    let package = python_package();
    // The package was read: its modules, its extension, and the imports of `kwheel.torch`
    // and of its ops' module.
    assert!(["__init__", "build", "torch", "_torch_op"]
        .iter()
        .all(|module| package.modules.contains_key(*module)));
    assert!(package.native.contains("_kwheel"));
    assert!(package.imports()["torch"].contains("_torch_op"));
    assert!(package.imports()["_torch_op"].contains("__init__"));
    let circles = package.circles();
    assert!(circles.is_empty(), "import circles: {circles:?}");
}

#[test]
fn the_python_scanner_reads_each_import_form_and_leaves_lazy_ones_out() {
    let text = r#""""Doc.

    import kwheel.b
"""
import os
import kwheel.a as _a, kwheel
from . import b, _native, helper
from .c import (
    x,  # why
    y,
)
from kwheel.d.inner import z
try:
    from .e import w
except ImportError:
    pass
class K:
    from .f import v
def lazy():
    from .g import u

    return u
from .h import \
    t
import torch
"#;
    let mut package = PythonPackage {
        name: "kwheel",
        modules: ["a", "b", "c", "d", "e", "f", "g", "h"]
            .map(|name| (name.to_owned(), String::new()))
            .into(),
        native: BTreeSet::from(["_native".to_owned()]),
    };
    package.modules.insert("m".to_owned(), text.to_owned());
    let graph = package.imports();
    let found: Vec<&str> = graph["m"].iter().map(String::as_str).collect();
    assert_eq!(found, ["__init__", "a", "b", "c", "d", "e", "f", "h"]);
    assert!(package.circles().is_empty());
    // A circle through the package itself is found.
    package
        .modules
        .insert("__init__".to_owned(), "from .m import t\n".to_owned());
    assert_eq!(
        package.circles(),
        ["python package kwheel: __init__ → m → __init__"]
    );
}

#[test]
fn the_build_crates_and_the_cli_have_only_the_known_circles() {
    let circles: Vec<String> = [
        CrateSources::read("bundler", "../bundler/src"),
        CrateSources::read("release", "../release/src"),
        cli(),
    ]
    .iter()
    .flat_map(CrateSources::circles)
    .collect();
    assert_eq!(
        circles, KNOWN_CIRCLES,
        "import circles of bundler, release and the CLI: break a new one; take a broken one \
         off KNOWN_CIRCLES in prebuilt/src/layering.rs"
    );
}

#[test]
fn selection_imports_only_the_index_the_targets_and_the_device() {
    let graph = prebuilt().imports();
    let allowed: BTreeSet<String> = ["index", "target", "device"].map(String::from).into();
    let extra: Vec<&String> = graph["select"].difference(&allowed).collect();
    assert!(extra.is_empty(), "select imports {extra:?}");
}

#[test]
fn no_file_runs_past_800_lines_without_its_tests() {
    for sources in [
        prebuilt(),
        python_module(),
        CrateSources::read("bundler", "../bundler/src"),
        CrateSources::read("release", "../release/src"),
        cli(),
    ] {
        let long = sources.long_files();
        assert!(long.is_empty(), "{long:?}");
    }
}

#[test]
fn test_modules_are_found_and_nothing_else_is() {
    let sources = prebuilt();
    // The registry's load-order tests are a file of their own, declared at the top.
    assert!(sources.modules["registry"]
        .iter()
        .all(|file| !file.ends_with("load_order.rs")));
    assert!(sources.modules["registry"]
        .iter()
        .any(|file| file.ends_with("registry/mod.rs")));
    assert!(!sources.modules.contains_key("testing") && !sources.modules.contains_key("layering"));
    let text = "use a;\n#[cfg(test)]\nmod load_order;\nuse crate::b;\n\
                #[cfg(test)]\nfn helper() -> [u8; 2] { let s = \"}\"; let c = '}'; [0; 2] }\n\
                fn kept<'a>(x: &'a str) {}\n\
                #[cfg(test)]\nmod tests {\n    use crate::c;\n    const R: &str = r#\"}\"#;\n}\n\
                fn after() { crate::d::f(); }\n";
    let code = non_test_code(text);
    assert_eq!(
        code,
        "use a;\n\nuse crate::b;\n\nfn kept<'a>(x: &'a str) {}\n\nfn after() { crate::d::f(); }\n"
    );
    let names: Vec<String> = crate_paths(&code).into_iter().collect();
    assert_eq!(names, ["b", "d"]);
    // `super::` that climbs to the root names a top-level module; one that stops short does not.
    let code = "use super::{a, b::c};\nlet x = super::super::d::f();\n// super::e\n";
    let at_depth =
        |depth| -> Vec<String> { root_paths_through_super(code, depth).into_iter().collect() };
    assert_eq!(at_depth(1), ["a", "b"]);
    assert_eq!(at_depth(2), ["d"]);
    let src = Path::new("/c/src");
    assert_eq!(module_depth(src, &src.join("a.rs")), 1);
    assert_eq!(module_depth(src, &src.join("a/mod.rs")), 1);
    assert_eq!(module_depth(src, &src.join("a/b.rs")), 2);
}

#[test]
fn the_scanner_sees_grouped_and_plain_paths() {
    let code = "use crate::{index::Index, target};\n// crate::commented\nlet x = crate::key::sha256_hex(b);";
    let names: Vec<String> = crate_paths(code).into_iter().collect();
    assert_eq!(names, ["index", "key", "target"]);
}
