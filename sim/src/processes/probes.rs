//! Readiness and liveness probes as kubelet runs them: `httpGet` (HTTP; HTTPS is checked by
//! connecting only) and `tcpSocket` against the pod's IP, with the delays and thresholds of
//! the probe. `exec` and `grpc` probes are not run: they count as success.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// What a probe checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// `GET path` on the port; 200–399 is success. `tls`: only the connection is checked.
    Http { port: u16, path: String, tls: bool },
    /// A TCP connection to the port.
    Tcp { port: u16 },
    /// `exec` or `grpc`: not run, counted as success.
    Unsupported,
}

/// A parsed probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Probe {
    pub action: Action,
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

fn port(p: &Value, container: &Value) -> Option<u16> {
    match p.get("port")? {
        Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
        Value::String(name) => name.parse().ok().or_else(|| {
            container
                .get("ports")?
                .as_array()?
                .iter()
                .find(|cp| cp.get("name").and_then(Value::as_str) == Some(name))?
                .get("containerPort")?
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
        }),
        _ => None,
    }
}

impl Probe {
    /// The container's probe `field` (`readinessProbe`, `livenessProbe`), if it has one.
    pub(crate) fn parse(container: &Value, field: &str) -> Option<Probe> {
        let p = container.get(field)?;
        let secs = |k: &str, default: u64| {
            Duration::from_secs(p.get(k).and_then(Value::as_u64).unwrap_or(default))
        };
        let count = |k: &str, default: u32| {
            p.get(k)
                .and_then(Value::as_u64)
                .map(|n| n.max(1) as u32)
                .unwrap_or(default)
        };
        let action = if let Some(h) = p.get("httpGet") {
            match port(h, container) {
                Some(port) => Action::Http {
                    port,
                    path: h
                        .get("path")
                        .and_then(Value::as_str)
                        .unwrap_or("/")
                        .to_string(),
                    tls: h.get("scheme").and_then(Value::as_str) == Some("HTTPS"),
                },
                None => Action::Unsupported,
            }
        } else if let Some(t) = p.get("tcpSocket") {
            port(t, container).map_or(Action::Unsupported, |port| Action::Tcp { port })
        } else {
            Action::Unsupported
        };
        Some(Probe {
            action,
            initial_delay: secs("initialDelaySeconds", 0),
            period: secs("periodSeconds", 10).max(Duration::from_secs(1)),
            timeout: secs("timeoutSeconds", 1).max(Duration::from_secs(1)),
            success_threshold: count("successThreshold", 1),
            failure_threshold: count("failureThreshold", 3),
        })
    }

    /// Runs the probe once against `ip`.
    pub(crate) async fn check(&self, ip: &str) -> bool {
        let run = async {
            match &self.action {
                Action::Unsupported => true,
                Action::Tcp { port } => TcpStream::connect((ip, *port)).await.is_ok(),
                Action::Http {
                    port, tls: true, ..
                } => TcpStream::connect((ip, *port)).await.is_ok(),
                Action::Http { port, path, .. } => http_get(ip, *port, path).await,
            }
        };
        tokio::time::timeout(self.timeout, run)
            .await
            .unwrap_or(false)
    }
}

async fn http_get(ip: &str, port: u16, path: &str) -> bool {
    let Ok(mut s) = TcpStream::connect((ip, port)).await else {
        return false;
    };
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {ip}:{port}\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    if s.write_all(req.as_bytes()).await.is_err() {
        return false;
    }
    let mut head = [0u8; 64];
    let mut n = 0;
    while n < 12 {
        match s.read(&mut head[n..]).await {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    status_ok(&head[..n])
}

/// Whether an HTTP response starting with `head` has a 2xx or 3xx status.
fn status_ok(head: &[u8]) -> bool {
    let text = String::from_utf8_lossy(head);
    let code = text
        .strip_prefix("HTTP/1.")
        .and_then(|r| r.get(2..5))
        .and_then(|c| c.parse::<u16>().ok());
    code.is_some_and(|c| (200..400).contains(&c))
}

/// Consecutive results against a probe's thresholds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Tracker {
    successes: u32,
    failures: u32,
    /// The probe's verdict: passed `successThreshold` times in a row since it last failed
    /// `failureThreshold` times in a row.
    pub passing: bool,
}

impl Tracker {
    /// A tracker whose verdict starts as passing (liveness: alive until proven otherwise).
    pub(crate) fn passing() -> Tracker {
        Tracker {
            passing: true,
            ..Tracker::default()
        }
    }

    /// Records a result; returns whether the verdict changed.
    pub(crate) fn observe(&mut self, ok: bool, probe: &Probe) -> bool {
        let before = self.passing;
        if ok {
            self.failures = 0;
            self.successes += 1;
            if self.successes >= probe.success_threshold {
                self.passing = true;
            }
        } else {
            self.successes = 0;
            self.failures += 1;
            if self.failures >= probe.failure_threshold {
                self.passing = false;
            }
        }
        before != self.passing
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{Action, Probe, Tracker, status_ok};

    #[test]
    fn named_ports_resolve_through_the_container_ports_and_defaults_apply() {
        let c = json!({
            "ports": [{"name": "ops", "containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": "ops"}, "periodSeconds": 5},
            "livenessProbe": {"tcpSocket": {"port": 9090}, "failureThreshold": 2},
        });
        let r = Probe::parse(&c, "readinessProbe").unwrap();
        assert_eq!(
            r.action,
            Action::Http {
                port: 8080,
                path: "/readyz".into(),
                tls: false
            }
        );
        assert_eq!((r.period.as_secs(), r.failure_threshold), (5, 3));
        let l = Probe::parse(&c, "livenessProbe").unwrap();
        assert_eq!(l.action, Action::Tcp { port: 9090 });
        assert_eq!(l.failure_threshold, 2);
        assert!(Probe::parse(&c, "startupProbe").is_none());
        let exec = json!({"readinessProbe": {"exec": {"command": ["true"]}}});
        assert_eq!(
            Probe::parse(&exec, "readinessProbe").unwrap().action,
            Action::Unsupported
        );
    }

    #[test]
    fn thresholds_need_consecutive_results() {
        let c = json!({"readinessProbe": {"tcpSocket": {"port": 1}, "successThreshold": 2, "failureThreshold": 2}});
        let p = Probe::parse(&c, "readinessProbe").unwrap();
        let mut t = Tracker::default();
        assert!(!t.observe(true, &p));
        assert!(t.observe(true, &p), "two successes in a row make it pass");
        assert!(!t.observe(false, &p));
        assert!(!t.observe(true, &p), "a success resets the failure count");
        assert!(!t.observe(false, &p));
        assert!(t.observe(false, &p), "two failures in a row make it fail");
        assert!(!t.passing);
    }

    #[test]
    fn http_status_lines() {
        assert!(status_ok(b"HTTP/1.1 200 OK\r\n"));
        assert!(status_ok(b"HTTP/1.0 302 Found\r\n"));
        assert!(!status_ok(b"HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(!status_ok(b"garbage"));
    }
}
