//! The loader at library scale: open + select of one kernel in a 16,000-variant bundle against
//! the default library's bundle, each in a fresh process, side by side in one run.
//!
//! ```text
//! cargo bench -p bundler --bench scale
//! ```
//!
//! Setup: the default library (`kernels/`) is bundled (from the build cache when warm), its
//! cubins extracted, and a manifest of 4,000 kernels × 4 targets (sm_90a, sm_100a × cu129,
//! cu130) made of them as precompiled `cubins` entries, so every variant is a real, validated
//! cubin. Both bundles stay under `target/kwheel/bench-scale/` for the GPU's first-call
//! measurement (`first_call` in `prebuilt/examples`).
//!
//! Each measurement is a fresh process (this binary, `probe`), timing inside itself:
//! `catalog` is what the loader does (open the loader index, read one kernel's record, select);
//! `index` is what it did before the loader index (parse the whole `index.json`, select).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bundler::{bundle_kernels, BundleOptions};
use prebuilt::device::{DeviceQuery, DriverVersion};
use prebuilt::lookup::Catalog;
use prebuilt::select::select_variant;

const KERNELS: usize = 4000;
const RUNS: usize = 21;
const TARGETS: [(&str, &str); 4] = [
    ("cu129", "sm_90a"),
    ("cu129", "sm_100a"),
    ("cu130", "sm_90a"),
    ("cu130", "sm_100a"),
];

fn main() {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    if arguments.first().map(String::as_str) == Some("probe") {
        probe(&arguments[1..]);
        return;
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned();
    let root = workspace.join("target/kwheel/bench-scale");
    let default = root.join("default/_prebuilt");
    let scale = root.join("scale/_prebuilt");
    println!("# loader at scale\n");
    build(&workspace.join("kernels/kernels.toml"), &default);
    write_scale_manifest(&default, &root.join("scale"));
    build(&root.join("scale/kernels.toml"), &scale);
    let size = |bundle: &Path, file: &str| {
        std::fs::metadata(bundle.join(file)).map_or(0, |metadata| metadata.len())
    };
    let variants = |bundle: &Path| {
        prebuilt::bundle::read_index(bundle)
            .unwrap()
            .kernels
            .values()
            .map(|record| record.variants.len())
            .sum::<usize>()
    };
    let bases = bases(&prebuilt::bundle::read_index(&default).unwrap());
    let middle = format!("k{:04}_{}", KERNELS / 2, bases[(KERNELS / 2) % bases.len()]);
    let cases = [
        (
            "default library, loader index",
            &default,
            "swiglu",
            "catalog",
        ),
        (
            "16,000 variants, loader index",
            &scale,
            middle.as_str(),
            "catalog",
        ),
        (
            "default library, whole index.json",
            &default,
            "swiglu",
            "index",
        ),
        (
            "16,000 variants, whole index.json",
            &scale,
            middle.as_str(),
            "index",
        ),
    ];
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); cases.len()];
    // Interleaved, so drift on a noisy machine hits every case alike.
    for _ in 0..RUNS {
        for (case, (_, bundle, kernel, mode)) in cases.iter().enumerate() {
            times[case].push(run_probe(bundle, kernel, mode));
        }
    }
    println!(
        "bundles: default {} variants (index.json {} B, kernels.idx {} B); scale {} variants \
         (index.json {} B, kernels.idx {} B)\n",
        variants(&default),
        size(&default, "index.json"),
        size(&default, "kernels.idx"),
        variants(&scale),
        size(&scale, "index.json"),
        size(&scale, "kernels.idx"),
    );
    index_overhead(&scale);
    println!("open + select of one kernel, fresh process each, {RUNS} runs, interleaved:\n");
    println!("| case | median | min | max |");
    println!("| --- | ---: | ---: | ---: |");
    let mut medians = Vec::new();
    for ((name, ..), times) in cases.iter().zip(&mut times) {
        times.sort();
        let median = times[times.len() / 2];
        medians.push(median);
        println!(
            "| {name} | {} | {} | {} |",
            micros(median),
            micros(times[0]),
            micros(*times.last().unwrap())
        );
    }
    println!(
        "\nratio, 16,000 variants / default, loader index: {:.2}× (goal ≤ 2×); whole index.json: {:.0}×",
        medians[1].as_secs_f64() / medians[0].as_secs_f64(),
        medians[3].as_secs_f64() / medians[2].as_secs_f64(),
    );
}

/// The index's share of the bundle on disk: `kernels.idx` (what a wheel ships; `index.json` is
/// a debugging output beside it) against every file of the bundle but `index.json`, and the
/// include graphs `kernels.idx` stores once.
fn index_overhead(bundle: &Path) {
    fn walk(dir: &Path, sizes: &mut Vec<(PathBuf, u64)>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let metadata = entry.metadata().unwrap();
            if metadata.is_dir() {
                walk(&entry.path(), sizes);
            } else {
                sizes.push((entry.path(), metadata.len()));
            }
        }
    }
    let mut files = Vec::new();
    walk(bundle, &mut files);
    let index_json = bundle.join("index.json");
    let lookup = bundle.join("kernels.idx");
    let total: u64 = files.iter().map(|(_, size)| size).sum();
    let of = |path: &Path| files.iter().find(|(p, _)| p == path).map_or(0, |(_, s)| *s);
    let shipped = total - of(&index_json);
    let artifacts: Vec<_> = files
        .iter()
        .filter(|(path, _)| path.starts_with(bundle.join("artifacts")))
        .collect();
    let opened = prebuilt::lookup::Lookup::open(&lookup).unwrap();
    let before = format_1_size(&opened.index().unwrap());
    println!(
        "kernels.idx before (format 1, computed from the same index): {before} B, {:.2}% of \
         the bundle it shipped in with index.json",
        100.0 * (before + of(&index_json)) as f64
            / (shipped - of(&lookup) + before + of(&index_json)) as f64
    );
    println!(
        "index overhead: kernels.idx {} B ({} kernels, {} distinct include graphs) of {} B \
         shipped ({:.2}%; artifacts {} B in {} files); index.json {} B beside it, not shipped\n",
        of(&lookup),
        opened.len(),
        opened.graph_count(),
        shipped,
        100.0 * of(&lookup) as f64 / shipped as f64,
        artifacts.iter().map(|(_, size)| size).sum::<u64>(),
        artifacts.len(),
        of(&index_json),
    );
}

/// The size format 1 of `kernels.idx` had for `index`: a 64-byte header, the meta's JSON, 32
/// bytes and the name per kernel, and each kernel's load record and key inputs as compact JSON.
fn format_1_size(index: &prebuilt::index::Index) -> u64 {
    let meta = serde_json::to_vec(&prebuilt::lookup::Meta::of(index)).unwrap();
    let mut size = 64 + meta.len() as u64;
    for (name, record) in &index.kernels {
        let load = serde_json::json!({
            "recipe": record.recipe,
            "constants": record.constants,
            "variants": record.variants,
            "skipped": record.skipped,
        });
        size += 32 + name.len() as u64;
        size += serde_json::to_vec(&load).unwrap().len() as u64;
        size += serde_json::to_vec(&record.inputs).unwrap().len() as u64;
    }
    size
}

fn micros(duration: Duration) -> String {
    format!("{:.1} µs", duration.as_secs_f64() * 1e6)
}

fn build(manifest: &Path, out: &Path) {
    let started = Instant::now();
    let summary = bundle_kernels(&BundleOptions::new(
        manifest,
        out,
        &bundler::cache::default_cache_dir(),
    ))
    .unwrap_or_else(|error| {
        panic!(
            "bundling {}: {}",
            manifest.display(),
            prebuilt::error_chain(&error)
        )
    });
    println!(
        "bundled {} in {:.1} s → {}",
        manifest.display(),
        started.elapsed().as_secs_f64(),
        summary.out.display()
    );
}

/// 4,000 kernels named `k<n>_<base>`, each the four cubins of one default kernel.
fn write_scale_manifest(default: &Path, dir: &Path) {
    let cubins = dir.join("cubins");
    let bundle = prebuilt::Bundle::open(default).unwrap();
    if !cubins.is_dir() {
        bundle.extract_to(&cubins).unwrap();
    }
    let bases = bases(bundle.index());
    let mut manifest = String::from(
        "[library]\npackage = \"scale-kernels\"\nversion = \"0.1.0\"\n\
         archs = [\"sm_90a\", \"sm_100a\"]\ncuda-builds = [\"cu129\", \"cu130\"]\n\
         torch = \"2.13.*\"\n",
    );
    for n in 0..KERNELS {
        let base = &bases[n % bases.len()];
        let entries = &bundle.index().kernels[base].variants[0].functions;
        let entries: Vec<String> = entries.iter().map(|f| format!("{:?}", f.name)).collect();
        manifest.push_str(&format!(
            "\n[kernels.k{n:04}_{base}]\nentries = [{}]\nconstants = {{ BLOCK_SIZE = {} }}\ncubins = [\n",
            entries.join(", "),
            n % 1024 + 1
        ));
        for (cuda, arch) in TARGETS {
            manifest.push_str(&format!(
                "  {{ arch = \"{arch}\", cuda = \"{cuda}\", path = \"cubins/{base}/{cuda}/{arch}.cubin\" }},\n"
            ));
        }
        manifest.push_str("]\n");
    }
    std::fs::write(dir.join("kernels.toml"), manifest).unwrap();
}

/// The default library's kernels built for every one of [`TARGETS`] (the wgmma kernel is
/// sm_90a only), in name order: what the scale library repeats.
fn bases(index: &prebuilt::index::Index) -> Vec<String> {
    let built = |record: &prebuilt::index::KernelRecord, (cuda, arch): (&str, &str)| {
        let label = format!("{cuda}/{arch}");
        record
            .variants
            .iter()
            .any(|variant| variant.label() == label)
    };
    index
        .kernels
        .iter()
        .filter(|(_, record)| TARGETS.iter().all(|target| built(record, *target)))
        .map(|(name, _)| name.clone())
        .collect()
}

fn run_probe(bundle: &Path, kernel: &str, mode: &str) -> Duration {
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["probe", &bundle.display().to_string(), kernel, mode])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "probe failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let nanos: u64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap();
    Duration::from_nanos(nanos)
}

/// One measurement in this (fresh) process: prints nanoseconds.
fn probe(arguments: &[String]) {
    let (bundle, kernel, mode) = (PathBuf::from(&arguments[0]), &arguments[1], &arguments[2]);
    let h200 = DeviceQuery {
        capability: (9, 0),
        driver: DriverVersion {
            major: 13,
            minor: 0,
        },
        cuda: "cu130".parse().unwrap(),
        torch: None,
    };
    let started = Instant::now();
    let label = match mode.as_str() {
        "catalog" => {
            let catalog = Catalog::open(&bundle).unwrap();
            let record = catalog.record(kernel).unwrap().unwrap();
            select_variant(kernel, &record, &h200)
                .unwrap()
                .variant
                .label()
        }
        _ => {
            let opened = prebuilt::Bundle::open(&bundle).unwrap();
            let record = &opened.index().kernels[kernel.as_str()];
            select_variant(kernel, record, &h200)
                .unwrap()
                .variant
                .label()
        }
    };
    let elapsed = started.elapsed();
    assert_eq!(label, "cu130/sm_90a");
    println!("{}", elapsed.as_nanos());
}
