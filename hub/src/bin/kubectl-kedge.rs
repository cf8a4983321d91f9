//! `kubectl-kedge`: the kubectl plugin (`kubectl kedge ...`).

use std::process::ExitCode;

use clap::Parser;
use kedge_hub::cli::{Cli, run};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    // Errors already name the file and field; print them the way kubectl does.
    match run(cli, &mut std::io::stdout().lock()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
