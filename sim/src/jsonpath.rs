//! The JSONPath subset CRD `additionalPrinterColumns` use (k8s.io/client-go/util/jsonpath
//! syntax): `.a.b`, `.a[0]` (negative indices count from the end), `.a[*].b`, `.a.*`,
//! `['a.b']`, escaped dots (`.labels.app\.kubernetes\.io/name`), and filters
//! `[?(@.type=="Ready")]` with `==`, `!=`, `<`, `<=`, `>`, `>=` against string, number and
//! boolean literals, or `[?(@.field)]` for presence. An optional `$` and surrounding `{}`
//! are accepted. Not supported: recursive descent (`..`), slices, unions, `range`.

use serde_json::Value;

/// Why a JSONPath expression was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonPathError {
    /// The expression is outside the supported grammar.
    #[error("unrecognized JSONPath {expr:?} at offset {offset}: {reason}")]
    Syntax {
        /// The expression.
        expr: String,
        /// Byte offset of the problem.
        offset: usize,
        /// What was expected.
        reason: &'static str,
    },
}

/// Result alias for this module.
pub type Result<T, E = JsonPathError> = std::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Field(String),
    Index(i64),
    Wildcard,
    Filter(Filter),
}

#[derive(Debug, Clone, PartialEq)]
struct Filter {
    path: Vec<Step>,
    test: Option<(CmpOp, Value)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A parsed JSONPath expression.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonPath {
    steps: Vec<Step>,
}

struct Parser<'a> {
    expr: &'a str,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn err<T>(&self, reason: &'static str) -> Result<T> {
        Err(JsonPathError::Syntax {
            expr: self.expr.to_owned(),
            offset: self.pos,
            reason,
        })
    }

    fn peek(&self) -> Option<char> {
        self.expr.get(self.pos..).and_then(|s| s.chars().next())
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    /// Steps until the end or a character in `stop`.
    fn steps(&mut self, stop: &[char]) -> Result<Vec<Step>> {
        let mut steps = Vec::new();
        loop {
            match self.peek() {
                None => return Ok(steps),
                Some(c) if stop.contains(&c) => return Ok(steps),
                Some('.') => {
                    self.pos += 1;
                    if self.eat('*') {
                        steps.push(Step::Wildcard);
                        continue;
                    }
                    if self.peek() == Some('.') {
                        return self.err("recursive descent is not supported");
                    }
                    let name = self.identifier(stop)?;
                    if name.is_empty() {
                        if self.peek().is_none() && steps.is_empty() {
                            // "." alone selects the whole object.
                            return Ok(steps);
                        }
                        return self.err("expected a field name after '.'");
                    }
                    steps.push(Step::Field(name));
                }
                Some('[') => {
                    self.pos += 1;
                    steps.push(self.bracket()?);
                }
                Some(_) => return self.err("expected '.' or '['"),
            }
        }
    }

    fn identifier(&mut self, stop: &[char]) -> Result<String> {
        let mut name = String::new();
        while let Some(c) = self.peek() {
            if c == '\\' {
                self.pos += 1;
                match self.bump() {
                    Some(e) => name.push(e),
                    None => return self.err("dangling escape"),
                }
                continue;
            }
            if c == '.' || c == '[' || c == ']' || stop.contains(&c) || c.is_whitespace() {
                break;
            }
            name.push(c);
            self.pos += c.len_utf8();
        }
        Ok(name)
    }

    fn bracket(&mut self) -> Result<Step> {
        self.skip_ws();
        let step = match self.peek() {
            Some('*') => {
                self.pos += 1;
                Step::Wildcard
            }
            Some('\'' | '"') => match self.literal()? {
                Value::String(s) => Step::Field(s),
                _ => return self.err("expected a quoted field name"),
            },
            Some('?') => {
                self.pos += 1;
                self.skip_ws();
                if !self.eat('(') {
                    return self.err("expected '(' after '?'");
                }
                self.skip_ws();
                if !self.eat('@') {
                    return self.err("expected '@' in filter");
                }
                let path = self.steps(&[')', '=', '!', '<', '>', ' '])?;
                self.skip_ws();
                let op = if self
                    .expr
                    .get(self.pos..)
                    .is_some_and(|s| s.starts_with("=="))
                {
                    Some(CmpOp::Eq)
                } else if self
                    .expr
                    .get(self.pos..)
                    .is_some_and(|s| s.starts_with("!="))
                {
                    Some(CmpOp::Ne)
                } else if self
                    .expr
                    .get(self.pos..)
                    .is_some_and(|s| s.starts_with("<="))
                {
                    Some(CmpOp::Le)
                } else if self
                    .expr
                    .get(self.pos..)
                    .is_some_and(|s| s.starts_with(">="))
                {
                    Some(CmpOp::Ge)
                } else if self.peek() == Some('<') {
                    Some(CmpOp::Lt)
                } else if self.peek() == Some('>') {
                    Some(CmpOp::Gt)
                } else {
                    None
                };
                let test = match op {
                    None => None,
                    Some(op) => {
                        self.pos += if matches!(op, CmpOp::Lt | CmpOp::Gt) {
                            1
                        } else {
                            2
                        };
                        self.skip_ws();
                        Some((op, self.literal()?))
                    }
                };
                self.skip_ws();
                if !self.eat(')') {
                    return self.err("expected ')' closing the filter");
                }
                Step::Filter(Filter { path, test })
            }
            Some(c) if c == '-' || c.is_ascii_digit() => {
                let start = self.pos;
                self.pos += 1;
                while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                    self.pos += 1;
                }
                match self.expr.get(start..self.pos).and_then(|s| s.parse().ok()) {
                    Some(i) => Step::Index(i),
                    None => return self.err("expected an index"),
                }
            }
            _ => return self.err("expected '*', an index, a quoted name or a filter"),
        };
        self.skip_ws();
        if !self.eat(']') {
            return self.err("expected ']'");
        }
        Ok(step)
    }

    fn literal(&mut self) -> Result<Value> {
        match self.peek() {
            Some(q @ ('\'' | '"')) => {
                self.pos += 1;
                let mut s = String::new();
                loop {
                    match self.bump() {
                        None => return self.err("unterminated string"),
                        Some('\\') => match self.bump() {
                            Some(e) => s.push(e),
                            None => return self.err("unterminated string"),
                        },
                        Some(c) if c == q => return Ok(Value::String(s)),
                        Some(c) => s.push(c),
                    }
                }
            }
            _ => {
                let start = self.pos;
                while self
                    .peek()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'))
                {
                    self.pos += 1;
                }
                let word = self.expr.get(start..self.pos).unwrap_or("");
                match word {
                    "true" => Ok(Value::Bool(true)),
                    "false" => Ok(Value::Bool(false)),
                    "null" | "nil" => Ok(Value::Null),
                    _ => match serde_json::from_str::<serde_json::Number>(word) {
                        Ok(n) => Ok(Value::Number(n)),
                        Err(_) => self.err("expected a literal"),
                    },
                }
            }
        }
    }
}

impl JsonPath {
    /// Parses an expression such as `.status.conditions[?(@.type=="Ready")].status`.
    pub fn parse(expr: &str) -> Result<Self> {
        let mut inner = expr.trim();
        if let Some(s) = inner.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            inner = s.trim();
        }
        let inner = inner.strip_prefix('$').unwrap_or(inner);
        let mut p = Parser {
            expr: inner,
            pos: 0,
        };
        if p.peek().is_some_and(|c| c != '.' && c != '[') {
            return p.err("a path must start with '.' or '['");
        }
        let steps = p.steps(&[])?;
        Ok(JsonPath { steps })
    }

    /// Every value the path selects, in document order.
    pub fn find<'v>(&self, root: &'v Value) -> Vec<&'v Value> {
        walk(&self.steps, vec![root])
    }
}

fn walk<'v>(steps: &[Step], mut current: Vec<&'v Value>) -> Vec<&'v Value> {
    for step in steps {
        let mut next = Vec::new();
        for v in current {
            match (step, v) {
                (Step::Field(f), Value::Object(m)) => next.extend(m.get(f)),
                (Step::Index(i), Value::Array(a)) => {
                    let idx = if *i < 0 {
                        i64::try_from(a.len()).ok().and_then(|n| n.checked_add(*i))
                    } else {
                        Some(*i)
                    };
                    next.extend(
                        idx.and_then(|i| usize::try_from(i).ok())
                            .and_then(|i| a.get(i)),
                    );
                }
                (Step::Wildcard, Value::Array(a)) => next.extend(a.iter()),
                (Step::Wildcard, Value::Object(m)) => next.extend(m.values()),
                (Step::Filter(f), Value::Array(a)) => {
                    next.extend(a.iter().filter(|e| filter_holds(f, e)));
                }
                (Step::Filter(f), Value::Object(_)) if filter_holds(f, v) => next.push(v),
                _ => {}
            }
        }
        current = next;
    }
    current
}

fn filter_holds(f: &Filter, elem: &Value) -> bool {
    let found = walk(&f.path, vec![elem]);
    let Some((op, lit)) = &f.test else {
        return !found.is_empty();
    };
    found.iter().any(|v| compare(v, *op, lit))
}

fn compare(v: &Value, op: CmpOp, lit: &Value) -> bool {
    let ord = match (v, lit) {
        (Value::Number(a), Value::Number(b)) => a
            .as_f64()
            .zip(b.as_f64())
            .and_then(|(a, b)| a.partial_cmp(&b)),
        (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
        (a, b) => {
            return match op {
                CmpOp::Eq => a == b,
                CmpOp::Ne => a != b,
                _ => false,
            };
        }
    };
    let Some(ord) = ord else { return false };
    match op {
        CmpOp::Eq => ord.is_eq(),
        CmpOp::Ne => ord.is_ne(),
        CmpOp::Lt => ord.is_lt(),
        CmpOp::Le => ord.is_le(),
        CmpOp::Gt => ord.is_gt(),
        CmpOp::Ge => ord.is_ge(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn find(expr: &str, v: &Value) -> Vec<Value> {
        match JsonPath::parse(expr) {
            Ok(p) => p.find(v).into_iter().cloned().collect(),
            Err(e) => panic!("{expr}: {e}"),
        }
    }

    #[test]
    fn paths() {
        let v = json!({
            "metadata": {"name": "x", "labels": {"app.kubernetes.io/name": "web"}},
            "spec": {"replicas": 3, "items": [{"n": 1}, {"n": 2}, {"m": 3}]},
            "status": {"conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "Synced", "status": "False", "count": 5}
            ]}
        });
        assert_eq!(find(".metadata.name", &v), vec![json!("x")]);
        assert_eq!(find("{.spec.replicas}", &v), vec![json!(3)]);
        assert_eq!(find("$.spec.replicas", &v), vec![json!(3)]);
        assert_eq!(find(".spec.items[0].n", &v), vec![json!(1)]);
        assert_eq!(find(".spec.items[-1].m", &v), vec![json!(3)]);
        assert_eq!(find(".spec.items[7]", &v), Vec::<Value>::new());
        assert_eq!(find(".spec.items[*].n", &v), vec![json!(1), json!(2)]);
        assert_eq!(find(".spec.items.*.n", &v), vec![json!(1), json!(2)]);
        assert_eq!(
            find(".status.conditions[?(@.type==\"Ready\")].status", &v),
            vec![json!("True")]
        );
        assert_eq!(
            find(".status.conditions[?(@.type == 'Synced')].status", &v),
            vec![json!("False")]
        );
        assert_eq!(
            find(".status.conditions[?(@.type!=\"Ready\")].type", &v),
            vec![json!("Synced")]
        );
        assert_eq!(
            find(".status.conditions[?(@.count>4)].type", &v),
            vec![json!("Synced")]
        );
        assert_eq!(
            find(".status.conditions[?(@.count)].type", &v),
            vec![json!("Synced")]
        );
        assert_eq!(
            find(".metadata.labels.app\\.kubernetes\\.io/name", &v),
            vec![json!("web")]
        );
        assert_eq!(
            find(".metadata.labels['app.kubernetes.io/name']", &v),
            vec![json!("web")]
        );
        assert_eq!(find(".nope.deeper", &v), Vec::<Value>::new());
        assert_eq!(find(".", &v), vec![v.clone()]);
    }

    #[test]
    fn syntax_errors() {
        for bad in [
            "spec",
            ".a[",
            ".a[x]",
            ".a[?(@.b==)]",
            "..a",
            ".a[?(@.b=='x']",
            ".a.",
            ".a[1:2]",
        ] {
            assert!(JsonPath::parse(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn never_panics(s in "[.\\[\\]?()@=!<>'\"*a-c0-9$ {}\\\\-]{0,30}") {
            if let Ok(p) = JsonPath::parse(&s) {
                let _ = p.find(&json!({"a": [{"b": 1}, {"c": "x"}], "b": {"c": [1, 2]}}));
            }
        }

        #[test]
        fn never_panics_any(s in "\\PC{0,30}") {
            let _ = JsonPath::parse(&s);
        }
    }
}
