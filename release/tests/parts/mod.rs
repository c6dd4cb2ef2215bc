//! Registry-sized wheels: the default library cut into a main wheel and companion parts,
//! installed by pip with `--target`, and read by the loader through the device seam (the
//! cubins it hands the device are checked against the index; no GPU needed).

use std::collections::{BTreeMap, BTreeSet};

use prebuilt::parts::{PartsIndex, PARTS_FILE};
use prebuilt::{JitPolicy, PtxJitPolicy, Registry, RegistryOptions};
use testkit::fixtures::FakeDevice;

use super::*;

/// Small enough that the main wheel (index, loader table, sources, Python files) still fits,
/// and the artifacts need several parts.
const LIMIT: u64 = 160 << 10;

/// The default library less its extension module, and its bundle, built once from the shared
/// cache: `(manifest, bundle)`. These tests cut cubins into parts; a module stays in the main
/// wheel (the import loads it), which the few tens of KiB some limits here allow would not hold.
fn cubin_library(shared: &Shared) -> &'static (PathBuf, PathBuf) {
    static LIBRARY: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();
    LIBRARY.get_or_init(|| {
        let root = scratch("parts-library");
        let manifest = library_without_module(&root);
        let bundle = root.join("_prebuilt");
        build_library_wheel(&options(
            &manifest,
            &bundle,
            &root.join("wheels"),
            &shared.cache,
        ))
        .unwrap_or_else(|error| panic!("the cubin library builds: {}", chain(&error)));
        (manifest, bundle)
    })
}

/// The default library's wheel set at `limit`, built into `out` from the shared bundle.
fn build_set(shared: &Shared, out: &Path, limit: u64, ship_sources: bool) -> BuiltWheel {
    build_library_wheel(&LibraryWheelOptions {
        max_file_size: Some(limit),
        ship_sources,
        ..options(
            &cubin_library(shared).0,
            &cubin_library(shared).1,
            out,
            &shared.cache,
        )
    })
    .unwrap_or_else(|error| panic!("the set builds: {}", chain(&error)))
}

/// Loads every kernel of the installed bundle at `bundle` on each simulated GPU and CUDA
/// build, the JIT off: the variants loaded (`kernel cu130/sm_90a`), each checked to be the
/// image whose digest the index records.
fn load_everywhere(bundle: &Path, search: &[PathBuf]) -> BTreeSet<String> {
    let index = prebuilt::lookup::open_bundle(bundle)
        .unwrap()
        .index()
        .clone();
    let mut loaded = BTreeSet::new();
    for capability in [(9, 0), (10, 0), (10, 3), (12, 0)] {
        for cuda in ["cu129", "cu130"] {
            let gpu = FakeDevice::new(capability, "13.0");
            let options = RegistryOptions {
                cuda: Some(cuda.parse().unwrap()),
                torch: None,
                jit: JitPolicy::Disabled,
                ptx_jit: PtxJitPolicy::Allowed,
                part_search: search.to_vec(),
                ..RegistryOptions::default()
            };
            let registry = Registry::open_on(bundle, options, gpu.clone(), None).unwrap();
            for (name, record) in &index.kernels {
                let Ok(kernel) = registry.load(name) else {
                    // A target the manifest declares skipped for this kernel.
                    continue;
                };
                let variant = record
                    .variants
                    .iter()
                    .find(|v| v.label() == kernel.variant())
                    .unwrap();
                assert_eq!(
                    gpu.loaded()
                        .last()
                        .map(|image| prebuilt::key::sha256_hex(image)),
                    Some(variant.artifact.digest.clone()),
                    "{name} {}",
                    kernel.variant()
                );
                loaded.insert(format!("{name} {}", kernel.variant()));
            }
        }
    }
    loaded
}

/// The registry a cu130 runtime with the JIT off opens on `bundle` for an sm_90 GPU.
fn sm90_registry(bundle: &Path) -> Registry {
    let options = RegistryOptions {
        cuda: Some("cu130".parse().unwrap()),
        jit: JitPolicy::Disabled,
        ..RegistryOptions::default()
    };
    Registry::open_on(bundle, options, FakeDevice::new((9, 0), "13.0"), None).unwrap()
}

fn every_variant(bundle: &Path) -> BTreeSet<String> {
    let index = prebuilt::lookup::open_bundle(bundle)
        .unwrap()
        .index()
        .clone();
    index
        .kernels
        .iter()
        .flat_map(|(name, record)| {
            record
                .variants
                .iter()
                .map(move |variant| format!("{name} {}", variant.label()))
        })
        .collect()
}

/// `pip install --no-deps --target <target> <wheels>`; `false` (skipped) without pip.
fn pip_install_target(target: &Path, wheels: &[&Path]) -> bool {
    let Some(python) = python() else { return false };
    let output = Command::new(python)
        .args(["-m", "pip", "install", "--quiet", "--no-index", "--no-deps"])
        .args(["--disable-pip-version-check", "--target"])
        .arg(target)
        .args(wheels)
        .output()
        .unwrap();
    assert_succeeded(&output);
    true
}

/// Every wheel of `built`'s set is at most `limit` bytes, and, where pip runs, the set
/// installed with `--target` loads every variant of the bundle from its parts.
fn installed_set_loads_every_variant(root: &Path, built: &BuiltWheel, limit: u64) {
    for wheel in set_wheels(built) {
        let size = std::fs::metadata(wheel).unwrap().len();
        assert!(size <= limit, "{} is {size} bytes", wheel.display());
    }
    let target = root.join("site");
    if !pip_install_target(&target, &set_wheels(built)) {
        return;
    }
    let bundle = target.join("af3_kernels/_prebuilt");
    assert_eq!(load_everywhere(&bundle, &[]), every_variant(&bundle));
}

fn set_wheels(built: &BuiltWheel) -> Vec<&Path> {
    std::iter::once(built.path.as_path())
        .chain(built.parts.iter().map(|part| part.path.as_path()))
        .collect()
}

#[test]
fn a_wheel_over_the_limit_is_cut_into_pinned_parts_by_build_and_gpu_generation() {
    let Some(shared) = shared() else { return };
    let root = scratch("parts-cut");
    let built = build_set(shared, &root.join("wheels"), LIMIT, true);
    let names: Vec<String> = built
        .parts
        .iter()
        .map(|part| part.filename.to_string())
        .collect();
    assert!(names.len() >= 3, "{names:?}");
    for part in &built.parts {
        assert!(
            part.size <= LIMIT,
            "{} is {} bytes",
            part.filename,
            part.size
        );
        assert!(part
            .filename
            .to_string()
            .ends_with("-0.1.0-py3-none-manylinux_2_28_x86_64.manylinux_2_28_aarch64.whl"));
    }
    assert!(
        built.size <= LIMIT,
        "the main wheel is {} bytes",
        built.size
    );
    // One part per CUDA build and GPU generation (PTX apart), named after the package.
    let groups: BTreeSet<String> = names
        .iter()
        .map(|name| name.split('-').next().unwrap().to_owned())
        .collect();
    for group in [
        "af3_kernels_kernels_cu129_sm90",
        "af3_kernels_kernels_cu130_sm90",
        "af3_kernels_kernels_cu129_sm100",
        "af3_kernels_kernels_cu130_sm100",
        "af3_kernels_kernels_cu129_ptx",
        "af3_kernels_kernels_cu130_ptx",
    ] {
        assert!(groups.contains(group), "{group} in {groups:?}");
    }

    // The main wheel keeps the index and pins every part exactly; no artifact is left in it.
    let main = std::fs::read(&built.path).unwrap();
    let metadata = entry(&main, &format!("{DIST_INFO}/METADATA"));
    for part in &built.parts {
        let line = format!(
            "Requires-Dist: {}==0.1.0\n",
            part.report
                .filename
                .as_ref()
                .unwrap()
                .name()
                .replace('_', "-")
        );
        assert!(metadata.contains(&line), "{line} in\n{metadata}");
    }
    let main_names: Vec<String> = entries(&main).into_iter().map(|(name, _)| name).collect();
    assert!(!main_names
        .iter()
        .any(|n| n.contains("/_prebuilt/artifacts/")));
    let index = parts_index(&built);
    assert_eq!(index.max_file_size, LIMIT);
    assert_eq!(index.parts.len(), built.parts.len());

    // Every artifact of the index is in exactly one part.
    let bundle = prebuilt::Bundle::open(&cubin_library(shared).1).unwrap();
    let mut holders: BTreeMap<&str, usize> = BTreeMap::new();
    for part in &index.parts {
        for file in part.files.iter().filter(|f| f.starts_with("artifacts/")) {
            *holders.entry(file).or_default() += 1;
        }
    }
    for record in bundle.index().kernels.values() {
        for variant in &record.variants {
            assert_eq!(holders.get(variant.artifact.path.as_str()), Some(&1));
        }
    }

    // `wheel verify` of the main wheel checks the whole set.
    let report = verify_wheel(&built.path).unwrap();
    assert!(report.is_ok(), "{report}");
    let set = report.set.as_ref().unwrap();
    assert_eq!(set.parts.len(), built.parts.len());
    let verified: usize = set.parts.iter().map(|part| part.variants).sum();
    assert_eq!(verified, every_variant(&cubin_library(shared).1).len());
}

#[test]
fn every_wheel_of_the_set_rebuilds_byte_for_byte() {
    let Some(shared) = shared() else { return };
    let root = scratch("parts-twice");
    let first = build_set(shared, &root.join("a"), LIMIT, true);
    let second = build_set(shared, &root.join("b"), LIMIT, true);
    let bytes = |built: &BuiltWheel| -> Vec<(String, Vec<u8>)> {
        set_wheels(built)
            .into_iter()
            .map(|path| {
                (
                    path.file_name().unwrap().to_string_lossy().into_owned(),
                    std::fs::read(path).unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(bytes(&first), bytes(&second));
}

#[test]
fn a_group_too_big_for_one_file_is_cut_by_size_into_numbered_parts() {
    let Some(shared) = shared() else { return };
    let root = scratch("parts-numbered");
    // Without sources the main wheel is small enough for a limit under one group's size.
    let limit = 40 << 10;
    let built = build_set(shared, &root.join("wheels"), limit, false);
    let names: Vec<String> = built
        .parts
        .iter()
        .map(|part| part.filename.name().to_owned())
        .collect();
    assert!(
        names.contains(&"af3_kernels_kernels_cu130_sm100_1".to_owned())
            && names.contains(&"af3_kernels_kernels_cu130_sm100_2".to_owned()),
        "{names:?}"
    );
    installed_set_loads_every_variant(&root, &built, limit);
}

#[test]
fn pip_installs_the_set_with_target_and_the_loader_reads_every_variant_from_its_parts() {
    let Some(shared) = shared() else { return };
    let root = scratch("parts-target");
    let built = build_set(shared, &root.join("wheels"), LIMIT, true);
    let target = root.join("site");
    if !pip_install_target(&target, &set_wheels(&built)) {
        return;
    }
    let bundle = target.join("af3_kernels/_prebuilt");
    assert!(!bundle.join("artifacts").exists());
    assert!(target
        .join("af3_kernels_kernels_cu130_sm90/_prebuilt/part.json")
        .is_file());
    // Selection for sm_90, sm_100, sm_103 and sm_120 (PTX) under both builds reaches every
    // variant the bundle has, each read from its part and verified before the device saw it.
    let every = every_variant(&bundle);
    assert_eq!(every.len(), every_variant(&cubin_library(shared).1).len());
    assert_eq!(load_everywhere(&bundle, &[]), every);
}

#[test]
fn an_editable_main_package_finds_its_parts_on_the_search_path() {
    let Some(shared) = shared() else { return };
    let root = scratch("parts-editable");
    let built = build_set(shared, &root.join("wheels"), LIMIT, true);
    // The main package where a source checkout keeps it, the parts where pip installs them.
    let checkout = root.join("checkout");
    let parts: Vec<&Path> = built.parts.iter().map(|p| p.path.as_path()).collect();
    let site = root.join("site-packages");
    if !pip_install_target(&checkout, &[built.path.as_path()]) || !pip_install_target(&site, &parts)
    {
        return;
    }
    let bundle = checkout.join("af3_kernels/_prebuilt");
    let error = sm90_registry(&bundle).load("layernorm_bf16").unwrap_err();
    assert!(chain(&error).contains("af3-kernels-kernels-cu130-sm90"));
    assert_eq!(
        load_everywhere(&bundle, std::slice::from_ref(&site)),
        every_variant(&bundle)
    );
}

#[test]
fn a_missing_part_is_named_with_the_command_that_installs_it() {
    let Some(shared) = shared() else { return };
    let root = scratch("parts-missing");
    let built = build_set(shared, &root.join("wheels"), LIMIT, true);
    let target = root.join("site");
    let without_sm90: Vec<&Path> = set_wheels(&built)
        .into_iter()
        .filter(|path| {
            !path
                .to_string_lossy()
                .contains("af3_kernels_kernels_cu130_sm90-")
        })
        .collect();
    if !pip_install_target(&target, &without_sm90) {
        return;
    }
    let registry = sm90_registry(&target.join("af3_kernels/_prebuilt"));
    let error = prebuilt::error_chain(&registry.load("layernorm_bf16").unwrap_err());
    assert!(
        error.starts_with(
            "`layernorm_bf16` (cu130/sm_90a) cannot load its prebuilt cubin: the cubins for \
             cu130-sm90 are in the companion package `af3-kernels-kernels-cu130-sm90` 0.1.0, \
             which is not installed"
        ),
        "{error}"
    );
    assert!(
        error.contains("install it with `pip install af3-kernels-kernels-cu130-sm90==0.1.0`"),
        "{error}"
    );
    // status() says the same, before any load.
    let prebuilt::Status::Unavailable { reason } = &registry.status()["layernorm_bf16"] else {
        panic!("{:?}", registry.status()["layernorm_bf16"]);
    };
    assert!(reason.contains("pip install af3-kernels-kernels-cu130-sm90==0.1.0"));

    // `wheel verify` of the main wheel alone names the part missing beside it.
    let alone = root.join("alone");
    std::fs::create_dir_all(&alone).unwrap();
    let copied = alone.join(built.path.file_name().unwrap());
    std::fs::copy(&built.path, &copied).unwrap();
    let report = verify_wheel(&copied).unwrap();
    let missing: Vec<&str> = report
        .problems
        .iter()
        .filter(|p| p.message.starts_with("is missing beside"))
        .map(|p| p.file.as_str())
        .collect();
    assert_eq!(missing.len(), built.parts.len(), "{report}");
    assert!(missing.contains(
        &"af3_kernels_kernels_cu130_sm90-0.1.0-py3-none-manylinux_2_28_x86_64.manylinux_2_28_aarch64.whl"
    ));
}

/// The set's `parts.json`, from its main wheel.
fn parts_index(built: &BuiltWheel) -> PartsIndex {
    let main = std::fs::read(&built.path).unwrap();
    let parts_json = entry(&main, &format!("af3_kernels/_prebuilt/{PARTS_FILE}"));
    PartsIndex::parse(Path::new(PARTS_FILE), parts_json.as_bytes()).unwrap()
}

/// The bundle's reference families: each reference cubin's artifact path, with the artifact
/// paths of the frames compressed against it.
fn reference_families(bundle: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let bundle = prebuilt::Bundle::open(bundle).unwrap();
    let mut families: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for variant in bundle.index().kernels.values().flat_map(|r| &r.variants) {
        if let Some(digest) = &variant.artifact.dictionary {
            families
                .entry(prebuilt::bundle::artifact_path(digest))
                .or_default()
                .insert(variant.artifact.path.clone());
        }
    }
    families
}

/// The parts that hold each family, its reference or a frame (copies left out), by reference.
fn parts_of_families(
    index: &PartsIndex,
    families: &BTreeMap<String, BTreeSet<String>>,
) -> BTreeMap<String, BTreeSet<String>> {
    let owner: BTreeMap<&str, &str> = index
        .parts
        .iter()
        .flat_map(|part| {
            part.files
                .iter()
                .map(|file| (file.as_str(), part.name.as_str()))
        })
        .collect();
    families
        .iter()
        .map(|(reference, frames)| {
            let parts = std::iter::once(reference)
                .chain(frames)
                .map(|path| owner[path.as_str()].to_owned())
                .collect();
            (reference.clone(), parts)
        })
        .collect()
}

/// The artifact files in all the set's part wheels, copies included.
fn artifact_files(built: &BuiltWheel) -> usize {
    built
        .parts
        .iter()
        .map(|part| {
            entries(&std::fs::read(&part.path).unwrap())
                .iter()
                .filter(|(name, _)| name.contains("/_prebuilt/artifacts/"))
                .count()
        })
        .sum()
}

/// How many distinct artifacts the bundle's index names.
fn distinct_artifacts(bundle: &Path) -> usize {
    let bundle = prebuilt::Bundle::open(bundle).unwrap();
    let paths: BTreeSet<&str> = bundle
        .index()
        .kernels
        .values()
        .flat_map(|record| &record.variants)
        .map(|variant| variant.artifact.path.as_str())
        .collect();
    paths.len()
}

#[test]
fn a_group_cut_into_parts_keeps_each_reference_family_in_one_part() {
    let Some(shared) = shared() else { return };
    let root = scratch("parts-families");
    // Under the size of a group of two families (one per target, as the bundler compresses
    // no cubin against another target's), over each family's.
    let limit = 40 << 10;
    let built = build_set(shared, &root.join("wheels"), limit, false);
    let index = parts_index(&built);
    let cut: Vec<&str> = index
        .parts
        .iter()
        .filter(|part| part.group == "cu130-sm100")
        .map(|part| part.name.as_str())
        .collect();
    assert!(cut.len() >= 2, "{cut:?}");

    // Each family whole in one part, so nothing is copied: the set holds every artifact once.
    let families = reference_families(&cubin_library(shared).1);
    assert!(families.len() >= 8, "{families:?}");
    for (reference, parts) in parts_of_families(&index, &families) {
        assert_eq!(parts.len(), 1, "the family of `{reference}` in {parts:?}");
    }
    assert!(index.parts.iter().all(|part| part.prefixes.is_empty()));
    assert_eq!(
        artifact_files(&built),
        distinct_artifacts(&cubin_library(shared).1)
    );
}

#[test]
fn a_family_too_big_for_one_part_is_cut_with_its_reference_copied_into_each_part_it_spans() {
    let Some(shared) = shared() else { return };
    let root = scratch("parts-family-cut");
    // Over the largest artifact and the main wheel, under a family of a GPU target (six or
    // seven cubins), over a PTX family.
    let limit = 32 << 10;
    let built = build_set(shared, &root.join("wheels"), limit, false);
    let index = parts_index(&built);
    let families = reference_families(&cubin_library(shared).1);
    let spans = parts_of_families(&index, &families);

    // A family cut across parts has its reference in one and a copy in each other; a family
    // that fits stays whole; nothing else is copied.
    let mut copies = 0;
    for (reference, parts) in &spans {
        for part in index.parts.iter().filter(|part| parts.contains(&part.name)) {
            let copied = part.prefixes.contains(reference);
            assert_ne!(
                copied,
                part.files.contains(reference),
                "{reference} in {}",
                part.name
            );
            copies += usize::from(copied);
        }
    }
    let prefixes: usize = index.parts.iter().map(|part| part.prefixes.len()).sum();
    assert_eq!(prefixes, copies);
    assert!(copies > 0);
    let whole: Vec<&String> = spans
        .iter()
        .filter(|(_, parts)| parts.len() == 1)
        .map(|(reference, _)| reference)
        .collect();
    assert!(!whole.is_empty(), "the PTX families fit: {spans:?}");
    assert_eq!(
        artifact_files(&built),
        distinct_artifacts(&cubin_library(shared).1) + copies
    );

    // Each part decodes alone: every variant loads from the installed set.
    installed_set_loads_every_variant(&root, &built, limit);
}

/// The part wheel of `built` whose distribution is `name`.
fn part_wheel<'b>(built: &'b BuiltWheel, name: &str) -> &'b Path {
    built
        .parts
        .iter()
        .find(|part| part.filename.name() == name)
        .map(|part| part.path.as_path())
        .unwrap_or_else(|| panic!("no part `{name}`"))
}

/// Rewrites the wheel at `path` with `edit` applied to its files (RECORD left out, then
/// written again to match): a tool that rewrites a wheel, so only the set's rules can tell.
fn rewrite(path: &Path, edit: impl FnOnce(&mut Vec<(String, Vec<u8>)>)) {
    let dist_info = format!(
        "{}/RECORD",
        WheelFilename::parse(&path.file_name().unwrap().to_string_lossy())
            .unwrap()
            .dist_info()
    );
    let mut files: Vec<(String, Vec<u8>)> = entries(&std::fs::read(path).unwrap())
        .into_iter()
        .filter(|(name, _)| *name != dist_info)
        .collect();
    edit(&mut files);
    write_with_record(path, &files, &dist_info);
}

#[test]
fn a_part_carrying_code_entry_points_or_dependencies_is_refused_naming_the_part_and_the_file() {
    let Some(shared) = shared() else { return };
    let root = scratch("parts-hostile");
    let built = build_set(shared, &root.join("wheels"), LIMIT, true);
    let name = "af3_kernels_kernels_cu130_sm90";
    let part = part_wheel(&built, name);
    let wheel = part.file_name().unwrap().to_string_lossy().into_owned();
    let dist_info = format!("{name}-0.1.0.dist-info");
    rewrite(part, |files| {
        for (path, bytes) in files.iter_mut() {
            if *path == format!("{name}/__init__.py") {
                bytes.extend_from_slice(b"import os\nos.system('echo owned')\n");
            }
            if *path == format!("{dist_info}/METADATA") {
                bytes.extend_from_slice(b"Requires-Dist: evil-helper\n");
            }
        }
        files.push((
            format!("{dist_info}/entry_points.txt"),
            b"[console_scripts]\nkwheel = evil:main\n".to_vec(),
        ));
    });
    let report = verify_wheel(&built.path).unwrap();
    assert!(!report.is_ok());
    let about = |file: &str| problems_about(&report, &format!("{wheel}: {file}"));
    assert_eq!(
        about(&format!("{name}/__init__.py")),
        [
            "is not the `__init__.py` kwheel writes into a part (a docstring only): a part \
             carries artifacts, and no code that runs when it is imported"
        ],
        "{report}"
    );
    assert_eq!(
        about(&format!("{dist_info}/entry_points.txt")),
        [
            "declares entry points (pip would install its console scripts): a part carries \
             artifacts only, no commands"
        ],
        "{report}"
    );
    assert_eq!(
        about(&format!("{dist_info}/METADATA")),
        ["requires `evil-helper`: a part carries artifacts only, no dependencies of its own"],
        "{report}"
    );
    // The rewrite is sound (its RECORD matches): the part fails only for what it carries, and
    // every other part, as kwheel writes it, passes the same rules.
    assert_eq!(report.problems.len(), 3, "{report}");
}

#[test]
fn release_diff_reads_a_registry_sized_main_wheel_with_its_parts() {
    let Some(shared) = shared() else { return };
    let root = scratch("parts-diff");
    let built = build_set(shared, &root.join("wheels"), LIMIT, true);
    let diff = release::diff::diff_releases(
        &release::diff::Release::open(&built.path)
            .unwrap_or_else(|error| panic!("{}", chain(&error))),
        &release::diff::Release::open(&cubin_library(shared).1).unwrap(),
        None,
    )
    .unwrap();
    assert_eq!(diff.changed().count(), 0, "{diff}");
    assert_eq!(diff.rows.len(), 50, "{diff}");
}

/// A part is read once too: replaced after its check by a part whose `_prebuilt/` names
/// climb out, it changes nothing `release diff` uses or writes.
#[test]
fn a_part_swapped_after_its_check_writes_nothing_outside() {
    let Some(shared) = shared() else { return };
    let root = scratch("parts-swapped");
    let built = build_set(shared, &root.join("wheels"), LIMIT, true);
    let outside = root.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let part = part_wheel(&built, "af3_kernels_kernels_cu130_sm90").to_owned();
    let hostile = root.join("hostile.whl");
    let mut files = vec![(
        format!(
            "af3_kernels_kernels_cu130_sm90/_prebuilt/{}",
            climbing_out_into(&outside)
        ),
        b"outside".to_vec(),
    )];
    files.extend(entries(&std::fs::read(&part).unwrap()));
    write_entries(&hostile, &files);
    let (swapped, from) = (part.clone(), hostile.clone());
    let hook = release::verify::after_check(move |checked| {
        if checked == swapped && from.exists() {
            std::fs::rename(&from, &swapped).unwrap();
        }
    });
    let opened = release::diff::Release::open(&built.path);
    drop(hook);
    assert!(!hostile.exists(), "the part was replaced");
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    let diff = release::diff::diff_releases(
        &opened.unwrap_or_else(|error| panic!("{}", chain(&error))),
        &release::diff::Release::open(&cubin_library(shared).1).unwrap(),
        None,
    )
    .unwrap();
    assert_eq!(diff.changed().count(), 0, "{diff}");
}
