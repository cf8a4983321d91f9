//! `kubectl kedge sessions`: the hub's live view of agent sessions, from its ops endpoint.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, HeaderValue};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::{Error, Result};
use crate::config::{DEFAULT_OPS_LISTEN, OPS_LISTEN_ENV};
use crate::registry::MemberSession;

/// `--help` examples of `sessions`.
pub const EXAMPLES: &str = "Examples:
  # A hub on this machine, or in a cluster behind a port-forward (its ops port, 8080):
  kubectl kedge sessions
  kubectl -n kedge-system port-forward deploy/kedge-hub 8080 &
  kubectl kedge sessions -o json
  # The fleet of `kedge-sim up`: the ops URL it prints (`ops http://127.0.0.1:PORT`):
  kubectl kedge sessions --hub http://127.0.0.1:PORT
  export KEDGE_HUB_OPS_URL=http://127.0.0.1:PORT; kubectl kedge sessions
  # A hub with --ops-token-file:
  kubectl kedge sessions --token-file ops-token";

/// Arguments of `sessions`.
#[derive(Debug, Clone, Args)]
pub struct SessionsArgs {
    /// Base URL of the hub's ops endpoint; default: what KEDGE_HUB_OPS_LISTEN (the hub's
    /// own variable) names, else http://127.0.0.1:8080, the hub's default --ops-listen and
    /// where `kubectl port-forward deploy/kedge-hub 8080` listens.
    #[arg(long, env = OPS_URL_ENV)]
    pub hub: Option<String>,
    /// File holding the hub's ops token (the hub's `--ops-token-file`); sent as a bearer
    /// token. Without it, only a hub without a token answers, and only to requests from
    /// 127.0.0.1 or ::1 (`kubectl port-forward`, or a shell in the hub's pod).
    #[arg(long, env = "KEDGE_HUB_OPS_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// Output format: table or json.
    #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
    pub output: String,
}

/// The environment variable of `--hub`.
pub const OPS_URL_ENV: &str = "KEDGE_HUB_OPS_URL";

/// Where `sessions` asks, and why there (for the message when nothing answers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpsEndpoint {
    /// Base URL of the ops endpoint.
    pub url: String,
    /// Where the URL came from.
    pub origin: String,
}

/// The ops endpoint to ask: `--hub` (or its variable), else the address the hub's own
/// [`OPS_LISTEN_ENV`] names, else the hub's default [`DEFAULT_OPS_LISTEN`]. An unspecified
/// address (`0.0.0.0`, `::`), as in a cluster, is reached on this machine's loopback.
pub fn ops_endpoint(hub: Option<&str>, ops_listen_env: Option<&str>) -> Result<OpsEndpoint> {
    if let Some(url) = hub {
        return Ok(OpsEndpoint {
            url: url.trim_end_matches('/').to_owned(),
            origin: format!("from --hub or {OPS_URL_ENV}"),
        });
    }
    let (listen, origin) = match ops_listen_env {
        Some(value) => {
            let listen: SocketAddr = value.trim().parse().map_err(|_| {
                Error::Argument(format!(
                    "{OPS_LISTEN_ENV}={value:?} is not the hub's HOST:PORT; set --hub URL or \
                     {OPS_URL_ENV} instead"
                ))
            })?;
            (listen, format!("from {OPS_LISTEN_ENV}={value}"))
        }
        None => (
            DEFAULT_OPS_LISTEN,
            format!("the hub's default --ops-listen {DEFAULT_OPS_LISTEN}"),
        ),
    };
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    Ok(OpsEndpoint {
        url: format!("http://{}", SocketAddr::new(ip, listen.port())),
        origin,
    })
}

/// What to do when nothing answers at the endpoint.
const POINT_ELSEWHERE: &str = "point to the hub's ops endpoint with --hub URL or \
     KEDGE_HUB_OPS_URL: `kedge-sim up` prints it (`ops http://127.0.0.1:PORT`); for a hub in \
     a cluster run `kubectl -n kedge-system port-forward deploy/kedge-hub 8080` first";

/// An error and its sources, `: `-separated (hyper's own message is only "client error").
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// Fetches `/v1/sessions` and prints it.
pub async fn run(args: &SessionsArgs, out: &mut impl std::io::Write) -> Result<()> {
    let listen_env = std::env::var(OPS_LISTEN_ENV).ok();
    let endpoint = ops_endpoint(args.hub.as_deref(), listen_env.as_deref())?;
    let sessions = fetch(&endpoint, args.token_file.as_deref()).await?;
    if args.output == "json" {
        writeln!(out, "{}", serde_json::to_string_pretty(&sessions)?)?;
    } else {
        write!(out, "{}", render_table(&sessions, SystemTime::now()))?;
    }
    Ok(())
}

/// The session list of the hub at `endpoint`, asked with the token in `token_file`.
async fn fetch(
    endpoint: &OpsEndpoint,
    token_file: Option<&std::path::Path>,
) -> Result<Vec<MemberSession>> {
    let url = format!("{}/v1/sessions", endpoint.url);
    let fail = |message: String| Error::Hub {
        url: url.clone(),
        message,
    };
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| fail(format!("invalid URL ({}): {e}", endpoint.origin)))?;
    let mut request = hyper::Request::get(uri);
    if let Some(path) = token_file {
        let token = std::fs::read_to_string(path)
            .map_err(|e| fail(format!("cannot read --token-file {}: {e}", path.display())))?;
        let value = HeaderValue::from_str(&format!("Bearer {}", token.trim())).map_err(|_| {
            fail(format!(
                "--token-file {} holds characters a header cannot carry",
                path.display()
            ))
        })?;
        request = request.header(AUTHORIZATION, value);
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|e| fail(format!("building the request: {e}")))?;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let response = tokio::time::timeout(Duration::from_secs(10), client.request(request))
        .await
        .map_err(|_| {
            fail(format!(
                "no answer within 10s ({}); {POINT_ELSEWHERE}",
                endpoint.origin
            ))
        })?
        .map_err(|e| {
            fail(format!(
                "cannot reach the hub ({}): {}; {POINT_ELSEWHERE}",
                endpoint.origin,
                chain(&e)
            ))
        })?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| fail(format!("reading the answer: {e}")))?
        .to_bytes();
    if !status.is_success() {
        return Err(fail(format!(
            "{status}: {}",
            String::from_utf8_lossy(&body)
        )));
    }
    serde_json::from_slice(&body).map_err(|e| fail(format!("not a session list: {e}")))
}

/// How long ago `unix_ms` was, in seconds.
pub fn ago(unix_ms: i64, now: SystemTime) -> String {
    let now_ms = now
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    let secs = u64::try_from(now_ms.saturating_sub(unix_ms) / 1000).unwrap_or(0);
    format!("{}s ago", secs)
}

/// How long until `unix_s`, in whole hours, or `expired`.
pub fn expires(unix_s: i64, now: SystemTime) -> String {
    let now_s = now
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    match u64::try_from(unix_s.saturating_sub(now_s)) {
        Ok(left) if left > 0 => {
            humantime::format_duration(Duration::from_secs((left / 3600) * 3600)).to_string()
        }
        _ => "expired".into(),
    }
}

/// Renders sessions as an aligned table.
pub fn render_table(sessions: &[MemberSession], now: SystemTime) -> String {
    let mut rows = vec![
        [
            "MEMBER",
            "STATE",
            "ADDRESS",
            "AGENT",
            "KUBERNETES",
            "HEARTBEAT",
            "CERT-EXPIRES",
            "SESSIONS",
            "REASON",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for s in sessions {
        rows.push(vec![
            s.member.clone(),
            s.state.as_str().to_owned(),
            s.remote_addr.clone(),
            s.agent_version.clone(),
            if s.kubernetes_version.is_empty() {
                "-".into()
            } else {
                s.kubernetes_version.clone()
            },
            ago(s.last_heartbeat_unix_ms, now),
            expires(s.cert_not_after_unix, now),
            s.sessions.to_string(),
            s.reason.clone(),
        ]);
    }
    super::table(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_is_the_flag_else_the_hubs_variable_else_the_hubs_default() {
        let given = ops_endpoint(Some("http://10.0.0.7:9000/"), Some("127.0.0.1:1")).unwrap();
        assert_eq!(given.url, "http://10.0.0.7:9000");
        assert!(given.origin.contains("--hub"), "{given:?}");

        let default = ops_endpoint(None, None).unwrap();
        assert_eq!(default.url, format!("http://{DEFAULT_OPS_LISTEN}"));
        assert_eq!(default.url, "http://127.0.0.1:8080");
        assert!(
            default.origin.contains("default --ops-listen"),
            "{default:?}"
        );

        for (listen, url) in [
            ("127.0.0.1:9100", "http://127.0.0.1:9100"),
            ("0.0.0.0:8080", "http://127.0.0.1:8080"),
            ("[::]:8080", "http://[::1]:8080"),
            ("[::1]:8081", "http://[::1]:8081"),
        ] {
            let endpoint = ops_endpoint(None, Some(listen)).unwrap();
            assert_eq!(endpoint.url, url, "{listen}");
            assert!(endpoint.origin.contains(OPS_LISTEN_ENV), "{endpoint:?}");
        }
        let bad = ops_endpoint(None, Some("hub:80")).unwrap_err().to_string();
        assert!(
            bad.contains(OPS_LISTEN_ENV) && bad.contains("--hub"),
            "{bad}"
        );
    }

    #[test]
    fn extreme_times_from_a_hub_do_not_overflow() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(ago(i64::MIN, now), format!("{}s ago", i64::MAX / 1000));
        assert_eq!(ago(i64::MAX, now), "0s ago");
        assert_eq!(expires(i64::MIN, now), "expired");
        assert!(expires(i64::MAX, now).contains("years"));
        assert_eq!(expires(1_000_000 + 7200, now), "2h");
    }
}
