//! A second round of crafted archives, each written byte by byte: data descriptors that
//! disagree with the central directory, stored entries with descriptors, names that differ
//! only by letter case, RECORD listing a file twice, sdist links. Each refused one is checked
//! against what Python reads; each accepted one is installed with pip and compared.

use super::*;

/// A data descriptor after an entry's data: signed or not, then its CRC-32, compressed size
/// and size, `None` meaning the true value.
type Descriptor = (bool, Option<u32>, Option<u32>, Option<u32>);

/// One entry of a zip written here: deflated, optionally with a data descriptor.
struct Entry<'a> {
    name: &'a str,
    data: Vec<u8>,
    /// Stored (method 0) instead of deflated.
    stored: bool,
    /// A data descriptor after the data; the local header then holds zeros.
    descriptor: Option<Descriptor>,
}

impl Entry<'_> {
    fn new(name: &str, data: &[u8]) -> Entry<'static> {
        Entry {
            name: Box::leak(name.to_owned().into_boxed_str()),
            data: data.to_vec(),
            stored: false,
            descriptor: None,
        }
    }
}

/// A zip of `entries` in order, with a correct central directory and end record.
fn zip_of(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut directory = Vec::new();
    for entry in entries {
        let mut crc = flate2::Crc::new();
        crc.update(&entry.data);
        let crc = crc.sum();
        let body = if entry.stored {
            entry.data.clone()
        } else {
            let mut encoder =
                flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
            encoder.write_all(&entry.data).unwrap();
            encoder.finish().unwrap()
        };
        let (method, flags) = (
            if entry.stored { 0u16 } else { 8 },
            0x0800u16 | if entry.descriptor.is_some() { 8 } else { 0 },
        );
        let offset = out.len() as u32;
        let (local_crc, local_c, local_u) = if entry.descriptor.is_some() {
            (0, 0, 0)
        } else {
            (crc, body.len() as u32, entry.data.len() as u32)
        };
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        out.extend_from_slice(&20u16.to_le_bytes());
        out.extend_from_slice(&flags.to_le_bytes());
        out.extend_from_slice(&method.to_le_bytes());
        out.extend_from_slice(&[0, 0, 0x21, 0]); // time, date
        for value in [local_crc, local_c, local_u] {
            out.extend_from_slice(&value.to_le_bytes());
        }
        out.extend_from_slice(&(entry.name.len() as u16).to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(entry.name.as_bytes());
        out.extend_from_slice(&body);
        if let Some((signed, d_crc, d_c, d_u)) = entry.descriptor {
            if signed {
                out.extend_from_slice(&0x0807_4b50u32.to_le_bytes());
            }
            for value in [
                d_crc.unwrap_or(crc),
                d_c.unwrap_or(body.len() as u32),
                d_u.unwrap_or(entry.data.len() as u32),
            ] {
                out.extend_from_slice(&value.to_le_bytes());
            }
        }
        directory.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        directory.extend_from_slice(&[20, 3]);
        directory.extend_from_slice(&20u16.to_le_bytes());
        directory.extend_from_slice(&flags.to_le_bytes());
        directory.extend_from_slice(&method.to_le_bytes());
        directory.extend_from_slice(&[0, 0, 0x21, 0]);
        for value in [crc, body.len() as u32, entry.data.len() as u32] {
            directory.extend_from_slice(&value.to_le_bytes());
        }
        directory.extend_from_slice(&(entry.name.len() as u16).to_le_bytes());
        directory.extend_from_slice(&[0; 8]);
        directory.extend_from_slice(&(0o100_644u32 << 16).to_le_bytes());
        directory.extend_from_slice(&offset.to_le_bytes());
        directory.extend_from_slice(entry.name.as_bytes());
    }
    let offset = out.len();
    out.extend_from_slice(&directory);
    out.extend(end_record(entries.len() as u16, directory.len(), offset));
    out
}

/// The entries of a `demo 1.0` wheel holding `files`, `.dist-info` last, RECORD listing every
/// file once (and `record_extra` lines after them).
fn wheel_entries(files: Vec<Entry<'static>>, record_extra: &str) -> Vec<Entry<'static>> {
    let info = "demo-1.0.dist-info";
    let mut entries = files;
    entries.push(Entry::new(
        &format!("{info}/METADATA"),
        b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
    ));
    entries.push(Entry::new(
        &format!("{info}/WHEEL"),
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    ));
    let mut record = String::new();
    for entry in &entries {
        record.push_str(&format!(
            "{},{},{}\n",
            entry.name,
            release::wheel::record_hash(&entry.data),
            entry.data.len()
        ));
    }
    record.push_str(record_extra);
    record.push_str(&format!("{info}/RECORD,,\n"));
    entries.push(Entry::new(&format!("{info}/RECORD"), record.as_bytes()));
    entries
}

fn init() -> Entry<'static> {
    Entry::new("demo/__init__.py", &b"VALUE = 1\n".repeat(20))
}

/// Writes `bytes` as the demo wheel under `dir/name/`.
fn wheel_at(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name).join("demo-1.0-py3-none-any.whl");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn wheels_with_data_descriptors_that_agree_verify_and_pip_installs_exactly_their_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut wheels = Vec::new();
    for signed in [true, false] {
        let mut entry = init();
        entry.descriptor = Some((signed, None, None, None));
        let bytes = zip_of(&wheel_entries(vec![entry], ""));
        wheels.push(wheel_at(dir.path(), &format!("signed-{signed}"), &bytes));
    }
    for wheel in &wheels {
        let report = verify_wheel(wheel).unwrap();
        assert!(report.is_ok(), "{report}");
    }
    let Some(python) = python() else { return };
    if !pip_available(python) {
        return;
    }
    for wheel in &wheels {
        assert_wheel_installs_as_listed(python, wheel);
    }
}

#[test]
fn a_data_descriptor_whose_sizes_or_crc_disagree_with_the_central_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (descriptor, expected) in [
        (
            (true, None, Some(3), None),
            "has compressed size 3 in its local record",
        ),
        (
            (true, None, None, Some(99)),
            "has size 99 in its local record",
        ),
        (
            (false, Some(1234), None, None),
            "has CRC-32 1234 in its local record",
        ),
    ] {
        let mut entry = init();
        entry.descriptor = Some(descriptor);
        let bytes = zip_of(&wheel_entries(vec![entry], ""));
        // Python's zipfile reads by the central directory and takes it; a reader of local
        // records would take the descriptor's sizes.
        if let Some(python) = python() {
            let path = wheel_at(dir.path(), "zipfile", &bytes);
            zipfile_names(python, &path).unwrap();
        }
        assert_refused(dir.path(), &bytes, expected);
    }
}

#[test]
fn a_stored_entry_with_a_data_descriptor_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Stored bytes holding what looks like a descriptor and the next local header: a reader
    // that searches for the descriptor's signature ends the entry early.
    let mut data = b"VALUE = 1\n".to_vec();
    data.extend_from_slice(&0x0807_4b50u32.to_le_bytes());
    data.extend_from_slice(&[0; 12]);
    data.extend_from_slice(b"PK\x03\x04 hidden");
    let mut entry = Entry::new("demo/__init__.py", &data);
    entry.stored = true;
    entry.descriptor = Some((true, None, None, None));
    let bytes = zip_of(&wheel_entries(vec![entry], ""));
    assert_refused(
        dir.path(),
        &bytes,
        "is stored uncompressed with a data descriptor",
    );
}

#[test]
fn wheel_names_that_differ_only_by_letter_case_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (second, expected) in [
        (
            "demo/__INIT__.py",
            "differs from `demo/__init__.py` only by letter case",
        ),
        ("Demo/other.py", "differs from `demo` only by letter case"),
    ] {
        let bytes = zip_of(&wheel_entries(
            vec![init(), Entry::new(second, b"VALUE = 2\n")],
            "",
        ));
        // On Linux pip installs both; on macOS and Windows one replaces the other.
        if let Some(python) = python() {
            let path = wheel_at(dir.path(), "zipfile", &bytes);
            assert_eq!(zipfile_names(python, &path).unwrap().len(), 5);
        }
        assert_refused(dir.path(), &bytes, expected);
    }
}

#[test]
fn a_record_that_lists_a_file_twice_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let entry = init();
    for hash in [
        release::wheel::record_hash(&entry.data),
        release::wheel::record_hash(b"x"),
    ] {
        let extra = format!("demo/__init__.py,{hash},{}\n", entry.data.len());
        let bytes = zip_of(&wheel_entries(vec![init()], &extra));
        // One reading of the zip; the wheel's RECORD is what is wrong.
        assert!(release::verify::zip_entry_names(&bytes).is_ok());
        let report = verify_wheel(&wheel_at(dir.path(), "twice", &bytes)).unwrap();
        let text = report.to_string();
        assert!(
            text.contains("demo/__init__.py: is listed twice in RECORD"),
            "{text}"
        );
    }
}

#[test]
fn sdist_paths_that_differ_only_by_letter_case_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let entries = sdist_entries(dir.path());
    // `Kernels.toml` beside `kernels.toml`: unpacked on macOS it replaces the manifest.
    for name in [
        format!("{STEM}/Kernels.toml"),
        format!("{}/extra.txt", STEM.to_uppercase()),
    ] {
        let mut tar = entries.clone();
        tar.extend(file(&name, EVIL_MANIFEST));
        let crafted = gzip(&with_end(&tar));
        if let Some(python) = python() {
            if pip_available(python) {
                let path = dir.path().join("pip").join(SDIST_NAME);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &crafted).unwrap();
                pip_untar(python, &path).unwrap();
            }
        }
        assert_sdist_refused(dir.path(), &crafted, "only by letter case");
    }
}

#[test]
fn sdist_hard_links_and_long_links_out_of_the_root_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let entries = sdist_entries(dir.path());
    let mut hard = tar_header(
        format!("{STEM}/python/af3_kernels/linked.py").as_bytes(),
        b'1',
        0,
        0o644,
    );
    hard[157..157 + 11].copy_from_slice(b"../../x.txt");
    checksum(&mut hard);
    let mut tar = entries.clone();
    tar.extend_from_slice(&hard);
    assert_sdist_refused(dir.path(), &gzip(&with_end(&tar)), "is a hard link");

    // A GNU long link name (`K`) reaching out, before a symbolic link.
    let target = format!("{}etc/passwd", "../".repeat(40));
    let mut data = target.as_bytes().to_vec();
    data.push(0);
    let mut tar = entries.clone();
    tar.extend(member(
        tar_header(b"././@LongLink", b'K', data.len() as u64, 0o644),
        &data,
    ));
    tar.extend_from_slice(&tar_header(
        format!("{STEM}/python/af3_kernels/out.py").as_bytes(),
        b'2',
        0,
        0o777,
    ));
    assert_sdist_refused(dir.path(), &gzip(&with_end(&tar)), "long link");
}
