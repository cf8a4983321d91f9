//! `kubectl kedge simulate -f SCENARIO.yaml [-o json|table]`: runs kedge-core's planners on
//! a scenario and prints the decisions of every step.

use std::io::{Read, Write};

use clap::{Args, ValueEnum};
use kedge_core::simulate::{render_table, simulate};

use super::{Error, Result};

/// Output format of `simulate`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// An aligned table for people.
    #[default]
    Table,
    /// `{"steps":[...]}` for scripts.
    Json,
}

/// Arguments of `kubectl kedge simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Scenario file (YAML or JSON); `-` reads standard input.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub filename: String,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// Reads the scenario, runs it and writes the report to `out`.
pub fn run(args: &SimulateArgs, out: &mut impl Write) -> Result<()> {
    let path = args.filename.clone();
    let text = if path == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|error| Error::Read {
                path: path.clone(),
                error,
            })?;
        text
    } else {
        std::fs::read_to_string(&path).map_err(|error| Error::Read {
            path: path.clone(),
            error,
        })?
    };
    let report = simulate(&text).map_err(|error| Error::Scenario { path, error })?;
    match args.output {
        Output::Json => {
            serde_json::to_writer(&mut *out, &report)?;
            writeln!(out)?;
        }
        Output::Table => out.write_all(render_table(&report).as_bytes())?,
    }
    Ok(())
}
