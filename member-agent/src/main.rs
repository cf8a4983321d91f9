use kedge_agent::config::AgentArgs;
use tokio_util::sync::CancellationToken;

// One thread: the agent mostly waits on I/O, and every thread keeps memory of its own (its
// stack, its allocator arena). With 1,000 Jobs the agent measured 26 MiB RSS with 16
// workers, 18 MiB with 2; idle, one thread holds 0.4 MiB less than two workers and the
// main thread (`make footprint`).
#[tokio::main(flavor = "current_thread")]
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
