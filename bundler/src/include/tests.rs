use std::fs;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::lex::*;
use super::*;

use tempfile::TempDir;

/// A tree of files in a fresh temporary directory.
fn tree(files: &[(&str, &str)]) -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_files(dir.path(), files);
    dir
}

fn write_files(base: &Path, files: &[(&str, &str)]) {
    for (path, content) in files {
        let path = base.join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }
}

fn roots(root: &Path, include_dirs: &[&str]) -> ScanRoots {
    ScanRoots {
        root: root.to_owned(),
        include_dirs: include_dirs.iter().map(|dir| root.join(dir)).collect(),
        external_dirs: Vec::new(),
    }
}

fn scan(root: &Path, include_dirs: &[&str], sources: &[&str]) -> Result<IncludeGraph, ScanError> {
    let sources: Vec<PathBuf> = sources.iter().map(|source| root.join(source)).collect();
    scan_includes(&sources, &roots(root, include_dirs))
}

fn file_names(graph: &IncludeGraph) -> Vec<&str> {
    graph.files().keys().map(String::as_str).collect()
}

fn externals(graph: &IncludeGraph) -> Vec<&str> {
    graph.externals().iter().map(String::as_str).collect()
}

fn includes(source: &str) -> Vec<(IncludeKind, String, u32)> {
    let mut out = Directives::default();
    find_includes(source.as_bytes(), &mut out).unwrap();
    out.includes
        .into_iter()
        .map(|include| (include.kind, include.name, include.line))
        .collect()
}

fn names(source: &str) -> Vec<String> {
    includes(source)
        .into_iter()
        .map(|(_, name, _)| name)
        .collect()
}

#[test]
fn quoted_include_prefers_the_includers_directory() {
    let dir = tree(&[
        ("kernels/a.cu", "#include \"common.cuh\"\n"),
        ("kernels/common.cuh", "// next to the kernel\n"),
        ("include/common.cuh", "// in the include dir\n"),
    ]);
    let graph = scan(dir.path(), &["include"], &["kernels/a.cu"]).unwrap();
    assert_eq!(file_names(&graph), ["kernels/a.cu", "kernels/common.cuh"]);
}

#[test]
fn include_dirs_are_searched_in_order() {
    let dir = tree(&[
        ("kernels/a.cu", "#include \"x.cuh\"\n#include <y.cuh>\n"),
        ("first/x.cuh", ""),
        ("first/y.cuh", ""),
        ("second/x.cuh", ""),
        ("second/y.cuh", ""),
    ]);
    let graph = scan(dir.path(), &["first", "second"], &["kernels/a.cu"]).unwrap();
    assert_eq!(
        file_names(&graph),
        ["first/x.cuh", "first/y.cuh", "kernels/a.cu"]
    );
    let graph = scan(dir.path(), &["second", "first"], &["kernels/a.cu"]).unwrap();
    assert_eq!(
        file_names(&graph),
        ["kernels/a.cu", "second/x.cuh", "second/y.cuh"]
    );
}

#[test]
fn angle_include_is_found_in_an_include_dir() {
    let dir = tree(&[
        ("kernels/a.cu", "#include <af3/x.cuh>\n"),
        (
            "kernels/af3/x.cuh",
            "// angle includes skip the includer's directory\n",
        ),
        ("include/af3/x.cuh", ""),
    ]);
    let graph = scan(dir.path(), &["include"], &["kernels/a.cu"]).unwrap();
    assert_eq!(file_names(&graph), ["include/af3/x.cuh", "kernels/a.cu"]);
    assert!(graph.externals().is_empty());
}

#[test]
fn angle_include_of_an_unknown_header_is_a_system_header() {
    let dir = tree(&[(
        "kernels/a.cu",
        "#include <vector>\n#include <cuda/std/cstdint>\n",
    )]);
    let graph = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap();
    assert_eq!(file_names(&graph), ["kernels/a.cu"]);
    assert_eq!(externals(&graph), ["cuda/std/cstdint", "vector"]);
}

#[test]
fn library_file_reached_through_a_toolkit_header_is_hashed() {
    let dir = tree(&[
        ("kernels/a.cu", "#include <cuda/std/utility>\n"),
        (
            "toolkit/include/cuda/std/utility",
            "#include <cuda/std/detail/__config>\n#include \"detail/own.h\"\n\
             #include MACRO_THE_TOOLKIT_USES\n",
        ),
        (
            "toolkit/include/cuda/std/detail/own.h",
            "#include <vendor_hook.h>\n",
        ),
        ("toolkit/include/cuda/std/detail/__config", ""),
        (
            "include/cuda/std/detail/__config",
            "#include_next <cuda/std/detail/__config>\n",
        ),
        ("include/vendor_hook.h", ""),
    ]);
    let mut roots = roots(dir.path(), &["include"]);
    roots.external_dirs = vec![dir.path().join("toolkit/include")];
    let graph = scan_includes(&[dir.path().join("kernels/a.cu")], &roots).unwrap();
    assert_eq!(
        file_names(&graph),
        [
            "include/cuda/std/detail/__config",
            "include/vendor_hook.h",
            "kernels/a.cu"
        ]
    );
    // The library's `__config` continues into the toolkit's with `#include_next`.
    assert_eq!(
        externals(&graph),
        ["cuda/std/detail/__config", "cuda/std/utility"]
    );
    assert!(graph.render_tree().contains("include/vendor_hook.h"));
}

#[test]
fn quoted_include_found_only_in_an_external_dir_is_external() {
    let dir = tree(&[
        ("kernels/a.cu", "#include \"cuda_fp16.h\"\n"),
        ("toolkit/include/cuda_fp16.h", "#include \"not_here.h\"\n"),
    ]);
    let mut roots = roots(dir.path(), &[]);
    roots.external_dirs = vec![dir.path().join("toolkit/include")];
    let graph = scan_includes(&[dir.path().join("kernels/a.cu")], &roots).unwrap();
    assert_eq!(file_names(&graph), ["kernels/a.cu"]);
    assert_eq!(externals(&graph), ["cuda_fp16.h"]);

    roots.external_dirs.clear();
    let error = scan_includes(&[dir.path().join("kernels/a.cu")], &roots).unwrap_err();
    assert!(matches!(error, ScanError::MissingHeader { .. }), "{error}");
}

#[test]
fn include_inside_if_zero_is_taken() {
    let dir = tree(&[
        (
            "kernels/a.cu",
            "#if 0\n#include \"dead.cuh\"\n#else\n#include \"live.cuh\"\n#endif\n\
             #ifdef NEVER_DEFINED\n  #  include <other/x.cuh>\n#endif\n",
        ),
        ("kernels/dead.cuh", ""),
        ("kernels/live.cuh", ""),
    ]);
    let graph = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap();
    assert_eq!(
        file_names(&graph),
        ["kernels/a.cu", "kernels/dead.cuh", "kernels/live.cuh"]
    );
    assert_eq!(externals(&graph), ["other/x.cuh"]);
}

#[test]
fn includes_in_comments_are_not_taken() {
    let dir = tree(&[
        (
            "kernels/a.cu",
            "/* a block comment\n#include \"missing1.cuh\"\n   */ int x;\n\
             // #include \"missing2.cuh\"\n\
             int y; // continued \\\n#include \"missing3.cuh\"\n\
             int z; /* opens\n#include \"missing4.cuh\"\n*/\n\
             /* before the hash */ #include \"real.cuh\"\n",
        ),
        ("kernels/real.cuh", ""),
    ]);
    let graph = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap();
    assert_eq!(file_names(&graph), ["kernels/a.cu", "kernels/real.cuh"]);
}

#[test]
fn includes_in_string_literals_are_not_taken() {
    let source = "const char* a = \"/*\";\n#include \"one.cuh\"\n\
                  const char* b = \"\\\"/*\";\n#include \"two.cuh\"\n\
                  char c = '\"';\n#include \"three.cuh\"\n\
                  int d = 0x1'ff; /* opens\n#include \"not0.cuh\"\n*/\n#include \"four.cuh\"\n\
                  const char* e = R\"x(\n)y\"\n#include \"not1.cuh\"\n)\" )x\";\n\
                  const char* f = u8R\"(\n#include \"not2.cuh\"\n)\";\n\
                  #include <five.cuh>\n\
                  auto g = u8'a'; auto h = L'/';\n#include \"six.cuh\"\n";
    assert_eq!(
        names(source),
        [
            "one.cuh",
            "two.cuh",
            "three.cuh",
            "four.cuh",
            "five.cuh",
            "six.cuh"
        ]
    );
}

#[test]
fn directive_spellings() {
    let source = "#include\"a.h\"\n  #  include <b.h>\n\t#\tinclude\t\"c.h\"\r\n\
                  # /* c */ include /* c */ <d.h> // trailing\n\
                  #include_next <e.h>\n#import \"f.h\"\n#includes \"g.h\"\n\
                  #if __has_include(\"h.h\") && __has_include(<i.h>)\n#endif\n\
                  #define S(x) #x\nx # include \"j.h\"\n#include <a/*b.h>\n#include \"k.h\"\n";
    assert_eq!(
        includes(source),
        [
            (IncludeKind::Quoted, "a.h".to_owned(), 1),
            (IncludeKind::Angle, "b.h".to_owned(), 2),
            (IncludeKind::Quoted, "c.h".to_owned(), 3),
            (IncludeKind::Angle, "d.h".to_owned(), 4),
            (IncludeKind::Next, "e.h".to_owned(), 5),
            (IncludeKind::Angle, "a/*b.h".to_owned(), 12),
            (IncludeKind::Quoted, "k.h".to_owned(), 13),
        ]
    );
}

#[test]
fn line_continuations() {
    let source = "#define INCLUDE_IT \\\n#include \"not_a_directive.h\"\n\
                  #  include \\\n  \"continued.h\"\n\
                  # inc\\\nlude <split_keyword.h>\n\
                  #include \"split\\\n_name.h\"\n\
                  #define LONG a \\  \n  b \\\r\n#include \"also_not.h\"\n\
                  #include <after.h>\n";
    assert_eq!(
        includes(source),
        [
            (IncludeKind::Quoted, "continued.h".to_owned(), 3),
            (IncludeKind::Angle, "split_keyword.h".to_owned(), 5),
            (IncludeKind::Quoted, "split_name.h".to_owned(), 7),
            (IncludeKind::Angle, "after.h".to_owned(), 12),
        ]
    );
}

#[test]
fn line_continuation_in_a_scanned_tree() {
    let dir = tree(&[
        (
            "kernels/a.cu",
            "#define X \\\n#include \"missing.cuh\"\n#include \\\n  \"real.cuh\"\n",
        ),
        ("kernels/real.cuh", ""),
    ]);
    let graph = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap();
    assert_eq!(file_names(&graph), ["kernels/a.cu", "kernels/real.cuh"]);
}

#[test]
fn computed_include_is_refused_with_its_location() {
    let dir = tree(&[(
        "kernels/a.cu",
        "// one\n// two\n#include <vector>\n\n/* five\nsix */\n#include KERNEL_HEADER\n",
    )]);
    let error = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap_err();
    match &error {
        ScanError::ComputedInclude { location, text } => {
            assert_eq!(location, "kernels/a.cu:7");
            assert_eq!(text, "#include KERNEL_HEADER");
        }
        other => panic!("unexpected error: {other}"),
    }
    assert_eq!(
        error.to_string(),
        "computed include `#include KERNEL_HEADER` at kernels/a.cu:7 is not supported: \
         include the header by name"
    );
}

#[test]
fn header_macros_are_recognized() {
    let mut out = Directives::default();
    let source = "#define STD(header) <cuda/std/header>\n\
                  #  define PAIR( a , b ) <a/b.hpp> // two\n#define WORD(h) <h/hh.h>\n\
                  #define LOCAL \"kernels/impl.cuh\" /* why */\n\
                  #define EMPTY\n#define SUM(a, b) ((a) + (b))\n#define VARIADIC(...) <x.h>\n\
                  #define TRAILING <x.h> extra\n#include STD(cstdint)\n#include LOCAL\n";
    find_includes(source.as_bytes(), &mut out).unwrap();
    let defines: Vec<(&str, Option<String>)> = out
        .defines
        .iter()
        .map(|define| {
            let expansion = define.header.as_ref().and_then(|header| {
                let args = header
                    .params
                    .as_ref()
                    .map(|params| params.iter().map(|p| format!("<{p}>")).collect::<Vec<_>>());
                header.expand(args.as_deref())
            });
            (define.name.as_str(), expansion)
        })
        .collect();
    assert_eq!(
        defines,
        [
            ("STD", Some("cuda/std/<header>".to_owned())),
            ("PAIR", Some("<a>/<b>.hpp".to_owned())),
            ("WORD", Some("<h>/hh.<h>".to_owned())),
            ("LOCAL", Some("kernels/impl.cuh".to_owned())),
            ("EMPTY", None),
            ("SUM", None),
            ("VARIADIC", None),
            ("TRAILING", None),
        ]
    );
    let pair = out.defines[1].header.as_ref().unwrap();
    let args = ["cute".to_owned(), "tensor".to_owned()];
    assert_eq!(pair.expand(Some(&args)).as_deref(), Some("cute/tensor.hpp"));
    assert_eq!(pair.expand(Some(&args[..1])), None);
    assert_eq!(pair.expand(None), None);
    assert_eq!(
        out.macro_includes,
        [
            MacroInclude {
                line: 9,
                text: "#include STD(cstdint)".to_owned(),
                name: "STD".to_owned(),
                args: Some(vec!["cstdint".to_owned()]),
            },
            MacroInclude {
                line: 10,
                text: "#include LOCAL".to_owned(),
                name: "LOCAL".to_owned(),
                args: None,
            },
        ]
    );
}

#[test]
fn include_through_a_macro_naming_external_headers_is_taken() {
    // CUTLASS 4 spells its standard headers this way.
    let dir = tree(&[
        (
            "kernels/a.cu",
            "#include \"config.cuh\"\n#include CUDA_STD_HEADER(cstdint)\n",
        ),
        (
            "kernels/config.cuh",
            "#include \"prefix.cuh\"\n#if !defined(CCCL_PREFIX)\n\
             #  define CUDA_STD_HEADER(header) <cuda/std/header>\n#endif\n",
        ),
        // Scanned after the include that uses its definition.
        (
            "kernels/prefix.cuh",
            "#define CUDA_STD_HEADER(header) <cccl/cuda/std/header>\n",
        ),
    ]);
    let graph = scan(dir.path(), &["include"], &["kernels/a.cu"]).unwrap();
    assert_eq!(
        file_names(&graph),
        ["kernels/a.cu", "kernels/config.cuh", "kernels/prefix.cuh"]
    );
    assert_eq!(
        externals(&graph),
        ["cccl/cuda/std/cstdint", "cuda/std/cstdint"]
    );
    assert_eq!(
        graph.render_tree(),
        "\
kernels/a.cu
├── kernels/config.cuh
│   └── kernels/prefix.cuh
├── cuda/std/cstdint (external)
└── cccl/cuda/std/cstdint (external)
"
    );
}

#[test]
fn include_through_a_macro_that_could_name_a_local_file_is_refused() {
    let cases = [
        // A quoted header: its content would be part of the key.
        "#define KERNEL_IMPL \"impl.cuh\"\n",
        // An angle header found in an include dir.
        "#define KERNEL_IMPL <af3/impl.cuh>\n",
        // One definition that is not a header name at all.
        "#ifdef A\n#define KERNEL_IMPL <cuda/std/cstdint>\n#else\n#define KERNEL_IMPL PICK(b)\n#endif\n",
    ];
    for config in cases {
        let dir = tree(&[
            (
                "kernels/a.cu",
                "#include \"config.cuh\"\n#include KERNEL_IMPL\n",
            ),
            ("kernels/config.cuh", config),
            ("kernels/impl.cuh", ""),
            ("include/af3/impl.cuh", ""),
        ]);
        let error = scan(dir.path(), &["include"], &["kernels/a.cu"]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "computed include `#include KERNEL_IMPL` at kernels/a.cu:2 is not supported: \
             include the header by name",
            "{config}"
        );
    }
}

#[test]
fn malformed_include_is_refused() {
    let dir = tree(&[("kernels/a.cu", "\n#include <vector\n")]);
    let error = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap_err();
    assert_eq!(
        error.to_string(),
        "malformed include `#include <vector` at kernels/a.cu:2: expected `\"header\"` or `<header>`"
    );
}

#[test]
fn missing_header_names_the_include_chain() {
    let dir = tree(&[
        ("kernels/a.cu", "#include <af3/x.cuh>\n"),
        ("include/af3/x.cuh", "#pragma once\n#include \"y.cuh\"\n"),
        (
            "include/af3/y.cuh",
            "#pragma once\n\n#include \"missing.cuh\"\n",
        ),
    ]);
    let error = scan(dir.path(), &["include"], &["kernels/a.cu"]).unwrap_err();
    let ScanError::MissingHeader {
        header,
        location,
        chain,
        searched,
    } = &error
    else {
        panic!("unexpected error: {error}");
    };
    assert_eq!(header, "missing.cuh");
    assert_eq!(location, "include/af3/y.cuh:3");
    assert_eq!(
        chain,
        &["kernels/a.cu", "include/af3/x.cuh", "include/af3/y.cuh"]
    );
    assert_eq!(
        searched,
        &[dir.path().join("include/af3"), dir.path().join("include")]
    );
    assert_eq!(
        error.to_string(),
        format!(
            "header \"missing.cuh\" not found: kernels/a.cu → include/af3/x.cuh → \
             include/af3/y.cuh:3 → \"missing.cuh\"; searched {}, {}",
            dir.path().join("include/af3").display(),
            dir.path().join("include").display()
        )
    );
}

#[test]
fn include_cycles_terminate() {
    for guard in ["", "#pragma once\n"] {
        let dir = tree(&[
            ("kernels/a.cu", "#include \"a.cuh\"\n"),
            ("kernels/a.cuh", &format!("{guard}#include \"b.cuh\"\n")),
            (
                "kernels/b.cuh",
                &format!("{guard}#include \"a.cuh\"\n#include \"b.cuh\"\n"),
            ),
        ]);
        let graph = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap();
        assert_eq!(
            file_names(&graph),
            ["kernels/a.cu", "kernels/a.cuh", "kernels/b.cuh"]
        );
        assert_eq!(
            graph.render_tree(),
            "kernels/a.cu\n\
             └── kernels/a.cuh\n    \
                 └── kernels/b.cuh\n        \
                     ├── kernels/a.cuh (already shown)\n        \
                     └── kernels/b.cuh (already shown)\n"
        );
    }
}

#[test]
fn files_outside_the_root_are_named_by_include_dir() {
    let dir = tree(&[(
        "kernels/a.cu",
        "#include <cute/tensor.hpp>\n#include \"local.cuh\"\n",
    )]);
    write_files(dir.path(), &[("kernels/local.cuh", "")]);
    let first = tree(&[("unused.h", "")]);
    let vendor = tree(&[
        (
            "cute/tensor.hpp",
            "#include \"layout.hpp\"\n#include \"../cute/layout.hpp\"\n",
        ),
        ("cute/layout.hpp", ""),
    ]);
    let roots = ScanRoots {
        root: dir.path().to_owned(),
        include_dirs: vec![first.path().to_owned(), vendor.path().to_owned()],
        external_dirs: Vec::new(),
    };
    let graph = scan_includes(&[dir.path().join("kernels/a.cu")], &roots).unwrap();
    assert_eq!(
        file_names(&graph),
        [
            "[1]/cute/layout.hpp",
            "[1]/cute/tensor.hpp",
            "kernels/a.cu",
            "kernels/local.cuh"
        ]
    );
    assert_eq!(
        graph.absolute_path("[1]/cute/layout.hpp"),
        Some(
            fs::canonicalize(vendor.path().join("cute/layout.hpp"))
                .unwrap()
                .as_path()
        )
    );
    assert_eq!(graph.absolute_path("cute/layout.hpp"), None);
}

#[test]
fn a_file_outside_every_root_is_refused() {
    let dir = tree(&[
        ("project/kernels/a.cu", "#include \"../../elsewhere.cuh\"\n"),
        ("elsewhere.cuh", ""),
    ]);
    let root = dir.path().join("project");
    let error = scan(&root, &[], &["kernels/a.cu"]).unwrap_err();
    assert!(matches!(error, ScanError::OutsideRoots { .. }), "{error}");
    assert!(
        error.to_string().contains("(included at kernels/a.cu:1)"),
        "{error}"
    );
}

#[test]
fn a_symlink_under_the_root_keeps_its_name_under_the_root() {
    let dir = tree(&[("kernels/a.cu", "#include \"../third_party/lib/x.cuh\"\n")]);
    let elsewhere = tree(&[("x.cuh", "#include \"y.cuh\"\n"), ("y.cuh", "")]);
    fs::create_dir(dir.path().join("third_party")).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("third_party/lib")).unwrap();
    let graph = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap();
    assert_eq!(
        file_names(&graph),
        [
            "kernels/a.cu",
            "third_party/lib/x.cuh",
            "third_party/lib/y.cuh"
        ]
    );
}

#[test]
fn paths_are_normalized_and_files_deduplicated() {
    let dir = tree(&[
        (
            "kernels/a.cu",
            "#include \"../include/./af3/../af3/x.cuh\"\n#include <af3/x.cuh>\n\
             #include \"sub/../b.cuh\"\n#include \"no_such_dir/../c.cuh\"\n",
        ),
        ("kernels/sub/.keep", ""),
        ("kernels/c.cuh", ""),
        ("kernels/b.cuh", ""),
        ("include/af3/x.cuh", ""),
    ]);
    let graph = scan(
        dir.path(),
        &["include/../include"],
        &["kernels/a.cu", "kernels/../kernels/a.cu"],
    )
    .unwrap();
    assert_eq!(
        file_names(&graph),
        [
            "include/af3/x.cuh",
            "kernels/a.cu",
            "kernels/b.cuh",
            "kernels/c.cuh"
        ]
    );
}

#[test]
fn include_next_continues_after_the_includers_dir() {
    let dir = tree(&[
        ("kernels/a.cu", "#include <wrap.h>\n"),
        ("first/wrap.h", "#include_next <wrap.h>\n"),
        ("second/wrap.h", "#include_next <wrap.h>\n"),
    ]);
    let graph = scan(dir.path(), &["first", "second"], &["kernels/a.cu"]).unwrap();
    assert_eq!(
        file_names(&graph),
        ["first/wrap.h", "kernels/a.cu", "second/wrap.h"]
    );
    assert_eq!(externals(&graph), ["wrap.h"]);
}

#[test]
fn the_hash_follows_the_content() {
    let dir = tree(&[
        ("kernels/a.cu", "#include \"x.cuh\"\n"),
        ("kernels/x.cuh", "int x;\n"),
    ]);
    let before = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap();
    assert_eq!(
        before.files()["kernels/x.cuh"],
        hex::encode(Sha256::digest(b"int x;\n"))
    );
    fs::write(dir.path().join("kernels/x.cuh"), "int y;\n").unwrap();
    let after = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap();
    assert_ne!(
        before.files()["kernels/x.cuh"],
        after.files()["kernels/x.cuh"]
    );
    assert_eq!(
        before.files()["kernels/a.cu"],
        after.files()["kernels/a.cu"]
    );
}

#[test]
fn stable_paths_do_not_depend_on_where_the_tree_lives() {
    let files = [
        (
            "kernels/a.cu",
            "#include <af3/x.cuh>\n#include <cute/t.hpp>\n",
        ),
        ("include/af3/x.cuh", "#include \"../af3/y.cuh\"\n"),
        ("include/af3/y.cuh", "int y;\n"),
    ];
    let scan_copy = || {
        let dir = tree(&files);
        let vendor = tree(&[("cute/t.hpp", "int t;\n")]);
        let roots = ScanRoots {
            root: dir.path().to_owned(),
            include_dirs: vec![dir.path().join("include"), vendor.path().to_owned()],
            external_dirs: Vec::new(),
        };
        let graph = scan_includes(&[dir.path().join("kernels/a.cu")], &roots).unwrap();
        (dir, vendor, graph)
    };
    let (first_dir, _first_vendor, first) = scan_copy();
    let (second_dir, _second_vendor, second) = scan_copy();
    assert_ne!(first_dir.path(), second_dir.path());
    assert_eq!(first.files(), second.files());
    assert_eq!(first.render_tree(), second.render_tree());
    assert!(first.files().contains_key("[1]/cute/t.hpp"));
}

#[test]
fn render_tree_snapshot() {
    let dir = tree(&[
        (
            "kernels/a.cu",
            "#include <af3/x.cuh>\n#include <cuda_fp16.h>\n#include \"af3/common.cuh\"\n",
        ),
        (
            "kernels/b.cu",
            "#include \"af3/common.cuh\"\n",
        ),
        (
            "include/af3/x.cuh",
            "#pragma once\n#include \"common.cuh\"\n#include \"common.cuh\"\n#include <cuda_fp16.h>\n",
        ),
        ("include/af3/common.cuh", "#pragma once\n#include <cstdint>\n"),
    ]);
    let graph = scan(
        dir.path(),
        &["include"],
        &["kernels/a.cu", "kernels/b.cu", "kernels/a.cu"],
    )
    .unwrap();
    assert_eq!(
        graph.render_tree(),
        "\
kernels/a.cu
├── include/af3/x.cuh
│   ├── include/af3/common.cuh
│   │   └── cstdint (external)
│   └── cuda_fp16.h (external)
├── cuda_fp16.h (external)
└── include/af3/common.cuh (already shown)
kernels/b.cu
└── include/af3/common.cuh (already shown)
"
    );
    assert_eq!(externals(&graph), ["cstdint", "cuda_fp16.h"]);
}

#[test]
fn a_missing_source_is_a_read_error() {
    let dir = tree(&[]);
    let error = scan(dir.path(), &[], &["kernels/none.cu"]).unwrap_err();
    assert!(matches!(error, ScanError::Read { .. }), "{error}");
    assert!(error.to_string().contains("none.cu"), "{error}");
}

fn conditional_flags(source: &str) -> Vec<(String, bool)> {
    let mut out = Directives::default();
    find_includes(source.as_bytes(), &mut out).unwrap();
    out.includes
        .into_iter()
        .map(|include| (include.name, include.conditional))
        .collect()
}

#[test]
fn includes_under_a_conditional_are_marked_but_include_guards_do_not_count() {
    let source = "#ifndef GUARD_H\n#define GUARD_H\n#include \"a.h\"\n\
                  #ifdef __CUDACC_RTC__\n#include \"target\"\n#else\n#include <b.h>\n#endif\n\
                  #if defined(X)\n#  if Y\n#include \"c.h\"\n#  endif\n#include \"d.h\"\n#endif\n\
                  #ifndef NOT_A_GUARD\n#include \"e.h\"\n#define OTHER\n#endif\n\
                  #include \"f.h\"\n#endif\n";
    assert_eq!(
        conditional_flags(source),
        [
            ("a.h".to_owned(), false),
            ("target".to_owned(), true),
            ("b.h".to_owned(), true),
            ("c.h".to_owned(), true),
            ("d.h".to_owned(), true),
            ("e.h".to_owned(), true),
            ("f.h".to_owned(), false),
        ]
    );
}

#[test]
fn a_missing_quoted_include_under_a_conditional_is_absent_not_an_error() {
    // The runtime headers' own spelling: NVRTC has `target` built in, nvcc never reads it.
    let dir = tree(&[
        ("kernels/a.cu", "#include <runtime/cuda_fp16.h>\n"),
        (
            "include/runtime/cuda_fp16.h",
            "#ifndef CUDA_FP16_H\n#define CUDA_FP16_H\n#ifdef __CUDACC_RTC__\n\
             #include \"target\"\n#endif\n#include \"cuda_fp16.hpp\"\n#endif\n",
        ),
        ("include/runtime/cuda_fp16.hpp", "// the half type\n"),
    ]);
    let graph = scan(dir.path(), &["include"], &["kernels/a.cu"]).unwrap();
    assert_eq!(
        file_names(&graph),
        [
            "include/runtime/cuda_fp16.h",
            "include/runtime/cuda_fp16.hpp",
            "kernels/a.cu"
        ]
    );
    assert_eq!(
        graph.absent().iter().cloned().collect::<Vec<_>>(),
        [(
            "include/runtime/cuda_fp16.h".to_owned(),
            "target".to_owned()
        )]
    );
    assert_eq!(
        graph.render_tree(),
        "kernels/a.cu\n└── include/runtime/cuda_fp16.h\n    \
         ├── \"target\" (absent: under a conditional, found nowhere)\n    \
         └── include/runtime/cuda_fp16.hpp\n"
    );

    // Once it exists, it is found and hashed: the key follows.
    write_files(dir.path(), &[("include/runtime/target", "// now here\n")]);
    let graph = scan(dir.path(), &["include"], &["kernels/a.cu"]).unwrap();
    assert!(graph.files().contains_key("include/runtime/target"));
    assert!(graph.absent().is_empty());
}

#[test]
fn a_missing_quoted_include_outside_any_conditional_still_fails_with_its_chain() {
    // Inside an include guard only: that is no conditional the compile can skip.
    let dir = tree(&[
        ("kernels/a.cu", "#include \"x.cuh\"\n"),
        (
            "kernels/x.cuh",
            "#ifndef X_CUH\n#define X_CUH\n#include \"gone.cuh\"\n#endif\n",
        ),
    ]);
    let error = scan(dir.path(), &[], &["kernels/a.cu"]).unwrap_err();
    let ScanError::MissingHeader {
        header,
        location,
        chain,
        ..
    } = &error
    else {
        panic!("unexpected error: {error}");
    };
    assert_eq!(
        (header.as_str(), location.as_str()),
        ("gone.cuh", "kernels/x.cuh:3")
    );
    assert_eq!(chain, &["kernels/a.cu", "kernels/x.cuh"]);
}

#[test]
fn a_copy_of_toolkit_headers_in_an_include_dir_is_the_toolkits() {
    // torch's `nvidia/cu13/include` holds the runtime headers again: byte-for-byte copies are
    // the toolkit's headers (keyed by the toolkit), a header that differs is a library file.
    let runtime_h = "#ifndef RT_H\n#define RT_H\n#include \"rt_api.h\"\n#endif\n";
    let dir = tree(&[
        (
            "kernels/a.cu",
            "#include <cuda_rt.h>\n#include <cuda_other.h>\n",
        ),
        ("toolkit/include/cuda_rt.h", runtime_h),
        ("toolkit/include/rt_api.h", "// api\n"),
        ("toolkit/include/cuda_other.h", "// the toolkit's\n"),
    ]);
    // Outside the root, as torch's include dir is.
    let torch = tree(&[
        ("include/cuda_rt.h", runtime_h),
        ("include/rt_api.h", "// api\n"),
        (
            "include/cuda_other.h",
            "// another release\n#ifdef __CUDACC_RTC__\n#include \"target\"\n#endif\n",
        ),
    ]);
    let mut roots = roots(dir.path(), &[]);
    roots.include_dirs = vec![torch.path().join("include")];
    roots.external_dirs = vec![dir.path().join("toolkit/include")];
    let graph = scan_includes(&[dir.path().join("kernels/a.cu")], &roots).unwrap();
    assert_eq!(file_names(&graph), ["[0]/cuda_other.h", "kernels/a.cu"]);
    assert_eq!(externals(&graph), ["cuda_rt.h"]);
    assert_eq!(
        graph.absent().iter().cloned().collect::<Vec<_>>(),
        [("[0]/cuda_other.h".to_owned(), "target".to_owned())]
    );
}

#[test]
fn needed_include_dirs_keep_host_dirs_only_up_to_the_last_one_used() {
    let dir = tree(&[("kernels/a.cu", "#include <lib/x.h>\n")]);
    let outside = tree(&[
        ("manifest_dir/unused.h", ""),
        ("host_a/other.h", ""),
        ("host_b/lib/x.h", ""),
        ("host_c/lib/x.h", ""),
    ]);
    let dirs: Vec<PathBuf> = ["manifest_dir", "host_a", "host_b", "host_c"]
        .iter()
        .map(|name| outside.path().join(name))
        .collect();
    let mut roots = roots(dir.path(), &[]);
    roots.include_dirs = dirs.clone();
    let graph = scan_includes(&[dir.path().join("kernels/a.cu")], &roots).unwrap();
    assert_eq!(file_names(&graph), ["[2]/lib/x.h", "kernels/a.cu"]);
    assert_eq!(graph.needed_include_dirs(&dirs, 1), dirs[..3]);
    write_files(dir.path(), &[("kernels/lib/x.h", "")]);
    fs::write(dir.path().join("kernels/a.cu"), "#include \"lib/x.h\"\n").unwrap();
    let graph = scan_includes(&[dir.path().join("kernels/a.cu")], &roots).unwrap();
    assert_eq!(graph.needed_include_dirs(&dirs, 1), dirs[..1]);
}
