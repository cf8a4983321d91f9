//! Sharded hub replicas (`--sharding`, `FLEET_BENCH_REPLICAS` > 1): R release hubs on one
//! simulated hub cluster, their CA the bench's (in the Secret `kedge-hub-ca`, as the chart
//! keeps it), and the fleet's virtual agents spread over them: agent i dials replica i mod R
//! first and the others after it, as an agent given every address does (behind one Service
//! the load balancer spreads them instead). The first replica holds the Lease and decides;
//! the others relay their agents' sessions to it.
//!
//! Measured: the time until every agent is welcomed; each replica's RSS before any agent and
//! with its agents connected; the fan-out of a DSO over every member (the same rounds as one
//! hub's); and a failover: one relaying replica killed (SIGKILL), the time until each of its
//! agents has a session again through another replica and holds its desired state, with no
//! replica count changed anywhere.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

use crate::common::memory;
use crate::{
    CountChange, Fleet, HUB_NAMESPACE, Prepared, create_dso, fanout, free_port_tcp, free_port_udp,
    hub_command, new_fleet, prepare, profiles_published, spawn_agents, wait_until,
    wait_until_ready,
};

/// Runs `members` virtual agents over `replicas` sharded hubs.
pub(crate) async fn measure_sharded(members: usize, replicas: usize, rounds: usize) -> ShardRow {
    let Prepared {
        dir,
        sim,
        ca,
        names,
        configs,
        ..
    } = prepare(members).await;
    ca_secret(sim.client.clone(), &ca).await;
    let ports: Vec<(u16, u16)> = (0..replicas)
        .map(|_| (free_port_udp(), free_port_tcp()))
        .collect();
    let start = |i: usize| {
        let (quic, ops) = ports[i];
        let mut command = hub_command(dir.path(), &format!("hub-{i}.log"), members, quic, ops);
        command.args(["--sharding", "true"]);
        command.spawn().expect("cannot start kedge-hub")
    };
    // The first replica takes the Lease; the others relay to it once they know it.
    let mut hubs = vec![start(0)];
    wait_until_ready(&format!("http://127.0.0.1:{}/readyz", ports[0].1)).await;
    for i in 1..replicas {
        hubs.push(start(i));
    }
    for (_, ops) in &ports[1..] {
        wait_until_ready(&format!("http://127.0.0.1:{ops}/readyz")).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pids: Vec<u32> = hubs.iter().map(|h| h.id().unwrap()).collect();
    let idle = rss_of(&pids);

    let addresses: Vec<SocketAddr> = ports
        .iter()
        .map(|(quic, _)| SocketAddr::from(([127, 0, 0, 1], *quic)))
        .collect();
    let fleet = new_fleet(members);
    let started = Instant::now();
    let (agents, endpoints) = spawn_agents(configs, &fleet, |i| {
        Arc::from(order(&addresses, i % replicas))
    });
    wait_until("every virtual agent welcomed (sharded)", || {
        fleet.welcomed.load(Ordering::Acquire) == members
    })
    .await;
    let connected = started.elapsed();
    eprintln!(
        "{members} members over {replicas} replicas: every agent welcomed in {connected:.1?}"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss: Vec<(u64, u64)> = idle.into_iter().zip(rss_of(&pids)).collect();

    let dsos = create_dso(sim.client.clone(), &names, &fleet).await;
    profiles_published(ports[0].1, members).await;
    let (samples, _, _) = fanout(&fleet, &dsos, ports[0].1, [pids[0], sim.pid], rounds).await;
    // From here on no replica count may change.
    fleet.frozen.store(true, Ordering::Release);
    let on_victim: Vec<usize> = (0..members)
        .filter(|&i| fleet.on[i].load(Ordering::Acquire) == 0 && i % replicas == 1)
        .collect();
    {
        let mut sorted = samples.clone();
        sorted.sort();
        let rss_now = rss_of(&pids);
        eprintln!(
            "{members} members over {replicas} replicas: {} fan-out samples, p50 {} p99 {} max {}; RSS idle → connected per replica {:?} KiB, now {rss_now:?} KiB; killing replica 1",
            sorted.len(),
            crate::ms(crate::percentile(&sorted, 0.5)),
            crate::ms(crate::percentile(&sorted, 0.99)),
            crate::ms(crate::percentile(&sorted, 1.0)),
            rss,
        );
    }
    let on_victim_count = on_victim.len();
    let killed_at = Instant::now();
    let (failover, moved) = failover(&fleet, &mut hubs[1], &on_victim).await;
    eprintln!("{members} members over {replicas} replicas: {moved} agents back in {failover:.1?}");
    changes_since(&fleet, &on_victim, killed_at);
    // The other agents kept their sessions.
    let wrong = fleet.wrong.load(Ordering::Acquire);
    for agent in agents {
        agent.abort();
    }
    for endpoint in &endpoints {
        endpoint.close(0u32.into(), b"bench done");
    }
    drop(hubs);
    sim.stop().await;
    if std::env::var_os("FLEET_BENCH_KEEP").is_some() {
        eprintln!("sharded: hub logs kept in {}", dir.keep().display());
    }
    ShardRow {
        members,
        replicas,
        connected,
        rss,
        samples,
        failover,
        victims: on_victim_count,
        moved,
        wrong,
    }
}

/// Longest wait for the agents of a killed replica.
const FAILOVER_LIMIT: Duration = Duration::from_secs(120);

/// One sharded run's figures.
pub(crate) struct ShardRow {
    pub(crate) members: usize,
    pub(crate) replicas: usize,
    pub(crate) connected: Duration,
    /// Per replica: RSS (KiB) before any agent, and with the fleet connected; the first is
    /// the active one.
    pub(crate) rss: Vec<(u64, u64)>,
    pub(crate) samples: Vec<Duration>,
    /// One relaying replica killed → every one of its agents served and re-synced elsewhere.
    pub(crate) failover: Duration,
    /// Agents of the killed replica, and how many were back within the limit.
    pub(crate) victims: usize,
    pub(crate) moved: usize,
    pub(crate) wrong: usize,
}

/// Stores the bench's CA as the hub CA, so that every replica issues its server and relay
/// certificates from it and trusts the virtual agents' certificates.
pub(crate) async fn ca_secret(client: kube::Client, ca: &kedge_net::pki::CertificateAuthority) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "kedge-hub-ca", "namespace": HUB_NAMESPACE},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": ca.cert_pem(), "tls.key": ca.key_pem()},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client, HUB_NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

/// The address of each replica for agent `index`: its own first, then the others in turn.
pub(crate) fn order(replicas: &[SocketAddr], index: usize) -> Vec<SocketAddr> {
    let n = replicas.len();
    (0..n).map(|k| replicas[(index + k) % n]).collect()
}

/// Kills replica `victim` and waits (at most [`FAILOVER_LIMIT`]) until every agent that was
/// on it has a session again (through another replica; its counts are checked by `frozen`);
/// returns how long that took (the
/// limit if not all came back) and how many of its agents are back.
pub(crate) async fn failover(
    fleet: &Fleet,
    victim: &mut tokio::process::Child,
    on_victim: &[usize],
) -> (Duration, usize) {
    let before: Vec<usize> = on_victim
        .iter()
        .map(|&i| fleet.sessions[i].load(Ordering::Acquire))
        .collect();
    let killed = Instant::now();
    victim.start_kill().unwrap();
    let _ = victim.wait().await;
    loop {
        // A new session is the re-sync: an agent that holds its acknowledged state is sent
        // nothing in it (protocol.md, desired state), so `synced` need not move.
        let back = on_victim
            .iter()
            .zip(&before)
            .all(|(&i, &b)| fleet.sessions[i].load(Ordering::Acquire) > b);
        if back || killed.elapsed() >= FAILOVER_LIMIT {
            let returned = on_victim
                .iter()
                .zip(&before)
                .filter(|&(&i, &b)| fleet.sessions[i].load(Ordering::Acquire) > b)
                .count();
            return (killed.elapsed(), returned);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Prints the counts changed since `since`: on how many agents (how many of them `victims`),
/// from what to what, and when.
fn changes_since(fleet: &Fleet, victims: &[usize], since: Instant) {
    let changes = fleet.changes.lock().unwrap();
    if changes.is_empty() {
        return;
    }
    let victims: std::collections::BTreeSet<usize> = victims.iter().copied().collect();
    let agents: std::collections::BTreeSet<usize> = changes.iter().map(|c| c.agent).collect();
    let mut moves: std::collections::BTreeMap<(i32, i32), usize> = Default::default();
    for c in changes.iter() {
        *moves.entry((c.held, c.told)).or_default() += 1;
    }
    let at = |c: &CountChange| c.at.saturating_duration_since(since);
    let first = changes.iter().map(at).min().unwrap_or_default();
    let last = changes.iter().map(at).max().unwrap_or_default();
    let in_new_session = changes
        .iter()
        .filter(|c| c.session > 1 && fleet.sessions[c.agent].load(Ordering::Acquire) == c.session)
        .count();
    eprintln!(
        "counts changed: {} times on {} agents ({} of them the killed replica's); held → told: {moves:?}; from +{first:.1?} to +{last:.1?} after the kill; {in_new_session} in a session after the first",
        changes.len(),
        agents.len(),
        agents.intersection(&victims).count(),
    );
}

/// Each replica's RSS now, KiB.
pub(crate) fn rss_of(pids: &[u32]) -> Vec<u64> {
    pids.iter().map(|&p| memory(p).rss).collect()
}

/// Prints the sharded rows as a Markdown table.
pub(crate) fn print(rows: &mut [ShardRow]) {
    println!(
        "| members | replicas | all welcomed | active replica RSS idle → connected | relaying replicas RSS idle → connected (mean) | per member held (relaying) | /scale → every member told: p50 | p99 | max | relaying replica killed → its agents re-synced elsewhere (at most 120 s) | agents back | counts changed |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows.iter_mut() {
        r.samples.sort();
        let (active_idle, active_connected) = r.rss[0];
        let relaying = &r.rss[1..];
        let mean = |f: fn(&(u64, u64)) -> u64| {
            relaying.iter().map(f).sum::<u64>() / relaying.len().max(1) as u64
        };
        let (idle, connected) = (mean(|x| x.0), mean(|x| x.1));
        let held = r.members / r.replicas;
        println!(
            "| {} | {} | {:.1} s | {} → {} | {} → {} | {:.1} KiB | {} | {} | {} | {:.2} s | {} of {} | {} |",
            r.members,
            r.replicas,
            r.connected.as_secs_f64(),
            crate::mib(active_idle),
            crate::mib(active_connected),
            crate::mib(idle),
            crate::mib(connected),
            connected.saturating_sub(idle) as f64 / held.max(1) as f64,
            crate::ms(crate::percentile(&r.samples, 0.5)),
            crate::ms(crate::percentile(&r.samples, 0.99)),
            crate::ms(crate::percentile(&r.samples, 1.0)),
            r.failover.as_secs_f64(),
            r.moved,
            r.victims,
            r.wrong,
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_agent_starts_at_its_own_replica() {
        let r: Vec<std::net::SocketAddr> = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(super::order(&r, 4), [r[1], r[2], r[0]]);
    }
}
