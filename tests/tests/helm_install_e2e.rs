//! `helm install` for real: the real Helm engine (helm-python-sdk) installs the `kedge-hub`
//! chart into a simulated hub cluster and the `kedge-agent` chart into two simulated member
//! clusters. kedge-sim runs no containers, so the test then runs each Deployment's container
//! here with what the chart produced: the Deployment's args and env as stored in the
//! cluster, its Secret's files where it mounts them, and a token of the chart's
//! ServiceAccount (the simulator enforces RBAC for tokens). The hub's external scaler
//! issues its certificates under the chart's RBAC (KEDA's client Secret in KEDA's
//! namespace, the ClusterTriggerAuthentication). A DSO then runs across the two
//! members; `helm upgrade` changes the hub's flags and keeps DSOs, members and the CA across a
//! hub restart; `helm uninstall` removes what the charts made and keeps the CRDs, the custom
//! resources and the CA. The same without Helm: `kubectl kedge install hub | kubectl apply`
//! and `kubectl kedge uninstall hub | kubectl delete`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::ByteString;
use kedge_sim::{Sim, SimConfig};
use serde_json::{Value, json};
use support::dso::{Fleet, LIMIT, deployment, dso_yaml, kubectl};
use support::*;

const NS: &str = "kedge-system";
const MEMBERS: [&str; 2] = ["edge-1", "edge-2"];

/// `helm_chart.py ARGS` off the runtime's threads (Helm blocks for seconds).
async fn helm(args: &[&str], values: Value) -> Value {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        support::helm::helm(&args, &values)
    })
    .await
    .unwrap()
}

fn chart(name: &str) -> String {
    support::helm::chart(name).display().to_string()
}

async fn get_json(kc: &Path, args: &[&str]) -> Value {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend(["-o", "json"]);
    serde_json::from_str(&kubectl(kc, &all).await).unwrap()
}

/// Whether `kubectl get ARGS` finds the object.
async fn exists(kc: &Path, args: &[&str]) -> bool {
    let out = tokio::process::Command::new("/usr/bin/kubectl")
        .arg("--kubeconfig")
        .arg(kc)
        .arg("get")
        .args(args)
        .output()
        .await
        .unwrap();
    out.status.success()
}

fn secret_value(secret: &Value, key: &str) -> String {
    let b: ByteString = serde_json::from_value(secret["data"][key].clone())
        .unwrap_or_else(|e| panic!("key {key} of {}: {e}", secret["metadata"]["name"]));
    String::from_utf8(b.0).unwrap()
}

/// A kubeconfig for `cluster` with a token of ServiceAccount `sa` (TokenRequest).
async fn service_account_kubeconfig(sim: &Sim, dir: &Path, cluster: &str, sa: &str) -> PathBuf {
    let admin = dir.join(format!("{cluster}.kubeconfig"));
    let token = kubectl(&admin, &["create", "token", sa, "-n", NS]).await;
    let path = dir.join(format!("{cluster}-{sa}.kubeconfig"));
    std::fs::write(
        &path,
        sim.cluster(cluster)
            .unwrap()
            .kubeconfig_with_token(token.trim()),
    )
    .unwrap();
    path
}

/// Runs the one container of the Deployment `name` of `cluster` as the chart made it:
/// its args (`0.0.0.0` listeners on loopback, the agent's ops port and the hub's scaler on
/// any free port, the
/// mounted Secret's files from `files`) and its env (downward API namespace, Secret keys),
/// against the cluster with a token of its ServiceAccount.
async fn run_container(
    sim: &Sim,
    dir: &Path,
    cluster: &str,
    name: &str,
    binary: &str,
    log: &str,
) -> Proc {
    let admin = dir.join(format!("{cluster}.kubeconfig"));
    let d = get_json(&admin, &["-n", NS, "deployment", name]).await;
    let pod = &d["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    // The mounted Secret, as files.
    let files = dir.join(format!("{cluster}-{name}-etc"));
    std::fs::create_dir_all(&files).unwrap();
    let mut mount = None;
    for v in pod["volumes"].as_array().into_iter().flatten() {
        let secret_name = v["secret"]["secretName"].as_str().unwrap();
        let secret = get_json(&admin, &["-n", NS, "secret", secret_name]).await;
        for key in secret["data"].as_object().unwrap().keys() {
            std::fs::write(files.join(key), secret_value(&secret, key)).unwrap();
        }
        let m = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == v["name"])
            .unwrap();
        mount = Some(format!("{}/", m["mountPath"].as_str().unwrap()));
    }
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for e in c["env"].as_array().into_iter().flatten() {
        let value = if let Some(v) = e["value"].as_str() {
            v.to_owned()
        } else if e.pointer("/valueFrom/fieldRef/fieldPath") == Some(&json!("metadata.namespace")) {
            NS.to_owned()
        } else if let Some(r) = e.pointer("/valueFrom/secretKeyRef") {
            let secret = get_json(&admin, &["-n", NS, "secret", r["name"].as_str().unwrap()]).await;
            secret_value(&secret, r["key"].as_str().unwrap())
        } else {
            panic!("env {e} of {name}: not a value, the namespace or a Secret key")
        };
        env.insert(e["name"].as_str().unwrap().to_owned(), value);
    }
    let mut args: Vec<String> = Vec::new();
    let raw: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for (i, a) in raw.iter().enumerate() {
        let previous = i.checked_sub(1).map(|p| raw[p]);
        let any_port = match binary {
            "kedge-agent" => previous == Some("--ops-listen"),
            _ => previous == Some("--scaler-listen"),
        };
        let a = if any_port {
            "127.0.0.1:0".to_owned()
        } else if let Some(port) = a.strip_prefix("0.0.0.0:") {
            format!("127.0.0.1:{port}")
        } else if let Some(file) = mount.as_deref().and_then(|m| a.strip_prefix(m)) {
            files.join(file).display().to_string()
        } else {
            a.replace("$(POD_NAMESPACE)", &env["POD_NAMESPACE"])
        };
        args.push(a);
    }
    let sa = pod["serviceAccountName"].as_str().unwrap();
    let kubeconfig = service_account_kubeconfig(sim, dir, cluster, sa).await;
    args.extend(["--kubeconfig".to_owned(), kubeconfig.display().to_string()]);
    let env: Vec<(&str, &str)> = env
        .iter()
        .filter(|(k, _)| k.as_str() != "RUST_LOG")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    Proc::spawn_env(&bin(binary), &args, &env, dir.join(log))
}

async fn wait_hub_ready(ports: HubPorts, hub: &mut Proc) {
    let start = std::time::Instant::now();
    while ready(ports).await != Some(true) {
        assert!(
            hub.is_running() && start.elapsed() < LIMIT,
            "the hub installed by the chart did not become ready:\n{}",
            hub.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A packaged release of a chart kept as the previous version (`tests/fixtures/charts`).
fn previous_chart(name: &str) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/charts");
    dir.join(format!("{name}-{PREVIOUS_VERSION}.tgz"))
        .display()
        .to_string()
}

/// The chart release `tests/fixtures/charts` keeps, for the upgrade test.
const PREVIOUS_VERSION: &str = "0.1.0";

/// KEDA in the hub cluster `DIR/hub.kubeconfig`, installed beforehand as far as the hub
/// needs it: its namespace, its ScaledObject and ClusterTriggerAuthentication CRDs.
async fn install_keda(dir: &Path) {
    let kc = dir.join("hub.kubeconfig");
    let namespace = dir.join("keda-namespace.yaml");
    std::fs::write(
        &namespace,
        "{apiVersion: v1, kind: Namespace, metadata: {name: keda}}",
    )
    .unwrap();
    let assets = concat!(env!("CARGO_MANIFEST_DIR"), "/../sim/assets");
    for file in [
        namespace.display().to_string(),
        format!("{assets}/scaledobject-crd.yaml"),
        format!("{assets}/clustertriggerauthentication-crd.yaml"),
    ] {
        kubectl(&kc, &["apply", "-f", &file]).await;
    }
}

/// Waits until the hub's external scaler has issued its certificates as the hub's
/// ServiceAccount: its Secret, KEDA's client Secret and the ClusterTriggerAuthentication.
async fn wait_scaler_certificates(kc: &Path) {
    for what in [
        vec!["-n", NS, "secret", "kedge-scaler-tls"],
        vec!["-n", "keda", "secret", "kedge-scaler-client"],
        vec!["clustertriggerauthentications.keda.sh", "kedge-scaler"],
    ] {
        let what = &what;
        wait_for(LIMIT, &format!("{what:?}"), || async move {
            exists(kc, what).await.then_some(())
        })
        .await;
    }
}

/// A simulated hub cluster with KEDA, and the two members.
async fn clusters(dir: &Path) -> Sim {
    let mut names = vec!["hub".to_owned()];
    names.extend(MEMBERS.iter().map(|m| m.to_string()));
    let config = SimConfig {
        pod_start_delay: Duration::from_millis(100),
        bookmark_interval: Duration::from_millis(500),
        ..SimConfig::default()
    };
    let sim = Sim::start(&names, config, Some(dir)).await.unwrap();
    install_keda(dir).await;
    sim
}

/// Hub chart values for loopback: the test's ports, short heartbeat and lease.
fn hub_values(ports: HubPorts) -> Value {
    json!({
        "quic": {"port": ports.quic, "service": {"type": "ClusterIP"}},
        "ops": {"port": ports.ops},
        "heartbeat": {"interval": "200ms"},
        "lease": {"duration": "2s"},
        "log": {"format": "text"},
    })
}

/// `helm install kedge-hub` from `chart`, then the hub run as its Deployment says, ready.
async fn install_hub(sim: &Sim, dir: &Path, chart: &str, ports: HubPorts) -> Proc {
    let kc = dir.join("hub.kubeconfig").display().to_string();
    let installed = helm(&["install", chart, "kedge-hub", NS, &kc], hub_values(ports)).await;
    assert!(
        installed["error"].is_null(),
        "helm install kedge-hub ({chart}): {installed}"
    );
    let mut hub = run_container(sim, dir, "hub", "kedge-hub", "kedge-hub", "hub.log").await;
    wait_hub_ready(ports, &mut hub).await;
    hub
}

/// Per member: `setup-member` prints the chart's values, `helm install kedge-agent` from
/// `chart`, the member's Deployment `web` (1 replica), and the agent run as its Deployment
/// says; returns once every agent is connected.
/// Gives a member's `kedge-agent` Role the verbs this build's agent needs on what it watches
/// (`list` and `watch`; chart 0.1.0 granted `get` on workloads and `list` on autoscalers,
/// for an agent that read each workload on every report). Only this build's agent binary
/// exists here, so a previous chart release runs it; an operator running a newer agent
/// image under the older chart would grant the same.
async fn grant_watch_verbs(member_kc: &Path) {
    let mut role = get_json(member_kc, &["-n", "default", "role", "kedge-agent"]).await;
    let Some(rules) = role["rules"].as_array_mut() else {
        panic!("the kedge-agent Role has no rules: {role}")
    };
    for rule in rules.iter_mut() {
        let verbs = rule["verbs"].as_array().cloned().unwrap_or_default();
        let subresource = rule["resources"].to_string().contains('/');
        if !subresource && (verbs == [json!("get")] || verbs == [json!("list")]) {
            rule["verbs"] = json!(["list", "watch"]);
        }
    }
    let file = member_kc.with_extension("role.json");
    std::fs::write(&file, role.to_string()).unwrap();
    kubectl(member_kc, &["replace", "-f", file.to_str().unwrap()]).await;
}

async fn install_agents(sim: &Sim, dir: &Path, chart: &str, ports: HubPorts) -> Vec<Proc> {
    let hub_kc = dir.join("hub.kubeconfig");
    let ca = get_json(&hub_kc, &["-n", NS, "secret", "kedge-hub-ca"]).await;
    let mut agents = Vec::new();
    for member in MEMBERS {
        let out = tokio::process::Command::new(bin("kubectl-kedge"))
            .args(["mc", "setup-member", member, "--namespaces", "default"])
            .args(["--hub-address", &format!("127.0.0.1:{}", ports.quic)])
            .args(["--hub-server-name", "localhost", "--output", "helm-values"])
            .arg("--kubeconfig")
            .arg(&hub_kc)
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "setup-member {member}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let values: Value = serde_yaml::from_slice(&out.stdout).unwrap();
        assert_eq!(values["namespaces"], json!(["default"]));
        assert_eq!(
            values["caBundle"].as_str(),
            Some(secret_value(&ca, "tls.crt").as_str())
        );
        let member_kc = dir
            .join(format!("{member}.kubeconfig"))
            .display()
            .to_string();
        let installed = helm(&["install", chart, "kedge-agent", NS, &member_kc], values).await;
        assert!(
            installed["error"].is_null(),
            "helm install kedge-agent on {member} ({chart}): {installed}"
        );
        if chart.ends_with(&format!("kedge-agent-{PREVIOUS_VERSION}.tgz")) {
            grant_watch_verbs(Path::new(&member_kc)).await;
        }
        deployment(sim, member, "web", 1).await;
        agents.push(
            run_container(
                sim,
                dir,
                member,
                "kedge-agent",
                "kedge-agent",
                &format!("{member}.log"),
            )
            .await,
        );
    }
    wait_for_states(ports, &MEMBERS, "Connected", LIMIT).await;
    agents
}

/// The installed hub and agents as a [`Fleet`], with the DSO `web` of 4 replicas split 2:2
/// across the two members.
async fn dso_across_the_members(sim: Sim, dir: &Path, ports: HubPorts) -> Fleet {
    let fleet = Fleet {
        members: MEMBERS.iter().map(|m| m.to_string()).collect(),
        dir: dir.to_owned(),
        pki: Pki {
            dir: dir.to_owned(),
        },
        sim,
        ports,
    };
    support::dso::apply(&fleet, &dso_yaml("web", "", "absent"), "web.yaml").await;
    fleet.kubectl(&["scale", "dso/web", "--replicas=4"]).await;
    fleet
        .wait_split("web", &MEMBERS, &[2, 2], "the DSO's 4 replicas split 2:2")
        .await;
    fleet
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installs_hub_and_agents_and_a_dso_runs_across_two_members() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_owned();
    let sim = clusters(&dir).await;
    let hub_kc = dir.join("hub.kubeconfig");
    let kc = hub_kc.display().to_string();

    // --- helm install kedge-hub: CRDs, namespace, RBAC, Deployment, Services.
    let ports = HubPorts::new();
    let hub = install_hub(&sim, &dir, &chart("kedge-hub"), ports).await;
    for crd in [
        "distributedscaledobjects.kedge.dev",
        "memberclusters.kedge.dev",
        "clusterprofiles.multicluster.x-k8s.io",
    ] {
        assert!(exists(&hub_kc, &["crd", crd]).await, "{crd}");
    }
    let ca = get_json(&hub_kc, &["-n", NS, "secret", "kedge-hub-ca"]).await;
    // The scaler (on by default) keeps its certificates under the chart's RBAC.
    assert!(exists(&hub_kc, &["-n", NS, "service", "kedge-hub-scaler"]).await);
    wait_scaler_certificates(&hub_kc).await;

    // --- Per member: setup-member prints the chart's values; helm install kedge-agent.
    let mut agents = install_agents(&sim, &dir, &chart("kedge-agent"), ports).await;
    // Enrolled: each agent keeps its certificate in its identity Secret.
    for member in MEMBERS {
        let kc = dir.join(format!("{member}.kubeconfig"));
        assert!(exists(&kc, &["-n", NS, "secret", "kedge-agent-identity"]).await);
    }

    // --- A DSO across the two members.
    let fleet = dso_across_the_members(sim, &dir, ports).await;
    // Each member's ClusterProfile, published under the chart's RBAC.
    wait_for(LIMIT, "a healthy ClusterProfile per member", || async {
        let list = get_json(&hub_kc, &["-n", NS, "clusterprofiles"]).await;
        let healthy = list["items"]
            .as_array()?
            .iter()
            .filter(|p| {
                support::dso::condition(&p["status"], "ControlPlaneHealthy")
                    .is_some_and(|c| c["status"] == "True")
            })
            .count();
        (healthy == MEMBERS.len()).then_some(())
    })
    .await;

    // --- helm upgrade with a changed value: the Deployment changes; DSOs, members and the
    // CA stay. The hub restarts with the new flags (a rollout); agents reconnect and the
    // members keep their replicas.
    let mut upgraded_values = hub_values(ports);
    upgraded_values["heartbeat"]["tolerance"] = json!(5);
    let upgraded = helm(
        &["upgrade", &chart("kedge-hub"), "kedge-hub", NS, &kc],
        upgraded_values,
    )
    .await;
    assert!(
        upgraded["error"].is_null(),
        "helm upgrade kedge-hub: {upgraded}"
    );
    assert_eq!(upgraded["revision"], 2);
    assert_eq!(upgraded["status"], "deployed");
    let d = get_json(&hub_kc, &["-n", NS, "deployment", "kedge-hub"]).await;
    let args = d["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains(r#""--heartbeat-tolerance","5""#), "{args}");
    drop(hub);
    let mut hub = run_container(
        &fleet.sim,
        &dir,
        "hub",
        "kedge-hub",
        "kedge-hub",
        "hub-2.log",
    )
    .await;
    wait_hub_ready(ports, &mut hub).await;
    wait_for_states(ports, &MEMBERS, "Connected", LIMIT).await;
    assert_eq!(fleet.split("web", &MEMBERS), [Some(2), Some(2)]);
    fleet.kubectl(&["scale", "dso/web", "--replicas=6"]).await;
    fleet
        .wait_split("web", &MEMBERS, &[3, 3], "the restarted hub follows /scale")
        .await;
    let ca_after = get_json(&hub_kc, &["-n", NS, "secret", "kedge-hub-ca"]).await;
    assert_eq!(ca_after["data"], ca["data"], "the CA survives the upgrade");

    // --- helm uninstall kedge-agent on edge-1: its objects go, the workload stays.
    drop(agents.remove(0));
    let edge1 = dir.join("edge-1.kubeconfig");
    let out = helm(
        &["uninstall", "kedge-agent", NS, &edge1.display().to_string()],
        Value::Null,
    )
    .await;
    assert!(out["error"].is_null(), "helm uninstall kedge-agent: {out}");
    for gone in [
        vec!["-n", NS, "deployment", "kedge-agent"],
        vec!["-n", NS, "secret", "kedge-agent-bootstrap"],
        vec!["-n", "default", "role", "kedge-agent"],
        vec!["clusterrole", "kedge-agent-capacity"],
    ] {
        assert!(!exists(&edge1, &gone).await, "{gone:?} left behind");
    }
    assert_eq!(
        fleet.replicas("edge-1", "web"),
        Some(3),
        "the workload is untouched"
    );

    // --- helm uninstall kedge-hub: the hub's objects go; CRDs, DSOs, members, the CA and the
    // scaler's certificates stay.
    drop(hub);
    let out = helm(&["uninstall", "kedge-hub", NS, &kc], Value::Null).await;
    assert!(out["error"].is_null(), "helm uninstall kedge-hub: {out}");
    for gone in [
        vec!["-n", NS, "deployment", "kedge-hub"],
        vec!["-n", NS, "service", "kedge-hub"],
        vec!["clusterrole", "kedge-hub"],
        vec!["-n", NS, "role", "kedge-hub-enrollment"],
        vec!["-n", NS, "service", "kedge-hub-scaler"],
        vec!["-n", "keda", "role", "kedge-hub-scaler"],
    ] {
        assert!(!exists(&hub_kc, &gone).await, "{gone:?} left behind");
    }
    for kept in [
        vec!["crd", "distributedscaledobjects.kedge.dev"],
        vec!["-n", "default", "dso", "web"],
        vec!["memberclusters", "edge-1"],
        vec!["-n", NS, "secret", "kedge-hub-ca"],
        vec!["-n", NS, "secret", "kedge-scaler-tls"],
        vec!["-n", "keda", "secret", "kedge-scaler-client"],
    ] {
        assert!(exists(&hub_kc, &kept).await, "{kept:?} removed");
    }
}

/// The version of a chart under `deploy/charts`, from its Chart.yaml.
fn chart_version(name: &str) -> String {
    let text = std::fs::read_to_string(support::helm::chart(name).join("Chart.yaml")).unwrap();
    let chart: Value = serde_yaml::from_str(&text).unwrap();
    chart["version"].as_str().unwrap().to_owned()
}

/// The `helm.sh/chart` label of a Deployment: which chart release made it.
fn made_by(deployment: &Value) -> &str {
    deployment["metadata"]["labels"]["helm.sh/chart"]
        .as_str()
        .unwrap_or_default()
}

/// Upgrading from the previous chart release (the packaged charts a chart repository would
/// serve, kept in `tests/fixtures/charts`) to this one with `helm upgrade --reuse-values`:
/// the hub's Deployment becomes this chart's; DSOs, MemberClusters (same uids) and the CA
/// are kept; while the hub is rolled (Recreate: the old one gone before the new one starts)
/// the members keep their replicas; the agents reconnect with the identity they enrolled
/// with (their one-time token is spent), before and after their own chart's upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_upgrade_from_the_previous_chart_release_keeps_members_dsos_ca_and_identities() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_owned();
    let sim = clusters(&dir).await;
    let hub_kc = dir.join("hub.kubeconfig");
    let kc = hub_kc.display().to_string();
    for name in ["kedge-hub", "kedge-agent"] {
        assert_ne!(
            chart_version(name),
            PREVIOUS_VERSION,
            "{name}: a chart that changes gets a new version; keep the released one in tests/fixtures/charts"
        );
    }

    // --- The previous release, installed and running a DSO.
    let ports = HubPorts::new();
    let hub = install_hub(&sim, &dir, &previous_chart("kedge-hub"), ports).await;
    let d = get_json(&hub_kc, &["-n", NS, "deployment", "kedge-hub"]).await;
    assert_eq!(made_by(&d), format!("kedge-hub-{PREVIOUS_VERSION}"));
    let mut agents = install_agents(&sim, &dir, &previous_chart("kedge-agent"), ports).await;
    let ca = get_json(&hub_kc, &["-n", NS, "secret", "kedge-hub-ca"]).await;
    let members = get_json(&hub_kc, &["memberclusters"]).await;
    let mut identities = Vec::new();
    for member in MEMBERS {
        let kc = dir.join(format!("{member}.kubeconfig"));
        identities.push(get_json(&kc, &["-n", NS, "secret", "kedge-agent-identity"]).await);
    }
    let fleet = dso_across_the_members(sim, &dir, ports).await;

    // --- helm upgrade kedge-hub to this chart, keeping the release's values.
    let upgraded = helm(
        &[
            "upgrade",
            &chart("kedge-hub"),
            "kedge-hub",
            NS,
            &kc,
            "--reuse-values",
        ],
        json!({}),
    )
    .await;
    assert!(
        upgraded["error"].is_null(),
        "helm upgrade kedge-hub from {PREVIOUS_VERSION}: {upgraded}"
    );
    assert_eq!(upgraded["revision"], 2);
    let d = get_json(&hub_kc, &["-n", NS, "deployment", "kedge-hub"]).await;
    assert_eq!(
        made_by(&d),
        format!("kedge-hub-{}", chart_version("kedge-hub"))
    );
    assert_eq!(d["spec"]["strategy"]["type"], "Recreate");
    let args = d["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(
        args.contains(&format!("0.0.0.0:{}", ports.quic)),
        "--reuse-values kept the install's QUIC port: {args}"
    );
    // The release's values (0.1.0's) have no `scaler`: it stays off until asked for.
    assert!(!args.contains("--scaler-listen"), "{args}");
    assert!(!exists(&hub_kc, &["-n", NS, "service", "kedge-hub-scaler"]).await);

    // The rollout: the old hub goes, the members keep their replicas while no hub runs and
    // while the new one starts and the agents reconnect.
    drop(hub);
    let mut hub = run_container(
        &fleet.sim,
        &dir,
        "hub",
        "kedge-hub",
        "kedge-hub",
        "hub-2.log",
    )
    .await;
    let start = std::time::Instant::now();
    loop {
        assert_eq!(
            fleet.split("web", &MEMBERS),
            [Some(2), Some(2)],
            "a member's replicas changed during the hub's rollout"
        );
        let connected = sessions(ports).await.is_some_and(|s| {
            MEMBERS
                .iter()
                .all(|m| state_of(&s, m).is_some_and(|x| x["state"] == "Connected"))
        });
        if ready(ports).await == Some(true) && connected {
            break;
        }
        assert!(
            hub.is_running() && start.elapsed() < LIMIT,
            "the upgraded hub and its agents did not come back:\n{}",
            hub.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ca_after = get_json(&hub_kc, &["-n", NS, "secret", "kedge-hub-ca"]).await;
    assert_eq!(ca_after["data"], ca["data"], "the CA survives the upgrade");
    let members_after = get_json(&hub_kc, &["memberclusters"]).await;
    let uids = |list: &Value| -> Vec<(Value, Value)> {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["metadata"]["name"].clone(), m["metadata"]["uid"].clone()))
            .collect()
    };
    assert_eq!(
        uids(&members_after),
        uids(&members),
        "the same MemberClusters"
    );
    assert_eq!(uids(&members).len(), MEMBERS.len());

    // --- helm upgrade kedge-agent on each member: the agent restarts with its identity.
    for (i, member) in MEMBERS.iter().enumerate() {
        let member_kc = dir.join(format!("{member}.kubeconfig"));
        let upgraded = helm(
            &[
                "upgrade",
                &chart("kedge-agent"),
                "kedge-agent",
                NS,
                &member_kc.display().to_string(),
                "--reuse-values",
            ],
            json!({}),
        )
        .await;
        assert!(
            upgraded["error"].is_null(),
            "helm upgrade kedge-agent on {member} from {PREVIOUS_VERSION}: {upgraded}"
        );
        let d = get_json(&member_kc, &["-n", NS, "deployment", "kedge-agent"]).await;
        assert_eq!(
            made_by(&d),
            format!("kedge-agent-{}", chart_version("kedge-agent"))
        );
        agents[i] = run_container(
            &fleet.sim,
            &dir,
            member,
            "kedge-agent",
            "kedge-agent",
            &format!("{member}-2.log"),
        )
        .await;
    }
    wait_for_states(ports, &MEMBERS, "Connected", LIMIT).await;
    for (member, before) in MEMBERS.iter().zip(&identities) {
        let kc = dir.join(format!("{member}.kubeconfig"));
        let after = get_json(&kc, &["-n", NS, "secret", "kedge-agent-identity"]).await;
        assert_eq!(
            after["data"], before["data"],
            "{member} kept the identity it enrolled with (no new enrollment)"
        );
    }
    fleet.kubectl(&["scale", "dso/web", "--replicas=6"]).await;
    fleet
        .wait_split(
            "web",
            &MEMBERS,
            &[3, 3],
            "the upgraded fleet follows /scale",
        )
        .await;
}

/// `kubectl-kedge ARGS` piped to `kubectl ARGS2 -f -` against `kubeconfig`.
async fn kedge_into_kubectl(kedge: &[&str], kubeconfig: &Path, kubectl_args: &[&str]) {
    let out = tokio::process::Command::new(bin("kubectl-kedge"))
        .args(kedge)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl kedge {kedge:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = kubeconfig.with_extension(format!("{}.yaml", kedge[..2].join("-")));
    std::fs::write(&path, &out.stdout).unwrap();
    let mut args = kubectl_args.to_vec();
    args.extend(["-f", path.to_str().unwrap()]);
    kubectl(kubeconfig, &args).await;
}

/// Without Helm: `kubectl kedge install hub | kubectl apply -f -`, the hub run as its
/// Deployment says, a member enrolled with `setup-member --member-kubeconfig`; then
/// `kubectl kedge uninstall hub | kubectl delete -f -` keeps the CRDs, members and the CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_kedge_install_applies_and_runs_and_uninstall_keeps_the_crds_and_ca() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_owned();
    let names = ["hub".to_owned(), "edge-1".to_owned()];
    let sim = Sim::start(&names, SimConfig::default(), Some(&dir))
        .await
        .unwrap();
    let hub_kc = dir.join("hub.kubeconfig");
    install_keda(&dir).await;
    let ports = HubPorts::new();
    let (quic, ops) = (ports.quic.to_string(), ports.ops.to_string());
    kedge_into_kubectl(
        &[
            "install",
            "hub",
            "--quic-port",
            &quic,
            "--ops-port",
            &ops,
            "--heartbeat-interval",
            "200ms",
            "--lease-duration",
            "2s",
            "--log-format",
            "text",
        ],
        &hub_kc,
        &["apply"],
    )
    .await;
    let mut hub = run_container(&sim, &dir, "hub", "kedge-hub", "kedge-hub", "hub.log").await;
    wait_hub_ready(ports, &mut hub).await;
    wait_scaler_certificates(&hub_kc).await;

    let edge = dir.join("edge-1.kubeconfig");
    let out = tokio::process::Command::new(bin("kubectl-kedge"))
        .args(["mc", "setup-member", "edge-1", "--namespaces", "default"])
        .args(["--hub-address", &format!("127.0.0.1:{}", ports.quic)])
        .args(["--hub-server-name", "localhost"])
        .arg("--kubeconfig")
        .arg(&hub_kc)
        .arg("--member-kubeconfig")
        .arg(&edge)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "setup-member: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _agent = run_container(
        &sim,
        &dir,
        "edge-1",
        "kedge-agent",
        "kedge-agent",
        "agent.log",
    )
    .await;
    wait_for_states(ports, &["edge-1"], "Connected", LIMIT).await;

    drop(hub);
    kedge_into_kubectl(
        &["uninstall", "hub"],
        &hub_kc,
        &["delete", "--ignore-not-found"],
    )
    .await;
    for gone in [
        vec!["-n", NS, "deployment", "kedge-hub"],
        vec!["clusterrole", "kedge-hub"],
        vec!["-n", NS, "service", "kedge-hub-metrics"],
        vec!["-n", NS, "service", "kedge-hub-scaler"],
        vec!["-n", "keda", "role", "kedge-hub-scaler"],
    ] {
        assert!(!exists(&hub_kc, &gone).await, "{gone:?} left behind");
    }
    for kept in [
        vec!["crd", "memberclusters.kedge.dev"],
        vec!["memberclusters", "edge-1"],
        vec!["-n", NS, "secret", "kedge-hub-ca"],
        vec!["namespace", NS],
    ] {
        assert!(exists(&hub_kc, &kept).await, "{kept:?} removed");
    }
}

/// `ops.tokenSecret`: the hub installed by the chart reads the token from the mounted Secret,
/// and its session listing answers only with it — also from 127.0.0.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_chart_mounts_an_ops_token_the_session_listing_then_needs() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_owned();
    let sim = clusters(&dir).await;
    let hub_kc = dir.join("hub.kubeconfig");
    let kc = hub_kc.display().to_string();
    let ports = HubPorts::new();
    let mut values = hub_values(ports);
    values["ops"]["tokenSecret"] = json!("kedge-hub-ops");
    let installed = helm(
        &["install", &chart("kedge-hub"), "kedge-hub", NS, &kc],
        values,
    )
    .await;
    assert!(installed["error"].is_null(), "helm install: {installed}");
    let token = "chart-ops-token-0123456789abcdef";
    kubectl(
        &hub_kc,
        &[
            "-n",
            NS,
            "create",
            "secret",
            "generic",
            "kedge-hub-ops",
            &format!("--from-literal=token={token}"),
        ],
    )
    .await;
    let mut hub = run_container(&sim, &dir, "hub", "kedge-hub", "kedge-hub", "hub.log").await;
    wait_hub_ready(ports, &mut hub).await;

    let listing = |token_file: Option<PathBuf>| {
        let mut command = tokio::process::Command::new(bin("kubectl-kedge"));
        command
            .args(["sessions", "-o", "json", "--hub", &ports.ops_url()])
            .env_remove("KEDGE_HUB_OPS_TOKEN_FILE");
        if let Some(file) = token_file {
            command.arg("--token-file").arg(file);
        }
        async move { command.output().await.unwrap() }
    };
    let refused = listing(None).await;
    assert!(!refused.status.success());
    let error = String::from_utf8_lossy(&refused.stderr);
    assert!(error.contains("401"), "{error}");
    let file = dir.join("ops-token");
    std::fs::write(&file, token).unwrap();
    let served = listing(Some(file)).await;
    assert!(
        served.status.success(),
        "{}",
        String::from_utf8_lossy(&served.stderr)
    );
    let sessions: Vec<Value> = serde_json::from_slice(&served.stdout).unwrap();
    assert!(sessions.is_empty(), "{sessions:?}");
    drop(hub);
    sim.shutdown().await;
}
