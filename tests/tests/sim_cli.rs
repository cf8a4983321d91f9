//! The `kedge-sim serve` command.

mod sim_support;
mod support;

use std::path::Path;
use std::time::Duration;

use sim_support::Serve;

/// `kedge-sim serve ARGS` once it says it is ready.
async fn serve(args: &[&str]) -> Serve {
    Serve::start(&support::bin("kedge-sim"), args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_writes_kubeconfigs_and_stops_on_sigterm() {
    let serve = serve(&["--clusters", "east,west", "--nodes", "2", "--node-cpu", "4"]).await;
    let dir = serve.dir().to_path_buf();
    for name in ["east", "west"] {
        let kc = dir.join(format!("{name}.kubeconfig"));
        let out = sim_support::kubectl_ok(
            &kc,
            &[
                "get",
                "nodes",
                "-o",
                "jsonpath={.items[*].status.capacity.cpu}",
            ],
        )
        .await;
        assert_eq!(out, "4 4");
        let out = sim_support::kubectl_ok(&kc, &["config", "current-context"]).await;
        assert_eq!(out.trim(), name);
        // The one kubeconfig has the same cluster as the context of its name.
        let all = dir.join("kubeconfig");
        let out = sim_support::kubectl_ok(
            &all,
            &[
                "--context",
                name,
                "get",
                "nodes",
                "-o",
                "jsonpath={.items[*].status.capacity.cpu}",
            ],
        )
        .await;
        assert_eq!(out, "4 4");
    }
    let current =
        sim_support::kubectl_ok(&dir.join("kubeconfig"), &["config", "current-context"]).await;
    assert_eq!(current.trim(), "east", "the first cluster is current");

    serve.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_keda_for_a_cluster_it_does_not_serve() {
    let out = tokio::process::Command::new(support::bin("kedge-sim"))
        .args(["serve", "--clusters", "mgmt,edge", "--keda", "hub", "--dir"])
        .arg(std::env::temp_dir().join("kedge-sim-cli-never"))
        .output()
        .await
        .expect("run kedge-sim");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--keda hub: not one of the --clusters (mgmt,edge)"),
        "{err}"
    );
}

/// Answers each datagram with `name` and the datagram.
async fn udp_echo(addr: &str, name: &'static str) -> tokio::task::JoinHandle<()> {
    let s = tokio::net::UdpSocket::bind(addr).await.expect("bind udp");
    tokio::spawn(async move {
        let mut buf = [0u8; 64];
        while let Ok((n, from)) = s.recv_from(&mut buf).await {
            let mut out = name.as_bytes().to_vec();
            out.extend_from_slice(&buf[..n]);
            let _ = s.send_to(&out, from).await;
        }
    })
}

async fn udp_ask(to: &str) -> Option<String> {
    let c = tokio::net::UdpSocket::bind("127.0.0.1:0").await.ok()?;
    c.send_to(b"?", to).await.ok()?;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_millis(500), c.recv(&mut buf))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

async fn tcp_ask(to: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(to).await.ok()?;
    c.write_all(b"?").await.ok()?;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_millis(500), c.read(&mut buf))
        .await
        .ok()?
        .ok()?;
    (n > 0).then(|| String::from_utf8_lossy(&buf[..n]).into_owned())
}

async fn jsonpath(kc: &Path, args: &[&str], path: &str) -> String {
    let mut all = args.to_vec();
    let expr = format!("jsonpath={path}");
    all.extend(["-o", &expr]);
    sim_support::kubectl_ok(kc, &all).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_installs_keda_where_asked_and_load_balancers_forward_to_ready_pods() {
    let serve = serve(&[
        "--clusters",
        "mgmt,edge",
        "--keda",
        "mgmt",
        "--pod-start-delay-ms",
        "100",
    ])
    .await;
    let dir = serve.dir().to_path_buf();
    let kc = dir.join("kubeconfig");
    // KEDA's namespace and CRDs in mgmt only.
    for (ctx, has) in [("mgmt", true), ("edge", false)] {
        for what in [
            vec!["get", "namespace", "keda"],
            vec!["get", "crd", "scaledobjects.keda.sh"],
        ] {
            let mut args = vec!["--context", ctx];
            args.extend(what.iter().copied());
            let out = sim_support::kubectl(&kc, &args).await;
            assert_eq!(out.ok, has, "{ctx} {what:?}: {}{}", out.stdout, out.stderr);
        }
    }

    // A LoadBalancer Service with a UDP and a TCP port, named target ports.
    let manifest = dir.join("lb.yaml");
    std::fs::write(
        &manifest,
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: hub, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: hub}}
  template:
    metadata: {labels: {app: hub}}
    spec:
      containers:
      - name: hub
        image: example.com/hub
        ports:
        - {name: quic, containerPort: 7443, protocol: UDP}
        - {name: ops, containerPort: 8080}
---
apiVersion: v1
kind: Service
metadata: {name: hub, namespace: default}
spec:
  type: LoadBalancer
  selector: {app: hub}
  ports:
  - {name: quic, port: 7443, protocol: UDP, targetPort: quic}
  - {name: ops, port: 80, targetPort: ops}
"#,
    )
    .unwrap();
    sim_support::kubectl_ok(
        &kc,
        &[
            "--context",
            "mgmt",
            "apply",
            "-f",
            manifest.to_str().unwrap(),
        ],
    )
    .await;
    sim_support::kubectl_ok(
        &kc,
        &[
            "--context",
            "mgmt",
            "rollout",
            "status",
            "deploy/hub",
            "--timeout=30s",
        ],
    )
    .await;
    let pod_ip = jsonpath(
        &kc,
        &["--context", "mgmt", "get", "pods", "-l", "app=hub"],
        "{.items[0].status.podIP}",
    )
    .await;
    let kc2 = kc.clone();
    let lb_ip = sim_support::eventually(10, || {
        let kc = kc2.clone();
        async move {
            let ip = jsonpath(
                &kc,
                &["--context", "mgmt", "get", "svc", "hub"],
                "{.status.loadBalancer.ingress[0].ip}",
            )
            .await;
            (!ip.is_empty()).then_some(ip)
        }
    })
    .await;
    assert_ne!(lb_ip, pod_ip, "the Service has its own address");
    let table = sim_support::kubectl_ok(&kc, &["--context", "mgmt", "get", "svc", "hub"]).await;
    assert!(table.contains(&lb_ip), "EXTERNAL-IP shows it:\n{table}");

    // The test plays the pod's process: servers on the pod's IP and container ports.
    let _udp = udp_echo(&format!("{pod_ip}:7443"), "udp").await;
    let tcp = tokio::net::TcpListener::bind(format!("{pod_ip}:8080"))
        .await
        .unwrap();
    let _tcp = tokio::spawn(async move {
        while let Ok((mut s, _)) = tcp.accept().await {
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = [0u8; 8];
                if let Ok(n) = s.read(&mut buf).await {
                    let _ = s.write_all(&[b"tcp", &buf[..n]].concat()).await;
                }
            });
        }
    });
    let udp_to = format!("{lb_ip}:7443");
    let answer = sim_support::eventually(10, || {
        let to = udp_to.clone();
        async move { udp_ask(&to).await }
    })
    .await;
    assert_eq!(answer, "udp?");
    let tcp_to = format!("{lb_ip}:80");
    let answer = sim_support::eventually(10, || {
        let to = tcp_to.clone();
        async move { tcp_ask(&to).await }
    })
    .await;
    assert_eq!(answer, "tcp?");

    // No ready endpoint, nothing answers; the address stays the Service's.
    sim_support::kubectl_ok(
        &kc,
        &["--context", "mgmt", "scale", "deploy/hub", "--replicas=0"],
    )
    .await;
    sim_support::eventually(10, || {
        let to = tcp_to.clone();
        async move { tcp_ask(&to).await.is_none().then_some(()) }
    })
    .await;
    let again = jsonpath(
        &kc,
        &["--context", "mgmt", "get", "svc", "hub"],
        "{.status.loadBalancer.ingress[0].ip}",
    )
    .await;
    assert_eq!(again, lb_ip);
}
