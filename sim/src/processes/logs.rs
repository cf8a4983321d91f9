//! Container logs: one file per run (`POD_DIR/logs/CONTAINER/N.log`, N the restart count, as
//! kubelet keeps them under /var/log/pods), served as `GET …/pods/NAME/log` with
//! `container`, `previous`, `tailLines`, `limitBytes` and `follow`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tokio::io::AsyncReadExt as _;

use crate::cluster::ClusterShared;
use crate::error::{Error, Result};
use crate::http::Req;
use crate::util::get_path;

/// How often a followed log is read again.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// The directory of a process pod's files (volumes, kubeconfig, logs).
pub(crate) fn pod_dir(cluster_dir: &Path, ns: &str, name: &str) -> PathBuf {
    cluster_dir.join(ns).join(name)
}

/// The log file of a container's run `n` (0 for the first start).
pub(crate) fn log_path(pod_dir: &Path, container: &str, n: u32) -> PathBuf {
    pod_dir
        .join("logs")
        .join(container)
        .join(format!("{n}.log"))
}

/// The newest run of a container that has a log.
fn current_run(pod_dir: &Path, container: &str) -> Option<u32> {
    std::fs::read_dir(pod_dir.join("logs").join(container))
        .ok()?
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_suffix(".log")?
                .parse()
                .ok()
        })
        .max()
}

/// What `tailLines` then `limitBytes` leave of a log.
pub(crate) fn select(log: &[u8], tail_lines: Option<usize>, limit_bytes: Option<usize>) -> &[u8] {
    let mut start = 0;
    if let Some(n) = tail_lines {
        let body = log.strip_suffix(b"\n").unwrap_or(log);
        start = if n == 0 {
            log.len()
        } else {
            body.iter()
                .enumerate()
                .rev()
                .filter(|(_, b)| **b == b'\n')
                .nth(n - 1)
                .map_or(0, |(i, _)| i + 1)
        };
    }
    let out = &log[start..];
    match limit_bytes {
        Some(n) if n < out.len() => &out[..n],
        _ => out,
    }
}

fn number(r: &Req, key: &str) -> Result<Option<usize>> {
    r.q(key)
        .map(|v| {
            v.parse()
                .map_err(|_| Error::BadRequest(format!("invalid {key}: {v:?}")))
        })
        .transpose()
}

fn text(body: Body) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain")], body).into_response()
}

/// The container the request names, or the pod's only one.
fn container_of(pod: &Value, name: &str, asked: Option<&str>) -> Result<String> {
    let names: Vec<&str> = get_path(pod, "spec.containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str))
        .collect();
    match (asked, names.as_slice()) {
        (Some(c), _) if names.contains(&c) => Ok(c.to_string()),
        (Some(c), _) => Err(Error::BadRequest(format!(
            "container {c} is not valid for pod {name}"
        ))),
        (None, [only]) => Ok((*only).to_string()),
        (None, _) => Err(Error::BadRequest(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            names.join(" ")
        ))),
    }
}

/// `GET /api/v1/namespaces/NS/pods/NAME/log`. A simulated pod's log is empty.
pub(crate) fn serve(c: &Arc<ClusterShared>, r: &Req, ns: &str, name: &str) -> Result<Response> {
    let pod = c
        .store()
        .get("/pods", ns, name)
        .cloned()
        .ok_or_else(|| Error::not_found("", "pods", name))?;
    let container = container_of(&pod, name, r.q("container"))?;
    let (tail, limit) = (number(r, "tailLines")?, number(r, "limitBytes")?);
    let Some(dir) = c.pods_dir.as_deref().map(|d| pod_dir(d, ns, name)) else {
        return Ok(text(Body::empty()));
    };
    let Some(run) = current_run(&dir, &container) else {
        return Ok(text(Body::empty()));
    };
    let run = if r.flag("previous") {
        run.checked_sub(1).ok_or_else(|| {
            Error::BadRequest(format!(
                "previous terminated container \"{container}\" in pod \"{name}\" not found"
            ))
        })?
    } else {
        run
    };
    let path = log_path(&dir, &container, run);
    let log = std::fs::read(&path).unwrap_or_default();
    let first = Bytes::copy_from_slice(select(&log, tail, limit));
    if !r.flag("follow") || r.flag("previous") || limit.is_some() {
        return Ok(text(Body::from(first)));
    }
    let follow = Follow {
        c: c.clone(),
        dir,
        container,
        run,
        uid: crate::util::meta_str(&pod, "uid")
            .unwrap_or_default()
            .to_string(),
        ns: ns.to_string(),
        name: name.to_string(),
        offset: log.len() as u64,
        path,
    };
    let rest = futures::stream::unfold(follow, |mut f| async move {
        let bytes = f.next().await?;
        Some((Ok::<_, std::io::Error>(bytes), f))
    });
    let head = futures::stream::once(async move { Ok::<_, std::io::Error>(first) });
    Ok(text(Body::from_stream(futures::StreamExt::chain(
        head, rest,
    ))))
}

/// A followed log: new bytes as they are written, until the run ends (the container
/// exited, or the pod is gone) or the simulator stops.
struct Follow {
    c: Arc<ClusterShared>,
    dir: PathBuf,
    container: String,
    run: u32,
    uid: String,
    ns: String,
    name: String,
    path: PathBuf,
    offset: u64,
}

impl Follow {
    /// Whether the run still writes: the same pod has the container running, on this run.
    fn live(&self) -> bool {
        let running = self
            .c
            .store()
            .get("/pods", &self.ns, &self.name)
            .filter(|p| crate::util::meta_str(p, "uid") == Some(&self.uid))
            .and_then(|p| get_path(p, "status.containerStatuses")?.as_array().cloned())
            .into_iter()
            .flatten()
            .any(|c| c["name"] == self.container.as_str() && c["state"].get("running").is_some());
        running && current_run(&self.dir, &self.container) == Some(self.run)
    }

    async fn read_new(&mut self) -> Option<Bytes> {
        let mut f = tokio::fs::File::open(&self.path).await.ok()?;
        tokio::io::AsyncSeekExt::seek(&mut f, std::io::SeekFrom::Start(self.offset))
            .await
            .ok()?;
        let mut buf = Vec::new();
        f.take(1 << 20).read_to_end(&mut buf).await.ok()?;
        self.offset += buf.len() as u64;
        (!buf.is_empty()).then(|| Bytes::from(buf))
    }

    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(b) = self.read_new().await {
                return Some(b);
            }
            if !self.live() {
                return self.read_new().await;
            }
            tokio::select! {
                _ = self.c.shutdown_token().cancelled() => return None,
                _ = tokio::time::sleep(FOLLOW_POLL) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::select;

    #[test]
    fn tail_lines_then_limit_bytes() {
        let log = b"one\ntwo\nthree\n";
        assert_eq!(select(log, None, None), log);
        assert_eq!(select(log, Some(2), None), b"two\nthree\n");
        assert_eq!(select(log, Some(1), None), b"three\n");
        assert_eq!(select(log, Some(0), None), b"");
        assert_eq!(select(log, Some(9), None), log);
        assert_eq!(
            select(b"a\nb", Some(1), None),
            b"b",
            "an unfinished last line"
        );
        assert_eq!(select(log, Some(2), Some(5)), b"two\nt");
        assert_eq!(select(log, None, Some(100)), log);
    }
}
