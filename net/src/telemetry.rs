//! Logging set-up shared by both binaries.

use tracing_subscriber::EnvFilter;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log pipelines.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!("unknown log format {other:?}: use text or json")),
        }
    }
}

/// Installs the global subscriber. `RUST_LOG` overrides the default `info` filter.
/// Logs go to stderr so that stdout stays free for machine-readable output.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal, never into log files or pipelines.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    // A second init (tests in one process) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// The `tracing` target of security events: every refused session or request (with a
/// distinct `reason` field), and enrollment, renewal and revocation. Route it on its own with
/// `RUST_LOG=kedge::audit=info` or a log pipeline's filter on the target.
///
/// ```
/// tracing::warn!(target: kedge_net::telemetry::AUDIT, reason = "unknown_ca", "session refused");
/// ```
pub const AUDIT: &str = "kedge::audit";
