//! Validation of DSO/DSJ specs and annotations into typed, defaulted settings.
//!
//! Every check names the field it refuses (`spec.memberClusters[2].weight: must be >= 0`),
//! and all problems of a spec are reported together. The planners only accept the typed
//! settings produced here, so they never see an invalid spec.
//!
//! - this module: pause annotations, the collector of problems, checks both kinds share;
//! - [`dso`](fn@dso) in `validate/dso.rs`: a DSO into [`DsoSettings`];
//! - [`dsj`](fn@dsj) in `validate/dsj.rs`: a DSJ into [`DsjSettings`], part by part.

use std::collections::{BTreeMap, BTreeSet};
use std::num::IntErrorKind;
use std::ops::RangeInclusive;
use std::time::Duration;

use crate::crd::conditions::{ANNOTATION_PAUSED, ANNOTATION_PAUSED_REPLICAS};
use crate::crd::keda::{ScaleTriggers, trigger_key};
use crate::duration::{format_duration, parse_duration};
use crate::{Error, Result};

mod dsj;
mod dso;
#[cfg(test)]
mod tests;

pub use crate::dsj::scaling::{MultipleScalers, ScalingStrategyKind};
pub use crate::limits::{
    MAX_COOLDOWN_PERIOD, MAX_DURATION, MAX_FAILURE_THRESHOLD, MAX_JOBS, MAX_MEMBERS,
    MAX_POLLING_INTERVAL, MAX_PRIORITY, MAX_QUEUE_LENGTH_DEDUCTION, MAX_REPLICAS,
    MAX_RUNNING_JOB_PERCENTAGE, MAX_TIER, MAX_TRIGGERS, MAX_WEIGHT,
};
pub use dsj::{
    ClusterStrategy, DsjMemberSettings, DsjSettings, DuplicationPolicy, FailoverTiming,
    Propagation, Rollout, dsj,
};
pub use dso::{DsoMemberSettings, DsoSettings, dso};

/// How a resource is paused by its annotations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pause {
    /// Not paused.
    No,
    /// `autoscaling.keda.sh/paused: "true"`: nothing is changed in any member.
    Paused,
    /// `autoscaling.keda.sh/paused-replicas: N`: the total is fixed at N (DSO only); wins
    /// over `paused`.
    AtReplicas(u32),
}

/// Errors collected while validating one resource.
#[derive(Debug, Default)]
struct Problems(Vec<Error>);

impl Problems {
    fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(Error::invalid(field, message));
    }

    fn duration(&mut self, field: &str, value: Option<&str>, default: &str) -> Duration {
        let text = value.unwrap_or(default);
        match parse_duration(text) {
            Some(d) if d > MAX_DURATION => {
                self.add(
                    field,
                    format!(
                        "must be at most {} ({} days), got {text:?}",
                        format_duration(MAX_DURATION),
                        MAX_DURATION.as_secs() / 86_400
                    ),
                );
                MAX_DURATION
            }
            Some(d) => d,
            None => {
                self.add(
                    field,
                    format!("cannot parse duration {text:?} (use e.g. 30s, 1m, 1h30m)"),
                );
                Duration::ZERO
            }
        }
    }

    /// A count within `0..=max`; out of range, a problem and the nearest bound.
    fn count(&mut self, field: &str, value: i32, max: u32) -> u32 {
        match u32::try_from(value) {
            Err(_) => {
                self.add(field, format!("must be >= 0, got {value}"));
                0
            }
            Ok(n) if n > max => {
                self.add(field, format!("must be at most {max}, got {n}"));
                max
            }
            Ok(n) => n,
        }
    }

    /// A number that is not a count (seconds from 1, a signed deduction) within `range`.
    fn within(&mut self, field: &str, value: i32, range: RangeInclusive<i32>) {
        if !range.contains(&value) {
            self.add(
                field,
                format!(
                    "must be between {} and {}, got {value}",
                    range.start(),
                    range.end()
                ),
            );
        }
    }

    /// One of `choices` (name, value) by its name; `None` is `default`. An unknown name is
    /// a problem that lists the names (`expected a, b or c`), and `default`.
    fn choice<T: Copy>(
        &mut self,
        field: &str,
        what: &str,
        value: Option<&str>,
        default: T,
        choices: &[(&str, T)],
    ) -> T {
        let Some(name) = value else {
            return default;
        };
        if let Some((_, v)) = choices.iter().find(|(n, _)| *n == name) {
            return *v;
        }
        let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
        let expected = match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.join(", "),
        };
        self.add(
            field,
            format!("unknown {what} {name:?} (expected {expected})"),
        );
        default
    }

    fn finish<T>(self, value: T) -> Result<T> {
        Error::collect(self.0).map(|()| value)
    }
}

/// Reads the pause annotations. `paused` accepts Go's boolean spellings; `paused-replicas`
/// must be an integer in `0..=MAX_REPLICAS` and wins over `paused`.
pub fn pause(annotations: &BTreeMap<String, String>) -> Result<Pause> {
    let field = |name: &str| format!("metadata.annotations[{name:?}]");
    if let Some(raw) = annotations.get(ANNOTATION_PAUSED_REPLICAS) {
        let refuse =
            |message: String| Err(Error::invalid(field(ANNOTATION_PAUSED_REPLICAS), message));
        let too_large = || refuse(format!("must be at most {MAX_REPLICAS}, got {raw:?}"));
        return match raw.trim().parse::<i64>() {
            Ok(n) if n < 0 => refuse(format!("must be a non-negative integer, got {raw:?}")),
            Ok(n) => match u32::try_from(n) {
                Ok(n) if n <= MAX_REPLICAS => Ok(Pause::AtReplicas(n)),
                _ => too_large(),
            },
            Err(e) if *e.kind() == IntErrorKind::PosOverflow => too_large(),
            Err(_) => refuse(format!("must be a non-negative integer, got {raw:?}")),
        };
    }
    match annotations.get(ANNOTATION_PAUSED).map(|v| v.trim()) {
        None => Ok(Pause::No),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(Pause::Paused),
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(Pause::No),
        Some(other) => Err(Error::invalid(
            field(ANNOTATION_PAUSED),
            format!("must be \"true\" or \"false\", got {other:?}"),
        )),
    }
}

/// The length of `spec.memberClusters` and its names: not empty, no duplicates.
fn check_member_list<'a>(problems: &mut Problems, names: impl ExactSizeIterator<Item = &'a str>) {
    if names.len() > MAX_MEMBERS {
        problems.add(
            "spec.memberClusters",
            format!(
                "must have at most {MAX_MEMBERS} entries, got {}",
                names.len()
            ),
        );
    }
    let mut seen = BTreeSet::new();
    for (i, name) in names.enumerate() {
        if name.is_empty() {
            problems.add(
                format!("spec.memberClusters[{i}].name"),
                "must not be empty",
            );
        } else if !crate::limits::is_member_name(name) {
            // The schema refuses these; an object stored before it did still gets here.
            let shown: String = name.chars().take(80).collect();
            problems.add(
                format!("spec.memberClusters[{i}].name"),
                format!(
                    "{shown:?}{} is not a member name (a lowercase RFC 1123 label of at most {} characters)",
                    if shown.len() < name.len() { "…" } else { "" },
                    crate::limits::MEMBER_NAME_MAX_LENGTH
                ),
            );
        } else if !seen.insert(name) {
            problems.add(
                format!("spec.memberClusters[{i}].name"),
                format!("duplicate member {name:?}"),
            );
        }
    }
}

fn check_replica_bounds(problems: &mut Problems, prefix: &str, min: Option<i32>, max: Option<i32>) {
    if let (Some(min), Some(max)) = (min, max)
        && min > max
    {
        problems.add(
            format!("{prefix}.minReplicaCount"),
            format!("{min} is greater than maxReplicaCount {max}"),
        );
    }
}

fn check_trigger_keys(p: &mut Problems, prefix: &str, triggers: &[ScaleTriggers]) -> Vec<String> {
    if triggers.len() > MAX_TRIGGERS {
        p.add(
            format!("{prefix}.triggers"),
            format!("at most {MAX_TRIGGERS} triggers, got {}", triggers.len()),
        );
    }
    let mut seen = BTreeSet::new();
    let mut keys = Vec::with_capacity(triggers.len());
    for (i, t) in triggers.iter().enumerate() {
        if t.type_.is_empty() {
            p.add(format!("{prefix}.triggers[{i}].type"), "must not be empty");
        }
        if t.name.as_deref().is_some_and(|n| n.trim().is_empty()) {
            p.add(
                format!("{prefix}.triggers[{i}].name"),
                "must not be empty (omit it to key the trigger by its type)",
            );
        }
        let key = trigger_key(t);
        if !seen.insert(key.to_owned()) {
            p.add(
                format!("{prefix}.triggers[{i}].name"),
                format!("duplicate trigger {key:?}: give each trigger a distinct name"),
            );
        }
        keys.push(key.to_owned());
    }
    keys
}
