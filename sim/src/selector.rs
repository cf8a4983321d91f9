//! Label and field selectors with the semantics of `k8s.io/apimachinery/pkg/labels` and
//! `pkg/fields`.
//!
//! Label selectors accept the full string grammar of `labels.Parse` (`=`, `==`, `!=`,
//! `in (...)`, `notin (...)`, `key`, `!key`, and the `>`/`<` integer comparisons) with the
//! same key/value validation, and the structured `metav1.LabelSelector` form. Field
//! selectors accept `=`, `==`, `!=` joined by commas with the `\,` `\=` `\\` escapes, and are
//! checked against the field labels the real server supports for each kind.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::Value;

/// Why a selector was rejected; the server answers these with 400 BadRequest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The selector string does not follow the grammar (the message is apimachinery's).
    #[error("{0}")]
    Syntax(String),
    /// A label key is not a valid qualified name.
    #[error("key: Invalid value: \"{key}\": {reason}")]
    InvalidKey {
        /// The rejected key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A label value is not valid.
    #[error("values: Invalid value: \"{value}\": {reason}")]
    InvalidValue {
        /// The rejected value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The operator and the number of values do not fit together.
    #[error("{0}")]
    InvalidRequirement(String),
    /// A structured `metav1.LabelSelector` is malformed.
    #[error("invalid label selector: {0}")]
    InvalidStructured(String),
    /// A field selector term or value could not be parsed.
    #[error("invalid selector: {0}")]
    InvalidField(String),
    /// A field selector names a field the server does not index for this kind.
    #[error("field label not supported: {0}")]
    FieldLabelNotSupported(String),
}

/// Result alias for this module.
pub type Result<T, E = SelectorError> = std::result::Result<T, E>;

/// The operator of one label requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operator {
    /// `key=value`
    Equals,
    /// `key==value`
    DoubleEquals,
    /// `key!=value`
    NotEquals,
    /// `key in (a,b)`
    In,
    /// `key notin (a,b)`
    NotIn,
    /// `key`
    Exists,
    /// `!key`
    DoesNotExist,
    /// `key>3`
    GreaterThan,
    /// `key<3`
    LessThan,
}

/// One `key op values` term of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    key: String,
    op: Operator,
    values: BTreeSet<String>,
}

impl Requirement {
    /// Builds a requirement with the validation of apimachinery's `labels.NewRequirement`.
    pub fn new(key: &str, op: Operator, values: BTreeSet<String>) -> Result<Self> {
        validate_label_key(key)?;
        match op {
            Operator::In | Operator::NotIn if values.is_empty() => {
                return Err(SelectorError::InvalidRequirement(
                    "for 'in', 'notin' operators, values set can't be empty".into(),
                ));
            }
            Operator::Equals | Operator::DoubleEquals | Operator::NotEquals
                if values.len() != 1 =>
            {
                return Err(SelectorError::InvalidRequirement(
                    "exact-match compatibility requires one single value".into(),
                ));
            }
            Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                return Err(SelectorError::InvalidRequirement(
                    "values set must be empty for exists and does not exist".into(),
                ));
            }
            Operator::GreaterThan | Operator::LessThan => {
                if values.len() != 1 {
                    return Err(SelectorError::InvalidRequirement(
                        "for 'Gt', 'Lt' operators, exactly one value is required".into(),
                    ));
                }
                for v in &values {
                    if v.parse::<i64>().is_err() {
                        return Err(SelectorError::InvalidRequirement(
                            "for 'Gt', 'Lt' operators, the value must be an integer".into(),
                        ));
                    }
                }
            }
            _ => {}
        }
        for v in &values {
            validate_label_value(v)?;
        }
        Ok(Requirement {
            key: key.to_owned(),
            op,
            values,
        })
    }

    /// The label key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The operator.
    pub fn operator(&self) -> Operator {
        self.op
    }

    /// The values (empty for `Exists`/`DoesNotExist`).
    pub fn values(&self) -> &BTreeSet<String> {
        &self.values
    }

    /// Whether this requirement holds for `labels`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let got = labels.get(&self.key);
        match self.op {
            Operator::Equals | Operator::DoubleEquals | Operator::In => {
                got.is_some_and(|v| self.values.contains(v))
            }
            Operator::NotEquals | Operator::NotIn => got.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => got.is_some(),
            Operator::DoesNotExist => got.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let Some(have) = got.and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                self.values
                    .iter()
                    .filter_map(|v| v.parse::<i64>().ok())
                    .any(|want| match self.op {
                        Operator::GreaterThan => have > want,
                        _ => have < want,
                    })
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let first = self.values.iter().next().map(String::as_str).unwrap_or("");
        let joined = || self.values.iter().cloned().collect::<Vec<_>>().join(",");
        match self.op {
            Operator::Exists => write!(f, "{}", self.key),
            Operator::DoesNotExist => write!(f, "!{}", self.key),
            Operator::Equals => write!(f, "{}={first}", self.key),
            Operator::DoubleEquals => write!(f, "{}=={first}", self.key),
            Operator::NotEquals => write!(f, "{}!={first}", self.key),
            Operator::GreaterThan => write!(f, "{}>{first}", self.key),
            Operator::LessThan => write!(f, "{}<{first}", self.key),
            Operator::In => write!(f, "{} in ({})", self.key, joined()),
            Operator::NotIn => write!(f, "{} notin ({})", self.key, joined()),
        }
    }
}

/// A parsed label selector: the AND of its requirements.
///
/// The empty selector matches everything; [`LabelSelector::nothing`] (what a `null`
/// `metav1.LabelSelector` converts to) matches no object.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
    nothing: bool,
}

impl LabelSelector {
    /// The selector that matches every label set.
    pub fn everything() -> Self {
        Self::default()
    }

    /// The selector that matches no label set.
    pub fn nothing() -> Self {
        LabelSelector {
            requirements: Vec::new(),
            nothing: true,
        }
    }

    /// Parses the string form (`?labelSelector=`), like apimachinery's `labels.Parse`.
    pub fn parse(input: &str) -> Result<Self> {
        let tokens = lex(input)?;
        let mut p = Parser { tokens, pos: 0 };
        let mut requirements = Vec::new();
        loop {
            match p.peek() {
                Token::End => break,
                Token::Ident(_) | Token::Bang => {
                    requirements.push(p.requirement()?);
                    match p.next() {
                        Token::End => break,
                        Token::Comma => match p.peek() {
                            Token::Ident(_) | Token::Bang => {}
                            t => {
                                return Err(SelectorError::Syntax(format!(
                                    "found '{}', expected: identifier after ','",
                                    t.literal()
                                )));
                            }
                        },
                        t => {
                            return Err(SelectorError::Syntax(format!(
                                "found '{}', expected: ',' or 'end of string'",
                                t.literal()
                            )));
                        }
                    }
                }
                t => {
                    return Err(SelectorError::Syntax(format!(
                        "found '{}', expected: !, identifier, or 'end of string'",
                        t.literal()
                    )));
                }
            }
        }
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector {
            requirements,
            nothing: false,
        })
    }

    /// Converts a `metav1.LabelSelector` (`matchLabels`, `matchExpressions`), like
    /// `metav1.LabelSelectorAsSelector`: `null` matches nothing, `{}` matches everything.
    pub fn from_label_selector_json(value: &Value) -> Result<Self> {
        let obj = match value {
            Value::Null => return Ok(Self::nothing()),
            Value::Object(o) => o,
            _ => {
                return Err(SelectorError::InvalidStructured(
                    "selector must be an object".into(),
                ));
            }
        };
        let mut requirements = Vec::new();
        match obj.get("matchLabels") {
            None | Some(Value::Null) => {}
            Some(Value::Object(labels)) => {
                for (k, v) in labels {
                    let Value::String(v) = v else {
                        return Err(SelectorError::InvalidStructured(format!(
                            "matchLabels[{k}] must be a string"
                        )));
                    };
                    requirements.push(Requirement::new(
                        k,
                        Operator::Equals,
                        BTreeSet::from([v.clone()]),
                    )?);
                }
            }
            Some(_) => {
                return Err(SelectorError::InvalidStructured(
                    "matchLabels must be an object".into(),
                ));
            }
        }
        match obj.get("matchExpressions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(exprs)) => {
                for e in exprs {
                    requirements.push(expression_requirement(e)?);
                }
            }
            Some(_) => {
                return Err(SelectorError::InvalidStructured(
                    "matchExpressions must be a list".into(),
                ));
            }
        }
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector {
            requirements,
            nothing: false,
        })
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether this selector matches every label set.
    pub fn is_everything(&self) -> bool {
        !self.nothing && self.requirements.is_empty()
    }

    /// Whether `labels` satisfies every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        !self.nothing && self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Like [`LabelSelector::matches`] for an object's `metadata.labels` JSON; non-string
    /// label values are ignored.
    pub fn matches_object(&self, object: &Value) -> bool {
        self.matches(&labels_of(object))
    }
}

/// An object's `metadata.labels` as a map (missing or malformed labels give an empty map).
pub fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

fn expression_requirement(e: &Value) -> Result<Requirement> {
    let key = e.get("key").and_then(Value::as_str).ok_or_else(|| {
        SelectorError::InvalidStructured("matchExpressions[].key is required".into())
    })?;
    let op = match e.get("operator").and_then(Value::as_str) {
        Some("In") => Operator::In,
        Some("NotIn") => Operator::NotIn,
        Some("Exists") => Operator::Exists,
        Some("DoesNotExist") => Operator::DoesNotExist,
        Some(other) => {
            return Err(SelectorError::InvalidStructured(format!(
                "\"{other}\" is not a valid label selector operator"
            )));
        }
        None => {
            return Err(SelectorError::InvalidStructured(
                "matchExpressions[].operator is required".into(),
            ));
        }
    };
    let mut values = BTreeSet::new();
    match e.get("values") {
        None | Some(Value::Null) => {}
        Some(Value::Array(vs)) => {
            for v in vs {
                let Value::String(v) = v else {
                    return Err(SelectorError::InvalidStructured(
                        "matchExpressions[].values must be strings".into(),
                    ));
                };
                values.insert(v.clone());
            }
        }
        Some(_) => {
            return Err(SelectorError::InvalidStructured(
                "matchExpressions[].values must be a list".into(),
            ));
        }
    }
    Requirement::new(key, op, values)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Bang,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    Comma,
    Open,
    Close,
    End,
}

impl Token {
    fn literal(&self) -> &str {
        match self {
            Token::Ident(s) => s,
            Token::Bang => "!",
            Token::Eq => "=",
            Token::DoubleEq => "==",
            Token::NotEq => "!=",
            Token::Gt => ">",
            Token::Lt => "<",
            Token::Comma => ",",
            Token::Open => "(",
            Token::Close => ")",
            Token::End => "",
        }
    }
}

/// The lexer's whitespace, exactly apimachinery's `isWhitespace`.
fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn is_special(c: char) -> bool {
    matches!(c, '!' | '=' | ',' | '(' | ')' | '<' | '>')
}

fn lex(input: &str) -> Result<Vec<Token>> {
    let mut out = Vec::new();
    let mut chars = input.char_indices().peekable();
    while let Some(&(start, c)) = chars.peek() {
        if is_space(c) {
            chars.next();
            continue;
        }
        if is_special(c) {
            chars.next();
            let next_is_eq = chars.peek().is_some_and(|&(_, n)| n == '=');
            let tok = match c {
                '!' if next_is_eq => {
                    chars.next();
                    Token::NotEq
                }
                '!' => Token::Bang,
                '=' if next_is_eq => {
                    chars.next();
                    Token::DoubleEq
                }
                '=' => Token::Eq,
                ',' => Token::Comma,
                '(' => Token::Open,
                ')' => Token::Close,
                '<' => Token::Lt,
                _ => Token::Gt,
            };
            out.push(tok);
            continue;
        }
        let mut end = input.len();
        while let Some(&(i, c)) = chars.peek() {
            if is_space(c) || is_special(c) {
                end = i;
                break;
            }
            chars.next();
        }
        out.push(Token::Ident(input.get(start..end).unwrap_or("").to_owned()));
    }
    out.push(Token::End);
    Ok(out)
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Token {
        self.tokens.get(self.pos).cloned().unwrap_or(Token::End)
    }

    fn next(&mut self) -> Token {
        let t = self.peek();
        self.pos += 1;
        t
    }

    fn requirement(&mut self) -> Result<Requirement> {
        let mut tok = self.next();
        let negated = tok == Token::Bang;
        if negated {
            tok = self.next();
        }
        let Token::Ident(key) = tok else {
            return Err(requirement_syntax(format!(
                "found '{}', expected: identifier",
                tok.literal()
            )));
        };
        validate_label_key(&key)?;
        if negated {
            return Requirement::new(&key, Operator::DoesNotExist, BTreeSet::new());
        }
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Requirement::new(&key, Operator::Exists, BTreeSet::new());
        }
        let op = match self.next() {
            Token::Eq => Operator::Equals,
            Token::DoubleEq => Operator::DoubleEquals,
            Token::NotEq => Operator::NotEquals,
            Token::Gt => Operator::GreaterThan,
            Token::Lt => Operator::LessThan,
            Token::Ident(s) if s == "in" => Operator::In,
            Token::Ident(s) if s == "notin" => Operator::NotIn,
            t => {
                return Err(requirement_syntax(format!(
                    "found '{}', expected: {}",
                    t.literal(),
                    "'=', '!=', '==', 'in', notin'"
                )));
            }
        };
        let values = match op {
            Operator::In | Operator::NotIn => self.set_values()?,
            _ => self.exact_value()?,
        };
        Requirement::new(&key, op, values)
    }

    fn exact_value(&mut self) -> Result<BTreeSet<String>> {
        match self.peek() {
            Token::End | Token::Comma => Ok(BTreeSet::from([String::new()])),
            Token::Ident(v) => {
                self.pos += 1;
                Ok(BTreeSet::from([v]))
            }
            t => Err(requirement_syntax(format!(
                "found '{}', expected: identifier",
                t.literal()
            ))),
        }
    }

    fn set_values(&mut self) -> Result<BTreeSet<String>> {
        let t = self.next();
        if t != Token::Open {
            return Err(requirement_syntax(format!(
                "found '{}' expected: '('",
                t.literal()
            )));
        }
        let mut values = BTreeSet::new();
        if self.peek() == Token::Close {
            self.pos += 1;
            values.insert(String::new());
            return Ok(values);
        }
        // Identifier list: "a,b", "a,,b" and trailing/leading commas yield "" entries.
        let mut expect_value = true;
        loop {
            match self.next() {
                Token::Ident(v) if expect_value => {
                    values.insert(v);
                    expect_value = false;
                }
                Token::Comma => {
                    if expect_value {
                        values.insert(String::new());
                    }
                    expect_value = true;
                }
                Token::Close => {
                    if expect_value {
                        values.insert(String::new());
                    }
                    return Ok(values);
                }
                t => {
                    return Err(requirement_syntax(format!(
                        "found '{}', expected: ',' or ')'",
                        t.literal()
                    )));
                }
            }
        }
    }
}

/// A syntax error inside one requirement, worded as `labels.Parse` words it.
fn requirement_syntax(msg: String) -> SelectorError {
    SelectorError::Syntax(format!("unable to parse requirement: {msg}"))
}

const NAME_MAX: usize = 63;
const DNS1123_SUBDOMAIN_MAX: usize = 253;

fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => {
            f.is_ascii_alphanumeric()
                && l.is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= DNS1123_SUBDOMAIN_MAX
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            match (b.first(), b.last()) {
                (Some(f), Some(l)) => {
                    (f.is_ascii_lowercase() || f.is_ascii_digit())
                        && (l.is_ascii_lowercase() || l.is_ascii_digit())
                        && b.iter()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                }
                _ => false,
            }
        })
}

/// Validates a label key as a qualified name (`[prefix/]name`), like
/// `validation.IsQualifiedName`.
pub fn validate_label_key(key: &str) -> Result<()> {
    let bad = |reason: &str| SelectorError::InvalidKey {
        key: key.to_owned(),
        reason: reason.to_owned(),
    };
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            return Err(bad("prefix part must be non-empty"));
        }
        if !is_dns1123_subdomain(p) {
            return Err(bad(
                "prefix part a lowercase RFC 1123 subdomain must consist of lower case \
                 alphanumeric characters, '-' or '.', and must start and end with an \
                 alphanumeric character",
            ));
        }
    }
    if name.is_empty() {
        return Err(bad("name part must be non-empty"));
    }
    if name.len() > NAME_MAX {
        return Err(bad("name part must be no more than 63 characters"));
    }
    if !is_qualified_name_part(name) {
        return Err(bad(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must \
             start and end with an alphanumeric character",
        ));
    }
    Ok(())
}

/// Validates a label value like `validation.IsValidLabelValue` (empty is allowed).
pub fn validate_label_value(value: &str) -> Result<()> {
    if value.is_empty() {
        return Ok(());
    }
    let reason = if value.len() > NAME_MAX {
        "must be no more than 63 characters"
    } else if !is_qualified_name_part(value) {
        "a valid label must be an empty string or consist of alphanumeric characters, '-', \
         '_' or '.', and must start and end with an alphanumeric character"
    } else {
        return Ok(());
    };
    Err(SelectorError::InvalidValue {
        value: value.to_owned(),
        reason: reason.to_owned(),
    })
}

/// The operator of one field selector term.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldOperator {
    /// `field=value` or `field==value`
    Equals,
    /// `field!=value`
    NotEquals,
}

/// One `field op value` term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    /// The field label, e.g. `metadata.name` or `spec.nodeName`.
    pub field: String,
    /// The comparison.
    pub op: FieldOperator,
    /// The unescaped value.
    pub value: String,
}

/// A parsed field selector: the AND of its terms. The empty selector matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldSelector {
    terms: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parses `?fieldSelector=` like apimachinery's `fields.ParseSelector`.
    pub fn parse(input: &str) -> Result<Self> {
        let mut parts = split_unescaped_commas(input);
        parts.sort();
        let mut terms = Vec::new();
        for part in parts {
            if part.is_empty() {
                continue;
            }
            let Some((lhs, op, rhs)) = split_term(part) else {
                return Err(SelectorError::InvalidField(format!(
                    "'{input}'; can't understand '{part}'"
                )));
            };
            terms.push(FieldRequirement {
                field: lhs.to_owned(),
                op,
                value: unescape_field_value(rhs)?,
            });
        }
        Ok(FieldSelector { terms })
    }

    /// Parses and checks every field against the labels the server supports for `kind`
    /// (see [`supported_field`]), failing like the real server with
    /// `field label not supported`.
    pub fn parse_for_kind(input: &str, kind: &str) -> Result<Self> {
        let s = Self::parse(input)?;
        s.check_supported(kind)?;
        Ok(s)
    }

    /// Fails with [`SelectorError::FieldLabelNotSupported`] for the first field `kind` does
    /// not support.
    pub fn check_supported(&self, kind: &str) -> Result<()> {
        match self.terms.iter().find(|t| !supported_field(kind, &t.field)) {
            Some(t) => Err(SelectorError::FieldLabelNotSupported(t.field.clone())),
            None => Ok(()),
        }
    }

    /// The terms, sorted as the server sorts them.
    pub fn terms(&self) -> &[FieldRequirement] {
        &self.terms
    }

    /// Whether this selector matches everything.
    pub fn is_everything(&self) -> bool {
        self.terms.is_empty()
    }

    /// The value `field` must equal, if a term requires one (e.g. `metadata.name=x`, which
    /// kubectl sends for `get NAME -w` and `wait`).
    pub fn exact_value(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| t.field == field && t.op == FieldOperator::Equals)
            .map(|t| t.value.as_str())
    }

    /// Whether `object` satisfies every term. Field labels are resolved per the object's
    /// `kind` (e.g. a Job's `status.successful` reads `status.succeeded`, a Pod's
    /// `status.podIP` reads `status.podIPs[0].ip`, an Event's `source` reads
    /// `source.component`), with the server's zero values for missing fields
    /// (`spec.nodeName=` matches unscheduled pods, `spec.unschedulable=false` matches
    /// nodes without the field); other labels are read as dotted paths.
    pub fn matches(&self, object: &Value) -> bool {
        let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
        self.terms.iter().all(|t| {
            let got = field_value(object, kind, &t.field);
            match t.op {
                FieldOperator::Equals => got == t.value,
                FieldOperator::NotEquals => got != t.value,
            }
        })
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let op = match t.op {
                FieldOperator::Equals => "=",
                FieldOperator::NotEquals => "!=",
            };
            write!(f, "{}{op}{}", t.field, escape_field_value(&t.value))?;
        }
        Ok(())
    }
}

/// One selectable field: its label, where its value is read (JSON pointers, first present
/// wins) and the value when none is present (the Go zero value the server would print).
#[derive(Debug)]
struct FieldLabel {
    label: &'static str,
    pointers: &'static [&'static str],
    default: &'static str,
}

const fn fl(
    label: &'static str,
    pointers: &'static [&'static str],
    default: &'static str,
) -> FieldLabel {
    FieldLabel {
        label,
        pointers,
        default,
    }
}

/// Per-kind field labels beyond `metadata.name`/`metadata.namespace`, from the
/// `ToSelectableFields`/`GetAttrs` functions of kube-apiserver 1.33. An Event is stored in
/// either API's shape (see `crate::events`), so each Event label is read from either
/// shape; which labels a request may use depends on its API ([`CORE_EVENT_LABELS`],
/// [`EVENTS_V1_LABELS`]).
const KIND_FIELDS: &[(&str, &[FieldLabel])] = &[
    (
        "Pod",
        &[
            fl("spec.nodeName", &["/spec/nodeName"], ""),
            fl("spec.restartPolicy", &["/spec/restartPolicy"], ""),
            fl("spec.schedulerName", &["/spec/schedulerName"], ""),
            fl("spec.serviceAccountName", &["/spec/serviceAccountName"], ""),
            fl("spec.hostNetwork", &["/spec/hostNetwork"], "false"),
            fl("status.phase", &["/status/phase"], ""),
            fl(
                "status.podIP",
                &["/status/podIPs/0/ip", "/status/podIP"],
                "",
            ),
            fl(
                "status.nominatedNodeName",
                &["/status/nominatedNodeName"],
                "",
            ),
        ],
    ),
    (
        "Event",
        &[
            fl(
                "involvedObject.kind",
                &["/involvedObject/kind", "/regarding/kind"],
                "",
            ),
            fl(
                "involvedObject.namespace",
                &["/involvedObject/namespace", "/regarding/namespace"],
                "",
            ),
            fl(
                "involvedObject.name",
                &["/involvedObject/name", "/regarding/name"],
                "",
            ),
            fl(
                "involvedObject.uid",
                &["/involvedObject/uid", "/regarding/uid"],
                "",
            ),
            fl(
                "involvedObject.apiVersion",
                &["/involvedObject/apiVersion", "/regarding/apiVersion"],
                "",
            ),
            fl(
                "involvedObject.resourceVersion",
                &[
                    "/involvedObject/resourceVersion",
                    "/regarding/resourceVersion",
                ],
                "",
            ),
            fl(
                "involvedObject.fieldPath",
                &["/involvedObject/fieldPath", "/regarding/fieldPath"],
                "",
            ),
            fl(
                "regarding.kind",
                &["/regarding/kind", "/involvedObject/kind"],
                "",
            ),
            fl(
                "regarding.namespace",
                &["/regarding/namespace", "/involvedObject/namespace"],
                "",
            ),
            fl(
                "regarding.name",
                &["/regarding/name", "/involvedObject/name"],
                "",
            ),
            fl(
                "regarding.uid",
                &["/regarding/uid", "/involvedObject/uid"],
                "",
            ),
            fl(
                "regarding.apiVersion",
                &["/regarding/apiVersion", "/involvedObject/apiVersion"],
                "",
            ),
            fl(
                "regarding.resourceVersion",
                &[
                    "/regarding/resourceVersion",
                    "/involvedObject/resourceVersion",
                ],
                "",
            ),
            fl(
                "regarding.fieldPath",
                &["/regarding/fieldPath", "/involvedObject/fieldPath"],
                "",
            ),
            fl("reason", &["/reason"], ""),
            fl(
                "reportingComponent",
                &["/reportingComponent", "/reportingController"],
                "",
            ),
            fl(
                "reportingController",
                &["/reportingController", "/reportingComponent"],
                "",
            ),
            fl(
                "source",
                &[
                    "/source/component",
                    "/deprecatedSource/component",
                    "/reportingComponent",
                    "/reportingController",
                ],
                "",
            ),
            fl("type", &["/type"], ""),
        ],
    ),
    ("Secret", &[fl("type", &["/type"], "")]),
    (
        "Node",
        &[fl("spec.unschedulable", &["/spec/unschedulable"], "false")],
    ),
    ("Namespace", &[fl("status.phase", &["/status/phase"], "")]),
    (
        "ReplicaSet",
        &[fl("status.replicas", &["/status/replicas"], "0")],
    ),
    (
        "Job",
        &[fl("status.successful", &["/status/succeeded"], "0")],
    ),
];

fn kind_field(kind: &str, field: &str) -> Option<&'static FieldLabel> {
    KIND_FIELDS
        .iter()
        .find(|(k, _)| *k == kind)
        .and_then(|(_, fields)| fields.iter().find(|f| f.label == field))
}

/// The kind [`supported_field`] knows events.k8s.io/v1 Events by; `Event` is core/v1's.
pub const EVENTS_V1_KIND: &str = "Event.events.k8s.io";

/// The labels core/v1 `events` accepts (`AddFieldLabelConversionsForEvent` of core/v1).
const CORE_EVENT_LABELS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

/// The labels events.k8s.io/v1 `events` accepts (its `AddFieldLabelConversionsForEvent`,
/// which maps `regarding.*` and `reportingController` to the core labels).
const EVENTS_V1_LABELS: &[&str] = &[
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "regarding.apiVersion",
    "regarding.resourceVersion",
    "regarding.fieldPath",
    "reason",
    "reportingController",
    "type",
];

/// Whether the real server lets `field` select objects of `kind` (`Pod`, `Event`,
/// [`EVENTS_V1_KIND`], ...); when it does not, it answers `field label not supported`.
/// Every kind supports `metadata.name` and `metadata.namespace`.
pub fn supported_field(kind: &str, field: &str) -> bool {
    field == "metadata.name"
        || field == "metadata.namespace"
        || match kind {
            "Event" => CORE_EVENT_LABELS.contains(&field),
            EVENTS_V1_KIND => EVENTS_V1_LABELS.contains(&field),
            _ => kind_field(kind, field).is_some(),
        }
}

/// The value a field label has on `object` of `kind`, as the server's field set holds it
/// (a missing string is `""`, a missing boolean `false`, a missing count `0`). Unknown
/// labels are read as a dotted path.
fn field_value(object: &Value, kind: &str, field: &str) -> String {
    let scalar = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    };
    if let Some(f) = kind_field(kind, field) {
        return f
            .pointers
            .iter()
            .filter_map(|p| object.pointer(p).and_then(scalar))
            .find(|v| !v.is_empty())
            .unwrap_or_else(|| f.default.to_owned());
    }
    let mut cur = object;
    for seg in field.split('.') {
        match cur.get(seg) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    scalar(cur).unwrap_or_default()
}

fn split_unescaped_commas(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' {
            out.push(s.get(start..i).unwrap_or(""));
            start = i + 1;
        }
    }
    out.push(s.get(start..).unwrap_or(""));
    out
}

fn split_term(term: &str) -> Option<(&str, FieldOperator, &str)> {
    for (i, _) in term.char_indices() {
        let rest = term.get(i..)?;
        for (tok, op) in [
            ("!=", FieldOperator::NotEquals),
            ("==", FieldOperator::Equals),
            ("=", FieldOperator::Equals),
        ] {
            if let Some(rhs) = rest.strip_prefix(tok) {
                return Some((term.get(..i)?, op, rhs));
            }
        }
    }
    None
}

fn unescape_field_value(v: &str) -> Result<String> {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(e) => {
                    return Err(SelectorError::InvalidField(format!(
                        "invalid field selector: invalid escape sequence: \\{e}"
                    )));
                }
                None => {
                    return Err(SelectorError::InvalidField(
                        "invalid field selector: trailing escape".into(),
                    ));
                }
            },
            ',' | '=' => {
                return Err(SelectorError::InvalidField(format!(
                    "invalid field selector: unescaped {c} in value"
                )));
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

fn escape_field_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn sel(s: &str) -> LabelSelector {
        match LabelSelector::parse(s) {
            Ok(sel) => sel,
            Err(e) => panic!("{s:?} should parse: {e}"),
        }
    }

    #[test]
    fn label_matching_table() {
        let l = labels(&[("app", "web"), ("tier", "front"), ("n", "5")]);
        let cases: &[(&str, bool)] = &[
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("app!=web", false),
            ("missing!=x", true),
            ("app in (web,db)", true),
            ("app in (db)", false),
            ("missing in (a)", false),
            ("app notin (db)", true),
            ("app notin (web)", false),
            ("missing notin (web)", true),
            ("app", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("app=web,tier=front", true),
            ("app=web,tier=back", false),
            ("  app = web , tier  in (front) ", true),
            ("n>4", true),
            ("n>5", false),
            ("n<6", true),
            ("missing>1", false),
            ("app>1", false),
            ("app=", false),
            ("missing=", false),
        ];
        for (s, want) in cases {
            assert_eq!(sel(s).matches(&l), *want, "selector {s:?}");
        }
        assert!(sel("x=").matches(&labels(&[("x", "")])));
        assert!(sel("x in ()").matches(&labels(&[("x", "")])));
        assert!(sel("x in (a,)").matches(&labels(&[("x", "")])));
    }

    #[test]
    fn keywords_are_identifiers_in_key_position() {
        assert!(sel("in=notin").matches(&labels(&[("in", "notin")])));
        assert!(sel("notin").matches(&labels(&[("notin", "1")])));
    }

    #[test]
    fn label_syntax_errors() {
        for bad in [
            "app=web,",
            ",app",
            "app web",
            "app in web",
            "app in (web",
            "app in (a b)",
            "!app=web",
            "!",
            "app=(x)",
            "app=a=b",
            "=x",
            "a,,b",
            "app)",
        ] {
            assert!(
                matches!(LabelSelector::parse(bad), Err(SelectorError::Syntax(_))),
                "{bad:?} should be a syntax error, got {:?}",
                LabelSelector::parse(bad)
            );
        }
    }

    #[test]
    fn error_messages_match_apimachinery() {
        let msg = |s: &str| LabelSelector::parse(s).map_err(|e| e.to_string());
        assert_eq!(
            msg("a,"),
            Err("found '', expected: identifier after ','".into())
        );
        assert_eq!(
            msg("a b"),
            Err(
                "unable to parse requirement: found 'b', expected: '=', '!=', '==', 'in', notin'"
                    .into()
            )
        );
        assert_eq!(
            msg("a in (b"),
            Err("unable to parse requirement: found '', expected: ',' or ')'".into())
        );
        assert!(msg("-a").is_err_and(|m| m.starts_with("key: Invalid value: \"-a\"")));
    }

    #[test]
    fn label_validation_errors() {
        for bad in ["-app=x", "app-=x", "Foo/app=x", "/app=x", "a/=x", "a/b/c=x"] {
            assert!(
                matches!(
                    LabelSelector::parse(bad),
                    Err(SelectorError::InvalidKey { .. })
                ),
                "{bad:?} -> {:?}",
                LabelSelector::parse(bad)
            );
        }
        let long = "a".repeat(64);
        assert!(LabelSelector::parse(&long).is_err());
        assert!(LabelSelector::parse(&"a".repeat(63)).is_ok());
        assert!(LabelSelector::parse("example.com/app.v1_x=yes").is_ok());
        assert!(matches!(
            LabelSelector::parse(&format!("a={long}")),
            Err(SelectorError::InvalidValue { .. })
        ));
        for bad in ["a=-x", "a=x-", "a=ü", "a in (ok,-bad)"] {
            assert!(
                matches!(
                    LabelSelector::parse(bad),
                    Err(SelectorError::InvalidValue { .. })
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            LabelSelector::parse("a>x"),
            Err(SelectorError::InvalidRequirement(_))
        ));
    }

    #[test]
    fn display_sorts_by_key_and_values() {
        let s = sel("z in (b,a), a!=1, !m, k, q==2, n>3");
        assert_eq!(s.to_string(), "a!=1,k,!m,n>3,q==2,z in (a,b)");
        assert_eq!(sel(&s.to_string()), s);
    }

    #[test]
    fn structured_selector() {
        let s = LabelSelector::from_label_selector_json(&json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["front", "edge"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "zone", "operator": "Exists"},
                {"key": "env", "operator": "NotIn", "values": ["dev"]}
            ]
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            s.to_string(),
            "app=web,!canary,env notin (dev),tier in (edge,front),zone"
        );
        let ok = labels(&[("app", "web"), ("tier", "edge"), ("zone", "a")]);
        assert!(s.matches(&ok));
        let mut canary = ok.clone();
        canary.insert("canary".into(), "1".into());
        assert!(!s.matches(&canary));
        let mut dev = ok.clone();
        dev.insert("env".into(), "dev".into());
        assert!(!s.matches(&dev));

        let everything = LabelSelector::from_label_selector_json(&json!({}));
        assert!(everything.is_ok_and(|s| s.matches(&BTreeMap::new())));
        let nothing = LabelSelector::from_label_selector_json(&Value::Null);
        assert!(nothing.is_ok_and(|s| !s.matches(&BTreeMap::new())));

        for bad in [
            json!({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "In"}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
            json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
            json!({"matchExpressions": [{"operator": "Exists"}]}),
            json!({"matchLabels": {"a": 1}}),
            json!({"matchLabels": {"-a": "x"}}),
            json!({"matchLabels": []}),
            json!("app=web"),
        ] {
            assert!(
                LabelSelector::from_label_selector_json(&bad).is_err(),
                "{bad} should be rejected"
            );
        }
    }

    #[test]
    fn matches_object_reads_metadata_labels() {
        let obj = json!({"metadata": {"labels": {"app": "web"}}});
        assert!(sel("app=web").matches_object(&obj));
        assert!(!sel("app=web").matches_object(&json!({})));
    }

    fn fsel(s: &str) -> FieldSelector {
        FieldSelector::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    #[test]
    fn field_selectors_on_pods() {
        let pod = json!({
            "kind": "Pod",
            "metadata": {"name": "p1", "namespace": "ns"},
            "spec": {"nodeName": "node-1", "hostNetwork": true},
            "status": {"phase": "Running"}
        });
        let pending = json!({"kind": "Pod", "metadata": {"name": "p2", "namespace": "ns"},
            "status": {"phase": "Pending"}});
        assert!(fsel("metadata.name=p1").matches(&pod));
        assert!(fsel("metadata.name==p1,metadata.namespace=ns").matches(&pod));
        assert!(!fsel("metadata.name=p1,metadata.namespace=other").matches(&pod));
        assert!(fsel("spec.nodeName=node-1").matches(&pod));
        assert!(!fsel("spec.nodeName=").matches(&pod));
        assert!(fsel("spec.nodeName=").matches(&pending));
        assert!(fsel("status.phase!=Succeeded,status.phase!=Failed").matches(&pod));
        assert!(!fsel("status.phase!=Running").matches(&pod));
        assert!(fsel("spec.hostNetwork=true").matches(&pod));
        assert!(fsel("").matches(&pod));
        assert_eq!(
            fsel("metadata.name=p1").exact_value("metadata.name"),
            Some("p1")
        );
        assert_eq!(fsel("metadata.name!=p1").exact_value("metadata.name"), None);
    }

    #[test]
    fn field_selectors_per_kind() {
        let ev = json!({"kind": "Event", "metadata": {"name": "e"},
            "involvedObject": {"kind": "Pod", "name": "p1", "uid": "u1"},
            "reason": "Scheduled", "type": "Normal", "source": {"component": "sched"}});
        assert!(fsel("involvedObject.kind=Pod,involvedObject.name=p1").matches(&ev));
        assert!(fsel("involvedObject.uid=u1,reason=Scheduled,type=Normal").matches(&ev));
        assert!(fsel("source=sched").matches(&ev));
        let job = json!({"kind": "Job", "status": {"succeeded": 3}});
        assert!(fsel("status.successful=3").matches(&job));
        let secret = json!({"kind": "Secret", "type": "kubernetes.io/tls"});
        assert!(fsel("type=kubernetes.io/tls").matches(&secret));
        // Zero values of missing fields, as in the server's field sets.
        assert!(fsel("status.successful=0").matches(&json!({"kind": "Job"})));
        assert!(fsel("spec.unschedulable=false").matches(&json!({"kind": "Node"})));
        assert!(fsel("spec.hostNetwork=false").matches(&json!({"kind": "Pod"})));
        assert!(fsel("status.replicas=0").matches(&json!({"kind": "ReplicaSet"})));
        let pod = json!({"kind": "Pod", "status": {"podIPs": [{"ip": "10.1.0.7"}]}});
        assert!(fsel("status.podIP=10.1.0.7").matches(&pod));
        // events.k8s.io/v1 shape and labels.
        let ev2 = json!({"kind": "Event", "regarding": {"kind": "Deployment", "name": "web"},
            "reportingController": "kedge-agent", "reason": "Scaled"});
        assert!(fsel("involvedObject.name=web,regarding.kind=Deployment").matches(&ev2));
        assert!(fsel("source=kedge-agent,reportingComponent=kedge-agent").matches(&ev2));
        // Each Events API accepts its own spellings only, as kube-apiserver does.
        assert!(FieldSelector::parse_for_kind("regarding.name=web", EVENTS_V1_KIND).is_ok());
        assert!(FieldSelector::parse_for_kind("regarding.name=web", "Event").is_err());
        assert!(FieldSelector::parse_for_kind("involvedObject.name=web", EVENTS_V1_KIND).is_err());
        assert!(FieldSelector::parse_for_kind("source=x", EVENTS_V1_KIND).is_err());
        assert!(FieldSelector::parse_for_kind("deprecatedSource=x", "Event").is_err());
        let events_v1 = "regarding.kind=Deployment,regarding.name=web,regarding.namespace=default,\
            regarding.uid=u,reportingController=kedge-agent,type=Normal,reason=Scaled";
        assert!(FieldSelector::parse_for_kind(events_v1, EVENTS_V1_KIND).is_ok());
        let core = "involvedObject.kind=Deployment,involvedObject.name=web,\
            involvedObject.namespace=default,involvedObject.uid=u,type=Normal,reason=Scaled,\
            source=kedge-agent,reportingComponent=kedge-agent";
        assert!(FieldSelector::parse_for_kind(core, "Event").is_ok());
        // The core labels read an events.k8s.io/v1 object and the other way round.
        let ev3 = json!({"kind": "Event", "regarding": {"kind": "Deployment", "name": "web",
            "namespace": "default", "uid": "u"}, "reportingController": "kedge-agent",
            "reason": "Scaled", "type": "Normal"});
        assert!(fsel(core).matches(&ev3));
        assert!(fsel(events_v1).matches(&ev3));
        let ev4 = json!({"kind": "Event", "involvedObject": {"kind": "Deployment", "name": "web",
            "namespace": "default", "uid": "u"}, "reportingComponent": "kedge-agent",
            "source": {"component": "kedge-agent"}, "reason": "Scaled", "type": "Normal"});
        assert!(fsel(core).matches(&ev4));
        assert!(fsel(events_v1).matches(&ev4));
        assert!(!fsel("involvedObject.uid=other").matches(&ev3));
        assert!(!fsel("regarding.name=other").matches(&ev4));

        assert!(FieldSelector::parse_for_kind("spec.nodeName=x", "Pod").is_ok());
        assert!(FieldSelector::parse_for_kind("involvedObject.name=x", "Event").is_ok());
        assert!(FieldSelector::parse_for_kind("type=Opaque", "Secret").is_ok());
        assert!(FieldSelector::parse_for_kind("metadata.name=x", "Widget").is_ok());
        assert_eq!(
            FieldSelector::parse_for_kind("spec.replicas=1", "Deployment"),
            Err(SelectorError::FieldLabelNotSupported(
                "spec.replicas".into()
            ))
        );
        assert_eq!(
            FieldSelector::parse_for_kind("metadata.name=x,spec.foo=1", "Pod")
                .map_err(|e| e.to_string()),
            Err("field label not supported: spec.foo".into())
        );
    }

    #[test]
    fn field_escapes_and_errors() {
        let s = fsel(r"metadata.name=a\,b\=c\\d");
        assert_eq!(s.terms()[0].value, r"a,b=c\d");
        assert_eq!(s.to_string(), r"metadata.name=a\,b\=c\\d");
        assert!(s.matches(&json!({"metadata": {"name": r"a,b=c\d"}})));
        for bad in [
            "metadata.name",
            r"metadata.name=a\x",
            r"a=b\",
            "a=b=c",
            "a!==",
        ] {
            assert!(FieldSelector::parse(bad).is_err(), "{bad:?}");
        }
        // Empty terms are skipped, as in apimachinery.
        assert_eq!(fsel("a=1,,b=2").terms().len(), 2);
    }

    proptest! {
        #[test]
        fn label_parser_never_panics(s in "\\PC{0,40}") {
            let _ = LabelSelector::parse(&s);
        }

        #[test]
        fn label_parser_grammar_chars_never_panic(s in "[a-z!=,() <>in/.-]{0,40}") {
            if let Ok(sel) = LabelSelector::parse(&s) {
                // What we print parses back to the same selector.
                prop_assert_eq!(LabelSelector::parse(&sel.to_string()), Ok(sel));
            }
        }

        #[test]
        fn field_parser_never_panics(s in "\\PC{0,40}") {
            if let Ok(sel) = FieldSelector::parse(&s) {
                let _ = sel.matches(&json!({"metadata": {"name": s}}));
            }
        }

        #[test]
        fn field_value_round_trips(v in "[a-z,=\\\\]{0,12}") {
            let s = FieldSelector {
                terms: vec![FieldRequirement {
                    field: "metadata.name".into(),
                    op: FieldOperator::Equals,
                    value: v.clone(),
                }],
            };
            let back = FieldSelector::parse(&s.to_string());
            prop_assert_eq!(back, Ok(s));
        }
    }
}
