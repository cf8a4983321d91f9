//! A DistributedScaledObject in a hub cluster without KEDA: the hub says so in status and an
//! Event, and the split still follows `kubectl scale`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use kedge_sim::{Sim, SimConfig};
use serde_json::{Value, json};
use support::*;

const MEMBERS: [&str; 2] = ["member-1", "member-2"];
const LIMIT: Duration = Duration::from_secs(15);

async fn kubectl(kc: &std::path::Path, args: &[&str], stdin: Option<&str>) -> String {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new("/usr/bin/kubectl")
        .arg("--kubeconfig")
        .arg(kc)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input
        .write_all(stdin.unwrap_or_default().as_bytes())
        .await
        .unwrap();
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("kubectl finished in time")
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keda_the_split_follows_kubectl_scale_and_status_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path(), &MEMBERS).await;
    let names: Vec<String> = ["hub", "member-1", "member-2"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let sim = Sim::start(&names, SimConfig::default(), Some(dir.path()))
        .await
        .unwrap();
    let hub_kc = dir.path().join("hub.kubeconfig");
    kubectl(
        &hub_kc,
        &[
            "apply",
            "-f",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds"),
        ],
        None,
    )
    .await;
    for member in MEMBERS {
        // Only members with a MemberCluster get a session.
        let mc = json!({"apiVersion": "kedge.dev/v1alpha1", "kind": "MemberCluster",
            "metadata": {"name": member}, "spec": {}});
        sim.cluster("hub").unwrap().put_object(mc).unwrap();
        let deployment = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "nginx", "namespace": "default"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "nginx"}},
                "template": {"metadata": {"labels": {"app": "nginx"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx"}]}}},
        });
        sim.cluster(member).unwrap().put_object(deployment).unwrap();
    }

    let ports = HubPorts::new();
    let hub_kubeconfig = hub_kc.display().to_string();
    let _hub = start_hub_with(
        &pki,
        ports,
        "200ms",
        dir.path().join("hub.log"),
        &["--kubeconfig", &hub_kubeconfig],
    );
    let _agents: Vec<Proc> = MEMBERS
        .iter()
        .map(|m| start_agent(&pki, m, ports, dir.path().join(format!("{m}.log"))))
        .collect();
    wait_for_states(ports, &MEMBERS, "Connected", LIMIT).await;

    let dso = r#"
apiVersion: kedge.dev/v1alpha1
kind: DistributedScaledObject
metadata: {name: nginx, namespace: default}
spec:
  memberClusters:
  - {name: member-1, weight: 1}
  - {name: member-2, weight: 3}
  scaledObjectSpec:
    scaleTargetRef: {name: nginx}
    triggers:
    - type: kubernetes-resource
      metadata: {resourceKind: ConfigMap, resourceName: m, key: v, targetValue: "5"}
"#;
    kubectl(&hub_kc, &["apply", "-f", "-"], Some(dso)).await;
    kubectl(&hub_kc, &["scale", "dso/nginx", "--replicas=8"], None).await;
    let replicas = |member: &str| {
        sim.cluster(member)
            .unwrap()
            .object("apps/v1", "Deployment", "default", "nginx")
            .and_then(|d| d.pointer("/spec/replicas").and_then(Value::as_i64))
    };
    wait_for(LIMIT, "the 1:3 split of 8", || async {
        (replicas("member-1") == Some(2) && replicas("member-2") == Some(6)).then_some(())
    })
    .await;
    let hub = sim.cluster("hub").unwrap();
    let degraded = wait_for(LIMIT, "Degraded KedaUnavailable", || async {
        let dso = hub.object(
            "kedge.dev/v1alpha1",
            "DistributedScaledObject",
            "default",
            "nginx",
        )?;
        dso["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Degraded" && c["reason"] == "KedaUnavailable")
            .cloned()
    })
    .await;
    assert_eq!(degraded["status"], "True");
    assert!(
        degraded["message"]
            .as_str()
            .unwrap()
            .contains("is KEDA installed"),
        "{degraded}"
    );
    sim.shutdown().await;
}
