//! The push-style baseline (Kedify's architecture): a controller on the hub side holds one
//! Kubernetes client per member cluster and, when the DSO's total changes, patches every
//! member's `/scale` directly. Here that controller is a separate process (this bench binary
//! again, so its memory and CPU are its own): it watches the DSO on the simulated hub cluster
//! and patches each member's `/scale` over HTTPS, each member with its own client and TLS
//! connection, all members at once. Each member's API server is a stand-in in the bench's
//! process: TLS with a certificate from the bench's CA, a bearer token, and the
//! `deployments/scale` endpoint of one Deployment kept in memory — the counterpart of the
//! virtual agents, which keep their counts in memory too.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use k8s_openapi::api::apps::v1::Deployment;
use kedge_core::crd::DistributedScaledObject;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::io::AsyncBufReadExt;
use tokio::net::TcpListener;

/// The environment variable that makes this bench binary the push controller: the path of
/// its [`PushConfig`].
pub(crate) const PUSHER_ENV: &str = "FLEET_BENCH_PUSHER";
/// The token every member's stand-in API server requires.
const TOKEN: &str = "fleet-bench-push-controller";
const SCALE_PATH: &str = "/apis/apps/v1/namespaces/default/deployments/app/scale";

/// What the push controller is told: where the hub's API server and the members are.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PushConfig {
    /// The simulated hub cluster's API server (plain HTTP on loopback).
    pub(crate) hub_url: String,
    /// Each member's API server.
    pub(crate) members: Vec<String>,
    /// The CA that signed the members' serving certificates (PEM).
    pub(crate) ca_pem: String,
}

/// Per member: the replica count its stand-in API server holds and when it was set.
pub(crate) type Held = Arc<Vec<Mutex<(i32, Option<Instant>)>>>;

/// Members whose stand-in API servers share one listener, each under a path of its own
/// (`https://ADDR/mINDEX`, a cluster URL with a path as kube clients take it). A listener
/// and an accepted connection per member were 20,000 file descriptors at 10,000 members, the
/// limit of this machine's processes: the last connections were refused.
const MEMBERS_PER_LISTENER: usize = 8;

/// Starts the stand-in API servers of `count` members on loopback; returns their URLs.
pub(crate) async fn start_members(
    count: usize,
    tls: Arc<rustls::ServerConfig>,
    held: Held,
) -> Vec<String> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut urls = Vec::with_capacity(count);
    for first in (0..count).step_by(MEMBERS_PER_LISTENER) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let members = first..(first + MEMBERS_PER_LISTENER).min(count);
        urls.extend(
            members
                .clone()
                .map(|index| format!("https://{addr}/m{index}")),
        );
        let (acceptor, held) = (acceptor.clone(), held.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, held, members) = (acceptor.clone(), held.clone(), members.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |request| {
                        let (held, members) = (held.clone(), members.clone());
                        async move { Ok::<_, hyper::Error>(answer(request, &held, members).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
    }
    urls
}

/// The member a request's path names (`/mINDEX/...`) among those of its listener, and the
/// rest of the path.
fn member_of(path: &str, members: std::ops::Range<usize>) -> Option<(usize, &str)> {
    let rest = path.strip_prefix("/m")?;
    let slash = rest.find('/')?;
    let index: usize = rest[..slash].parse().ok()?;
    members.contains(&index).then(|| (index, &rest[slash..]))
}

/// `GET` or `PATCH` of `deployments/app/scale`, with the token; anything else is refused.
async fn answer(
    request: Request<Incoming>,
    held: &Held,
    members: std::ops::Range<usize>,
) -> Response<Full<Bytes>> {
    let respond = |status: StatusCode, body: serde_json::Value| {
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap()
    };
    let authorized = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {TOKEN}"));
    if !authorized {
        return respond(
            StatusCode::UNAUTHORIZED,
            json!({"kind": "Status", "code": 401}),
        );
    }
    let Some(index) = member_of(request.uri().path(), members)
        .filter(|(_, rest)| *rest == SCALE_PATH)
        .map(|(index, _)| index)
    else {
        return respond(
            StatusCode::NOT_FOUND,
            json!({"kind": "Status", "code": 404}),
        );
    };
    let method = request.method().clone();
    if method == Method::PATCH {
        let body = request.into_body().collect().await.map(|b| b.to_bytes());
        let replicas = body
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v.pointer("/spec/replicas").and_then(|r| r.as_i64()));
        let Some(replicas) = replicas.and_then(|r| i32::try_from(r).ok()) else {
            return respond(
                StatusCode::BAD_REQUEST,
                json!({"kind": "Status", "code": 400}),
            );
        };
        *held[index].lock().unwrap() = (replicas, Some(Instant::now()));
    } else if method != Method::GET {
        return respond(
            StatusCode::METHOD_NOT_ALLOWED,
            json!({"kind": "Status", "code": 405}),
        );
    }
    let replicas = held[index].lock().unwrap().0;
    respond(
        StatusCode::OK,
        json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": "app", "namespace": "default"},
            "spec": {"replicas": replicas}, "status": {"replicas": replicas}}),
    )
}

/// Starts this bench binary as the push controller. It prints `started`, creates its member
/// clients once it reads a line on its stdin (so that its memory can be read before), prints
/// `clients`, and `pushed N` after each fan-out.
pub(crate) fn start_pusher(dir: &Path, config: &PushConfig) -> tokio::process::Child {
    let path: PathBuf = dir.join("pusher.json");
    std::fs::write(&path, serde_json::to_vec(config).unwrap()).unwrap();
    tokio::process::Command::new(std::env::current_exe().unwrap())
        .env(PUSHER_ENV, &path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Reads the push controller's output until a line starting with `prefix`.
pub(crate) async fn expect_line(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    prefix: &str,
) {
    let found = tokio::time::timeout(super::STEP_LIMIT, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.starts_with(prefix) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "the push controller never said {prefix:?}");
}

/// The push controller (in its own process): a client per member, a watch on the DSO, and
/// on every new total, `total / members` patched into every member's `/scale` at once.
pub(crate) async fn run_pusher(config_path: &str) {
    let config: PushConfig = serde_json::from_slice(&std::fs::read(config_path).unwrap()).unwrap();
    let hub = Client::try_from(kube::Config::new(config.hub_url.parse().unwrap())).unwrap();
    let ca_der = rustls_pki_types::pem::PemObject::from_pem_slice(config.ca_pem.as_bytes())
        .map(|c: rustls_pki_types::CertificateDer<'static>| c.to_vec())
        .unwrap();
    // Before any member client: the bench reads this process's memory, then says go.
    println!("started");
    tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new()))
        .await
        .unwrap()
        .unwrap();
    let members: Vec<Api<Deployment>> = config
        .members
        .iter()
        .map(|url| {
            let mut c = kube::Config::new(url.parse().unwrap());
            c.root_cert = Some(vec![ca_der.clone()]);
            c.tls_server_name = Some("localhost".into());
            c.auth_info.token = Some(TOKEN.to_owned().into());
            Api::namespaced(Client::try_from(c).unwrap(), super::NS)
        })
        .collect();
    println!("clients");
    let dsos: Api<DistributedScaledObject> = Api::namespaced(hub, super::NS);
    let watch = watcher(
        dsos,
        watcher::Config::default().fields(&format!("metadata.name={}", super::WORKLOAD)),
    )
    .applied_objects();
    let mut watch = std::pin::pin!(watch);
    let mut last = None;
    let patch_params = PatchParams::default();
    while let Some(dso) = watch.next().await {
        let Ok(dso) = dso else { continue };
        let total = dso.spec.total_target_replicas;
        if total == last {
            continue;
        }
        last = total;
        let Some(total) = total else { continue };
        let each = total / members.len() as i32;
        let patch = Patch::Merge(json!({"spec": {"replicas": each}}));
        // A failed patch is retried, as a controller requeues it (at 10,000 members some
        // connections of the first fan-out are refused by the listeners' backlogs).
        let mut pending: Vec<&Api<_>> = members.iter().collect();
        for attempt in 1..=10 {
            let pushed = futures::future::join_all(
                pending
                    .iter()
                    .map(|m| m.patch_scale(super::WORKLOAD, &patch_params, &patch)),
            )
            .await;
            if let Some(Err(e)) = pushed.iter().find(|r| r.is_err()) {
                eprintln!(
                    "push: {} of {} patches failed (attempt {attempt}), e.g. {e}; retrying",
                    pushed.iter().filter(|r| r.is_err()).count(),
                    pending.len()
                );
            }
            pending = pending
                .into_iter()
                .zip(&pushed)
                .filter(|(_, r)| r.is_err())
                .map(|(m, _)| m)
                .collect();
            if pending.is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200 * attempt)).await;
        }
        println!("pushed {total}");
    }
}

/// Reads the push controller's stdout line by line.
pub(crate) fn lines(
    child: &mut tokio::process::Child,
) -> tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>> {
    tokio::io::BufReader::new(child.stdout.take().unwrap()).lines()
}
