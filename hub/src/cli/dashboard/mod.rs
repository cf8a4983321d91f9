//! `kubectl kedge dashboard`: a read-only web view of the fleet, its DSOs and DSJs, served
//! on loopback from the user's own machine.
//!
//! It reads the hub cluster's API with the user's kubeconfig (so it sees exactly what their
//! RBAC allows), watches instead of polling ([`watch`]), keeps a cut-down copy and each
//! workload's recent split ([`model`]), and pushes changes to the open pages as server-sent
//! events ([`server`]). The page is plain HTML, CSS and JavaScript embedded in the binary.

pub mod model;
pub mod server;
pub mod watch;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;

use super::{Error, Result};
use model::{Limits, Model};
use watch::Shared;

/// Arguments of `kubectl kedge dashboard`.
#[derive(Debug, Clone, Args)]
pub struct DashboardArgs {
    /// Kubeconfig of the hub cluster; default: $KUBECONFIG, then ~/.kube/config.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context of the hub cluster (as `kubectl --context`).
    #[arg(long)]
    pub context: Option<String>,
    /// Show only the DSOs, DSJs and Events of this namespace (members are cluster-wide);
    /// default: every namespace.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Local port to serve on (0: any free port).
    #[arg(long, default_value_t = 8765)]
    pub port: u16,
    /// Loopback address to serve on; the dashboard shows what your kubeconfig can read, so
    /// it never listens beyond this machine.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub address: IpAddr,
    /// Open the page in the default browser (xdg-open or open) besides printing its URL.
    #[arg(long)]
    pub open: bool,
    /// How far back the split charts reach.
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
    pub history: Duration,
}

/// Serves the dashboard until interrupted; prints its URL to `out` first.
pub async fn run(args: &DashboardArgs, out: &mut impl std::io::Write) -> Result<()> {
    if !args.address.is_loopback() {
        return Err(Error::Argument(format!(
            "--address {}: the dashboard serves only on a loopback address (127.0.0.1 or ::1); from another machine, run it there with its own kubeconfig",
            args.address
        )));
    }
    let client =
        kedge_net::kube_client::client_in(args.kubeconfig.as_deref(), args.context.as_deref())
            .await
            .map_err(|e| Error::HubCluster {
                what: "connecting to the hub cluster".into(),
                message: e.to_string(),
            })?;
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(args.address, args.port))
        .await
        .map_err(|e| {
            Error::Argument(format!(
                "cannot listen on {}:{}: {e}{}",
                args.address,
                args.port,
                if e.kind() == std::io::ErrorKind::AddrInUse {
                    "; choose another port with --port (0: any free port)"
                } else {
                    ""
                }
            ))
        })?;
    let local = listener
        .local_addr()
        .map_err(|e| Error::Argument(format!("cannot read the dashboard's address: {e}")))?;
    let url = match local {
        SocketAddr::V4(a) => format!("http://{}:{}/", a.ip(), a.port()),
        SocketAddr::V6(a) => format!("http://[{}]:{}/", a.ip(), a.port()),
    };
    let limits = Limits {
        history: args.history,
        ..Limits::default()
    };
    let shared = Arc::new(Shared {
        model: Mutex::new(Model::new(limits, args.namespace.clone())),
        changed: tokio::sync::Notify::new(),
    });
    watch::spawn_all(&client, args.namespace.as_deref(), &shared);
    let app = server::router(server::AppState::start(shared), local.port());
    writeln!(out, "kedge dashboard: {url}  (read-only; Ctrl-C stops it)")?;
    out.flush()?;
    if args.open {
        open_browser(&url, out)?;
    }
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| Error::Argument(format!("the dashboard's server stopped: {e}")))
}

/// Asks the desktop to open `url`; says so when it cannot (the URL is already printed).
fn open_browser(url: &str, out: &mut impl std::io::Write) -> Result<()> {
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else {
        "xdg-open"
    };
    // tokio reaps the child when it exits.
    let opened = tokio::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .is_ok();
    if !opened {
        writeln!(out, "(no {opener} here: open {url} in your browser)")?;
        out.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn args(extra: &[&str]) -> DashboardArgs {
        let cli = Cli::try_parse_from(["kubectl-kedge", "dashboard"].iter().chain(extra))
            .expect("valid arguments");
        match cli.command {
            Command::Dashboard(args) => args,
            other => panic!("not dashboard: {other:?}"),
        }
    }

    #[tokio::test]
    async fn an_address_beyond_loopback_is_refused_before_anything_is_read() {
        let mut out = Vec::new();
        let error = run(&args(&["--address", "0.0.0.0"]), &mut out)
            .await
            .expect_err("0.0.0.0 is refused");
        assert!(
            error.to_string().contains("only on a loopback address"),
            "{error}"
        );
        assert!(out.is_empty(), "no URL printed");
    }

    #[tokio::test]
    async fn a_kubeconfig_that_is_not_there_is_named_in_the_error() {
        let mut out = Vec::new();
        let error = run(
            &args(&["--kubeconfig", "/nonexistent/hub.kubeconfig", "--port", "0"]),
            &mut out,
        )
        .await
        .expect_err("no kubeconfig");
        let message = error.to_string();
        assert!(
            message.contains("connecting to the hub cluster"),
            "{message}"
        );
        assert!(message.contains("/nonexistent/hub.kubeconfig"), "{message}");
    }

    #[test]
    fn the_defaults_are_loopback_port_8765_and_fifteen_minutes_of_history() {
        let a = args(&[]);
        assert_eq!(a.address, IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(a.port, 8765);
        assert_eq!(a.history, Duration::from_secs(900));
        assert!(
            Cli::try_parse_from(["kubectl-kedge", "dashboard", "--history", "soon"]).is_err(),
            "a history that is not a duration is refused"
        );
    }
}
