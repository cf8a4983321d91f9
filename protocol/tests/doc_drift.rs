//! docs/protocol.md states what the code does; this test fails when they drift, as
//! `core/tests/crd_yaml.rs` does for the CRDs.
//!
//! The facts come from the code, not from a copied list: message variants, their payload
//! types and every struct's fields are read from the serde derives by [`trace`] (a new
//! variant or field is seen at once), the supported versions from [`is_supported_version`],
//! the close codes from [`close_code::name`]. The doc must then:
//! - give the supported range (every `` `A..=B` ``) and the version constants' values;
//! - list every `AgentMessage`/`HubMessage` variant with its payload in its Messages table,
//!   and name no variant, type or field the code lacks (`` `Type { a, b }` `` spans);
//! - name every variant of every enum that crosses the wire (codes, phases, ...);
//! - give every close code with its number, both ALPNs, and each limit constant's value.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use kedge_protocol::{AgentMessage, HubMessage, close_code, is_supported_version};
use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, Visitor};

// ---------------------------------------------------------------------------------------
// What the code says, read from the serde derives.

/// The shape of the wire types reachable from the traced roots.
#[derive(Debug, Default)]
struct Shapes {
    /// Struct name → field names.
    structs: BTreeMap<&'static str, Vec<&'static str>>,
    /// Enum name → variant names.
    enums: BTreeMap<&'static str, Vec<&'static str>>,
    /// (enum, variant) → name of its payload type (`()` for a unit variant).
    payloads: BTreeMap<(&'static str, &'static str), String>,
}

#[derive(Default)]
struct TraceState {
    shapes: Shapes,
    /// (enum, variant index) already taken in some pass.
    explored: BTreeSet<(&'static str, usize)>,
    /// Times each enum was deserialized: once every variant was taken, they are taken in
    /// turn, so that variants reached only through another enum's variant are reached too.
    visits: BTreeMap<&'static str, usize>,
    /// Whether this pass took a variant never taken before.
    progressed: bool,
    /// The newtype variant whose payload is being deserialized next.
    pending: Option<(&'static str, &'static str)>,
}

#[derive(Debug)]
struct TraceError(String);

impl std::fmt::Display for TraceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TraceError {}

impl de::Error for TraceError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Self(msg.to_string())
    }
}

/// A deserializer that builds a value of any serde-derived type out of nothing, recording
/// every struct, enum and variant on the way. Each pass takes, in each enum, a variant not
/// taken before (then each in turn); passes repeat until no new variant turns up.
#[derive(Clone, Copy)]
struct Tracer<'a>(&'a RefCell<TraceState>);

impl Tracer<'_> {
    fn payload(&self, name: &str) {
        let mut state = self.0.borrow_mut();
        if let Some(variant) = state.pending.take() {
            state.shapes.payloads.insert(variant, name.to_owned());
        }
    }
}

macro_rules! primitive {
    ($($method:ident => $visit:ident($value:expr), $name:literal;)*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TraceError> {
            self.payload($name);
            visitor.$visit($value)
        }
    )*};
}

impl<'de> Deserializer<'de> for Tracer<'_> {
    type Error = TraceError;

    primitive! {
        deserialize_bool => visit_bool(false), "bool";
        deserialize_i8 => visit_i8(0), "i8";
        deserialize_i16 => visit_i16(0), "i16";
        deserialize_i32 => visit_i32(0), "i32";
        deserialize_i64 => visit_i64(0), "i64";
        deserialize_u8 => visit_u8(0), "u8";
        deserialize_u16 => visit_u16(0), "u16";
        deserialize_u32 => visit_u32(0), "u32";
        deserialize_u64 => visit_u64(0), "u64";
        deserialize_f32 => visit_f32(0.0), "f32";
        deserialize_f64 => visit_f64(0.0), "f64";
        deserialize_char => visit_char('x'), "char";
        deserialize_str => visit_string(String::new()), "String";
        deserialize_string => visit_string(String::new()), "String";
        deserialize_bytes => visit_byte_buf(Vec::new()), "Vec<u8>";
        deserialize_byte_buf => visit_byte_buf(Vec::new()), "Vec<u8>";
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TraceError> {
        self.payload("()");
        visitor.visit_unit()
    }

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, TraceError> {
        Err(de::Error::custom("not a self-describing format"))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TraceError> {
        self.payload("Option");
        visitor.visit_some(self)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, TraceError> {
        self.payload(name);
        visitor.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, TraceError> {
        self.payload(name);
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, TraceError> {
        self.payload("Vec");
        // One element, so that the element type is traced too.
        visitor.visit_seq(Elements(self, 1))
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, TraceError> {
        self.payload("tuple");
        visitor.visit_seq(Elements(self, len))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, TraceError> {
        self.payload(name);
        visitor.visit_seq(Elements(self, len))
    }

    fn deserialize_map<V: Visitor<'de>>(self, _: V) -> Result<V::Value, TraceError> {
        Err(de::Error::custom("maps do not cross the wire"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, TraceError> {
        self.payload(name);
        self.0
            .borrow_mut()
            .shapes
            .structs
            .insert(name, fields.to_vec());
        visitor.visit_seq(Elements(self, fields.len()))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, TraceError> {
        self.payload(name);
        let index = {
            let mut state = self.0.borrow_mut();
            state.shapes.enums.insert(name, variants.to_vec());
            let fresh = (0..variants.len()).find(|i| !state.explored.contains(&(name, *i)));
            let visits = state.visits.entry(name).or_default();
            *visits += 1;
            let index = fresh.unwrap_or(*visits % variants.len());
            if fresh.is_some() {
                state.explored.insert((name, index));
                state.progressed = true;
            }
            index
        };
        visitor.visit_enum(Variant(self, name, variants[index], index as u32))
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, _: V) -> Result<V::Value, TraceError> {
        Err(de::Error::custom("identifiers are read through enums"))
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, TraceError> {
        Err(de::Error::custom("nothing is ignored"))
    }
}

struct Elements<'a>(Tracer<'a>, usize);

impl<'de> de::SeqAccess<'de> for Elements<'_> {
    type Error = TraceError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, TraceError> {
        if self.1 == 0 {
            return Ok(None);
        }
        self.1 -= 1;
        seed.deserialize(self.0).map(Some)
    }
}

struct Variant<'a>(Tracer<'a>, &'static str, &'static str, u32);

impl<'de> de::EnumAccess<'de> for Variant<'_> {
    type Error = TraceError;
    type Variant = Self;

    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Self), TraceError> {
        let index: de::value::U32Deserializer<TraceError> = self.3.into_deserializer();
        Ok((seed.deserialize(index)?, self))
    }
}

impl<'de> de::VariantAccess<'de> for Variant<'_> {
    type Error = TraceError;

    fn unit_variant(self) -> Result<(), TraceError> {
        let mut state = self.0.0.borrow_mut();
        state.shapes.payloads.insert((self.1, self.2), "()".into());
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<T::Value, TraceError> {
        self.0.0.borrow_mut().pending = Some((self.1, self.2));
        seed.deserialize(self.0)
    }

    fn tuple_variant<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, TraceError> {
        self.0.0.borrow_mut().pending = Some((self.1, self.2));
        self.0.deserialize_tuple(len, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, TraceError> {
        self.0.0.borrow_mut().pending = Some((self.1, self.2));
        self.0.deserialize_struct(self.2, fields, visitor)
    }
}

/// Every struct, enum, variant and payload reachable from the two message enums (and the
/// enrollment messages, which travel on their own connection).
fn trace() -> Shapes {
    let state = RefCell::new(TraceState::default());
    // Passes without a new variant before the search gives up: far more than the product
    // of the enums' sizes along any path of nested enums on the wire.
    let mut idle = 0;
    while idle < 256 {
        state.borrow_mut().progressed = false;
        let tracer = Tracer(&state);
        AgentMessage::deserialize_with(tracer);
        HubMessage::deserialize_with(tracer);
        kedge_protocol::EnrollRequest::deserialize_with(tracer);
        idle = if state.borrow().progressed {
            0
        } else {
            idle + 1
        };
    }
    state.into_inner().shapes
}

trait DeserializeWith {
    fn deserialize_with(tracer: Tracer<'_>);
}

impl<T: serde::de::DeserializeOwned> DeserializeWith for T {
    fn deserialize_with(tracer: Tracer<'_>) {
        if let Err(e) = T::deserialize(tracer) {
            panic!("{} does not trace: {e}", std::any::type_name::<T>());
        }
    }
}

/// The constants the doc states, with their values.
fn constants() -> BTreeMap<&'static str, u64> {
    use kedge_protocol as p;
    BTreeMap::from([
        ("PROTOCOL_VERSION", u64::from(p::PROTOCOL_VERSION)),
        ("MIN_PROTOCOL_VERSION", u64::from(p::MIN_PROTOCOL_VERSION)),
        (
            "RENEWAL_PROTOCOL_VERSION",
            u64::from(p::RENEWAL_PROTOCOL_VERSION),
        ),
        (
            "PODMETRICS_PROTOCOL_VERSION",
            u64::from(p::PODMETRICS_PROTOCOL_VERSION),
        ),
        ("DEFAULT_PORT", u64::from(p::DEFAULT_PORT)),
        ("MAX_FRAME_BYTES", p::MAX_FRAME_BYTES as u64),
        ("SESSION_STREAMS", u64::from(p::SESSION_STREAMS)),
        ("MAX_REF_BYTES", p::MAX_REF_BYTES as u64),
        ("MAX_TEXT_BYTES", p::MAX_TEXT_BYTES as u64),
        ("MAX_MESSAGE_BYTES", p::MAX_MESSAGE_BYTES as u64),
        ("MAX_POD_CONDITION_SETS", p::MAX_POD_CONDITION_SETS as u64),
        ("MAX_POD_CONDITION_TYPES", p::MAX_POD_CONDITION_TYPES as u64),
        ("MAX_SCRAPE_TARGETS", p::MAX_SCRAPE_TARGETS as u64),
        ("MAX_SAMPLE_PODS", u64::from(p::MAX_SAMPLE_PODS)),
        ("MIN_SCRAPE_INTERVAL_MS", p::MIN_SCRAPE_INTERVAL_MS),
    ])
}

/// Close code → its constant's name, from [`close_code::name`].
fn close_codes() -> BTreeMap<u64, String> {
    (0..=u64::from(u16::MAX))
        .map(|code| (code, close_code::name(code)))
        .filter(|(_, name)| *name != "unknown")
        .map(|(code, name)| (code, name.to_uppercase()))
        .collect()
}

/// The supported protocol versions, from [`is_supported_version`]: one contiguous range.
fn supported_range() -> (u16, u16) {
    let supported: Vec<u16> = (0..=u16::MAX)
        .filter(|v| is_supported_version(*v))
        .collect();
    let (min, max) = (supported[0], supported[supported.len() - 1]);
    assert_eq!(
        supported.len(),
        usize::from(max - min) + 1,
        "one contiguous range"
    );
    (min, max)
}

// ---------------------------------------------------------------------------------------
// What the doc says.

fn doc() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md");
    std::fs::read_to_string(path).expect("docs/protocol.md")
}

/// The text of every `` `code span` ``.
fn spans(doc: &str) -> Vec<&str> {
    doc.split('`').skip(1).step_by(2).collect()
}

/// The lines of the section under `heading` (up to the next heading of any level).
fn section<'d>(doc: &'d str, heading: &str) -> Vec<&'d str> {
    doc.lines()
        .skip_while(|l| l.trim() != heading)
        .skip(1)
        .take_while(|l| !l.starts_with('#'))
        .collect()
}

/// The cells of a Markdown table row, or `None` for other lines and the separator.
fn cells(line: &str) -> Option<Vec<&str>> {
    let row = line.trim().strip_prefix('|')?.strip_suffix('|')?;
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    (!cells[0].starts_with("--")).then_some(cells)
}

fn unquote(cell: &str) -> &str {
    cell.trim_matches('`')
}

/// A number as the doc writes it: `4194304`, `100,000`, `4 MiB`, `1 KiB`.
fn quantity(cell: &str) -> Option<u64> {
    let cell = cell.replace(['`', ','], "");
    let mut words = cell.split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    Some(match words.next() {
        Some("KiB") => n * 1024,
        Some("MiB") => n * 1024 * 1024,
        _ => n,
    })
}

fn is_screaming(word: &str) -> bool {
    word.len() > 2
        && word.contains('_')
        && word
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// Identifiers in a span: runs of letters, digits and `_`.
fn words(span: &str) -> impl Iterator<Item = &str> {
    span.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
}

// ---------------------------------------------------------------------------------------
// The checks. Each collects every disagreement, so one run shows all of them.

fn report(problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "docs/protocol.md disagrees with the code:\n- {}",
        problems.join("\n- ")
    );
}

#[test]
fn versions_match() {
    let doc = doc();
    let (min, max) = supported_range();
    assert_eq!(
        (min, max),
        (
            kedge_protocol::MIN_PROTOCOL_VERSION,
            kedge_protocol::PROTOCOL_VERSION
        )
    );
    let mut problems = Vec::new();
    let ranges: Vec<&str> = spans(&doc)
        .into_iter()
        .filter(|s| {
            s.contains("..=")
                && s.chars()
                    .all(|c| c.is_ascii_digit() || c == '.' || c == '=')
        })
        .collect();
    if ranges.is_empty() {
        problems.push(format!("no supported range `{min}..={max}`"));
    }
    for range in ranges {
        if range != format!("{min}..={max}") {
            problems.push(format!(
                "says versions `{range}`, the code accepts `{min}..={max}`"
            ));
        }
    }
    report(problems);
}

#[test]
fn constants_match() {
    let doc = doc();
    let code = constants();
    let codes = close_codes();
    let mut problems = Vec::new();
    let mut stated = BTreeSet::new();
    for row in doc.lines().filter_map(cells) {
        let name = unquote(row[0]);
        if !is_screaming(name) || row[0] == name {
            continue;
        }
        stated.insert(name);
        match (code.get(name), row.get(1).and_then(|c| quantity(c))) {
            (None, _) => problems.push(format!("table names `{name}`, which the code lacks")),
            (Some(_), None) => problems.push(format!("`{name}` has no number in its row")),
            (Some(want), Some(got)) if *want != got => {
                problems.push(format!("`{name}` is {got} in the doc, {want} in the code"))
            }
            _ => {}
        }
    }
    for name in code.keys().filter(|n| !stated.contains(*n)) {
        problems.push(format!("`{name}` has no row in a table"));
    }
    // Any other constant the prose names must exist.
    for word in spans(&doc)
        .into_iter()
        .flat_map(words)
        .filter(|w| is_screaming(w))
    {
        if !code.contains_key(word) && !codes.values().any(|c| c == word) {
            problems.push(format!("names `{word}`, which the code lacks"));
        }
    }
    report(problems);
}

#[test]
fn close_codes_match() {
    // The constants agree with the names the logs use.
    for (value, name) in [
        (close_code::SHUTDOWN, "shutdown"),
        (close_code::PROTOCOL_ERROR, "protocol_error"),
        (close_code::REFUSED, "refused"),
        (close_code::REPLACED, "replaced"),
        (close_code::REVOKED, "revoked"),
        (close_code::BAD_IDENTITY, "bad_identity"),
        (close_code::HEARTBEAT_TIMEOUT, "heartbeat_timeout"),
        (close_code::CERT_EXPIRED, "cert_expired"),
        (close_code::RECONNECT, "reconnect"),
    ] {
        assert_eq!(close_code::name(value.into()), name);
    }
    let doc = doc();
    let table: BTreeMap<u64, String> = section(&doc, "## Close codes")
        .into_iter()
        .filter_map(cells)
        .filter_map(|row| Some((row[0].parse().ok()?, unquote(row[1]).to_owned())))
        .collect();
    assert_eq!(table, close_codes(), "the Close codes table (code → name)");
}

#[test]
fn alpns_match() {
    let doc = doc();
    let code: BTreeSet<String> = [kedge_protocol::ALPN, kedge_protocol::ENROLL_ALPN]
        .into_iter()
        .map(|a| String::from_utf8(a.to_vec()).expect("ALPN is text"))
        .collect();
    let named: BTreeSet<String> = spans(&doc)
        .into_iter()
        .filter(|s| {
            s.starts_with("kedge")
                && s.split_once('/')
                    .is_some_and(|(_, v)| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit()))
        })
        .map(str::to_owned)
        .collect();
    assert_eq!(named, code, "ALPNs named in the doc");
}

#[test]
fn messages_match() {
    let doc = doc();
    let shapes = trace();
    let mut problems = Vec::new();

    // The Messages table lists every variant of both directions with its payload.
    let mut listed = BTreeSet::new();
    for row in section(&doc, "## Messages").into_iter().filter_map(cells) {
        let Some((enum_name, rest)) = unquote(row[0]).split_once("::") else {
            continue;
        };
        let (variant, payload) = match rest.split_once('(') {
            Some((v, p)) => (v, p.trim_end_matches(')')),
            None => (rest, "()"),
        };
        listed.insert((enum_name.to_owned(), variant.to_owned()));
        match shapes
            .payloads
            .iter()
            .find(|((e, v), _)| *e == enum_name && *v == variant)
        {
            None => problems.push(format!(
                "Messages lists `{enum_name}::{variant}`, which the code lacks"
            )),
            Some((_, p)) if p != payload => problems.push(format!(
                "Messages gives `{enum_name}::{variant}` the payload `{payload}`, the code `{p}`"
            )),
            _ => {}
        }
    }
    for enum_name in ["AgentMessage", "HubMessage"] {
        for variant in &shapes.enums[enum_name] {
            if !listed.contains(&(enum_name.to_owned(), (*variant).to_owned())) {
                problems.push(format!("Messages lacks `{enum_name}::{variant}`"));
            }
        }
    }

    let variants: BTreeSet<&str> = shapes.enums.values().flatten().copied().collect();
    let types: BTreeSet<&str> = shapes
        .structs
        .keys()
        .chain(shapes.enums.keys())
        .copied()
        .collect();
    // Words the doc may use in code spans that are not protocol types: Rust's Option, a
    // Kubernetes condition status and the member state the hub sets.
    let other = ["Some", "None", "True", "Unreachable"];
    for span in spans(&doc) {
        // `Enum::Variant` names a variant of that enum (`Enum::method` is not checked).
        for (enum_name, rest) in span.split(' ').filter_map(|s| s.split_once("::")) {
            let variant = words(rest).next().unwrap_or_default();
            if let Some(all) = shapes.enums.get(enum_name)
                && variant.starts_with(char::is_uppercase)
                && !all.contains(&variant)
            {
                problems.push(format!(
                    "names `{enum_name}::{variant}`, which the code lacks"
                ));
            }
        }
        // `Type { a, b: x }` names fields the struct has.
        if let Some((head, body)) = span.split_once('{') {
            let ty = words(head).last().unwrap_or_default();
            if !ty.starts_with(|c: char| c.is_ascii_uppercase()) {
                continue; // a metric with labels
            }
            let body = body.split_once('}').map_or(body, |(inside, _)| inside);
            let fields = body
                .split(',')
                .map(|f| f.split(':').next().unwrap_or_default().trim());
            match shapes.structs.get(ty) {
                None => problems.push(format!("`{span}`: `{ty}` is not a struct on the wire")),
                Some(have) => {
                    for field in fields.filter(|f| !f.is_empty() && *f != "..") {
                        if !have.contains(&field) {
                            problems.push(format!("`{span}`: `{ty}` has no field `{field}`"));
                        }
                    }
                }
            }
        }
        // Every capitalised word is a type, a variant or one of `other`.
        for word in words(span) {
            let camel = word.starts_with(|c: char| c.is_ascii_uppercase())
                && word.contains(|c: char| c.is_ascii_lowercase());
            if camel
                && !types.contains(word)
                && !variants.contains(word)
                && !other.contains(&word)
                && !["AgentMessage", "HubMessage"].contains(&word)
            {
                problems.push(format!("names `{word}`, which is no wire type or variant"));
            }
        }
    }

    // Every variant of every enum on the wire (messages, codes, phases) is named.
    let named: BTreeSet<&str> = spans(&doc).into_iter().flat_map(words).collect();
    for (enum_name, all) in &shapes.enums {
        for variant in all {
            if !named.contains(variant) {
                problems.push(format!("never names `{enum_name}::{variant}`"));
            }
        }
    }
    report(problems);
}
