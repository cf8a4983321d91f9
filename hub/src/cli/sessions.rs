//! `kubectl kedge sessions`: the hub's live view of agent sessions, from its ops endpoint.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, HeaderValue};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::{Error, Result};
use crate::registry::MemberSession;

/// Arguments of `sessions`.
#[derive(Debug, Clone, Args)]
pub struct SessionsArgs {
    /// Base URL of the hub's ops endpoint (e.g. after `kubectl port-forward`).
    #[arg(
        long,
        env = "KEDGE_HUB_OPS_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub hub: String,
    /// File holding the hub's ops token (the hub's `--ops-token-file`); sent as a bearer
    /// token. Without it, only a hub without a token answers, and only to requests from
    /// 127.0.0.1 or ::1 (`kubectl port-forward`, or a shell in the hub's pod).
    #[arg(long, env = "KEDGE_HUB_OPS_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// Output format: table or json.
    #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
    pub output: String,
}

/// Fetches `/v1/sessions` and prints it.
pub async fn run(args: &SessionsArgs, out: &mut impl std::io::Write) -> Result<()> {
    let url = format!("{}/v1/sessions", args.hub.trim_end_matches('/'));
    let fail = |message: String| Error::Hub {
        url: url.clone(),
        message,
    };
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| fail(format!("invalid --hub URL: {e}")))?;
    let mut request = hyper::Request::get(uri);
    if let Some(path) = &args.token_file {
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
        .map_err(|_| fail("no answer within 10s".into()))?
        .map_err(|e| fail(format!("cannot reach the hub: {e}")))?;
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
    let sessions: Vec<MemberSession> =
        serde_json::from_slice(&body).map_err(|e| fail(format!("not a session list: {e}")))?;
    if args.output == "json" {
        writeln!(out, "{}", serde_json::to_string_pretty(&sessions)?)?;
    } else {
        write!(out, "{}", render_table(&sessions, SystemTime::now()))?;
    }
    Ok(())
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
    fn extreme_times_from_a_hub_do_not_overflow() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(ago(i64::MIN, now), format!("{}s ago", i64::MAX / 1000));
        assert_eq!(ago(i64::MAX, now), "0s ago");
        assert_eq!(expires(i64::MIN, now), "expired");
        assert!(expires(i64::MAX, now).contains("years"));
        assert_eq!(expires(1_000_000 + 7200, now), "2h");
    }
}
