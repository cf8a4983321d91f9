//! `kedge-sim serve --clusters a,b --dir DIR`: hosts virtual clusters until stopped.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use kedge_sim::{Sim, SimConfig};

#[derive(Parser, Debug)]
#[command(
    name = "kedge-sim",
    version,
    about = "Kubernetes API simulator hosting many virtual clusters"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Serve virtual clusters and write DIR/NAME.kubeconfig for each.
    Serve(Serve),
    /// Start a local fleet: a hub cluster and member clusters, the real kedge-hub and one
    /// kedge-agent per member, enrolled and connected.
    Up(Up),
}

#[derive(clap::Args, Debug)]
struct Up {
    /// Member clusters (named member-1 … member-N).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=100))]
    members: u16,
    /// Directory for kubeconfigs (DIR/hub.kubeconfig, DIR/member-N.kubeconfig), certificates,
    /// logs and DIR/fleet.env (the kubeconfigs, the hub's ops URL and the logs as KEY=VALUE
    /// lines, written once the fleet is ready).
    #[arg(long, default_value = ".kedge-fleet")]
    dir: PathBuf,
    /// No example and no live view: print `fleet ready` and run until stopped.
    #[arg(long)]
    headless: bool,
    /// Namespaces every agent may act in (comma-separated); agents refuse commands for any
    /// other namespace.
    #[arg(long, value_delimiter = ',', default_value = "default")]
    agent_namespaces: Vec<String>,
    /// Heartbeat interval the hub asks agents for.
    #[arg(long, default_value = "1s", value_parser = heartbeat)]
    heartbeat: String,
    /// Put a link emulator between MEMBER's agent and the hub (repeatable, one per member).
    /// SPEC is comma-separated KEY=VALUE: rtt=600ms, jitter=50ms, loss=5 (percent, each
    /// direction), rate=64kbit (k/M/G, bit or bps), blackout=30s/120s (down 30 s of every
    /// 120 s), rebind=20s (the address the hub sees changes, as a NAT rebinding), seed=N.
    #[arg(long = "link", value_name = "MEMBER:SPEC", value_parser = link)]
    links: Vec<(String, kedge_sim::link::LinkSpec)>,
    /// Also serve `kubectl kedge dashboard` on a free loopback port (its URL is printed and
    /// in DIR/fleet.env as DASHBOARD_URL); default: with the live view, not --headless.
    #[arg(long, value_name = "BOOL")]
    dashboard: Option<bool>,
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    Ok(())
}

/// The `--link` flags as member → spec, refusing a member given twice.
fn one_link_per_member(
    links: Vec<(String, kedge_sim::link::LinkSpec)>,
) -> anyhow::Result<std::collections::BTreeMap<String, kedge_sim::link::LinkSpec>> {
    let mut by_member = std::collections::BTreeMap::new();
    for (member, spec) in links {
        if by_member.insert(member.clone(), spec).is_some() {
            anyhow::bail!("--link {member}: given twice; one link per member");
        }
    }
    Ok(by_member)
}

/// One line per emulated link: member, spec, the emulator's address and the seed in use.
fn print_links(fleet: &kedge_sim::fleet::Fleet) {
    for member in fleet.members() {
        if let Some(link) = fleet.link(&member) {
            println!(
                "{member} link:       {} via {} (seed {})",
                link.spec(),
                link.local_addr(),
                link.seed()
            );
        }
    }
}

async fn up(args: Up) -> anyhow::Result<()> {
    let mut config =
        kedge_sim::fleet::FleetConfig::new(usize::from(args.members), args.dir.clone())?;
    config.heartbeat = args.heartbeat;
    config.agent_namespaces = args.agent_namespaces;
    config.links = one_link_per_member(args.links)?;
    config.dashboard = args.dashboard.unwrap_or(!args.headless);
    if !args.headless {
        config = kedge_sim::demo::with_demo_link(config);
    }
    let fleet = kedge_sim::fleet::Fleet::up(config).await?;
    println!("hub kubeconfig:     {}", fleet.kubeconfig("hub").display());
    for member in fleet.members() {
        println!(
            "{member} kubeconfig: {}",
            fleet.kubeconfig(&member).display()
        );
    }
    println!(
        "hub QUIC {}  ops {}  logs {}",
        fleet.hub_addr(),
        fleet.ops_url(),
        fleet.dir().join("logs").display()
    );
    print_links(&fleet);
    if let Some(url) = &fleet.facts().dashboard_url {
        println!("dashboard:          {url} (kubectl kedge dashboard, read-only)");
    }
    println!(
        "fleet file:         {} (all of the above as KEY=VALUE lines)",
        fleet.facts().env_file().display()
    );
    println!("fleet ready: {} members connected", fleet.members().len());
    let outcome = if args.headless {
        wait_for_signal().await
    } else {
        kedge_sim::demo::install_example(&fleet).await?;
        println!(
            "example installed; try: kubectl --kubeconfig {} get dso",
            fleet.kubeconfig("hub").display()
        );
        let stop = async {
            let _ = wait_for_signal().await;
        };
        kedge_sim::demo::live_view(&fleet, stop)
            .await
            .map_err(anyhow::Error::from)
    };
    println!("stopping the fleet...");
    fleet.shutdown().await;
    outcome
}

#[derive(clap::Args, Debug)]
struct Serve {
    /// Cluster names, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    clusters: Vec<String>,
    /// Directory for the kubeconfig files.
    #[arg(long)]
    dir: PathBuf,
    /// Ready nodes per cluster.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=1000))]
    nodes: u16,
    /// CPU capacity per node.
    #[arg(long, default_value = "8")]
    node_cpu: String,
    /// Memory capacity per node.
    #[arg(long, default_value = "32Gi")]
    node_memory: String,
    /// Pod capacity per node.
    #[arg(long, default_value_t = 110, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    node_pods: u32,
    /// Simulated milliseconds from binding until a pod is Ready.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pod_start_delay_ms: u64,
    /// Simulated run time of Job pods in milliseconds.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(0..=86_400_000))]
    job_duration_ms: u64,
    /// Job pods fail instead of succeeding (per Job: annotation sim.kedge.dev/outcome).
    #[arg(long)]
    job_pods_fail: bool,
    /// Simulated time speed factor.
    #[arg(long, default_value_t = 1.0, value_parser = speed)]
    speed: f64,
    /// First port (cluster i gets port-base + i); 0 picks free ports.
    #[arg(long, default_value_t = 0)]
    port_base: u16,
    /// Clusters (comma-separated, from --clusters) that get KEDA as far as kedge-sim
    /// emulates it: its namespace and CRDs, and its loop for ScaledObjects.
    #[arg(long, value_delimiter = ',')]
    keda: Vec<String>,
    /// Run pods of image repository IMAGE (no tag) as real processes of the executable PATH
    /// (repeatable; kedge's hub and agent images map to the kedge-hub and kedge-agent next
    /// to kedge-sim by default).
    #[arg(long = "run-image", value_name = "IMAGE=PATH", value_parser = run_image)]
    run_images: Vec<(String, PathBuf)>,
}

/// kedge's own images → the binaries next to kedge-sim's executable, where they exist.
fn default_run_images() -> kedge_sim::processes::ImageMap {
    let dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(PathBuf::from));
    let mut map = kedge_sim::processes::ImageMap::new();
    for (image, binary) in [
        ("ghcr.io/kedge-dev/kedge-hub", "kedge-hub"),
        ("ghcr.io/kedge-dev/kedge-agent", "kedge-agent"),
    ] {
        if let Some(path) = dir.as_ref().map(|d| d.join(binary))
            && kedge_sim::processes::executable(&path)
        {
            map.insert(image.to_owned(), path);
        }
    }
    map
}

/// `--run-image IMAGE=PATH`: a repository without tag and an executable file.
fn run_image(text: &str) -> Result<(String, PathBuf), String> {
    let (image, path) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not IMAGE=PATH"))?;
    let repository = kedge_sim::processes::repository(image.trim());
    if repository.is_empty() || repository != image.trim() {
        return Err(format!(
            "{image:?}: give the image repository without a tag or digest (pods of every tag run)"
        ));
    }
    let path = PathBuf::from(path.trim());
    if !path.exists() {
        return Err(format!("{}: no such file", path.display()));
    }
    if !kedge_sim::processes::executable(&path) {
        return Err(format!("{}: not an executable file", path.display()));
    }
    Ok((repository.to_owned(), path))
}

/// `--link MEMBER:SPEC`: split at the first ':', the SPEC's errors as its parser words them.
fn link(text: &str) -> Result<(String, kedge_sim::link::LinkSpec), String> {
    let (member, spec) = text
        .split_once(':')
        .ok_or_else(|| format!("{text:?} is not MEMBER:SPEC (e.g. member-1:rtt=600ms,loss=5)"))?;
    let member = member.trim();
    if member.is_empty() {
        return Err(format!("{text:?}: no MEMBER before ':'"));
    }
    let spec = spec.parse().map_err(|e| format!("{member}: {e}"))?;
    Ok((member.to_owned(), spec))
}

/// `--heartbeat`: what the hub accepts for `--heartbeat-interval`, checked before anything
/// starts.
fn heartbeat(text: &str) -> Result<String, String> {
    kedge_net::flags::duration_within(Duration::from_millis(100), Duration::from_secs(600))(text)
        .map(|_| text.to_owned())
}

/// `--speed`: a finite factor in 0.01..=1000.
fn speed(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if !(0.01..=1000.0).contains(&value) {
        return Err(format!("must be between 0.01 and 1000, got {text}"));
    }
    Ok(value)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = match Cli::parse().cmd {
        Cmd::Serve(args) => args,
        Cmd::Up(args) => return up(args).await,
    };
    let config = SimConfig {
        nodes: usize::from(args.nodes),
        node_cpu: args.node_cpu,
        node_memory: args.node_memory,
        node_pods: args.node_pods,
        pod_start_delay: Duration::from_millis(args.pod_start_delay_ms),
        job_duration: Duration::from_millis(args.job_duration_ms),
        job_pods_fail: args.job_pods_fail,
        speed: args.speed,
        port_base: args.port_base,
        run_images: default_run_images()
            .into_iter()
            .chain(args.run_images)
            .collect(),
        ..SimConfig::default()
    };
    if let Some(unknown) = args.keda.iter().find(|k| !args.clusters.contains(k)) {
        anyhow::bail!(
            "--keda {unknown}: not one of the --clusters ({})",
            args.clusters.join(",")
        );
    }
    let sim = Sim::start(&args.clusters, config, Some(&args.dir)).await?;
    for name in &args.keda {
        if let Some(c) = sim.cluster(name) {
            kedge_sim::keda::install(c)?;
        }
    }
    for c in sim.clusters() {
        println!(
            "cluster {} {} {}",
            c.name(),
            c.url(),
            args.dir.join(format!("{}.kubeconfig", c.name())).display()
        );
    }
    println!(
        "kubeconfig {} (a context per cluster)",
        args.dir.join("kubeconfig").display()
    );
    println!("kedge-sim ready: {} clusters", sim.clusters().len());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    sim.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_flag_is_member_colon_spec() {
        let (member, spec) = link("member-2:rtt=600ms,loss=5").expect("valid");
        assert_eq!(member, "member-2");
        assert_eq!(spec.to_string(), "rtt=600ms,loss=5");
        let errors = [
            ("member-2", "\"member-2\" is not MEMBER:SPEC"),
            (":rtt=1s", "no MEMBER before ':'"),
            (
                "member-2:loss=200",
                "member-2: loss=200: the loss is a percent from 0 to 100",
            ),
            ("member-2:rtt=1s:2s", "member-2: rtt=1s:2s: not a duration"),
        ];
        for (text, want) in errors {
            let got = link(text).expect_err(text);
            assert!(got.contains(want), "{text}: {got}");
        }
        let twice = vec![
            link("member-1:rtt=1s").expect("valid"),
            link("member-1:rtt=2s").expect("valid"),
        ];
        let err = one_link_per_member(twice).expect_err("member-1 twice");
        assert_eq!(
            err.to_string(),
            "--link member-1: given twice; one link per member"
        );
    }
}
