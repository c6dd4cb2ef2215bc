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
//! | `bundler`, `release` | `../bundler/src`, `../release/src` | circles and long files, against the lists below of those known today |

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Circles the `bundler` and `release` crates have today, `a → b → a`: this test fails when
/// one is added, and when one is gone (so the list is kept true).
const KNOWN_CIRCLES: [&str; 0] = [];

/// One crate's sources: each top-level module and its non-test files.
struct CrateSources {
    name: &'static str,
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
        CrateSources { name, modules }
    }

    /// Each top-level module and the top-level modules its non-test code names through
    /// `crate::`.
    fn imports(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut graph = BTreeMap::new();
        for (module, files) in &self.modules {
            let mut used = BTreeSet::new();
            for file in files {
                let text = std::fs::read_to_string(file).unwrap();
                for name in crate_paths(&non_test_code(&text)) {
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
        let graph = self.imports();
        let mut circles = BTreeSet::new();
        for start in graph.keys() {
            // Depth-first search for a path from `start` back to itself through modules that
            // sort after it, so that each circle is found from its smallest module only.
            let mut stack: Vec<Vec<&str>> = vec![vec![start.as_str()]];
            let mut seen = BTreeSet::new();
            while let Some(path) = stack.pop() {
                let last = *path.last().unwrap();
                for next in &graph[last] {
                    if next == start {
                        circles.insert(format!("{}: {} → {start}", self.name, path.join(" → ")));
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
fn the_build_crates_have_only_the_known_circles() {
    let circles: Vec<String> = [
        CrateSources::read("bundler", "../bundler/src"),
        CrateSources::read("release", "../release/src"),
    ]
    .iter()
    .flat_map(CrateSources::circles)
    .collect();
    assert_eq!(
        circles, KNOWN_CIRCLES,
        "import circles of bundler and release: break a new one; take a broken one off \
         KNOWN_CIRCLES in prebuilt/src/layering.rs"
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
    for sources in [prebuilt(), python_module()] {
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
}

#[test]
fn the_build_crates_long_files_are_reported() {
    // Not a floor of this crate's: listed so that a reader of the test output sees them.
    for sources in [
        CrateSources::read("bundler", "../bundler/src"),
        CrateSources::read("release", "../release/src"),
    ] {
        for file in sources.long_files() {
            eprintln!("{}: over 800 lines without its tests: {file}", sources.name);
        }
    }
}

#[test]
fn the_scanner_sees_grouped_and_plain_paths() {
    let code = "use crate::{index::Index, target};\n// crate::commented\nlet x = crate::key::sha256_hex(b);";
    let names: Vec<String> = crate_paths(code).into_iter().collect();
    assert_eq!(names, ["index", "key", "target"]);
}
