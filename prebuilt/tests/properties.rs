//! Property tests of the round trips the runtime relies on: a key recomputed from the inputs an
//! index stores is the key the bundler computed, and fields are length-prefixed (no two
//! splittings of the same text key alike); a torch pin matches the versions it names and
//! survives its own `Requires-Dist`. Cases are bounded (64 each) to keep CI time flat.

use std::collections::BTreeMap;

use prebuilt::index::KernelInputs;
use prebuilt::key::{KernelKey, KeyInputs};
use prebuilt::select::TorchPin;
use proptest::prelude::*;
use testkit::fixtures::{arch, build, compiler};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 64,
        ..ProptestConfig::default()
    }
}

fn key_of(kernel: &str, inputs: &KernelInputs, target: &str, torch: &str) -> KernelKey {
    KernelKey::compute(&KeyInputs {
        kernel,
        inputs,
        arch: arch(target),
        cuda: build("cu130"),
        torch,
        compiler: &compiler("nvcc", "13.0.88"),
    })
}

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_<>:,.=/ -]{0,12}"
}

prop_compose! {
    fn kernel_inputs()(
        entries in prop::collection::vec(text(), 1..4),
        files in prop::collection::btree_map("[a-z]{1,6}/[a-z]{1,6}\\.cuh?", "[0-9a-f]{64}", 0..4),
        defines in prop::collection::btree_map("[A-Z_]{1,8}", text(), 0..3),
        flags in prop::collection::vec(text(), 0..3),
        cxx_std in prop::sample::select(vec!["c++17", "c++20"]),
    ) -> KernelInputs {
        KernelInputs {
            entries,
            files,
            defines,
            flags,
            cxx_std: cxx_std.to_owned(),
            ..KernelInputs::default()
        }
    }
}

proptest! {
    #![proptest_config(config())]

    /// What the JIT does: read the inputs back from `index.json` and recompute the key.
    #[test]
    fn a_key_recomputed_from_stored_inputs_is_the_same_key(
        inputs in kernel_inputs(),
        kernel in "[a-z_]{1,12}",
        target in prop::sample::select(vec!["sm_90a", "sm_100a", "sm_100f", "compute_90"]),
    ) {
        let stored: KernelInputs =
            serde_json::from_str(&serde_json::to_string(&inputs).unwrap()).unwrap();
        let key = key_of(&kernel, &inputs, target, "2.13.*");
        prop_assert_eq!(&key, &key_of(&kernel, &stored, target, "2.13.*"));
        prop_assert_eq!(key.0.len(), 64);
        prop_assert!(key.0.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    }

    /// Fields are length-prefixed: moving text from one entry (or define) to the next changes
    /// the key, as does a different torch pin.
    #[test]
    fn splitting_the_same_text_differently_gives_another_key(
        text in "[a-z]{2,16}",
        split in 1usize..16,
        other in 1usize..16,
    ) {
        let split = split.min(text.len() - 1);
        let other = other.min(text.len() - 1);
        prop_assume!(split != other);
        let entries = |at: usize| KernelInputs {
            entries: vec![text[..at].to_owned(), text[at..].to_owned()],
            ..KernelInputs::default()
        };
        let defines = |at: usize| KernelInputs {
            entries: vec!["k".to_owned()],
            defines: BTreeMap::from([(text[..at].to_owned(), text[at..].to_owned())]),
            ..KernelInputs::default()
        };
        prop_assert_ne!(
            key_of("k", &entries(split), "sm_90a", "2.13.*"),
            key_of("k", &entries(other), "sm_90a", "2.13.*")
        );
        prop_assert_ne!(
            key_of("k", &defines(split), "sm_90a", "2.13.*"),
            key_of("k", &defines(other), "sm_90a", "2.13.*")
        );
        prop_assert_ne!(
            key_of("k", &entries(split), "sm_90a", "2.13.*"),
            key_of("k", &entries(split), "sm_90a", "2.12.*")
        );
    }

    /// `2.13.*` takes every 2.13 release and local build, and no other minor version.
    #[test]
    fn a_wildcard_pin_matches_exactly_its_minor_versions(
        major in 1u32..4,
        minor in 0u32..30,
        patch in 0u32..20,
        local in prop::sample::select(vec!["", "+cu129", "+cu130", "+cpu"]),
        other in 0u32..30,
    ) {
        let pin = TorchPin::parse(&format!("{major}.{minor}.*")).unwrap();
        let release = format!("{major}.{minor}.{patch}{local}");
        let short = format!("{major}.{minor}");
        prop_assert!(pin.matches(&release), "{}", release);
        prop_assert!(pin.matches(&short), "{}", short);
        prop_assume!(other != minor);
        let another = format!("{major}.{other}.{patch}{local}");
        prop_assert!(!pin.matches(&another), "{}", another);
    }

    /// The wheel's `Requires-Dist` (`torch>=2.9,<2.14`) parses back to the same pin, which
    /// answers every version alike.
    #[test]
    fn a_pin_survives_its_requirement(
        specifiers in prop::collection::vec(
            (
                prop::sample::select(vec!["==", ">=", "<=", ">", "<", "~=", "!="]),
                1u32..4,
                0u32..20,
            ),
            1..3,
        ),
        versions in prop::collection::vec((1u32..4, 0u32..20, 0u32..5), 1..6),
    ) {
        let text = specifiers
            .iter()
            .map(|(op, major, minor)| format!("{op}{major}.{minor}"))
            .collect::<Vec<_>>()
            .join(",");
        let pin = TorchPin::parse(&text).unwrap();
        let requirement = pin.requirement().unwrap();
        let again = TorchPin::parse(requirement.strip_prefix("torch").unwrap()).unwrap();
        prop_assert_eq!(&again, &pin);
        for (major, minor, patch) in versions {
            let version = format!("{major}.{minor}.{patch}");
            prop_assert_eq!(pin.matches(&version), again.matches(&version));
        }
    }
}

#[test]
fn any_pin_is_star_and_matches_everything() {
    let pin = TorchPin::parse("*").unwrap();
    assert_eq!(pin.requirement().as_deref(), Some("torch"));
    assert!(pin.matches("2.13.0+cu130") && pin.matches("not a version"));
}

#[test]
fn no_torch_requires_none_and_matches_everything() {
    let pin = TorchPin::parse("none").unwrap();
    assert_eq!(pin.requirement(), None);
    assert!(!pin.uses_torch() && TorchPin::parse("*").unwrap().uses_torch());
    assert!(pin.matches("2.13.0+cu130") && pin.matches("not a version"));
}
