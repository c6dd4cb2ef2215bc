//! What a kernel requires of the values it is called with: a small expression language, its
//! checks, and the one evaluator every caller uses (the manifest check, the runtime, the
//! Python module and through it the torch ops).
//!
//! ```toml
//! [kernels.flash_moe]
//! constants = { BLOCK_M = 128, MXFP8_SCALE_BLOCK = 32 }
//! inputs = ["dim", "hidden_dim", "mxfp8"]
//! requires = [
//!   { when = "dim % BLOCK_M == 0", reason = "dim must be a multiple of BLOCK_M" },
//!   { when = "hidden_dim <= 8192" },
//!   { when = "not mxfp8 or hidden_dim % MXFP8_SCALE_BLOCK == 0" },
//! ]
//! ```
//!
//! | piece | what it is |
//! | --- | --- |
//! | values | 64-bit signed integers and booleans (`true`, `false`) |
//! | names | the kernel's `inputs` and its integer and boolean constants |
//! | operators, loosest first | `or`; `and`; `not`; `== != < <= > >=` (not chained); `+ -`; `* / %`; unary `-` |
//! | `/` and `%` | floor division and its remainder, as Python's `//` and `%` |
//!
//! [`check`] parses every condition and infers each input's type from its use (an input is
//! an integer or a boolean, never both); an unknown name, a type error or a condition that is
//! not a boolean is refused, naming the condition. [`Checked::first_unmet`] evaluates the
//! conditions in order with `and` and `or` short-circuiting, and returns the first that is
//! false, with the values of the names it reads. Arithmetic is checked: an overflow or a
//! division by zero is reported as that condition being unmet, with the cause, never a panic.
//! Text longer than [`MAX_LENGTH`] or nested deeper than [`MAX_DEPTH`] is refused, so a crafted
//! index cannot make a reader recurse without bound.

use std::collections::BTreeMap;
use std::fmt;

use crate::index::{Constant, Requirement, Requirements};

mod parse;
use parse::{parse, Expr, Operator};

/// The longest condition, in bytes.
pub const MAX_LENGTH: usize = 4096;
/// The deepest nesting of a condition's expression tree (parentheses, operators, `not`).
pub const MAX_DEPTH: usize = 64;

/// A value a condition computes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
}

impl Value {
    fn kind(self) -> Kind {
        match self {
            Value::Int(_) => Kind::Int,
            Value::Bool(_) => Kind::Bool,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(value) => write!(f, "{value}"),
            Value::Bool(value) => write!(f, "{value}"),
        }
    }
}

/// The type of a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An integer.
    Int,
    /// A boolean.
    Bool,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Int => "an integer",
            Kind::Bool => "a boolean",
        })
    }
}

/// Why requirements were refused: which condition (1-based, in declaration order; 0 for the
/// `inputs` list) and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", describe(*.number, .when))]
pub struct Refused {
    /// The condition's number, from 1; 0 for the `inputs` list.
    pub number: usize,
    /// The condition's text (empty for the `inputs` list).
    pub when: String,
    /// What is wrong.
    pub message: String,
}

fn describe(number: usize, when: &str) -> String {
    if number == 0 {
        "`inputs`".to_owned()
    } else {
        format!("requirement {number} `{when}`")
    }
}

/// Values a caller passed that do not match the declared inputs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InputMismatch {
    /// Inputs the conditions need that were not given.
    #[error("missing input{} {}; the kernel's inputs are {}", plural(.missing.len()), listed(.missing), listed(.inputs))]
    Missing {
        /// What is missing.
        missing: Vec<String>,
        /// Every declared input.
        inputs: Vec<String>,
    },
    /// A value for a name that is no input.
    #[error("no input `{name}`; the kernel's inputs are {}", listed(.inputs))]
    Unknown {
        /// The name given.
        name: String,
        /// Every declared input.
        inputs: Vec<String>,
    },
    /// A value of the other type.
    #[error("input `{name}` is {expected}, not {found} (`{value}`)")]
    Type {
        /// The input.
        name: String,
        /// Its type, from the conditions.
        expected: Kind,
        /// The type given.
        found: Kind,
        /// The value given.
        value: Value,
    },
}

fn plural(count: usize) -> &'static str {
    if count == 1 {
        ""
    } else {
        "s"
    }
}

fn listed(names: &[String]) -> String {
    if names.is_empty() {
        return "none".to_owned();
    }
    names
        .iter()
        .map(|name| format!("`{name}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A condition that does not hold for the values given, in words with the values that broke
/// it (its `Display`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unmet {
    /// The condition's number, from 1.
    pub number: usize,
    /// The condition as declared.
    pub requirement: Requirement,
    /// Every name the condition reads, in order of first use, with its value.
    pub values: Vec<(String, Value)>,
    /// Why it could not be evaluated (`division by zero`), when that is why it failed.
    pub fault: Option<Fault>,
}

impl fmt::Display for Unmet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(reason) = &self.requirement.reason {
            write!(f, "{reason}: ")?;
        }
        write!(f, "requires `{}`", self.requirement.when)?;
        let values = self
            .values
            .iter()
            .map(|(name, value)| format!("{name} = {value}"))
            .collect::<Vec<_>>()
            .join(", ");
        match (&self.fault, values.is_empty()) {
            (Some(fault), true) => write!(f, ", which cannot be evaluated: {fault}"),
            (Some(fault), false) => {
                write!(f, ", which cannot be evaluated with {values}: {fault}")
            }
            (None, true) => write!(f, ", which is false"),
            (None, false) => write!(f, ", but {values}"),
        }
    }
}

/// Why a condition could not be evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `/` or `%` by zero.
    DivisionByZero,
    /// A result outside the 64-bit signed range.
    Overflow,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fault::DivisionByZero => "division by zero",
            Fault::Overflow => "the result overflows 64-bit integers",
        })
    }
}

/// Requirements parsed and type-checked against a kernel's constants: what evaluates.
#[derive(Clone, Debug)]
pub struct Checked {
    inputs: Vec<(String, Option<Kind>)>,
    constants: BTreeMap<String, Value>,
    rules: Vec<(Requirement, Expr)>,
}

/// Parses and checks `requirements` over `constants` (a kernel's exported constants: the
/// integer and boolean ones can be named).
pub fn check(
    requirements: &Requirements,
    constants: &BTreeMap<String, Constant>,
) -> Result<Checked, Refused> {
    let refused = |message: String| Refused {
        number: 0,
        when: String::new(),
        message,
    };
    let mut inputs: Vec<(String, Option<Kind>)> = Vec::new();
    for name in &requirements.inputs {
        if !is_name(name) || KEYWORDS.contains(&name.as_str()) {
            return Err(refused(format!(
                "`{name}` is not a name a condition can use (letters, digits and `_`, not a \
                 keyword)"
            )));
        }
        if inputs.iter().any(|(known, _)| known == name) {
            return Err(refused(format!("`{name}` is listed twice")));
        }
        if constants.contains_key(name) {
            return Err(refused(format!(
                "`{name}` is both an input and a constant of the kernel"
            )));
        }
        if RESERVED.contains(&name.as_str()) {
            return Err(refused(format!(
                "`{name}` cannot be an input: `<package>.unsupported_shape_reason(name, \
                 device=None, **inputs)` takes it as its own argument; call the input \
                 something else"
            )));
        }
        inputs.push((name.clone(), None));
    }
    let known: BTreeMap<String, Known> = constants
        .iter()
        .map(|(name, constant)| {
            let known = match constant {
                Constant::Integer(value) => Known::Value(Value::Int(*value)),
                Constant::Bool(value) => Known::Value(Value::Bool(*value)),
                Constant::Float(_) => Known::Unusable("a floating-point number"),
                Constant::String(_) => Known::Unusable("a string"),
            };
            (name.clone(), known)
        })
        .collect();
    let mut rules = Vec::new();
    for (index, requirement) in requirements.rules.iter().enumerate() {
        let refused = |message: String| Refused {
            number: index + 1,
            when: requirement.when.clone(),
            message,
        };
        if requirement
            .reason
            .as_deref()
            .is_some_and(|reason| reason.trim().is_empty())
        {
            return Err(refused("its `reason` is empty".to_owned()));
        }
        let expr = parse(&requirement.when).map_err(refused)?;
        let mut types = Types {
            inputs: &mut inputs,
            constants: &known,
        };
        types.expect(&expr, Kind::Bool).map_err(refused)?;
        if fold(&expr, &known).map_err(refused)? == Some(Value::Bool(false)) {
            return Err(refused(
                "it is false whatever the inputs (it reads only the kernel's constants and \
                 literals), so it would refuse every call"
                    .to_owned(),
            ));
        }
        rules.push((requirement.clone(), expr));
    }
    let constants = known
        .into_iter()
        .filter_map(|(name, known)| match known {
            Known::Value(value) => Some((name, value)),
            Known::Unusable(_) => None,
        })
        .collect();
    Ok(Checked {
        inputs,
        constants,
        rules,
    })
}

impl Checked {
    /// The declared inputs, each with its type where a condition uses it.
    pub fn inputs(&self) -> &[(String, Option<Kind>)] {
        &self.inputs
    }

    /// The first condition that does not hold for `values` (one per declared input), or
    /// `None` when all hold. Values that do not match the inputs are refused whole, before
    /// any condition is evaluated.
    pub fn first_unmet(
        &self,
        values: &BTreeMap<String, Value>,
    ) -> Result<Option<Unmet>, InputMismatch> {
        let declared = || self.inputs.iter().map(|(name, _)| name.clone()).collect();
        if let Some(name) = values
            .keys()
            .find(|name| !self.inputs.iter().any(|(known, _)| known == *name))
        {
            return Err(InputMismatch::Unknown {
                name: name.clone(),
                inputs: declared(),
            });
        }
        let missing: Vec<String> = self
            .inputs
            .iter()
            .filter(|(name, _)| !values.contains_key(name))
            .map(|(name, _)| name.clone())
            .collect();
        if !missing.is_empty() {
            return Err(InputMismatch::Missing {
                missing,
                inputs: declared(),
            });
        }
        for (name, kind) in &self.inputs {
            let value = values[name];
            if let Some(expected) = *kind {
                if value.kind() != expected {
                    return Err(InputMismatch::Type {
                        name: name.clone(),
                        expected,
                        found: value.kind(),
                        value,
                    });
                }
            }
        }
        let lookup = |name: &str| {
            values
                .get(name)
                .or_else(|| self.constants.get(name))
                .copied()
                .expect("every name was checked")
        };
        for (index, (requirement, expr)) in self.rules.iter().enumerate() {
            let fault = match evaluate(expr, &lookup) {
                Ok(Value::Bool(true)) => continue,
                Ok(_) => None,
                Err(fault) => Some(fault),
            };
            let mut names = Vec::new();
            expr.names(&mut names);
            let values = names
                .into_iter()
                .map(|name| (name.to_owned(), lookup(name)))
                .collect();
            return Ok(Some(Unmet {
                number: index + 1,
                requirement: requirement.clone(),
                values,
                fault,
            }));
        }
        Ok(None)
    }
}

/// Words a name cannot be.
const KEYWORDS: &[&str] = &["and", "or", "not", "true", "false"];

/// Names an input cannot have: the package-level `unsupported_shape_reason(name, device=None,
/// **inputs)` takes them as its own arguments.
const RESERVED: &[&str] = &["name", "device"];

/// The value of the part of `expr` that reads no input (its constants and literals), where
/// all of it does; a part that can never be evaluated (a division by a zero that no input can
/// change, an overflow of constants) is refused here, when the manifest is read, not at the
/// first call. `expr` is type-checked.
fn fold(expr: &Expr, constants: &BTreeMap<String, Known>) -> Result<Option<Value>, String> {
    let constant = |name: &str| match constants.get(name) {
        Some(Known::Value(value)) => *value,
        _ => unreachable!("folded parts read only constants"),
    };
    Ok(match expr {
        Expr::Literal(value) => Some(*value),
        Expr::Name(name) => match constants.get(name.as_str()) {
            Some(Known::Value(value)) => Some(*value),
            _ => None,
        },
        Expr::Not(inner) | Expr::Negate(inner) => match fold(inner, constants)? {
            Some(_) => Some(fold_value(expr, &constant)?),
            None => None,
        },
        Expr::Binary(operator, left, right) => {
            let (left, right) = (fold(left, constants)?, fold(right, constants)?);
            if matches!(operator, Operator::Divide | Operator::Remainder)
                && right == Some(Value::Int(0))
            {
                return Err(format!(
                    "its `{}` divides by zero whatever the inputs",
                    operator.symbol()
                ));
            }
            match (left, right) {
                (Some(_), Some(_)) => Some(fold_value(expr, &constant)?),
                _ => None,
            }
        }
    })
}

/// The value of an `expr` that reads only constants, or why it has none.
fn fold_value(expr: &Expr, constant: &dyn Fn(&str) -> Value) -> Result<Value, String> {
    evaluate(expr, constant)
        .map_err(|fault| format!("a part that reads only constants cannot be evaluated: {fault}"))
}

fn is_name(text: &str) -> bool {
    let mut chars = text.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

enum Known {
    Value(Value),
    Unusable(&'static str),
}

/// Type inference over one condition: constants have their type, an input takes the type of
/// its first use.
struct Types<'a> {
    inputs: &'a mut Vec<(String, Option<Kind>)>,
    constants: &'a BTreeMap<String, Known>,
}

impl Types<'_> {
    /// The type `expr` has by itself, if it does not depend on an input not yet typed.
    fn of(&self, expr: &Expr) -> Result<Option<Kind>, String> {
        Ok(match expr {
            Expr::Literal(value) => Some(value.kind()),
            Expr::Name(name) => self.name(name)?,
            Expr::Not(_) => Some(Kind::Bool),
            Expr::Negate(_) => Some(Kind::Int),
            Expr::Binary(operator, ..) => Some(match operator {
                Operator::Add
                | Operator::Subtract
                | Operator::Multiply
                | Operator::Divide
                | Operator::Remainder => Kind::Int,
                _ => Kind::Bool,
            }),
        })
    }

    fn name(&self, name: &str) -> Result<Option<Kind>, String> {
        if let Some((_, kind)) = self.inputs.iter().find(|(known, _)| known == name) {
            return Ok(*kind);
        }
        match self.constants.get(name) {
            Some(Known::Value(value)) => Ok(Some(value.kind())),
            Some(Known::Unusable(what)) => Err(format!(
                "the constant `{name}` is {what}: conditions compute with integers and booleans"
            )),
            None => Err(format!(
                "unknown name `{name}`: it is neither an input ({}) nor an integer or boolean \
                 constant of the kernel ({})",
                listed(
                    &self
                        .inputs
                        .iter()
                        .map(|(n, _)| n.clone())
                        .collect::<Vec<_>>()
                ),
                listed(
                    &self
                        .constants
                        .iter()
                        .filter(|(_, known)| matches!(known, Known::Value(_)))
                        .map(|(n, _)| n.clone())
                        .collect::<Vec<_>>()
                )
            )),
        }
    }

    /// Checks that `expr` has type `expected`, typing inputs on their first use.
    fn expect(&mut self, expr: &Expr, expected: Kind) -> Result<(), String> {
        let mismatch = |found: Kind, what: String| {
            Err(format!("{what} is {found}, where {expected} is needed"))
        };
        match expr {
            Expr::Literal(value) if value.kind() != expected => {
                mismatch(value.kind(), format!("`{value}`"))
            }
            Expr::Literal(_) => Ok(()),
            Expr::Name(name) => match self.name(name)? {
                Some(found) if found != expected => {
                    let what = if self.constants.contains_key(name) {
                        format!("the constant `{name}`")
                    } else {
                        format!("the input `{name}` (by an earlier use)")
                    };
                    mismatch(found, what)
                }
                Some(_) => Ok(()),
                None => {
                    let input = self
                        .inputs
                        .iter_mut()
                        .find(|(known, _)| known == name)
                        .expect("an untyped name is an input");
                    input.1 = Some(expected);
                    Ok(())
                }
            },
            Expr::Not(inner) => {
                if expected != Kind::Bool {
                    return mismatch(Kind::Bool, "a `not`".to_owned());
                }
                self.expect(inner, Kind::Bool)
            }
            Expr::Negate(inner) => {
                if expected != Kind::Int {
                    return mismatch(Kind::Int, "a negation".to_owned());
                }
                self.expect(inner, Kind::Int)
            }
            Expr::Binary(operator, left, right) => {
                let (operands, result) = match operator {
                    Operator::Or | Operator::And => (Some(Kind::Bool), Kind::Bool),
                    Operator::Equal | Operator::NotEqual => (None, Kind::Bool),
                    Operator::Less
                    | Operator::LessEqual
                    | Operator::Greater
                    | Operator::GreaterEqual => (Some(Kind::Int), Kind::Bool),
                    _ => (Some(Kind::Int), Kind::Int),
                };
                if result != expected {
                    return mismatch(result, format!("a `{}`", operator.symbol()));
                }
                // `==` and `!=` compare two values of one type: the first side whose type is
                // known decides, integers when neither is.
                let operands = match operands {
                    Some(kind) => kind,
                    None => self.of(left)?.or(self.of(right)?).unwrap_or(Kind::Int),
                };
                self.expect(left, operands)?;
                self.expect(right, operands)
            }
        }
    }
}

fn evaluate(expr: &Expr, lookup: &dyn Fn(&str) -> Value) -> Result<Value, Fault> {
    let int = |expr: &Expr| match evaluate(expr, lookup)? {
        Value::Int(value) => Ok(value),
        Value::Bool(_) => unreachable!("type-checked: an integer"),
    };
    let boolean = |expr: &Expr| match evaluate(expr, lookup)? {
        Value::Bool(value) => Ok(value),
        Value::Int(_) => unreachable!("type-checked: a boolean"),
    };
    Ok(match expr {
        Expr::Literal(value) => *value,
        Expr::Name(name) => lookup(name),
        Expr::Not(inner) => Value::Bool(!boolean(inner)?),
        Expr::Negate(inner) => Value::Int(int(inner)?.checked_neg().ok_or(Fault::Overflow)?),
        Expr::Binary(Operator::Or, left, right) => Value::Bool(boolean(left)? || boolean(right)?),
        Expr::Binary(Operator::And, left, right) => Value::Bool(boolean(left)? && boolean(right)?),
        Expr::Binary(Operator::Equal, left, right) => {
            Value::Bool(evaluate(left, lookup)? == evaluate(right, lookup)?)
        }
        Expr::Binary(Operator::NotEqual, left, right) => {
            Value::Bool(evaluate(left, lookup)? != evaluate(right, lookup)?)
        }
        Expr::Binary(operator, left, right) => {
            let (a, b) = (int(left)?, int(right)?);
            match operator {
                Operator::Less => Value::Bool(a < b),
                Operator::LessEqual => Value::Bool(a <= b),
                Operator::Greater => Value::Bool(a > b),
                Operator::GreaterEqual => Value::Bool(a >= b),
                Operator::Add => Value::Int(a.checked_add(b).ok_or(Fault::Overflow)?),
                Operator::Subtract => Value::Int(a.checked_sub(b).ok_or(Fault::Overflow)?),
                Operator::Multiply => Value::Int(a.checked_mul(b).ok_or(Fault::Overflow)?),
                Operator::Divide => Value::Int(floor_divide(a, b)?),
                Operator::Remainder => Value::Int(floor_remainder(a, b)?),
                _ => unreachable!("handled above"),
            }
        }
    })
}

/// `a // b` as Python computes it (rounded toward negative infinity).
fn floor_divide(a: i64, b: i64) -> Result<i64, Fault> {
    if b == 0 {
        return Err(Fault::DivisionByZero);
    }
    let quotient = a.checked_div(b).ok_or(Fault::Overflow)?;
    Ok(if a % b != 0 && ((a < 0) != (b < 0)) {
        quotient - 1
    } else {
        quotient
    })
}

/// `a % b` as Python computes it (the sign of `b`).
fn floor_remainder(a: i64, b: i64) -> Result<i64, Fault> {
    if b == 0 {
        return Err(Fault::DivisionByZero);
    }
    // `i64::MIN % -1` is 0, though `checked_rem` calls it an overflow.
    let remainder = a.checked_rem(b).unwrap_or(0);
    Ok(if remainder != 0 && ((remainder < 0) != (b < 0)) {
        remainder + b
    } else {
        remainder
    })
}

/// The first unmet requirement of a kernel (its `requirements` over its `constants`) for
/// `values`, in words, or `None`: what `unsupported_shape_reason` answers.
pub fn unsupported_reason(
    requirements: &Requirements,
    constants: &BTreeMap<String, Constant>,
    values: &BTreeMap<String, Value>,
) -> Result<Option<String>, Mismatch> {
    let checked = check(requirements, constants).map_err(Mismatch::Refused)?;
    let unmet = checked.first_unmet(values).map_err(Mismatch::Inputs)?;
    Ok(unmet.map(|unmet| unmet.to_string()))
}

/// Why [`unsupported_reason`] has no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    /// The requirements themselves do not check (an index not written by this bundler).
    #[error(transparent)]
    Refused(Refused),
    /// The values given do not match the inputs.
    #[error(transparent)]
    Inputs(InputMismatch),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requirements(inputs: &[&str], rules: &[(&str, Option<&str>)]) -> Requirements {
        Requirements {
            inputs: inputs.iter().map(|name| (*name).to_owned()).collect(),
            rules: rules
                .iter()
                .map(|(when, reason)| Requirement {
                    when: (*when).to_owned(),
                    reason: reason.map(str::to_owned),
                })
                .collect(),
        }
    }

    fn flash_moe() -> (Requirements, BTreeMap<String, Constant>) {
        (
            requirements(
                &["dim", "hidden_dim", "mxfp8"],
                &[
                    (
                        "dim % BLOCK_M == 0",
                        Some("dim must be a multiple of BLOCK_M"),
                    ),
                    ("hidden_dim <= 8192", None),
                    ("not mxfp8 or hidden_dim % MXFP8_SCALE_BLOCK == 0", None),
                ],
            ),
            BTreeMap::from([
                ("BLOCK_M".to_owned(), Constant::Integer(128)),
                ("MXFP8_SCALE_BLOCK".to_owned(), Constant::Integer(32)),
                ("NAME".to_owned(), Constant::String("moe".to_owned())),
            ]),
        )
    }

    fn values(pairs: &[(&str, Value)]) -> BTreeMap<String, Value> {
        pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), *value))
            .collect()
    }

    fn reason(pairs: &[(&str, Value)]) -> Option<String> {
        let (requirements, constants) = flash_moe();
        unsupported_reason(&requirements, &constants, &values(pairs)).unwrap()
    }

    fn refused(rules: &[&str]) -> String {
        let (_, constants) = flash_moe();
        let rules: Vec<(&str, Option<&str>)> = rules.iter().map(|rule| (*rule, None)).collect();
        check(&requirements(&["dim", "flag"], &rules), &constants)
            .unwrap_err()
            .to_string()
    }

    fn value_of(text: &str) -> Result<Value, Fault> {
        let expr = parse(text).unwrap();
        evaluate(&expr, &|_| unreachable!("no names"))
    }

    #[test]
    fn each_requirement_answers_on_both_sides_of_its_boundary() {
        use Value::{Bool, Int};
        let ok = [
            ("dim", Int(256)),
            ("hidden_dim", Int(8192)),
            ("mxfp8", Bool(true)),
        ];
        assert_eq!(reason(&ok), None);
        assert_eq!(
            reason(&[
                ("dim", Int(100)),
                ("hidden_dim", Int(64)),
                ("mxfp8", Bool(false))
            ])
            .unwrap(),
            "dim must be a multiple of BLOCK_M: requires `dim % BLOCK_M == 0`, but dim = 100, \
             BLOCK_M = 128"
        );
        assert_eq!(
            reason(&[
                ("dim", Int(128)),
                ("hidden_dim", Int(8193)),
                ("mxfp8", Bool(false))
            ])
            .unwrap(),
            "requires `hidden_dim <= 8192`, but hidden_dim = 8193"
        );
        assert_eq!(
            reason(&[
                ("dim", Int(128)),
                ("hidden_dim", Int(48)),
                ("mxfp8", Bool(true))
            ])
            .unwrap(),
            "requires `not mxfp8 or hidden_dim % MXFP8_SCALE_BLOCK == 0`, but mxfp8 = true, \
             hidden_dim = 48, MXFP8_SCALE_BLOCK = 32"
        );
        // Without mxfp8 the scale block does not matter.
        assert_eq!(
            reason(&[
                ("dim", Int(128)),
                ("hidden_dim", Int(48)),
                ("mxfp8", Bool(false))
            ]),
            None
        );
    }

    #[test]
    fn inputs_are_typed_by_their_use_and_values_are_checked_against_it() {
        let (requirements, constants) = flash_moe();
        let checked = check(&requirements, &constants).unwrap();
        assert_eq!(
            checked.inputs(),
            &[
                ("dim".to_owned(), Some(Kind::Int)),
                ("hidden_dim".to_owned(), Some(Kind::Int)),
                ("mxfp8".to_owned(), Some(Kind::Bool)),
            ]
        );
        let given = |pairs| checked.first_unmet(&values(pairs)).unwrap_err().to_string();
        use Value::{Bool, Int};
        assert_eq!(
            given(&[("dim", Int(1)), ("hidden_dim", Int(1)), ("mxfp8", Int(1))]),
            "input `mxfp8` is a boolean, not an integer (`1`)"
        );
        assert_eq!(
            given(&[("dim", Int(1))]),
            "missing inputs `hidden_dim`, `mxfp8`; the kernel's inputs are `dim`, `hidden_dim`, \
             `mxfp8`"
        );
        assert_eq!(
            given(&[("dim", Int(1)), ("hidden", Int(1)), ("mxfp8", Bool(true))]),
            "no input `hidden`; the kernel's inputs are `dim`, `hidden_dim`, `mxfp8`"
        );
    }

    #[test]
    fn unknown_names_and_type_errors_name_the_requirement() {
        assert_eq!(
            refused(&["dim > 0", "dimm % 2 == 0"]),
            "requirement 2 `dimm % 2 == 0`: unknown name `dimm`: it is neither an input (`dim`, \
             `flag`) nor an integer or boolean constant of the kernel (`BLOCK_M`, \
             `MXFP8_SCALE_BLOCK`)"
        );
        assert_eq!(
            refused(&["dim + 1"]),
            "requirement 1 `dim + 1`: a `+` is an integer, where a boolean is needed"
        );
        // An input used as a boolean, then as an integer.
        assert_eq!(
            refused(&["flag", "flag + 1 > 0"]),
            "requirement 2 `flag + 1 > 0`: the input `flag` (by an earlier use) is a boolean, \
             where an integer is needed"
        );
        assert_eq!(
            refused(&["NAME == 1"]),
            "requirement 1 `NAME == 1`: the constant `NAME` is a string: conditions compute \
             with integers and booleans"
        );
        assert_eq!(
            refused(&["BLOCK_M == true"]),
            "requirement 1 `BLOCK_M == true`: `true` is a boolean, where an integer is needed"
        );
        assert_eq!(
            refused(&["dim < 1 < 2"]),
            "requirement 1 `dim < 1 < 2`: `<` follows a comparison: comparisons do not chain, \
             join them with `and`"
        );
        assert!(refused(&["dim > 0 && flag"]).ends_with("`&&`: write `and`"));
        assert!(refused(&["dim = 0"]).ends_with("`=`: compare with `==`"));
        assert!(refused(&["(dim > 0"]).ends_with("a `(` is not closed"));
        assert!(refused(&["dim >"]).ends_with("ends where a value should follow"));
        assert!(refused(&["dim > 0 0"]).ends_with("unexpected `0` after a whole expression"));
        assert!(refused(&[""]).ends_with("is empty"));
        assert!(refused(&["dim ≥ 0"]).ends_with("unexpected character `≥`"));
    }

    #[test]
    fn the_inputs_list_is_checked() {
        let constants = flash_moe().1;
        let message = |inputs: &[&str]| {
            check(&requirements(inputs, &[]), &constants)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(message(&["a", "a"]), "`inputs`: `a` is listed twice");
        assert_eq!(
            message(&["BLOCK_M"]),
            "`inputs`: `BLOCK_M` is both an input and a constant of the kernel"
        );
        assert!(message(&["not"]).contains("`not` is not a name"));
        assert!(message(&["2x"]).contains("`2x` is not a name"));
        for reserved in ["name", "device"] {
            assert_eq!(
                message(&["dim", reserved]),
                format!(
                    "`inputs`: `{reserved}` cannot be an input: `<package>.unsupported_shape_\
                     reason(name, device=None, **inputs)` takes it as its own argument; call \
                     the input something else"
                )
            );
        }
    }

    #[test]
    fn a_condition_its_constants_make_impossible_is_refused_at_the_manifest() {
        // `flash_moe`'s constants: BLOCK_M = 128, MXFP8_SCALE_BLOCK = 32.
        let false_always = "it is false whatever the inputs (it reads only the kernel's \
                            constants and literals), so it would refuse every call";
        assert_eq!(
            refused(&["dim > 0", "false"]),
            format!("requirement 2 `false`: {false_always}")
        );
        assert_eq!(
            refused(&["BLOCK_M % 64 == 1"]),
            format!("requirement 1 `BLOCK_M % 64 == 1`: {false_always}")
        );
        assert_eq!(
            refused(&["dim % 0 == 0"]),
            "requirement 1 `dim % 0 == 0`: its `%` divides by zero whatever the inputs"
        );
        assert_eq!(
            refused(&["flag or dim / (BLOCK_M - 128) > 1"]),
            "requirement 1 `flag or dim / (BLOCK_M - 128) > 1`: its `/` divides by zero \
             whatever the inputs"
        );
        assert_eq!(
            refused(&["dim < BLOCK_M * 9223372036854775807"]),
            "requirement 1 `dim < BLOCK_M * 9223372036854775807`: a part that reads only \
             constants cannot be evaluated: the result overflows 64-bit integers"
        );
        // What the constants decide in the kernel's favour is a static check that holds, and
        // a division whose divisor an input can change is evaluated at the call.
        let (_, constants) = flash_moe();
        let fine = requirements(
            &["dim", "block"],
            &[
                ("BLOCK_M % MXFP8_SCALE_BLOCK == 0", None),
                ("dim % block == 0", None),
            ],
        );
        assert!(check(&fine, &constants).is_ok());
    }

    #[test]
    fn arithmetic_follows_python_and_precedence() {
        assert_eq!(value_of("-7 / 2"), Ok(Value::Int(-4)));
        assert_eq!(value_of("-7 % 2"), Ok(Value::Int(1)));
        assert_eq!(value_of("7 % -2"), Ok(Value::Int(-1)));
        assert_eq!(value_of("7 / 2"), Ok(Value::Int(3)));
        assert_eq!(value_of("1 + 2 * 3"), Ok(Value::Int(7)));
        assert_eq!(value_of("(1 + 2) * 3"), Ok(Value::Int(9)));
        assert_eq!(value_of("10 - 2 - 3"), Ok(Value::Int(5)));
        assert_eq!(value_of("- -3"), Ok(Value::Int(3)));
        assert_eq!(value_of("1_024 == 1024"), Ok(Value::Bool(true)));
        assert_eq!(value_of("not true or true"), Ok(Value::Bool(true)));
        assert_eq!(value_of("not (true or true)"), Ok(Value::Bool(false)));
        assert_eq!(value_of("true or false and false"), Ok(Value::Bool(true)));
        assert_eq!(value_of("true == (1 < 2)"), Ok(Value::Bool(true)));
        assert_eq!(
            value_of("-9223372036854775807 - 1 == -9223372036854775807 - 1"),
            Ok(Value::Bool(true))
        );
        assert_eq!(
            value_of("(-9223372036854775807 - 1) % -1"),
            Ok(Value::Int(0))
        );
    }

    #[test]
    fn division_by_zero_and_overflow_are_refusals_with_their_cause() {
        assert_eq!(value_of("1 / 0"), Err(Fault::DivisionByZero));
        assert_eq!(value_of("1 % 0"), Err(Fault::DivisionByZero));
        assert_eq!(value_of("9223372036854775807 + 1"), Err(Fault::Overflow));
        assert_eq!(value_of("-9223372036854775807 - 2"), Err(Fault::Overflow));
        assert_eq!(value_of("4294967296 * 4294967296"), Err(Fault::Overflow));
        assert_eq!(
            value_of("(-9223372036854775807 - 1) / -1"),
            Err(Fault::Overflow)
        );
        assert_eq!(
            value_of("-(-9223372036854775807 - 1)"),
            Err(Fault::Overflow)
        );
        let rules = requirements(
            &["rows", "block"],
            &[("rows % block == 0", Some("whole blocks"))],
        );
        let reason = unsupported_reason(
            &rules,
            &BTreeMap::new(),
            &values(&[("rows", Value::Int(10)), ("block", Value::Int(0))]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            reason,
            "whole blocks: requires `rows % block == 0`, which cannot be evaluated with rows = \
             10, block = 0: division by zero"
        );
        let rules = requirements(&["rows"], &[("rows * rows >= 0", None)]);
        let reason = unsupported_reason(
            &rules,
            &BTreeMap::new(),
            &values(&[("rows", Value::Int(i64::MAX))]),
        )
        .unwrap()
        .unwrap();
        assert!(
            reason.ends_with("the result overflows 64-bit integers"),
            "{reason}"
        );
        // `and` and `or` short-circuit: the side that would divide by zero is not evaluated.
        assert_eq!(value_of("false and 1 / 0 == 0"), Ok(Value::Bool(false)));
        assert_eq!(value_of("true or 1 / 0 == 0"), Ok(Value::Bool(true)));
    }

    #[test]
    fn adversarial_text_is_refused_not_a_crash() {
        assert!(parse("99999999999999999999 > 0")
            .unwrap_err()
            .contains("`99999999999999999999` is outside the 64-bit signed range"));
        // i64::MIN is written as a subtraction: its magnitude alone is out of range.
        assert!(parse("-9223372036854775808 < 0").is_err());
        let deep = format!("{}1 == 1{}", "(".repeat(10_000), ")".repeat(10_000));
        assert!(parse(&deep).unwrap_err().contains("over the limit of 4096"));
        let nested = format!("{}1 == 1{}", "(".repeat(100), ")".repeat(100));
        assert_eq!(parse(&nested).unwrap_err(), "nests deeper than 64 levels");
        let nots = format!("{}true", "not ".repeat(1000));
        assert_eq!(parse(&nots).unwrap_err(), "nests deeper than 64 levels");
        let negations = format!("{}1 == 1", "-".repeat(1000));
        assert_eq!(
            parse(&negations).unwrap_err(),
            "nests deeper than 64 levels"
        );
        let long_sum = format!("{}1 > 0", "1 + ".repeat(500));
        assert_eq!(parse(&long_sum).unwrap_err(), "nests deeper than 64 levels");
        let just_nested = format!("{}1 == 1{}", "(".repeat(60), ")".repeat(60));
        assert_eq!(
            evaluate(&parse(&just_nested).unwrap(), &|_| unreachable!()),
            Ok(Value::Bool(true))
        );
        for text in [
            "(",
            ")",
            "not",
            "- ",
            "()",
            "1 +",
            "and",
            "true true",
            "((1)",
            "1 == == 1",
        ] {
            assert!(parse(text).is_err(), "{text}");
        }
        // Every byte string either parses or is refused with a message, never a panic.
        for text in ["\u{0}", "é", "1 /", "a.b", "x[0]", "f(x)", "1e9"] {
            assert!(parse(text).is_err(), "{text}");
        }
    }
}
