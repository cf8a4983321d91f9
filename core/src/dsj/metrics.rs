//! Trigger readings for a DSJ: the target average value each trigger's metadata gives, the
//! current value KEDA's metrics server returns for it, and the state shown per trigger in the
//! DSJ's status. A trigger that cannot be read is an `Error` state with the reason, never a
//! silent zero.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::scaling::TriggerMetric;
use crate::crd::keda::ScaleTriggers;
use crate::quantity::parse_quantity;

/// Metadata keys that hold a trigger's target value per Job, by KEDA scaler type (the first
/// present wins). Scalers not listed use [`GENERIC_TARGET_KEYS`].
const TARGET_KEYS: &[(&str, &[&str])] = &[
    ("rabbitmq", &["value", "queueLength"]),
    ("aws-sqs-queue", &["queueLength"]),
    ("azure-queue", &["queueLength"]),
    ("azure-servicebus", &["messageCount"]),
    ("gcp-pubsub", &["value", "subscriptionSize"]),
    ("kafka", &["lagThreshold"]),
    ("nats-jetstream", &["lagThreshold"]),
    ("redis", &["listLength"]),
    ("redis-cluster", &["listLength"]),
    (
        "redis-streams",
        &["pendingEntriesCount", "lagCount", "streamLength"],
    ),
    ("prometheus", &["threshold"]),
    ("postgresql", &["targetQueryValue"]),
    ("mysql", &["queryValue"]),
    ("mssql", &["targetValue"]),
    ("mongodb", &["queryValue"]),
    ("metrics-api", &["targetValue"]),
    ("kubernetes-resource", &["targetValue", "value"]),
    ("cron", &["desiredReplicas"]),
    ("external", &["targetValue", "value", "threshold"]),
];

/// Keys tried for scalers [`TARGET_KEYS`] does not list.
const GENERIC_TARGET_KEYS: &[&str] = &["targetValue", "value", "threshold"];

/// The target average value per Job of `trigger`, from its metadata.
pub fn target(trigger: &ScaleTriggers) -> Result<f64, String> {
    let keys = TARGET_KEYS
        .iter()
        .find(|(ty, _)| *ty == trigger.type_)
        .map_or(GENERIC_TARGET_KEYS, |(_, keys)| *keys);
    let Some((key, raw)) = keys
        .iter()
        .find_map(|k| trigger.metadata.get(*k).map(|v| (*k, v)))
    else {
        return Err(format!(
            "no target value in metadata (a {} trigger sets {})",
            trigger.type_,
            keys.join(" or ")
        ));
    };
    match raw.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("metadata.{key} {raw:?} is not a number > 0")),
    }
}

/// The value of one item of KEDA's `ExternalMetricValueList` (a Kubernetes quantity such as
/// `5`, `5500m` or `2k`).
pub fn value(quantity: &str) -> Result<f64, String> {
    let millis = parse_quantity(quantity)
        .map_err(|e| format!("metric value {quantity:?} is not a quantity: {e}"))?;
    if millis < 0 {
        return Err(format!("metric value {quantity:?} is negative"));
    }
    // Quantities are integral milli-units; f64 is exact up to 2^53 of them.
    #[allow(clippy::cast_precision_loss)]
    Ok(millis as f64 / 1000.0)
}

/// State of one trigger in a DSJ's status (`triggerMetricsStatus[].state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TriggerState {
    /// Read, and asks for Jobs (value > 0).
    Active,
    /// Read, asks for none.
    Inactive,
    /// Could not be read: nothing is created while any trigger is in this state.
    Error,
}

/// The outcome of reading one trigger.
#[derive(Clone, Debug, PartialEq)]
pub enum Reading {
    /// Read: value and target.
    Read(TriggerMetric),
    /// Why it could not be read.
    Failed(String),
}

impl Reading {
    /// The state to show.
    pub fn state(&self) -> TriggerState {
        match self {
            Reading::Read(m) if m.jobs() > 0 => TriggerState::Active,
            Reading::Read(_) => TriggerState::Inactive,
            Reading::Failed(_) => TriggerState::Error,
        }
    }

    /// Human-readable detail for `triggerMetricsStatus[].info`.
    pub fn info(&self) -> String {
        match self {
            Reading::Read(m) => format!("value {} / target {}", m.value, m.target),
            Reading::Failed(why) => why.clone(),
        }
    }
}

/// The readings that can be planned from, by trigger key; failed ones are left out, which
/// makes [`super::step::step`] create nothing.
pub fn usable(readings: &BTreeMap<String, Reading>) -> BTreeMap<String, TriggerMetric> {
    readings
        .iter()
        .filter_map(|(k, r)| match r {
            Reading::Read(m) => Some((k.clone(), *m)),
            Reading::Failed(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trigger(ty: &str, metadata: &[(&str, &str)]) -> ScaleTriggers {
        ScaleTriggers {
            type_: ty.into(),
            metadata: metadata
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..ScaleTriggers::default()
        }
    }

    #[test]
    fn targets_come_from_each_scalers_own_key() {
        for (ty, md, want) in [
            (
                "rabbitmq",
                vec![("queueName", "q"), ("value", "5")],
                Ok(5.0),
            ),
            ("rabbitmq", vec![("queueLength", "20")], Ok(20.0)),
            ("kafka", vec![("lagThreshold", "10")], Ok(10.0)),
            ("prometheus", vec![("threshold", "2.5")], Ok(2.5)),
            ("some-new-scaler", vec![("targetValue", "3")], Ok(3.0)),
        ] {
            assert_eq!(target(&trigger(ty, &md)), want, "{ty}");
        }
        for (ty, md, error) in [
            (
                "kafka",
                vec![("topic", "t")],
                "a kafka trigger sets lagThreshold",
            ),
            (
                "rabbitmq",
                vec![("value", "0")],
                "metadata.value \"0\" is not a number > 0",
            ),
            ("rabbitmq", vec![("value", "NaN")], "is not a number > 0"),
            (
                "prometheus",
                vec![("threshold", "1e400")],
                "is not a number > 0",
            ),
        ] {
            let got = target(&trigger(ty, &md)).unwrap_err();
            assert!(got.contains(error), "{ty}: {got}");
        }
    }

    #[test]
    fn values_are_quantities() {
        assert_eq!(value("5"), Ok(5.0));
        assert_eq!(value("5500m"), Ok(5.5));
        assert_eq!(value("2k"), Ok(2000.0));
        assert!(value("-1").is_err());
        assert!(value("five").is_err());
    }

    #[test]
    fn failed_readings_are_errors_and_are_not_planned_from() {
        let readings = BTreeMap::from([
            (
                "q".to_owned(),
                Reading::Read(TriggerMetric {
                    value: 3.0,
                    target: 1.0,
                }),
            ),
            (
                "idle".to_owned(),
                Reading::Read(TriggerMetric {
                    value: 0.0,
                    target: 1.0,
                }),
            ),
            ("down".to_owned(), Reading::Failed("503".into())),
        ]);
        let states: Vec<TriggerState> = readings.values().map(Reading::state).collect();
        assert_eq!(
            states,
            [
                TriggerState::Error,
                TriggerState::Inactive,
                TriggerState::Active
            ]
        );
        assert_eq!(usable(&readings).keys().collect::<Vec<_>>(), ["idle", "q"]);
    }
}
