use clap::Parser;
use kedge_hub::config::HubArgs;
use tokio_util::sync::CancellationToken;

/// The hub allocates and frees small strings and maps for every member at every decision;
/// glibc's allocator spent a quarter of the hub's CPU on it at 10,000 members
/// (docs/scale.md, "The allocator").
/// The `system-allocator` feature leaves the process's own allocator in place, for heap
/// profilers that intercept `malloc`.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // One explicit crypto provider for every TLS user in the process (quinn, kube).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = HubArgs::parse();
    kedge_net::telemetry::init(args.log_format);
    let shutdown = CancellationToken::new();
    tokio::spawn(kedge_net::signals::cancel_on_signal(shutdown.clone()));
    // A stop never hangs: whatever a task is waiting for, the process is gone by the
    // deadline (the standby then takes the Lease when it expires).
    let backstop = shutdown.clone();
    tokio::spawn(async move {
        backstop.cancelled().await;
        tokio::time::sleep(kedge_hub::STOP_DEADLINE).await;
        tracing::error!(deadline = ?kedge_hub::STOP_DEADLINE, "the hub did not stop in time; exiting");
        std::process::exit(1);
    });
    kedge_hub::run(args, shutdown).await?;
    Ok(())
}
