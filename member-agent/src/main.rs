use kedge_agent::config::AgentArgs;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // One explicit crypto provider for every TLS user in the process (quinn, kube).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = AgentArgs::parse_checked();
    kedge_net::telemetry::init(args.log_format);
    let shutdown = CancellationToken::new();
    tokio::spawn(kedge_net::signals::cancel_on_signal(shutdown.clone()));
    kedge_agent::run(args, shutdown).await?;
    Ok(())
}
