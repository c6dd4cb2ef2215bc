//! Running the jobs: compile or take from the caches, validate, record entries, with progress
//! and every failure kept as a skip of its target.

use super::*;

pub(super) struct Built {
    pub(super) cubin: Vec<u8>,
    pub(super) functions: Vec<Function>,
    pub(super) compiled: bool,
    pub(super) remote: bool,
}

/// Runs every job. A job whose compile or validation fails gives its error in place of a
/// result (with `require`, the first such error ends the run); any other error (the cache
/// cannot be read or written) ends the run.
pub(super) fn run_jobs(
    jobs: &[Job],
    kernels: &[PlannedKernel],
    cache: &BuildCache,
    options: &BundleOptions,
) -> Result<Vec<Result<Built, Error>>, Error> {
    let bar = progress_bar(jobs.len(), options.progress);
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let results: Mutex<Vec<Option<Result<Built, Error>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    let threads = options.jobs.max(1).min(jobs.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let n = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(n) else { break };
                let kernel = &kernels[job.kernel];
                bar.set_message(format!("{} {} {}", kernel.name, job.build, job.arch));
                let result = run_job(job, kernel, cache);
                if let Err(error) = &result {
                    if options.require || !is_target_failure(error) {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
                results
                    .lock()
                    .expect("no job panics while holding the lock")[n] = Some(result);
                bar.inc(1);
            });
        }
    });
    bar.finish_and_clear();
    let results = results.into_inner().expect("threads have finished");
    let stopped = results.iter().flatten().find_map(|result| match result {
        Err(error) if options.require || !is_target_failure(error) => Some(()),
        _ => None,
    });
    if stopped.is_some() {
        let error = results
            .into_iter()
            .flatten()
            .find_map(|result| {
                result
                    .err()
                    .filter(|e| options.require || !is_target_failure(e))
            })
            .expect("found above");
        return Err(error);
    }
    Ok(results
        .into_iter()
        .map(|result| result.expect("every job ran"))
        .collect())
}

/// Whether `error` is about one target (a compile or its cubin), so the build records it as a
/// skip and goes on, rather than about the machine (a cache it cannot write).
pub(super) fn is_target_failure(error: &Error) -> bool {
    matches!(
        error,
        Error::Compile(_) | Error::InvalidCubin { .. } | Error::MissingEntry { .. }
    )
}

/// An error and its causes, one per line, as a skip's reason and the failure report.
pub(super) fn describe(error: &Error) -> String {
    prebuilt::error_chain(error)
}

/// A failure's reason as the index keeps it: the whole message when short, else its first line
/// and the last lines of the log (the full log is printed by the build).
pub(super) fn index_reason(reason: &str) -> String {
    const LIMIT: usize = 2000;
    if reason.len() <= LIMIT {
        return reason.to_owned();
    }
    let first = reason.lines().next().unwrap_or_default();
    let mut start = reason.len() - (LIMIT - first.len()).min(reason.len());
    while !reason.is_char_boundary(start) {
        start += 1;
    }
    format!("{first}\n[…]\n{}", &reason[start..])
}

pub(super) fn progress_bar(len: usize, enabled: bool) -> indicatif::ProgressBar {
    if !enabled {
        return indicatif::ProgressBar::hidden();
    }
    // indicatif draws nothing when stderr is not a terminal.
    let bar = indicatif::ProgressBar::new(len as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed}] {wide_msg}")
            .expect("valid template"),
    );
    bar
}

pub(super) fn run_job(
    job: &Job,
    kernel: &PlannedKernel,
    cache: &BuildCache,
) -> Result<Built, Error> {
    let symbols_key = symbols_key(&job.key);
    let symbols_path = cache.entry_path(&job.key).with_extension("entries.json");
    if let Some(cubin) = cache.get(&job.key)? {
        let symbols = std::fs::read(&symbols_path)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        match check_cubin(&cubin, job, kernel, &symbols) {
            Ok(functions) => {
                return Ok(Built {
                    cubin,
                    functions,
                    compiled: false,
                    remote: false,
                })
            }
            // A damaged entry (or one whose entry symbols were lost) is rebuilt, not bundled.
            Err(_) => cache.remove(&job.key)?,
        }
    }
    let what = format!("`{}` for {} ({})", kernel.name, job.arch, job.build);
    let output = format!("{}/{}/{}.cubin", kernel.name, job.build, job.arch);
    let compiles = matches!(job.work, Work::Compile { .. });
    if compiles {
        if let Some(cubin) = cache.get_remote(&job.key, &what) {
            let symbols = cache
                .get_remote(&symbols_key, &what)
                .and_then(|bytes| serde_json::from_slice(&bytes).ok())
                .unwrap_or_default();
            match check_cubin(&cubin, job, kernel, &symbols) {
                Ok(functions) => {
                    cache.put(&job.key, &cubin)?;
                    put_symbols(cache, &symbols_path, &symbols, None)?;
                    return Ok(Built {
                        cubin,
                        functions,
                        compiled: false,
                        remote: true,
                    });
                }
                Err(error) => eprintln!(
                    "warning: the remote cache's cubin of {what} is not valid ({}); compiling it \
                     here",
                    prebuilt::error_chain(&error)
                ),
            }
        }
    }
    let (cubin, symbols) = match &job.work {
        Work::Precompiled { path } => {
            let cubin = std::fs::read(path).map_err(|source| Error::Read {
                path: path.clone(),
                source,
            })?;
            (cubin, BTreeMap::new())
        }
        Work::Compile {
            source,
            include_dirs,
            compiler,
        } => {
            let name_expressions: Vec<String> = kernel
                .inputs
                .entries
                .iter()
                .filter(|entry| prebuilt::compile::is_name_expression(entry))
                .cloned()
                .collect();
            let flags = kernel.inputs.flags_for(&job.compiler.kind);
            let request = CompileRequest {
                kernel: &kernel.name,
                source,
                include_dirs,
                defines: &kernel.inputs.defines,
                flags: &flags,
                cxx_std: &kernel.inputs.cxx_std,
                arch: job.arch,
                name_expressions: &name_expressions,
            };
            let output = compiler.compile(&request).map_err(Box::new)?;
            (output.cubin, output.lowered_names)
        }
    };
    let functions = check_cubin(&cubin, job, kernel, &symbols)?;
    cache.put(&job.key, &cubin)?;
    put_symbols(cache, &symbols_path, &symbols, None)?;
    if compiles {
        cache.put_remote(&job.key, &cubin, &output, &what);
        let remote = (symbols_key.as_str(), output.as_str(), what.as_str());
        put_symbols(cache, &symbols_path, &symbols, Some(remote))?;
    }
    Ok(Built {
        cubin,
        functions,
        compiled: true,
        remote: false,
    })
}

/// The remote cache's key for the symbols the compiler gave a variant's name expressions
/// (locally they sit beside the cubin, `<key>.entries.json`): derived from the variant's key.
pub(super) fn symbols_key(key: &str) -> String {
    sha256_hex(format!("entry symbols of {key}").as_bytes())
}

/// Keeps `symbols` beside the cached cubin at `path`, or with `remote` = (key, output, what)
/// in the remote cache.
pub(super) fn put_symbols(
    cache: &BuildCache,
    path: &Path,
    symbols: &BTreeMap<String, String>,
    remote: Option<(&str, &str, &str)>,
) -> Result<(), Error> {
    if symbols.is_empty() {
        return Ok(());
    }
    let bytes = serde_json::to_vec(symbols).expect("a map of strings serializes");
    match remote {
        None => crate::cache::write_atomically(path, &bytes),
        Some((key, output, what)) => {
            cache.put_remote(key, &bytes, &format!("{output}.entries.json"), what);
            Ok(())
        }
    }
}

/// Validates a cubin for its job and maps each declared entry to its symbol and parameters:
/// the symbol the compiler gave a name expression (`symbols`), else the entry itself or the
/// mangled symbol that demangles to it.
pub(super) fn check_cubin(
    cubin: &[u8],
    job: &Job,
    kernel: &PlannedKernel,
    symbols: &BTreeMap<String, String>,
) -> Result<Vec<Function>, Error> {
    resolve_entries(cubin, job.arch, &kernel.inputs.entries, symbols).map_err(|error| match error {
        EntryError::Invalid(source) => Error::InvalidCubin {
            kernel: kernel.name.clone(),
            arch: job.arch,
            build: job.build,
            source,
        },
        EntryError::Missing { entry, found } => Error::MissingEntry {
            kernel: kernel.name.clone(),
            arch: job.arch,
            build: job.build,
            entry,
            found,
        },
    })
}
