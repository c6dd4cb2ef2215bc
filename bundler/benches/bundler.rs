//! Benchmarks of the bundler, printed as a markdown table (`cargo bench -p bundler`).
//!
//! | benchmark | what is timed or measured | target |
//! | --- | --- | --- |
//! | `keys` | scanning a CUTLASS/CuTe kernel's include graph and computing its keys, vs `nvcc -M` | ≥ 20× faster |
//! | `cold` | a cold build of the default library's full matrix, `jobs = 1` vs `jobs = 2` | (ratio) |
//! | `noop` | `bundle_kernels` on the default library when nothing changed, and the CLI | ≤ 100 ms |
//! | `size` | the bundle of a 60-kernel template library vs each cubin deflated on its own | ≤ 1/3 |
//!
//! Ratios are measured side by side in one run, because the machines this runs on are shared
//! and noisy; nothing here asserts a timing. Parts whose CUDA toolchain (`ci/setup`), CUTLASS
//! headers (`ci/bench-setup`) or `kwheel` binary (`cargo build --release`) is missing are skipped
//! with the reason. Names given after `--` run only those parts:
//! `cargo bench -p bundler --bench bundler -- size`. `KWHEEL_BENCH_KEEP=1` keeps the generated
//! template library and its bundle.
//! How to read the numbers, and the numbers measured: `docs/benchmarks.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bundler::include::{scan_includes, ScanRoots};
use bundler::pipeline::compiler_record;
use bundler::writer::WriteOutcome;
use bundler::{bundle_kernels, BuildToolchain, BundleOptions, BundleSummary};
use prebuilt::index::{CompilerRecord, KernelInputs};
use prebuilt::key::KeyInputs;
use prebuilt::{Arch, Bundle, CudaBuild, KernelKey};

#[path = "bundler/support.rs"]
mod support;
use support::*;

/// Timed runs of the scanner and keys (after one warm-up run).
const KEY_RUNS: usize = 15;
/// Timed runs of `nvcc -M` (after one warm-up run).
const NVCC_M_RUNS: usize = 5;
/// Timed no-op `bundle_kernels` calls, of each kind.
const NOOP_RUNS: usize = 20;
/// Timed no-op CLI runs (after one warm-up run).
const CLI_RUNS: usize = 10;
/// The zip deflate level a plain wheel uses (Python's `zipfile` default, as pip and
/// setuptools write wheels).
const WHEEL_DEFLATE_LEVEL: u32 = 6;

fn main() {
    let selected: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .collect();
    let runs = |part: &str| selected.is_empty() || selected.iter().any(|s| s == part);
    let bench = Bench::new();
    println!("# bundler benchmarks\n");
    println!("machine: {}\n", machine());
    let mut report = Report::default();
    if runs("keys") {
        bench.key_computation(&mut report);
    }
    let default_build = if runs("cold") || runs("noop") {
        bench.cold_builds(&mut report, runs("cold"))
    } else {
        None
    };
    if runs("noop") {
        bench.noop_rebuilds(&mut report, default_build.as_ref());
    }
    if runs("size") {
        bench.bundle_size(&mut report);
    }
    report.print();
}

/// What every part needs: where things are, and the toolchains found.
struct Bench {
    workspace: PathBuf,
    fixtures: PathBuf,
    /// Both CUDA builds of the default matrix, or why not.
    toolchains: Result<Vec<BuildToolchain>, String>,
    cores: usize,
}

impl Bench {
    fn new() -> Bench {
        let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let builds: [CudaBuild; 2] = ["cu129".parse().unwrap(), "cu130".parse().unwrap()];
        let toolchains = builds
            .into_iter()
            .map(|build| BuildToolchain::discover(build).map_err(|error| format!("{error}")))
            .collect();
        Bench {
            workspace: crate_dir
                .parent()
                .expect("bundler/ is in the workspace")
                .into(),
            fixtures: crate_dir.join("benches/fixtures"),
            toolchains,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }

    fn default_manifest(&self) -> PathBuf {
        self.workspace.join("kernels/kernels.toml")
    }

    fn options(&self, manifest: &Path, dir: &Path, jobs: usize) -> BundleOptions {
        BundleOptions {
            manifest: manifest.to_owned(),
            out: dir.join("_prebuilt"),
            cache_dir: dir.join("cache"),
            jobs,
            only: Vec::new(),
            require: false,
            torch: None,
            progress: None,
            toolchains: self.toolchains.as_ref().ok().cloned(),
            farm: None,
        }
    }

    /// Benchmark 2: scan + keys of a CUTLASS kernel vs `nvcc -M` on the same file.
    fn key_computation(&self, report: &mut Report) {
        const NAME: &str = "key computation, CUTLASS kernel (scan + 4 keys) vs `nvcc -M`";
        println!("## keys: {NAME}\n");
        let cutlass = match cutlass_include_dir() {
            Ok(dir) => dir,
            Err(reason) => return report.skip(NAME, "≥ 20×", &reason),
        };
        let cu130: CudaBuild = "cu130".parse().unwrap();
        let nvcc = match bundler::toolchain::discover(cu130) {
            Ok(toolchain) => match toolchain.nvcc {
                Some(nvcc) => nvcc,
                None => return report.skip(NAME, "≥ 20×", "the cu130 toolchain has no nvcc"),
            },
            Err(error) => return report.skip(NAME, "≥ 20×", &error.to_string()),
        };
        let toolchains: Vec<BuildToolchain> = match &self.toolchains {
            Ok(toolchains) => toolchains.clone(),
            Err(_) => match BuildToolchain::discover(cu130) {
                Ok(toolchain) => vec![toolchain],
                Err(error) => return report.skip(NAME, "≥ 20×", &error.to_string()),
            },
        };
        let root = self.fixtures.join("cutlass_gemm");
        let source = root.join("hopper_gemm_bf16.cu");
        let roots = ScanRoots {
            root: root.clone(),
            include_dirs: vec![cutlass.clone()],
            external_dirs: toolchains
                .iter()
                .flat_map(|t| t.include_dirs.iter().cloned())
                .collect(),
        };
        let compilers: Vec<(CudaBuild, CompilerRecord)> = toolchains
            .iter()
            .map(|t| (t.build, compiler_record(t.compiler.id())))
            .collect();
        let nvcc_args = [
            "-M".to_owned(),
            "-I".to_owned(),
            cutlass.display().to_string(),
            "-std=c++17".to_owned(),
            "-arch=sm_90a".to_owned(),
            source.display().to_string(),
        ];
        println!("source: {}", source.display());
        println!("CUTLASS headers: {}", cutlass.display());
        println!("nvcc: {} {}", nvcc.display(), nvcc_args.join(" "));

        // nvcc first: its run also brings every header into the page cache for both sides.
        let mut nvcc_times = Vec::new();
        let mut dependencies = BTreeSet::new();
        for _ in 0..=NVCC_M_RUNS {
            let started = Instant::now();
            let output = Command::new(&nvcc).args(&nvcc_args).output();
            let elapsed = started.elapsed();
            match output {
                Ok(output) if output.status.success() => {
                    dependencies =
                        parse_make_dependencies(&String::from_utf8_lossy(&output.stdout));
                    nvcc_times.push(elapsed);
                }
                Ok(output) => {
                    let reason = format!(
                        "`nvcc -M` failed: {}",
                        String::from_utf8_lossy(&output.stderr).trim()
                    );
                    return report.skip(NAME, "≥ 20×", &reason);
                }
                Err(error) => {
                    let reason = format!("cannot run {}: {error}", nvcc.display());
                    return report.skip(NAME, "≥ 20×", &reason);
                }
            }
        }
        nvcc_times.remove(0); // the warm-up

        let mut key_times = Vec::new();
        let mut graph = None;
        for _ in 0..=KEY_RUNS {
            let started = Instant::now();
            let scanned = match scan_includes(std::slice::from_ref(&source), &roots) {
                Ok(scanned) => scanned,
                Err(error) => {
                    // Reported in full: the error names the header and line the scanner refused.
                    let message = chain(&error);
                    println!("scanner error: {message}\n");
                    report.row(
                        NAME,
                        &format!("scanner error: {message}"),
                        "≥ 20×",
                        "FAILED",
                    );
                    return;
                }
            };
            let keys = cutlass_keys(&scanned, &compilers);
            key_times.push(started.elapsed());
            assert_eq!(keys.len(), 2 * compilers.len());
            graph = Some(scanned);
        }
        key_times.remove(0);
        let graph = graph.expect("at least one scan ran");

        let nvcc_median = median(&nvcc_times);
        let key_median = median(&key_times);
        let ratio = nvcc_median.as_secs_f64() / key_median.as_secs_f64();
        let cutlass_canonical = cutlass.canonicalize().unwrap_or_else(|_| cutlass.clone());
        let in_cutlass = |path: &Path| path.starts_with(&cutlass_canonical);
        let nvcc_cutlass: BTreeSet<&PathBuf> =
            dependencies.iter().filter(|p| in_cutlass(p)).collect();
        let scanned: BTreeSet<PathBuf> = graph
            .files()
            .keys()
            .filter_map(|stable| graph.absolute_path(stable))
            .map(Path::to_owned)
            .collect();
        let scanned_cutlass = scanned.iter().filter(|p| in_cutlass(p)).count();
        let missed: Vec<&&PathBuf> = nvcc_cutlass
            .iter()
            .filter(|p| !scanned.contains(**p))
            .collect();
        println!(
            "graph: {} hashed files ({} CUTLASS/CuTe headers) + {} external (toolkit/system) \
             names; nvcc -M lists {} files, {} of them CUTLASS/CuTe; CUTLASS files nvcc needs \
             that the scan lacks: {}",
            graph.files().len(),
            scanned_cutlass,
            graph.externals().len(),
            dependencies.len(),
            nvcc_cutlass.len(),
            missed.len()
        );
        for path in &missed {
            println!("  missed: {}", path.display());
        }
        println!(
            "scan + keys: median {} of {KEY_RUNS} ({}–{}); nvcc -M: median {} of {NVCC_M_RUNS} \
             ({}–{}); ratio {ratio:.0}×\n",
            ms(key_median),
            ms(min(&key_times)),
            ms(max(&key_times)),
            ms(nvcc_median),
            ms(min(&nvcc_times)),
            ms(max(&nvcc_times)),
        );
        report.row(
            NAME,
            &format!(
                "{} vs {} = **{ratio:.0}×** ({} files hashed, {} CUTLASS; nvcc -M: {} files)",
                ms(key_median),
                ms(nvcc_median),
                graph.files().len(),
                scanned_cutlass,
                dependencies.len()
            ),
            "≥ 20×",
            verdict(ratio >= 20.0 && missed.is_empty()),
        );
    }

    /// Benchmark 3: cold builds of the default matrix with 1 and 2 jobs. Returns the directory
    /// of the 2-job build (its cache and bundle) for the no-op benchmark.
    fn cold_builds(&self, report: &mut Report, record: bool) -> Option<tempfile::TempDir> {
        const NAME: &str = "cold build, default library, full matrix";
        println!("## cold: {NAME}\n");
        if let Err(reason) = &self.toolchains {
            report.skip(NAME, "(ratio)", reason);
            return None;
        }
        let manifest = self.default_manifest();
        // Bring both compilers' files into the page cache, so that neither timed build pays it.
        let warm_up = tempdir();
        let mut options = self.options(&manifest, warm_up.path(), 2);
        options.only = vec!["sigmoid_gate".to_owned()];
        if let Err(error) = bundle_kernels(&options) {
            report.skip(NAME, "", &format!("warm-up build failed: {error}"));
            return None;
        }

        let mut results = Vec::new();
        let mut last = None;
        for jobs in [1, 2] {
            let dir = tempdir();
            let options = self.options(&manifest, dir.path(), jobs);
            let load = load_average();
            let started = Instant::now();
            let summary = match bundle_kernels(&options) {
                Ok(summary) => summary,
                Err(error) => {
                    report.skip(NAME, "", &format!("build failed: {}", chain(&error)));
                    return None;
                }
            };
            let elapsed = started.elapsed();
            println!(
                "jobs = {jobs}: {} compiled, {} cached, {} in {} (load average before: {load})",
                summary.compiled().len(),
                summary.cached(),
                skipped_count(&summary),
                secs(elapsed)
            );
            results.push((jobs, elapsed, summary.compiled().len()));
            last = Some(dir);
        }
        let (one, two) = (results[0].1, results[1].1);
        let speedup = one.as_secs_f64() / two.as_secs_f64();
        println!("speed-up with 2 jobs: {speedup:.2}×\n");
        if record {
            report.row(
                NAME,
                &format!(
                    "{} cubins: jobs 1 {}, jobs 2 {} = **{speedup:.2}×**",
                    results[0].2,
                    secs(one),
                    secs(two)
                ),
                "(ratio)",
                "measured",
            );
        }
        last
    }

    /// Benchmark 1: no-op rebuilds of the default library after a build.
    fn noop_rebuilds(&self, report: &mut Report, built: Option<&tempfile::TempDir>) {
        const NAME: &str = "no-op rebuild, default library, `bundle_kernels`";
        const CLI: &str = "no-op rebuild, default library, CLI end to end";
        println!("## noop: no-op rebuilds of the default library\n");
        let Some(built) = built else {
            let reason = match &self.toolchains {
                Err(reason) => reason.clone(),
                Ok(_) => "the cold build did not complete".to_owned(),
            };
            report.skip(NAME, "≤ 100 ms", &reason);
            report.skip(CLI, "≤ 100 ms", &reason);
            return;
        };
        let manifest = self.default_manifest();
        let dir = built.path();

        // As the CLI calls it: toolchains discovered on every call, jobs = the core count.
        let mut discovered = self.options(&manifest, dir, self.cores);
        discovered.toolchains = None;
        let given = self.options(&manifest, dir, self.cores);
        let mut with_discovery = Vec::new();
        let mut without_discovery = Vec::new();
        for _ in 0..NOOP_RUNS {
            for (options, times) in [
                (&discovered, &mut with_discovery),
                (&given, &mut without_discovery),
            ] {
                let started = Instant::now();
                let summary = bundle_kernels(options).expect("the library built a moment ago");
                times.push(started.elapsed());
                assert!(summary.compiled().is_empty(), "a no-op rebuild compiled");
                assert_eq!(summary.written, WriteOutcome::Unchanged);
            }
        }
        let mut discovery = Vec::new();
        for _ in 0..NOOP_RUNS {
            let started = Instant::now();
            for build in ["cu129", "cu130"] {
                BuildToolchain::discover(build.parse().unwrap()).expect("found before");
            }
            discovery.push(started.elapsed());
        }
        let noop = median(&with_discovery);
        println!(
            "bundle_kernels, toolchains discovered each call: median {} of {NOOP_RUNS} ({}–{})",
            ms(noop),
            ms(min(&with_discovery)),
            ms(max(&with_discovery))
        );
        println!(
            "bundle_kernels, toolchains given: median {} ({}–{}); discovering both toolchains \
             alone: median {}",
            ms(median(&without_discovery)),
            ms(min(&without_discovery)),
            ms(max(&without_discovery)),
            ms(median(&discovery))
        );
        report.row(
            NAME,
            &format!(
                "**{}** ({} with toolchains given; discovering both toolchains alone: {})",
                ms(noop),
                ms(median(&without_discovery)),
                ms(median(&discovery))
            ),
            "≤ 100 ms",
            verdict(noop <= Duration::from_millis(100)),
        );

        let kwheel = match kwheel_binary() {
            Ok(kwheel) => kwheel,
            Err(reason) => {
                println!();
                return report.skip(CLI, "≤ 100 ms", &reason);
            }
        };
        let run_cli = || {
            let started = Instant::now();
            let output = Command::new(&kwheel)
                .args(["dev", "bundle-kernels", "--quiet", "--manifest"])
                .arg(&manifest)
                .arg("--out")
                .arg(dir.join("_prebuilt"))
                .arg("--cache-dir")
                .arg(dir.join("cache"))
                .current_dir(&self.workspace)
                .output();
            (started.elapsed(), output)
        };
        let mut cli_times = Vec::new();
        for _ in 0..=CLI_RUNS {
            let (elapsed, output) = run_cli();
            match output {
                Ok(output) if output.status.success() => cli_times.push(elapsed),
                Ok(output) => {
                    let reason = format!(
                        "{} failed: {}",
                        kwheel.display(),
                        String::from_utf8_lossy(&output.stderr).trim()
                    );
                    println!();
                    return report.skip(CLI, "≤ 100 ms", &reason);
                }
                Err(error) => {
                    println!();
                    let reason = format!("cannot run {}: {error}", kwheel.display());
                    return report.skip(CLI, "≤ 100 ms", &reason);
                }
            }
        }
        cli_times.remove(0); // the first run pages the binary in
        let cli = median(&cli_times);
        println!(
            "{} dev bundle-kernels (second run on): median {} of {CLI_RUNS} ({}–{})\n",
            kwheel.display(),
            ms(cli),
            ms(min(&cli_times)),
            ms(max(&cli_times))
        );
        report.row(
            CLI,
            &format!("**{}**", ms(cli)),
            "≤ 100 ms",
            verdict(cli <= Duration::from_millis(100)),
        );
    }

    /// Benchmark 4: the bundle of a generated many-instantiation library (and of the default
    /// library) vs its cubins deflated one by one, as a plain wheel's zip stores them.
    fn bundle_size(&self, report: &mut Report) {
        const NAME: &str = "bundle size, template library, vs each cubin deflated (level 6)";
        println!("## size: {NAME}\n");
        if let Err(reason) = &self.toolchains {
            return report.skip(NAME, "≤ 1/3", reason);
        }
        let library = tempdir();
        let kernels =
            write_template_library(&self.fixtures.join("template_library"), library.path());
        // The cache outlives the run (next to this benchmark's binary), so that rerunning the
        // benchmark does not recompile the library; the bundle is written fresh every time.
        let cache = bench_cache_dir();
        let mut options = self.options(&library.path().join("kernels.toml"), library.path(), 2);
        options.cache_dir = cache.clone();
        println!(
            "{kernels} kernels generated in {}; build cache {}",
            library.path().display(),
            cache.display()
        );
        let started = Instant::now();
        let summary = match bundle_kernels(&options) {
            Ok(summary) => summary,
            Err(error) => {
                return report.skip(NAME, "≤ 1/3", &format!("build failed: {}", chain(&error)))
            }
        };
        if std::env::var_os("KWHEEL_BENCH_KEEP").is_some_and(|v| !v.is_empty()) {
            println!("kept (KWHEEL_BENCH_KEEP): {}", library.keep().display());
        }
        println!(
            "built in {} (jobs = 2): {} compiled, {} from the build cache, {}",
            secs(started.elapsed()),
            summary.compiled().len(),
            summary.cached(),
            skipped_count(&summary)
        );
        let sizes = measure_bundle(&summary.out);
        sizes.print();
        report.row(
            NAME,
            &sizes.cell(),
            "≤ 1/3",
            verdict(sizes.ratio() <= 1.0 / 3.0),
        );
        compression_alternatives(&sizes);

        // The default library too, for scale: few kernels, so the dictionary has little to learn.
        const DEFAULT: &str = "bundle size, default library, vs each cubin deflated (level 6)";
        let dir = tempdir();
        let mut options = self.options(&self.default_manifest(), dir.path(), 2);
        options.cache_dir = cache;
        match bundle_kernels(&options) {
            Ok(summary) => {
                let sizes = measure_bundle(&summary.out);
                println!("default library:");
                sizes.print();
                report.row(
                    DEFAULT,
                    &sizes.cell(),
                    "(for scale)",
                    verdict(sizes.ratio() <= 1.0 / 3.0),
                );
            }
            Err(error) => report.skip(DEFAULT, "", &chain(&error)),
        }
        println!();
    }
}
