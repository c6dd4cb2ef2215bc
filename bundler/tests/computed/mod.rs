//! Constants the compiler computes (`computed`) and struct layouts (`structs`): real compiles
//! for sm_90a and sm_100a under both CUDA builds, each value read back from the bundle and
//! checked by a `static_assert(expr == value)` compiled for the same arch.

use super::*;

const FIXTURE: &str = "tests/fixtures/computed/conv.cu";

const ENTRIES: [&str; 2] = [
    "conv_fwd_kernel<Conv_traits<128, 4, false>>",
    "conv_fwd_kernel<Conv_traits<64, 2, true>>",
];

/// The manifest of the fixture: `computed` per entry, `structs`, and `kernel_extra` appended to
/// the kernel's table.
fn computed_manifest(kernel_extra: &str) -> String {
    let entries: Vec<String> = ENTRIES.iter().map(|e| format!("\"{e}\"")).collect();
    matrix_library(
        "computed",
        &format!(
            "\n[kernels.conv_fwd]\nsources = [\"conv.cu\"]\nentries = [{}]\n\
             template = \"typename Ktraits\"\n\
             computed = {{ smem = \"sizeof(typename Ktraits::SmemStorage)\", threads = \"Ktraits::kNThreads\" }}\n\
             structs = {{ ConvParams = [\"batch\", \"dim\", \"seqlen\", \"x_ptr\", \"width\"] }}\n{kernel_extra}",
            entries.join(", ")
        ),
    )
}

fn fixture_library(manifest: &str) -> (tempfile::TempDir, PathBuf) {
    let source = std::fs::read_to_string(workspace().join("bundler").join(FIXTURE)).unwrap();
    library_in(manifest, &[("conv.cu", &source)])
}

/// Whether nvcc (cu130) compiles `checks` after the fixture for `arch`: each a
/// `static_assert`, so a wrong value is a compile error.
fn static_asserts_hold(dir: &Path, arch: Arch, checks: &str) -> Result<(), String> {
    let unit = dir.join(format!("check_{arch}.cu"));
    std::fs::write(&unit, format!("#include \"conv.cu\"\n{checks}")).unwrap();
    let output = std::process::Command::new(cu130_nvcc())
        .arg("-cubin")
        .arg(format!("-arch={arch}"))
        .arg("-o")
        .arg(dir.join(format!("check_{arch}.cubin")))
        .arg(&unit)
        .output()
        .unwrap();
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

#[test]
fn computed_constants_and_struct_layouts_are_the_compilers_per_arch_and_build() {
    let Some(toolchains) = toolchains() else {
        return;
    };
    let (dir, manifest) = fixture_library(&computed_manifest(""));
    bundle_kernels(&options_in(dir.path(), &manifest, toolchains)).unwrap();
    let bundle = Bundle::open(dir.path().join("out")).unwrap();
    let record = &bundle.index().kernels["conv_fwd"];
    let cells: BTreeSet<String> = record.variants.iter().map(|v| v.label()).collect();
    assert!(record.skipped.is_empty(), "{:?}", record.skipped);
    assert_eq!(
        cells,
        BTreeSet::from(
            [
                "cu129/sm_90a",
                "cu129/sm_100a",
                "cu130/sm_90a",
                "cu130/sm_100a"
            ]
            .map(String::from)
        )
    );
    let mut smem_by_arch: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    for variant in &record.variants {
        let mut checks = String::new();
        for (n, function) in variant.functions.iter().enumerate() {
            let arguments = prebuilt::compile::computed::template_arguments(&function.name)
                .unwrap()
                .to_owned();
            assert_eq!(
                function.computed.keys().collect::<Vec<_>>(),
                ["smem", "threads"],
                "{}",
                variant.label()
            );
            for (name, expression) in [
                ("smem", "sizeof(typename Ktraits::SmemStorage)"),
                ("threads", "Ktraits::kNThreads"),
            ] {
                let value = function.computed[name];
                checks.push_str(&format!(
                    "template <typename Ktraits> struct check_{n}_{name} {{ \
                     static_assert(({expression}) == {value}, \"{name}\"); }};\n\
                     template struct check_{n}_{name}<{arguments}>;\n"
                ));
            }
            smem_by_arch
                .entry(variant.arch.to_string())
                .or_default()
                .insert(function.computed["smem"]);
        }
        let layout = &variant.structs["ConvParams"];
        checks.push_str(&format!(
            "static_assert(sizeof(ConvParams) == {}, \"size\");\n\
             static_assert(alignof(ConvParams) == {}, \"align\");\n",
            layout.size, layout.align
        ));
        for field in &layout.fields {
            checks.push_str(&format!(
                "static_assert(__builtin_offsetof(ConvParams, {f}) == {o}, \"offset\");\n\
                 static_assert(sizeof(((ConvParams*)0)->{f}) == {s}, \"size\");\n",
                f = field.name,
                o = field.offset,
                s = field.size
            ));
        }
        static_asserts_hold(dir.path(), variant.arch, &checks)
            .unwrap_or_else(|log| panic!("{}: {log}\n{checks}", variant.label()));
        let threads: Vec<i64> = variant
            .functions
            .iter()
            .map(|f| f.computed["threads"])
            .collect();
        assert_eq!(threads, [128, 64], "{}", variant.label());
        let width = layout.fields.iter().find(|f| f.name == "width").unwrap();
        let expected_offset = if variant.arch.to_string() == "sm_100a" {
            28
        } else {
            24
        };
        assert_eq!(
            (width.offset, width.size),
            (expected_offset, 2),
            "{}",
            variant.label()
        );
    }
    // The fixture's shared storage has a `double` more on sm_100a, and a different layout.
    assert_eq!(
        smem_by_arch,
        BTreeMap::from([
            ("sm_90a".to_owned(), BTreeSet::from([512, 1024])),
            ("sm_100a".to_owned(), BTreeSet::from([520, 1032])),
        ])
    );
}

/// The JIT (the cu130 nvcc, on the bundle's shipped sources) records the struct layouts and
/// computed constants the bundler did for the same target, caches them, and reads them back.
#[test]
fn the_jit_records_the_same_struct_layouts_and_constants_as_the_bundler() {
    let Some(toolchains) = toolchains() else {
        return;
    };
    let cu130: Vec<_> = of_build(toolchains, "cu130");
    let (dir, manifest) = fixture_library(&computed_manifest("arch = [\"sm_90a\"]\n"));
    bundle_kernels(&options_in(dir.path(), &manifest, cu130)).unwrap();
    let bundle = Bundle::open(dir.path().join("out")).unwrap();
    let record = &bundle.index().kernels["conv_fwd"];
    let shipped = &record.variants[0];
    let compiler = prebuilt::jit::JitCompiler::nvcc_at(&cu130_nvcc()).unwrap();
    let request = prebuilt::jit::JitRequest {
        bundle_root: bundle.root(),
        kernel: "conv_fwd",
        record,
        torch: &bundle.index().torch,
        arch: shipped.arch,
        cuda: shipped.cuda,
    };
    let cache = dir.path().join("jit-cache");
    let built = prebuilt::jit::compile_cached(&request, &compiler, &cache).unwrap();
    assert!(built.compiled);
    assert_eq!(built.structs, shipped.structs);
    assert_eq!(built.structs["ConvParams"].fields.len(), 5);
    let computed = |functions: &[prebuilt::index::Function]| -> Vec<_> {
        functions.iter().map(|f| f.computed.clone()).collect()
    };
    assert_eq!(computed(&built.functions), computed(&shipped.functions));
    let again = prebuilt::jit::compile_cached(&request, &compiler, &cache).unwrap();
    assert!(!again.compiled);
    assert_eq!(again.structs, shipped.structs);
}

#[test]
fn a_bad_computed_expression_is_a_compile_error_naming_kernel_constant_and_entry() {
    let Some(toolchains) = toolchains() else {
        return;
    };
    let manifest = computed_manifest("").replace(
        "threads = \"Ktraits::kNThreads\"",
        "threads = \"Ktraits::kNoSuchMember\"",
    );
    for build in ["cu130", "cu129"] {
        let (dir, manifest) = fixture_library(&manifest.replace(
            "cuda-builds = [\"cu129\", \"cu130\"]",
            &format!("cuda-builds = [\"{build}\"]"),
        ));
        let mut opts = options_in(dir.path(), &manifest, of_build(toolchains.clone(), build));
        opts.jobs = 1;
        let text = anyhow_like(&bundle_kernels(&opts).unwrap_err());
        assert!(text.contains("`conv_fwd`"), "{text}");
        assert!(text.contains("kNoSuchMember"), "{text}");
        assert!(
            text.contains(
                "the error is in computed constant `threads` (`Ktraits::kNoSuchMember`) for \
                 entry `conv_fwd_kernel<Conv_traits<128, 4, false>>` of kernel `conv_fwd`"
            ),
            "{build}: {text}"
        );
    }
}

#[test]
fn computed_keys_are_checked_when_the_manifest_is_read() {
    for (extra_or_edit, message) in [
        (
            "constants = { smem = 4 }\n",
            "computed constant `smem` has the name of an exported constant of the kernel",
        ),
        (
            "!entries = [\"plain_kernel\"]",
            "entry `plain_kernel` has none",
        ),
        (
            "!structs = { ConvParams = [\"batch\", \"batch\"] }",
            "struct `ConvParams` names field `batch` twice",
        ),
        (
            "!computed = { \"not a name\" = \"1\" }",
            "computed constant `not a name` must be a C identifier",
        ),
    ] {
        let text = match extra_or_edit.strip_prefix('!') {
            None => computed_manifest(extra_or_edit),
            Some(edit) => {
                let key = edit.split(" =").next().unwrap();
                let base = computed_manifest("");
                base.lines()
                    .map(|line| {
                        if line.starts_with(&format!("{key} =")) {
                            edit.to_owned()
                        } else {
                            line.to_owned()
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            }
        };
        let (_, loaded) = load_manifest(&text);
        let error = loaded.unwrap_err();
        assert!(error.contains(message), "{error}\n{text}");
        assert!(error.contains("conv_fwd"), "{error}");
    }
}
