//! What kwheel deletes and what it trusts: `--out` and its leftover siblings are removed only
//! when they hold exactly what kwheel writes there; a merged shard's cubin must be a plain file
//! and the one its key names.

use super::*;

/// A folder at `at` with `thesis.tex` and an `index.json` holding `index`.
fn thesis_folder(at: &Path, index: &[u8]) {
    std::fs::create_dir_all(at).unwrap();
    std::fs::write(at.join("thesis.tex"), b"\\chapter{Five years}\n").unwrap();
    std::fs::write(at.join("index.json"), index).unwrap();
}

fn assert_thesis_intact(at: &Path) {
    assert_eq!(
        std::fs::read(at.join("thesis.tex")).unwrap(),
        b"\\chapter{Five years}\n",
        "{}",
        at.display()
    );
}

/// A copy of the built bundle at `to`, with its first artifact's path (relative).
fn bundle_copy(to: &Path) -> String {
    copy_tree(&built().bundle, to, &[]);
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(to.join("index.json")).unwrap()).unwrap();
    let kernels = index["kernels"].as_object().unwrap();
    let (_, kernel) = kernels.iter().next().unwrap();
    kernel["variants"][0]["artifact"]["path"]
        .as_str()
        .unwrap()
        .to_owned()
}

// ---------------------------------------------------------------------------------------------
// 1. `--out` replaced a folder holding `thesis.tex` and any `index.json` with a `format` key.

#[test]
fn out_keeps_a_folder_whose_index_json_has_a_format_key() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let real_index = std::fs::read(built().bundle.join("index.json")).unwrap();
    let indexes: [&[u8]; 3] = [br#"{"format":"html5"}"#, br#"{"format":1}"#, &real_index];
    for (n, index) in indexes.into_iter().enumerate() {
        let out = dir.path().join(format!("d{n}"));
        thesis_folder(&out, index);
        let message = failed(&build(&out, &built().cache, &[]));
        assert!(
            message.contains(&format!("refusing to replace `{}`", out.display()))
                && message.contains("thesis.tex"),
            "{message}"
        );
        assert_thesis_intact(&out);
        assert_eq!(listing(&out), ["index.json", "thesis.tex"]);
    }
    // merge-bundles --out reads the folder the same way.
    let out = dir.path().join("d2");
    let shard = shard_of(dir.path(), "swiglu");
    let output = merge_bundles(&shard, &out);
    assert!(failed(&output).contains("thesis.tex"), "{}", text(&output));
    assert_thesis_intact(&out);
    // A shard folder with a foreign file is not a shard to replace either.
    std::fs::write(shard.join("cubins").join("thesis.tex"), b"x").unwrap();
    let message = failed(&build(&shard, &built().cache, &["--shard", "1/1"]));
    assert!(message.contains("cubins/thesis.tex"), "{message}");
    assert!(shard.join("cubins/thesis.tex").is_file());
}

#[test]
fn out_keeps_a_real_bundle_that_holds_anything_else() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A file the index does not name, deep inside, or in `sources/`.
    for extra in ["artifacts/notes.txt", "sources/thesis.tex", "thesis.tex"] {
        let out = dir.path().join("extra");
        let _ = std::fs::remove_dir_all(&out);
        bundle_copy(&out);
        std::fs::write(out.join(extra), b"mine\n").unwrap();
        let message = failed(&build(&out, &built().cache, &[]));
        assert!(message.contains(&format!("`{extra}`")), "{message}");
        assert_eq!(std::fs::read(out.join(extra)).unwrap(), b"mine\n");
    }
    // An artifact replaced by a symbolic link, wherever it points.
    let out = dir.path().join("linked");
    let artifact = bundle_copy(&out);
    let elsewhere = dir.path().join("thesis");
    thesis_folder(&elsewhere, b"{}");
    std::fs::remove_file(out.join(&artifact)).unwrap();
    std::os::unix::fs::symlink(elsewhere.join("thesis.tex"), out.join(&artifact)).unwrap();
    let message = failed(&build(&out, &built().cache, &[]));
    assert!(message.contains(&artifact), "{message}");
    assert!(out.join(&artifact).is_symlink());
    assert_thesis_intact(&elsewhere);
    // A bundle that is only what kwheel wrote is still replaced.
    let out = dir.path().join("plain");
    bundle_copy(&out);
    let output = build(&out, &built().cache, &[]);
    assert!(output.status.success(), "{}", text(&output));
}

#[test]
fn leftover_siblings_kwheel_did_not_write_are_left_in_place() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let foreign = [".out.tmp-th3s1s", ".out.old-th3s1s", ".out.tmp-m4rk3d"];
    for name in foreign {
        thesis_folder(&dir.path().join(name), br#"{"format":"html5"}"#);
    }
    // A staging marker does not make `thesis.tex` kwheel's.
    std::fs::write(dir.path().join(".out.tmp-m4rk3d/.kwheel-staging"), b"").unwrap();
    // A killed run's staging folder: the marker and half the artifacts, one still a temporary.
    let killed = dir.path().join(".out.tmp-k1ll3d");
    let artifact = bundle_copy(&killed);
    for name in ["index.json", "kernels.idx"] {
        std::fs::remove_file(killed.join(name)).unwrap();
    }
    std::fs::write(killed.join(".kwheel-staging"), b"").unwrap();
    let artifact = killed.join(artifact);
    let temporary = artifact.with_file_name(format!(
        ".{}.4242.7.tmp",
        artifact.file_name().unwrap().to_string_lossy()
    ));
    std::fs::rename(&artifact, temporary).unwrap();

    let out = dir.path().join("out");
    let output = build(&out, &built().cache, &[]);
    let message = text(&output);
    assert!(output.status.success(), "{message}");
    for name in foreign {
        let leftover = dir.path().join(name);
        assert_thesis_intact(&leftover);
        assert!(
            message.contains(&format!("leaving `{}` in place", leftover.display())),
            "{message}"
        );
    }
    assert!(message.contains("thesis.tex"), "{message}");
    assert!(
        !killed.exists(),
        "the killed run's staging folder is removed"
    );
    assert!(out.join("index.json").is_file());
}

// ---------------------------------------------------------------------------------------------
// 8. merge-bundles checked only sha256 and size: another target's, toolkit's or kernel's cubin
//    merged, and a cubin linked out of its shard was followed.

/// The variant `label` (`cu130/sm_90a`) of `kernel` in a shard file.
fn shard_variant<'v>(
    file: &'v mut serde_json::Value,
    kernel: &str,
    label: &str,
) -> &'v mut serde_json::Value {
    let (cuda, arch) = label.split_once('/').unwrap();
    file["index"]["kernels"][kernel]["variants"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|variant| variant["cuda"] == cuda && variant["arch"] == arch)
        .unwrap_or_else(|| panic!("no {kernel} {label}"))
}

#[test]
fn merge_refuses_a_cubin_of_another_target_toolkit_or_kernel() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let shard = shard_of(dir.path(), "swiglu,sigmoid_gate");
    let out = dir.path().join("merged");
    let output = merge_bundles(&shard, &out);
    assert!(output.status.success(), "{}", text(&output));
    // (kernel, variant, whose cubin it is given, what the refusal says)
    let cases = [
        (
            "swiglu",
            "cu130/sm_90a",
            ("swiglu", "cu129/sm_90a"),
            "built by CUDA 12.9",
        ),
        (
            "swiglu",
            "cu129/sm_90a",
            ("swiglu", "cu129/sm_100a"),
            "sm_100",
        ),
        (
            "swiglu",
            "cu130/sm_100a",
            ("swiglu", "cu130/sm_100f"),
            "family",
        ),
        (
            "swiglu",
            "cu130/sm_90a",
            ("sigmoid_gate", "cu130/sm_90a"),
            "no kernel entry `swiglu`",
        ),
    ];
    for (kernel, label, (other_kernel, other_label), says) in cases {
        let edited = dir.path().join("edited");
        let _ = std::fs::remove_dir_all(&edited);
        copy_tree(&shard, &edited, &[]);
        let path = edited.join("shard.json");
        let mut file: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let artifact = shard_variant(&mut file, other_kernel, other_label)["artifact"].clone();
        shard_variant(&mut file, kernel, label)["artifact"] = artifact;
        std::fs::write(&path, serde_json::to_vec_pretty(&file).unwrap()).unwrap();
        let out = dir.path().join("refused");
        let message = failed(&merge_bundles(&edited, &out));
        assert!(
            message.contains(&format!("`{kernel}` ({label})"))
                && message.contains(&edited.display().to_string())
                && message.contains("is not the one its key names")
                && message.contains(says),
            "{kernel} {label} given {other_kernel} {other_label}: {message}"
        );
        assert!(!out.exists());
    }
}

#[test]
fn merge_refuses_a_cubin_that_is_a_symbolic_link() {
    if !have_toolchains() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let shard = shard_of(dir.path(), "swiglu");
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(shard.join("shard.json")).unwrap()).unwrap();
    let digest = file["index"]["kernels"]["swiglu"]["variants"][0]["artifact"]["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let relative = format!("cubins/{}/{digest}.cubin", &digest[..2]);
    // The same bytes, outside the shard and inside it: a link is refused wherever it points.
    let outside = dir.path().join("outside.cubin");
    std::fs::copy(shard.join(&relative), &outside).unwrap();
    let inside = shard.join("cubins").join("copy.cubin");
    for target in [outside, inside.clone()] {
        let edited = dir.path().join("edited");
        let _ = std::fs::remove_dir_all(&edited);
        copy_tree(&shard, &edited, &[]);
        std::fs::copy(shard.join(&relative), edited.join("cubins/copy.cubin")).unwrap();
        let target = if target == inside {
            edited.join("cubins/copy.cubin")
        } else {
            target
        };
        std::fs::remove_file(edited.join(&relative)).unwrap();
        std::os::unix::fs::symlink(&target, edited.join(&relative)).unwrap();
        let out = dir.path().join("refused");
        let message = failed(&merge_bundles(&edited, &out));
        assert!(
            message.contains("symbolic link") && message.contains(&relative),
            "{message}"
        );
        assert!(!out.exists());
    }
}
