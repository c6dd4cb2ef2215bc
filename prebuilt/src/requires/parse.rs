//! The text of a condition: tokens, and a recursive-descent parser that bounds its length and
//! its depth.

use std::fmt;

use super::{Value, MAX_DEPTH, MAX_LENGTH};

/// A parsed expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Expr {
    Literal(Value),
    Name(String),
    Not(Box<Expr>),
    Negate(Box<Expr>),
    Binary(Operator, Box<Expr>, Box<Expr>),
}

impl Expr {
    /// Every name read, in order of first use.
    pub(super) fn names<'a>(&'a self, names: &mut Vec<&'a str>) {
        match self {
            Expr::Literal(_) => {}
            Expr::Name(name) => {
                if !names.contains(&name.as_str()) {
                    names.push(name);
                }
            }
            Expr::Not(inner) | Expr::Negate(inner) => inner.names(names),
            Expr::Binary(_, left, right) => {
                left.names(names);
                right.names(names);
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Operator {
    Or,
    And,
    Equal,
    NotEqual,
    Less,
    LessEqual,
    Greater,
    GreaterEqual,
    Add,
    Subtract,
    Multiply,
    Divide,
    Remainder,
}

impl Operator {
    pub(super) fn symbol(self) -> &'static str {
        match self {
            Operator::Or => "or",
            Operator::And => "and",
            Operator::Equal => "==",
            Operator::NotEqual => "!=",
            Operator::Less => "<",
            Operator::LessEqual => "<=",
            Operator::Greater => ">",
            Operator::GreaterEqual => ">=",
            Operator::Add => "+",
            Operator::Subtract => "-",
            Operator::Multiply => "*",
            Operator::Divide => "/",
            Operator::Remainder => "%",
        }
    }

    fn is_comparison(self) -> bool {
        matches!(
            self,
            Operator::Equal
                | Operator::NotEqual
                | Operator::Less
                | Operator::LessEqual
                | Operator::Greater
                | Operator::GreaterEqual
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Int(i64),
    Word(String),
    Operator(Operator),
    Open,
    Close,
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Int(value) => write!(f, "`{value}`"),
            Token::Word(word) => write!(f, "`{word}`"),
            Token::Operator(operator) => write!(f, "`{}`", operator.symbol()),
            Token::Open => f.write_str("`(`"),
            Token::Close => f.write_str("`)`"),
        }
    }
}

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        let two = bytes.get(at..at + 2).unwrap_or_default();
        let (token, length) = match byte {
            b' ' | b'\t' | b'\n' | b'\r' => {
                at += 1;
                continue;
            }
            b'0'..=b'9' => {
                let digits = bytes[at..]
                    .iter()
                    .take_while(|b| b.is_ascii_digit() || **b == b'_')
                    .count();
                let written = &text[at..at + digits];
                let literal: String = written.chars().filter(|c| *c != '_').collect();
                let value = literal.parse::<i64>().map_err(|_| {
                    format!("the integer `{written}` is outside the 64-bit signed range")
                })?;
                (Token::Int(value), digits)
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                let length = bytes[at..]
                    .iter()
                    .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
                    .count();
                (Token::Word(text[at..at + length].to_owned()), length)
            }
            b'(' => (Token::Open, 1),
            b')' => (Token::Close, 1),
            b'+' => (Token::Operator(Operator::Add), 1),
            b'-' => (Token::Operator(Operator::Subtract), 1),
            b'*' => (Token::Operator(Operator::Multiply), 1),
            b'/' if two == b"//" => {
                return Err("`//`: write `/`, which is floor division here".to_owned())
            }
            b'/' => (Token::Operator(Operator::Divide), 1),
            b'%' => (Token::Operator(Operator::Remainder), 1),
            b'=' if two == b"==" => (Token::Operator(Operator::Equal), 2),
            b'!' if two == b"!=" => (Token::Operator(Operator::NotEqual), 2),
            b'<' if two == b"<=" => (Token::Operator(Operator::LessEqual), 2),
            b'>' if two == b">=" => (Token::Operator(Operator::GreaterEqual), 2),
            b'<' => (Token::Operator(Operator::Less), 1),
            b'>' => (Token::Operator(Operator::Greater), 1),
            b'&' | b'|' | b'!' => {
                let word = match byte {
                    b'&' => "and",
                    b'|' => "or",
                    _ => "not",
                };
                let written = if two == b"&&" || two == b"||" {
                    &text[at..at + 2]
                } else {
                    &text[at..at + 1]
                };
                return Err(format!("`{written}`: write `{word}`"));
            }
            b'=' => return Err("`=`: compare with `==`".to_owned()),
            _ => {
                let found = text[at..]
                    .chars()
                    .next()
                    .expect("a character at a boundary");
                return Err(format!("unexpected character `{found}`"));
            }
        };
        tokens.push(token);
        at += length;
    }
    Ok(tokens)
}

/// Parses a condition's text, refusing one over [`MAX_LENGTH`] bytes or [`MAX_DEPTH`] deep.
pub(super) fn parse(text: &str) -> Result<Expr, String> {
    if text.len() > MAX_LENGTH {
        return Err(format!(
            "is {} bytes long, over the limit of {MAX_LENGTH}",
            text.len()
        ));
    }
    let tokens = tokenize(text)?;
    if tokens.is_empty() {
        return Err("is empty".to_owned());
    }
    let mut parser = Parser { tokens, at: 0 };
    let (expr, _) = parser.or(0)?;
    match parser.tokens.get(parser.at) {
        None => Ok(expr),
        Some(token) => Err(format!("unexpected {token} after a whole expression")),
    }
}

/// A recursive-descent parser; every function returns the expression and its height, and
/// refuses one past [`MAX_DEPTH`], so that neither parsing nor evaluating can recurse without
/// bound (a long `1 + 1 + …` is as deep as it is long).
struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

type Parsed = Result<(Expr, usize), String>;

fn too_deep(depth: usize) -> Result<(), String> {
    if depth > MAX_DEPTH {
        Err(format!("nests deeper than {MAX_DEPTH} levels"))
    } else {
        Ok(())
    }
}

fn binary(operator: Operator, (left, lh): (Expr, usize), (right, rh): (Expr, usize)) -> Parsed {
    let height = lh.max(rh) + 1;
    too_deep(height)?;
    Ok((
        Expr::Binary(operator, Box::new(left), Box::new(right)),
        height,
    ))
}

impl Parser {
    fn peek_operator(&self) -> Option<Operator> {
        match self.tokens.get(self.at) {
            Some(Token::Operator(operator)) => Some(*operator),
            Some(Token::Word(word)) if word == "and" => Some(Operator::And),
            Some(Token::Word(word)) if word == "or" => Some(Operator::Or),
            _ => None,
        }
    }

    /// `next (operator next)*` over `operators`, left-associative.
    fn chain(
        &mut self,
        depth: usize,
        operators: &[Operator],
        next: fn(&mut Parser, usize) -> Parsed,
    ) -> Parsed {
        let mut left = next(self, depth)?;
        while let Some(operator) = self.peek_operator().filter(|op| operators.contains(op)) {
            self.at += 1;
            let right = next(self, depth)?;
            left = binary(operator, left, right)?;
        }
        Ok(left)
    }

    fn or(&mut self, depth: usize) -> Parsed {
        too_deep(depth)?;
        self.chain(depth, &[Operator::Or], Parser::and)
    }

    fn and(&mut self, depth: usize) -> Parsed {
        self.chain(depth, &[Operator::And], Parser::not)
    }

    fn not(&mut self, depth: usize) -> Parsed {
        if matches!(self.tokens.get(self.at), Some(Token::Word(word)) if word == "not") {
            self.at += 1;
            too_deep(depth + 1)?;
            let (inner, height) = self.not(depth + 1)?;
            too_deep(height + 1)?;
            return Ok((Expr::Not(Box::new(inner)), height + 1));
        }
        self.comparison(depth)
    }

    fn comparison(&mut self, depth: usize) -> Parsed {
        let left = self.sum(depth)?;
        let Some(operator) = self.peek_operator().filter(|op| op.is_comparison()) else {
            return Ok(left);
        };
        self.at += 1;
        let right = self.sum(depth)?;
        if let Some(next) = self.peek_operator().filter(|op| op.is_comparison()) {
            return Err(format!(
                "`{}` follows a comparison: comparisons do not chain, join them with `and`",
                next.symbol()
            ));
        }
        binary(operator, left, right)
    }

    fn sum(&mut self, depth: usize) -> Parsed {
        self.chain(depth, &[Operator::Add, Operator::Subtract], Parser::product)
    }

    fn product(&mut self, depth: usize) -> Parsed {
        let operators = [Operator::Multiply, Operator::Divide, Operator::Remainder];
        self.chain(depth, &operators, Parser::unary)
    }

    fn unary(&mut self, depth: usize) -> Parsed {
        if self.peek_operator() == Some(Operator::Subtract) {
            self.at += 1;
            too_deep(depth + 1)?;
            let (inner, height) = self.unary(depth + 1)?;
            too_deep(height + 1)?;
            return Ok((Expr::Negate(Box::new(inner)), height + 1));
        }
        self.atom(depth)
    }

    fn atom(&mut self, depth: usize) -> Parsed {
        let Some(token) = self.tokens.get(self.at).cloned() else {
            return Err("ends where a value should follow".to_owned());
        };
        self.at += 1;
        match token {
            Token::Int(value) => Ok((Expr::Literal(Value::Int(value)), 1)),
            Token::Word(word) => match word.as_str() {
                "true" => Ok((Expr::Literal(Value::Bool(true)), 1)),
                "false" => Ok((Expr::Literal(Value::Bool(false)), 1)),
                "and" | "or" | "not" => Err(format!("unexpected `{word}` where a value goes")),
                _ => Ok((Expr::Name(word), 1)),
            },
            Token::Open => {
                let inner = self.or(depth + 1)?;
                if self.tokens.get(self.at) != Some(&Token::Close) {
                    return Err("a `(` is not closed".to_owned());
                }
                self.at += 1;
                Ok(inner)
            }
            token => Err(format!("unexpected {token} where a value goes")),
        }
    }
}
