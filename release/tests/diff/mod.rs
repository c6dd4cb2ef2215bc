//! `release diff` between two builds of the embedded library: one edited header, one
//! `-maxrregcount` change.

use std::path::{Path, PathBuf};

use release::diff::{diff_releases, Breaches as _, Change, DiffPolicy, Release};

use super::{chain, copy_library, scratch, toolchains};

/// What differs from one machine or run to the next in the outputs snapshotted here, in the
/// way uv's tests filter theirs: every sha256 (a key or a digest, in full or as its first 12
/// digits), the host compiler an nvcc build records (`nvcc 13.0.88, host gcc (Debian …)`,
/// which its key holds too), and the scratch folder, which each test replaces with
/// `<scratch>` first.
fn snapshot_filters() -> Vec<(&'static str, &'static str)> {
    vec![
        (r"\b[0-9a-f]{64}\b", "[sha256]"),
        (r"\b[0-9a-f]{12}\b", "[key12]"),
        (r#", host [^"|]+"#, ", host [host compiler]"),
    ]
}

fn stable(text: &str, root: &Path) -> String {
    text.replace(&root.display().to_string(), "<scratch>")
}

/// The kernels both builds hold: the edited header reaches `swiglu`, the flag is on
/// `masked_softmax_pair_bias`, and `layernorm_bf16` sees neither.
const KERNELS: [&str; 3] = ["layernorm_bf16", "masked_softmax_pair_bias", "swiglu"];

fn bundle(manifest: &Path, out: &Path, cache: &Path) {
    bundler::bundle_kernels(&bundler::BundleOptions {
        manifest: manifest.to_owned(),
        out: out.to_owned(),
        cache_dir: cache.to_owned(),
        jobs: 2,
        only: KERNELS.iter().map(|k| (*k).to_owned()).collect(),
        require: false,
        torch: None,
        progress: None,
        toolchains: toolchains(),
        farm: None,
    })
    .unwrap_or_else(|error| panic!("bundle {}: {}", manifest.display(), chain(&error)));
}

/// Two bundles: the library as it is (`old`), and with `edit` applied to the manifest of a
/// second copy (`new`), built with one cache: the two bundles and the scratch folder.
fn builds_with(name: &str, edit: impl FnOnce(&Path)) -> Option<(PathBuf, PathBuf, PathBuf)> {
    toolchains()?;
    let root = scratch(name);
    let cache = root.join("cache");
    let old = copy_library(&root.join("old"));
    let new = copy_library(&root.join("new"));
    edit(&new);
    bundle(&old, &root.join("old-bundle"), &cache);
    bundle(&new, &root.join("new-bundle"), &cache);
    Some((root.join("old-bundle"), root.join("new-bundle"), root))
}

/// `path` with `from` replaced by `to`, which must be there.
fn replace_in(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    let edited = text.replace(from, to);
    assert_ne!(text, edited, "the edit of {} applies", path.display());
    std::fs::write(path, edited).unwrap();
}

/// Two bundles: the library as it is, and with `activations.cuh` edited and
/// `-maxrregcount=24` on one kernel.
fn two_builds(name: &str) -> Option<(PathBuf, PathBuf, PathBuf)> {
    builds_with(name, |new| {
        replace_in(
            &new.parent().unwrap().join("include/af3/activations.cuh"),
            "return x * sigmoid(x); }",
            "return x * sigmoid(x) + 0.0f * x; }",
        );
        replace_in(
            new,
            "entries = [\"masked_softmax_pair_bias\"]\n",
            "entries = [\"masked_softmax_pair_bias\"]\nflags = [\"-maxrregcount=24\"]\n",
        );
    })
}

/// `release diff OLD NEW` of two bundle folders, without a fleet.
fn diff_of(old: &Path, new: &Path) -> release::diff::ReleaseDiff {
    let (old, new) = (Release::open(old).unwrap(), Release::open(new).unwrap());
    diff_releases(&old, &new, None).unwrap()
}

/// The kernels with a changed row.
fn changed_kernels(diff: &release::diff::ReleaseDiff) -> std::collections::BTreeSet<&str> {
    diff.changed().map(|row| row.kernel.as_str()).collect()
}

#[test]
fn release_diff_shows_exactly_the_edited_kernels_with_why_and_registers() {
    let Some((old, new, root)) = two_builds("diff") else {
        return;
    };
    let diff = diff_of(&old, &new);
    let changed = changed_kernels(&diff);
    assert_eq!(
        changed,
        ["masked_softmax_pair_bias", "swiglu"].into(),
        "{diff}"
    );
    for row in &diff.rows {
        match row.kernel.as_str() {
            "layernorm_bf16" => assert_eq!(row.change, Change::Unchanged, "{diff}"),
            "swiglu" => {
                assert_eq!(row.change, Change::Rebuilt, "{diff}");
                assert_eq!(row.why.len(), 1, "{:?}", row.why);
                assert!(
                    row.why[0].starts_with("file include/af3/activations.cuh: content changed"),
                    "{:?}",
                    row.why
                );
            }
            "masked_softmax_pair_bias" => {
                assert_eq!(row.change, Change::Rebuilt, "{diff}");
                assert_eq!(row.why, ["flags: [] → [\"-maxrregcount=24\"]"], "{diff}");
            }
            other => panic!("unexpected kernel {other}"),
        }
    }
    // The flag moves the register count of the Hopper cubins, and the rows say by how much.
    let row = diff
        .rows
        .iter()
        .find(|row| row.kernel == "masked_softmax_pair_bias" && row.target == "cu130/sm_90a")
        .unwrap();
    let (before, after) = (
        row.old.as_ref().unwrap().entries["masked_softmax_pair_bias"]
            .registers
            .unwrap(),
        row.new.as_ref().unwrap().entries["masked_softmax_pair_bias"]
            .registers
            .unwrap(),
    );
    assert_ne!(before, after, "{diff}");
    assert_eq!(
        row.register_increase,
        Some(i64::from(after) - i64::from(before))
    );
    assert!(
        row.resource_changes
            .iter()
            .any(|line| line.starts_with(&format!(
                "masked_softmax_pair_bias: registers {before} → {after}"
            ))),
        "{:?}",
        row.resource_changes
    );

    // The Markdown, with the scratch paths made stable: one line per changed target.
    let text = diff
        .to_string()
        .replace(&root.display().to_string(), "<scratch>");
    let first: Vec<&str> = text.lines().take(3).collect();
    assert_eq!(
        first,
        [
            "# <scratch>/old-bundle → <scratch>/new-bundle",
            "",
            "24 kernel targets: 0 added, 0 removed, 16 rebuilt, 8 unchanged, 0 skipped"
        ],
        "{text}"
    );
    // 16 kernel rows, and the extension module on both CPUs: its device code includes the
    // edited `activations.cuh` too.
    assert_eq!(
        text.lines().filter(|line| line.starts_with("| `")).count(),
        16 + 2,
        "{text}"
    );
    for cpu in ["x86_64", "aarch64"] {
        assert!(
            text.contains(&format!(
                "| `_C` | cu130/{cpu} | rebuilt | include/af3/activations.cuh changed |"
            )),
            "{text}"
        );
    }

    // A policy on the same diff: the register jump breaks a limit under it, and passes one
    // over it.
    let increase = u32::try_from(row.register_increase.unwrap().max(0)).unwrap();
    let tight = DiffPolicy {
        max_register_increase: Some(increase.saturating_sub(1)),
        ..DiffPolicy::default()
    };
    let breaches = tight.breaches(&diff);
    assert!(
        breaches
            .iter()
            .any(|b| b.starts_with("`masked_softmax_pair_bias` cu130/sm_90a: registers +")),
        "{breaches:?}"
    );
    let loose = DiffPolicy {
        max_register_increase: Some(increase),
        allow_removed: Some(false),
        allow_abi_break: Some(false),
        ..DiffPolicy::default()
    };
    assert_eq!(loose.breaches(&diff), Vec::<String>::new());

    // The whole Markdown and JSON, as `kwheel release diff` prints them.
    let json = stable(&serde_json::to_string_pretty(&diff).unwrap(), &root);
    insta::with_settings!({filters => snapshot_filters()}, {
        insta::assert_snapshot!("release_diff_markdown", text);
        insta::assert_snapshot!("release_diff_json", json);
    });
}

/// The new build's manifest (under `root`, as [`builds_with`] lays it out) loaded with a
/// `[release]` table of `policy` appended; the file is left as it was read before.
fn with_release_policy(root: &Path, policy: &str) -> bundler::Manifest {
    let path = root.join("new/kernels/kernels.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{text}\n[release]\n{policy}\n")).unwrap();
    let manifest = bundler::Manifest::load(&path).unwrap();
    std::fs::write(&path, text).unwrap();
    manifest
}

/// `release check --against OLD` holds the diff to the manifest's `[release]` policy: a
/// register limit under the jump fails naming the row, one above it passes.
#[test]
fn release_check_against_gates_on_the_manifest_policy() {
    let Some((old, new, root)) = two_builds("diff-gate") else {
        return;
    };
    let with_policy = |limit: u32| {
        with_release_policy(
            &root,
            &format!("max-register-increase = {limit}\nallow-removed = false"),
        )
    };
    let gate = release::check::against_gate(&with_policy(0), &old, &new);
    assert_eq!(gate.status, release::check::GateStatus::Fail, "{gate:?}");
    assert!(
        gate.reason
            .contains("`masked_softmax_pair_bias` cu130/sm_90a: registers +"),
        "{}",
        gate.reason
    );
    assert!(
        gate.reason.contains("over max-register-increase = 0"),
        "{}",
        gate.reason
    );
    assert!(!gate.reason.contains("swiglu"), "{}", gate.reason);
    // The gate as `release check --against OLD` prints it, and its JSON.
    let failed = release::check::Checklist {
        gates: vec![gate.clone()],
        built: Vec::new(),
    };
    insta::with_settings!({filters => snapshot_filters()}, {
        insta::assert_snapshot!("release_check_against_fails", stable(&failed.to_string(), &root));
        insta::assert_snapshot!(
            "release_check_against_fails_json",
            stable(&serde_json::to_string_pretty(&failed).unwrap(), &root)
        );
    });
    let gate = release::check::against_gate(&with_policy(64), &old, &new);
    assert_eq!(gate.status, release::check::GateStatus::Pass, "{gate:?}");
    assert!(
        gate.reason
            .starts_with("16 of 24 kernel targets changed since"),
        "{}",
        gate.reason
    );
    let passed = release::check::Checklist {
        gates: vec![gate],
        built: Vec::new(),
    };
    insta::with_settings!({filters => snapshot_filters()}, {
        insta::assert_snapshot!("release_check_against_passes", stable(&passed.to_string(), &root));
    });
}

/// Two bundles of the library: as it is, and with `swiglu`'s output limit halved (a stricter
/// requirement, nothing else changed).
fn requirement_builds(name: &str) -> Option<(PathBuf, PathBuf, PathBuf)> {
    builds_with(name, |new| {
        replace_in(
            new,
            "{ when = \"rows * (width / 2) <= 2147483647\"",
            "{ when = \"rows * (width / 2) <= 1073741823\"",
        );
    })
}

/// A requirement that changes between two releases is a changed kernel (its key), and `release
/// diff` calls it out on each of its targets, like a register increase; with
/// `allow-requirement-change = false`, `release check --against` fails naming it.
#[test]
fn a_changed_requirement_shows_in_release_diff_and_fails_the_gate_under_the_policy() {
    let Some((old, new, root)) = requirement_builds("diff-requires") else {
        return;
    };
    let diff = diff_of(&old, &new);
    let changed = changed_kernels(&diff);
    assert_eq!(changed, ["swiglu"].into(), "{diff}");
    for row in diff.rows.iter().filter(|row| row.kernel == "swiglu") {
        assert_eq!(row.change, Change::Rebuilt, "{diff}");
        assert_eq!(row.requirement_changes, row.why, "{diff}");
        assert_eq!(
            row.why,
            [
                "requires: new `rows * (width / 2) <= 1073741823` (the number of outputs must fit \
                 the kernel's 32-bit int)",
                "requires: dropped `rows * (width / 2) <= 2147483647` (the number of outputs \
                 must fit the kernel's 32-bit int)",
            ],
            "{diff}"
        );
    }
    let text = diff.to_string();
    let called_out = text
        .lines()
        .filter(|line| line.starts_with("| `swiglu`") && line.contains("**requirements changed**"))
        .count();
    assert_eq!(called_out, 8, "{text}");
    assert_eq!(DiffPolicy::default().breaches(&diff), Vec::<String>::new());

    let with_policy =
        |allow: bool| with_release_policy(&root, &format!("allow-requirement-change = {allow}"));
    let gate = release::check::against_gate(&with_policy(false), &old, &new);
    assert_eq!(gate.status, release::check::GateStatus::Fail, "{gate:?}");
    assert!(
        gate.reason.contains(
            "`swiglu` cu130/sm_90a: the kernel's requirements changed (requires: new \
             `rows * (width / 2) <= 1073741823`"
        ) && gate.reason.contains("and allow-requirement-change = false"),
        "{}",
        gate.reason
    );
    assert!(!gate.reason.contains("layernorm_bf16"), "{}", gate.reason);
    let gate = release::check::against_gate(&with_policy(true), &old, &new);
    assert_eq!(gate.status, release::check::GateStatus::Pass, "{gate:?}");
}

/// A wheel is read through `wheel verify`, then its `_prebuilt/`: the default library's wheel
/// against the bundle it was built from has no change; what is not a release is refused.
#[test]
fn release_diff_reads_wheels_and_refuses_what_is_not_a_release() {
    let Some(shared) = super::shared() else {
        return;
    };
    let diff = diff_releases(
        &Release::open(&shared.built.path).unwrap(),
        &Release::open(&shared.bundle).unwrap(),
        None,
    )
    .unwrap();
    assert_eq!(diff.changed().count(), 0, "{diff}");
    assert_eq!(diff.rows.len(), 50, "{diff}");
    assert!(
        diff.to_string().contains("No kernel target changed."),
        "{diff}"
    );

    let root = scratch("diff-refusals");
    assert!(
        Release::open(&root).is_err(),
        "a folder that is not a bundle"
    );
    let not_a_wheel = root.join("not.whl");
    std::fs::write(&not_a_wheel, b"PK\x03\x04 nothing").unwrap();
    let error = chain(&Release::open(&not_a_wheel).err().unwrap());
    assert!(error.contains("not.whl"), "{error}");
}
