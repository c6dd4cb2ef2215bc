//! For tests: a hook that runs between a pack's check and the use of what was read (a file of
//! the pack swapped there must change nothing of what is installed or shipped), and a small
//! bundle with a warm pack that verifies against it, built from a fixture cubin without a
//! compiler. Only the hook's call site is compiled outside tests and the `testing` feature.

use std::path::Path;

#[cfg(any(test, feature = "testing"))]
pub use fixture::{fixture_pack, FixturePack};

/// What [`after_check`] runs.
#[cfg(any(test, feature = "testing"))]
type Hook = Box<dyn FnMut(&Path)>;

#[cfg(any(test, feature = "testing"))]
thread_local! {
    static AFTER_CHECK: std::cell::RefCell<Option<Hook>> = const { std::cell::RefCell::new(None) };
}

/// Runs `hook` with the pack's folder, on this thread, each time a pack has been read and
/// checked whole and before what was read is used; until [`clear_after_check`].
#[cfg(any(test, feature = "testing"))]
pub fn after_check(hook: impl FnMut(&Path) + 'static) {
    AFTER_CHECK.with(|slot| *slot.borrow_mut() = Some(Box::new(hook)));
}

/// Removes this thread's [`after_check`] hook.
#[cfg(any(test, feature = "testing"))]
pub fn clear_after_check() {
    AFTER_CHECK.with(|slot| *slot.borrow_mut() = None);
}

/// The pack at `dir` has been read and checked; what was read is used next.
pub(super) fn checked(dir: &Path) {
    #[cfg(any(test, feature = "testing"))]
    AFTER_CHECK.with(|slot| {
        if let Some(hook) = slot.borrow_mut().as_mut() {
            hook(dir);
        }
    });
    let _ = dir;
}

#[cfg(any(test, feature = "testing"))]
mod fixture {
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};

    use super::super::{inputs_digest, PackIndex, PackKernel, PACK_FILE, PACK_FORMAT};
    use crate::index::{
        CompilerRecord, Function, Index, KernelInputs, KernelRecord, Variant, INDEX_FORMAT,
    };
    use crate::key::{sha256_hex, KernelKey, KeyInputs};
    use crate::Bundle;

    /// NVRTC 12.9.86's `sm_90a` cubin of `prebuilt/tests/fixtures/cubin/kernels.cu`.
    const CUBIN: &[u8] = include_bytes!("../../../tests/fixtures/cubin/nvrtc129_sm_90a.cubin");

    /// A bundle of one kernel, `axpy` (the fixture's `kw_axpy`, no cubin of its own), and a
    /// warm pack of its JIT result for `cu129/sm_90a` that verifies against it.
    pub struct FixturePack {
        /// The bundle.
        pub bundle: Bundle,
        /// The pack's folder.
        pub pack: PathBuf,
        /// The pack's only artifact: its path inside the pack, and its bytes (a zstd frame).
        pub artifact: (String, Vec<u8>),
        /// The cubin it holds.
        pub cubin: Vec<u8>,
    }

    /// [`FixturePack`] under `dir` (`dir/bundle`, `dir/pack`).
    pub fn fixture_pack(dir: &Path) -> FixturePack {
        let inputs = KernelInputs {
            entries: vec!["kw_axpy".to_owned()],
            files: BTreeMap::from([("axpy.cu".to_owned(), sha256_hex(b"axpy"))]),
            cxx_std: "c++17".to_owned(),
            ..KernelInputs::default()
        };
        let torch = "2.13.*";
        let compiler = CompilerRecord {
            kind: "nvrtc".to_owned(),
            version: "12.9.86".to_owned(),
        };
        let (arch, cuda) = ("sm_90a".parse().unwrap(), "cu129".parse().unwrap());
        let key = KernelKey::compute(&KeyInputs {
            kernel: "axpy",
            inputs: &inputs,
            arch,
            cuda,
            torch,
            compiler: &compiler,
        });
        let stored = zstd::encode_all(CUBIN, 19).expect("zstd compresses");
        let variant = Variant {
            structs: Default::default(),
            arch,
            cuda,
            torch: torch.to_owned(),
            compiler,
            key: key.0,
            artifact: crate::testing::stored_file(CUBIN, &stored),
            functions: vec![Function {
                computed: Default::default(),
                name: "kw_axpy".to_owned(),
                symbol: "kw_axpy".to_owned(),
                param_sizes: vec![8, 4, 8],
            }],
        };
        let index = Index {
            format: INDEX_FORMAT,
            store: None,
            package: "af3-kernels".to_owned(),
            torch: torch.to_owned(),
            dictionary: None,
            modules: Default::default(),
            kernels: BTreeMap::from([(
                "axpy".to_owned(),
                KernelRecord {
                    inputs: inputs.clone(),
                    recipe: None,
                    constants: BTreeMap::new(),
                    variants: Vec::new(),
                    skipped: Vec::new(),
                },
            )]),
        };
        let pack_index = PackIndex {
            format: PACK_FORMAT,
            package: "af3-kernels".to_owned(),
            torch: torch.to_owned(),
            kernels: BTreeMap::from([(
                "axpy".to_owned(),
                PackKernel {
                    inputs: inputs_digest(&inputs),
                    variants: vec![variant.clone()],
                },
            )]),
        };
        let pack = dir.join("pack");
        let artifact = variant.artifact.path.clone();
        std::fs::create_dir_all(pack.join(&artifact).parent().unwrap()).unwrap();
        std::fs::write(pack.join(&artifact), &stored).unwrap();
        std::fs::write(
            pack.join(PACK_FILE),
            serde_json::to_vec_pretty(&pack_index).unwrap(),
        )
        .unwrap();
        let root = dir.join("bundle");
        std::fs::create_dir_all(&root).unwrap();
        FixturePack {
            bundle: Bundle::with_index(root, index),
            pack,
            artifact: (artifact, stored),
            cubin: CUBIN.to_vec(),
        }
    }
}
