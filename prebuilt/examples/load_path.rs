//! The host CPU cost of a kernel's first load through [`Registry`], on a fake device: what a
//! first call costs before and around `cuModuleLoadData`, measured without a GPU.
//!
//! ```text
//! cargo run --release -p prebuilt --example load_path -- <bundle> \
//!     [--repetitions 101] [--limit 20] [--device 9.0] [--driver 13.0]
//! ```
//!
//! For every kernel of the bundle (or `--limit` of them, evenly spaced), medians over the
//! repetitions of:
//!
//! | column | what is timed |
//! | --- | --- |
//! | open | `Registry::open_on` of the bundle (options made before the clock starts) |
//! | cold load | the first `load` of the kernel on a fresh registry: record, device query, plan, read, decompress (its reference too), sha256, the fake device's load |
//! | warm load | the same on a registry that already loaded a sibling whose frame has the same reference (a family dictionary or a reference cubin); `-` when none |
//! | record | `Catalog::record`: finding and decoding the kernel's index record |
//! | query + select | the device query of a fresh registry and `select_variant` |
//! | read | reading the kernel's frame, and on a cold load its reference's, as the loader does (`read_inside`) |
//! | decompress | decompressing them (the reference first, then the frame against it) |
//! | sha256 | hashing the decoded cubin, which is checked before anything loads it |
//!
//! The device is `prebuilt::testing::FakeDevice` (compute capability `--device`, default 9.0,
//! so `sm_90a` variants are chosen), whose load only copies the image: every column is host
//! work the real load pays too.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prebuilt::bundle::{decompress_bounded, decompress_with_prefix, prefix_path, read_inside};
use prebuilt::device::DeviceQuery;
use prebuilt::key::sha256_hex;
use prebuilt::registry::Device;
use prebuilt::select::select_variant;
use prebuilt::testing::FakeDevice;
use prebuilt::untrusted::{ArtifactPath, MAX_ARTIFACT_SIZE};
use prebuilt::{JitPolicy, Registry, RegistryOptions, Variant};

struct Arguments {
    bundle: PathBuf,
    repetitions: usize,
    limit: Option<usize>,
    capability: (u32, u32),
    driver: String,
    /// Load every kernel once on one registry and count the outcomes (`--every-kernel`).
    every_kernel: bool,
}

fn parse_arguments() -> Result<Arguments, String> {
    let mut arguments = Arguments {
        bundle: PathBuf::new(),
        repetitions: 101,
        limit: None,
        capability: (9, 0),
        driver: "13.0".to_owned(),
        every_kernel: false,
    };
    let mut bundle = None;
    let mut words = std::env::args().skip(1);
    while let Some(word) = words.next() {
        let mut value = |name: &str| words.next().ok_or_else(|| format!("{name} needs a value"));
        match word.as_str() {
            "--repetitions" => {
                arguments.repetitions = value("--repetitions")?
                    .parse()
                    .map_err(|error| format!("--repetitions: {error}"))?;
            }
            "--limit" => {
                let limit = value("--limit")?;
                arguments.limit = Some(limit.parse().map_err(|error| format!("--limit: {error}"))?);
            }
            "--device" => {
                arguments.capability = DeviceQuery::parse_device(&value("--device")?)
                    .map_err(|error| format!("--device: {error}"))?;
            }
            "--driver" => arguments.driver = value("--driver")?,
            "--every-kernel" => arguments.every_kernel = true,
            "-h" | "--help" => {
                return Err("usage: load_path <bundle> [--repetitions 101] [--limit N] \
                            [--device 9.0] [--driver 13.0]"
                    .to_owned())
            }
            _ if word.starts_with('-') => return Err(format!("unknown option {word}")),
            _ => bundle = Some(PathBuf::from(word)),
        }
    }
    arguments.bundle = bundle.ok_or("give the bundle directory")?;
    arguments.repetitions = arguments.repetitions.max(1);
    Ok(arguments)
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn us(duration: Duration) -> String {
    format!("{:.1}", duration.as_secs_f64() * 1e6)
}

/// Times `body` `repetitions` times, each after its own untimed `setup`; the median.
fn timed<S, T>(
    repetitions: usize,
    mut setup: impl FnMut() -> Result<S, String>,
    mut body: impl FnMut(S) -> Result<T, String>,
) -> Result<Duration, String> {
    let mut times = Vec::with_capacity(repetitions);
    for _ in 0..repetitions {
        let state = setup()?;
        let started = Instant::now();
        let result = body(state);
        times.push(started.elapsed());
        // Dropped after the clock stopped: a registry's teardown is not the load's cost.
        drop(result?);
    }
    Ok(median(times))
}

/// The frame a variant's frame is compressed against, or the variant's own digest: two
/// variants with the same reference share its decoded bytes within a registry.
fn reference(variant: &Variant) -> &str {
    variant
        .artifact
        .dictionary
        .as_deref()
        .unwrap_or(&variant.artifact.digest)
}

struct Row {
    name: String,
    variant: String,
    times: [Option<Duration>; 8],
}

fn run() -> Result<(), String> {
    let arguments = parse_arguments()?;
    let scratch = tempfile::tempdir().map_err(|error| error.to_string())?;
    let options = RegistryOptions {
        jit: JitPolicy::Disabled,
        jit_cache: scratch.path().join("jit-cache"),
        artifact_cache: scratch.path().join("artifact-cache"),
        ..RegistryOptions::default()
    };
    // A fake device per registry, as each process has its own: one shared by every
    // repetition would keep every image it was handed, and its growing heap would be timed.
    let device = || -> Arc<dyn Device> { FakeDevice::new(arguments.capability, &arguments.driver) };
    let root = arguments.bundle.as_path();
    let open = || -> Result<Registry, String> {
        Registry::open_on(root, options.clone(), device(), None).map_err(|error| error.to_string())
    };

    if arguments.every_kernel {
        return load_every_kernel(&open()?);
    }
    let probe = open()?;
    let query = probe.device_query().map_err(|error| error.to_string())?;
    let mut names = probe.catalog().names().map_err(|error| error.to_string())?;
    // Every kernel's chosen variant, for the siblings.
    let mut chosen = Vec::new();
    for name in &names {
        let record = probe
            .catalog()
            .record(name)
            .map_err(|error| error.to_string())?
            .ok_or_else(|| format!("no kernel `{name}`"))?;
        let variant = select_variant(name, &record, &query)
            .ok()
            .map(|choice| choice.variant.clone());
        chosen.push(variant);
    }
    let all: Vec<(String, Option<Variant>)> = names.iter().cloned().zip(chosen).collect();
    if let Some(limit) = arguments.limit {
        let step = names.len().div_ceil(limit.max(1)).max(1);
        names = names.iter().step_by(step).cloned().collect();
    }
    println!(
        "bundle {}: {} kernels, {} measured; fake device {}.{}, driver {}, CUDA build {}; \
         medians of {} repetitions, µs\n",
        root.display(),
        all.len(),
        names.len(),
        arguments.capability.0,
        arguments.capability.1,
        arguments.driver,
        query.cuda,
        arguments.repetitions
    );

    let repetitions = arguments.repetitions;
    let mut rows = Vec::new();
    for name in &names {
        let Some((_, Some(variant))) = all.iter().find(|(other, _)| other == name) else {
            rows.push(Row {
                name: name.clone(),
                variant: "none fits".to_owned(),
                times: [None; 8],
            });
            continue;
        };
        let sibling = all.iter().find_map(|(other, chosen)| {
            let chosen = chosen.as_ref()?;
            (other != name && reference(chosen) == reference(variant)).then_some(other)
        });
        let open_time = timed(
            repetitions,
            || Ok((options.clone(), device())),
            |(options, device)| {
                Registry::open_on(root, options, device, None).map_err(|error| error.to_string())
            },
        )?;
        let cold = timed(repetitions, open, |registry| {
            let kernel = registry.load(name).map_err(|error| error.to_string())?;
            Ok((kernel, registry))
        })?;
        let warm = sibling
            .map(|sibling| {
                timed(
                    repetitions,
                    || {
                        let registry = open()?;
                        registry.load(sibling).map_err(|error| error.to_string())?;
                        Ok(registry)
                    },
                    |registry| {
                        let kernel = registry.load(name).map_err(|error| error.to_string())?;
                        Ok((kernel, registry))
                    },
                )
            })
            .transpose()?;
        let record = timed(repetitions, open, |registry| {
            let record = registry.catalog().record(name);
            Ok((record, registry))
        })?;
        let select = timed(
            repetitions,
            || {
                let registry = open()?;
                let record = registry
                    .catalog()
                    .record(name)
                    .map_err(|error| error.to_string())?
                    .ok_or("no record")?;
                Ok((registry, record))
            },
            |(registry, record)| {
                let query = registry.device_query().map_err(|error| error.to_string())?;
                let label = select_variant(name, &record, &query)
                    .map(|choice| choice.variant.label())
                    .map_err(|no_fit| no_fit.to_string())?;
                Ok((label, registry, record))
            },
        )?;
        let (read, decompress, sha256) = primitives(root, variant, repetitions)?;
        rows.push(Row {
            name: name.clone(),
            variant: variant.label(),
            times: [
                Some(open_time),
                Some(cold),
                warm,
                Some(record),
                Some(select),
                Some(read),
                Some(decompress),
                Some(sha256),
            ],
        });
    }

    println!(
        "| kernel | variant | open | cold load | warm load | record | query + select | read | \
         decompress | sha256 |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let cell = |time: &Option<Duration>| time.map_or_else(|| "-".to_owned(), us);
    for row in &rows {
        let cells: Vec<String> = row.times.iter().map(cell).collect();
        println!(
            "| `{}` | {} | {} |",
            row.name,
            row.variant,
            cells.join(" | ")
        );
    }
    if rows.len() > 1 {
        let column = |at: usize| {
            let times: Vec<Duration> = rows.iter().filter_map(|row| row.times[at]).collect();
            (!times.is_empty()).then(|| median(times))
        };
        let cells: Vec<String> = (0..8).map(|at| cell(&column(at))).collect();
        println!("| median of kernels | | {} |", cells.join(" | "));
    }
    Ok(())
}

/// Medians of the read, decompress and sha256 of `variant`'s frame (and its reference's), each
/// step alone, through the functions the loader reads artifacts with.
fn primitives(
    root: &Path,
    variant: &Variant,
    repetitions: usize,
) -> Result<(Duration, Duration, Duration), String> {
    let stored = &variant.artifact;
    let frame_path = root.join(&stored.path);
    let reference_path = stored
        .dictionary
        .as_deref()
        .map(|digest| {
            prefix_path(root, digest)
                .map(|relative| root.join(relative))
                .ok_or_else(|| format!("no reference {digest}"))
        })
        .transpose()?;
    // The loader's read: the file opened where no link leads out of the bundle, read whole.
    let read_file = |path: &Path| -> Result<Vec<u8>, String> {
        let relative = path.strip_prefix(root).map_err(|error| error.to_string())?;
        let relative =
            ArtifactPath::parse(&relative.to_string_lossy()).map_err(|error| error.to_string())?;
        read_inside(root, &relative, MAX_ARTIFACT_SIZE)
            .map(|(_, bytes)| bytes)
            .map_err(|error| format!("{}: {error}", path.display()))
    };
    let read = timed(
        repetitions,
        || Ok(()),
        |()| {
            let reference = reference_path.as_deref().map(read_file).transpose()?;
            Ok((read_file(&frame_path)?, reference))
        },
    )?;
    let frame = read_file(&frame_path)?;
    let reference = reference_path.as_deref().map(read_file).transpose()?;
    let inflate = || -> Result<Vec<u8>, String> {
        let bytes = match &reference {
            Some(reference) => {
                let prefix = decompress_with_prefix(reference, &[], MAX_ARTIFACT_SIZE)
                    .map_err(|error| error.to_string())?;
                decompress_with_prefix(&frame, &prefix, stored.size)
            }
            None => decompress_bounded(&frame, None, stored.size),
        };
        bytes.map_err(|error| error.to_string())
    };
    let decompress = timed(repetitions, || Ok(()), |()| inflate())?;
    let cubin = inflate()?;
    let sha256 = timed(repetitions, || Ok(()), |()| Ok(sha256_hex(&cubin)))?;
    if sha256_hex(&cubin) != stored.digest {
        return Err(format!(
            "{}: the cubin does not match its digest",
            variant.label()
        ));
    }
    Ok((read, decompress, sha256))
}

/// Loads every kernel of the bundle once, as the loader does (wherever its cubin is: the
/// bundle or an installed part package), and prints how many loaded (read, verified,
/// decompressed, handed to the device) and why the others did not.
fn load_every_kernel(registry: &Registry) -> Result<(), String> {
    let names = registry
        .catalog()
        .names()
        .map_err(|error| error.to_string())?;
    let started = Instant::now();
    let mut loaded = 0;
    let mut refused: std::collections::BTreeMap<String, usize> = Default::default();
    for name in &names {
        match registry.load(name) {
            Ok(_) => loaded += 1,
            Err(error) => {
                // One line per kind of refusal: the message without the kernel's own name.
                let text = error.to_string().replace(name.as_str(), "<kernel>");
                *refused.entry(text).or_default() += 1;
            }
        }
    }
    println!(
        "{} kernels: {loaded} loaded in {:.1} s, {} refused",
        names.len(),
        started.elapsed().as_secs_f64(),
        names.len() - loaded
    );
    for (reason, count) in refused {
        println!("  {count} × {reason}");
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("load_path: {message}");
            ExitCode::FAILURE
        }
    }
}
