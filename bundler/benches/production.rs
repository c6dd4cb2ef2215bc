//! A whole production library bundled the way `kwheel dev bundle-kernels` bundles precompiled
//! cubins, at its full size (`cargo bench -p bundler --bench production`).
//!
//! The corpus is every cubin of the `flashinfer-cubin` wheel that `ci/bench-setup` unpacks
//! (15,970 cubins, 1.89 GB; skipped with the reason when absent). Each cubin becomes one kernel
//! of one variant, as a manifest entry `cubins = [{ arch, cuda, path }]` makes it: read,
//! digested, its entries and parameter sizes read from its ELF, then the bundle written by
//! [`bundler::writer::write_bundle_from`] with the cubins streamed from their files.
//!
//! | reported | how |
//! | --- | --- |
//! | wall time | the digest pass and the writer, one clock; progress lines on stderr |
//! | peak memory | the process's peak resident set (`VmHWM`, which is what `getrusage` reports as `ru_maxrss`) |
//! | size as a wheel stores it | every file of the bundle deflated at level 6 where that is smaller, else stored; against the 447.9 MB the wheel itself takes |
//! | installed size | the bundle's files as they are on disk |
//! | solid archive | with `--solid`: `tar` of the cubins in path order in one zstd stream, level 19, long matching, 1 GiB window (no random access) |
//! | decode | single thread, each distinct cubin: cold = its reference read and decoded, then its own frame read, decoded and its sha256 checked; warm = the reference already in memory |
//!
//! Arguments after `--`: `--every N` takes every Nth cubin (a quick subset), `--under TEXT`
//! only paths containing TEXT, `--jobs N`, `--solid`, `--keep` keeps the bundle under
//! `target/kwheel/bench-production/`.

mod corpus;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bundler::compress::{FileCorpus, Stage};
use bundler::writer::write_bundle_from;
use prebuilt::bundle::{read_prefix, read_stored, FrameDictionary};
use prebuilt::index::{
    CompilerRecord, Function, Index, KernelInputs, KernelRecord, StoredFile, Variant, INDEX_FORMAT,
};
use rayon::prelude::*;
use sha2::{Digest as _, Sha256};

use corpus::{append_file, corpus_root, cubin_paths, micros, percentile};

/// The wheel's own size for its cubins: every `.cubin` member's compressed size.
const WHEEL_STORED: f64 = 447.9e6;

struct Arguments {
    every: usize,
    under: Option<String>,
    jobs: usize,
    solid: bool,
    keep: bool,
    /// Write a manifest of the corpus (one kernel per cubin) into this folder instead.
    manifest: Option<PathBuf>,
}

fn arguments() -> Arguments {
    let mut parsed = Arguments {
        every: 1,
        under: None,
        jobs: std::thread::available_parallelism().map_or(1, usize::from),
        solid: false,
        keep: false,
        manifest: None,
    };
    let mut given = std::env::args().skip(1);
    while let Some(argument) = given.next() {
        match argument.as_str() {
            "--every" => parsed.every = given.next().and_then(|n| n.parse().ok()).unwrap_or(1),
            "--under" => parsed.under = given.next(),
            "--jobs" => parsed.jobs = given.next().and_then(|n| n.parse().ok()).unwrap_or(1),
            "--solid" => parsed.solid = true,
            "--keep" => parsed.keep = true,
            "--manifest" => parsed.manifest = given.next().map(PathBuf::from),
            _ => {}
        }
    }
    parsed
}

/// What the digest pass keeps of a cubin: never its bytes.
struct Scanned {
    path: String,
    digest: String,
    size: u64,
    arch: prebuilt::Arch,
    functions: Vec<Function>,
}

fn main() {
    let arguments = arguments();
    let root = corpus_root();
    let Some(mut paths) = cubin_paths(&root) else {
        println!(
            "production: skipped, no cubins under {}: run `bash ci/bench-setup`",
            root.display()
        );
        return;
    };
    if let Some(under) = &arguments.under {
        paths.retain(|p| p.contains(under.as_str()));
    }
    paths = paths.into_iter().step_by(arguments.every.max(1)).collect();
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let out_dir = workspace.join("target/kwheel/bench-production");
    let out = out_dir.join("_prebuilt");
    let _ = std::fs::remove_dir_all(&out);
    println!(
        "production: {} cubins under {}, {} threads\n",
        paths.len(),
        root.display(),
        arguments.jobs
    );

    let started = Instant::now();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(arguments.jobs)
        .build()
        .unwrap();
    let done = AtomicUsize::new(0);
    let scanned: Vec<Scanned> = pool.install(|| {
        paths
            .par_iter()
            .map(|path| {
                let scanned = scan(&root, path);
                report(
                    "digest",
                    done.fetch_add(1, Ordering::Relaxed) + 1,
                    paths.len(),
                );
                scanned
            })
            .collect()
    });
    if let Some(folder) = &arguments.manifest {
        write_manifest(folder, &root, &scanned);
        return;
    }
    let raw: u64 = scanned.iter().map(|s| s.size).sum();
    let index = index_of(&scanned);
    let corpus = FileCorpus::new(
        scanned
            .iter()
            .map(|s| (s.digest.clone(), root.join(&s.path)))
            .collect(),
    );
    drop(scanned);
    let progress = |stage: Stage, done: usize, of: usize| {
        report(
            match stage {
                Stage::Sketch => "sketch",
                Stage::Compress => "compress",
            },
            done,
            of,
        )
    };
    let (index, _) = write_bundle_from(
        &out,
        index,
        &corpus,
        bundler::writer::BundleFiles {
            sources: &BTreeMap::new(),
            modules: &BTreeMap::new(),
        },
        arguments.jobs,
        &progress,
    )
    .unwrap();
    let wall = started.elapsed();
    let peak = peak_rss();

    let files = bundle_files(&out);
    let mut wheel = 0u64;
    let mut installed = 0u64;
    let mut by_kind: BTreeMap<&str, (usize, u64, u64)> = BTreeMap::new();
    let references: std::collections::BTreeSet<&str> = index
        .kernels
        .values()
        .flat_map(|r| &r.variants)
        .filter_map(|v| v.artifact.dictionary.as_deref())
        .collect();
    for (relative, size) in &files {
        let stored = stored_in_wheel(&out.join(relative)).min(*size);
        wheel += stored;
        installed += size;
        let kind = if relative.starts_with("artifacts/") {
            let digest = relative
                .rsplit('/')
                .next()
                .unwrap()
                .trim_end_matches(".cubin.zst");
            if references.contains(digest) {
                "artifacts: references (plain frames)"
            } else {
                "artifacts: other frames"
            }
        } else if relative.starts_with("dictionaries/") {
            "dictionaries"
        } else {
            relative.as_str()
        };
        let entry = by_kind.entry(kind).or_default();
        *entry = (entry.0 + 1, entry.1 + size, entry.2 + stored);
    }
    let (cold, warm) = decode_times(&out, &index);
    let cubins = corpus_len(&index);

    println!("| measure | value |\n| --- | --- |");
    println!("| cubins (distinct) | {} ({cubins}) |", paths.len());
    println!("| raw | {} |", mb(raw));
    println!(
        "| wall time (digest + write) | {:.0} s |",
        wall.as_secs_f64()
    );
    println!("| peak resident memory | {} |", mb(peak));
    println!(
        "| **size as a wheel stores it** | **{}** = **{:.3}** of the wheel's {} |",
        mb(wheel),
        wheel as f64 / WHEEL_STORED,
        mb(WHEEL_STORED as u64)
    );
    println!("| installed size | {} |", mb(installed));
    for (kind, (count, size, stored)) in &by_kind {
        println!(
            "| {kind} | {count} files, {} on disk, {} in the wheel |",
            mb(*size),
            mb(*stored)
        );
    }
    println!(
        "| decode cold median / p99 / max | {} / {} / {} |",
        micros(percentile(&cold, 50)),
        micros(percentile(&cold, 99)),
        micros(percentile(&cold, 100))
    );
    println!(
        "| decode warm median / p99 / max | {} / {} / {} |",
        micros(percentile(&warm, 50)),
        micros(percentile(&warm, 99)),
        micros(percentile(&warm, 100))
    );
    if arguments.solid {
        let started = Instant::now();
        let solid = solid_size(&root, &paths);
        println!(
            "| solid tar.zst --long=30 (level 19) | {} = {:.3} of the wheel ({:.0} s) |",
            mb(solid),
            solid as f64 / WHEEL_STORED,
            started.elapsed().as_secs_f64()
        );
    }
    if !arguments.keep {
        let _ = std::fs::remove_dir_all(&out_dir);
    }
}

/// `kernels.toml` in `folder`: the corpus as a library of precompiled cubins, one kernel per
/// cubin with the names [`index_of`] gives, each for its own target and CUDA 13.0 only, so
/// that `kwheel dev bundle-kernels` and `dev build-wheel` run on the whole production library.
fn write_manifest(folder: &Path, root: &Path, scanned: &[Scanned]) {
    let index = index_of(scanned);
    let archs: std::collections::BTreeSet<String> =
        scanned.iter().map(|s| s.arch.to_string()).collect();
    let quoted = |items: &mut dyn Iterator<Item = String>| {
        items
            .map(|item| format!("{item:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut text = format!(
        "# Every cubin of flashinfer-cubin 0.6.13 as a precompiled kernel (written by\n\
         # `cargo bench -p bundler --bench production -- --manifest DIR`).\n\
         [library]\npackage = \"flashinfer-cubin-bundle\"\nversion = \"0.6.13\"\n\
         python-package = \"python/flashinfer_cubin_bundle\"\n\
         archs = [{}]\ncuda-builds = [\"cu130\"]\ntorch = \"2.13.*\"\n\n\
         [wheel]\nmax-file-size = \"100MiB\"\n",
        quoted(&mut archs.iter().cloned())
    );
    for ((name, record), cubin) in index.kernels.iter().zip(order_by_name(&index, scanned)) {
        let arch = cubin.arch.to_string();
        text.push_str(&format!(
            "\n[kernels.{name}]\nentries = [{}]\narch = [{arch:?}]\ncubins = [{{ arch = {arch:?}, cuda = \"cu130\", path = {:?} }}]\n",
            quoted(&mut record.variants[0].functions.iter().map(|f| f.symbol.clone())),
            root.join(&cubin.path).display().to_string(),
        ));
    }
    let package = folder.join("python/flashinfer_cubin_bundle");
    std::fs::create_dir_all(&package).unwrap();
    std::fs::write(package.join("__init__.py"), "").unwrap();
    std::fs::write(folder.join("kernels.toml"), text).unwrap();
    println!(
        "production: wrote {} ({} kernels)",
        folder.join("kernels.toml").display(),
        index.kernels.len()
    );
}

/// `scanned` in the order of `index` (made of them by [`index_of`]), a map by kernel name.
fn order_by_name<'a>(index: &Index, scanned: &'a [Scanned]) -> Vec<&'a Scanned> {
    let by_digest: BTreeMap<&str, &Scanned> =
        scanned.iter().map(|s| (s.digest.as_str(), s)).collect();
    index
        .kernels
        .values()
        .map(|record| by_digest[record.variants[0].artifact.digest.as_str()])
        .collect()
}

/// One progress line per 5% of a stage, on stderr.
fn report(stage: &str, done: usize, of: usize) {
    let step = (of / 20).max(1);
    if done.is_multiple_of(step) || done == of {
        eprintln!("{stage}: {done}/{of}");
    }
}

/// Reads, digests and inspects one cubin, as the build does for a precompiled entry.
fn scan(root: &Path, path: &str) -> Scanned {
    let bytes = std::fs::read(root.join(path)).unwrap();
    let info = prebuilt::cubin::inspect_cubin(&bytes)
        .unwrap_or_else(|e| panic!("{path}: not a cubin: {e}"));
    let suffix = match info.kind {
        Some(prebuilt::ArchKind::Specific) => "a",
        Some(prebuilt::ArchKind::Family) => "f",
        _ => "",
    };
    let arch = format!("sm_{}{suffix}", info.sm)
        .parse()
        .unwrap_or_else(|_| "sm_100a".parse().unwrap());
    Scanned {
        path: path.to_owned(),
        digest: hex::encode(Sha256::digest(&bytes)),
        size: bytes.len() as u64,
        arch,
        functions: info
            .functions
            .into_iter()
            .map(|f| Function {
                computed: Default::default(),
                name: f.symbol.clone(),
                symbol: f.symbol,
                param_sizes: f.param_sizes,
            })
            .collect(),
    }
}

/// One kernel per cubin, named after its file, one variant each (cu130), keyed by content.
fn index_of(scanned: &[Scanned]) -> Index {
    let mut kernels = BTreeMap::new();
    for (n, cubin) in scanned.iter().enumerate() {
        let stem = cubin
            .path
            .rsplit('/')
            .next()
            .unwrap()
            .trim_end_matches(".cubin");
        let mut name: String = format!("k{n:05}_{stem}")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        name.truncate(120);
        let variant = Variant {
            structs: Default::default(),
            arch: cubin.arch,
            cuda: "cu130".parse().unwrap(),
            torch: "2.13.*".to_owned(),
            compiler: CompilerRecord {
                kind: "cubin".to_owned(),
                version: String::new(),
            },
            key: hex::encode(Sha256::digest(format!("{}:{}", cubin.digest, cubin.arch))),
            artifact: StoredFile {
                digest: cubin.digest.clone(),
                size: cubin.size,
                path: String::new(),
                stored_size: 0,
                dictionary: None,
            },
            functions: cubin.functions.clone(),
        };
        let inputs = KernelInputs {
            entries: cubin.functions.iter().map(|f| f.symbol.clone()).collect(),
            files: BTreeMap::from([(cubin.path.clone(), cubin.digest.clone())]),
            cxx_std: "c++17".to_owned(),
            ..KernelInputs::default()
        };
        kernels.insert(
            name,
            KernelRecord {
                inputs,
                recipe: None,
                constants: BTreeMap::new(),
                variants: vec![variant],
                skipped: Vec::new(),
            },
        );
    }
    Index {
        format: INDEX_FORMAT,
        package: "flashinfer-cubin".to_owned(),
        torch: "2.13.*".to_owned(),
        store: None,
        dictionary: None,
        kernels,
        modules: Default::default(),
    }
}

fn corpus_len(index: &Index) -> usize {
    distinct(index).len()
}

/// Each distinct artifact once, with a kernel that names it.
fn distinct(index: &Index) -> BTreeMap<&str, (&str, &Variant)> {
    let mut out = BTreeMap::new();
    for (kernel, record) in &index.kernels {
        for variant in &record.variants {
            out.entry(variant.artifact.digest.as_str())
                .or_insert((kernel.as_str(), variant));
        }
    }
    out
}

/// Per distinct cubin, one thread: cold (reference read and decoded, then the frame read,
/// decoded, sha256 checked) and warm (the reference held).
fn decode_times(root: &Path, index: &Index) -> (Vec<Duration>, Vec<Duration>) {
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    for (kernel, variant) in distinct(index).into_values() {
        let label = variant.label();
        let started = Instant::now();
        let prefix = variant
            .artifact
            .dictionary
            .as_ref()
            .map(|digest| read_prefix(root, digest, false, kernel, &label).unwrap());
        let dictionary = match &prefix {
            Some(prefix) => FrameDictionary::Prefix(prefix),
            None => FrameDictionary::None,
        };
        read_stored(root, &variant.artifact, dictionary, kernel, &label)
            .unwrap_or_else(|e| panic!("{kernel}: {e}"));
        cold.push(started.elapsed());
        let started = Instant::now();
        read_stored(root, &variant.artifact, dictionary, kernel, &label).unwrap();
        warm.push(started.elapsed());
    }
    cold.sort();
    warm.sort();
    (cold, warm)
}

/// Every file under `root` with its size, by `/`-separated relative path.
fn bundle_files(root: &Path) -> BTreeMap<String, u64> {
    let size = |path: PathBuf| std::fs::metadata(path).unwrap().len();
    let files = testkit::tree::files(root);
    files
        .into_iter()
        .map(|(name, path)| (name, size(path)))
        .collect()
}

/// The file deflated at level 6, as a wheel stores a file (the zip's own headers aside).
fn stored_in_wheel(path: &Path) -> u64 {
    let bytes = std::fs::read(path).unwrap();
    let mut encoder = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::new(6));
    encoder.write_all(&bytes).unwrap();
    encoder.finish().unwrap().len() as u64
}

/// `tar` of the cubins in path order, one zstd stream with long-distance matching over a
/// 1 GiB window, like `tar c | zstd -19 --long=30`, streamed: only its size is kept.
fn solid_size(root: &Path, paths: &[String]) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len() as u64;
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut encoder = zstd::stream::Encoder::new(Count(0), 19).unwrap();
    encoder.long_distance_matching(true).unwrap();
    encoder.window_log(30).unwrap();
    let mut archive = tar::Builder::new(encoder);
    for (n, path) in paths.iter().enumerate() {
        append_file(&mut archive, path, &std::fs::read(root.join(path)).unwrap());
        report("solid", n + 1, paths.len());
    }
    archive.into_inner().unwrap().finish().unwrap().0
}

/// Peak resident set of this process in bytes (`VmHWM`).
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn mb(bytes: u64) -> String {
    format!("{:.2} MB", bytes as f64 / 1e6)
}
