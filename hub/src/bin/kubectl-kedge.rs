//! `kubectl-kedge`: the kubectl plugin (`kubectl kedge ...`).

use std::process::ExitCode;

use clap::Parser;
use kedge_hub::cli::{Cli, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Errors already name the file and field; print them the way kubectl does.
    match run(cli, &mut std::io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
