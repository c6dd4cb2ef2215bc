//! Executing a plan: compile each job or take it from the caches, validate it, record its
//! entries, with progress; then each job's typed [`Outcome`] (a failure is the target's
//! outcome, not the build's end, unless `require`).

use super::plan::BuildPlan;
use super::*;
use prebuilt::untrusted::Unreadable;

use crate::error::KeptFailure;
use crate::progress::Event;
use rayon::iter::{ParallelBridge as _, ParallelIterator as _};

pub(super) struct Fetched {
    pub(super) cubin: Vec<u8>,
    pub(super) functions: Vec<Function>,
    pub(super) structs: BTreeMap<String, StructLayout>,
    pub(super) compiled: bool,
    pub(super) remote: bool,
}

/// Runs every job of `plan` (all of them, or until `require` meets a failure) and returns each
/// one's outcome, in plan order. A job whose every entry is a stub on its target is skipped
/// (unless the kernel allows stubs); one whose some entries are is kept, with a warning.
pub(super) fn execute(
    plan: &BuildPlan,
    cache: &BuildCache,
    options: &BundleOptions,
) -> Result<Vec<TargetOutcome>, Error> {
    let results = run_jobs(&plan.jobs, &plan.kernels, cache, options)?;
    let mut outcomes = Vec::with_capacity(results.len());
    for (job, result) in plan.jobs.iter().zip(results) {
        let target = plan.target(job);
        let allow_stub = plan.manifest.kernels[&target.kernel].allow_stub;
        let outcome = match result {
            Err(error) => {
                // Not reported here: the caller reports failures once per distinct error with
                // the targets it hit (`kwheel`'s report).
                let described = describe(&error);
                // A failure kept from an earlier build is recorded as that build recorded it.
                let (recorded, replayed) = match &error {
                    Error::CachedFailure { kept, .. } => (index_reason(&kept.reason), true),
                    _ => (index_reason(&described), false),
                };
                let (target_named, log) = failure_parts(&error, job);
                Outcome::Failed(Failure {
                    error: described,
                    target: target_named,
                    log,
                    recorded,
                    replayed,
                })
            }
            Ok(done)
                if !done.stubs.is_empty()
                    && !allow_stub
                    && done.stubs.len() == done.functions.len() =>
            {
                let reason = stub_reason(&target.kernel, job.arch, &done.stubs);
                if options.require {
                    return Err(Error::Skipped {
                        kernel: target.kernel,
                        arch: job.arch,
                        build: job.build,
                        reason: reason.to_string(),
                    });
                }
                tracing::info!("skipping {target}: {reason}");
                Outcome::Skipped { reason }
            }
            Ok(done) => {
                let stub_entries: Vec<(String, String)> = match allow_stub {
                    true => Vec::new(),
                    false => done
                        .stubs
                        .iter()
                        .map(|(entry, stub)| (entry.clone(), stub.describe()))
                        .collect(),
                };
                if !stub_entries.is_empty() {
                    let entries: Vec<String> = stub_entries
                        .iter()
                        .map(|(entry, what)| format!("`{entry}` ({what})"))
                        .collect();
                    tracing::warn!(
                        "warning: {target}: {} a stub there, kept for the kernel's other \
                         entries; launching it there fails",
                        if entries.len() == 1 {
                            format!("entry {} is", entries[0])
                        } else {
                            format!("entries {} are", entries.join(", "))
                        }
                    );
                }
                Outcome::Built(Built {
                    source: match (done.compiled, done.remote) {
                        (true, _) => Provenance::Compiled,
                        (false, true) => Provenance::Remote,
                        (false, false) => Provenance::Cached,
                    },
                    digest: done.digest,
                    size: done.size,
                    functions: done.functions,
                    structs: done.structs,
                    stub_entries,
                })
            }
        };
        outcomes.push(TargetOutcome { target, outcome });
    }
    Ok(outcomes)
}

/// What a job leaves for the bundle: its cubin's digest and size, not its bytes, which stay in
/// the build cache under the job's key until the writer streams them from there. Holding every
/// cubin of a production library at once (15,970 cubins, 1.9 GB, and a copy) is what took the
/// build above 4 GB resident.
pub(super) struct Finished {
    pub(super) digest: String,
    pub(super) size: u64,
    pub(super) functions: Vec<Function>,
    pub(super) structs: BTreeMap<String, StructLayout>,
    pub(super) compiled: bool,
    pub(super) remote: bool,
    /// The declared entries whose bodies are stubs on this target, as (entry, stub).
    pub(super) stubs: Vec<(String, StubEntry)>,
}

/// Runs every job. A job whose compile or validation fails gives its error in place of a
/// result (with `require`, the first such error ends the run); any other error (the cache
/// cannot be read or written) ends the run.
pub(super) fn run_jobs(
    jobs: &[Job],
    kernels: &[PlannedKernel],
    cache: &BuildCache,
    options: &BundleOptions,
) -> Result<Vec<Result<Finished, Error>>, Error> {
    let progress = crate::progress::observer(&options.progress);
    progress.event(Event::Start {
        steps: jobs.len() as u64,
        stage: "targets",
    });
    let stop = AtomicBool::new(false);
    // `par_bridge` hands the jobs out one at a time in plan order, so a stop leaves only later
    // jobs unstarted; each result goes back to its job's place.
    let mut results: Vec<(usize, Option<Result<Finished, Error>>)> =
        crate::compress::thread_pool(options.jobs, jobs.len()).install(|| {
            jobs.iter()
                .enumerate()
                .par_bridge()
                .map(|(n, job)| {
                    if stop.load(Ordering::Relaxed) {
                        return (n, None);
                    }
                    let kernel = &kernels[job.kernel];
                    progress.event(Event::Detail(&format!(
                        "{} {} {}",
                        kernel.name, job.build, job.arch
                    )));
                    let result = run_job(job, kernel, cache);
                    if let Err(error) = &result {
                        if options.require || !is_target_failure(error) {
                            stop.store(true, Ordering::Relaxed);
                        }
                    }
                    progress.event(Event::Step);
                    (n, Some(result))
                })
                .collect()
        });
    progress.event(Event::Finish);
    results.sort_unstable_by_key(|(n, _)| *n);
    let results: Vec<Option<Result<Finished, Error>>> =
        results.into_iter().map(|(_, result)| result).collect();
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
        Error::Compile(_)
            | Error::InvalidCubin { .. }
            | Error::MissingEntry { .. }
            | Error::AmbiguousEntry { .. }
            | Error::CachedFailure { .. }
    )
}

/// Whether a compile job's failure follows from its key's inputs alone, so that the build
/// cache may keep it: the compiler rejected the source (its log reports an error), cannot
/// honour a flag or a target, or the cubin is not the kernel's. A compiler that could not
/// start, a file it could not read, or a log without an error (a killed compiler) may go
/// another way next time.
pub(super) fn is_lasting_failure(error: &Error) -> bool {
    use crate::compiler::CompileError;
    match error {
        Error::Compile(error) => match error.as_ref() {
            CompileError::Failed { log, .. } => log.to_lowercase().contains("error"),
            CompileError::NewerPtx { .. }
            | CompileError::Unhonoured { .. }
            | CompileError::Unsupported { .. } => true,
            _ => false,
        },
        Error::InvalidCubin { .. } | Error::MissingEntry { .. } | Error::AmbiguousEntry { .. } => {
            true
        }
        _ => false,
    }
}

/// An error and its causes, one per line, as a skip's reason and the failure report.
pub(super) fn describe(error: &Error) -> String {
    prebuilt::error_chain(error)
}

/// A failure's reason as the index keeps it: the whole message when short, else its first
/// line, the first lines that report an error (where a compiler names the first thing that went
/// wrong: ptxas's first `error`, the first missing header), and the last lines of the log; each
/// part bounded (the full log is printed by the build).
pub(super) fn index_reason(reason: &str) -> String {
    const LIMIT: usize = 2000;
    const ERROR_LINES: usize = 20;
    const LINE: usize = 300;
    if reason.len() <= LIMIT {
        return reason.to_owned();
    }
    let clip = |line: &str, limit: usize| -> String {
        if line.len() <= limit {
            return line.to_owned();
        }
        let mut end = limit;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &line[..end])
    };
    let (first, rest) = reason.split_once('\n').unwrap_or((reason, ""));
    // The tail: the last LIMIT bytes, from a line start where there is one.
    let mut start = reason.len() - LIMIT;
    while !reason.is_char_boundary(start) {
        start += 1;
    }
    if let Some(newline) = reason[start..].find('\n') {
        if newline + 1 < reason.len() - start {
            start += newline + 1;
        }
    }
    let body_start = first.len() + 1;
    let errors: Vec<String> = rest[..start.saturating_sub(body_start).min(rest.len())]
        .lines()
        .filter(|line| line.to_lowercase().contains("error"))
        .take(ERROR_LINES)
        .map(|line| clip(line, LINE))
        .collect();
    let mut kept = clip(first, LINE);
    kept.push_str("\n[…]\n");
    if !errors.is_empty() {
        kept.push_str(&errors.join("\n"));
        kept.push_str("\n[…]\n");
    }
    kept.push_str(&reason[start..]);
    kept
}

/// Runs one job: its cubin from the caches or the compiler, checked, with the entries that
/// are stubs on the target. A compile that failed for good before (same key) is not run again:
/// the build cache keeps the failure beside where the cubin would be.
pub(super) fn run_job(
    job: &Job,
    kernel: &PlannedKernel,
    cache: &BuildCache,
) -> Result<Finished, Error> {
    let compiles = matches!(job.work, Work::Compile { .. });
    let record = failure_record_path(cache, &job.key);
    if compiles && !cache.entry_path(&job.key).is_file() {
        if let Some(kept) = read_failure(&record) {
            return Err(Error::CachedFailure {
                kernel: kernel.name.clone(),
                arch: job.arch,
                build: job.build,
                record,
                kept: Box::new(kept.kept),
            });
        }
    }
    match fetch_or_compile(job, kernel, cache) {
        Ok(built) => Ok(Finished {
            stubs: entry_stubs(&built.cubin, job, kernel, &built.functions)?,
            digest: sha256_hex(&built.cubin),
            size: built.cubin.len() as u64,
            functions: built.functions,
            structs: built.structs,
            compiled: built.compiled,
            remote: built.remote,
        }),
        Err(error) => {
            if compiles && is_lasting_failure(&error) {
                let (target, log) = failure_parts(&error, job);
                write_failure(
                    &record,
                    &FailureRecord {
                        format: FAILURE_FORMAT,
                        kept: KeptFailure {
                            reason: describe(&error),
                            target,
                            log,
                        },
                    },
                );
            }
            Err(error)
        }
    }
}

/// Where the build cache keeps the failure of `key`: beside its cubin's place.
pub(super) fn failure_record_path(cache: &BuildCache, key: &str) -> PathBuf {
    cache.entry_path(key).with_extension("failed.json")
}

/// A failure record: the version of its layout and the failure as the build described it.
#[derive(serde::Serialize, serde::Deserialize)]
struct FailureRecord {
    format: u32,
    #[serde(flatten)]
    kept: KeptFailure,
}

/// Bump when [`FailureRecord`] changes, or when a kept failure may no longer fail with the same
/// key (a rule the key does not hash, such as how entries resolve or which flags the
/// nvcc+ptxas route takes, now accepts more); records of another format are ignored.
const FAILURE_FORMAT: u32 = 3;

/// The failure a record at `path` keeps, if there is a readable one of this format.
fn read_failure(path: &Path) -> Option<FailureRecord> {
    let bytes = std::fs::read(path).ok()?;
    let record: FailureRecord = serde_json::from_slice(&bytes).ok()?;
    (record.format == FAILURE_FORMAT).then_some(record)
}

/// Keeps a failure for the next build; a record that cannot be written is a warning (the
/// target is then compiled again next time).
fn write_failure(path: &Path, record: &FailureRecord) {
    let bytes = serde_json::to_vec(record).expect("a record of strings serializes");
    if let Err(error) = crate::cache::write_atomically(path, &bytes) {
        tracing::warn!(
            "warning: cannot keep the failure in the build cache ({}); the target is compiled \
             again next time",
            prebuilt::error_chain(&error)
        );
    }
}

/// The target a failure names and what went wrong, apart: a compile the compiler rejected
/// names its compiler and keeps its log; a failure kept from an earlier build is as that build
/// kept it ([`Failure::replayed`] says so); any other names the job's arch and build and keeps
/// the whole error.
fn failure_parts(error: &Error, job: &Job) -> (String, String) {
    use crate::compiler::CompileError;
    match error {
        Error::Compile(compile) => {
            if let CompileError::Failed {
                arch,
                build,
                compiler,
                log,
                ..
            } = compile.as_ref()
            {
                return (format!("{arch} ({build}, {compiler})"), log.clone());
            }
        }
        Error::CachedFailure { kept, .. } => return (kept.target.clone(), kept.log.clone()),
        _ => {}
    }
    (format!("{} ({})", job.arch, job.build), describe(error))
}

/// The declared entries of a checked cubin whose bodies are stubs on its target (see
/// [`prebuilt::cubin::stub_entries`]).
pub(super) fn entry_stubs(
    cubin: &[u8],
    job: &Job,
    kernel: &PlannedKernel,
    functions: &[Function],
) -> Result<Vec<(String, StubEntry)>, Error> {
    let stubs = stub_entries(cubin).map_err(|source| Error::InvalidCubin {
        kernel: kernel.name.clone(),
        arch: job.arch,
        build: job.build,
        source,
    })?;
    Ok(functions
        .iter()
        .filter_map(|function| {
            let stub = stubs.iter().find(|stub| stub.symbol == function.symbol)?;
            Some((function.name.clone(), stub.clone()))
        })
        .collect())
}

/// The skip reason of a target whose every entry is a stub there.
pub(super) fn stub_reason(kernel: &str, arch: Arch, stubs: &[(String, StubEntry)]) -> SkipReason {
    let aborting = stubs.iter().filter(|(_, stub)| stub.aborts()).count();
    let what = if aborting == stubs.len() {
        "a stub that aborts"
    } else if aborting == 0 {
        "a stub that prints and computes nothing"
    } else {
        "a stub that prints or aborts and computes nothing"
    };
    let entries: Vec<String> = stubs
        .iter()
        .map(|(entry, stub)| format!("`{entry}`: {}", stub.describe()))
        .collect();
    SkipReason::Stub(format!(
        "the source compiles `{kernel}` only for other targets; its {arch} body is {what} ({}); \
         `allow-stub = true` would keep it",
        entries.join("; ")
    ))
}

fn fetch_or_compile(
    job: &Job,
    kernel: &PlannedKernel,
    cache: &BuildCache,
) -> Result<Fetched, Error> {
    let symbols_key = symbols_key(&job.key);
    let symbols_path = cache.entry_path(&job.key).with_extension("entries.json");
    if let Some(cubin) = cache.get(&job.key)? {
        let symbols = std::fs::read(&symbols_path)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        match check_cubin(&cubin, job, kernel, &symbols) {
            Ok((functions, structs)) => {
                return Ok(Fetched {
                    cubin,
                    functions,
                    structs,
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
        // A served cubin counts as a hit only once it is the key's: its entries, target and
        // toolkit (a refusal is a warning and a miss, and the job compiles here).
        let served = cache.get_remote(&job.key, &what, |cubin| {
            let symbols: BTreeMap<String, String> = cache
                .get_remote_file(&symbols_key, &what)
                .and_then(|bytes| serde_json::from_slice(&bytes).ok())
                .unwrap_or_default();
            let (functions, structs) = check_cubin(cubin, job, kernel, &symbols)
                .map_err(|error| prebuilt::error_chain(&error))?;
            let expected = prebuilt::cubin::identity::ExpectedCubin {
                arch: job.arch,
                cuda: job.build,
                compiler: &job.compiler,
                functions: &functions,
            };
            prebuilt::cubin::identity::check_identity(cubin, &expected)
                .map_err(|error| error.to_string())?;
            Ok((functions, structs, symbols))
        });
        if let Some((cubin, (functions, structs, symbols))) = served {
            cache.put(&job.key, &cubin)?;
            put_symbols(cache, &symbols_path, &symbols, None)?;
            return Ok(Fetched {
                cubin,
                functions,
                structs,
                compiled: false,
                remote: true,
            });
        }
    }
    let (cubin, symbols) = match &job.work {
        Work::Precompiled { path } => {
            let cubin = std::fs::read(path).map_err(|source| {
                Error::Read(Unreadable {
                    path: path.clone(),
                    source,
                })
            })?;
            (cubin, BTreeMap::new())
        }
        Work::Compile {
            tree,
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
            // What this arch compiles with: the key's and the JIT's merge.
            let inputs = kernel.inputs.for_arch(job.arch);
            let flags = inputs.flags_for(&job.compiler);
            let request = CompileRequest {
                kernel: &kernel.name,
                job: CompileJob {
                    key: &job.key,
                    tree,
                    source,
                    include_dirs,
                    defines: &inputs.defines,
                    flags: &flags,
                    cxx_std: &inputs.cxx_std,
                    arch: job.arch,
                    name_expressions: &name_expressions,
                    preamble: &inputs.preamble,
                    computed: &kernel.computed.evaluations,
                },
            };
            let output = compiler
                .compile(&request)
                .map_err(|error| Box::new(crate::compiler::explain_computed(&request, error)))?;
            (output.cubin, output.lowered_names)
        }
    };
    let (functions, structs) = check_cubin(&cubin, job, kernel, &symbols)?;
    cache.put(&job.key, &cubin)?;
    put_symbols(cache, &symbols_path, &symbols, None)?;
    if compiles {
        cache.put_remote(&job.key, &cubin, &output, &what);
        let remote = (symbols_key.as_str(), output.as_str(), what.as_str());
        put_symbols(cache, &symbols_path, &symbols, Some(remote))?;
    }
    Ok(Fetched {
        cubin,
        functions,
        structs,
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
/// the symbol the compiler gave a name expression (`symbols`), else the entry itself, the
/// mangled symbol that demangles to it, or for a plain name the one kernel of that name
/// ([`resolve_entries`]); with the values the compile computed (`computed`, `structs`) read
/// back from it.
pub(super) fn check_cubin(
    cubin: &[u8],
    job: &Job,
    kernel: &PlannedKernel,
    symbols: &BTreeMap<String, String>,
) -> Result<(Vec<Function>, BTreeMap<String, StructLayout>), Error> {
    let mut functions = resolve_functions(cubin, job, kernel, symbols)?;
    let plan = &kernel.computed;
    let values =
        read_computed(cubin, plan.evaluations.len()).map_err(|source| Error::ComputedMissing {
            kernel: kernel.name.clone(),
            arch: job.arch,
            build: job.build,
            detail: source.to_string(),
        })?;
    let structs = plan.assign(&values, &mut functions);
    Ok((functions, structs))
}

fn resolve_functions(
    cubin: &[u8],
    job: &Job,
    kernel: &PlannedKernel,
    symbols: &BTreeMap<String, String>,
) -> Result<Vec<Function>, Error> {
    resolve_entries(cubin, job.arch, &kernel.inputs.entries, symbols).map_err(|error| {
        let (kernel, arch, build) = (kernel.name.clone(), job.arch, job.build);
        match error {
            EntryError::Invalid(source) => Error::InvalidCubin {
                kernel,
                arch,
                build,
                source,
            },
            EntryError::Missing { entry, found } => Error::MissingEntry {
                kernel,
                arch,
                build,
                entry,
                found,
            },
            EntryError::Ambiguous { entry, candidates } => Error::AmbiguousEntry {
                kernel,
                arch,
                build,
                entry,
                candidates,
            },
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ptxas log as long as real ones get: the first error early, pages of warnings after.
    fn long_log() -> String {
        let mut log =
            String::from("failed to compile `k` for sm_90a (cu129, nvcc+ptxas 13.0.88/12.9.86):\n");
        log.push_str("ptxas info    : 0 bytes gmem\n");
        log.push_str("ptxas error   : Entry function 'k' uses too much shared data (0x12000 bytes, 0xc000 max)\n");
        for n in 0..400 {
            log.push_str(&format!(
                "ptxas warning : Registers are spilled to local memory in function 'f{n}'\n"
            ));
        }
        log.push_str("ptxas fatal   : Ptx assembly aborted due to errors\n");
        log
    }

    #[test]
    fn a_long_failure_keeps_its_first_error_and_its_tail() {
        let log = long_log();
        let kept = index_reason(&log);
        let lines: Vec<&str> = kept.lines().collect();
        assert_eq!(lines[0], log.lines().next().unwrap());
        assert_eq!(lines[1], "[…]");
        assert_eq!(
            lines[2],
            "ptxas error   : Entry function 'k' uses too much shared data (0x12000 bytes, 0xc000 max)"
        );
        assert_eq!(lines[3], "[…]");
        assert!(kept.ends_with("ptxas fatal   : Ptx assembly aborted due to errors\n"));
        // The tail starts at a line.
        assert!(lines[4].starts_with("ptxas warning : "), "{}", lines[4]);
        assert!(kept.len() < 2000 + 600, "{}", kept.len());
    }

    #[test]
    fn error_lines_are_bounded() {
        let mut log = String::from("failed:\n");
        for n in 0..500 {
            log.push_str(&format!("k.cu({n}): error: {}\n", "x".repeat(1000)));
        }
        let kept = index_reason(&log);
        assert!(kept.len() <= 300 + 20 * 304 + 2000 + 40, "{}", kept.len());
        assert_eq!(kept.lines().filter(|l| l.ends_with('…')).count(), 20);
    }

    #[test]
    fn failures_kept_in_an_older_format_are_not_replayed() {
        // A record of format 1 may keep a plain C++ entry or an nvcc flag that its rules
        // refused and that builds with the same key now; one of format 2 keeps no target or
        // log apart from its text. Either is compiled again, not replayed.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.failed.json");
        for old in [
            r#"{"format":1,"reason":"cubin of `gelu` for sm_90a (cu130) has no entry"}"#,
            r#"{"format":2,"reason":"failed to compile `gelu` for sm_90a (cu130, nvcc 13.0):\nx"}"#,
        ] {
            std::fs::write(&path, old).unwrap();
            assert!(read_failure(&path).is_none(), "{old}");
        }
        let record = FailureRecord {
            format: FAILURE_FORMAT,
            kept: KeptFailure {
                reason:
                    "failed to compile `gelu` for sm_90a (cu130, nvcc 13.0.88):\nk.cu(3): error"
                        .into(),
                target: "sm_90a (cu130, nvcc 13.0.88)".into(),
                log: "k.cu(3): error".into(),
            },
        };
        write_failure(&path, &record);
        let kept = read_failure(&path).expect("a record of this format is read back");
        assert_eq!(
            (kept.kept.reason, kept.kept.target, kept.kept.log),
            (record.kept.reason, record.kept.target, record.kept.log)
        );
    }

    #[test]
    fn a_short_failure_is_kept_whole() {
        let log = "failed to compile `k`:\nk.cu(3): error: nope\n";
        assert_eq!(index_reason(log), log);
    }

    #[test]
    fn only_failures_of_the_inputs_are_kept() {
        let failed = |log: &str| {
            Error::Compile(Box::new(crate::compiler::CompileError::Failed {
                kernel: "k".into(),
                arch: "sm_90a".parse().unwrap(),
                build: "cu130".parse().unwrap(),
                compiler: CompilerId {
                    kind: crate::toolchain::CompilerKind::Nvcc,
                    version: "13.0.88".into(),
                },
                log: log.into(),
            }))
        };
        assert!(is_lasting_failure(&failed("k.cu(3): error: nope\n")));
        // A compiler killed mid-way prints no error.
        assert!(!is_lasting_failure(&failed("")));
        assert!(!is_lasting_failure(&Error::Read(Unreadable {
            path: "k.cu".into(),
            source: std::io::Error::other("gone"),
        })));
    }
}
