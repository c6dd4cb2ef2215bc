//! The bundles inside a wheel: each `…/_prebuilt/` (found by its `kernels.idx`, or by the
//! `index.json` a wheel of an older kwheel shipped) is extracted to scratch and read the way
//! the loader reads it, its whole index decoded from `kernels.idx`, every artifact against its digest (streamed through
//! `Bundle::verify_artifact`, never held whole), every source against its hash, and every
//! warm pack under `packs/` as `dev build-wheel --add-pack` verifies one: `pack.json` and the
//! cubins it lists, in the folder its sha256 names, and nothing else. Every extension module
//! is decompressed, matched against its digest and audited for each of the wheel's platform
//! tags of its CPU, torch's and CUDA's libraries external (what `dev build-wheel` tagged it by):
//! it is stored compressed, so neither the wheel's own ELF audit nor PyPA's auditwheel sees it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use prebuilt::bundle::{Bundle, BundleError, INDEX_FILE, SOURCES_DIR};
use prebuilt::jit::pack::{verify_pack, BUNDLE_PACKS_DIR, PACK_FILE};
use prebuilt::key::sha256_hex;
use prebuilt::lookup::{encode, LOOKUP_FILE};

use super::reading::{inside, write_new};
use super::{BundleCheck, VerifyReport};
use crate::audit::{audit_module, AuditTarget};

pub(super) fn check_bundles(report: &mut VerifyReport, contents: &BTreeMap<String, Vec<u8>>) {
    let mut roots = BTreeSet::new();
    for file in [LOOKUP_FILE, INDEX_FILE] {
        let suffix = format!("_prebuilt/{file}");
        roots.extend(
            contents
                .keys()
                .filter(|name| *name == &suffix || name.ends_with(&format!("/{suffix}")))
                .map(|name| name[..name.len() - file.len()].to_owned()),
        );
    }
    for root in roots {
        check_bundle(report, contents, &root);
    }
}

/// Checks the bundle at `root` (`af3_kernels/_prebuilt/`) by extracting it and reading every
/// artifact the way the loader does.
fn check_bundle(report: &mut VerifyReport, contents: &BTreeMap<String, Vec<u8>>, root: &str) {
    // What the messages about the index as a whole name: the file its index is read from.
    let index_path = if contents.contains_key(&format!("{root}{INDEX_FILE}")) {
        format!("{root}{INDEX_FILE}")
    } else {
        format!("{root}{LOOKUP_FILE}")
    };
    let scratch = match tempfile::Builder::new().prefix("kwheel-verify-").tempdir() {
        Ok(dir) => dir,
        Err(error) => {
            report.problem(
                &index_path,
                format!("cannot be checked: no temporary directory ({error})"),
            );
            return;
        }
    };
    for (name, bytes) in contents.range(root.to_owned()..) {
        let Some(relative) = name.strip_prefix(root) else {
            break;
        };
        // Every name passed the archive checks; joined only once it is known to stay inside.
        let written = inside(scratch.path(), relative)
            .and_then(|target| write_new(&target, bytes).map_err(|error| error.to_string()));
        if let Err(error) = written {
            report.problem(name, format!("cannot be extracted to check it: {error}"));
            return;
        }
    }
    let bundle = match prebuilt::lookup::open_bundle(scratch.path()) {
        Ok(bundle) => bundle,
        Err(error) => {
            report.problem(&index_path, bundle_message(&error, scratch.path(), root));
            return;
        }
    };
    let index = bundle.index();
    // The loader reads kernels.idx, never index.json: where a wheel ships both (an older
    // kwheel's), the two must be one index.
    let lookup_path = format!("{root}{LOOKUP_FILE}");
    match contents.get(&lookup_path) {
        Some(_) if index_path == lookup_path => {}
        None => report.problem(
            &lookup_path,
            "is missing: the loader reads this kernel table, not index.json; rebuild the \
             bundle with `kwheel dev bundle-kernels`"
                .to_owned(),
        ),
        Some(bytes) if *bytes != encode(index) => report.problem(
            &lookup_path,
            format!(
                "does not match {index_path}: the loader would read other kernels than the \
                 index lists (sha256 {}, expected {})",
                sha256_hex(bytes),
                sha256_hex(&encode(index))
            ),
        ),
        Some(_) => {}
    }
    let mut failed = BTreeSet::new();
    let mut variants = 0;
    let mut remote = 0;
    // Artifacts of a registry-sized set's parts are checked with the set (`parts`).
    let in_parts = super::parts::part_files(contents, root);
    for (kernel, record) in &index.kernels {
        for variant in &record.variants {
            let shipped = contents.contains_key(&format!("{root}{}", variant.artifact.path));
            if !shipped && in_parts.contains(&variant.artifact.path) {
                continue;
            }
            if !shipped && index.store.is_some() {
                remote += 1;
                continue;
            }
            // The one verifying read (`Bundle::verify_artifact`): inflated into a hasher, never
            // held, and a file several variants share is decoded once.
            match bundle.verify_artifact(kernel, variant) {
                Ok(()) => variants += 1,
                Err(error) => {
                    let file = error_path(&error)
                        .strip_prefix(scratch.path())
                        .ok()
                        .map(|path| format!("{root}{}", path.to_string_lossy()))
                        .unwrap_or_else(|| format!("{root}{}", variant.artifact.path));
                    if failed.insert(file.clone()) {
                        report.problem(file, bundle_message(&error, scratch.path(), root));
                    }
                }
            }
        }
    }

    let sources_root = format!("{root}{SOURCES_DIR}/");
    let sources = contents.keys().any(|name| name.starts_with(&sources_root));
    if sources {
        for (kernel, record) in &index.kernels {
            if record.recipe.is_none() {
                continue;
            }
            for (stable, digest) in &record.inputs.files {
                let path = format!("{sources_root}{stable}");
                match contents.get(&path) {
                    None => report.problem(
                        &path,
                        format!("is missing: kernel `{kernel}` includes it, and the JIT fallback compiles it"),
                    ),
                    Some(bytes) if sha256_hex(bytes) != *digest => report.problem(
                        &path,
                        format!(
                            "has sha256 {}, but the index records {digest} for kernel `{kernel}`",
                            sha256_hex(bytes)
                        ),
                    ),
                    Some(_) => {}
                }
            }
        }
    }
    // The JIT refuses a kernel whose recorded flags are off its allowlist; a bundler given a
    // manifest may accept more, so the release says so before users find out.
    for (kernel, record) in &index.kernels {
        if record.recipe.is_none() {
            continue;
        }
        for refused in prebuilt::jit::refused_inputs(&record.inputs, record.recipe.as_ref()) {
            report.problem(
                &index_path,
                format!(
                    "kernel `{kernel}`: its {refused}; the JIT fallback refuses to compile it \
                     (it takes only flags that cannot name a file, a folder or a program: see \
                     docs/jit.md), so leave the flag out or ship cubins for every target"
                ),
            );
        }
    }
    check_packs(report, contents, root, scratch.path(), &bundle);
    let modules = check_modules(report, scratch.path(), root, &bundle);
    report.bundles.push(BundleCheck {
        root: root.to_owned(),
        kernels: index.kernels.len(),
        variants,
        remote,
        sources,
        modules,
    });
}

/// Checks every extension module of the bundle extracted in `scratch`: its bytes against
/// the index's digest, then the decompressed library against each platform tag of the wheel
/// for its CPU. Returns how many passed both.
fn check_modules(report: &mut VerifyReport, scratch: &Path, root: &str, bundle: &Bundle) -> usize {
    let tags: Vec<String> = report
        .filename
        .as_ref()
        .map(|filename| filename.platform_tags().to_vec())
        .unwrap_or_default();
    let mut passed = 0;
    for (name, record) in &bundle.index().modules {
        for variant in &record.variants {
            let file = format!("{root}{}", variant.artifact.path);
            let what = format!("extension module `{name}` ({})", variant.label());
            let bytes = match prebuilt::module::read_module(scratch, name, variant) {
                Ok(bytes) => bytes,
                Err(error) => {
                    report.problem(file, bundle_message(&error, scratch, root));
                    continue;
                }
            };
            let mut audited = false;
            let mut clean = true;
            for tag in &tags {
                match AuditTarget::for_platform(tag) {
                    Some(AuditTarget::Policy(policy)) if policy.architecture == variant.cpu => {
                        audited = true;
                        for violation in audit_module(policy, &file, &bytes) {
                            clean = false;
                            report.problem(&file, format!("{what}: {}", violation.message()));
                        }
                    }
                    Some(AuditTarget::Unrestricted) if tag.ends_with(variant.cpu.as_str()) => {
                        audited = true;
                    }
                    Some(AuditTarget::PlatformIndependent) => {
                        clean = false;
                        report.problem(
                            &file,
                            format!("{what} is host code, but the wheel is tagged `{tag}`"),
                        );
                    }
                    _ => {}
                }
            }
            if !audited && clean {
                clean = false;
                report.problem(
                    &file,
                    format!(
                        "{what} is built for {}, but no platform tag of the wheel ({}) names that CPU: \
                         an installer would put it where it cannot load",
                        variant.cpu,
                        tags.join(", ")
                    ),
                );
            }
            if clean {
                passed += 1;
            }
        }
    }
    passed
}

/// Checks the warm packs the bundle at `root` ships under `packs/` (extracted into `scratch`
/// with the rest of the bundle): each in a folder `packs/<id>/` whose id is its `pack.json`'s
/// (16 hex digits of its sha256), verified against `bundle` whole, as `--add-pack` and the
/// loader verify one, holding its `pack.json` and the cubins that lists and nothing else.
fn check_packs(
    report: &mut VerifyReport,
    contents: &BTreeMap<String, Vec<u8>>,
    root: &str,
    scratch: &Path,
    bundle: &Bundle,
) {
    let packs_root = format!("{root}{BUNDLE_PACKS_DIR}/");
    // Pack folder → its files, relative to it.
    let mut packs: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for name in contents.keys() {
        let Some(relative) = name.strip_prefix(&packs_root) else {
            continue;
        };
        match relative.split_once('/') {
            Some((id, file)) => packs.entry(id).or_default().push(file),
            None => report.problem(
                name,
                format!(
                    "lies in `{packs_root}` outside a pack's folder: a wheel ships a warm pack \
                     as `{packs_root}<id>/{PACK_FILE}` and the cubins it lists"
                ),
            ),
        }
    }
    for (id, files) in packs {
        let pack_json = format!("{packs_root}{id}/{PACK_FILE}");
        let unlisted = |report: &mut VerifyReport, listed: &BTreeSet<&str>| {
            for file in files.iter().filter(|file| !listed.contains(*file)) {
                report.problem(
                    format!("{packs_root}{id}/{file}"),
                    format!(
                        "is not vouched for by `{pack_json}`: a pack ships its `{PACK_FILE}` \
                         and the cubins it lists, nothing else"
                    ),
                );
            }
        };
        if !files.contains(&PACK_FILE) {
            report.problem(
                &pack_json,
                "is missing, but files of its pack folder ship: nothing vouches for them",
            );
            unlisted(report, &BTreeSet::new());
            continue;
        }
        let dir = scratch.join(BUNDLE_PACKS_DIR).join(id);
        let verified = match verify_pack(&dir, bundle) {
            Ok(verified) => verified,
            Err(error) => {
                let message =
                    prebuilt::error_chain(&error).replace(&format!("{}/", scratch.display()), root);
                report.problem(
                    &pack_json,
                    format!("does not verify against the bundle: {message}"),
                );
                continue;
            }
        };
        if verified.id() != id {
            report.problem(
                &pack_json,
                format!(
                    "lies in the folder `{id}`, but its sha256 gives `{}`: the loader and \
                     `--add-pack` name a pack's folder by it",
                    verified.id()
                ),
            );
        }
        let listed: BTreeSet<&str> = verified.files().map(|(file, _)| file).collect();
        unlisted(report, &listed);
    }
}

fn error_path(error: &BundleError) -> &Path {
    match error {
        BundleError::Read { path, .. }
        | BundleError::InvalidIndex { path, .. }
        | BundleError::UnsupportedFormat { path, .. }
        | BundleError::Refused { path, .. }
        | BundleError::Corrupt { path, .. }
        | BundleError::DigestMismatch { path, .. }
        | BundleError::Write { path, .. }
        | BundleError::UnsupportedLookup { path, .. } => path,
    }
}

/// A bundle error as a message about a file of the wheel: scratch paths become wheel paths.
fn bundle_message(error: &BundleError, scratch: &Path, root: &str) -> String {
    match error {
        BundleError::Read { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            "is missing, but the index lists it".to_owned()
        }
        BundleError::DigestMismatch {
            kernel,
            variant,
            expected,
            actual,
            ..
        } => format!(
            "decompresses to sha256 {actual}, but the index records {expected} (kernel `{kernel}`, {variant})"
        ),
        BundleError::Corrupt {
            kernel,
            variant,
            source,
            ..
        } => format!("does not decompress (kernel `{kernel}`, {variant}): {source}"),
        other => {
            let mut message = other.to_string();
            let mut cause = std::error::Error::source(other);
            while let Some(error) = cause {
                message.push_str(&format!(": {error}"));
                cause = error.source();
            }
            message.replace(&format!("{}/", scratch.display()), root)
        }
    }
}
