//! `kubectl-kedge`, the kubectl plugin: argument parsing and one module per subcommand.
//! The binary only parses arguments and dispatches here.

pub mod crds;
pub mod dashboard;
pub mod dev_certs;
pub mod install;
pub mod mc;
pub mod pipe;
pub mod sessions;
pub mod setup_member;
pub mod simulate;

use clap::{Args, Parser, Subcommand};
use kedge_net::agent_cli::{NamespaceScope, flag};

pub use pipe::PipeOutput;
pub use simulate::SimulateArgs;

/// Where the agent of `mc setup-member` and `install agent` may act: the agent's own
/// `--namespaces` / `--all-namespaces`, read by [`NamespaceScope`] as the agent reads them.
#[derive(Debug, Clone, Args)]
pub struct NamespaceArgs {
    /// Namespaces the agent may act in, comma-separated (its RBAC and its own policy).
    #[arg(
        long = flag::NAMESPACES,
        value_delimiter = ',',
        required_unless_present = "all_namespaces"
    )]
    pub namespaces: Vec<String>,
    /// Let the agent act in every namespace (not recommended).
    #[arg(long = flag::ALL_NAMESPACES, conflicts_with = "namespaces")]
    pub all_namespaces: bool,
}

impl NamespaceArgs {
    /// The scope the flags give; the install's `validate` reports what is wrong with it
    /// together with its other problems.
    pub fn scope(&self) -> NamespaceScope {
        NamespaceScope::from_flags(&self.namespaces, self.all_namespaces)
    }
}

/// kubectl kedge: operate kedge from kubectl.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-kedge",
    bin_name = "kubectl kedge",
    version,
    about = "Operate kedge, multi-cluster autoscaling next to KEDA, from kubectl",
    after_help = "Examples:
  kubectl kedge crds | kubectl apply -f -
  kubectl kedge install hub | kubectl apply -f -
  kubectl kedge mc setup-member edge-1 --namespaces shop --hub-address hub.example.com:7443 \\
    --member-kubeconfig edge-1.kubeconfig
  kubectl kedge mc list-members -o wide
  kubectl kedge sessions
  kubectl kedge dashboard --open"
)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands of `kubectl kedge`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run kedge's placement and scaling decisions on a scenario file, without a cluster.
    #[command(after_help = "Examples:
  kubectl kedge simulate -f deploy/examples/simulate/dso-failover.yaml
  kubectl kedge simulate -f deploy/examples/simulate/dsj-priority-failover.yaml -o json
  cat scenario.yaml | kubectl kedge simulate -f -")]
    Simulate(SimulateArgs),
    /// Print kedge's CustomResourceDefinitions (pipe to `kubectl apply -f -`).
    #[command(after_help = "Examples:
  kubectl kedge crds | kubectl apply --server-side -f -
  kubectl kedge crds > kedge-crds.yaml")]
    Crds,
    /// Create a development CA, hub server certificate and member client certificates.
    #[command(after_help = "Examples:
  kubectl kedge dev-certs --dir ./pki --members edge-1,edge-2
  kubectl kedge dev-certs --dir ./pki --hub-names hub.example.com,10.0.0.5 --validity 90days")]
    DevCerts(dev_certs::DevCertsArgs),
    /// List agent sessions as the hub sees them.
    #[command(after_help = sessions::EXAMPLES)]
    Sessions(sessions::SessionsArgs),
    /// Manage member clusters on the hub: setup-member, list-members, delete-member.
    #[command(after_help = "Examples:
  kubectl kedge mc list-members
  kubectl kedge mc --kubeconfig hub.kubeconfig list-members -o wide
  kubectl kedge mc setup-member edge-1 --namespaces shop --hub-address hub.example.com:7443 \\
    --member-kubeconfig edge-1.kubeconfig
  kubectl kedge mc delete-member edge-1")]
    Mc(mc::McArgs),
    /// Print the hub's or an agent's install (pipe to `kubectl apply -f -`), or the same
    /// install as Helm chart values (`-o helm-values`).
    #[command(after_help = "Examples:
  kubectl kedge install hub | kubectl apply -f -
  kubectl kedge install agent --hub-address hub.example.com:7443 --ca-file ca.crt \\
    --token-file token --namespaces shop | kubectl --kubeconfig edge-1.kubeconfig apply -f -")]
    Install(install::InstallArgs),
    /// Serve a read-only web view of the fleet, its DSOs and DSJs on 127.0.0.1, read with
    /// your kubeconfig and updated live.
    #[command(after_help = "Examples:
  kubectl kedge dashboard
  kubectl kedge dashboard --context mgmt --open
  kubectl kedge dashboard --namespace shop --port 0")]
    Dashboard(dashboard::DashboardArgs),
    /// Print what `install` made, for `kubectl delete -f -`; CRDs and the hub CA stay
    /// unless asked.
    #[command(after_help = "Examples:
  kubectl kedge uninstall hub | kubectl delete -f -
  kubectl kedge uninstall agent --namespaces shop | kubectl --kubeconfig edge-1.kubeconfig delete -f -")]
    Uninstall(install::UninstallArgs),
}

/// Errors of the `kubectl kedge` subcommands.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The scenario file could not be read.
    // The inner errors are part of the message, not `source`s, so that a caller printing
    // the error chain does not repeat them.
    #[error("cannot read {path}: {error}")]
    Read {
        /// The path given with `-f`.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// The scenario (or the spec in it) is invalid; the message names the field.
    #[error("{path}: {error}")]
    Scenario {
        /// The path given with `-f`.
        path: String,
        /// What is wrong.
        error: kedge_core::Error,
    },
    /// The report could not be serialized.
    #[error("cannot encode the report: {0}")]
    Encode(#[from] serde_json::Error),
    /// Writing the output failed.
    #[error("cannot write output: {0}")]
    Write(#[from] std::io::Error),
    /// Certificates could not be created or written.
    #[error(transparent)]
    Pki(#[from] kedge_net::Error),
    /// An argument is out of range.
    #[error("{0}")]
    Argument(String),
    /// The CRDs could not be rendered as YAML.
    #[error("cannot render the CRDs: {0}")]
    Yaml(#[from] serde_yaml::Error),
    /// The hub cluster's API refused or failed.
    #[error("{what}: {message}")]
    HubCluster {
        /// What was attempted.
        what: String,
        /// What went wrong, with what to do about it.
        message: String,
    },
    /// The hub's ops endpoint could not be queried.
    #[error("{url}: {message}")]
    Hub {
        /// The URL asked.
        url: String,
        /// What went wrong.
        message: String,
    },
}

/// `Result` with the CLI [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Runs a parsed command line, writing its output to `out`.
pub async fn run(cli: Cli, out: &mut impl std::io::Write) -> Result<()> {
    match cli.command {
        Command::Simulate(args) => simulate::run(&args, out),
        Command::Crds => Ok(out.write_all(crds::render()?.as_bytes())?),
        Command::DevCerts(args) => dev_certs::run(&args, out),
        Command::Sessions(args) => sessions::run(&args, out).await,
        Command::Mc(args) => mc::run(&args, out).await,
        Command::Install(args) => install::install(&args, out),
        Command::Uninstall(args) => install::uninstall(&args, out),
        Command::Dashboard(args) => dashboard::run(&args, out).await,
    }
}

/// Renders rows (the first is the header) as columns aligned like kubectl's.
pub fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// The path of every command of the tree under `command`, itself included, each with its
    /// `--help` text after the options.
    fn walk(command: &clap::Command, path: &str, out: &mut Vec<(String, String)>) {
        let after = command
            .get_after_long_help()
            .or(command.get_after_help())
            .map(ToString::to_string)
            .unwrap_or_default();
        out.push((path.to_owned(), after));
        for sub in command.get_subcommands() {
            walk(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    #[test]
    fn every_command_has_examples_in_its_help() {
        let mut commands = Vec::new();
        walk(&Cli::command(), "kubectl kedge", &mut commands);
        assert!(commands.len() > 10, "{commands:?}");
        let missing: Vec<&str> = commands
            .iter()
            .filter(|(path, after)| {
                let examples = after.split_once("Examples:\n").map_or("", |(_, e)| e);
                // Each example runs the command it documents.
                let name = path.trim_start_matches("kubectl ");
                !examples.lines().any(|l| l.contains(name))
            })
            .map(|(path, _)| path.as_str())
            .collect();
        assert!(
            missing.is_empty(),
            "no `Examples:` in --help of {missing:?}"
        );
    }

    #[test]
    fn help_shows_the_examples() {
        let help = Cli::try_parse_from(["kubectl-kedge", "mc", "list-members", "--help"])
            .unwrap_err()
            .to_string();
        assert!(
            help.contains("Examples:\n  kubectl kedge mc list-members"),
            "{help}"
        );
    }
}
