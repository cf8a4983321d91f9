//! `kedge-sim serve` runs pods whose image is mapped to a local executable as real
//! processes: the real kubectl sees their env, mounted Secret, logs, restarts and deletion;
//! and `kubectl kedge install hub | kubectl apply -f -` gives a hub that runs, answers its
//! readiness probe and writes its CA Secret with its ServiceAccount's RBAC.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod sim_support;
mod support;

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use sim_support::{Serve, kubectl, kubectl_ok};

const LIMIT: Duration = Duration::from_secs(60);
/// The test image, mapped to /bin/sh.
const SH: &str = "test.kedge.dev/sh";

/// `kedge-sim serve --clusters CLUSTERS` with fast pods and `extra` flags.
async fn serve(clusters: &str, extra: &[&str]) -> Serve {
    let mut args = vec!["--clusters", clusters, "--pod-start-delay-ms", "100"];
    args.extend_from_slice(extra);
    Serve::start(&support::bin("kedge-sim"), &args).await
}

async fn apply(kc: &Path, yaml: &str) {
    let file = kc.with_extension(format!(
        "{}.yaml",
        kedge_sim::util::random_u64() % 1_000_000
    ));
    std::fs::write(&file, yaml).unwrap();
    kubectl_ok(kc, &["apply", "-f", file.to_str().unwrap()]).await;
}

async fn pod_json(kc: &Path, ns: &str, name: &str) -> Option<Value> {
    let out = kubectl(kc, &["-n", ns, "get", "pod", name, "-o", "json"]).await;
    out.ok.then(|| serde_json::from_str(&out.stdout).unwrap())
}

/// Waits until `check` accepts the pod; returns it.
async fn wait_pod(kc: &Path, name: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let start = std::time::Instant::now();
    loop {
        let pod = pod_json(kc, "default", name).await;
        if let Some(p) = pod.as_ref().filter(|p| check(p)) {
            return p.clone();
        }
        assert!(
            start.elapsed() < LIMIT,
            "pod {name}: {what}; last seen {pod:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn pid_of(pod: &Value) -> u32 {
    let id = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap_or_default();
    id.strip_prefix("kedge-sim://")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("containerID {id:?} is not kedge-sim://PID"))
}

fn alive(pid: u32) -> bool {
    // A zombie has exited: only its entry is left until its parent reaps it.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

async fn wait_gone(pid: u32) {
    let start = std::time::Instant::now();
    while alive(pid) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "process {pid} still runs"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn run_image_sh() -> String {
    format!("{SH}=/bin/sh")
}

const PRINTER: &str = r#"
apiVersion: v1
kind: Secret
metadata: {name: creds}
data: {password: czNjcmV0}
---
apiVersion: v1
kind: Pod
metadata: {name: printer, labels: {app: printer}}
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: test.kedge.dev/sh:1.0
    args:
    - -c
    - 'echo "GREETING=$GREETING"; echo "NS=$NS"; echo "PASS=$PASS"; echo "FILE=$(cat "$1")"; echo "ARG=$(NS)"; echo "KC=$KUBECONFIG"; exec sleep 300'
    - sh
    - /etc/creds/password
    env:
    - {name: GREETING, value: hello}
    - name: NS
      valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
    - name: PASS
      valueFrom: {secretKeyRef: {name: creds, key: password}}
    volumeMounts:
    - {name: creds, mountPath: /etc/creds, readOnly: true}
  volumes:
  - name: creds
    secret: {secretName: creds}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapped_image_runs_with_its_env_and_secret_logs_and_stops_when_deleted() {
    let serve = serve("east", &["--run-image", &run_image_sh()]).await;
    let kc = serve.kubeconfig("east");
    apply(&kc, PRINTER).await;
    let pod = wait_pod(&kc, "printer", "Ready", |p| {
        p["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
    })
    .await;
    assert_eq!(pod["status"]["phase"], "Running");
    let pid = pid_of(&pod);
    assert!(alive(pid), "the container's process {pid} runs");
    let ip = pod["status"]["podIP"].as_str().unwrap();
    assert!(ip.starts_with("127."), "a loopback pod IP: {ip}");

    let start = std::time::Instant::now();
    let log = loop {
        let out = kubectl(&kc, &["logs", "printer"]).await;
        if out.ok && out.stdout.contains("KC=") {
            break out.stdout;
        }
        assert!(start.elapsed() < LIMIT, "kubectl logs printer: {out:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for line in [
        "GREETING=hello",
        "NS=default",
        "PASS=s3cret",
        "FILE=s3cret",
        "ARG=default",
    ] {
        assert!(
            log.lines().any(|l| l == line),
            "{line:?} in the log:\n{log}"
        );
    }
    let kubeconfig = log.lines().find_map(|l| l.strip_prefix("KC=")).unwrap();
    assert!(
        std::fs::read_to_string(kubeconfig)
            .unwrap()
            .contains("token: kedge-sim."),
        "KUBECONFIG holds a ServiceAccount token"
    );
    let tail = kubectl_ok(&kc, &["logs", "printer", "--tail=1"]).await;
    assert_eq!(tail.trim_end(), format!("KC={kubeconfig}"));
    logs_need_get_on_pods_log(&kc).await;

    kubectl_ok(&kc, &["delete", "pod", "printer"]).await;
    wait_gone(pid).await;
    serve.stop().await;
}

/// Pod logs as ServiceAccount `reader` (through kube-rs: kubectl sends no token over plain
/// HTTP): forbidden with `get pods` alone, allowed once its Role grants `get pods/log`.
async fn logs_need_get_on_pods_log(kc: &Path) {
    let role = |resources: &str| {
        format!(
            "{{apiVersion: rbac.authorization.k8s.io/v1, kind: Role, metadata: {{name: reader}}, rules: [{{apiGroups: [''], resources: [{resources}], verbs: [get]}}]}}"
        )
    };
    apply(
        kc,
        "{apiVersion: v1, kind: ServiceAccount, metadata: {name: reader}}",
    )
    .await;
    apply(kc, &role("pods")).await;
    apply(kc, "{apiVersion: rbac.authorization.k8s.io/v1, kind: RoleBinding, metadata: {name: reader}, roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: reader}, subjects: [{kind: ServiceAccount, name: reader, namespace: default}]}").await;
    let token = kubectl_ok(kc, &["create", "token", "reader"]).await;
    let admin = std::fs::read_to_string(kc).unwrap();
    let reader = admin.replace(
        "  user: {}\n",
        &format!("  user:\n    token: {}\n", token.trim()),
    );
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&reader).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::default_namespaced(kube::Client::try_from(config).unwrap());
    let params = kube::api::LogParams::default();
    match pods.logs("printer", &params).await {
        Err(kube::Error::Api(e)) if e.code == 403 => {
            assert!(e.message.contains("pods/log"), "{}", e.message);
        }
        other => panic!("logs without pods/log: {other:?}"),
    }
    apply(kc, &role("pods, pods/log")).await;
    let log = pods.logs("printer", &params).await.unwrap();
    assert!(log.contains("GREETING=hello"), "{log}");
}

const CRASHER: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: crasher}
spec:
  containers:
  - name: main
    image: test.kedge.dev/sh
    args: [-c, 'echo boom; exit 1']
---
apiVersion: v1
kind: Pod
metadata: {name: once}
spec:
  restartPolicy: Never
  containers:
  - name: main
    image: test.kedge.dev/sh
    args: [-c, 'echo done']
---
apiVersion: v1
kind: Pod
metadata: {name: unhealthy}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: test.kedge.dev/sh
    args: [-c, 'exec sleep 300']
    livenessProbe:
      tcpSocket: {port: 1}
      periodSeconds: 1
      failureThreshold: 2
---
apiVersion: v1
kind: Pod
metadata: {name: waiting}
spec:
  containers:
  - name: main
    image: test.kedge.dev/sh
    args: [-c, 'echo "KEY=$KEY"; exec sleep 300']
    env:
    - name: KEY
      valueFrom: {secretKeyRef: {name: later, key: key}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exits_restart_with_back_off_or_end_the_pod_and_a_missing_secret_waits() {
    let serve = serve("west", &["--run-image", &run_image_sh()]).await;
    let kc = serve.kubeconfig("west");
    apply(&kc, CRASHER).await;
    let crashed = wait_pod(&kc, "crasher", "CrashLoopBackOff after a restart", |p| {
        let c = &p["status"]["containerStatuses"][0];
        c["state"]["waiting"]["reason"] == "CrashLoopBackOff"
            && c["restartCount"].as_u64().is_some_and(|n| n >= 1)
    })
    .await;
    let c = &crashed["status"]["containerStatuses"][0];
    assert_eq!(c["lastState"]["terminated"]["exitCode"], 1);
    assert_eq!(c["lastState"]["terminated"]["reason"], "Error");
    assert_eq!(crashed["status"]["phase"], "Running");
    let previous = kubectl_ok(&kc, &["logs", "crasher", "--previous"]).await;
    assert_eq!(previous.trim(), "boom");

    let unhealthy = wait_pod(&kc, "unhealthy", "restarted by its liveness probe", |p| {
        p["status"]["containerStatuses"][0]["restartCount"]
            .as_u64()
            .is_some_and(|n| n >= 1)
    })
    .await;
    assert_eq!(
        unhealthy["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"], 143,
        "SIGTERM ended the unhealthy process"
    );

    let once = wait_pod(&kc, "once", "Succeeded", |p| {
        p["status"]["phase"] == "Succeeded"
    })
    .await;
    assert_eq!(
        once["status"]["containerStatuses"][0]["state"]["terminated"]["reason"],
        "Completed"
    );
    assert_eq!(kubectl_ok(&kc, &["logs", "once"]).await.trim(), "done");
    assert_eq!(
        kubectl_ok(&kc, &["logs", "-f", "once"]).await.trim(),
        "done",
        "following an ended container's log ends"
    );

    let waiting = wait_pod(&kc, "waiting", "CreateContainerConfigError", |p| {
        p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
            == "CreateContainerConfigError"
    })
    .await;
    assert_eq!(
        waiting["status"]["containerStatuses"][0]["state"]["waiting"]["message"],
        "secret \"later\" not found"
    );
    assert_eq!(waiting["status"]["phase"], "Pending");
    kubectl_ok(
        &kc,
        &[
            "create",
            "secret",
            "generic",
            "later",
            "--from-literal=key=now",
        ],
    )
    .await;
    let running = wait_pod(&kc, "waiting", "Running once the Secret exists", |p| {
        p["status"]["phase"] == "Running" && p["status"]["containerStatuses"][0]["ready"] == true
    })
    .await;
    let pid = pid_of(&running);
    serve.stop().await;
    assert!(
        !alive(pid),
        "kedge-sim stopped its processes when it stopped"
    );
}

/// KEDA's namespace and CRDs, which the hub's manifests and scaler expect.
async fn install_keda(kc: &Path) {
    apply(
        kc,
        "{apiVersion: v1, kind: Namespace, metadata: {name: keda}}",
    )
    .await;
    let assets = concat!(env!("CARGO_MANIFEST_DIR"), "/../sim/assets");
    for file in [
        "scaledobject-crd.yaml",
        "clustertriggerauthentication-crd.yaml",
    ] {
        kubectl_ok(kc, &["apply", "-f", &format!("{assets}/{file}")]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_kedge_install_hub_runs_the_real_hub_that_rollout_status_waits_for() {
    let serve = serve("hub", &[]).await;
    let kc = serve.kubeconfig("hub");
    install_keda(&kc).await;
    let manifests = tokio::process::Command::new(support::bin("kubectl-kedge"))
        .args([
            "install",
            "hub",
            "--server-dns-names",
            "kedge-hub.example.com",
        ])
        .output()
        .await
        .unwrap();
    assert!(
        manifests.status.success(),
        "{}",
        String::from_utf8_lossy(&manifests.stderr)
    );
    apply(&kc, &String::from_utf8(manifests.stdout).unwrap()).await;
    let rollout = kubectl(
        &kc,
        &[
            "-n",
            "kedge-system",
            "rollout",
            "status",
            "deploy/kedge-hub",
            "--timeout=60s",
        ],
    )
    .await;
    let logs = kubectl(&kc, &["-n", "kedge-system", "logs", "deploy/kedge-hub"]).await;
    assert!(rollout.ok, "rollout status: {rollout:?}\nhub log: {logs:?}");
    assert!(
        logs.ok && !logs.stdout.trim().is_empty(),
        "the hub's log: {logs:?}"
    );
    let pods = kubectl_ok(&kc, &["-n", "kedge-system", "get", "pods", "-o", "json"]).await;
    let pods: Value = serde_json::from_str(&pods).unwrap();
    let pod = &pods["items"][0];
    assert!(alive(pid_of(pod)), "the hub runs as a process: {pod:#}");
    let ca = kubectl(
        &kc,
        &["-n", "kedge-system", "get", "secret", "kedge-hub-ca"],
    )
    .await;
    assert!(ca.ok, "the hub wrote its CA Secret: {ca:?}");
    serve.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_image_flags_are_checked_before_anything_starts() {
    let dir = std::env::temp_dir().join(format!("kedge-sim-run-image-{}", std::process::id()));
    let tmp = tempfile::tempdir().unwrap();
    let plain = tmp.path().join("plain");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    let not_executable = format!("test.kedge.dev/x={}", plain.display());
    let not_executable_error = format!("{}: not an executable file", plain.display());
    for (flag, error) in [
        (
            "test.kedge.dev/x=/nonexistent/sh",
            "/nonexistent/sh: no such file",
        ),
        (not_executable.as_str(), not_executable_error.as_str()),
        ("test.kedge.dev/x:1.0=/bin/sh", "without a tag or digest"),
        ("/bin/sh", "is not IMAGE=PATH"),
    ] {
        let run = tokio::process::Command::new(support::bin("kedge-sim"))
            .args(["serve", "--clusters", "a", "--run-image", flag, "--dir"])
            .arg(&dir)
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(20), run)
            .await
            .unwrap_or_else(|_| panic!("{flag}: accepted, kedge-sim serves"))
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag}: accepted");
        assert!(stderr.contains(error), "{flag}: {stderr}");
    }
    assert!(!dir.exists(), "nothing started");
}
