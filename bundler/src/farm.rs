//! Compile actions on a build farm: sccache-dist (Mozilla sccache's scheduler and build
//! servers), reached through an sccache client daemon the team already runs. kwheel hands each
//! nvcc and `ptxas` run of the bundler to `sccache`, which runs the host stages here and ships
//! `cicc` and `ptxas` with their inputs to a server; the cubin comes back into the key's work
//! folder and is validated like a local one (ELF, target, entries, stubs). kwheel's key stays
//! the identity of what was built, and its build cache (local, then remote) is asked first.
//! The JIT never uses the farm. See docs/distributed-builds.md.
//!
//! | compile | where |
//! | --- | --- |
//! | `nvcc -cubin …` (nvcc builds), the route's `ptxas` (CUDA 12.9's `nvcc+ptxas`) | the farm |
//! | `nvcc -ptx …` (`compute_XY` targets, the route's first step) | here: sccache 0.19 cannot distribute a PTX output |
//! | line tables (`-lineinfo`, `-G`, …) | here: a server sees no source file, so its line tables would hold other sizes and times |
//! | NVRTC (CUDA 12.9 without host code) | here: a library call in this process |
//!
//! A stage the farm cannot finish (a server that dies) is run here by sccache itself; a
//! compile that fails through the farm but builds here is run here by kwheel; the report
//! counts both ([`FarmReport`]). An `sm_XYa` or `sm_XYf` compile reaches the farm with its
//! arch spelled as `-arch=compute_XYa -code=sm_XYa` (the same compile to nvcc), so that
//! sccache's own `nvcc -E` of the unit sees the arch-specific macros.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use prebuilt::compile::{Local, ToolRun, ToolRunner};

use crate::error::Error;

/// Options that make a compile's output depend on the source files' sizes and times, which a
/// build server does not have: kept here.
const LINE_TABLE_FLAGS: &[&str] = &["-lineinfo", "--generate-line-info", "-G", "--device-debug"];

/// The sccache client daemon that reaches the farm, and what this build sent it.
pub struct Farm {
    sccache: PathBuf,
    /// The daemon's address (`SCCACHE_SERVER_UDS` or `SCCACHE_SERVER_PORT`), and the client
    /// configuration for the statistics calls.
    env: Vec<(OsString, OsString)>,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    sent: usize,
    kept: BTreeMap<&'static str, usize>,
}

impl std::fmt::Debug for Farm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Farm")
            .field("sccache", &self.sccache)
            .finish_non_exhaustive()
    }
}

/// Why a compile the farm failed and this machine built was run here.
pub const FARM_FAILED: &str = "the farm failed it, this machine built it";

/// Why a `-ptx` compile is kept here, by design.
pub const KEPT_PTX: &str = "a PTX output (sccache 0.19 cannot distribute `-ptx`)";

/// Why a compile with line tables is kept here, by design.
pub const KEPT_LINE_TABLES: &str = "line tables (a server has no source file to describe)";

/// The variables that name the daemon and its configuration, passed on to every `sccache`
/// call (nvcc's own environment stays clean).
const DAEMON_VARIABLES: &[&str] = &[
    "SCCACHE_SERVER_UDS",
    "SCCACHE_SERVER_PORT",
    "SCCACHE_CONF",
    "SCCACHE_DIR",
];

/// What the daemon's statistics say of one build: compiles it ran on each server, and here.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FarmStats {
    /// Device stages (cicc, ptxas) each server ran, by its address.
    pub by_server: BTreeMap<String, u64>,
    /// Device stages run here: the farm failed them (a dead server) or had no room.
    pub local_stages: u64,
    /// Stages the farm failed (sccache then ran them here).
    pub dist_errors: u64,
    /// Compiles answered from sccache's own cache (kwheel's cache is asked first).
    pub cache_hits: u64,
}

/// What a build did with the farm.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FarmReport {
    /// Compiles (nvcc or ptxas runs) handed to the farm.
    pub sent: usize,
    /// Compiles run here by design, by reason.
    pub kept_local: BTreeMap<&'static str, usize>,
    /// What the daemon counted for those compiles.
    pub stats: FarmStats,
}

impl std::fmt::Display for FarmReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stages: u64 = self.stats.by_server.values().sum();
        write!(
            f,
            "build farm: {} compile(s) sent, {stages} device stage(s) on {} server(s)",
            self.sent,
            self.stats.by_server.len()
        )?;
        for (server, count) in &self.stats.by_server {
            write!(f, "\n  {server}: {count} stage(s)")?;
        }
        if self.stats.dist_errors > 0 || self.stats.local_stages > 0 {
            write!(
                f,
                "\n  {} stage(s) failed on the farm, {} run here instead",
                self.stats.dist_errors, self.stats.local_stages
            )?;
        }
        if self.stats.cache_hits > 0 {
            write!(
                f,
                "\n  {} answered from sccache's cache",
                self.stats.cache_hits
            )?;
        }
        for (reason, count) in &self.kept_local {
            write!(f, "\n  {count} compile(s) kept here: {reason}")?;
        }
        Ok(())
    }
}

impl Farm {
    /// The farm of `sccache` (an `sccache` executable), reached through the daemon the
    /// environment names (`SCCACHE_SERVER_UDS` or `SCCACHE_SERVER_PORT`, with `SCCACHE_CONF`).
    pub fn new(sccache: &Path) -> Farm {
        let env = DAEMON_VARIABLES
            .iter()
            .filter_map(|name| Some((OsString::from(name), std::env::var_os(name)?)))
            .collect();
        Farm {
            sccache: sccache.to_owned(),
            env,
            counts: Mutex::default(),
        }
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.sccache);
        command.env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            command.env("PATH", path);
        }
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    /// The daemon's statistics now; an error when it does not answer or has no farm (a
    /// daemon started by accident with no configuration would compile everything here).
    pub fn stats(&self) -> Result<FarmStats, Error> {
        let farm_error = |reason: String| Error::Farm {
            sccache: self.sccache.clone(),
            reason,
        };
        let output = self
            .command()
            .args(["--show-stats", "--stats-format", "json"])
            .output()
            .map_err(|error| farm_error(format!("cannot run it: {error}")))?;
        if !output.status.success() {
            return Err(farm_error(format!(
                "`--show-stats` failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        let json: serde_json::Value = serde_json::from_slice(&output.stdout)
            .map_err(|error| farm_error(format!("`--show-stats` printed no JSON: {error}")))?;
        let stats = &json["stats"];
        let number = |value: &serde_json::Value| value.as_u64().unwrap_or(0);
        let by_server: BTreeMap<String, u64> = stats["dist_compiles"]
            .as_object()
            .map(|servers| {
                servers
                    .iter()
                    .map(|(server, count)| (server.clone(), number(count)))
                    .collect()
            })
            .unwrap_or_default();
        let device = number(&stats["compilations"])
            .saturating_sub(number(&stats["non_cacheable_compilations"]));
        let distributed: u64 = by_server.values().sum();
        Ok(FarmStats {
            local_stages: device.saturating_sub(distributed),
            dist_errors: number(&stats["dist_errors"]),
            cache_hits: stats["cache_hits"]["counts"]
                .as_object()
                .map_or(0, |counts| counts.values().map(number).sum()),
            by_server,
        })
    }

    /// Checks that the daemon answers with a farm behind it: `--dist-status` names a
    /// scheduler.
    pub fn check(&self) -> Result<FarmStats, Error> {
        let output = self
            .command()
            .arg("--dist-status")
            .output()
            .map_err(|error| Error::Farm {
                sccache: self.sccache.clone(),
                reason: format!("cannot run it: {error}"),
            })?;
        let text = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() || text.contains("Disabled") || text.contains("NotConfigured") {
            return Err(Error::Farm {
                sccache: self.sccache.clone(),
                reason: format!(
                    "its daemon has no farm (`--dist-status`: {}); start it with the farm's \
                     configuration and give its address in SCCACHE_SERVER_UDS or \
                     SCCACHE_SERVER_PORT",
                    text.trim()
                ),
            });
        }
        self.stats()
    }

    /// What this build did with the farm, from the statistics taken at its start.
    pub fn report(&self, before: &FarmStats) -> Result<FarmReport, Error> {
        let after = self.stats()?;
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let by_server = after
            .by_server
            .iter()
            .map(|(server, n)| {
                (
                    server.clone(),
                    n - before.by_server.get(server).unwrap_or(&0),
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        Ok(FarmReport {
            sent: counts.sent,
            kept_local: counts.kept.clone(),
            stats: FarmStats {
                by_server,
                local_stages: after.local_stages.saturating_sub(before.local_stages),
                dist_errors: after.dist_errors.saturating_sub(before.dist_errors),
                cache_hits: after.cache_hits.saturating_sub(before.cache_hits),
            },
        })
    }

    /// Why `run` stays here, if it does.
    fn kept_here(run: &ToolRun<'_>) -> Option<&'static str> {
        let arguments: Vec<String> = run
            .arguments
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        if run.name == "nvcc" && arguments.iter().any(|a| a == "-ptx") {
            return Some(KEPT_PTX);
        }
        let line_tables = arguments.iter().any(|a| {
            LINE_TABLE_FLAGS.contains(&a.as_str())
                || a.split([',', '=']).any(|piece| piece == "-lineinfo")
        });
        line_tables.then_some(KEPT_LINE_TABLES)
    }
}

impl ToolRunner for Farm {
    fn run(&self, run: &ToolRun<'_>) -> std::io::Result<std::process::Output> {
        if let Some(reason) = Farm::kept_here(run) {
            let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            *counts.kept.entry(reason).or_default() += 1;
            drop(counts);
            return Local.run(run);
        }
        let (program, arguments) = if run.name == "nvcc" {
            (
                nvcc_by_name(run.work, run.program)?,
                split_arch(run.arguments),
            )
        } else {
            (run.program.to_owned(), run.arguments.to_vec())
        };
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).sent += 1;
        let output = self
            .command()
            .arg(program)
            .args(arguments)
            .current_dir(run.work)
            .env("TMPDIR", run.work)
            .output()?;
        if output.status.success() {
            return Ok(output);
        }
        // What the farm's route cannot compile is compiled here, and counted (a build that
        // needs a clean farm checks that count); a real error fails here too, with the local
        // compiler's words.
        let local = Local.run(run)?;
        if local.status.success() {
            let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            *counts.kept.entry(FARM_FAILED).or_default() += 1;
        }
        Ok(local)
    }
}

/// nvcc's arguments as the farm is given them: in a `-cubin` compile, `-arch=sm_XY` (with
/// its `a` or `f`) spelled as the pair it stands for, `-arch=compute_XY -code=sm_XY`. nvcc plans
/// the same compile from either spelling (the same `--dryrun`, so the same cubin), but sccache
/// first runs `nvcc -E` with the compile's arguments to hash the unit, and nvcc 13.0's `-E`
/// with `-arch=sm_90a` leaves out the arch-specific macros the compile defines
/// (`__CUDA_ARCH_FEAT_SM90_ALL`, `__CUDA_ARCH_SPECIFIC__`, `__CUDA_ARCH_FAMILY_SPECIFIC__`),
/// while with the split spelling it defines them: a unit that insists on them (`#error`
/// without sm_90a) would fail that step, and sccache fails the whole compile with it.
///
/// Only arch-specific (`a`) and family (`f`) targets are spelled again, the ones whose macros
/// `-E` drops and whose two spellings were shown to plan the same compile; a plain `sm_XY`, and
/// a compile whose flags already name a code (`-code`, `-gencode`, `--gpu-code`), go as given.
fn split_arch(arguments: &[OsString]) -> Vec<OsString> {
    let names_code = arguments.iter().any(|argument| {
        argument.to_str().is_some_and(|argument| {
            ["-code", "-gencode", "--gpu-code", "--generate-code"]
                .iter()
                .any(|flag| argument == *flag || argument.starts_with(&format!("{flag}=")))
        })
    });
    if names_code || !arguments.iter().any(|argument| argument == "-cubin") {
        return arguments.to_vec();
    }
    let mut split = Vec::with_capacity(arguments.len() + 1);
    for argument in arguments {
        let real = argument
            .to_str()
            .and_then(|argument| argument.strip_prefix("-arch=sm_"))
            .filter(|real| real.ends_with(['a', 'f']));
        match real {
            Some(real) => {
                split.push(format!("-arch=compute_{real}").into());
                split.push(format!("-code=sm_{real}").into());
            }
            None => split.push(argument.clone()),
        }
    }
    split
}

/// nvcc as a file rather than a link, in a view of its toolkit that outlives the compile:
/// sccache follows a link to the toolkit's real place (which would then name itself in what
/// nvcc writes), and remembers the compiler it found by its content, with the place it found
/// it, for the compiles after (so a view in the work folder, removed after each compile, would
/// be gone for the next one). The view, beside the work folders, is a folder of links to the
/// toolkit's entries with `bin/nvcc` the real nvcc's file (a hard link, or a copy); made once
/// per toolkit (its place and its nvcc's file), under a temporary name and renamed into place.
fn nvcc_by_name(work: &Path, program: &Path) -> std::io::Result<PathBuf> {
    let Ok(toolkit) = std::fs::read_link(work.join("cuda")) else {
        return Ok(program.to_owned());
    };
    let nvcc = program.file_name().unwrap_or_default().to_owned();
    // Named by the toolkit's place and its nvcc's file (inode, size, time): a toolkit
    // reinstalled in place gets a view of its own, never the old nvcc beside the new tools.
    let identity = {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(toolkit.join("bin").join(&nvcc))?;
        format!(
            "{}\n{}\n{}\n{}.{}",
            toolkit.display(),
            meta.ino(),
            meta.len(),
            meta.mtime(),
            meta.mtime_nsec()
        )
    };
    let digest = prebuilt::key::sha256_hex(identity.as_bytes());
    let base = work.parent().unwrap_or(work);
    let view = base.join(format!("kwheel-farm-toolkit-{}", &digest[..16]));
    let file = view.join("bin").join(&nvcc);
    if file.is_file() {
        return Ok(file);
    }
    static STAGINGS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let staging = base.join(format!(
        ".kwheel-farm-toolkit-{}-{}-{}",
        &digest[..16],
        std::process::id(),
        STAGINGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(staging.join("bin"))?;
    for entry in std::fs::read_dir(&toolkit)? {
        let name = entry?.file_name();
        if name != "bin" {
            std::os::unix::fs::symlink(toolkit.join(&name), staging.join(&name))?;
        }
    }
    for entry in std::fs::read_dir(toolkit.join("bin"))? {
        let name = entry?.file_name();
        if name != nvcc {
            let target = toolkit.join("bin").join(&name);
            std::os::unix::fs::symlink(target, staging.join("bin").join(&name))?;
        }
    }
    let real = toolkit.join("bin").join(&nvcc);
    let copy = staging.join("bin").join(&nvcc);
    if std::fs::hard_link(&real, &copy).is_err() {
        std::fs::copy(&real, &copy)?;
    }
    // Another compile may have made the view first: its view serves.
    if std::fs::rename(&staging, &view).is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_with<'a>(name: &'a str, arguments: &'a [OsString]) -> ToolRun<'a> {
        ToolRun {
            name,
            program: Path::new("/tk/bin/nvcc"),
            arguments,
            work: Path::new("/w"),
        }
    }

    #[test]
    fn ptx_outputs_and_line_tables_stay_here() {
        let args = |list: &[&str]| list.iter().map(OsString::from).collect::<Vec<_>>();
        let cubin = args(&["-cubin", "-arch=sm_90a", "-o", "kernel.cubin", "src/k.cu"]);
        assert_eq!(Farm::kept_here(&run_with("nvcc", &cubin)), None);
        let ptx = args(&["-ptx", "-arch=compute_90", "-o", "kernel.ptx", "src/k.cu"]);
        assert!(Farm::kept_here(&run_with("nvcc", &ptx))
            .unwrap()
            .contains("PTX"));
        for flag in [
            "-lineinfo",
            "-G",
            "--generate-line-info",
            "-Xptxas=-lineinfo",
        ] {
            let lines = args(&["-cubin", flag, "src/k.cu"]);
            assert!(
                Farm::kept_here(&run_with("nvcc", &lines))
                    .unwrap()
                    .contains("line tables"),
                "{flag}"
            );
        }
        let ptxas = args(&[
            "-arch=sm_90a",
            "-m64",
            "-o",
            "kernel.cubin",
            "kernel.lowered.ptx",
        ]);
        assert_eq!(Farm::kept_here(&run_with("ptxas", &ptxas)), None);
    }

    #[test]
    fn a_cubin_compile_names_its_virtual_and_real_arch_apart() {
        let args = |list: &[&str]| list.iter().map(OsString::from).collect::<Vec<_>>();
        for arch in ["90a", "100a", "100f"] {
            let cubin = args(&[
                "-cubin",
                &format!("-arch=sm_{arch}"),
                "-o",
                "k.cubin",
                "k.cu",
            ]);
            assert_eq!(
                split_arch(&cubin),
                args(&[
                    "-cubin",
                    &format!("-arch=compute_{arch}"),
                    &format!("-code=sm_{arch}"),
                    "-o",
                    "k.cubin",
                    "k.cu"
                ])
            );
        }
        // A PTX output (kept here anyway) is left as it is, as are a plain arch (no macro to
        // lose) and a compile whose flags already name a code.
        let ptx = args(&["-ptx", "-arch=compute_90a", "-o", "k.ptx", "k.cu"]);
        assert_eq!(split_arch(&ptx), ptx);
        let plain = args(&["-cubin", "-arch=sm_90", "-o", "k.cubin", "k.cu"]);
        assert_eq!(split_arch(&plain), plain);
        let coded = args(&[
            "-cubin",
            "-arch=sm_90a",
            "-gencode=arch=compute_90a,code=sm_90a",
            "k.cu",
        ]);
        assert_eq!(split_arch(&coded), coded);
    }

    #[test]
    fn nvcc_runs_as_a_file_of_a_view_of_its_toolkit() {
        let toolkit = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(toolkit.path().join("bin")).unwrap();
        std::fs::create_dir_all(toolkit.path().join("include")).unwrap();
        for tool in ["nvcc", "ptxas", "cicc"] {
            std::fs::write(toolkit.path().join("bin").join(tool), "").unwrap();
        }
        let work = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(toolkit.path(), work.path().join("cuda")).unwrap();
        let program = work.path().join("cuda/bin/nvcc");
        std::fs::write(toolkit.path().join("bin/nvcc"), "the real nvcc").unwrap();
        let file = nvcc_by_name(work.path(), &program).unwrap();
        let view = file.parent().unwrap().parent().unwrap().to_owned();
        assert_eq!(view.parent(), work.path().parent());
        let metadata = std::fs::symlink_metadata(&file).unwrap();
        assert!(metadata.is_file(), "a file, not a link");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "the real nvcc");
        for (link, target) in [("bin/ptxas", "bin/ptxas"), ("include", "include")] {
            assert_eq!(
                std::fs::read_link(view.join(link)).unwrap(),
                toolkit.path().join(target)
            );
        }
        // The next compile finds the view made.
        assert_eq!(nvcc_by_name(work.path(), &program).unwrap(), file);
        std::fs::remove_dir_all(view).unwrap();
    }
}
