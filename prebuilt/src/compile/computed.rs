//! Constants the compiler computes: C++ constant expressions a manifest names per kernel
//! (`sizeof(typename Ktraits::SmemStorage)`, `Ktraits::kNThreads`), evaluated by the compile
//! of each variant, per entry and per arch, and read back from what it produced. Nothing runs
//! on a GPU.
//!
//! Each [`Evaluation`] becomes one line of the generated unit ([`computed_source`]): a class
//! template over the kernel's template parameters whose `static constexpr long long` is the
//! expression, instantiated with the entry's template arguments, and stored in a device
//! variable `__kwheel_const_<n>`:
//!
//! ```text
//! template <typename Ktraits> struct __kwheel_eval_0 { static constexpr long long v = (long long)(sizeof(typename Ktraits::SmemStorage)); };
//! extern "C" __device__ const long long __kwheel_const_0 = __kwheel_eval_0<Traits<128, 4>>::v;
//! ```
//!
//! | output | where the value is |
//! | --- | --- |
//! | cubin (nvcc, NVRTC, nvcc+ptxas) | the symbol `__kwheel_const_<n>` (a local 8-byte object): its bytes in `.nv.global.init` at the symbol's value, or zero when the section is `.nv.global` (`NOBITS`) |
//! | a field's offset | stored as the pointer `(const char*)&((T*)0)->f`, which the compiler folds to the offset: NVRTC knows no `offsetof` |
//! | PTX (`compute_XY`) | the line `.global .align 8 .u64 __kwheel_const_<n> = <value>;` (no initializer: zero) |
//!
//! Verified against nvcc 13.0 for `sm_90a`/`sm_100a`: the variables stay in the cubin without
//! `-rdc`, as `LOCAL` `OBJECT` symbols, which are no kernel entries. Each line of the unit
//! sits under `#line <n + 1> "kwheel-computed"`, so a compiler error on it names the
//! evaluation ([`evaluation_of_error`]).

use std::collections::BTreeMap;

use crate::cubin::{read_global_integers, CubinError};
use crate::index::{ComputedInputs, FieldLayout, Function, StructLayout};

/// The prefix of the device variables that hold computed values.
pub const COMPUTED_PREFIX: &str = "__kwheel_const_";
/// The file name the generated lines are reported under (`kwheel-computed(3): error`).
pub const COMPUTED_FILE: &str = "kwheel-computed";

/// One expression to evaluate.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Evaluation {
    /// The template parameter list the arguments bind to (`typename Ktraits`); empty for an
    /// expression evaluated as written.
    pub parameters: String,
    /// The template arguments (`Traits<128, 4>`), when `parameters` is not empty.
    pub arguments: String,
    /// The C++ constant expression.
    pub expression: String,
    /// Whether `expression` is an address off a null pointer (`&((T*)0)->f`), stored as a
    /// pointer: the compiler folds it to the field's offset, where NVRTC has no `offsetof`.
    pub address: bool,
    /// What it computes, for an error: ``computed constant `smem` (`sizeof(S)`) for entry
    /// `k<T<1>>` ``, ``the offset of field `x` of struct `Params` ``. Not compiled.
    pub label: String,
}

/// What one evaluation's value is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Slot {
    /// A constant, for one entry (`None`: for every entry, evaluated as written).
    Constant { name: String, entry: Option<String> },
    /// A struct's `sizeof`.
    StructSize(String),
    /// A struct's `alignof`.
    StructAlign(String),
    /// A field's `offsetof`.
    FieldOffset(String, String),
    /// A field's `sizeof`.
    FieldSize(String, String),
}

/// The evaluations one kernel's compile makes, and what each value is: decided once, from the
/// kernel's inputs, by the bundler and the JIT alike.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ComputedPlan {
    /// What to compile, in the order of the variables.
    pub evaluations: Vec<Evaluation>,
    slots: Vec<Slot>,
}

impl ComputedPlan {
    /// The plan of a kernel whose inputs ask for `computed`, with `entries` as declared.
    /// Constants come first, per entry when there is a `template`, then each struct's size,
    /// alignment and fields.
    pub fn new(computed: &ComputedInputs, entries: &[String]) -> ComputedPlan {
        let mut plan = ComputedPlan::default();
        for (name, expression) in &computed.constants {
            if computed.template.trim().is_empty() {
                plan.push(
                    Slot::Constant {
                        name: name.clone(),
                        entry: None,
                    },
                    "",
                    "",
                    expression.clone(),
                );
                continue;
            }
            for entry in entries {
                plan.push(
                    Slot::Constant {
                        name: name.clone(),
                        entry: Some(entry.clone()),
                    },
                    &computed.template,
                    template_arguments(entry).unwrap_or_default(),
                    expression.clone(),
                );
            }
        }
        for (name, fields) in &computed.structs {
            plan.push(
                Slot::StructSize(name.clone()),
                "",
                "",
                format!("sizeof({name})"),
            );
            plan.push(
                Slot::StructAlign(name.clone()),
                "",
                "",
                format!("alignof({name})"),
            );
            for field in fields {
                plan.push(
                    Slot::FieldOffset(name.clone(), field.clone()),
                    "",
                    "",
                    format!("&((({name}*)0)->{field})"),
                );
                plan.push(
                    Slot::FieldSize(name.clone(), field.clone()),
                    "",
                    "",
                    format!("sizeof((({name}*)0)->{field})"),
                );
            }
        }
        plan
    }

    fn push(&mut self, slot: Slot, parameters: &str, arguments: &str, expression: String) {
        let label = describe(&slot, &expression);
        let address = matches!(slot, Slot::FieldOffset(..));
        self.slots.push(slot);
        self.evaluations.push(Evaluation {
            parameters: parameters.to_owned(),
            arguments: arguments.to_owned(),
            expression,
            address,
            label,
        });
    }

    /// Whether nothing is evaluated.
    pub fn is_empty(&self) -> bool {
        self.evaluations.is_empty()
    }

    /// Puts `values` (read back by [`read_computed`], one per evaluation) where they go: each
    /// entry's constants into its function, and the struct layouts returned.
    pub fn assign(
        &self,
        values: &[i64],
        functions: &mut [Function],
    ) -> BTreeMap<String, StructLayout> {
        let mut structs: BTreeMap<String, StructLayout> = BTreeMap::new();
        for (slot, &value) in self.slots.iter().zip(values) {
            let unsigned = u64::try_from(value).unwrap_or(0);
            let (name, field) = match slot {
                Slot::Constant { name, entry } => {
                    for function in functions.iter_mut() {
                        if entry.as_ref().is_none_or(|entry| *entry == function.name) {
                            function.computed.insert(name.clone(), value);
                        }
                    }
                    continue;
                }
                Slot::StructSize(name) | Slot::StructAlign(name) => (name, None),
                Slot::FieldOffset(name, field) | Slot::FieldSize(name, field) => {
                    (name, Some(field))
                }
            };
            let record = structs.entry(name.clone()).or_insert_with(|| StructLayout {
                size: 0,
                align: 0,
                fields: Vec::new(),
            });
            match (slot, field) {
                (Slot::StructSize(_), _) => record.size = unsigned,
                (Slot::StructAlign(_), _) => record.align = unsigned,
                (Slot::FieldOffset(..), Some(field)) => record.fields.push(FieldLayout {
                    name: field.clone(),
                    offset: unsigned,
                    size: 0,
                }),
                (_, Some(field)) => {
                    if let Some(last) = record.fields.iter_mut().rfind(|f| f.name == *field) {
                        last.size = unsigned;
                    }
                }
                _ => {}
            }
        }
        structs
    }
}

/// What `slot`, computed by `expression`, is, for an error ([`Evaluation::label`]).
fn describe(slot: &Slot, expression: &str) -> String {
    match slot {
        Slot::Constant { name, entry: None } => {
            format!("computed constant `{name}` (`{expression}`)")
        }
        Slot::Constant {
            name,
            entry: Some(entry),
        } => format!("computed constant `{name}` (`{expression}`) for entry `{entry}`"),
        Slot::StructSize(name) => format!("the size of struct `{name}`"),
        Slot::StructAlign(name) => format!("the alignment of struct `{name}`"),
        Slot::FieldOffset(name, field) => {
            format!("the offset of field `{field}` of struct `{name}`")
        }
        Slot::FieldSize(name, field) => format!("the size of field `{field}` of struct `{name}`"),
    }
}

/// The template arguments of a name expression: `Traits<128, 4>` for
/// `kernel<Traits<128, 4>>`; `None` for a name that is no template instance.
pub fn template_arguments(entry: &str) -> Option<&str> {
    let open = entry.find('<')?;
    let close = entry.rfind('>')?;
    (close > open).then(|| entry[open + 1..close].trim())
}

/// The lines that evaluate `evaluations`, in order, each under its own `#line`.
pub fn computed_source(evaluations: &[Evaluation]) -> String {
    let mut text = String::new();
    for (n, evaluation) in evaluations.iter().enumerate() {
        text.push_str(&format!("#line {} \"{COMPUTED_FILE}\"\n", n + 1));
        let expression = &evaluation.expression;
        if evaluation.address {
            text.push_str(&format!(
                "extern \"C\" __device__ const char* const {COMPUTED_PREFIX}{n} = (const char*)({expression});\n"
            ));
        } else if evaluation.parameters.trim().is_empty() {
            text.push_str(&format!(
                "extern \"C\" __device__ const long long {COMPUTED_PREFIX}{n} = (long long)({expression});\n"
            ));
        } else {
            text.push_str(&format!(
                "template <{}> struct __kwheel_eval_{n} {{ static constexpr long long v = (long long)({expression}); }}; \
                 extern \"C\" __device__ const long long {COMPUTED_PREFIX}{n} = __kwheel_eval_{n}<{}>::v;\n",
                evaluation.parameters, evaluation.arguments
            ));
        }
    }
    text
}

/// Which evaluation a compiler log's first error on a generated line is about: the `n` of
/// `kwheel-computed(<n + 1>): error`.
pub fn evaluation_of_error(log: &str) -> Option<usize> {
    log.lines()
        .filter(|line| line.contains("error"))
        .find_map(|line| {
            let (_, rest) = line.split_once(COMPUTED_FILE)?;
            let rest = rest.strip_prefix('(').or_else(|| rest.strip_prefix(':'))?;
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<usize>().ok()?.checked_sub(1)
        })
}

/// Why computed values could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum ComputedError {
    /// The output is no readable cubin.
    #[error(transparent)]
    Invalid(#[from] CubinError),
    /// The output lacks an evaluation's variable.
    #[error("the output has no `{COMPUTED_PREFIX}{0}`, the value of a computed constant")]
    Missing(usize),
}

/// The `count` values [`computed_source`] stored in `bytes` (a cubin, or PTX text), in order.
pub fn read_computed(bytes: &[u8], count: usize) -> Result<Vec<i64>, ComputedError> {
    if count == 0 {
        return Ok(Vec::new());
    }
    let found: BTreeMap<String, i64> = read_global_integers(bytes, COMPUTED_PREFIX)?;
    (0..count)
        .map(|n| {
            found
                .get(&format!("{COMPUTED_PREFIX}{n}"))
                .copied()
                .ok_or(ComputedError::Missing(n))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_arguments_are_the_outer_brackets() {
        assert_eq!(
            template_arguments("k<Traits<128, 4, false>>"),
            Some("Traits<128, 4, false>")
        );
        assert_eq!(template_arguments("ns::k< float , 2 >"), Some("float , 2"));
        assert_eq!(template_arguments("plain"), None);
    }

    #[test]
    fn each_evaluation_is_one_numbered_line() {
        let text = computed_source(&[
            Evaluation {
                parameters: "typename K".into(),
                arguments: "T<1>".into(),
                expression: "sizeof(typename K::S)".into(),
                address: false,
                label: String::new(),
            },
            Evaluation {
                parameters: String::new(),
                arguments: String::new(),
                expression: "4 * 8".into(),
                address: false,
                label: String::new(),
            },
        ]);
        assert_eq!(
            text,
            "#line 1 \"kwheel-computed\"\n\
             template <typename K> struct __kwheel_eval_0 { static constexpr long long v = (long long)(sizeof(typename K::S)); }; \
             extern \"C\" __device__ const long long __kwheel_const_0 = __kwheel_eval_0<T<1>>::v;\n\
             #line 2 \"kwheel-computed\"\n\
             extern \"C\" __device__ const long long __kwheel_const_1 = (long long)(4 * 8);\n"
        );
        assert_eq!(
            evaluation_of_error(
                "kwheel-entries.cu(3): warning: x\nkwheel-computed(2): error: expression must have a constant value\n"
            ),
            Some(1)
        );
        assert_eq!(evaluation_of_error("k.cu(2): error: x\n"), None);
    }

    #[test]
    fn ptx_values_are_read_from_their_initializers() {
        let ptx = ".version 9.0\n.target sm_90a\n\
                   .global .align 8 .u64 __kwheel_const_0 = 520;\n\
                   .global .align 8 .u64 __kwheel_const_1 = -5;\n\
                   .global .align 8 .u64 __kwheel_const_2;\n";
        assert_eq!(read_computed(ptx.as_bytes(), 3).unwrap(), [520, -5, 0]);
        assert!(matches!(
            read_computed(ptx.as_bytes(), 4),
            Err(ComputedError::Missing(3))
        ));
    }
}
