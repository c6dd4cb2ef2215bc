//! What the benches over the `flashinfer-cubin` corpus share: where `ci/bench-setup` puts
//! it, its cubins, a solid archive's entries, and the statistics they print.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// `${KWHEEL_BENCH:-${XDG_CACHE_HOME:-~/.cache}/kwheel/bench}/flashinfer-cubin/cubins`, as
/// `ci/bench-setup` lays it out.
pub fn corpus_root() -> PathBuf {
    let bench = match std::env::var_os("KWHEEL_BENCH").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => prebuilt::cache::cache_home_or_unwritable().join("kwheel/bench"),
    };
    bench.join("flashinfer-cubin/cubins")
}

/// Every `.cubin` below `root`, as sorted `/`-separated paths relative to it (the paths inside
/// the wheel); `None` when there are none.
pub fn cubin_paths(root: &Path) -> Option<Vec<String>> {
    if !root.is_dir() {
        return None;
    }
    let paths: Vec<String> = testkit::tree::files(root)
        .into_keys()
        .filter(|path| Path::new(path).extension().is_some_and(|e| e == "cubin"))
        .collect();
    (!paths.is_empty()).then_some(paths)
}

/// The `percent`th percentile of `sorted`.
pub fn percentile(sorted: &[Duration], percent: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[(sorted.len() - 1) * percent / 100]
}

/// Appends `bytes` to a solid `tar` as the file `path`, with fixed mode and mtime.
pub fn append_file<W: std::io::Write>(archive: &mut tar::Builder<W>, path: &str, bytes: &[u8]) {
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(0);
    archive
        .append_data(&mut header, path, bytes)
        .expect("a tar entry");
}

/// A duration in whole microseconds.
pub fn micros(duration: Duration) -> String {
    format!("{:.0} µs", duration.as_secs_f64() * 1e6)
}
