//! `kubectl-kedge`: the kubectl plugin (`kubectl kedge ...`).

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use kedge_hub::cli::{Cli, PipeOutput, run};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    let mut out = PipeOutput::new(std::io::stdout().lock());
    let result = match run(cli, &mut out).await {
        Ok(()) => out.flush().map_err(Into::into),
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `kubectl kedge crds | head`: the reader has what it wanted.
        Err(_) if out.reader_closed() => ExitCode::SUCCESS,
        // Errors already name the file and field; print them the way kubectl does.
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
