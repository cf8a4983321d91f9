//! Leader election of `kedge_hub::lease` against one kedge-sim cluster over real HTTP: of
//! several candidates at most one ever believes it leads, through races, API errors, a holder
//! that dies and a holder that steps down.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kedge_hub::lease::{Elector, LeaseConfig, Role, identity};
use kedge_sim::{Faults, Sim, SimConfig};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const DURATION: Duration = Duration::from_secs(1);
const NAMESPACE: &str = "kedge-system";

struct Candidate {
    identity: String,
    role: watch::Receiver<Role>,
    task: JoinHandle<()>,
    release: CancellationToken,
    /// Cleared once the candidate is stopped: a dead task's last role means nothing.
    alive: Arc<AtomicBool>,
}

/// Candidates the sampler watches.
type Watched = Arc<Mutex<Vec<(String, watch::Receiver<Role>, Arc<AtomicBool>)>>>;

fn candidate(sim: &Sim, watched: &Watched) -> Candidate {
    let client = sim.cluster("hub").unwrap().client().unwrap();
    let config = LeaseConfig {
        name: "kedge-hub".into(),
        namespace: NAMESPACE.into(),
        duration: DURATION,
        identity: identity(Some("candidate".into())),
        relay_address: None,
    };
    let (tx, role) = watch::channel(Role::WAITING);
    let release = CancellationToken::new();
    let alive = Arc::new(AtomicBool::new(true));
    watched
        .lock()
        .unwrap()
        .push((config.identity.clone(), role.clone(), alive.clone()));
    Candidate {
        identity: config.identity.clone(),
        task: Elector::new(client, config).start(tx, release.clone()),
        role,
        release,
        alive,
    }
}

fn leaders(candidates: &[Candidate]) -> Vec<String> {
    candidates
        .iter()
        .filter(|c| c.alive.load(Ordering::Acquire) && c.role.borrow().is_leader())
        .map(|c| c.identity.clone())
        .collect()
}

async fn holder(sim: &Sim) -> Option<String> {
    let api = Api::<Lease>::namespaced(sim.cluster("hub").unwrap().client().unwrap(), NAMESPACE);
    api.get_opt("kedge-hub")
        .await
        .unwrap()
        .and_then(|l| l.spec?.holder_identity)
}

async fn transitions(sim: &Sim) -> i32 {
    let api = Api::<Lease>::namespaced(sim.cluster("hub").unwrap().client().unwrap(), NAMESPACE);
    let lease = api.get("kedge-hub").await.unwrap();
    lease.spec.unwrap().lease_transitions.unwrap_or_default()
}

/// Waits until exactly one live candidate leads and the Lease names it; returns it.
async fn one_leader(sim: &Sim, candidates: &[Candidate], limit: Duration) -> String {
    let start = Instant::now();
    loop {
        let leading = leaders(candidates);
        if let [leader] = leading.as_slice()
            && holder(sim).await.as_deref() == Some(leader.as_str())
        {
            return leader.clone();
        }
        assert!(
            start.elapsed() < limit,
            "no single leader after {limit:?}: {leading:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Stops a candidate without letting it release the lease, as a crash would.
async fn kill(candidate: &Candidate) {
    candidate.task.abort();
    finished(&candidate.task).await;
    candidate.alive.store(false, Ordering::Release);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_electors_never_both_hold_the_lease() {
    let sim = Sim::start(&["hub".to_owned()], SimConfig::default(), None)
        .await
        .unwrap();
    let namespaces = Api::<Namespace>::all(sim.cluster("hub").unwrap().client().unwrap());
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap();
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let watched: Watched = Arc::default();

    // Every 5 ms: at most one live candidate believes it leads.
    let stop = CancellationToken::new();
    let samples = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let watched = watched.clone();
        let stop = stop.clone();
        let samples = samples.clone();
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let leading: Vec<String> = watched
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(_, role, alive)| {
                        alive.load(Ordering::Acquire) && role.borrow().is_leader()
                    })
                    .map(|(id, _, _)| id.clone())
                    .collect();
                assert!(leading.len() <= 1, "two leaders at once: {leading:?}");
                samples.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    // Two candidates race to create the Lease: one wins, the other stands by and names it.
    let mut candidates = vec![candidate(&sim, &watched), candidate(&sim, &watched)];
    let first = one_leader(&sim, &candidates, Duration::from_secs(3)).await;
    let other = candidates.iter().find(|c| c.identity != first).unwrap();
    tokio::time::timeout(Duration::from_secs(2), async {
        let mut role = other.role.clone();
        role.wait_for(|r| {
            *r == Role::Standby {
                holder: Some(first.clone()),
                relay: None,
            }
        })
        .await
        .unwrap();
    })
    .await
    .expect("the standby names the holder");
    assert_eq!(transitions(&sim).await, 0);
    // Renewals keep the same leader over several lease durations.
    tokio::time::sleep(DURATION * 3).await;
    assert_eq!(leaders(&candidates), std::slice::from_ref(&first));

    // The holder dies without releasing: the other takes over after the lease expires (one
    // duration plus at most one retry period), not before.
    let leader = candidates.iter().position(|c| c.identity == first).unwrap();
    let killed = Instant::now();
    kill(&candidates[leader]).await;
    let second = one_leader(&sim, &candidates, DURATION * 3).await;
    let took = killed.elapsed();
    assert_ne!(second, first);
    assert!(
        took <= DURATION + DURATION / 3 + Duration::from_millis(500),
        "{took:?}"
    );
    assert_eq!(transitions(&sim).await, 1);

    // API errors: a leader that cannot renew in time gives up before anyone may take over;
    // lost candidates are replaced, as Kubernetes restarts a hub that exits.
    candidates.push(candidate(&sim, &watched));
    let hub = sim.cluster("hub").unwrap();
    hub.set_faults(Faults {
        error_rate: 0.5,
        ..Faults::default()
    });
    let chaos = Instant::now();
    let mut lost = 0;
    while chaos.elapsed() < Duration::from_secs(6) {
        for i in 0..candidates.len() {
            let dead = matches!(*candidates[i].role.borrow(), Role::Lost { .. })
                && candidates[i].alive.load(Ordering::Acquire);
            if dead {
                lost += 1;
                kill(&candidates[i]).await;
                candidates.push(candidate(&sim, &watched));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    hub.set_faults(Faults::default());
    eprintln!("leaders lost under API errors: {lost}");
    let third = one_leader(&sim, &candidates, DURATION * 4).await;

    // The holder steps down: a standby takes over at its next read, well within a duration.
    let leader = candidates.iter().find(|c| c.identity == third).unwrap();
    let released = Instant::now();
    leader.release.cancel();
    tokio::time::timeout(Duration::from_secs(2), finished(&leader.task))
        .await
        .expect("the elector ends after releasing");
    leader.alive.store(false, Ordering::Release);
    let fourth = one_leader(&sim, &candidates, DURATION).await;
    assert_ne!(fourth, third);
    assert!(released.elapsed() < DURATION, "{:?}", released.elapsed());

    stop.cancel();
    sampler.await.expect("never two leaders");
    assert!(samples.load(Ordering::Relaxed) > 100);
    for c in &candidates {
        c.task.abort();
    }
}

async fn finished(task: &JoinHandle<()>) {
    while !task.is_finished() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
