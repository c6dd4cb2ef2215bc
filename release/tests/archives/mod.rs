//! One reading of every archive: wheels and sdists that `wheel verify` passes install exactly
//! the files it listed (pip, Python's `zipfile` and pip's own `untar_file` do the
//! installing), and crafted archives that installers would read differently are refused.
//! Tests are named after the cases of the hardening list they answer (3: zip records that
//! disagree, 4: sdists read differently, 5: unbounded sdist reads, 6: files from outside the
//! library's root).

use super::*;

mod crafted;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use release::sdist::{read_archive, Sdist};
use release::{build_sdist, verify_sdist, write_wheel, SdistOptions};

const STEM: &str = "af3_kernels-0.1.0";
const SDIST_NAME: &str = "af3_kernels-0.1.0.tar.gz";

// ---------------------------------------------------------------------------------------------
// Helpers: Python's readings, and pip's installs

fn pip_available(python: &str) -> bool {
    let found = Command::new(python)
        .args(["-c", "import pip._internal.utils.unpacking"])
        .output()
        .is_ok_and(|output| output.status.success());
    if !found {
        skip("python3 has no pip");
    }
    found
}

/// The names Python's `zipfile` (what pip installs wheels with) reads from a zip, or its
/// refusal.
fn zipfile_names(python: &str, path: &Path) -> Result<Vec<String>, String> {
    let script = "import json, sys, zipfile\n\
                  z = zipfile.ZipFile(sys.argv[1])\n\
                  [z.read(i) for i in z.infolist()]\n\
                  print(json.dumps(z.namelist()))";
    let output = Command::new(python)
        .args(["-c", script])
        .arg(path)
        .output()
        .unwrap();
    if output.status.success() {
        Ok(serde_json::from_slice(&output.stdout).unwrap())
    } else {
        Err(output_text(&output))
    }
}

/// Every file under `dir`, relative, with `/`.
fn files_under(dir: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let relative = path.strip_prefix(root).unwrap();
                out.insert(relative.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

/// Installs a wheel with pip (no dependencies, no index) and lists what it wrote, without the
/// files pip adds to `.dist-info` itself.
fn pip_install_wheel(python: &str, wheel: &Path) -> BTreeSet<String> {
    let target = tempfile::tempdir().unwrap();
    pip_install_into(python, wheel, target.path());
    files_under(target.path())
        .into_iter()
        .filter(|path| {
            let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
            !(dir.ends_with(".dist-info")
                && ["INSTALLER", "REQUESTED", "direct_url.json"].contains(&name))
        })
        .collect()
}

/// Unpacks an sdist with pip's own `untar_file` and lists the files it wrote.
fn pip_untar(python: &str, sdist: &Path) -> Result<BTreeSet<String>, String> {
    pip_untar_into(python, sdist).map(|(_, files)| files)
}

/// [`pip_untar`], keeping the directory it unpacked into.
fn pip_untar_into(
    python: &str,
    sdist: &Path,
) -> Result<(tempfile::TempDir, BTreeSet<String>), String> {
    let target = tempfile::tempdir().unwrap();
    let script = "import sys\n\
                  from pip._internal.utils.unpacking import untar_file\n\
                  untar_file(sys.argv[1], sys.argv[2])";
    let output = Command::new(python)
        .args(["-c", script])
        .arg(sdist)
        .arg(target.path())
        .output()
        .unwrap();
    if output.status.success() {
        let files = files_under(target.path());
        Ok((target, files))
    } else {
        Err(output_text(&output))
    }
}

/// A wheel `wheel verify` passes installs exactly the files it listed; Python's `zipfile`
/// names the same entries.
fn assert_wheel_installs_as_listed(python: &str, wheel: &Path) {
    let report = verify_wheel(wheel).unwrap();
    assert!(report.is_ok(), "{report}");
    let listed: BTreeSet<String> = report.names.iter().cloned().collect();
    assert_eq!(listed.len(), report.names.len(), "no name twice");
    let read = zipfile_names(python, wheel).unwrap();
    assert_eq!(read, report.names, "zipfile reads {}", wheel.display());
    let installed = pip_install_wheel(python, wheel);
    assert_eq!(installed, listed, "pip installs {}", wheel.display());
}

/// An sdist verify passes unpacks, with pip's `untar_file`, into exactly the files it listed.
fn assert_sdist_unpacks_as_listed(python: &str, sdist: &Path) -> Sdist {
    let report = verify_sdist(sdist).unwrap();
    assert!(report.problems.is_empty(), "{report}");
    let listed: BTreeSet<String> = report.files.iter().cloned().collect();
    let unpacked = pip_untar(python, sdist).unwrap();
    assert_eq!(unpacked, listed, "pip unpacks {}", sdist.display());
    report
}

// ---------------------------------------------------------------------------------------------
// Zip surgery: a small wheel from the real writer, then its records edited

fn small_wheel(dir: &Path) -> PathBuf {
    write_wheel(&WheelSpec {
        filename: WheelFilename::new("demo", "1.0", "py3", "none", "any").unwrap(),
        metadata: Metadata {
            name: "demo".into(),
            version: "1.0".into(),
            summary: None,
            requires_python: None,
            requires_dist: Vec::new(),
        },
        files: vec![
            WheelFile::from_bytes("demo/__init__.py", b"VALUE = 1\n".to_vec()),
            WheelFile::from_bytes("demo/data.txt", b"data\n".repeat(100)),
        ],
        out_dir: dir.to_owned(),
        modified: None,
    })
    .unwrap()
}

/// A plain zip split into its parts: local records, central directory, entry count.
struct Parts {
    locals: Vec<u8>,
    directory: Vec<u8>,
    count: u16,
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(bytes[at..at + 2].try_into().unwrap())
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

fn split(bytes: &[u8]) -> Parts {
    let eocd = bytes.len() - 22;
    assert_eq!(u32_at(bytes, eocd), 0x0605_4b50, "a plain end record");
    let size = u32_at(bytes, eocd + 12) as usize;
    let offset = u32_at(bytes, eocd + 16) as usize;
    Parts {
        locals: bytes[..offset].to_vec(),
        directory: bytes[offset..offset + size].to_vec(),
        count: u16_at(bytes, eocd + 10),
    }
}

fn end_record(count: u16, size: usize, offset: usize) -> Vec<u8> {
    let mut out = 0x0605_4b50u32.to_le_bytes().to_vec();
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&(size as u32).to_le_bytes());
    out.extend_from_slice(&(offset as u32).to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

/// A stored entry's local record and central directory entry, its local header at `offset`.
fn stored_entry(name: &str, data: &[u8], offset: usize) -> (Vec<u8>, Vec<u8>) {
    let mut crc = flate2::Crc::new();
    crc.update(data);
    let crc = crc.sum();
    let mut local = 0x0403_4b50u32.to_le_bytes().to_vec();
    local.extend_from_slice(&20u16.to_le_bytes());
    local.extend_from_slice(&[0; 4]); // flags, method
    local.extend_from_slice(&[0; 4]); // time, date
    local.extend_from_slice(&crc.to_le_bytes());
    local.extend_from_slice(&(data.len() as u32).to_le_bytes());
    local.extend_from_slice(&(data.len() as u32).to_le_bytes());
    local.extend_from_slice(&(name.len() as u16).to_le_bytes());
    local.extend_from_slice(&0u16.to_le_bytes());
    local.extend_from_slice(name.as_bytes());
    local.extend_from_slice(data);
    let mut central = 0x0201_4b50u32.to_le_bytes().to_vec();
    central.extend_from_slice(&[20, 3]); // made by Unix
    central.extend_from_slice(&20u16.to_le_bytes());
    central.extend_from_slice(&[0; 8]); // flags, method, time, date
    central.extend_from_slice(&crc.to_le_bytes());
    central.extend_from_slice(&(data.len() as u32).to_le_bytes());
    central.extend_from_slice(&(data.len() as u32).to_le_bytes());
    central.extend_from_slice(&(name.len() as u16).to_le_bytes());
    central.extend_from_slice(&[0; 8]); // extra, comment, disk, internal attributes
    central.extend_from_slice(&(0o100_644u32 << 16).to_le_bytes());
    central.extend_from_slice(&(offset as u32).to_le_bytes());
    central.extend_from_slice(name.as_bytes());
    (local, central)
}

const HIDDEN: &str = "demo-1.0.pth";
const HIDDEN_CODE: &[u8] = b"import os; os.system('echo pwned')\n";

/// Python's `zipfile` (where there is a Python) reads the hidden entry from `crafted`: the
/// archive is one that installers read differently from the verifier's first look.
fn assert_zipfile_reads_hidden(dir: &Path, crafted: &[u8]) {
    if let Some(python) = python() {
        let path = dir.join("crafted.zip");
        std::fs::write(&path, crafted).unwrap();
        let names = zipfile_names(python, &path).unwrap();
        assert!(
            names.contains(&HIDDEN.to_owned()),
            "zipfile reads it: {names:?}"
        );
    }
}

/// Refuses `bytes` as a wheel, with a problem naming it that contains `expected`.
fn assert_refused(dir: &Path, bytes: &[u8], expected: &str) {
    let path = dir.join("demo-1.0-py3-none-any.whl");
    std::fs::write(&path, bytes).unwrap();
    let started = Instant::now();
    let report = verify_wheel(&path).unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!report.is_ok(), "accepted: {report}");
    let text = report.to_string();
    assert!(text.contains(expected), "{text}");
    assert!(release::verify::zip_entry_names(bytes).is_err());
}

#[test]
fn case3_an_end_record_that_counts_one_entry_fewer_than_the_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(small_wheel(dir.path())).unwrap();
    let mut parts = split(&bytes);
    // A `.pth` file pip would install and run at start-up, in the directory past the count.
    let (local, central) = stored_entry(HIDDEN, HIDDEN_CODE, parts.locals.len());
    parts.locals.extend_from_slice(&local);
    parts.directory.extend_from_slice(&central);
    let mut crafted = parts.locals.clone();
    crafted.extend_from_slice(&parts.directory);
    crafted.extend(end_record(
        parts.count,
        parts.directory.len(),
        parts.locals.len(),
    ));
    assert_zipfile_reads_hidden(dir.path(), &crafted);
    assert_refused(
        dir.path(),
        &crafted,
        &format!(
            "the end records count {} entries but the central directory holds {}",
            parts.count,
            parts.count + 1
        ),
    );
}

#[test]
fn case3_a_zip64_record_that_points_at_a_second_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(small_wheel(dir.path())).unwrap();
    let parts = split(&bytes);
    let (local, central) = stored_entry(HIDDEN, HIDDEN_CODE, parts.locals.len());
    let mut crafted = parts.locals.clone();
    crafted.extend_from_slice(&local);
    // The first directory, which the end record names; then a second one, with the hidden
    // entry, which the zip64 record names.
    let first = crafted.len();
    crafted.extend_from_slice(&parts.directory);
    let second = crafted.len();
    crafted.extend_from_slice(&parts.directory);
    crafted.extend_from_slice(&central);
    let second_size = crafted.len() - second;
    let record = crafted.len();
    crafted.extend_from_slice(&0x0606_4b50u32.to_le_bytes());
    crafted.extend_from_slice(&44u64.to_le_bytes());
    crafted.extend_from_slice(&[45, 3, 45, 0]);
    crafted.extend_from_slice(&[0; 8]);
    let count = u64::from(parts.count) + 1;
    crafted.extend_from_slice(&count.to_le_bytes());
    crafted.extend_from_slice(&count.to_le_bytes());
    crafted.extend_from_slice(&(second_size as u64).to_le_bytes());
    crafted.extend_from_slice(&(second as u64).to_le_bytes());
    crafted.extend_from_slice(&0x0706_4b50u32.to_le_bytes());
    crafted.extend_from_slice(&0u32.to_le_bytes());
    crafted.extend_from_slice(&(record as u64).to_le_bytes());
    crafted.extend_from_slice(&1u32.to_le_bytes());
    crafted.extend(end_record(parts.count, parts.directory.len(), first));
    assert_zipfile_reads_hidden(dir.path(), &crafted);
    assert_refused(
        dir.path(),
        &crafted,
        &format!(
            "the end record's entry count is {} and the zip64 record's {count}",
            parts.count
        ),
    );
}

#[test]
fn case3_end_records_and_directories_that_disagree_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(small_wheel(dir.path())).unwrap();
    let parts = split(&bytes);
    let whole = |locals: &[u8], directory: &[u8], end: Vec<u8>| {
        let mut out = locals.to_vec();
        out.extend_from_slice(directory);
        out.extend(end);
        out
    };
    let size = parts.directory.len();
    let offset = parts.locals.len();

    // A comment, and bytes after the end record.
    let mut commented = bytes.clone();
    let eocd = commented.len() - 22;
    commented[eocd + 20] = 5;
    commented.extend_from_slice(b"hello");
    assert_refused(
        dir.path(),
        &commented,
        "bytes follow the end-of-central-directory record",
    );
    let mut comment_field = bytes.clone();
    comment_field[eocd + 20] = 1;
    assert_refused(dir.path(), &comment_field, "has a 1-byte archive comment");
    let mut trailing = bytes.clone();
    trailing.extend_from_slice(&[0; 7]);
    assert_refused(
        dir.path(),
        &trailing,
        "7 bytes follow the end-of-central-directory record",
    );

    // A directory size one short, a count one more than the directory holds.
    let short = whole(
        &parts.locals,
        &parts.directory,
        end_record(parts.count, size - 1, offset),
    );
    assert_refused(dir.path(), &short, "is recorded as");
    let counted = whole(
        &parts.locals,
        &parts.directory,
        end_record(parts.count + 1, size, offset),
    );
    assert_refused(
        dir.path(),
        &counted,
        &format!(
            "count {} entries but the central directory holds {}",
            parts.count + 1,
            parts.count
        ),
    );

    // Bytes between the last entry and the directory that no entry claims (offsets kept right).
    let mut padded = parts.locals.clone();
    padded.extend_from_slice(b"PK\x03\x04 hidden local record");
    let gap = whole(
        &padded,
        &parts.directory,
        end_record(parts.count, size, padded.len()),
    );
    assert_refused(dir.path(), &gap, "belong to no entry");

    // Bytes before the archive (Python's zipfile shifts every offset past them).
    let mut prepended = b"#!/bin/sh\nexit 0\n".to_vec();
    prepended.extend_from_slice(&bytes);
    assert_refused(
        dir.path(),
        &prepended,
        "bytes lie between it and the end records",
    );

    // A local header whose sizes are not the directory's.
    let mut sized = bytes.clone();
    let local_size = u32_at(&sized, 22);
    sized[22..26].copy_from_slice(&(local_size + 1).to_le_bytes());
    assert_refused(dir.path(), &sized, "in its local record and");

    // Two directory entries of one name.
    let first_entry = 46 + usize::from(u16_at(&parts.directory, 28));
    let mut doubled = parts.directory.clone();
    doubled.extend_from_slice(&parts.directory[..first_entry]);
    let twice = whole(
        &parts.locals,
        &doubled,
        end_record(parts.count + 1, doubled.len(), offset),
    );
    assert_refused(dir.path(), &twice, "overlaps the entry before it");
}

#[test]
fn case3_wheels_that_verify_install_exactly_the_listed_files() {
    let Some(python) = python() else { return };
    if !pip_available(python) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A small wheel of the writer; the embedded library's recipes-only wheel (no toolchain
    // needed); the full wheel with its bundle where the toolchains are here.
    let mut wheels = vec![small_wheel(&dir.path().join("small"))];
    let manifest = copy_library(dir.path());
    let recipes = build_library_wheel(&LibraryWheelOptions {
        out: dir.path().join("recipes"),
        recipes_only: true,
        toolchains: Some(Vec::new()),
        ..LibraryWheelOptions::new(&manifest)
    })
    .unwrap_or_else(|error| panic!("{}", chain(&error)));
    wheels.push(recipes.path);
    if let Some(shared) = shared() {
        wheels.push(shared.built.path.clone());
    }
    for wheel in &wheels {
        assert_wheel_installs_as_listed(python, wheel);
    }
}

// ---------------------------------------------------------------------------------------------
// Tar surgery: headers written byte by byte, so each test says exactly what each holds

fn tar_header(name: &[u8], kind: u8, size: u64, mode: u32) -> [u8; 512] {
    let mut block = [0u8; 512];
    block[..name.len().min(100)].copy_from_slice(&name[..name.len().min(100)]);
    block[100..107].copy_from_slice(format!("{mode:07o}").as_bytes());
    block[108..115].copy_from_slice(b"0000000");
    block[116..123].copy_from_slice(b"0000000");
    block[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
    block[136..147].copy_from_slice(b"00000000000");
    block[156] = kind;
    block[257..263].copy_from_slice(b"ustar\0");
    block[263..265].copy_from_slice(b"00");
    checksum(&mut block);
    block
}

fn checksum(block: &mut [u8; 512]) {
    block[148..156].copy_from_slice(b"        ");
    let sum: u32 = block.iter().map(|&b| u32::from(b)).sum();
    block[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
}

/// A tar member: its header and data, padded to the block.
fn member(header: [u8; 512], data: &[u8]) -> Vec<u8> {
    let mut out = header.to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

fn file(name: &str, data: &[u8]) -> Vec<u8> {
    member(
        tar_header(name.as_bytes(), b'0', data.len() as u64, 0o644),
        data,
    )
}

fn pax(records: &[(&str, &str)]) -> Vec<u8> {
    let mut data = Vec::new();
    for (key, value) in records {
        let body = format!(" {key}={value}\n");
        let mut length = body.len() + 1;
        while format!("{length}{body}").len() != length {
            length += 1;
        }
        data.extend_from_slice(format!("{length}{body}").as_bytes());
    }
    member(
        tar_header(b"././@PaxHeader", b'x', data.len() as u64, 0o644),
        &data,
    )
}

fn gnu_long_name(name: &str) -> Vec<u8> {
    let mut data = name.as_bytes().to_vec();
    data.push(0);
    member(
        tar_header(b"././@LongLink", b'L', data.len() as u64, 0o644),
        &data,
    )
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

/// The tar stream (without its end blocks) of the embedded library's sdist, built the
/// product's way: the entries every crafted sdist starts from.
fn sdist_entries(dir: &Path) -> Vec<u8> {
    let manifest = copy_library(dir);
    let sdist = build_sdist(&SdistOptions {
        manifest,
        out: dir.join("good"),
    })
    .unwrap_or_else(|error| panic!("{}", chain(&error)));
    let mut tar = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&sdist.path).unwrap())
        .read_to_end(&mut tar)
        .unwrap();
    // Drop the end-of-archive blocks (and any padding).
    while tar.len() >= 512 && tar[tar.len() - 512..].iter().all(|&b| b == 0) {
        tar.truncate(tar.len() - 512);
    }
    tar
}

fn with_end(tar: &[u8]) -> Vec<u8> {
    let mut out = tar.to_vec();
    out.extend_from_slice(&[0; 1024]);
    out
}

/// Verifies `bytes` as the library's sdist; its problems, asserted to include `expected`.
fn assert_sdist_refused(dir: &Path, bytes: &[u8], expected: &str) -> String {
    let path = dir.join(SDIST_NAME);
    std::fs::write(&path, bytes).unwrap();
    let started = Instant::now();
    let report = verify_sdist(&path).unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    let problems = report.problems.join("\n");
    assert!(
        problems.contains(expected),
        "expected `{expected}` in:\n{problems}"
    );
    problems
}

const EVIL_MANIFEST: &[u8] = b"[library]\npackage = \"af3-kernels\"\n";

#[test]
fn case4_a_second_gzip_member_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let entries = sdist_entries(dir.path());
    // The first member ends without the end blocks; the second holds another manifest.
    let mut crafted = gzip(&entries);
    crafted.extend(gzip(&with_end(&file(
        &format!("{STEM}/kernels.toml"),
        EVIL_MANIFEST,
    ))));
    if let Some(python) = python() {
        if pip_available(python) {
            let path = dir.path().join("crafted").join(SDIST_NAME);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &crafted).unwrap();
            // pip reads on into the second member and writes its manifest over the first.
            let (unpacked, _) = pip_untar_into(python, &path).unwrap();
            let manifest = std::fs::read(unpacked.path().join("kernels.toml")).unwrap();
            assert_eq!(manifest, EVIL_MANIFEST);
        }
    }
    let problems = assert_sdist_refused(dir.path(), &crafted, "bytes follow the first gzip member");
    assert!(problems.contains(SDIST_NAME), "{problems}");
}

#[test]
fn case4_data_after_the_end_blocks_is_refused_and_zero_padding_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let entries = sdist_entries(dir.path());
    let mut junk = with_end(&entries);
    junk.extend_from_slice(&file(&format!("{STEM}/kernels.toml"), EVIL_MANIFEST));
    assert_sdist_refused(
        dir.path(),
        &gzip(&junk),
        "data follows the tar end-of-archive block",
    );
    let mut padded = with_end(&entries);
    padded.resize(padded.len().div_ceil(10240) * 10240 + 10240, 0);
    let path = dir.path().join("padded").join(SDIST_NAME);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, gzip(&padded)).unwrap();
    let report = verify_sdist(&path).unwrap();
    assert!(report.problems.is_empty(), "{report}");
    if let Some(python) = python() {
        if pip_available(python) {
            assert_sdist_unpacks_as_listed(python, &path);
        }
    }
    // No end block at all.
    assert_sdist_refused(
        dir.path(),
        &gzip(&entries),
        "ends without its end-of-archive block",
    );
}

#[test]
fn case4_names_that_readers_resolve_differently_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let entries = sdist_entries(dir.path());
    let toml = format!("{STEM}/kernels.toml");
    let other = format!("{STEM}/other.toml");
    let crafted = |extra: Vec<u8>| {
        let mut tar = entries.clone();
        tar.extend(extra);
        gzip(&with_end(&tar))
    };
    let header = |name: &str| tar_header(name.as_bytes(), b'0', 3, 0o644);

    // A PAX path and a GNU long name, which tar-rs and Python's tarfile pick apart.
    let mut both = pax(&[("path", &toml)]);
    both.extend(gnu_long_name(&other));
    both.extend(member(header(&other), b"x=1"));
    assert_sdist_refused(
        dir.path(),
        &crafted(both),
        "follows another extended header",
    );

    // A PAX path renaming a header that holds another short name.
    let mut renamed = pax(&[("path", &toml)]);
    renamed.extend(member(header(&other), b"x=1"));
    assert_sdist_refused(dir.path(), &crafted(renamed), "is renamed");

    // A GNU long name holding a NUL before its end (Python cuts there, tar-rs does not).
    let long = format!("{STEM}/{}", "d/".repeat(60));
    let mut cut = gnu_long_name(&format!("{toml}\0{long}x"));
    cut.extend(member(header(&toml), b"x=1"));
    assert_sdist_refused(dir.path(), &crafted(cut), "holds a NUL before its end");

    // A PAX size that is not the header's.
    let mut sized = pax(&[("size", "0")]);
    sized.extend(member(header(&other), b"x=1"));
    assert_sdist_refused(
        dir.path(),
        &crafted(sized),
        "its PAX size 0 is not the header's 3",
    );

    // PAX records an sdist does not need, and a global header.
    let mut sparse = pax(&[("GNU.sparse.name", &toml)]);
    sparse.extend(member(header(&other), b"x=1"));
    assert_sdist_refused(dir.path(), &crafted(sparse), "has record `GNU.sparse.name`");
    let global = member(tar_header(b"pax_global_header", b'g', 0, 0o644), b"");
    assert_sdist_refused(dir.path(), &crafted(global), "a global PAX header");

    // A prefix field under GNU magic (Python joins it, tar-rs does not).
    let mut gnu = tar_header(b"kernels.toml", b'0', 3, 0o644);
    gnu[257..265].copy_from_slice(b"ustar  \0");
    gnu[345..345 + STEM.len()].copy_from_slice(STEM.as_bytes());
    checksum(&mut gnu);
    assert_sdist_refused(
        dir.path(),
        &crafted(member(gnu, b"x=1")),
        "ustar prefix field without POSIX ustar magic",
    );

    // An old-style entry ending in `/` (a directory to Python, a file to tar-rs).
    let old = tar_header(format!("{STEM}/data/").as_bytes(), 0, 0, 0o644);
    assert_sdist_refused(dir.path(), &crafted(member(old, b"")), "old-style entry");

    // Duplicates, a file inside a file, links, a FIFO.
    assert_sdist_refused(
        dir.path(),
        &crafted(file(&toml, EVIL_MANIFEST)),
        "is in the archive twice",
    );
    assert_sdist_refused(
        dir.path(),
        &crafted(file(&format!("{toml}/x"), b"")),
        "which is a file",
    );
    for (kind, what) in [
        (b'2', "is a symbolic link"),
        (b'1', "is a hard link"),
        (b'6', "is a FIFO"),
        (b'3', "is a character device"),
    ] {
        let link = member(tar_header(other.as_bytes(), kind, 0, 0o644), b"");
        let problems = assert_sdist_refused(dir.path(), &crafted(link), what);
        assert!(problems.contains(&other), "{problems}");
    }
    // A bad checksum.
    let mut broken = tar_header(other.as_bytes(), b'0', 3, 0o644);
    broken[0] ^= 1;
    assert_sdist_refused(dir.path(), &crafted(member(broken, b"x=1")), "has checksum");
}

#[test]
fn case4_sdists_that_verify_unpack_exactly_the_listed_files() {
    let Some(python) = python() else { return };
    if !pip_available(python) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let entries = sdist_entries(dir.path());
    // The product's own sdist.
    let good = dir.path().join("good").join(SDIST_NAME);
    let report = assert_sdist_unpacks_as_listed(python, &good);
    assert!(report.files.contains(&"kernels.toml".to_owned()));

    // Long names: a GNU long name as tar-rs writes it, a PAX path as Python's tarfile writes
    // it (header holding the first 100 bytes), and a non-ASCII name in PAX.
    let deep = format!("{STEM}/python/af3_kernels/{}/deep.txt", "nested".repeat(20));
    let mut tar = entries.clone();
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(4);
    header.set_mode(0o644);
    builder
        .append_data(&mut header, &deep, &b"deep"[..])
        .unwrap();
    let mut long = builder.into_inner().unwrap();
    long.truncate(long.len() - 1024); // its end blocks
    tar.extend(long);
    let pax_name = format!("{STEM}/python/af3_kernels/{}/pax.txt", "p".repeat(120));
    tar.extend(pax(&[("path", &pax_name)]));
    tar.extend(member(
        tar_header(pax_name.as_bytes(), b'0', 3, 0o644),
        b"pax",
    ));
    let accented = format!("{STEM}/python/af3_kernels/caf\u{e9}.txt");
    tar.extend(pax(&[("path", &accented)]));
    let ascii: String = accented
        .chars()
        .map(|c| if c.is_ascii() { c } else { '?' })
        .collect();
    tar.extend(member(tar_header(ascii.as_bytes(), b'0', 3, 0o755), b"caf"));
    let path = dir.path().join("long").join(SDIST_NAME);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, gzip(&with_end(&tar))).unwrap();
    let report = assert_sdist_unpacks_as_listed(python, &path);
    for name in [&deep, &pax_name, &accented] {
        let relative = name.strip_prefix(&format!("{STEM}/")).unwrap();
        assert!(report.files.iter().any(|f| f == relative), "{relative}");
    }

    // An sdist Python's tarfile writes (PAX format, its own gzip), from the same files.
    let unpacked = tempfile::tempdir().unwrap();
    let script = "import sys, tarfile, os\n\
                  from pip._internal.utils.unpacking import untar_file\n\
                  untar_file(sys.argv[1], sys.argv[2])\n\
                  with tarfile.open(sys.argv[3], 'w:gz', format=tarfile.PAX_FORMAT) as t:\n\
                  \x20   t.add(sys.argv[2], arcname=sys.argv[4])";
    let written = dir.path().join("python").join(SDIST_NAME);
    std::fs::create_dir_all(written.parent().unwrap()).unwrap();
    let output = Command::new(python)
        .args(["-c", script])
        .arg(&good)
        .arg(unpacked.path())
        .arg(&written)
        .arg(STEM)
        .output()
        .unwrap();
    assert_succeeded(&output);
    assert_sdist_unpacks_as_listed(python, &written);
}

// ---------------------------------------------------------------------------------------------
// 5. Bounds

/// A gzip bomb: a tar header for one file, then 2 GiB of zeros, about 2 MB compressed; cached
/// under the target's scratch space.
fn bomb() -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("release-archives")
        .join(SDIST_NAME);
    if path.is_file() {
        return path;
    }
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let temp = path.with_extension("partial");
    let mut encoder = flate2::write::GzEncoder::new(
        std::fs::File::create(&temp).unwrap(),
        flate2::Compression::best(),
    );
    encoder
        .write_all(&tar_header(
            format!("{STEM}/PKG-INFO").as_bytes(),
            b'0',
            60 << 20,
            0o644,
        ))
        .unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..2048 {
        encoder.write_all(&zeros).unwrap();
    }
    encoder.finish().unwrap();
    std::fs::rename(&temp, &path).unwrap();
    path
}

/// Run in a child process by the test below: verifies the sdist `KWHEEL_SDIST_BOMB` names and
/// prints its problems and peak memory.
#[test]
fn case5_child_verifies_the_sdist_it_is_given() {
    let Ok(path) = std::env::var("KWHEEL_SDIST_BOMB") else {
        return;
    };
    let report = verify_sdist(Path::new(&path)).unwrap();
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let peak = status
        .lines()
        .find(|line| line.starts_with("VmHWM:"))
        .unwrap()
        .to_owned();
    println!("problems: {}", report.problems.join(" | "));
    println!("{peak}");
}

#[test]
fn case5_a_gzip_bomb_is_refused_quickly_in_bounded_memory() {
    let bomb = bomb();
    let compressed = std::fs::metadata(&bomb).unwrap().len();
    assert!(compressed < 3 << 20, "a ~2 MB bomb: {compressed}");
    let started = Instant::now();
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "archives::case5_child_verifies_the_sdist_it_is_given",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("KWHEEL_SDIST_BOMB", &bomb)
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    assert_succeeded(&output);
    let text = output_text(&output);
    assert!(
        text.contains("more than 100:1; refused as a decompression bomb"),
        "{text}"
    );
    let peak_kb: u64 = text
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .map(|value| value.trim().trim_end_matches(" kB").trim().parse().unwrap())
        .unwrap();
    eprintln!("gzip bomb of {compressed} bytes: refused in {elapsed:?}, peak {peak_kb} kB");
    assert!(peak_kb < 200 << 10, "peak {peak_kb} kB");
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
}

#[test]
fn case5_an_entry_over_the_cap_is_refused_from_its_header() {
    let dir = tempfile::tempdir().unwrap();
    let mut tar = tar_header(format!("{STEM}/PKG-INFO").as_bytes(), b'0', 2 << 30, 0o644).to_vec();
    tar.extend_from_slice(&[0; 1024]);
    assert_sdist_refused(
        dir.path(),
        &gzip(&tar),
        "over the 67108864-byte cap on an sdist entry",
    );
}

#[test]
fn case5_an_sdist_path_that_is_a_fifo_a_device_or_a_link_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join(SDIST_NAME);
    let made = Command::new("mkfifo").arg(&fifo).status();
    let started = Instant::now();
    if made.is_ok_and(|status| status.success()) {
        let error = verify_sdist(&fifo).unwrap_err();
        assert!(
            chain(&error).contains("not a regular file"),
            "{}",
            chain(&error)
        );
    } else {
        skipped("no mkfifo");
    }
    let error = verify_sdist(Path::new("/dev/zero")).unwrap_err();
    assert!(
        chain(&error).contains("not a regular file"),
        "{}",
        chain(&error)
    );
    let linked = dir.path().join("linked");
    std::fs::create_dir(&linked).unwrap();
    let real = dir.path().join("real.tar.gz");
    std::fs::write(&real, gzip(&[0; 1024])).unwrap();
    std::os::unix::fs::symlink(&real, linked.join(SDIST_NAME)).unwrap();
    let error = verify_sdist(&linked.join(SDIST_NAME)).unwrap_err();
    let text = chain(&error);
    assert!(
        text.contains("is a symbolic link") && text.contains(SDIST_NAME),
        "{text}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn case5_the_reader_streams_files_to_its_caller_without_keeping_them() {
    // 40 files of 1 MiB each, handed over one by one.
    let mut tar = Vec::new();
    // Data that does not compress (a hash chain), so no ratio applies.
    let mut data = Vec::with_capacity(1 << 20);
    let mut block = sha2::Sha256::digest(b"seed");
    while data.len() < 1 << 20 {
        data.extend_from_slice(&block);
        block = sha2::Sha256::digest(block);
    }
    for n in 0..40 {
        tar.extend(file(&format!("{STEM}/data/{n}.bin"), &data));
    }
    let bytes = gzip(&with_end(&tar));
    let mut seen = 0u64;
    let entries = read_archive(bytes.as_slice(), &mut |_, reader| {
        seen += std::io::copy(reader, &mut std::io::sink())?;
        Ok(())
    })
    .unwrap();
    assert_eq!(entries.len(), 40);
    assert_eq!(seen, 40 << 20);
}

// ---------------------------------------------------------------------------------------------
// 6. Files from outside the library's root

fn recipes_only(manifest: &Path, out: &Path) -> Result<BuiltWheel, Error> {
    build_library_wheel(&LibraryWheelOptions {
        out: out.to_owned(),
        recipes_only: true,
        toolchains: Some(Vec::new()),
        ..LibraryWheelOptions::new(manifest)
    })
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A private key outside the library, readable by its owner only.
fn secret(dir: &Path) -> PathBuf {
    let outside = dir.join("home/.ssh");
    std::fs::create_dir_all(&outside).unwrap();
    let key = outside.join("id_rsa");
    std::fs::write(&key, "-----BEGIN OPENSSH PRIVATE KEY-----\n").unwrap();
    set_mode(&key, 0o600);
    key
}

fn edit_manifest(manifest: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(manifest).unwrap();
    assert!(text.contains(from), "{from} in the manifest");
    std::fs::write(manifest, text.replacen(from, to, 1)).unwrap();
}

#[test]
fn case6_include_dirs_outside_the_root_are_refused_naming_the_key() {
    for include in ["../home/.ssh", "ABSOLUTE"] {
        let dir = tempfile::tempdir().unwrap();
        let manifest = copy_library(dir.path());
        let key = secret(dir.path());
        let include = include.replace("ABSOLUTE", &key.parent().unwrap().display().to_string());
        edit_manifest(
            &manifest,
            "include-dirs = [\"include\"]",
            &format!("include-dirs = [\"include\", \"{include}\"]"),
        );
        for error in [
            recipes_only(&manifest, &dir.path().join("wheels")).unwrap_err(),
            build_sdist(&SdistOptions {
                manifest: manifest.clone(),
                out: dir.path().join("sdist"),
            })
            .unwrap_err(),
        ] {
            let text = chain(&error);
            assert!(
                text.contains("`library.include-dirs` names") && text.contains(&include),
                "{text}"
            );
        }
        assert!(
            !dir.path().join("wheels").exists()
                || files_under(&dir.path().join("wheels")).is_empty()
        );
    }
}

#[test]
fn case6_files_linked_out_of_the_root_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = copy_library(dir.path());
    let root = manifest.parent().unwrap().to_owned();
    let key = secret(dir.path());
    // A key linked into the Python package, and a header that is a link out.
    std::os::unix::fs::symlink(&key, root.join("python/af3_kernels/id_rsa")).unwrap();
    let error = recipes_only(&manifest, &dir.path().join("wheels")).unwrap_err();
    let text = chain(&error);
    assert!(
        text.contains("af3_kernels/id_rsa") && text.contains("resolves to"),
        "{text}"
    );
    let error = build_sdist(&SdistOptions {
        manifest: manifest.clone(),
        out: dir.path().join("sdist"),
    })
    .unwrap_err();
    assert!(chain(&error).contains("id_rsa"), "{}", chain(&error));
    std::fs::remove_file(root.join("python/af3_kernels/id_rsa")).unwrap();

    let header = root.join("include/af3/common.cuh");
    let moved = dir.path().join("home/common.cuh");
    std::fs::rename(&header, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &header).unwrap();
    let error = recipes_only(&manifest, &dir.path().join("wheels")).unwrap_err();
    let text = chain(&error);
    assert!(
        text.contains("common.cuh") && text.contains("`kernels.") && text.contains("resolves to"),
        "{text}"
    );
    let error = build_sdist(&SdistOptions {
        manifest: manifest.clone(),
        out: dir.path().join("sdist"),
    })
    .unwrap_err();
    assert!(chain(&error).contains("common.cuh"), "{}", chain(&error));
}

#[test]
fn case6_an_sdist_whose_manifest_reaches_outside_fails_verification() {
    let dir = tempfile::tempdir().unwrap();
    let key = secret(dir.path());
    let entries = sdist_entries(dir.path());
    // The product's manifest, with an include dir outside the sdist: its planning would read
    // the key from the machine that verifies it.
    let manifest = std::fs::read_to_string(dir.path().join("kernels/kernels.toml")).unwrap();
    let outside = key.parent().unwrap().display().to_string();
    let manifest = manifest.replacen(
        "include-dirs = [\"include\"]",
        &format!("include-dirs = [\"include\", \"{outside}\"]"),
        1,
    );
    let mut tar = Vec::new();
    let mut rest = entries.as_slice();
    // Every entry but the manifest, then the edited one.
    while !rest.is_empty() {
        let header = &rest[..512];
        let name = String::from_utf8_lossy(&header[..100])
            .trim_end_matches('\0')
            .to_owned();
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&header[124..135]).trim_matches(['\0', ' ']),
            8,
        )
        .unwrap();
        let length = 512 + size.div_ceil(512) * 512;
        if name != format!("{STEM}/kernels.toml") {
            tar.extend_from_slice(&rest[..length]);
        }
        rest = &rest[length..];
    }
    tar.extend(file(&format!("{STEM}/kernels.toml"), manifest.as_bytes()));
    let problems = assert_sdist_refused(
        dir.path(),
        &gzip(&with_end(&tar)),
        "`library.include-dirs` names",
    );
    assert!(problems.contains("is absolute"), "{problems}");
}

#[test]
fn case6_modes_are_normalised_and_the_sdist_is_world_readable() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let manifest = copy_library(dir.path());
    let package = manifest.parent().unwrap().join("python/af3_kernels");
    set_mode(&package.join("__init__.py"), 0o600);
    std::fs::write(package.join("tool.sh"), "#!/bin/sh\n").unwrap();
    set_mode(&package.join("tool.sh"), 0o700);
    let built = recipes_only(&manifest, &dir.path().join("wheels")).unwrap();
    let bytes = std::fs::read(&built.path).unwrap();
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    for (name, mode) in [
        ("af3_kernels/__init__.py", 0o644),
        ("af3_kernels/tool.sh", 0o755),
    ] {
        let entry = archive.by_name(name).unwrap();
        assert_eq!(entry.unix_mode().unwrap() & 0o777, mode, "{name}");
    }
    let sdist = build_sdist(&SdistOptions {
        manifest: manifest.clone(),
        out: dir.path().join("sdist"),
    })
    .unwrap();
    let mode = std::fs::metadata(&sdist.path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o644);
    let wheel_mode = std::fs::metadata(&built.path).unwrap().permissions().mode();
    assert_eq!(wheel_mode & 0o777, 0o644);
    let mut modes = BTreeMap::new();
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(
        std::fs::File::open(&sdist.path).unwrap(),
    ));
    for entry in archive.entries().unwrap() {
        let entry = entry.unwrap();
        modes.insert(
            entry.path().unwrap().to_string_lossy().into_owned(),
            entry.header().mode().unwrap(),
        );
    }
    assert_eq!(
        modes[&format!("{STEM}/python/af3_kernels/__init__.py")],
        0o644
    );
    assert_eq!(modes[&format!("{STEM}/python/af3_kernels/tool.sh")], 0o755);
}
