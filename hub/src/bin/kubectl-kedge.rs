//! `kubectl kedge`: the kedge kubectl plugin.

use clap::{Parser, Subcommand};
use kedge_hub::cli::{crds, dev_certs, sessions};

#[derive(Debug, Parser)]
#[command(name = "kubectl-kedge", version, about = "kubectl plugin for kedge")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print kedge's CustomResourceDefinitions (pipe to `kubectl apply -f -`).
    Crds,
    /// Create a development CA, hub server certificate and member client certificates.
    DevCerts(dev_certs::DevCertsArgs),
    /// List agent sessions as the hub sees them.
    Sessions(sessions::SessionsArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    match Cli::parse().command {
        Command::Crds => {
            print!("{}", crds::render()?);
            Ok(())
        }
        Command::DevCerts(args) => dev_certs::run(&args),
        Command::Sessions(args) => sessions::run(&args).await,
    }
}
