//! Which kernels this process has loaded, on which device, from which binary: the list
//! `kwheel.provenance()` prints and profiler traces name (`docs/provenance.md`).
//!
//! Every successful [`Registry::load_on`] adds its kernel here. The list holds the kernels
//! weakly: a kernel is listed while anything still holds it (its registry does, for as long
//! as the registry lives), so a dropped registry's modules are unloaded as before.

use std::path::Path;
use std::sync::Weak;

use super::*;

/// One kernel loaded in this process, with the facts a trace range names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LoadedKernel {
    /// The kernel library's distribution name (`af3-kernels`).
    pub package: String,
    /// The bundle it was loaded from.
    pub bundle: PathBuf,
    /// The kernel.
    pub kernel: String,
    /// The device ordinal it is loaded on.
    pub device: u32,
    /// The variant (`cu130/sm_90a`), or the JIT's build and architecture.
    pub variant: String,
    /// `prebuilt`, `jit-cache` or `jit-compiled`.
    pub source: ProvenanceKind,
    /// The cubin's key, in full.
    pub key: String,
    /// Why this cubin was chosen, or compiled.
    pub reason: String,
    /// The range name its launches are traced under ([`Kernel::trace_label`]).
    pub label: String,
}

struct Entry {
    package: String,
    bundle: PathBuf,
    kernel: Weak<KernelInner>,
}

static LOADED: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// Adds `kernel`, just loaded from `package`'s bundle at `bundle`, to the process's list;
/// forgets the kernels nothing holds any more.
pub(super) fn record(package: &str, bundle: &Path, kernel: &Kernel) {
    let mut loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
    loaded.retain(|entry| entry.kernel.strong_count() > 0);
    loaded.push(Entry {
        package: package.to_owned(),
        bundle: bundle.to_path_buf(),
        kernel: Arc::downgrade(&kernel.inner),
    });
}

/// Every kernel loaded in this process and still held, in the order they loaded.
pub fn loaded_kernels() -> Vec<LoadedKernel> {
    let loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
    loaded
        .iter()
        .filter_map(|entry| {
            let inner = entry.kernel.upgrade()?;
            let kernel = Kernel { inner };
            Some(LoadedKernel {
                package: entry.package.clone(),
                bundle: entry.bundle.clone(),
                kernel: kernel.name().to_owned(),
                device: kernel.device(),
                variant: kernel.variant().to_owned(),
                source: kernel.provenance().kind(),
                key: kernel.provenance().key().to_owned(),
                reason: kernel.reason().to_owned(),
                label: kernel.trace_label(),
            })
        })
        .collect()
}
