//! The bytes checked are the bytes used: a warm pack's file swapped for a link to a file
//! outside the pack after `dev build-wheel --add-pack` verified the pack, and before the
//! wheel's files are taken, changes nothing of what the wheel ships (the test hook of
//! `prebuilt::jit::pack::testing` runs at that point). `jit import`'s side is
//! `prebuilt/src/jit/pack.rs`'s tests.

use std::path::Path;

use prebuilt::jit::pack::testing::{after_check, clear_after_check, fixture_pack};
use prebuilt::jit::pack::{BUNDLE_PACKS_DIR, PACK_FILE};
use prebuilt::key::sha256_hex;
use release::wheel::Contents;

/// The sha256 of what the wheel writer would put in the wheel for `contents`: its bytes, or
/// the file it names, read when the wheel is written (after the check).
fn shipped(contents: &Contents) -> String {
    let bytes = match contents {
        Contents::Bytes(bytes) => bytes.clone(),
        Contents::Disk(path) => std::fs::read(path).unwrap(),
    };
    sha256_hex(&bytes)
}

fn swap_for_a_link_out(dir: &Path, relative: &str) {
    let outside = dir.join("id_rsa");
    std::fs::write(&outside, b"-----BEGIN OPENSSH PRIVATE KEY-----\n").unwrap();
    let relative = relative.to_owned();
    after_check(move |pack| {
        let file = pack.join(&relative);
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(&outside, &file).unwrap();
    });
}

#[test]
fn add_pack_ships_the_verified_bytes_when_a_file_is_swapped_for_a_link_after_the_check() {
    for swapped in ["artifact", PACK_FILE] {
        let dir = tempfile::tempdir().unwrap();
        let fixture = fixture_pack(dir.path());
        let (artifact, stored) = fixture.artifact.clone();
        let pack_json = std::fs::read(fixture.pack.join(PACK_FILE)).unwrap();
        let relative = if swapped == "artifact" {
            artifact.as_str()
        } else {
            PACK_FILE
        };
        swap_for_a_link_out(dir.path(), relative);
        let root = "af3_kernels/_prebuilt";
        let files = release::wheel::warm_pack_files(
            &fixture.bundle,
            root,
            std::slice::from_ref(&fixture.pack),
        );
        clear_after_check();
        let files = files.unwrap_or_else(|error| panic!("{}", prebuilt::error_chain(&error)));
        let id = &sha256_hex(&pack_json)[..16];
        let prefix = format!("{root}/{BUNDLE_PACKS_DIR}/{id}");
        let mut got: Vec<(String, String)> = files
            .iter()
            .map(|file| (file.path.clone(), shipped(&file.contents)))
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                (format!("{prefix}/{artifact}"), sha256_hex(&stored)),
                (format!("{prefix}/{PACK_FILE}"), sha256_hex(&pack_json)),
            ],
            "{swapped}: the wheel ships what was verified, not the link's target"
        );
    }
}
