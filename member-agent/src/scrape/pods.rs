//! Which pods of a workload are scraped, and on which port: pure functions over pods decoded
//! with only the fields they need.

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kedge_protocol::ScrapePort;
use serde::Deserialize;

use crate::jobs::facts::Condition;
use crate::lite::lite_resource;

/// A pod, decoded with only what a scrape needs.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ScrapePod {
    /// Standard metadata (without annotations and managed fields: [`crate::lite::slim_meta`]).
    #[serde(deserialize_with = "crate::lite::slim_meta")]
    pub(crate) metadata: ObjectMeta,
    /// The spec, for named ports.
    #[serde(default)]
    pub(crate) spec: Option<ScrapePodSpec>,
    /// The status: phase, conditions, IP.
    #[serde(default)]
    pub(crate) status: Option<ScrapePodStatus>,
}

/// A pod's containers, reduced to their ports.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ScrapePodSpec {
    /// Its containers.
    #[serde(default)]
    pub(crate) containers: Vec<ContainerPorts>,
}

/// A container, reduced to its ports.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ContainerPorts {
    /// `ports[]`.
    #[serde(default)]
    pub(crate) ports: Vec<ContainerPort>,
}

/// One container port.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ContainerPort {
    /// Its name, if any.
    #[serde(default)]
    pub(crate) name: Option<String>,
    /// The port number in the pod.
    #[serde(default)]
    pub(crate) container_port: i32,
}

/// The part of a pod's status a scrape needs.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ScrapePodStatus {
    /// `Pending`, `Running`, ….
    #[serde(default)]
    pub(crate) phase: Option<String>,
    /// Pod conditions.
    #[serde(default)]
    pub(crate) conditions: Option<Vec<Condition>>,
    /// `status.podIP`.
    #[serde(default, rename = "podIP")]
    pub(crate) pod_ip: Option<String>,
}

lite_resource!(ScrapePod, "", "v1", "Pod", "pods", NamespaceResourceScope);

/// A pod that serves traffic, with what reaching it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReadyPod {
    /// Pod name.
    pub(crate) name: String,
    /// `status.podIP`, as the API server has it.
    pub(crate) ip: String,
    /// Its containers' named ports.
    pub(crate) named_ports: Vec<(String, i32)>,
}

/// The pods a scrape counts, sorted by name: like the endpoints of a Service, only those
/// `Running`, `Ready` and with an IP, and not being deleted.
pub(crate) fn ready_pods<'a>(pods: impl IntoIterator<Item = &'a ScrapePod>) -> Vec<ReadyPod> {
    let mut ready: Vec<ReadyPod> = pods.into_iter().filter_map(ready_pod).collect();
    ready.sort_by(|a, b| a.name.cmp(&b.name));
    ready
}

fn ready_pod(pod: &ScrapePod) -> Option<ReadyPod> {
    let status = pod.status.as_ref()?;
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let ip = status.pod_ip.as_deref().filter(|ip| !ip.is_empty())?;
    if status.phase.as_deref() != Some("Running")
        || !ready
        || pod.metadata.deletion_timestamp.is_some()
    {
        return None;
    }
    Some(ReadyPod {
        name: pod.metadata.name.clone().unwrap_or_default(),
        ip: ip.to_owned(),
        named_ports: pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .flat_map(|c| &c.ports)
            .filter_map(|p| Some((p.name.clone()?, p.container_port)))
            .collect(),
    })
}

/// The port to scrape `pod` on: a number as given, a name looked up in its containers'
/// ports (the first container declaring it, as a Service's `targetPort` resolves it).
pub(crate) fn resolve_port(pod: &ReadyPod, port: &ScrapePort) -> Result<u16, String> {
    match port {
        ScrapePort::Number(0) => Err("port 0 is not a port".to_owned()),
        ScrapePort::Number(n) => Ok(*n),
        ScrapePort::Name(name) => {
            let (_, number) = pod
                .named_ports
                .iter()
                .find(|(n, _)| n == name)
                .ok_or_else(|| format!("no container port named {name:?}"))?;
            u16::try_from(*number)
                .ok()
                .filter(|n| *n != 0)
                .ok_or_else(|| format!("container port {name:?} is {number}, not a port"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> ScrapePod {
        serde_json::from_value(value).unwrap()
    }

    fn running(name: &str, ip: &str) -> serde_json::Value {
        json!({
            "metadata": {"name": name},
            "spec": {"containers": [
                {"name": "sidecar", "ports": [{"containerPort": 9000}]},
                {"name": "vllm", "ports": [
                    {"name": "http", "containerPort": 8000},
                    {"name": "metrics", "containerPort": 5000},
                ]},
            ]},
            "status": {"phase": "Running", "podIP": ip, "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True"},
            ]},
        })
    }

    #[test]
    fn only_running_ready_pods_with_an_ip_count() {
        let mut not_ready = running("c-not-ready", "127.1.0.3");
        not_ready["status"]["conditions"][1]["status"] = json!("False");
        let mut pending = running("d-pending", "127.1.0.4");
        pending["status"]["phase"] = json!("Pending");
        let mut no_ip = running("e-no-ip", "");
        no_ip["status"]
            .as_object_mut()
            .unwrap()
            .remove("podIP")
            .unwrap();
        let empty_ip = running("f-empty-ip", "");
        let mut deleting = running("g-deleting", "127.1.0.7");
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let mut no_conditions = running("h-no-conditions", "127.1.0.8");
        no_conditions["status"]
            .as_object_mut()
            .unwrap()
            .remove("conditions");
        let no_status = json!({"metadata": {"name": "i-no-status"}});
        let pods: Vec<ScrapePod> = [
            running("b-ready", "127.1.0.2"),
            not_ready,
            pending,
            no_ip,
            empty_ip,
            deleting,
            no_conditions,
            no_status,
            running("a-ready", "127.1.0.1"),
        ]
        .into_iter()
        .map(pod)
        .collect();
        let ready = ready_pods(&pods);
        let names: Vec<&str> = ready.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["a-ready", "b-ready"]);
        assert_eq!(ready[0].ip, "127.1.0.1");
        assert_eq!(
            ready[0].named_ports,
            [("http".to_owned(), 8000), ("metrics".to_owned(), 5000)]
        );
    }

    #[test]
    fn ports_resolve_by_number_and_by_name() {
        let ready = ready_pods(&[pod(running("p", "127.1.0.1"))]);
        let p = &ready[0];
        assert_eq!(resolve_port(p, &ScrapePort::Number(5000)), Ok(5000));
        assert_eq!(
            resolve_port(p, &ScrapePort::Name("metrics".into())),
            Ok(5000)
        );
        assert_eq!(resolve_port(p, &ScrapePort::Name("http".into())), Ok(8000));
        let missing = resolve_port(p, &ScrapePort::Name("prom".into())).unwrap_err();
        assert!(missing.contains("\"prom\""), "{missing}");
        assert!(resolve_port(p, &ScrapePort::Number(0)).is_err());
        // A port number out of range in a (hand-written) pod is not a port.
        let mut odd = p.clone();
        odd.named_ports = vec![("big".into(), 70_000), ("zero".into(), 0)];
        for name in ["big", "zero"] {
            let error = resolve_port(&odd, &ScrapePort::Name(name.into())).unwrap_err();
            assert!(error.contains("not a port"), "{error}");
        }
    }

    #[test]
    fn odd_fields_do_not_fail_the_decoding() {
        let p = pod(json!({
            "metadata": {"name": "x"},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Running", "podIP": "127.1.0.1",
                "conditions": [{"type": "Ready", "status": "True"}]},
        }));
        let ready = ready_pods(&[p]);
        assert_eq!(ready.len(), 1);
        assert!(ready[0].named_ports.is_empty());
    }
}
