//! Reading a KEDA ScaledObject's triggers from the external metrics API
//! (`external.metrics.k8s.io/v1beta1`, served by KEDA's metrics server), the way the HPA
//! does. The hub owns a shadow ScaledObject per DistributedScaledJob only to have KEDA expose
//! these values; it applies the ScaledJob math itself.

use std::collections::BTreeMap;

use axum::http::Request;
use kedge_core::crd::keda::ScaleTriggers;
use kedge_core::dsj::metrics::{Reading, target, value};
use kedge_core::dsj::scaling::TriggerMetric;
use kube::Client;
use serde::Deserialize;

/// Label KEDA's metrics server selects a ScaledObject's metrics by.
pub const SCALED_OBJECT_LABEL: &str = "scaledobject.keda.sh/name";

/// One item of an `ExternalMetricValueList`.
#[derive(Debug, Deserialize)]
struct Item {
    value: String,
}

/// `ExternalMetricValueList`.
#[derive(Debug, Deserialize)]
struct List {
    #[serde(default)]
    items: Vec<Item>,
}

/// Where each trigger of a ScaledObject is read: `triggers[i]` is published by KEDA as
/// `status.externalMetricNames[i]`.
#[derive(Clone, Copy, Debug)]
pub struct Source<'a> {
    /// Namespace of the ScaledObject.
    pub namespace: &'a str,
    /// Name of the ScaledObject.
    pub scaled_object: &'a str,
    /// `status.externalMetricNames`, in trigger order.
    pub metric_names: &'a [String],
}

/// The path of one metric of `source`.
pub fn path(source: &Source<'_>, metric: &str) -> String {
    let escape = |s: &str| {
        s.bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => {
                    char::from(b).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    format!(
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/{}/{}?labelSelector={}",
        escape(source.namespace),
        escape(metric),
        escape(&format!("{SCALED_OBJECT_LABEL}={}", source.scaled_object)),
    )
}

/// Reads every trigger (keyed by `keys[i]`, the trigger's name else its type). A trigger whose
/// target is missing from its metadata, whose metric KEDA has not published yet, or whose
/// read fails is a [`Reading::Failed`] with the reason.
pub async fn read(
    client: &Client,
    source: &Source<'_>,
    triggers: &[ScaleTriggers],
    keys: &[String],
) -> BTreeMap<String, Reading> {
    let mut out = BTreeMap::new();
    for (i, (trigger, key)) in triggers.iter().zip(keys).enumerate() {
        let reading = match (target(trigger), source.metric_names.get(i)) {
            (Err(why), _) => Reading::Failed(why),
            (Ok(_), None) => Reading::Failed(format!(
                "KEDA has not published a metric for this trigger yet (ScaledObject {}/{} \
                 status.externalMetricNames has {} entries)",
                source.namespace,
                source.scaled_object,
                source.metric_names.len()
            )),
            (Ok(target), Some(metric)) => match read_one(client, source, metric).await {
                Ok(value) => Reading::Read(TriggerMetric { value, target }),
                Err(why) => Reading::Failed(format!("reading metric {metric}: {why}")),
            },
        };
        out.insert(key.clone(), reading);
    }
    out
}

async fn read_one(client: &Client, source: &Source<'_>, metric: &str) -> Result<f64, String> {
    let request = Request::get(path(source, metric))
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let list: List = super::bounded("read an external metric", client.request(request))
        .await
        .map_err(|e| e.to_string())?;
    if list.items.is_empty() {
        return Err("KEDA returned no value".to_owned());
    }
    // KEDA returns one item per ScaledObject; several are summed, as the HPA does.
    list.items
        .iter()
        .map(|item| value(&item.value))
        .sum::<Result<f64, String>>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_selects_the_scaled_object_and_escapes() {
        let names = ["s0-rabbitmq-jobs".to_owned()];
        let source = Source {
            namespace: "team-a",
            scaled_object: "dsj-jobs",
            metric_names: &names,
        };
        assert_eq!(
            path(&source, &names[0]),
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/team-a/s0-rabbitmq-jobs\
             ?labelSelector=scaledobject.keda.sh%2Fname%3Ddsj-jobs"
        );
        assert!(path(&source, "a/b?c").contains("/a%2Fb%3Fc?"));
    }
}
