//! The agent's flags come from one definition: `kedge_net::agent_cli::flag`, which
//! `kedge-agent`'s clap definition declares and `kubectl kedge install agent` /
//! `setup-member` render. The Helm chart writes the same flags as text in its template, so
//! this test reads that text: every flag it passes is one the agent accepts, and it passes
//! the same set as the Rust renderer. Renaming a flag in one place only fails here (and in
//! `charts.rs`, which renders the chart with Helm and compares the arguments one by one).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use clap::{CommandFactory, Parser};
use kedge_agent::config::AgentArgs;
use kedge_hub::install::agent::agent_args;
use kedge_hub::install::{AgentInstall, AgentNamespaces, Credentials};

/// Every long flag `kedge-agent` accepts, with its dashes.
fn accepted() -> BTreeSet<String> {
    AgentArgs::command()
        .get_arguments()
        .filter_map(|a| a.get_long())
        .map(|long| format!("--{long}"))
        .collect()
}

/// The flags of the chart's agent container (`- --name` lines of its `args`), every branch
/// of the template at once.
fn chart_flags() -> BTreeSet<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/charts/kedge-agent/templates/deployment.yaml"
    );
    let template = std::fs::read_to_string(path).unwrap();
    template
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- --"))
        .map(|flag| format!("--{}", flag.trim()))
        .collect()
}

/// Installs that between them take every branch of `agent_args`.
fn installs() -> Vec<AgentInstall> {
    let bootstrap = AgentInstall::new(
        vec!["hub.example:7443".into()],
        "CA".into(),
        Credentials::Bootstrap {
            token: "edge-1.abc".into(),
        },
        AgentNamespaces::Only(vec!["web".into(), "apps".into()]),
    );
    let mut certificate = AgentInstall::new(
        vec!["10.0.0.1:7443".into()],
        "CA".into(),
        Credentials::Certificate {
            cert_pem: "CERT".into(),
            key_pem: "KEY".into(),
        },
        AgentNamespaces::All,
    );
    certificate.hub_server_name = Some("kedge-hub.example".into());
    vec![bootstrap, certificate]
}

#[test]
fn the_chart_and_the_installer_pass_the_same_flags_and_the_agent_accepts_them() {
    let accepted = accepted();
    let chart = chart_flags();
    let rust: BTreeSet<String> = installs()
        .iter()
        .flat_map(agent_args)
        .filter(|a| a.starts_with("--"))
        .collect();
    let unknown: Vec<&String> = chart
        .union(&rust)
        .filter(|f| !accepted.contains(*f))
        .collect();
    assert!(
        unknown.is_empty(),
        "flags kedge-agent does not accept: {unknown:?}"
    );
    assert_eq!(
        chart, rust,
        "the kedge-agent chart and kedge_hub::install::agent::agent_args pass different flags"
    );
}

#[test]
fn what_the_installer_renders_starts_the_agent() {
    for install in installs() {
        let args = agent_args(&install);
        // The hub addresses come from the environment in the Deployment.
        let line = ["kedge-agent", "--hub", "hub.example:7443"]
            .into_iter()
            .map(str::to_owned)
            .chain(args.iter().cloned());
        let parsed = AgentArgs::try_parse_from(line).and_then(AgentArgs::checked);
        assert!(parsed.is_ok(), "{args:?}: {}", parsed.unwrap_err());
    }
}
