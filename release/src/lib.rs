//! Release machinery for prebuilt-kernel bundles: wheels that carry a bundle, the manylinux
//! audit of everything inside them, and verification of any wheel.
//!
//! ```text
//! kernels.toml ─► bundle fresh? ─► Python package + _prebuilt/ ─► audit ─► write_wheel ─► verify
//!                  (else refuse,      (library)                   (audit)   (wheel)       (verify)
//!                   or bundle first)
//! ```
//!
//! | module | owns |
//! | --- | --- |
//! | [`wheel`] | wheel file names and tags, `METADATA`, `WHEEL`, `RECORD`, the deterministic writer |
//! | [`library`] | a kernel library's wheel: bundle freshness, the Python package and `_prebuilt/` |
//! | [`runtime`] | the `kwheel` wheels: the command and the Python module for glibc 2.28 (x86_64, aarch64) with `cargo zigbuild` |
//! | [`sdist`] | a kernel library's source distribution (PEP 625) and its verification |
//! | [`audit`] | the manylinux_2_28 policy and the audit of host ELF files (cubins are skipped) |
//! | [`verify`] | re-checking any wheel: RECORD, tags, zip hygiene, bundles, the audit |
//! | [`check`] | the release checklist: every gate a release must pass, as one report |
//! | [`publish`] | slim wheels' variant filter; publishing wheels and artifacts to a store |
//!
//! It reads bundles through `prebuilt` and builds them only through `bundler` (when a wheel is
//! asked for and the bundle is missing). The wheel layout is described in
//! `docs/wheel-format.md`.
#![deny(missing_docs)]

pub mod audit;
pub mod check;
pub mod diff;
pub mod library;
pub mod modules;
pub mod publish;
pub mod runtime;
pub mod sdist;
mod tree;
pub mod verify;
pub mod wheel;

mod error;
pub use error::{Error, StaleKernel};

pub use audit::{audit_elf, Policy, Violation, MANYLINUX_2_28_AARCH64, MANYLINUX_2_28_X86_64};
pub use check::{release_check, CheckOptions, Checklist, Gate, GateStatus};
pub use library::{build_library_wheel, check_bundle_current, BuiltWheel, LibraryWheelOptions};
pub use publish::{publish, PublishOptions, PublishReport, ShipFilter};
pub use runtime::{
    build_runtime_wheel, NativeCommand, NativeModule, RuntimeArch, RuntimeWheelOptions,
};
pub use sdist::{build_sdist, verify_sdist, SdistOptions};
pub use verify::{verify_wheel, Problem, VerifiedWheel, VerifyReport};
pub use wheel::{write_wheel, Metadata, WheelFile, WheelFilename, WheelSpec};
