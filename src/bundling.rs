//! `dev bundle-kernels`: the build run, and its report rendered as text or JSON.

use anyhow::Result;

use crate::cli::BundleKernelsArgs;
use crate::exit::{CommandFailed, Failure};
use crate::{default_jobs, report, written};

pub(crate) fn bundle_kernels(args: BundleKernelsArgs) -> Result<()> {
    let jobs = default_jobs(args.jobs);
    let options = bundler::BundleOptions {
        manifest: args.manifest.resolve()?,
        out: args.out,
        cache_dir: args.cache.resolve(),
        jobs,
        only: if args.only.is_empty() {
            kernels_from_env(std::env::var("KWHEEL_KERNELS").ok().as_deref())
        } else {
            args.only
        },
        require: args.require || std::env::var_os("KWHEEL_REQUIRE").is_some_and(|v| v == "1"),
        torch: args.torch,
        progress: crate::progress::shown_unless(args.quiet),
        toolchains: None,
        farm: args.farm.then(farm),
    };
    let shared = bundler::SharedBuild {
        shard: args.shard.as_deref().map(str::parse).transpose()?,
        remote_cache: bundler::remote::resolve_remote_cache(args.remote_cache.as_deref(), None)?
            .map(|mut remote| {
                remote.upload = !args.remote_cache_read_only;
                remote
            }),
    };
    let summary = bundler::bundle_kernels_shared(&options, &shared).map_err(|error| {
        let context = format!("bundle-kernels for `{}` failed", options.manifest.display());
        match (&error, args.verbose) {
            (bundler::Error::NoTarget { kernel, skips }, false) => {
                no_target_summary(&context, kernel, skips)
            }
            _ => anyhow::Error::new(error).context(context),
        }
    })?;

    let variants: usize = summary
        .index
        .kernels
        .values()
        .map(|k| k.variants.len())
        .sum();
    if args.json {
        let report =
            bundler::pipeline::report::BuildReport::new(&summary, written(summary.written));
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    if let Some(remote) = &summary.remote {
        println!("remote cache: {remote}");
    }
    if let Some(farm) = &summary.farm {
        println!("{farm}");
    }
    let failed = summary.failures();
    if !failed.is_empty() {
        let mut by_kernel: std::collections::BTreeMap<&str, Vec<&bundler::pipeline::Failure>> =
            std::collections::BTreeMap::new();
        let mut full = String::new();
        for (kernel, failure) in &failed {
            by_kernel.entry(kernel).or_default().push(failure);
            full.push_str(&format!(
                "`{kernel}` {}:\n{}\n\n",
                failure.target, failure.error
            ));
        }
        let log = if args.verbose {
            None
        } else {
            report::write_log("bundle-kernels", &full)
        };
        for (kernel, errors) in by_kernel {
            let parts: Vec<report::TargetError> = errors
                .iter()
                .map(|failure| report::TargetError::of(failure))
                .collect();
            let groups = report::group_errors(&parts);
            eprint!(
                "warning: `{kernel}` failed for {} target(s), recorded as unavailable ({} \
                 distinct error(s)):\n{}",
                errors.len(),
                groups.len(),
                if args.verbose {
                    errors
                        .iter()
                        .map(|failure| format!("  {}:\n{}\n", failure.target, failure.error))
                        .collect()
                } else {
                    report::render_groups(&groups, log.as_deref())
                }
            );
        }
    }
    println!(
        "{} kernels, {variants} variants: {} built, {} from cache, {} skipped, {} failed; bundle {} {} in {:.2}s",
        summary.index.kernels.len(),
        summary.compiled().len(),
        summary.cached(),
        summary.skipped(),
        failed.len(),
        summary.out.display(),
        written(summary.written),
        summary.elapsed.as_secs_f64(),
    );
    let modules = &summary.index.modules;
    if !modules.is_empty() {
        let variants: usize = modules.values().map(|m| m.variants.len()).sum();
        let skipped: usize = modules.values().map(|m| m.skipped.len()).sum();
        println!(
            "{} extension modules, {variants} built (CUDA build × CPU): {} compiled, {} from \
             cache, {skipped} skipped",
            modules.len(),
            summary.modules_compiled.len(),
            variants - summary.modules_compiled.len(),
        );
        // A reason shared by both CPUs of a CUDA build is said once.
        for (name, record) in modules {
            let mut said: Vec<(prebuilt::CudaBuild, &str, Vec<&str>)> = Vec::new();
            for skip in &record.skipped {
                match said
                    .iter_mut()
                    .find(|(cuda, reason, _)| *cuda == skip.cuda && *reason == skip.reason)
                {
                    Some((_, _, cpus)) => cpus.push(&skip.cpu),
                    None => said.push((skip.cuda, &skip.reason, vec![&skip.cpu])),
                }
            }
            for (cuda, reason, cpus) in said {
                println!(
                    "  skipped `{name}` for {cuda} ({}): {reason}",
                    cpus.join(", ")
                );
            }
        }
    }
    Ok(())
}

/// A kernel that built for no target, said once per distinct error with the targets it hit and
/// the first lines of each; the whole text goes to a log file (or the terminal with --verbose).
fn no_target_summary(context: &str, kernel: &str, skips: &[bundler::Unbuilt]) -> anyhow::Error {
    let errors: Vec<report::TargetError> = skips
        .iter()
        .map(|unbuilt| match &unbuilt.failure {
            Some((failure, replayed)) => report::TargetError {
                target: failure.target.clone(),
                log: failure.log.clone(),
                replayed: *replayed,
            },
            None => report::TargetError {
                target: format!("{} ({})", unbuilt.arch, unbuilt.cuda),
                log: unbuilt.reason.to_string(),
                replayed: false,
            },
        })
        .collect();
    let groups = report::group_errors(&errors);
    let full: String = skips
        .iter()
        .map(|unbuilt| match &unbuilt.failure {
            Some((failure, _)) => format!("`{kernel}` {}:\n{}\n\n", failure.target, failure.reason),
            None => format!(
                "`{kernel}` {} ({}): {}\n\n",
                unbuilt.arch, unbuilt.cuda, unbuilt.reason
            ),
        })
        .collect();
    let log = report::write_log("bundle-kernels", &format!("{context}:\n{full}"));
    CommandFailed::new(
        Failure::Build,
        format!(
            "{context}: `{kernel}` was built for no target of the matrix; {} distinct error(s) on \
             {} target(s):\n{}",
            groups.len(),
            errors.len(),
            report::render_groups(&groups, log.as_deref()).trim_end()
        ),
    )
    .into()
}

/// `KWHEEL_KERNELS=a,b` as `--only a,b`.
fn kernels_from_env(value: Option<&str>) -> Vec<String> {
    value
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The build farm `--farm` asks for: `$KWHEEL_SCCACHE`, else `sccache` on `PATH`; its daemon
/// is found through `SCCACHE_SERVER_UDS` or `SCCACHE_SERVER_PORT` (docs/distributed-builds.md).
fn farm() -> std::sync::Arc<bundler::farm::Farm> {
    let sccache = std::env::var_os("KWHEEL_SCCACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "sccache".into());
    std::sync::Arc::new(bundler::farm::Farm::new(&sccache))
}
