//! `wheel verify` checks the warm packs a wheel ships under `_prebuilt/packs/` like every
//! other artifact: each pack verified against the wheel's bundle, in the folder its
//! `pack.json` names, and no file there that the pack does not list.

use std::collections::BTreeMap;

use prebuilt::jit::pack::{inputs_digest, PackIndex, PackKernel, PACK_FORMAT};

use super::*;

const PACKS: &str = "af3_kernels/_prebuilt/packs";

/// A warm pack made from one variant of the bundle at `bundle` that NVRTC or nvcc compiled
/// (what a JIT cache would hold for it): its `pack.json`, and its files as they ship, by path
/// inside the pack.
fn pack_of(bundle: &Path) -> (String, Vec<(String, Vec<u8>)>) {
    let bundle = prebuilt::Bundle::open(bundle).unwrap();
    let index = bundle.index();
    let (kernel, record, variant) = index
        .kernels
        .iter()
        .flat_map(|(kernel, record)| record.variants.iter().map(move |v| (kernel, record, v)))
        .find(|(_, _, variant)| matches!(variant.compiler.kind.as_str(), "nvrtc" | "nvcc"))
        .expect("a variant NVRTC or nvcc compiled");
    let cubin = bundle.read_artifact(kernel, variant).unwrap();
    let frame = bundler::compress::compress_one(&cubin, None, 3);
    let mut entry = variant.clone();
    entry.artifact.path = prebuilt::bundle::artifact_path(&entry.artifact.digest);
    entry.artifact.stored_size = frame.len() as u64;
    entry.artifact.dictionary = None;
    let pack = PackIndex {
        format: PACK_FORMAT,
        package: index.package.clone(),
        torch: index.torch.clone(),
        kernels: BTreeMap::from([(
            kernel.clone(),
            PackKernel {
                inputs: inputs_digest(&record.inputs),
                variants: vec![entry.clone()],
            },
        )]),
    };
    let json = serde_json::to_vec_pretty(&pack).unwrap();
    let id = prebuilt::key::sha256_hex(&json)[..16].to_owned();
    (
        id,
        vec![
            ("pack.json".to_owned(), json),
            (entry.artifact.path.clone(), frame),
        ],
    )
}

/// The default library's wheel with `extra` files added, its RECORD matching, at `dir`.
fn wheel_with(shared: &Shared, dir: &Path, extra: Vec<(String, Vec<u8>)>) -> PathBuf {
    let path = dir.join(shared.built.path.file_name().unwrap());
    let record = format!("{DIST_INFO}/RECORD");
    let mut files: Vec<(String, Vec<u8>)> = extra;
    files.extend(
        entries(&shared.bytes)
            .into_iter()
            .filter(|(name, _)| *name != record),
    );
    write_with_record(&path, &files, &record);
    path
}

#[test]
fn a_shipped_pack_verifies_and_a_file_it_does_not_list_is_refused() {
    let Some(shared) = shared() else { return };
    let (id, pack) = pack_of(&shared.bundle);
    let shipped = |files: &[(String, Vec<u8>)], folder: &str| -> Vec<(String, Vec<u8>)> {
        files
            .iter()
            .map(|(name, bytes)| (format!("{PACKS}/{folder}/{name}"), bytes.clone()))
            .collect()
    };

    // As `--add-pack` ships it: verified, nothing to say.
    let root = scratch("packs-shipped");
    let report = verify_wheel(&wheel_with(shared, &root, shipped(&pack, &id))).unwrap();
    assert!(report.is_ok(), "{report}");

    // A file beside it that the pack does not list, and one outside any pack's folder.
    let root = scratch("packs-unlisted");
    let mut files = shipped(&pack, &id);
    files.push((format!("{PACKS}/{id}/id_rsa"), b"secret".to_vec()));
    files.push((format!("{PACKS}/loose.cubin.zst"), b"loose".to_vec()));
    let report = verify_wheel(&wheel_with(shared, &root, files)).unwrap();
    assert_eq!(
        problems_about(&report, &format!("{PACKS}/{id}/id_rsa")),
        [format!(
            "is not vouched for by `{PACKS}/{id}/pack.json`: a pack ships its `pack.json` and \
             the cubins it lists, nothing else"
        )],
        "{report}"
    );
    assert_eq!(
        problems_about(&report, &format!("{PACKS}/loose.cubin.zst")),
        [format!(
            "lies in `{PACKS}/` outside a pack's folder: a wheel ships a warm pack as \
             `{PACKS}/<id>/pack.json` and the cubins it lists"
        )],
        "{report}"
    );
    assert_eq!(report.problems.len(), 2, "{report}");

    // A pack in another folder than its sha256 names; a folder with no `pack.json`.
    let root = scratch("packs-misplaced");
    let mut files = shipped(&pack, "0123456789abcdef");
    files.push((
        format!("{PACKS}/fedcba9876543210/x.cubin.zst"),
        b"x".to_vec(),
    ));
    let report = verify_wheel(&wheel_with(shared, &root, files)).unwrap();
    assert_eq!(
        problems_about(&report, &format!("{PACKS}/0123456789abcdef/pack.json")),
        [format!(
            "lies in the folder `0123456789abcdef`, but its sha256 gives `{id}`: the loader \
             and `--add-pack` name a pack's folder by it"
        )],
        "{report}"
    );
    assert_eq!(
        problems_about(&report, &format!("{PACKS}/fedcba9876543210/pack.json")),
        ["is missing, but files of its pack folder ship: nothing vouches for them"],
        "{report}"
    );
    assert_eq!(
        problems_about(&report, &format!("{PACKS}/fedcba9876543210/x.cubin.zst")).len(),
        1,
        "{report}"
    );

    // A cubin that is not the one its entry names.
    let root = scratch("packs-tampered");
    let mut tampered = pack.clone();
    tampered[1].1 = bundler::compress::compress_one(b"not the cubin", None, 3);
    let report = verify_wheel(&wheel_with(shared, &root, shipped(&tampered, &id))).unwrap();
    let messages = problems_about(&report, &format!("{PACKS}/{id}/pack.json"));
    assert_eq!(messages.len(), 1, "{report}");
    assert!(
        messages[0].starts_with("does not verify against the bundle: "),
        "{report}"
    );
}
