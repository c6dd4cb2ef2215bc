//! The kernel key: one sha256 naming everything that can change a cubin.
//!
//! The bundler keys its build cache with it, the index records it, and the loader's JIT
//! fallback recomputes it from the shipped sources, so all three agree by construction.
//!
//! The key is sha256 over length-prefixed fields (an 8-byte little-endian length before
//! every byte string, a count before every list), in this order:
//!
//! | input | why it is in the key |
//! | --- | --- |
//! | [`KEY_FORMAT`] | bumping it invalidates every cache entry when the key's definition changes |
//! | kernel name | two kernels with the same sources are still two cache entries |
//! | entry points | name expressions instantiate templates, and every entry is validated |
//! | include graph: (stable path, sha256) per file | any edit to a source or header changes the code |
//! | defines (constants included), with the target arch's `targets` defines merged in | they change the preprocessed source |
//! | flags: `flags`, then those of the compiler used (`nvcc-flags` or `nvrtc-flags`), each with the target arch's after the kernel's | they change code generation |
//! | C++ standard | it changes parsing and overloads |
//! | arch | the cubin's machine code |
//! | CUDA build | the toolkit's headers and the driver it needs |
//! | torch build | the torch pin the variant is released for |
//! | compiler and its exact version: for nvcc also the host compiler (`gcc --version`), for the `nvcc+ptxas` route also ptxas's version | nvcc and NVRTC, or two patch releases, emit different code; nvcc preprocesses device code with the host compiler and its libstdc++/glibc headers; the assembler writes the machine code |
//! | preamble, only when there is one (or requirements are) | it is compiled with the source (see below) |
//! | requirements (`inputs`, then each condition and its reason), only when there are some | a kernel that accepts other shapes is another kernel: a release that changes one is told apart |
//! | computed inputs (`template`, each constant's name and expression, each struct and its fields), only when there are some | they are compiled into the cubin, and their values ship with it |
//!
//! Per-arch values are merged before hashing ([`KernelInputs::for_arch`]): a target is keyed
//! by what it compiles with, so an arch without a `targets` table keeps the key it had. The
//! preamble came after format 2 and is hashed last, only when it is not empty: a kernel
//! without one keeps its format 2 key, and since every field before it is length-prefixed, a
//! key with a preamble cannot equal one without. Requirements came later still and follow the
//! same rule: a kernel that declares some hashes its preamble (empty or not, length-prefixed)
//! and then them, so the stream of a kernel with requirements never ends where one without
//! does and no two of the three shapes can be equal. Computed inputs came last: a kernel that
//! declares some hashes its preamble and requirements (each length- or count-prefixed, empty or
//! not) and then them, so again its stream never ends where another shape's does. An input added later that is not empty
//! for every kernel needs [`KEY_FORMAT`] bumped.
//!
//! Paths are stable paths (relative to the manifest's directory or to an include dir), never
//! absolute, and no timestamp is hashed: moving a checkout or touching a file keeps the key.

use sha2::{Digest, Sha256};

use crate::index::{CompilerRecord, KernelInputs};
use crate::{Arch, CudaBuild};

/// Version of the key's definition. Bump it whenever an input is added, removed or encoded
/// differently. (Per-arch values, the preamble and requirements did not bump it: a kernel that
/// uses none hashes exactly what format 2 hashed, see the module docs.)
pub const KEY_FORMAT: u64 = 2;

/// Everything a variant's key is computed from.
#[derive(Clone, Copy, Debug)]
pub struct KeyInputs<'a> {
    /// The kernel's name in the manifest.
    pub kernel: &'a str,
    /// The target-independent inputs (entries, include graph, defines, flags, C++ standard).
    pub inputs: &'a KernelInputs,
    /// The target architecture.
    pub arch: Arch,
    /// The CUDA build.
    pub cuda: CudaBuild,
    /// The torch pin.
    pub torch: &'a str,
    /// The compiler and its exact version.
    pub compiler: &'a CompilerRecord,
}

/// A variant's key: lowercase hex sha256.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KernelKey(pub String);

impl std::fmt::Display for KernelKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The one way keys are hashed: length-prefixed byte strings and counts after a format
/// version (the kernel key here, the module key in [`crate::module`]).
pub(crate) struct KeyHasher(Sha256);

impl KeyHasher {
    /// A hasher that has hashed `format` first.
    pub(crate) fn new(format: u64) -> KeyHasher {
        let mut hasher = KeyHasher(Sha256::new());
        hasher.0.update(format.to_le_bytes());
        hasher
    }

    pub(crate) fn bytes(&mut self, bytes: &[u8]) {
        self.0.update((bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
    }

    pub(crate) fn count(&mut self, count: usize) {
        self.0.update((count as u64).to_le_bytes());
    }

    /// A list of strings: its count, then each.
    pub(crate) fn strings(&mut self, strings: &[String]) {
        self.count(strings.len());
        for string in strings {
            self.bytes(string.as_bytes());
        }
    }

    /// A map of strings (files and their digests, defines and their values): its count,
    /// then each key and value.
    pub(crate) fn pairs(&mut self, pairs: &std::collections::BTreeMap<String, String>) {
        self.count(pairs.len());
        for (key, value) in pairs {
            self.bytes(key.as_bytes());
            self.bytes(value.as_bytes());
        }
    }

    /// The key: lowercase hex sha256.
    pub(crate) fn finish(self) -> String {
        hex::encode(self.0.finalize())
    }
}

impl KernelKey {
    /// Computes the key of one variant.
    pub fn compute(key: &KeyInputs<'_>) -> KernelKey {
        let inputs = key.inputs.for_arch(key.arch);
        let mut hasher = KeyHasher::new(KEY_FORMAT);
        hasher.bytes(key.kernel.as_bytes());
        hasher.strings(&inputs.entries);
        hasher.pairs(&inputs.files);
        hasher.pairs(&inputs.defines);
        hasher.strings(&inputs.flags_for(key.compiler));
        hasher.bytes(inputs.cxx_std.as_bytes());
        hasher.bytes(key.arch.to_string().as_bytes());
        hasher.bytes(key.cuda.to_string().as_bytes());
        hasher.bytes(key.torch.as_bytes());
        hasher.bytes(key.compiler.kind.as_bytes());
        hasher.bytes(key.compiler.version.as_bytes());
        // Optional, so that a kernel without them keeps its format 2 key (module docs).
        let requires = &inputs.requires;
        if !inputs.preamble.is_empty() || !requires.is_empty() || !inputs.computed.is_empty() {
            hasher.bytes(inputs.preamble.as_bytes());
        }
        let computed = &inputs.computed;
        if !requires.is_empty() || !computed.is_empty() {
            hasher.strings(&requires.inputs);
            hasher.count(requires.rules.len());
            for rule in &requires.rules {
                hasher.bytes(rule.when.as_bytes());
                match &rule.reason {
                    None => hasher.count(0),
                    Some(reason) => {
                        hasher.count(1);
                        hasher.bytes(reason.as_bytes());
                    }
                }
            }
        }
        if !computed.is_empty() {
            hasher.bytes(computed.template.as_bytes());
            hasher.pairs(&computed.constants);
            hasher.count(computed.structs.len());
            for (name, fields) in &computed.structs {
                hasher.bytes(name.as_bytes());
                hasher.strings(fields);
            }
        }
        KernelKey(hasher.finish())
    }
}

/// Lowercase hex sha256 of some bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::index::TargetInputs;

    fn inputs() -> KernelInputs {
        KernelInputs {
            entries: vec!["layernorm_bf16".into()],
            files: BTreeMap::from([
                ("include/af3/common.cuh".into(), sha256_hex(b"common")),
                ("layernorm/layernorm.cu".into(), sha256_hex(b"layernorm")),
            ]),
            defines: BTreeMap::from([("BLOCK_SIZE".into(), "256".into())]),
            flags: vec![],
            nvcc_flags: vec![],
            nvrtc_flags: vec![],
            cxx_std: "c++17".into(),
            ..KernelInputs::default()
        }
    }

    fn compiler() -> CompilerRecord {
        CompilerRecord {
            kind: "nvcc".into(),
            version: "13.0.88".into(),
        }
    }

    fn key_with(edit: impl FnOnce(&mut KernelInputs, &mut KeyParts)) -> KernelKey {
        let mut inputs = inputs();
        let mut parts = KeyParts {
            kernel: "layernorm_bf16".into(),
            arch: "sm_90a".parse().unwrap(),
            cuda: "cu130".parse().unwrap(),
            torch: "2.13.*".into(),
            compiler: compiler(),
        };
        edit(&mut inputs, &mut parts);
        KernelKey::compute(&KeyInputs {
            kernel: &parts.kernel,
            inputs: &inputs,
            arch: parts.arch,
            cuda: parts.cuda,
            torch: &parts.torch,
            compiler: &parts.compiler,
        })
    }

    struct KeyParts {
        kernel: String,
        arch: Arch,
        cuda: CudaBuild,
        torch: String,
        compiler: CompilerRecord,
    }

    fn assert_changes(what: &str, edit: impl FnOnce(&mut KernelInputs, &mut KeyParts)) {
        let base = key_with(|_, _| {});
        assert_ne!(
            base,
            key_with(edit),
            "changing the {what} must change the key"
        );
    }

    #[test]
    fn key_is_stable_for_identical_inputs() {
        assert_eq!(key_with(|_, _| {}), key_with(|_, _| {}));
        assert_eq!(key_with(|_, _| {}).0.len(), 64);
    }

    #[test]
    fn kernel_name_is_in_the_key() {
        assert_changes("kernel name", |_, parts| parts.kernel = "swiglu".into());
    }

    #[test]
    fn entry_points_are_in_the_key() {
        assert_changes("entries", |inputs, _| inputs.entries.push("other".into()));
    }

    #[test]
    fn file_content_is_in_the_key() {
        assert_changes("header content", |inputs, _| {
            inputs
                .files
                .insert("include/af3/common.cuh".into(), sha256_hex(b"edited"));
        });
    }

    #[test]
    fn file_path_is_in_the_key() {
        assert_changes("header path", |inputs, _| {
            let digest = inputs.files.remove("include/af3/common.cuh").unwrap();
            inputs
                .files
                .insert("include/af3/renamed.cuh".into(), digest);
        });
    }

    #[test]
    fn added_header_is_in_the_key() {
        assert_changes("include set", |inputs, _| {
            inputs
                .files
                .insert("include/af3/new.cuh".into(), sha256_hex(b""));
        });
    }

    #[test]
    fn defines_are_in_the_key() {
        assert_changes("define value", |inputs, _| {
            inputs.defines.insert("BLOCK_SIZE".into(), "128".into());
        });
        assert_changes("define set", |inputs, _| {
            inputs.defines.insert("AF3_FAST".into(), "1".into());
        });
    }

    #[test]
    fn flags_are_in_the_key() {
        assert_changes("flags", |inputs, _| {
            inputs.flags.push("--use_fast_math".into())
        });
    }

    #[test]
    fn flags_of_the_compiler_used_are_in_the_key() {
        // The base compiler is nvcc: its own flags count, NVRTC's do not.
        assert_changes("nvcc flags", |inputs, _| {
            inputs.nvcc_flags.push("-Xptxas=-v".into())
        });
        assert_eq!(
            key_with(|_, _| {}),
            key_with(|inputs, _| inputs.nvrtc_flags.push("-default-device".into())),
            "NVRTC's flags do not change an nvcc key"
        );
        let nvrtc = |inputs: &mut KernelInputs, parts: &mut KeyParts| {
            parts.compiler.kind = "nvrtc".into();
            inputs.nvcc_flags.push("-Xptxas=-v".into());
        };
        assert_ne!(
            key_with(nvrtc),
            key_with(|inputs, parts| {
                nvrtc(inputs, parts);
                inputs.nvrtc_flags.push("-default-device".into());
            }),
            "NVRTC's flags change an NVRTC key"
        );
        assert_changes("nvcc+ptxas flags", |inputs, parts| {
            parts.compiler.kind = "nvcc+ptxas".into();
            inputs.nvcc_flags.push("-lineinfo".into());
        });
    }

    #[test]
    fn host_compiler_and_assembler_are_in_the_key() {
        // The bundler records them in the compiler's version.
        assert_changes("host compiler", |_, parts| {
            parts.compiler.version = "13.0.88, host gcc (GCC) 13.2.0".into()
        });
        assert_changes("ptxas version", |_, parts| {
            parts.compiler.kind = "nvcc+ptxas".into();
            parts.compiler.version = "13.0.88 + ptxas 12.9.41".into()
        });
    }

    #[test]
    fn cxx_standard_is_in_the_key() {
        assert_changes("C++ standard", |inputs, _| inputs.cxx_std = "c++20".into());
    }

    #[test]
    fn arch_is_in_the_key() {
        assert_changes("arch", |_, parts| parts.arch = "sm_100a".parse().unwrap());
        assert_changes("arch suffix", |_, parts| {
            parts.arch = "sm_90".parse().unwrap()
        });
    }

    #[test]
    fn cuda_build_is_in_the_key() {
        assert_changes("CUDA build", |_, parts| {
            parts.cuda = "cu129".parse().unwrap()
        });
    }

    #[test]
    fn torch_build_is_in_the_key() {
        assert_changes("torch pin", |_, parts| parts.torch = "2.11.*".into());
    }

    #[test]
    fn compiler_and_version_are_in_the_key() {
        assert_changes("compiler", |_, parts| parts.compiler.kind = "nvrtc".into());
        assert_changes("compiler version", |_, parts| {
            parts.compiler.version = "13.0.48".into()
        });
    }

    #[test]
    fn preamble_is_in_the_key() {
        assert_changes("preamble", |inputs, _| {
            inputs.preamble = "using namespace af3;".into()
        });
        assert_ne!(
            key_with(|inputs, _| inputs.preamble = "using namespace a;".into()),
            key_with(|inputs, _| inputs.preamble = "using namespace b;".into()),
        );
    }

    #[test]
    fn computed_inputs_are_in_the_key() {
        assert_changes("computed constant", |inputs, _| {
            inputs
                .computed
                .constants
                .insert("smem".into(), "sizeof(int)".into());
        });
        assert_changes("template", |inputs, _| {
            inputs.computed.template = "typename K".into();
            inputs
                .computed
                .constants
                .insert("smem".into(), "sizeof(K)".into());
        });
        assert_changes("struct", |inputs, _| {
            inputs.computed.structs.insert("P".into(), vec!["a".into()]);
        });
        assert_ne!(
            key_with(|inputs, _| {
                inputs
                    .computed
                    .constants
                    .insert("smem".into(), "sizeof(int)".into());
            }),
            key_with(|inputs, _| {
                inputs
                    .computed
                    .constants
                    .insert("smem".into(), "sizeof(long)".into());
            }),
        );
        assert_ne!(
            key_with(|inputs, _| {
                inputs.computed.structs.insert("P".into(), vec!["a".into()]);
            }),
            key_with(|inputs, _| {
                inputs.computed.structs.insert("P".into(), vec!["b".into()]);
            }),
        );
    }

    #[test]
    fn requirements_are_in_the_key() {
        use crate::index::Requirement;
        let with = |inputs: &[&str], rules: &[(&str, Option<&str>)]| {
            let inputs: Vec<String> = inputs.iter().map(|name| (*name).to_owned()).collect();
            let rules: Vec<Requirement> = rules
                .iter()
                .map(|(when, reason)| Requirement {
                    when: (*when).to_owned(),
                    reason: reason.map(str::to_owned),
                })
                .collect();
            key_with(move |kernel, _| {
                kernel.requires.inputs = inputs;
                kernel.requires.rules = rules;
            })
        };
        let base = with(&["cols"], &[("cols <= 8192", None)]);
        assert_ne!(
            key_with(|_, _| {}),
            base,
            "declaring requirements changes the key"
        );
        for (what, key) in [
            (
                "a stricter condition",
                with(&["cols"], &[("cols <= 4096", None)]),
            ),
            (
                "another input",
                with(&["cols", "rows"], &[("cols <= 8192", None)]),
            ),
            (
                "a reason",
                with(&["cols"], &[("cols <= 8192", Some("one row per block"))]),
            ),
            (
                "another condition",
                with(&["cols"], &[("cols <= 8192", None), ("cols > 0", None)]),
            ),
        ] {
            assert_ne!(base, key, "{what} must change the key");
        }
        // A preamble and requirements are told apart from either alone.
        let preamble = key_with(|kernel, _| kernel.preamble = "x".into());
        let both = key_with(|kernel, _| {
            kernel.preamble = "x".into();
            kernel.requires.inputs = vec!["cols".into()];
        });
        assert_ne!(preamble, both);
    }

    #[test]
    fn per_arch_values_are_in_that_targets_key_only() {
        let sm100: Arch = "sm_100a".parse().unwrap();
        let with_sm100 = |edit: fn(&mut TargetInputs)| {
            move |inputs: &mut KernelInputs, _: &mut KeyParts| {
                edit(inputs.targets.entry(sm100).or_default())
            }
        };
        // The base target is sm_90a: another arch's table leaves its key alone.
        assert_eq!(
            key_with(|_, _| {}),
            key_with(with_sm100(|t| {
                t.defines.insert("KITTENS_BLACKWELL".into(), "1".into());
            })),
            "an sm_100a define must not change the sm_90a key"
        );
        let on_sm100 = |edit: fn(&mut TargetInputs)| {
            move |inputs: &mut KernelInputs, parts: &mut KeyParts| {
                parts.arch = sm100;
                edit(inputs.targets.entry(sm100).or_default());
            }
        };
        let base = key_with(|_, parts| parts.arch = sm100);
        for (what, key) in [
            (
                "per-arch define",
                key_with(on_sm100(|t| {
                    t.defines.insert("KITTENS_BLACKWELL".into(), "1".into());
                })),
            ),
            (
                "per-arch define value",
                key_with(on_sm100(|t| {
                    t.defines.insert("BLOCK_SIZE".into(), "512".into());
                })),
            ),
            (
                "per-arch flag",
                key_with(on_sm100(|t| t.flags.push("-lineinfo".into()))),
            ),
            (
                "per-arch nvcc flag",
                key_with(on_sm100(|t| t.nvcc_flags.push("-maxrregcount=64".into()))),
            ),
        ] {
            assert_ne!(base, key, "the {what} must change the sm_100a key");
        }
        // NVRTC's per-arch flags do not change an nvcc key.
        assert_eq!(
            base,
            key_with(on_sm100(|t| t.nvrtc_flags.push("-default-device".into())))
        );
        // A target is keyed by what it compiles with: a per-arch define is the same input as
        // the kernel-wide define it amounts to.
        assert_eq!(
            key_with(on_sm100(|t| {
                t.defines.insert("X".into(), "1".into());
            })),
            key_with(|inputs, parts| {
                parts.arch = sm100;
                inputs.defines.insert("X".into(), "1".into());
            })
        );
    }

    #[test]
    fn field_boundaries_cannot_be_shifted() {
        // Length prefixes keep ("ab", "c") and ("a", "bc") apart.
        let first = key_with(|inputs, _| inputs.flags = vec!["ab".into(), "c".into()]);
        let second = key_with(|inputs, _| inputs.flags = vec!["a".into(), "bc".into()]);
        assert_ne!(first, second);
    }
}
