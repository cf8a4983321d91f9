//! The real kubectl against kedge-sim.

mod sim_support;

use std::process::Stdio;
use std::time::Duration;

use sim_support::{fast, fixture, kubectl, kubectl_ok, start};
use tokio::io::{AsyncBufReadExt, BufReader};

const DEPLOY: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: REPLICAS
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: nginx
        image: nginx
        resources:
          requests: {cpu: 100m, memory: 64Mi}
"#;

fn write_deploy(dir: &std::path::Path, replicas: u32) -> String {
    let p = dir.join(format!("deploy-{replicas}.yaml"));
    std::fs::write(&p, DEPLOY.replace("REPLICAS", &replicas.to_string())).expect("write manifest");
    p.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_lifecycle_with_kubectl() {
    let (sim, kc) = start("k1", fast()).await;
    let dir = kc.parent().expect("dir").to_path_buf();
    let d2 = write_deploy(&dir, 2);
    let d3 = write_deploy(&dir, 3);

    let out = kubectl_ok(&kc, &["apply", "-f", &d2]).await;
    assert!(out.contains("deployment.apps/web created"), "{out}");
    kubectl_ok(
        &kc,
        &[
            "wait",
            "--for=condition=Available",
            "deploy/web",
            "--timeout=20s",
        ],
    )
    .await;
    let out = kubectl_ok(
        &kc,
        &[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.status.readyReplicas}",
        ],
    )
    .await;
    assert_eq!(out, "2");
    // Server-side Tables with the built-in printer columns.
    let out = kubectl_ok(&kc, &["get", "deploy", "web"]).await;
    let mut rows = out.lines();
    let header = rows.next().unwrap_or_default();
    assert!(
        header.contains("READY") && header.contains("UP-TO-DATE") && header.contains("AVAILABLE"),
        "{out}"
    );
    assert!(rows.next().unwrap_or_default().contains("2/2"), "{out}");
    let out = kubectl_ok(&kc, &["get", "pods", "-l", "app=web"]).await;
    assert_eq!(out.matches("Running").count(), 2, "{out}");

    // Client-side apply of a change patches (strategic merge) and reports "configured".
    let out = kubectl_ok(&kc, &["apply", "--dry-run=server", "-f", &d3]).await;
    assert!(out.contains("configured (server dry run)"), "{out}");
    let out = kubectl_ok(
        &kc,
        &["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"],
    )
    .await;
    assert_eq!(out, "2");
    let out = kubectl_ok(&kc, &["apply", "-f", &d3]).await;
    assert!(out.contains("deployment.apps/web configured"), "{out}");
    let out = kubectl_ok(
        &kc,
        &[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.spec.replicas} {.metadata.generation}",
        ],
    )
    .await;
    assert_eq!(out, "3 2");
    let out = kubectl_ok(&kc, &["apply", "-f", &d3]).await;
    assert!(out.contains("deployment.apps/web unchanged"), "{out}");

    let out = kubectl_ok(&kc, &["scale", "deploy/web", "--replicas=4"]).await;
    assert!(out.contains("deployment.apps/web scaled"), "{out}");
    sim_support::eventually(20, || {
        let kc = kc.clone();
        async move {
            let out = kubectl(&kc, &["get", "pods", "-l", "app=web", "-o", "name"]).await;
            (out.stdout.lines().count() == 4).then_some(())
        }
    })
    .await;

    kubectl_ok(&kc, &["annotate", "deploy", "web", "kedge.dev/note=hello"]).await;
    let out = kubectl_ok(&kc, &["get", "deploy", "web", "-o", "yaml"]).await;
    assert!(out.contains("kedge.dev/note: hello"), "{out}");
    kubectl_ok(&kc, &["annotate", "deploy", "web", "kedge.dev/note-"]).await;
    let out = kubectl_ok(&kc, &["get", "deploy", "web", "-o", "yaml"]).await;
    assert!(!out.contains("kedge.dev/note"), "{out}");

    kubectl_ok(&kc, &["label", "deploy", "web", "tier=frontend"]).await;
    let out = kubectl_ok(&kc, &["get", "deploy", "-l", "tier=frontend", "-o", "name"]).await;
    assert_eq!(out.trim(), "deployment.apps/web");
    let out = kubectl_ok(&kc, &["get", "deploy", "-l", "tier=backend", "-o", "name"]).await;
    assert_eq!(out.trim(), "");

    let out = kubectl_ok(&kc, &["describe", "deploy", "web"]).await;
    assert!(
        out.contains("Replicas:") && out.contains("4 desired"),
        "{out}"
    );
    assert!(out.contains("NewReplicaSet:"), "{out}");
    assert!(
        out.contains("ScalingReplicaSet") && out.contains("deployment-controller"),
        "{out}"
    );
    let out = kubectl_ok(&kc, &["describe", "nodes"]).await;
    assert!(
        out.contains("node-0") && out.contains("Allocatable:"),
        "{out}"
    );

    // Server-side apply takes ownership of replicas again.
    let out = kubectl_ok(
        &kc,
        &["apply", "--server-side", "--force-conflicts", "-f", &d2],
    )
    .await;
    assert!(out.contains("serverside-applied"), "{out}");
    let out = kubectl_ok(
        &kc,
        &["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"],
    )
    .await;
    assert_eq!(out, "2");

    let out = kubectl_ok(&kc, &["delete", "deploy", "web"]).await;
    assert!(out.contains("deployment.apps \"web\" deleted"), "{out}");
    // The garbage collector removes the ReplicaSet and its pods.
    sim_support::eventually(20, || {
        let kc = kc.clone();
        async move {
            let out = kubectl(&kc, &["get", "rs,pods", "-o", "name"]).await;
            out.stdout.trim().is_empty().then_some(())
        }
    })
    .await;
    let out = kubectl(&kc, &["get", "deploy", "web"]).await;
    assert!(!out.ok && out.stderr.contains("NotFound"), "{}", out.stderr);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resources_with_kubectl() {
    let (sim, kc) = start("k2", fast()).await;
    kubectl_ok(&kc, &["apply", "-f", &fixture("widget-crd.yaml")]).await;
    kubectl_ok(
        &kc,
        &[
            "wait",
            "--for=condition=Established",
            "crd/widgets.example.kedge.dev",
            "--timeout=20s",
        ],
    )
    .await;
    let out = kubectl_ok(&kc, &["apply", "-f", &fixture("widget.yaml")]).await;
    assert!(out.contains("widget.example.kedge.dev/w1 created"), "{out}");

    // Short name, printer columns.
    let out = kubectl_ok(&kc, &["get", "wdg"]).await;
    let header = out.lines().next().unwrap_or_default();
    assert!(
        header.contains("DESIRED") && header.contains("CURRENT") && header.contains("AGE"),
        "{out}"
    );
    assert!(
        out.lines().nth(1).unwrap_or_default().starts_with("w1"),
        "{out}"
    );

    // Scale goes through /scale and leaves status alone.
    let out = kubectl_ok(&kc, &["scale", "wdg/w1", "--replicas=5"]).await;
    assert!(out.contains("scaled"), "{out}");
    let out = kubectl_ok(
        &kc,
        &[
            "get",
            "widget",
            "w1",
            "-o",
            "jsonpath={.spec.replicas}/{.status}/{.metadata.generation}",
        ],
    )
    .await;
    assert_eq!(out, "5//2");

    kubectl_ok(&kc, &["label", "wdg", "w1", "team-"]).await;
    let out = kubectl_ok(&kc, &["get", "wdg", "-l", "team=a", "-o", "name"]).await;
    assert_eq!(out.trim(), "");

    // kubectl scale owns .spec.replicas now: a server-side apply that sets it conflicts.
    let out = kubectl(
        &kc,
        &["apply", "--server-side", "-f", &fixture("widget.yaml")],
    )
    .await;
    assert!(!out.ok, "{}", out.stdout);
    assert!(
        out.stderr.contains("conflict") && out.stderr.contains(".spec.replicas"),
        "{}",
        out.stderr
    );
    let out = kubectl_ok(
        &kc,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &fixture("widget.yaml"),
        ],
    )
    .await;
    assert!(out.contains("serverside-applied"), "{out}");
    let out = kubectl_ok(&kc, &["get", "wdg", "w1", "-o", "yaml"]).await;
    assert!(
        out.contains("color: blue") && out.contains("team: a"),
        "{out}"
    );

    let out = kubectl_ok(&kc, &["get", "kedge"]).await;
    assert!(out.contains("w1"), "category lookup: {out}");
    let out = kubectl_ok(&kc, &["describe", "wdg", "w1"]).await;
    assert!(
        out.contains("Kind:         Widget") || out.contains("Widget"),
        "{out}"
    );

    kubectl_ok(&kc, &["delete", "-f", &fixture("widget.yaml")]).await;
    kubectl_ok(&kc, &["delete", "crd", "widgets.example.kedge.dev"]).await;
    let out = kubectl(&kc, &["get", "wdg"]).await;
    assert!(
        !out.ok,
        "resource must be gone with its CRD: {}",
        out.stdout
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_secrets_and_watch_with_kubectl() {
    let (sim, kc) = start("k3", fast()).await;
    let out = kubectl_ok(
        &kc,
        &[
            "create",
            "secret",
            "generic",
            "creds",
            "--from-literal=user=admin",
            "--from-literal=pw=s3cret",
        ],
    )
    .await;
    assert!(out.contains("secret/creds created"), "{out}");
    let out = kubectl_ok(
        &kc,
        &[
            "get",
            "secret",
            "creds",
            "-o",
            "jsonpath={.data.user} {.type}",
        ],
    )
    .await;
    assert_eq!(out, "YWRtaW4= Opaque");

    // Typed-client creates travel as protobuf.
    let out = kubectl_ok(
        &kc,
        &[
            "create",
            "deployment",
            "nginx",
            "--image=nginx:1.27",
            "--replicas=2",
            "--port=80",
        ],
    )
    .await;
    assert!(out.contains("deployment.apps/nginx created"), "{out}");
    kubectl_ok(
        &kc,
        &[
            "wait",
            "--for=condition=Available",
            "deploy/nginx",
            "--timeout=20s",
        ],
    )
    .await;
    let out = kubectl_ok(&kc, &["get", "deploy", "nginx", "-o", "jsonpath={.spec.template.spec.containers[0].ports[0].containerPort} {.status.readyReplicas}"]).await;
    assert_eq!(out, "80 2");
    kubectl_ok(
        &kc,
        &[
            "create",
            "job",
            "once",
            "--image=busybox",
            "--",
            "echo",
            "hi",
        ],
    )
    .await;
    kubectl_ok(
        &kc,
        &[
            "wait",
            "--for=condition=complete",
            "job/once",
            "--timeout=20s",
        ],
    )
    .await;
    let out = kubectl_ok(
        &kc,
        &[
            "get",
            "job",
            "once",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].command}",
        ],
    )
    .await;
    assert_eq!(out, r#"["echo","hi"]"#);

    kubectl_ok(&kc, &["apply", "-f", &fixture("job.yaml")]).await;
    kubectl_ok(
        &kc,
        &[
            "wait",
            "--for=condition=complete",
            "job/work",
            "--timeout=30s",
        ],
    )
    .await;
    let out = kubectl_ok(
        &kc,
        &[
            "get",
            "job",
            "work",
            "-o",
            "jsonpath={.status.succeeded} {.status.completionTime}",
        ],
    )
    .await;
    assert!(out.starts_with("2 20"), "{out}");
    let out = kubectl_ok(&kc, &["describe", "job", "work"]).await;
    assert!(out.contains("2 Succeeded"), "{out}");

    // get -w prints changes as they happen.
    let mut child = tokio::process::Command::new("/usr/bin/kubectl")
        .arg("--kubeconfig")
        .arg(&kc)
        .args(["get", "configmaps", "-w", "-o", "name"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn kubectl");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    tokio::time::sleep(Duration::from_millis(500)).await;
    kubectl_ok(
        &kc,
        &["create", "configmap", "watched", "--from-literal=a=b"],
    )
    .await;
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("configmap/watched") {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    assert!(seen, "kubectl get -w did not print the new configmap");
    let _ = child.kill().await;

    kubectl_ok(&kc, &["delete", "job", "work", "once"]).await;
    let out = kubectl_ok(&kc, &["get", "jobs", "-o", "name"]).await;
    assert!(out.trim().is_empty(), "{out}");
    sim.shutdown().await;
}

const DSO_YAML: &str = r#"
apiVersion: kedge.dev/v1alpha1
kind: DistributedScaledObject
metadata:
  name: web
spec:
  memberClusters:
  - name: MEMBER
  scaledObjectSpec:
    scaleTargetRef:
      name: web
    advanced:
      horizontalPodAutoscalerConfig:
        behavior:
          scaleUp:
            policies:
            - {type: Pods, value: VALUE, periodSeconds: 60}
"#;

fn write_manifest(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write manifest");
    path.display().to_string()
}

/// Issue 26 with the real kubectl: kedge-sim refuses what kube-apiserver refuses (a value
/// beyond the schema's bound, a DSO without `scaleTargetRef`, a 5,000-character member
/// name), and kubectl's default `--validate=strict` refuses a typo'd field that
/// `--validate=warn` only warns about (and that is then not stored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_sees_schema_validation_and_field_validation() {
    let (sim, kc) = start("k-schema", fast()).await;
    let dir = kc.parent().expect("kubeconfig dir").to_path_buf();
    let crd = format!(
        "{}/../deploy/crds/distributedscaledobjects.kedge.dev.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    kubectl_ok(&kc, &["apply", "-f", &crd]).await;
    kubectl_ok(
        &kc,
        &[
            "wait",
            "--for=condition=Established",
            "crd/distributedscaledobjects.kedge.dev",
            "--timeout=20s",
        ],
    )
    .await;
    let manifest =
        |member: &str, value: &str| DSO_YAML.replace("MEMBER", member).replace("VALUE", value);

    let bad = write_manifest(&dir, "value.yaml", &manifest("m1", "3000000000"));
    let out = kubectl(&kc, &["apply", "-f", &bad]).await;
    let field = "spec.scaledObjectSpec.advanced.horizontalPodAutoscalerConfig.behavior.scaleUp.policies[0].value";
    assert!(!out.ok, "{}", out.stdout);
    assert!(
        // kubectl lists the causes of an Invalid Status itself.
        out.stderr.contains("The DistributedScaledObject \"web\" is invalid")
            && out.stderr.contains(&format!(
                "{field}: Invalid value: 3000000000: {field} in body should be less than or equal to 2147483647"
            )),
        "{}",
        out.stderr
    );

    let long = write_manifest(&dir, "long.yaml", &manifest(&"m".repeat(5_000), "4"));
    let out = kubectl(&kc, &["create", "-f", &long]).await;
    assert!(!out.ok, "{}", out.stdout);
    assert!(
        out.stderr
            .contains("spec.memberClusters[0].name: Too long: may not be more than 63 bytes"),
        "{}",
        out.stderr
    );

    let no_target = write_manifest(
        &dir,
        "no-target.yaml",
        "apiVersion: kedge.dev/v1alpha1\nkind: DistributedScaledObject\nmetadata: {name: web}\nspec:\n  scaledObjectSpec: {minReplicaCount: 1}\n",
    );
    let out = kubectl(&kc, &["apply", "-f", &no_target]).await;
    assert!(!out.ok, "{}", out.stdout);
    assert!(
        out.stderr
            .contains("spec.scaledObjectSpec.scaleTargetRef: Required value"),
        "{}",
        out.stderr
    );

    let typo = write_manifest(
        &dir,
        "typo.yaml",
        &manifest("m1", "4").replace("  memberClusters:", "  memberCluster:"),
    );
    let out = kubectl(&kc, &["apply", "-f", &typo]).await;
    assert!(!out.ok, "{}", out.stdout);
    assert!(
        out.stderr
            .contains("strict decoding error: unknown field \"spec.memberCluster\""),
        "{}",
        out.stderr
    );
    let out = kubectl(&kc, &["apply", "--validate=warn", "-f", &typo]).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("Warning: unknown field \"spec.memberCluster\""),
        "{}",
        out.stderr
    );
    let stored = kubectl_ok(&kc, &["get", "dso", "web", "-o", "jsonpath={.spec}"]).await;
    assert!(!stored.contains("memberCluster"), "{stored}");

    // The same typo in an update (kubectl sends a merge patch) is refused too.
    let out = kubectl(&kc, &["apply", "-f", &typo]).await;
    assert!(!out.ok, "{}", out.stdout);
    assert!(
        out.stderr
            .contains("strict decoding error: unknown field \"spec.memberCluster\""),
        "{}",
        out.stderr
    );
    // And a valid one goes through.
    let good = write_manifest(&dir, "good.yaml", &manifest("m1", "4"));
    kubectl_ok(&kc, &["apply", "-f", &good]).await;
    sim.shutdown().await;
}

const CORE_EVENT: &str = r#"
apiVersion: v1
kind: Event
metadata:
  name: settings.edited
involvedObject:
  apiVersion: v1
  kind: ConfigMap
  name: settings
  namespace: default
  uid: UID
reason: Edited
message: edited through core/v1
type: Normal
source:
  component: test-editor
firstTimestamp: "2026-03-01T11:00:00Z"
lastTimestamp: "2026-03-01T11:05:00Z"
count: 2
"#;

/// Issue 29 (one storage behind core/v1 and events.k8s.io/v1 Events, as on kube-apiserver):
/// a cluster with ConfigMap `settings` and two Events about it, `settings.rotated` created
/// through events.k8s.io/v1 with the kube client (as kube-runtime's `Recorder` and kedge-hub
/// write them) and `settings.edited` through core/v1 with `kubectl create`.
struct EventsFixture {
    sim: kedge_sim::Sim,
    kc: std::path::PathBuf,
    uid: String,
    events: kube::Api<k8s_openapi::api::events::v1::Event>,
    core: kube::Api<k8s_openapi::api::core::v1::Event>,
}

async fn events_fixture(name: &str) -> EventsFixture {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::events::v1::Event;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    use kube::api::{Api, PostParams};

    let (sim, kc) = start(name, fast()).await;
    let dir = kc.parent().expect("kubeconfig dir").to_path_buf();
    let client = sim.clusters()[0].client().expect("client");
    kubectl_ok(
        &kc,
        &["create", "configmap", "settings", "--from-literal=a=b"],
    )
    .await;
    let uid = kubectl_ok(
        &kc,
        &[
            "get",
            "configmap",
            "settings",
            "-o",
            "jsonpath={.metadata.uid}",
        ],
    )
    .await;
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let rotated = Event {
        metadata: ObjectMeta {
            name: Some("settings.rotated".into()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        reporting_controller: Some("kedge-test".into()),
        reporting_instance: Some("test-0".into()),
        action: Some("Rotate".into()),
        reason: Some("Rotated".into()),
        note: Some("settings rotated by the test".into()),
        type_: Some("Warning".into()),
        regarding: Some(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
            name: Some("settings".into()),
            namespace: Some("default".into()),
            uid: Some(uid.clone()),
            ..ObjectReference::default()
        }),
        ..Event::default()
    };
    events
        .create(&PostParams::default(), &rotated)
        .await
        .expect("create events.k8s.io/v1 Event");
    let manifest = write_manifest(&dir, "event.yaml", &CORE_EVENT.replace("UID", &uid));
    kubectl_ok(&kc, &["create", "-f", &manifest]).await;
    EventsFixture {
        core: Api::namespaced(client, "default"),
        sim,
        kc,
        uid,
        events,
    }
}

/// An events.k8s.io/v1 Event shows in `kubectl get events` and `kubectl describe`, which
/// read core/v1 with an `involvedObject.*` field selector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_k8s_io_events_show_in_kubectl_get_and_describe() {
    let EventsFixture {
        sim, kc, uid, core, ..
    } = events_fixture("k-events-get").await;
    let out = kubectl_ok(&kc, &["get", "events", "-n", "default"]).await;
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
        "{out}"
    );
    let row = out
        .lines()
        .find(|l| l.contains("Rotated"))
        .unwrap_or_else(|| panic!("no Rotated event in:\n{out}"));
    for want in [
        "Warning",
        "configmap/settings",
        "settings rotated by the test",
    ] {
        assert!(row.contains(want), "{want:?} missing from {row:?}");
    }
    let out = kubectl_ok(&kc, &["describe", "configmap", "settings"]).await;
    let section = out.split("Events:").nth(1).unwrap_or_default();
    for want in [
        "Warning",
        "Rotated",
        "kedge-test",
        "settings rotated by the test",
        "Edited",
        "edited through core/v1",
    ] {
        assert!(section.contains(want), "{want:?} missing from:\n{out}");
    }
    let got = core.get("settings.rotated").await.expect("core/v1 get");
    assert_eq!(got.message.as_deref(), Some("settings rotated by the test"));
    assert_eq!(got.involved_object.uid.as_deref(), Some(uid.as_str()));
    assert_eq!(got.reporting_component.as_deref(), Some("kedge-test"));
    sim.shutdown().await;
}

/// A core/v1 Event reads through events.k8s.io/v1, found by that API's field labels; each
/// API refuses the other's spellings, as kube-apiserver does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_events_read_through_events_k8s_io_with_its_field_labels() {
    use kube::api::ListParams;

    let EventsFixture {
        sim,
        kc,
        uid,
        events,
        ..
    } = events_fixture("k-events-labels").await;
    let found = events
        .list(&ListParams::default().fields(&format!(
            "regarding.name=settings,regarding.uid={uid},reason=Edited,type=Normal"
        )))
        .await
        .expect("events.k8s.io/v1 list");
    let [edited] = &found.items[..] else {
        panic!("want one Edited event, got {found:?}")
    };
    assert_eq!(edited.note.as_deref(), Some("edited through core/v1"));
    assert_eq!(edited.deprecated_count, Some(2));
    assert_eq!(
        edited
            .deprecated_source
            .as_ref()
            .and_then(|s| s.component.as_deref()),
        Some("test-editor")
    );
    let by_controller = events
        .list(&ListParams::default().fields("reportingController=kedge-test"))
        .await
        .expect("list by reportingController");
    assert_eq!(by_controller.items.len(), 1, "{by_controller:?}");
    let out = kubectl_ok(&kc, &["get", "events.events.k8s.io", "-n", "default"]).await;
    assert!(out.contains("Rotated") && out.contains("Edited"), "{out}");
    let err = events
        .list(&ListParams::default().fields("involvedObject.name=settings"))
        .await
        .expect_err("involvedObject.* is a core/v1 label");
    assert!(
        err.to_string().contains("field label not supported"),
        "{err}"
    );
    let out = kubectl(
        &kc,
        &[
            "get",
            "events",
            "--field-selector",
            "regarding.name=settings",
        ],
    )
    .await;
    assert!(
        !out.ok && out.stderr.contains("field label not supported"),
        "{out:?}"
    );
    sim.shutdown().await;
}

/// A core/v1 watch sees the Events of both APIs in the core shape; a deletecollection
/// through core/v1 and a delete through events.k8s.io/v1 remove them from both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_and_deletes_span_both_event_apis() {
    use futures::{StreamExt, TryStreamExt};
    use kube::api::{DeleteParams, ListParams, WatchEvent, WatchParams};

    let EventsFixture {
        sim,
        kc,
        events,
        core,
        ..
    } = events_fixture("k-events-watch").await;
    let params =
        WatchParams::default().fields("involvedObject.kind=ConfigMap,involvedObject.name=settings");
    let mut stream = core.watch(&params, "0").await.expect("watch").boxed();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match stream.try_next().await.expect("watch event") {
            Some(WatchEvent::Added(e)) => seen.push((e.reason, e.message)),
            other => panic!("unexpected {other:?}"),
        }
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            (Some("Edited".into()), Some("edited through core/v1".into())),
            (
                Some("Rotated".into()),
                Some("settings rotated by the test".into())
            ),
        ]
    );
    core.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().fields("source=kedge-test"),
    )
    .await
    .expect("core/v1 deletecollection");
    assert!(
        events
            .get_opt("settings.rotated")
            .await
            .expect("get")
            .is_none()
    );
    events
        .delete("settings.edited", &DeleteParams::default())
        .await
        .expect("events.k8s.io/v1 delete");
    assert!(
        core.get_opt("settings.edited")
            .await
            .expect("get")
            .is_none()
    );
    let out = kubectl_ok(&kc, &["get", "events", "-n", "default"]).await;
    assert!(!out.contains("settings"), "{out}");
    sim.shutdown().await;
}
