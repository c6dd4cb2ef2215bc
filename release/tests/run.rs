//! The release machinery end to end: the default library's wheel (bundled with the real CUDA
//! toolchains that `ci/setup` installs), wheels written by an independent writer for
//! verification, and real ELF files compiled here with the system `cc` for the audit.
//!
//! Tests that need a toolchain (CUDA, `cc`, `python3` with pip) skip with the reason when it is
//! missing, unless `KWHEEL_REQUIRE_TOOLCHAINS=1` (CI), where they fail.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use base64::Engine as _;
use release::audit::{audit_file, AuditTarget, ElfKind};
use release::library::torch_requirement;
use release::wheel::{record_hash, KWHEEL_VERSION};
use release::{
    audit_elf, build_library_wheel, verify_wheel, BuiltWheel, Error, LibraryWheelOptions, Metadata,
    WheelFile, WheelFilename, WheelSpec, MANYLINUX_2_28_X86_64,
};
use sha2::Digest as _;
use zip::write::SimpleFileOptions;

const WHEEL_NAME: &str =
    "af3_kernels-0.1.0-py3-none-manylinux_2_28_x86_64.manylinux_2_28_aarch64.whl";
const DIST_INFO: &str = "af3_kernels-0.1.0.dist-info";

mod support;
use support::*;

// The fault-injecting store, as `super::loopback_store` for the areas.
use testkit::loopback_store;

// One module per area.
mod archives;
mod audit;
mod diff;
mod distribution;
mod foreign;
mod from_source;
// wheel verify names recorded flags the JIT refuses.
mod jit_flags;
// One reading of a wheel: what is checked is what is used.
mod one_reading;
// Registry-sized wheels: a main wheel and its companion parts.
mod parts;
// Property tests of the round trips: RECORD, wheel file names.
mod properties;
mod python_runtime;
// Snapshots of RECORD, METADATA and the errors a user reads.
mod user_text;
// Warm packs a wheel ships under `_prebuilt/packs/`, checked like every artifact.
mod warm_packs;
mod wheel;
mod writer;
