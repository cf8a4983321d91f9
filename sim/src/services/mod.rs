//! Services of type `LoadBalancer`: an external address on loopback and a real forwarder.
//!
//! A cloud's load-balancer controller gives each `LoadBalancer` Service an address and sends
//! what arrives there to the Service's ready endpoints. kedge-sim does the same on the host:
//! the Service gets a loopback address unique in the process (from the pool pod IPs come
//! from, see [`crate::pod_ips`]) in `status.loadBalancer.ingress[0].ip`, and every port of
//! the Service (TCP or UDP) listens on that address and forwards to the `podIP:targetPort`
//! of a Ready pod the selector matches ([`forward`]). Pods that run real processes (a hub
//! installed by its chart, say) are then reachable the way a client outside the cluster
//! reaches them: through the Service's external IP.
//!
//! The decision (address, endpoints) is made under the store lock by [`reconcile`]; the
//! sockets live in tasks [`run`] keeps in step with it, so no I/O happens under the lock.

mod forward;
pub mod published;

pub use published::{Forwards, Frontend, LoadBalancers, Protocol};

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use serde_json::{Value, json};

use crate::cluster::ClusterShared;
use crate::store::{Obj, Store, WriteScope, deleting};
use crate::util::{get_path, meta_mut, meta_str};

const SERVICES: &str = "/services";
const PODS: &str = "/pods";

/// Gives every `LoadBalancer` Service its address and publishes the forwards of all of them.
pub(crate) fn reconcile(store: &mut Store, lbs: &LoadBalancers, now: i64) {
    let services: Vec<Obj> = store
        .list(SERVICES, None)
        .filter(|s| {
            !deleting(s) && get_path(s, "spec.type").and_then(Value::as_str) == Some("LoadBalancer")
        })
        .cloned()
        .collect();
    let pods: Vec<Obj> = if services.is_empty() {
        Vec::new()
    } else {
        store.list(PODS, None).cloned().collect()
    };
    let mut forwards = Forwards::new();
    for svc in services {
        let Some(ip) = ingress_ip(store, &svc, now) else {
            continue;
        };
        let backends: Vec<&Obj> = pods.iter().filter(|p| backs(&svc, p)).collect();
        for port in get_path(&svc, "spec.ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some((frontend, target)) = frontend(ip, port) else {
                continue;
            };
            let endpoints = backends
                .iter()
                .filter_map(|p| endpoint(p, &target, frontend.protocol))
                .collect();
            forwards.insert(frontend, endpoints);
        }
    }
    lbs.publish(forwards);
}

/// The Service's external address: the one in its status, else a new one written there.
fn ingress_ip(store: &mut Store, svc: &Value, now: i64) -> Option<IpAddr> {
    let uid = meta_str(svc, "uid")?.to_owned();
    let ip = IpAddr::V4(store.pod_ip(&uid)?);
    let shown = get_path(svc, "status.loadBalancer.ingress.0.ip").and_then(Value::as_str);
    if shown != Some(ip.to_string().as_str()) {
        let def = store.def(SERVICES)?;
        let mut new = svc.clone();
        meta_mut(&mut new).remove("resourceVersion");
        new["status"] =
            json!({"loadBalancer": {"ingress": [{"ip": ip.to_string(), "ipMode": "VIP"}]}});
        let ns = meta_str(svc, "namespace").unwrap_or_default().to_owned();
        let name = meta_str(svc, "name").unwrap_or_default().to_owned();
        if let Err(e) = store.update(&def, &ns, &name, new, WriteScope::Internal, now) {
            tracing::debug!(error = %e, name, "load balancer status write failed");
        }
    }
    Some(ip)
}

/// Whether `pod` is a ready endpoint of `svc`: same namespace, selected, Ready, not going.
fn backs(svc: &Value, pod: &Value) -> bool {
    let Some(selector) = get_path(svc, "spec.selector").and_then(Value::as_object) else {
        return false;
    };
    if selector.is_empty()
        || meta_str(svc, "namespace") != meta_str(pod, "namespace")
        || deleting(pod)
        || !ready(pod)
    {
        return false;
    }
    let labels = get_path(pod, "metadata.labels");
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

fn ready(pod: &Value) -> bool {
    get_path(pod, "status.conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// A Service port's frontend on `ip`, and its `targetPort` (number or name; the port itself
/// when absent).
fn frontend(ip: IpAddr, port: &Value) -> Option<(Frontend, Value)> {
    let number = u16::try_from(port.get("port")?.as_u64()?).ok()?;
    let protocol = match port.get("protocol").and_then(Value::as_str) {
        None | Some("TCP") => Protocol::Tcp,
        Some("UDP") => Protocol::Udp,
        Some(_) => return None,
    };
    let target = port.get("targetPort").cloned().unwrap_or(json!(number));
    let frontend = Frontend {
        addr: SocketAddr::new(ip, number),
        protocol,
    };
    Some((frontend, target))
}

/// `podIP:port` of `target` in `pod`: a number as is, a name looked up in the pod's container
/// ports of the same protocol.
fn endpoint(pod: &Value, target: &Value, protocol: Protocol) -> Option<SocketAddr> {
    let ip: IpAddr = get_path(pod, "status.podIP")?.as_str()?.parse().ok()?;
    let port = match target {
        Value::Number(n) => u16::try_from(n.as_u64()?).ok()?,
        Value::String(s) if s.parse::<u16>().is_ok() => s.parse().ok()?,
        Value::String(name) => named_port(pod, name, protocol)?,
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

fn named_port(pod: &Value, name: &str, protocol: Protocol) -> Option<u16> {
    let wanted = match protocol {
        Protocol::Tcp => "TCP",
        Protocol::Udp => "UDP",
    };
    get_path(pod, "spec.containers")?
        .as_array()?
        .iter()
        .filter_map(|c| c.get("ports").and_then(Value::as_array))
        .flatten()
        .find(|p| {
            p.get("name").and_then(Value::as_str) == Some(name)
                && p.get("protocol").and_then(Value::as_str).unwrap_or("TCP") == wanted
        })
        .and_then(|p| p.get("containerPort")?.as_u64())
        .and_then(|n| u16::try_from(n).ok())
}

/// Keeps one forwarder per published frontend until shutdown: starts new ones, hands changed
/// endpoints to running ones, stops the ones no longer published.
pub(crate) async fn run(c: Arc<ClusterShared>) {
    let mut published = c.load_balancers.subscribe();
    let mut running: BTreeMap<Frontend, forward::Forwarder> = BTreeMap::new();
    loop {
        let forwards = published.borrow_and_update().clone();
        running.retain(|frontend, _| forwards.contains_key(frontend));
        for (frontend, endpoints) in forwards.iter() {
            if let Some(f) = running.get(frontend) {
                f.set_endpoints(endpoints.clone());
                continue;
            }
            match forward::Forwarder::start(*frontend, endpoints.clone(), c.shutdown_token()).await
            {
                Ok(f) => {
                    running.insert(*frontend, f);
                }
                Err(e) => tracing::warn!(
                    cluster = %c.name, frontend = ?frontend, error = %e,
                    "load balancer cannot listen"
                ),
            }
        }
        tokio::select! {
            _ = c.shutdown_token().cancelled() => break,
            changed = published.changed() => if changed.is_err() { break },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ready: bool, ip: &str) -> Value {
        json!({
            "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "hub", "x": "y"}},
            "spec": {"containers": [{"ports": [
                {"name": "quic", "containerPort": 7443, "protocol": "UDP"},
                {"name": "ops", "containerPort": 8080},
            ]}]},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]},
        })
    }

    fn svc() -> Value {
        json!({"metadata": {"name": "s", "namespace": "ns"}, "spec": {"selector": {"app": "hub"}}})
    }

    #[test]
    fn only_ready_selected_pods_of_the_namespace_are_endpoints() {
        assert!(backs(&svc(), &pod(true, "127.1.0.9")));
        assert!(!backs(&svc(), &pod(false, "127.1.0.9")), "not Ready");
        let mut other = pod(true, "127.1.0.9");
        other["metadata"]["namespace"] = json!("elsewhere");
        assert!(!backs(&svc(), &other), "another namespace");
        let mut unselected = pod(true, "127.1.0.9");
        unselected["metadata"]["labels"]["app"] = json!("agent");
        assert!(!backs(&svc(), &unselected), "labels differ");
        let mut no_selector = svc();
        no_selector["spec"] = json!({});
        assert!(!backs(&no_selector, &pod(true, "127.1.0.9")), "no selector");
        let mut going = pod(true, "127.1.0.9");
        going["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert!(!backs(&svc(), &going), "being deleted");
    }

    #[test]
    fn target_ports_resolve_by_number_or_by_name_and_protocol() {
        let p = pod(true, "127.1.0.9");
        let at = |port: u16| Some(SocketAddr::from(([127, 1, 0, 9], port)));
        assert_eq!(endpoint(&p, &json!(9000), Protocol::Tcp), at(9000));
        assert_eq!(endpoint(&p, &json!("9001"), Protocol::Tcp), at(9001));
        assert_eq!(endpoint(&p, &json!("quic"), Protocol::Udp), at(7443));
        assert_eq!(endpoint(&p, &json!("ops"), Protocol::Tcp), at(8080));
        assert_eq!(
            endpoint(&p, &json!("quic"), Protocol::Tcp),
            None,
            "quic is UDP"
        );
        assert_eq!(endpoint(&p, &json!("nope"), Protocol::Tcp), None);
        let mut no_ip = p.clone();
        no_ip["status"]["podIP"] = json!(null);
        assert_eq!(endpoint(&no_ip, &json!(9000), Protocol::Tcp), None);
    }

    #[test]
    fn a_port_without_target_port_forwards_to_the_same_number_and_sctp_is_skipped() {
        let ip: IpAddr = "127.2.0.1".parse().unwrap();
        let (f, target) = frontend(ip, &json!({"port": 7443, "protocol": "UDP"})).unwrap();
        assert_eq!(f.addr, SocketAddr::new(ip, 7443));
        assert_eq!(f.protocol, Protocol::Udp);
        assert_eq!(target, json!(7443));
        let (f, target) = frontend(ip, &json!({"port": 80, "targetPort": "ops"})).unwrap();
        assert_eq!(f.protocol, Protocol::Tcp);
        assert_eq!(target, json!("ops"));
        assert!(frontend(ip, &json!({"port": 80, "protocol": "SCTP"})).is_none());
        assert!(frontend(ip, &json!({"port": 70000})).is_none());
    }
}
