//! Least privilege at the edge, with the real parts: the agent's install rendered by
//! `kedge_hub::install::agent_manifests` and applied with the real `kubectl` to a simulated
//! member cluster that enforces RBAC for bearer tokens; the real `kedge-agent`, run with the
//! flags of the rendered Deployment and a token of the rendered ServiceAccount, against a
//! scripted hub (real QUIC, real mTLS).
//!
//! Shown: the agent scales a Deployment and creates a Job in its namespace; a command for
//! another namespace, for a kind outside its `--kinds` and a Job manifest that is not a Job
//! are refused, logged and reported in the Ack with a readable reason, and nothing is
//! touched; a Job without kedge's label is neither deleted nor adopted; the agent reports
//! capacity without a grant on pods outside its namespace; and the ServiceAccount itself,
//! through the real `kubectl` with its token, cannot act outside its Role (nor list pods
//! cluster-wide).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use kedge_core::crd::conditions::LABEL_DSJ;
use kedge_hub::install::agent::{AgentInstall, AgentKind, AgentNamespaces, Credentials};
use kedge_hub::install::agent_manifests;
use kedge_protocol::*;
use kube::Api;
use serde_json::json;
use support::hub_peer::{HubPeer, HubSide, Session, next};
use support::*;

const OWNER: &str = "apps/work";

/// The member's own objects, made by its admin (not by kedge).
const FIXTURE: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: apps}
---
apiVersion: v1
kind: Namespace
metadata: {name: kube-system}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: apps}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c, image: nginx}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system}
spec:
  replicas: 2
  selector: {matchLabels: {app: coredns}}
  template:
    metadata: {labels: {app: coredns}}
    spec: {containers: [{name: c, image: coredns}]}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: apps}
spec:
  replicas: 1
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec: {containers: [{name: c, image: postgres}]}
---
apiVersion: v1
kind: Secret
metadata: {name: db-password, namespace: apps}
stringData: {password: hunter2}
---
apiVersion: batch/v1
kind: Job
metadata:
  name: foreign
  namespace: apps
  labels: {team: data}
  annotations: {sim.kedge.dev/run-seconds: "3600"}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: busybox}]
"#;

/// Runs the real kubectl; returns (success, stdout, stderr).
async fn kubectl(kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("/usr/bin/kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("kubectl finished in time")
    .expect("kubectl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn kubectl_ok(kubeconfig: &Path, args: &[&str]) -> String {
    let (ok, stdout, stderr) = kubectl(kubeconfig, args).await;
    assert!(ok, "kubectl {args:?}: {stderr}");
    stdout
}

/// A TLS front for the simulated API server: kubectl sends a bearer token only over TLS.
/// Returns its address and the PEM of its (self-signed) certificate.
async fn tls_front(upstream: SocketAddr) -> (SocketAddr, String) {
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let key = rustls_pki_types::PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der());
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key.into())
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut api) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut api).await;
            });
        }
    });
    (addr, certified.cert.pem())
}

fn workload(api_version: &str, kind: &str, namespace: &str, name: &str) -> WorkloadRef {
    WorkloadRef {
        api_version: api_version.into(),
        kind: kind.into(),
        namespace: namespace.into(),
        name: name.into(),
    }
}

fn job_manifest(name: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "annotations": {"sim.kedge.dev/run-seconds": "3600"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox"}]}}}
    }))
    .unwrap()
}

fn job_create(namespace: &str, name: &str, manifest_json: Vec<u8>) -> JobCreate {
    JobCreate {
        namespace: namespace.into(),
        name: name.into(),
        owner: OWNER.into(),
        manifest_json,
    }
}

/// Sends `state` and returns its Ack, recording every Job the agent reports on the way.
async fn apply(control: &mut HubSide, state: DesiredState, seen: &mut BTreeSet<String>) -> Ack {
    let revision = state.revision;
    control
        .send(&HubMessage::DesiredState(state))
        .await
        .unwrap();
    next(control, "the ack", |m| match m {
        AgentMessage::Ack(a) if a.revision == revision => Some(a),
        AgentMessage::Report(r) => {
            seen.extend(r.jobs.iter().map(|j| j.name.clone()));
            None
        }
        _ => None,
    })
    .await
}

fn failure(ack: &Ack, target: &CommandTarget) -> Option<Failure> {
    ack.results
        .iter()
        .find(|r| r.target == *target)
        .unwrap_or_else(|| panic!("no result for {target:?}: {ack:?}"))
        .failure
        .clone()
}

fn refused(ack: &Ack, target: &CommandTarget, code: FailureCode, says: &[&str]) {
    let f = failure(ack, target).unwrap_or_else(|| panic!("{target:?} was not refused"));
    assert_eq!(
        (f.retry, f.code),
        (Retry::Permanent, code),
        "{target:?}: {f:?}"
    );
    for s in says {
        assert!(
            f.message.contains(s),
            "{target:?}: {:?} lacks {s:?}",
            f.message
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_acts_only_within_its_rendered_rbac_and_policy() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::create(dir.path(), &["edge"]).await;
    let sim = start_clusters(dir.path(), &["edge"]).await;
    let cluster = sim.cluster("edge").unwrap();
    let admin = dir.path().join("edge.kubeconfig");
    let fixture = dir.path().join("fixture.yaml");
    std::fs::write(&fixture, FIXTURE).unwrap();
    kubectl_ok(&admin, &["apply", "-f", fixture.to_str().unwrap()]).await;

    // The install, for namespace `apps` and Deployments only, with a dev certificate.
    let hub = HubPeer::start(&pki);
    let read = |f: &str| std::fs::read_to_string(pki.path(f)).unwrap();
    let mut install = AgentInstall::new(
        vec![hub.ports().quic_addr().to_string()],
        read("ca.pem"),
        Credentials::Certificate {
            cert_pem: read("member-edge.pem"),
            key_pem: read("member-edge-key.pem"),
        },
        AgentNamespaces::Only(vec!["apps".into()]),
    );
    install.kinds = vec![AgentKind::deployment()];
    install.hub_server_name = Some("localhost".into());
    install.validate().unwrap();
    let objects = agent_manifests(&install);
    let (deployment, rest) = objects.split_last().unwrap();
    assert_eq!(deployment["kind"], "Deployment");
    let manifests = dir.path().join("agent-install.yaml");
    let yaml: Vec<String> = rest
        .iter()
        .map(|o| serde_yaml::to_string(o).unwrap())
        .collect();
    std::fs::write(&manifests, yaml.join("---\n")).unwrap();
    kubectl_ok(&admin, &["apply", "-f", manifests.to_str().unwrap()]).await;

    // A token of the rendered ServiceAccount (TokenRequest, by the real kubectl).
    let token = kubectl_ok(
        &admin,
        &["create", "token", "kedge-agent", "-n", "kedge-system"],
    )
    .await;
    let token = token.trim();
    let agent_kubeconfig = dir.path().join("agent.kubeconfig");
    std::fs::write(&agent_kubeconfig, cluster.kubeconfig_with_token(token)).unwrap();

    // The Deployment's container, run here: its Secret's files where it mounts them, its
    // args, its hub address from the Secret, and the token's kubeconfig.
    let secret = rest.iter().find(|o| o["kind"] == "Secret").unwrap();
    let etc = dir.path().join("etc-kedge");
    std::fs::create_dir(&etc).unwrap();
    for key in ["ca.crt", "tls.crt", "tls.key"] {
        std::fs::write(etc.join(key), secret_value(secret, key)).unwrap();
    }
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let mut args = local_args(container, "/etc/kedge", &etc, "kedge-system");
    args.extend([
        "--kubeconfig".to_owned(),
        agent_kubeconfig.display().to_string(),
        "--report-interval".to_owned(),
        "300ms".to_owned(),
    ]);
    let hubs = secret_value(secret, "hub");
    let log = dir.path().join("agent.log");
    let _agent = Proc::spawn_env(
        &bin("kedge-agent"),
        &args,
        &[("KEDGE_AGENT_HUB", &hubs)],
        log.clone(),
    );
    let Session {
        mut control,
        hello,
        connection: _connection,
    } = hub.accept("edge").await;
    assert_eq!(hello.namespaces, ["apps"]);
    // The first full report carries the capacity: the ClusterRole's node list and the pods
    // of `apps` (no grant on other pods: a cluster-wide list would be forbidden).
    let capacity = next(&mut control, "a full report", |m| match m {
        AgentMessage::Report(r) if r.full => Some(r.capacity),
        _ => None,
    })
    .await;
    assert!(capacity.is_some_and(|c| c.ready_nodes > 0), "{capacity:?}");

    let mut seen = BTreeSet::new();
    let web = workload("apps/v1", "Deployment", "apps", "web");
    let coredns = workload("apps/v1", "Deployment", "kube-system", "coredns");
    let db = workload("apps/v1", "StatefulSet", "apps", "db");
    let replicas = |w: &WorkloadRef, n: i32| WorkloadReplicas {
        workload: w.clone(),
        replicas: Some(n),
        owner: "apps/web".into(),
    };
    let ack = apply(
        &mut control,
        DesiredState {
            revision: 1,
            workloads: vec![replicas(&web, 3), replicas(&coredns, 0), replicas(&db, 5)],
            create_jobs: vec![
                job_create("apps", "work-1", job_manifest("work-1")),
                job_create("apps", "foreign", job_manifest("foreign")),
                job_create(
                    "apps",
                    "sneaky",
                    serde_json::to_vec(&json!({
                        "apiVersion": "apps/v1", "kind": "Deployment",
                        "metadata": {"name": "sneaky"},
                        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}
                    }))
                    .unwrap(),
                ),
                job_create("default", "work-2", job_manifest("work-2")),
            ],
            delete_jobs: vec![JobDelete {
                namespace: "apps".into(),
                name: "foreign".into(),
                owner: OWNER.into(),
                propagation: Propagation::Background,
            }],
        },
        &mut seen,
    )
    .await;

    // Within its namespace and kinds, through its Role: done.
    assert_eq!(failure(&ack, &CommandTarget::Workload(web.clone())), None);
    assert_eq!(
        failure(&ack, &CommandTarget::Job("apps/work-1".into())),
        None
    );
    let client = cluster.client().unwrap();
    let web_now = Api::<Deployment>::namespaced(client.clone(), "apps")
        .get("web")
        .await
        .unwrap();
    assert_eq!(web_now.spec.unwrap().replicas, Some(3));
    let jobs: Api<Job> = Api::namespaced(client.clone(), "apps");
    let work = jobs.get("work-1").await.unwrap();
    assert_eq!(
        work.metadata
            .labels
            .unwrap()
            .get(LABEL_DSJ)
            .map(String::as_str),
        Some("work")
    );

    // Outside them: refused, readable, and nothing touched.
    refused(
        &ack,
        &CommandTarget::Workload(coredns.clone()),
        FailureCode::NamespaceNotAllowed,
        &["\"kube-system\"", "--namespaces"],
    );
    refused(
        &ack,
        &CommandTarget::Workload(db.clone()),
        FailureCode::KindNotAllowed,
        &["apps/v1/StatefulSet", "--kinds", "apps/v1/Deployment"],
    );
    refused(
        &ack,
        &CommandTarget::Job("apps/sneaky".into()),
        FailureCode::KindNotAllowed,
        &["apps/v1/Deployment, not a batch/v1 Job"],
    );
    refused(
        &ack,
        &CommandTarget::Job("default/work-2".into()),
        FailureCode::NamespaceNotAllowed,
        &["\"default\""],
    );
    let coredns_now = Api::<Deployment>::namespaced(client.clone(), "kube-system")
        .get("coredns")
        .await
        .unwrap();
    assert_eq!(coredns_now.spec.unwrap().replicas, Some(2));
    let db_now = Api::<StatefulSet>::namespaced(client.clone(), "apps")
        .get("db")
        .await
        .unwrap();
    assert_eq!(db_now.spec.unwrap().replicas, Some(1));
    assert!(jobs.get_opt("sneaky").await.unwrap().is_none());
    assert!(
        Api::<Deployment>::namespaced(client.clone(), "apps")
            .get_opt("sneaky")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<Job>::namespaced(client.clone(), "default")
            .get_opt("work-2")
            .await
            .unwrap()
            .is_none()
    );

    // A Job kedge did not create: its name colliding with a create is a refusal, a delete
    // is refused, and it is left exactly as it was.
    let target = CommandTarget::Job("apps/foreign".into());
    let foreign_results: Vec<&CommandResult> =
        ack.results.iter().filter(|r| r.target == target).collect();
    assert_eq!(foreign_results.len(), 2, "a create and a delete: {ack:?}");
    for r in foreign_results {
        let f = r.failure.as_ref().expect("the foreign Job is refused");
        assert_eq!((f.retry, f.code), (Retry::Permanent, FailureCode::NotOwned));
        assert!(
            f.message.contains(&format!("has no {LABEL_DSJ} label"))
                && f.message.contains("leaves it alone"),
            "{}",
            f.message
        );
    }
    let foreign = jobs.get("foreign").await.unwrap();
    let labels = foreign.metadata.labels.unwrap();
    assert_eq!(labels.get("team").map(String::as_str), Some("data"));
    assert!(!labels.contains_key(LABEL_DSJ), "adopted: {labels:?}");
    assert!(foreign.metadata.deletion_timestamp.is_none());

    // Reports name kedge's Job and never the foreign one.
    let _ = next(&mut control, "a report of work-1", |m| match m {
        AgentMessage::Report(r) => {
            seen.extend(r.jobs.iter().map(|j| j.name.clone()));
            seen.contains("work-1").then_some(())
        }
        _ => None,
    })
    .await;
    assert!(!seen.contains("foreign"), "{seen:?}");

    // Every refusal is logged with its reason; nothing the agent needs was forbidden.
    let text = std::fs::read_to_string(&log).unwrap();
    let refusals = text
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("command refused by the agent's policy"))
        .count();
    assert!(refusals >= 6, "{text}");
    for reason in [
        "reason=namespace \"kube-system\" is not managed",
        "reason=kind apps/v1/StatefulSet is not managed",
        "reason=Job sneaky manifest is a apps/v1/Deployment",
        "reason=Job apps/foreign has no",
    ] {
        assert!(text.contains(reason), "{reason}: {text}");
    }
    assert!(
        !text.to_lowercase().contains("forbidden"),
        "the rendered RBAC denied the agent something: {text}"
    );

    // The ServiceAccount itself, through the real kubectl with its token (over TLS: kubectl
    // sends no credentials in the clear): only what its Role grants.
    let upstream: SocketAddr = cluster.url().trim_start_matches("http://").parse().unwrap();
    let (front, front_ca) = tls_front(upstream).await;
    let ca_file = dir.path().join("front-ca.pem");
    std::fs::write(&ca_file, front_ca).unwrap();
    let sa_kubeconfig = dir.path().join("sa.kubeconfig");
    std::fs::write(
        &sa_kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: edge\n  cluster:\n    server: https://{front}\n    certificate-authority: {}\ncontexts:\n- name: sa\n  context: {{cluster: edge, user: sa, namespace: apps}}\ncurrent-context: sa\nusers:\n- name: sa\n  user:\n    token: {token}\n",
            ca_file.display()
        ),
    )
    .unwrap();
    // Allowed: what the agent does, listing (and watching) the Deployments of `apps` and
    // scaling one through `/scale`. (Not `kubectl scale`: it gets the Deployment first, and
    // the agent never gets one.)
    let listed = kubectl_ok(&sa_kubeconfig, &["-n", "apps", "get", "deployments"]).await;
    assert!(listed.contains("web"), "{listed}");
    // The pods of `apps` (pending counts, Jobs' pods, capacity) and the nodes (capacity).
    kubectl_ok(&sa_kubeconfig, &["-n", "apps", "get", "pods"]).await;
    let nodes = kubectl_ok(&sa_kubeconfig, &["get", "nodes"]).await;
    assert!(!nodes.trim().is_empty(), "{nodes}");
    kubectl_ok(
        &sa_kubeconfig,
        &[
            "-n",
            "apps",
            "patch",
            "deployment",
            "web",
            "--subresource=scale",
            "--type=merge",
            "-p",
            r#"{"spec":{"replicas":4}}"#,
        ],
    )
    .await;
    for (what, args) in [
        (
            "scaling in kube-system",
            &[
                "-n",
                "kube-system",
                "scale",
                "deployment",
                "coredns",
                "--replicas",
                "0",
            ][..],
        ),
        (
            "reading Secrets in apps",
            &["-n", "apps", "get", "secrets"][..],
        ),
        (
            "reading a Secret by name in apps",
            &["-n", "apps", "get", "secret", "db-password"][..],
        ),
        (
            "creating a Job in default",
            &["-n", "default", "create", "job", "x", "--image", "busybox"][..],
        ),
        (
            "editing the Deployment itself (not /scale)",
            &["-n", "apps", "set", "image", "deployment/web", "c=evil"][..],
        ),
        (
            "scaling a StatefulSet (not in its kinds)",
            &[
                "-n",
                "apps",
                "scale",
                "statefulset",
                "db",
                "--replicas",
                "0",
            ][..],
        ),
        (
            "listing the Secrets of its own namespace",
            &["-n", "kedge-system", "get", "secrets"][..],
        ),
        // A pod spec carries its containers' environment: only the served namespaces' pods.
        (
            "listing pods cluster-wide",
            &["get", "pods", "--all-namespaces"][..],
        ),
        (
            "listing pods in kube-system",
            &["-n", "kube-system", "get", "pods"][..],
        ),
        (
            "reading a node (only list, for capacity)",
            &["get", "node", "node-0"][..],
        ),
    ] {
        let (ok, _, stderr) = kubectl(&sa_kubeconfig, args).await;
        assert!(!ok, "{what} was allowed");
        assert!(
            stderr.contains("Forbidden") || stderr.contains("forbidden"),
            "{what}: {stderr}"
        );
    }
    let coredns_now = Api::<Deployment>::namespaced(client.clone(), "kube-system")
        .get("coredns")
        .await
        .unwrap();
    assert_eq!(coredns_now.spec.unwrap().replicas, Some(2));
    sim.shutdown().await;
}
