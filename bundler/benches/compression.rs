//! Bundle size of production cubins, printed as a markdown table
//! (`cargo bench -p bundler --bench compression`).
//!
//! The corpus is the `flashinfer-cubin` wheel's cubins that `ci/bench-setup` unpacks (skipped
//! with the reason when absent), taken two ways, both fixed by the wheel alone:
//!
//! | corpus | cubins | why |
//! | --- | --- | --- |
//! | `families` | every cubin of the GEMM families (every path without an `fmha` folder) | what a library ships: whole families of instantiations |
//! | `sample` | the 2,000 whose sha256 of their path inside the wheel sorts first | a sparse random draw over every family: the hard case |
//!
//! For each: raw size; every cubin deflated alone at level 6 (as a wheel stores it); every cubin
//! a plain zstd frame; a solid `tar` zstd stream with a 1 GiB window (no random access: the
//! floor); and [`bundler::compress::plan_compression`] (cubin references, every choice exact),
//! with its ratio to deflate (target ≤ 1/3) and the single-threaded decode time of one cubin,
//! cold (its reference decompressed first) and warm (the reference already in memory, as for a
//! family's later cubins). The whole library at its full size is `--bench production`. Names given after `--` run only
//! those corpora. Nothing here asserts a timing; every frame is checked to decode to its cubin.

mod corpus;

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use bundler::compress::{plan_compression, CompressionPlan, Prefix};
use prebuilt::bundle::decompress_with_prefix;
use sha2::{Digest as _, Sha256};

use corpus::{append_file, corpus_root, cubin_paths, micros, percentile};

const LEVEL: i32 = 19;
const SAMPLE: usize = 2000;

fn main() {
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let root = corpus_root();
    let Some(all) = cubin_paths(&root) else {
        println!(
            "compression: skipped, no cubins under {}: run `bash ci/bench-setup`",
            root.display()
        );
        return;
    };
    println!(
        "compression: {} cubins under {}, zstd level {LEVEL}\n",
        all.len(),
        root.display()
    );
    let families: Vec<String> = all
        .iter()
        .filter(|p| !p.split('/').any(|part| part == "fmha"))
        .cloned()
        .collect();
    let mut sample = all.clone();
    sample.sort_by_cached_key(|p| hex::encode(Sha256::digest(p.as_bytes())));
    sample.truncate(SAMPLE);
    sample.sort();
    println!("| corpus | cubins | raw | deflate-6 each | zstd each | solid tar.zst | plan | plan / deflate | dictionaries | decode cold median / p99 | decode warm median / p99 |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (name, paths) in [("families", families), ("sample", sample)] {
        if !wanted.is_empty() && !wanted.iter().any(|w| w == name) {
            continue;
        }
        run_corpus(name, &root, &paths);
    }
}

fn run_corpus(name: &str, root: &Path, paths: &[String]) {
    let cubins: Vec<(String, Vec<u8>)> = paths
        .iter()
        .map(|p| {
            let bytes = std::fs::read(root.join(p))
                .unwrap_or_else(|e| panic!("reading {}: {e}", root.join(p).display()));
            (p.clone(), bytes)
        })
        .collect();
    let raw: usize = cubins.iter().map(|(_, b)| b.len()).sum();
    let jobs = std::thread::available_parallelism().map_or(1, usize::from);

    let deflate: usize = cubins.iter().map(|(_, b)| deflate_size(b)).sum();
    let started = Instant::now();
    let zstd_each: usize = cubins
        .iter()
        .map(|(_, b)| {
            zstd::bulk::compress(b, LEVEL)
                .expect("in-memory compression")
                .len()
        })
        .sum();
    eprintln!("{name}: zstd each in {:.0?}", started.elapsed());
    let started = Instant::now();
    let solid = solid_size(&cubins);
    eprintln!("{name}: solid in {:.0?}", started.elapsed());

    let borrowed: Vec<(&str, &[u8])> = cubins
        .iter()
        .map(|(k, b)| (k.as_str(), b.as_slice()))
        .collect();
    let started = Instant::now();
    let plan = plan_compression(&borrowed, LEVEL, jobs);
    eprintln!(
        "{name}: plan in {:.0?} on {jobs} threads",
        started.elapsed()
    );
    let (cold, warm) = decode_times(&plan, &cubins);
    let with_dictionary = plan.frames.values().filter(|f| f.prefix.is_some()).count();
    let dictionary_raw: u64 = plan.dictionaries.iter().map(|d| d.size).sum();
    let dictionary_stored: usize = plan.dictionaries.iter().map(|d| d.stored.len()).sum();
    let stored = plan.stored_size();
    println!(
        "| {name} | {} | {} | {} | {} ({:.3}) | {} ({:.3}) | {} | **{:.3}** | {} ({} raw, {} stored; {} cubins use one) | {} / {} | {} / {} |",
        cubins.len(),
        mb(raw),
        mb(deflate),
        mb(zstd_each),
        zstd_each as f64 / deflate as f64,
        mb(solid),
        solid as f64 / deflate as f64,
        mb(stored),
        stored as f64 / deflate as f64,
        plan.dictionaries.len(),
        mb(dictionary_raw as usize),
        mb(dictionary_stored),
        with_dictionary,
        micros(percentile(&cold, 50)),
        micros(percentile(&cold, 99)),
        micros(percentile(&warm, 50)),
        micros(percentile(&warm, 99)),
    );
}

/// Per cubin: (its prefix decompressed, then its frame decoded; its frame decoded alone).
fn decode_times(
    plan: &CompressionPlan,
    cubins: &[(String, Vec<u8>)],
) -> (Vec<Duration>, Vec<Duration>) {
    let sizes: std::collections::BTreeMap<&str, u64> = cubins
        .iter()
        .map(|(key, bytes)| (key.as_str(), bytes.len() as u64))
        .collect();
    // A prefix's raw content from its stored frame: a dictionary's, or the reference cubin's
    // own (plain) frame.
    let content = |prefix: &Prefix| match prefix {
        Prefix::Dictionary(i) => {
            let dictionary = &plan.dictionaries[*i];
            decompress_with_prefix(&dictionary.stored, &[], dictionary.size)
                .expect("dictionary decodes")
        }
        Prefix::Cubin(key) => {
            decompress_with_prefix(&plan.frames[key].bytes, &[], sizes[key.as_str()])
                .expect("reference decodes")
        }
    };
    let mut cold = Vec::with_capacity(cubins.len());
    let mut warm = Vec::with_capacity(cubins.len());
    for (key, bytes) in cubins {
        let frame = &plan.frames[key];
        let started = Instant::now();
        let prefix = frame.prefix.as_ref().map(content);
        let decoded = decompress_with_prefix(
            &frame.bytes,
            prefix.as_deref().unwrap_or_default(),
            bytes.len() as u64,
        )
        .unwrap_or_else(|e| panic!("{key}: {e}"));
        cold.push(started.elapsed());
        assert_eq!(&decoded, bytes, "{key} round-trips");

        let started = Instant::now();
        let decoded = decompress_with_prefix(
            &frame.bytes,
            prefix.as_deref().unwrap_or_default(),
            bytes.len() as u64,
        )
        .unwrap_or_else(|e| panic!("{key}: {e}"));
        warm.push(started.elapsed());
        assert_eq!(decoded.len(), bytes.len());
    }
    cold.sort();
    warm.sort();
    (cold, warm)
}

fn deflate_size(bytes: &[u8]) -> usize {
    let mut encoder = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::new(6));
    encoder.write_all(bytes).expect("in-memory deflate");
    encoder.finish().expect("in-memory deflate").len()
}

/// `tar` of the cubins in path order, one zstd stream with long-distance matching over a
/// 1 GiB window, like `tar c | zstd -19 --long=30`.
fn solid_size(cubins: &[(String, Vec<u8>)]) -> usize {
    let mut encoder = zstd::stream::Encoder::new(Vec::new(), LEVEL).expect("zstd encoder");
    encoder
        .long_distance_matching(true)
        .expect("valid parameter");
    encoder.window_log(30).expect("valid parameter");
    let mut archive = tar::Builder::new(encoder);
    for (path, bytes) in cubins {
        append_file(&mut archive, path, bytes);
    }
    let encoder = archive.into_inner().expect("in-memory tar");
    encoder.finish().expect("in-memory zstd").len()
}

fn mb(bytes: usize) -> String {
    format!("{:.2} MB", bytes as f64 / 1e6)
}
