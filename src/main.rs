//! The `kwheel` command line: argument parsing (`cli`), one library call per command (here),
//! and an exit code that says what failed (`exit`).

mod bundling;
mod cli;
mod exit;
mod pep517;
mod progress;
mod report;

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;

use cli::{
    BuildKwheelArgs, BuildWheelArgs, BundleCommand, CheckArgs, Cli, Command, CoverageArgs,
    DevCommand, DiffArgs, FetchArgs, JitCommand, JitExportArgs, JitImportArgs, ReleaseCommand,
    WheelCommand,
};
use exit::{CommandFailed, Failure};

fn main() -> ExitCode {
    let cli = Cli::parse();
    diagnostics();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // A hint is the outermost context; it goes on a line of its own after the error.
            match error.downcast_ref::<Hint>() {
                Some(hint) => {
                    let hint = hint.0.clone();
                    let cause = error.chain().nth(1).map(|_| {
                        let mut chain = error.chain().skip(1).map(ToString::to_string);
                        let first = chain.next().unwrap_or_default();
                        chain.fold(first, |text, next| format!("{text}: {next}"))
                    });
                    eprintln!("error: {}", cause.unwrap_or_default());
                    eprintln!("hint: {hint}");
                }
                None => eprintln!("error: {error:#}"),
            }
            ExitCode::from(Failure::of(&error).code())
        }
    }
}

/// Where the library crates' diagnostics go: each event's message alone on stderr, as the
/// bundler's and the release check's lines have always read, at `info` and above unless
/// `RUST_LOG` says otherwise (`RUST_LOG=warn` keeps only warnings, `RUST_LOG=bundler=debug`
/// adds detail).
fn diagnostics() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .without_time()
        .with_level(false)
        .with_target(false)
        .with_ansi(false)
        .init();
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Dev(DevCommand::BundleKernels(args)) => bundling::bundle_kernels(args),
        Command::Dev(DevCommand::Explain(args)) => {
            let explanation = bundler::explain::explain_kernel_or_module(
                &args.manifest.resolve()?,
                &args.name,
                args.torch.as_deref(),
                args.against.as_deref(),
            )?;
            print!("{explanation}");
            Ok(())
        }
        Command::Dev(DevCommand::Coverage(args)) => coverage(args),
        Command::Dev(DevCommand::BuildWheel(args)) => build_wheel(args),
        Command::Dev(DevCommand::BuildSdist(args)) => {
            let manifest = args.manifest.resolve()?;
            let sdist = release::build_sdist(&release::SdistOptions {
                manifest: manifest.clone(),
                out: args.out,
            })
            .with_context(|| format!("build-sdist for `{}` failed", manifest.display()))?;
            print_written(&sdist.path, sdist.files.len(), sdist.size, args.json)
        }
        Command::Release(ReleaseCommand::BuildKwheel(args)) => build_kwheel(args),
        Command::Dev(DevCommand::MergeBundles(args)) => {
            let summary = bundler::merge_shards(
                &args.shards,
                &args.out,
                default_jobs(args.jobs),
                &*progress::on_a_terminal(),
            )?;
            println!(
                "merged {} shards: {} kernels; bundle {} {}",
                summary.shards,
                summary.index.kernels.len(),
                summary.out.display(),
                written(summary.written)
            );
            Ok(())
        }
        Command::Release(ReleaseCommand::Publish(args)) => {
            let report = release::publish(&release::PublishOptions {
                bundles: args.bundle,
                wheels: args.wheels,
                ..release::PublishOptions::new(args.to)
            })?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{report}");
            }
            Ok(())
        }
        Command::Fetch(args) => fetch(args),
        Command::Jit(JitCommand::Export(args)) => jit_export(args),
        Command::Jit(JitCommand::Import(args)) => jit_import(args),
        Command::Release(ReleaseCommand::Check(args)) => release_check(args),
        Command::Release(ReleaseCommand::Diff(args)) => release_diff(args),
        Command::Wheel(WheelCommand::Verify { wheel })
            if wheel.to_string_lossy().ends_with(".tar.gz") =>
        {
            let sdist = release::verify_sdist(&wheel)?;
            print!("{sdist}");
            sdist.into_result()?;
            Ok(())
        }
        Command::Wheel(WheelCommand::Verify { wheel }) => {
            let report = release::verify_wheel(&wheel)?;
            print!("{report}");
            report.into_result()?;
            Ok(())
        }
        Command::Bundle(BundleCommand::List { bundle, json }) => {
            let bundle = open_bundle(&bundle)?;
            if json {
                let listing = prebuilt::bundle::BundleListing::of(bundle.index());
                println!("{}", serde_json::to_string_pretty(&listing)?);
            } else {
                print!("{}", prebuilt::bundle::list_bundle(bundle.index()));
            }
            Ok(())
        }
        Command::Bundle(BundleCommand::Extract { bundle, out }) => {
            let bundle = open_bundle(&bundle)?;
            let written = bundler::writer::extract_bundle(&bundle, &out)?;
            let modules = written
                .iter()
                .filter(|path| path.extension().is_some_and(|e| e == "so"))
                .count();
            if modules == 0 {
                println!("wrote {} cubins under {}", written.len(), out.display());
            } else {
                println!(
                    "wrote {} cubins and {modules} extension module(s) under {}",
                    written.len() - modules,
                    out.display()
                );
            }
            Ok(())
        }
        Command::Toolchains(args) => toolchains(&args.manifest.resolve()?, args.json),
        Command::Pep517(command) => pep517::run(command),
    }
}

fn default_jobs(jobs: Option<usize>) -> usize {
    jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn release_check(args: CheckArgs) -> Result<()> {
    let options = release::CheckOptions {
        bundle: args.bundle,
        wheels: args.wheels,
        torch: args.torch,
        no_rebuild: args.no_rebuild,
        size_budget: args.size_budget,
        tag_prefix: args.tag_prefix,
        publish: args.publish,
        rebuild_sample: args.rebuild_sample,
        against: args.against,
        skip: args.skip,
        cache_dir: args.cache.resolve(),
        ..release::CheckOptions::new(args.manifest.resolve()?)
    };
    let checklist = release::release_check(&options);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&checklist)?);
    } else {
        print!("{checklist}");
    }
    match checklist.outcome() {
        release::check::Outcome::Passed => Ok(()),
        release::check::Outcome::Failed => {
            Err(CommandFailed::new(Failure::Verification, "release check failed").into())
        }
        release::check::Outcome::Incomplete => {
            Err(CommandFailed::new(Failure::Incomplete, "release check incomplete").into())
        }
    }
}

fn build_wheel(args: BuildWheelArgs) -> Result<()> {
    let options = release::LibraryWheelOptions {
        bundle: args.bundle,
        out: args.out,
        torch: args.torch,
        ship_sources: !args.no_sources,
        cache_dir: args.cache.resolve(),
        jobs: default_jobs(args.jobs),
        progress: progress::shown_unless(args.quiet),
        ship: args
            .ship
            .as_deref()
            .map(str::parse::<release::ShipFilter>)
            .transpose()?,
        store: args.store,
        recipes_only: args.recipes_only,
        max_file_size: args.max_file_size,
        packs: args.add_pack,
        ..release::LibraryWheelOptions::new(args.manifest.resolve()?)
    };
    if args.no_runtime {
        eprintln!(
            "note: --no-runtime is no longer needed: `dev build-wheel` builds only the library's \
             wheel (`kwheel release build-kwheel` builds kwheel's own)"
        );
    }
    let built = release::build_library_wheel(&options).map_err(|error| {
        let error = anyhow::Error::new(error);
        let stale = error.chain().any(|cause| {
            matches!(
                cause.downcast_ref(),
                Some(release::Error::StaleBundle { .. })
            )
        });
        let mut error = error.context(format!(
            "build-wheel for `{}` failed",
            options.manifest.display()
        ));
        if stale {
            // The same manifest, pin and bundle the user gave, so following the hint rebuilds
            // this library's bundle and not whatever the defaults name.
            let rebuild = invocation(
                "kwheel dev bundle-kernels",
                &[
                    ("--manifest", Some(&options.manifest)),
                    ("--out", Some(&options.bundle)),
                    ("--torch", options.torch.as_ref().map(Path::new)),
                    ("--cache-dir", args.cache.cache_dir.as_deref()),
                ],
            );
            error = error.context(Hint(format!(
                "rebuild the bundle with `{rebuild}`, or give another --bundle directory \
                 (built first when missing)"
            )));
        }
        error
    })?;
    warn_missing_module_cpus(&options.bundle);
    print_written(&built.path, built.files, built.size, args.json)
}

/// Says, on stderr, which CPU a module of the shipped bundle was not built for and why: the
/// wheel's tags leave that CPU out, which would otherwise pass unnoticed.
fn warn_missing_module_cpus(bundle: &Path) {
    let Ok(bundle) = prebuilt::Bundle::open(bundle) else {
        return;
    };
    for (name, record) in &bundle.index().modules {
        let mut cpus: Vec<&str> = record.skipped.iter().map(|s| s.cpu.as_str()).collect();
        cpus.dedup();
        for cpu in cpus {
            if record.variants.is_empty() || record.variants.iter().any(|v| v.cpu == cpu) {
                continue;
            }
            // The reason of a CUDA build another CPU has: the one this CPU lacks for itself.
            let skips = record.skipped.iter().filter(|s| s.cpu == cpu);
            let Some(skip) = skips
                .clone()
                .find(|s| record.variants.iter().any(|v| v.cuda == s.cuda))
                .or_else(|| skips.clone().next())
            else {
                continue;
            };
            eprintln!(
                "warning: extension module `{name}` has no {cpu} build ({}/{cpu}: {}), so the \
                 wheel is not tagged for {cpu}",
                skip.cuda, skip.reason
            );
        }
    }
}

/// A command line for a hint: `program` and every option that has a value, quoted for a POSIX
/// shell where needed, so the hint can be pasted as it is.
fn invocation(program: &str, options: &[(&str, Option<&Path>)]) -> String {
    let mut line = program.to_owned();
    for (flag, value) in options {
        if let Some(value) = value {
            let text = value.display().to_string();
            let plain = !text.is_empty()
                && text
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"/._-+=:,@".contains(&b));
            if plain {
                line.push_str(&format!(" {flag} {text}"));
            } else {
                line.push_str(&format!(" {flag} '{}'", text.replace('\'', "'\\''")));
            }
        }
    }
    line
}

/// What to do next after an error; printed on its own line after the error.
#[derive(Debug)]
pub(crate) struct Hint(pub(crate) String);

impl std::fmt::Display for Hint {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.0)
    }
}

/// The line a build command ends with: the file written, its size and that it verified; with
/// `--json`, the same as one JSON object (what the build backend reads).
fn print_written(path: &Path, files: usize, size: u64, json: bool) -> Result<()> {
    if json {
        let answer = serde_json::json!({
            "path": path,
            "file_name": path.file_name().map(|name| name.to_string_lossy()),
            "files": files,
            "size": size,
            "verified": true,
        });
        println!("{answer}");
    } else {
        println!("{} ({files} files, {size} bytes), verified", path.display());
    }
    Ok(())
}

fn build_kwheel(args: BuildKwheelArgs) -> Result<()> {
    let workspace = match args.workspace {
        Some(workspace) => workspace,
        None => release::runtime::source_workspace().context(
            "no kwheel source tree at or above the current directory: kwheel's own wheels are \
             built from a clone of kwheel (run this in the clone, or give it with --workspace)",
        )?,
    };
    let archs = if args.arch.is_empty() {
        vec![release::RuntimeArch::host().context(
            "this machine is neither x86_64 nor aarch64: give --arch x86_64 or --arch aarch64",
        )?]
    } else {
        args.arch
    };
    if archs.len() > 1 && (args.module.is_some() || args.command.is_some()) {
        anyhow::bail!("--module and --command are built for one architecture: give one --arch");
    }
    for arch in archs {
        let options = release::RuntimeWheelOptions {
            arch,
            module: match &args.module {
                Some(module) => release::NativeModule::Prebuilt(module.clone()),
                None => release::NativeModule::Build {
                    target_dir: args.target_dir.clone(),
                },
            },
            command: match &args.command {
                Some(command) => release::NativeCommand::Prebuilt(command.clone()),
                None => release::NativeCommand::Build,
            },
            progress: !args.quiet,
            ..release::RuntimeWheelOptions::new(&workspace, &args.out)
        };
        let built = release::build_runtime_wheel(&options)
            .with_context(|| format!("building kwheel's {arch} wheel failed"))?;
        println!(
            "{} ({} files, {} bytes), verified",
            built.path.display(),
            built.files,
            built.size
        );
    }
    Ok(())
}

fn release_diff(args: DiffArgs) -> Result<()> {
    use prebuilt::coverage::FleetDevice;
    let old = release::diff::Release::open(&args.old)?;
    let new = release::diff::Release::open(&args.new)?;
    let fleet = args
        .fleet
        .iter()
        .map(|text| FleetDevice::parse(text))
        .collect::<Result<Vec<_>, _>>()?;
    // Each device's capability replaces this one's.
    let query = prebuilt::device::DeviceQuery::simulated((9, 0), args.cuda, None, None);
    let fleet = (!fleet.is_empty()).then_some((fleet.as_slice(), &query));
    let diff = release::diff::diff_releases(&old, &new, fleet)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&diff)?);
    } else {
        print!("{diff}");
    }
    Ok(())
}

fn coverage(args: CoverageArgs) -> Result<()> {
    use prebuilt::coverage::{fleet_coverage, FleetDevice};
    use prebuilt::env::ptx_jit_variable;
    let bundle = open_bundle(&args.bundle)?;
    let ptx_forbidden_by = args.no_ptx_jit.then(|| {
        let variable = ptx_jit_variable(&bundle.index().package);
        format!("--no-ptx-jit (as {variable}=0)")
    });
    if !args.fleet.is_empty() {
        let fleet = args
            .fleet
            .iter()
            .map(|text| FleetDevice::parse(text))
            .collect::<Result<Vec<_>, _>>()?;
        // Each device's capability replaces this one's.
        let query = args.runtime.query((9, 0));
        refuse_unbuilt_cuda(&bundle, &query)?;
        let report = fleet_coverage(bundle.index(), &fleet, &query, ptx_forbidden_by.as_deref());
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{report}");
        }
        return Ok(());
    }
    // clap requires one of --device and --fleet.
    let capability = args.device.unwrap_or((9, 0));
    let query = args.runtime.query(capability);
    refuse_unbuilt_cuda(&bundle, &query)?;
    let cache = prebuilt::cache::ArtifactCache::default();
    let report =
        prebuilt::coverage::bundle_coverage(&bundle, &query, ptx_forbidden_by.as_deref(), &cache);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    jit_note(&bundle, &report)
}

/// Opens the bundle at `path` by the one rule every command and `kwheel.find_bundle` use
/// ([`prebuilt::lookup::bundle_at`]: the folder, else its `_prebuilt/`); when neither is one,
/// says what a bundle is.
fn open_bundle(path: &Path) -> Result<prebuilt::Bundle> {
    let found = prebuilt::lookup::bundle_at(path).unwrap_or_else(|| path.to_owned());
    prebuilt::lookup::open_bundle(&found).map_err(|error| {
        anyhow::Error::new(error).context(format!(
            "`{}` is not a bundle; a bundle is the directory with `index.json` that `kwheel dev \
             bundle-kernels` writes (default `target/kwheel/_prebuilt`), or a wheel's \
             `<package>/_prebuilt`",
            path.display()
        ))
    })
}

/// Refuses a runtime CUDA build that no variant or target of the bundle was built for: every
/// kernel would be refused for the same reason, which the table would hide.
fn refuse_unbuilt_cuda(
    bundle: &prebuilt::Bundle,
    query: &prebuilt::device::DeviceQuery,
) -> Result<()> {
    let builds = prebuilt::lookup::Meta::of(bundle.index()).builds;
    if builds.is_empty() || builds.contains(&query.cuda) {
        return Ok(());
    }
    let list: Vec<String> = builds.iter().map(ToString::to_string).collect();
    // A value of --cuda this bundle cannot answer for: a usage error, like one that does not
    // parse.
    Err(CommandFailed::new(
        Failure::Usage,
        format!(
            "the bundle was built for CUDA builds {} only; the runtime's CUDA build {} is none of \
             them, so no cubin of it loads there (give --cuda with one of those, or bundle for {} \
             with `cuda-builds` in the manifest)",
            list.join(", "),
            query.cuda,
            query.cuda
        ),
    )
    .into())
}

/// After a coverage table: what happens to kernels that load no prebuilt cubin (the JIT
/// fallback compiles them from the shipped sources, if the bundle has them), and an error
/// when no kernel loads at all.
fn jit_note(bundle: &prebuilt::Bundle, report: &prebuilt::coverage::CoverageReport) -> Result<()> {
    let none: Vec<&String> = report
        .kernels
        .iter()
        .filter(|(_, kernel)| kernel.loads.is_none())
        .map(|(name, _)| name)
        .collect();
    if none.is_empty() {
        return Ok(());
    }
    let sources = bundle.root().join(prebuilt::bundle::SOURCES_DIR).is_dir();
    let variable = prebuilt::env::fallback_variable(&bundle.index().package);
    let fallback = if sources {
        format!(
            "load() would JIT-compile them from the shipped sources on first use (unless \
             {variable}=0)"
        )
    } else {
        "the bundle ships no sources, so they cannot load here".to_owned()
    };
    eprintln!(
        "{} of {} kernels load no prebuilt cubin on this device: {fallback}",
        none.len(),
        report.kernels.len()
    );
    if none.len() == report.kernels.len() {
        anyhow::bail!("no kernel of the bundle has a prebuilt cubin for this device");
    }
    Ok(())
}

fn fetch(args: FetchArgs) -> Result<()> {
    let query = args.runtime.query(args.device);
    let bundle = prebuilt::lookup::open_bundle(prebuilt::lookup::find_bundle(&args.package)?)?;
    let report = prebuilt::fetch::prefetch(
        &bundle,
        &query,
        &prebuilt::cache::ArtifactCache::default(),
        &prebuilt::fetch::StoreOptions::default(),
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    if let Some(failure) = report.failure() {
        return Err(failure).context("not everything this device would load could be fetched");
    }
    Ok(())
}

/// A warm pack that is refused (not a pack, another package's, an entry or cubin that does not
/// verify) is a verification failure (exit 4); one that cannot be read or written keeps its
/// I/O exit code.
fn pack_failure(error: prebuilt::jit::pack::PackError) -> anyhow::Error {
    use prebuilt::jit::pack::PackError;
    match error {
        PackError::Read { .. } | PackError::Write { .. } => error.into(),
        PackError::Empty { .. } => {
            CommandFailed::new(Failure::NotFound, prebuilt::error_chain(&error)).into()
        }
        _ => CommandFailed::new(Failure::Verification, prebuilt::error_chain(&error)).into(),
    }
}

fn jit_export(args: JitExportArgs) -> Result<()> {
    let bundle = prebuilt::lookup::open_bundle(prebuilt::lookup::find_bundle(&args.package)?)?;
    let cache = args
        .jit_cache
        .unwrap_or_else(prebuilt::jit::default_cache_dir);
    let out = args.out.unwrap_or_else(|| {
        let name = prebuilt::site::normalize_package(&bundle.index().package);
        std::path::PathBuf::from(format!("{name}-warm-pack"))
    });
    let report = prebuilt::jit::pack::export_pack(&bundle, &cache, &out).map_err(pack_failure)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "wrote the warm pack {} ({} of `{}`)",
        report.path.display(),
        counted(report.entries.len(), "JIT result", "JIT results"),
        report.package
    );
    for entry in &report.entries {
        println!("  {entry}");
    }
    for skipped in &report.skipped {
        println!("  passed over: {skipped}");
    }
    Ok(())
}

fn jit_import(args: JitImportArgs) -> Result<()> {
    let package = match args.package {
        Some(package) => package,
        None => {
            prebuilt::jit::pack::read_pack(&args.pack)
                .map_err(pack_failure)?
                .package
        }
    };
    let bundle = prebuilt::lookup::open_bundle(prebuilt::lookup::find_bundle(&package)?)?;
    let cache = args
        .jit_cache
        .unwrap_or_else(prebuilt::jit::default_cache_dir);
    let installed =
        prebuilt::jit::pack::install_pack(&args.pack, &bundle, &cache).map_err(pack_failure)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&installed)?);
        return Ok(());
    }
    println!(
        "{} the warm pack of `{}` at {} ({}, each verified)",
        if installed.already {
            "already installed:"
        } else {
            "installed"
        },
        installed.package,
        installed.path.display(),
        counted(installed.entries.len(), "entry", "entries")
    );
    for entry in &installed.entries {
        println!("  {entry}");
    }
    Ok(())
}

fn written(outcome: bundler::writer::WriteOutcome) -> &'static str {
    match outcome {
        bundler::writer::WriteOutcome::Written => "written",
        bundler::writer::WriteOutcome::Unchanged => "unchanged",
    }
}

fn toolchains(manifest: &Path, json: bool) -> Result<()> {
    let manifest = bundler::Manifest::load(manifest)?;
    let mut builds = Vec::new();
    let mut missing = Vec::new();
    for &build in &manifest.library.cuda_builds {
        match bundler::toolchain::discover(build) {
            Ok(toolchain) => {
                let sms: Vec<String> = toolchain
                    .supported_archs
                    .iter()
                    .map(|sm| format!("sm_{sm}"))
                    .collect();
                if !json {
                    println!(
                        "{build}  {}  {}  (targets {})",
                        toolchain.compiler,
                        toolchain.root.display(),
                        sms.join(" ")
                    );
                }
                builds.push(serde_json::json!({
                    "build": build.to_string(),
                    "found": true,
                    "compiler": toolchain.compiler.to_string(),
                    "root": toolchain.root,
                    "targets": sms,
                }));
            }
            Err(error) => {
                if !json {
                    println!("{build}  missing: {error}");
                }
                missing.push(format!("{build}: {error}"));
                builds.push(serde_json::json!({
                    "build": build.to_string(),
                    "found": false,
                    "error": error.to_string(),
                }));
            }
        }
    }
    if json {
        println!(
            "{}",
            serde_json::json!({ "builds": builds, "missing": missing })
        );
    }
    if !missing.is_empty() {
        return Err(CommandFailed::new(
            Failure::NotFound,
            format!("{} CUDA build(s) have no toolchain", missing.len()),
        )
        .into());
    }
    Ok(())
}

/// `1 entry`, `2 entries`.
fn counted(count: usize, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}
