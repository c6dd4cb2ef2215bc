//! First-call latency of every kernel of a bundle, against NVRTC JIT of the same kernel.
//!
//! ```text
//! cargo run --release -p prebuilt --example first_call -- <bundle> \
//!     [--cuda cu130] [--torch 2.11.0] [--repetitions 25] [--jit-repetitions 3] [--json out.json]
//! ```
//!
//! After the CUDA context exists (created once, timed apart, as PyTorch pays it too), each
//! kernel's first call is measured from nothing: a fresh [`Registry`] (read the index),
//! selection, reading the artifact, sha256 verification, zstd decompression, `cuModuleLoadData`
//! and `cuModuleGetFunction` for every entry; the module is unloaded between repetitions. The
//! JIT column is the same first call on a copy of the bundle without that kernel's cubins and
//! with an empty JIT cache: the shipped sources verified and compiled by NVRTC (or nvcc, as the
//! search finds), validated, cached, and loaded. libnvrtc itself is loaded before timing.
//!
//! Beside each first call, in the same process: the bare `cuModuleLoadData` +
//! `cuModuleGetFunction` of the same (already decoded) cubin, straight through the driver,
//! which is the floor a first call can reach; and the warm first call, the same kernel loaded
//! by a registry that has already loaded another kernel whose frame reads the same reference
//! (its family's reference cubin or dictionary is then decoded and held), where one exists.
//! The cold first call is the plain one: a fresh registry, its family's reference read too.
//! And the least any verified load from the compressed bundle can cost, each step alone: the
//! bare load, plus decoding the cubin's frame (its reference already decoded) and the sha256
//! that is checked before every load.
//!
//! Prints markdown tables (the breakdown of one first call, and the comparison) for
//! `docs/benchmarks.md`; `--json` also writes the numbers for `load_inline_bench.py`.
//!
//! A kernel whose variant is PTX (`compute_90`) has its first call include the driver's
//! compile of that PTX, unless the driver finds it in its JIT cache (`~/.nv/ComputeCache`, or
//! `CUDA_CACHE_PATH`): run with `CUDA_CACHE_DISABLE=1` for the compile every time, or with a
//! fresh `CUDA_CACHE_PATH` for one compile and then cache hits. The header says which.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use cudarc::driver::result;
use prebuilt::bundle::{
    decompress_bounded, decompress_with_prefix, prefix_path, Bundle, INDEX_FILE,
};
use prebuilt::device::DriverVersion;
use prebuilt::driver::{Context, Driver};
use prebuilt::jit::CompilerSearch;
use prebuilt::key::sha256_hex;
use prebuilt::registry::{ProvenanceKind, Registry, RegistryOptions};
use prebuilt::select::select_variant;
use prebuilt::untrusted::MAX_ARTIFACT_SIZE;
use prebuilt::CudaBuild;
use prebuilt::JitPolicy;

struct Arguments {
    bundle: PathBuf,
    cuda: Option<CudaBuild>,
    torch: Option<String>,
    repetitions: usize,
    jit_repetitions: usize,
    json: Option<PathBuf>,
    /// Only these kernels (all when empty).
    kernels: Vec<String>,
    /// Whether to measure the JIT column.
    jit: bool,
}

fn parse_arguments() -> Result<Arguments, String> {
    let mut arguments = Arguments {
        bundle: PathBuf::new(),
        cuda: None,
        torch: None,
        repetitions: 25,
        jit_repetitions: 3,
        json: None,
        kernels: Vec::new(),
        jit: true,
    };
    let mut bundle = None;
    let mut words = std::env::args().skip(1);
    while let Some(word) = words.next() {
        let mut value = |name: &str| words.next().ok_or_else(|| format!("{name} needs a value"));
        match word.as_str() {
            "--cuda" => {
                let text = value("--cuda")?;
                arguments.cuda = Some(text.parse().map_err(|error| format!("--cuda: {error}"))?);
            }
            "--torch" => arguments.torch = Some(value("--torch")?),
            "--repetitions" => {
                arguments.repetitions = value("--repetitions")?
                    .parse()
                    .map_err(|error| format!("--repetitions: {error}"))?;
            }
            "--jit-repetitions" => {
                arguments.jit_repetitions = value("--jit-repetitions")?
                    .parse()
                    .map_err(|error| format!("--jit-repetitions: {error}"))?;
            }
            "--json" => arguments.json = Some(PathBuf::from(value("--json")?)),
            "--kernels" => {
                arguments.kernels = value("--kernels")?.split(',').map(str::to_owned).collect();
            }
            "--no-jit" => arguments.jit = false,
            "-h" | "--help" => {
                return Err(
                    "usage: first_call <bundle> [--cuda cu130] [--torch 2.11.0] \
                     [--repetitions 25] [--jit-repetitions 3] [--json out.json] \
                     [--kernels a,b] [--no-jit]"
                        .to_owned(),
                )
            }
            _ if word.starts_with('-') => return Err(format!("unknown option {word}")),
            _ => bundle = Some(PathBuf::from(word)),
        }
    }
    arguments.bundle = bundle.ok_or("give the bundle directory")?;
    arguments.repetitions = arguments.repetitions.max(1);
    arguments.jit_repetitions = arguments.jit_repetitions.max(1);
    Ok(arguments)
}

fn options(arguments: &Arguments, jit: JitPolicy, cache: &Path) -> RegistryOptions {
    RegistryOptions {
        cuda: arguments.cuda,
        torch: arguments.torch.clone(),
        jit,
        jit_cache: cache.to_path_buf(),
        ..RegistryOptions::default()
    }
}

fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// One first call, by phase, through the public pieces the registry is made of.
struct Phases {
    open: Duration,
    select: Duration,
    read: Duration,
    load: Duration,
}

fn phases(arguments: &Arguments, name: &str, cache: &Path) -> Result<Phases, String> {
    let started = Instant::now();
    let registry = Registry::open_with(
        &arguments.bundle,
        options(arguments, JitPolicy::Disabled, cache),
    )
    .map_err(|error| error.to_string())?;
    let open = started.elapsed();
    let started = Instant::now();
    let query = registry.device_query().map_err(|error| error.to_string())?;
    let record = registry
        .catalog()
        .record(name)
        .map_err(|error| error.to_string())?
        .ok_or_else(|| format!("no kernel `{name}`"))?;
    let choice = select_variant(name, &record, &query).map_err(|no_fit| no_fit.to_string())?;
    let select = started.elapsed();
    let started = Instant::now();
    registry
        .catalog()
        .read_artifact(name, choice.variant)
        .map_err(|error| error.to_string())?;
    let read = started.elapsed();
    let started = Instant::now();
    registry.load(name).map_err(|error| error.to_string())?;
    let load = started.elapsed();
    Ok(Phases {
        open,
        select,
        read,
        load,
    })
}

fn run() -> Result<(), String> {
    let arguments = parse_arguments()?;
    let scratch = tempfile::tempdir().map_err(|error| error.to_string())?;
    let unused_cache = scratch.path().join("unused-jit-cache");

    let started = Instant::now();
    let driver = Driver::get().map_err(|error| error.to_string())?;
    let driver_time = started.elapsed();
    let started = Instant::now();
    let context = Context::primary(0).map_err(|error| error.to_string())?;
    let context_time = started.elapsed();
    let device = context.device().clone();
    make_primary_current()?;

    let probe = Registry::open_with(
        &arguments.bundle,
        options(&arguments, JitPolicy::Disabled, &unused_cache),
    )
    .map_err(|error| error.to_string())?;
    let query = probe.device_query().map_err(|error| error.to_string())?;
    let names: Vec<String> = if arguments.kernels.is_empty() {
        probe.catalog().names().map_err(|error| error.to_string())?
    } else {
        arguments.kernels.clone()
    };
    drop(probe);

    // The JIT copy: the same bundle without any cubin, so every kernel compiles.
    let stripped = scratch.path().join("_prebuilt");
    let compiler = if arguments.jit {
        copy_dir(&arguments.bundle, &stripped)?;
        let mut index = Bundle::open(&stripped)
            .map_err(|error| error.to_string())?
            .index()
            .clone();
        for record in index.kernels.values_mut() {
            record.variants.clear();
        }
        std::fs::write(stripped.join(INDEX_FILE), index.to_json())
            .map_err(|error| error.to_string())?;
        std::fs::write(
            stripped.join(prebuilt::lookup::LOOKUP_FILE),
            prebuilt::lookup::encode(&index),
        )
        .map_err(|error| error.to_string())?;
        let compiler = CompilerSearch::from_env()
            .find(query.cuda, Some(query.driver))
            .map_err(|error| error.to_string())?;
        Some(compiler)
    } else {
        None
    };
    let compiler_name = compiler
        .as_ref()
        .map_or_else(|| "none (--no-jit)".to_owned(), ToString::to_string);

    println!(
        "device {} (compute {}), driver CUDA {}, CUDA build {}, JIT with {compiler_name}",
        device.name(),
        query.device(),
        DriverVersion::from_api(driver.version()),
        query.cuda
    );
    println!(
        "libcuda + cuInit {:.1} ms, primary context {:.1} ms (paid once per process, by PyTorch \
         too)",
        ms(driver_time),
        ms(context_time)
    );
    let setting = |name: &str| std::env::var(name).unwrap_or_else(|_| "unset".to_owned());
    println!(
        "driver JIT cache for PTX: CUDA_CACHE_DISABLE={}, CUDA_CACHE_PATH={}\n",
        setting("CUDA_CACHE_DISABLE"),
        setting("CUDA_CACHE_PATH")
    );

    let mut rows = Vec::new();
    let mut floors = Vec::new();
    let mut report = BTreeMap::new();
    println!("| kernel | open index | device query + select | read + verify + decompress | load + get function (incl. read) |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for name in &names {
        match phases(&arguments, name, &unused_cache) {
            Ok(phases) => println!(
                "| `{name}` | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms |",
                ms(phases.open),
                ms(phases.select),
                ms(phases.read),
                ms(phases.load)
            ),
            Err(reason) => println!("| `{name}` | {reason} | | | |"),
        }
    }
    println!();

    for name in &names {
        let mut first_calls = Vec::new();
        let mut variant = String::new();
        let mut failure = None;
        for _ in 0..arguments.repetitions {
            let started = Instant::now();
            let result = Registry::open_with(
                &arguments.bundle,
                options(&arguments, JitPolicy::Disabled, &unused_cache),
            )
            .and_then(|registry| registry.load(name));
            let elapsed = started.elapsed();
            match result {
                Ok(kernel) => {
                    assert_eq!(kernel.provenance().kind(), ProvenanceKind::Prebuilt);
                    variant = match kernel.provenance() {
                        prebuilt::registry::Provenance::Prebuilt { variant, .. } => variant.clone(),
                        _ => unreachable!(),
                    };
                    first_calls.push(elapsed);
                    // Dropping the kernel and its registry unloads the module.
                }
                Err(error) => {
                    failure = Some(error.to_string());
                    break;
                }
            }
        }
        let mut jit_calls = Vec::new();
        let jit_repetitions = if arguments.jit {
            arguments.jit_repetitions
        } else {
            0
        };
        for repetition in 0..jit_repetitions {
            let cache = scratch.path().join(format!("jit-{name}-{repetition}"));
            let started = Instant::now();
            let result =
                Registry::open_with(&stripped, options(&arguments, JitPolicy::Allowed, &cache))
                    .and_then(|registry| registry.load(name));
            let elapsed = started.elapsed();
            match result {
                Ok(kernel) => {
                    assert_eq!(kernel.provenance().kind(), ProvenanceKind::JitCompiled);
                    jit_calls.push(elapsed);
                }
                Err(error) => {
                    failure.get_or_insert_with(|| format!("JIT: {error}"));
                    break;
                }
            }
        }
        if let Some(reason) = failure {
            rows.push(format!("| `{name}` | {reason} | | | |"));
            continue;
        }
        let (minimum, maximum) = (
            *first_calls.iter().min().unwrap(),
            *first_calls.iter().max().unwrap(),
        );
        let first_call = median(&mut first_calls);
        let jit = if jit_calls.is_empty() {
            Duration::ZERO
        } else {
            median(&mut jit_calls)
        };
        let ratio = jit.as_secs_f64() / first_call.as_secs_f64();
        let (bare, warm, floor) = bare_and_warm(&arguments, name, &names, &unused_cache)?;
        let least = bare + floor.decode + floor.sha256;
        floors.push(format!(
            "| `{name}` | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms | {:.2}× |",
            ms(bare),
            ms(floor.decode),
            ms(floor.sha256),
            ms(least),
            least.as_secs_f64() / bare.as_secs_f64()
        ));
        let warm_cell = warm.as_ref().map_or_else(
            || "no sibling".to_owned(),
            |(sibling, time)| {
                format!(
                    "{:.3} ms ({:.1}×, after `{sibling}`)",
                    ms(*time),
                    time.as_secs_f64() / bare.as_secs_f64()
                )
            },
        );
        rows.push(format!(
            "| `{name}` | {variant} | {:.3} ms ({:.3}–{:.3}) | {:.3} ms | {:.1}× | {warm_cell} | {:.1} ms | {ratio:.0}× |",
            ms(first_call),
            ms(minimum),
            ms(maximum),
            ms(bare),
            first_call.as_secs_f64() / bare.as_secs_f64(),
            ms(jit)
        ));
        report.insert(
            name.clone(),
            serde_json::json!({
                "variant": variant,
                "first_call_ms": ms(first_call),
                "first_call_min_ms": ms(minimum),
                "first_call_max_ms": ms(maximum),
                "jit_ms": ms(jit),
                "bare_load_ms": ms(bare),
                "cold_over_bare": first_call.as_secs_f64() / bare.as_secs_f64(),
                "warm_ms": warm.as_ref().map(|(_, time)| ms(*time)),
                "warm_after": warm.as_ref().map(|(sibling, _)| sibling.clone()),
                "warm_over_bare": warm.as_ref().map(|(_, time)| time.as_secs_f64() / bare.as_secs_f64()),
                "warm_decode_ms": ms(floor.decode),
                "sha256_ms": ms(floor.sha256),
                "contract_floor_over_bare": least.as_secs_f64() / bare.as_secs_f64(),
                "jit_over_first_call": ratio,
            }),
        );
    }
    println!(
        "| kernel | loads | cold first call, median of {} (min–max) | bare load | cold / bare | warm first call (/ bare) | {} JIT, median of {} | JIT / first call |",
        arguments.repetitions,
        compiler.as_ref().map_or_else(|| "no".to_owned(), |c| c.kind().to_string()),
        arguments.jit_repetitions
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for row in &rows {
        println!("{row}");
    }
    println!(
        "\nThe least a verified load from a compressed bundle costs (medians of {}, warm: the \
         frame's reference already decoded): bare load + decoding the frame + the sha256 of the \
         cubin, each alone, no index, selection, read or bookkeeping.\n",
        arguments.repetitions
    );
    println!("| kernel | bare load | decode | sha256 | bare + decode + sha256 | / bare |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for row in &floors {
        println!("{row}");
    }
    if let Some(path) = &arguments.json {
        let json = serde_json::json!({
            "device": device.name(),
            "capability": query.device(),
            "driver": DriverVersion::from_api(driver.version()).to_string(),
            "cuda": query.cuda.to_string(),
            "jit_compiler": compiler_name,
            "context_ms": ms(context_time),
            "kernels": report,
        });
        std::fs::write(path, serde_json::to_string_pretty(&json).unwrap() + "\n")
            .map_err(|error| format!("cannot write {}: {error}", path.display()))?;
    }
    drop(context);
    Ok(())
}

/// The bare load of a verified `image`: `cuModuleLoadData` and `cuModuleGetFunction` of every
/// symbol, straight through the driver with device 0's primary context current (set by
/// [`make_primary_current`]); the module is unloaded after the clock stops.
fn bare_load(image: &[u8], symbols: &[CString]) -> Result<Duration, String> {
    let terminated;
    let image = if image.starts_with(b"\x7fELF") || image.last() == Some(&0) {
        image
    } else {
        terminated = [image, &[0]].concat();
        &terminated
    };
    let started = Instant::now();
    // SAFETY: `image` is a whole cubin whose sha256 the catalog checked, or NUL-terminated PTX,
    // readable for the call (which copies it); the primary context is current on this thread.
    let module = unsafe { result::module::load_data(image.as_ptr().cast()) }
        .map_err(|error| format!("cuModuleLoadData: {error:?}"))?;
    for symbol in symbols {
        // SAFETY: `module` is loaded and its context current.
        unsafe { result::module::get_function(module, symbol.clone()) }
            .map_err(|error| format!("cuModuleGetFunction {symbol:?}: {error:?}"))?;
    }
    let elapsed = started.elapsed();
    // SAFETY: `module` was loaded above and no function of it outlives this call.
    unsafe { result::module::unload(module) }
        .map_err(|error| format!("cuModuleUnload: {error:?}"))?;
    Ok(elapsed)
}

/// Makes device 0's primary context (the one the registry uses) current on this thread, for
/// [`bare_load`]; the retain is kept for the process.
fn make_primary_current() -> Result<(), String> {
    // SAFETY: plain driver calls on device 0, whose primary context the registry retained
    // already; the retain taken here is never released, so the handle stays valid.
    unsafe {
        let device = result::device::get(0).map_err(|error| format!("cuDeviceGet: {error:?}"))?;
        let context = result::primary_ctx::retain(device)
            .map_err(|error| format!("cuDevicePrimaryCtxRetain: {error:?}"))?;
        result::ctx::set_current(context).map_err(|error| format!("cuCtxSetCurrent: {error:?}"))
    }
}

/// Medians of the bare load of `name`'s chosen cubin, and of its warm first call (after a
/// sibling sharing its frame's reference was loaded by the same registry; `None` without one).
fn bare_and_warm(
    arguments: &Arguments,
    name: &str,
    names: &[String],
    cache: &Path,
) -> Result<(Duration, Warm, Floor), String> {
    let open = || {
        Registry::open_with(
            &arguments.bundle,
            options(arguments, JitPolicy::Disabled, cache),
        )
        .map_err(|error| error.to_string())
    };
    let registry = open()?;
    let query = registry.device_query().map_err(|error| error.to_string())?;
    let chosen = |registry: &Registry, kernel: &str| -> Result<_, String> {
        let record = registry
            .catalog()
            .record(kernel)
            .map_err(|error| error.to_string())?
            .ok_or_else(|| format!("no kernel `{kernel}`"))?;
        let choice =
            select_variant(kernel, &record, &query).map_err(|no_fit| no_fit.to_string())?;
        Ok(choice.variant.clone())
    };
    let variant = chosen(&registry, name)?;
    let image = registry
        .catalog()
        .read_artifact(name, &variant)
        .map_err(|error| error.to_string())?;
    let symbols: Vec<CString> = variant
        .functions
        .iter()
        .map(|function| CString::new(function.symbol.clone()).map_err(|error| error.to_string()))
        .collect::<Result<_, _>>()?;
    let mut bare = Vec::new();
    for _ in 0..arguments.repetitions {
        bare.push(bare_load(&image, &symbols)?);
    }
    let floor = contract_floor(&arguments.bundle, &variant, &image, arguments.repetitions)?;
    let mut warm = None;
    if let Some(reference) = &variant.artifact.dictionary {
        let sibling = names.iter().filter(|other| *other != name).find(|other| {
            chosen(&registry, other)
                .is_ok_and(|sibling| sibling.artifact.dictionary.as_ref() == Some(reference))
        });
        if let Some(sibling) = sibling {
            let mut times = Vec::new();
            for _ in 0..arguments.repetitions {
                let registry = open()?;
                let _held = registry.load(sibling).map_err(|error| error.to_string())?;
                let started = Instant::now();
                let kernel = registry.load(name).map_err(|error| error.to_string())?;
                times.push(started.elapsed());
                drop(kernel);
            }
            warm = Some((sibling.clone(), median(&mut times)));
        }
    }
    Ok((median(&mut bare), warm, floor))
}

/// A warm first call's sibling and median, when the kernel has one.
type Warm = Option<(String, Duration)>;

/// What the bundle's two contracts cost a load of one cubin at the least, each step alone and
/// warm: decoding its frame (its reference already decoded and held, as a warm first call
/// finds it) and the sha256 of the decoded cubin, checked before anything loads it.
struct Floor {
    decode: Duration,
    sha256: Duration,
}

/// Medians of [`Floor`]'s steps for `variant`, read from the bundle at `root`, through the
/// functions the loader decodes and hashes with; `image` is the verified cubin.
fn contract_floor(
    root: &Path,
    variant: &prebuilt::Variant,
    image: &[u8],
    repetitions: usize,
) -> Result<Floor, String> {
    let stored = &variant.artifact;
    let read = |relative: &str| {
        std::fs::read(root.join(relative)).map_err(|error| format!("{relative}: {error}"))
    };
    let frame = read(&stored.path)?;
    let reference = match &stored.dictionary {
        Some(digest) => {
            let relative =
                prefix_path(root, digest).ok_or_else(|| format!("no reference {digest}"))?;
            Some(
                decompress_with_prefix(&read(&relative)?, &[], MAX_ARTIFACT_SIZE)
                    .map_err(|error| format!("{relative}: {error}"))?,
            )
        }
        None => None,
    };
    let decode = || match &reference {
        Some(prefix) => decompress_with_prefix(&frame, prefix, stored.size),
        None => decompress_bounded(&frame, None, stored.size),
    };
    if decode().map_err(|error| format!("{}: {error}", stored.path))? != image {
        return Err(format!(
            "{} does not decode to the loaded cubin",
            stored.path
        ));
    }
    let timed = |step: &dyn Fn()| {
        let mut times: Vec<Duration> = (0..repetitions)
            .map(|_| {
                let started = Instant::now();
                step();
                started.elapsed()
            })
            .collect();
        median(&mut times)
    };
    Ok(Floor {
        decode: timed(&|| {
            std::hint::black_box(decode().ok());
        }),
        sha256: timed(&|| {
            std::hint::black_box(sha256_hex(std::hint::black_box(image)));
        }),
    })
}

fn copy_dir(from: &Path, to: &Path) -> Result<(), String> {
    let error =
        |path: &Path, error: std::io::Error| format!("cannot copy {}: {error}", path.display());
    std::fs::create_dir_all(to).map_err(|e| error(to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| error(from, e))? {
        let entry = entry.map_err(|e| error(from, e))?;
        let target = to.join(entry.file_name());
        if entry
            .file_type()
            .map_err(|e| error(&entry.path(), e))?
            .is_dir()
        {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target).map_err(|e| error(&entry.path(), e))?;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("first_call: {message}");
            ExitCode::FAILURE
        }
    }
}
