//! Exactly-once Jobs across hub restarts, with the real binaries on kedge-sim: the hub is
//! stopped (SIGTERM) and killed (SIGKILL) at points of a queue burst, an agent is frozen
//! across the restart for longer than any startup grace, every agent reconnects at once, and
//! the Jobs ever created per DSJ (every name seen in every member, sampled all along) must
//! equal what the strategy asked for: none twice, none missing, none deleted.
//!
//! The bounded form runs in CI. `KEDGE_CHAOS_MEMBERS` (default 3), `KEDGE_CHAOS_ROUNDS`
//! (default 2) and `KEDGE_CHAOS_OUTAGE_S` (how long the hub stays down in the last round,
//! default 3) make it longer: `make chaos-dsj` runs 20 members, 6 rounds and a 10-minute
//! outage.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use kube::api::ListParams;
use support::dso::*;
use support::*;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A DSJ at target 1 per Job over the queue ConfigMap, listing `members` (or none: every
/// registered member).
fn dsj_yaml(name: &str, members: Option<&[String]>) -> String {
    let listed = members.map_or(String::new(), |m| {
        let entries: Vec<String> = m.iter().map(|m| format!("  - {{name: {m}}}")).collect();
        format!("  memberClusters:\n{}\n", entries.join("\n"))
    });
    format!(
        r#"apiVersion: kedge.dev/v1alpha1
kind: DistributedScaledJob
metadata: {{name: {name}, namespace: default}}
spec:
{listed}  scaledJobSpec:
    pollingInterval: 1
    maxReplicaCount: 5000
    scalingStrategy: {{strategy: basic}}
    jobTargetRef:
      template:
        spec:
          restartPolicy: Never
          containers: [{{name: worker, image: busybox}}]
    triggers:
    - type: kubernetes-resource
      name: queue
      metadata: {{resourceKind: ConfigMap, resourceName: queue, key: length, targetValue: "1"}}
"#
    )
}

/// Job names of DSJ `dsj` now, by member.
async fn names_now(fleet: &Fleet, dsj: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for member in &fleet.members {
        let client = fleet.sim.cluster(member).unwrap().client().unwrap();
        let list = Api::<Job>::namespaced(client, "default")
            .list(&ListParams::default().labels(&format!("kedge.dev/distributedscaledjob={dsj}")))
            .await
            .unwrap();
        out.insert(
            member.clone(),
            list.items
                .into_iter()
                .filter_map(|j| j.metadata.name)
                .collect(),
        );
    }
    out
}

/// (member, Job name) pairs.
type Placed = BTreeSet<(String, String)>;

/// Every (member, Job name) ever seen per DSJ, sampled every 100 ms in the background.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<BTreeMap<String, Placed>>>);

impl Seen {
    fn record(&self, dsj: &str, now: &BTreeMap<String, BTreeSet<String>>) {
        let mut seen = self.0.lock().unwrap();
        let entry = seen.entry(dsj.to_owned()).or_default();
        for (member, names) in now {
            for name in names {
                entry.insert((member.clone(), name.clone()));
            }
        }
    }

    fn of(&self, dsj: &str) -> Placed {
        self.0.lock().unwrap().get(dsj).cloned().unwrap_or_default()
    }
}

const DSJS: [&str; 2] = ["listed", "unlisted"];

/// Checks both DSJs: exactly `want` Jobs now, every Job ever seen still there (none deleted),
/// no name in two members (a Job created twice).
async fn exactly(fleet: &Fleet, seen: &Seen, want: usize, what: &str) {
    for dsj in DSJS {
        let now = names_now(fleet, dsj).await;
        seen.record(dsj, &now);
        let current: Placed = now
            .iter()
            .flat_map(|(m, names)| names.iter().map(move |n| (m.clone(), n.clone())))
            .collect();
        let ever = seen.of(dsj);
        assert_eq!(
            ever.len(),
            want,
            "{what}: {dsj} created {} Jobs, the strategy asked for {want}: {now:?}",
            ever.len()
        );
        assert_eq!(current, ever, "{what}: {dsj} lost a running Job");
        let names: BTreeSet<&String> = ever.iter().map(|(_, n)| n).collect();
        assert_eq!(
            names.len(),
            ever.len(),
            "{what}: {dsj}: one name in two members"
        );
    }
}

/// Waits until both DSJs have `want` Jobs, then checks that they stay exactly so.
async fn settles(fleet: &Fleet, seen: &Seen, want: usize, what: &str) {
    wait_for(4 * LIMIT, what, || async {
        let mut all = true;
        for dsj in DSJS {
            let now = names_now(fleet, dsj).await;
            seen.record(dsj, &now);
            all &= now.values().map(BTreeSet::len).sum::<usize>() >= want;
        }
        all.then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    exactly(fleet, seen, want, what).await;
}

fn start_hub(fleet: &Fleet, log: &str) -> Proc {
    fleet.start_hub_with(log, &["--dsj-enabled", "true"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_job_is_created_twice_across_hub_restarts() {
    let count = env_or("KEDGE_CHAOS_MEMBERS", 3).max(2);
    let rounds = env_or("KEDGE_CHAOS_ROUNDS", 2).max(1);
    let outage = Duration::from_secs(env_or("KEDGE_CHAOS_OUTAGE_S", 3));
    let names: Vec<String> = (1..=count).map(|i| format!("member-{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    // Jobs outlive the test: every Job created is still there at the end.
    let (_dir, fleet) = start_with(&refs, |c| c.job_duration = Duration::from_secs(3600)).await;
    let mut hub = start_hub(&fleet, "hub-0.log");
    let mut agents: Vec<Proc> = names
        .iter()
        .map(|m| fleet.start_agent(m, None, &format!("{m}-0.log")))
        .collect();
    wait_for_states(fleet.ports, &refs, "Connected", 4 * LIMIT).await;
    let seen = Seen::default();
    // Sample all along: a Job created and deleted between two checks is still caught.
    let sampler = {
        let seen = seen.clone();
        let clients: Vec<(String, kube::Client)> = names
            .iter()
            .map(|m| (m.clone(), fleet.sim.cluster(m).unwrap().client().unwrap()))
            .collect();
        tokio::spawn(async move {
            loop {
                for dsj in DSJS {
                    let mut now = BTreeMap::new();
                    for (member, client) in &clients {
                        let lp = ListParams::default()
                            .labels(&format!("kedge.dev/distributedscaledjob={dsj}"));
                        if let Ok(list) = Api::<Job>::namespaced(client.clone(), "default")
                            .list(&lp)
                            .await
                        {
                            now.insert(
                                member.clone(),
                                list.items
                                    .into_iter()
                                    .filter_map(|j| j.metadata.name)
                                    .collect(),
                            );
                        }
                    }
                    seen.record(dsj, &now);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    set_queue(&fleet, 0).await;
    apply(&fleet, &dsj_yaml("listed", Some(&names)), "listed.yaml").await;
    apply(&fleet, &dsj_yaml("unlisted", None), "unlisted.yaml").await;
    let mut want = 3 * count;
    set_queue(&fleet, want).await;
    settles(
        &fleet,
        &seen,
        usize::try_from(want).unwrap(),
        "the first burst",
    )
    .await;

    for round in 1..=rounds {
        // A graceful stop with member-1's agent frozen across it, for longer than the old
        // startup grace: the new hub must count member-1's Jobs from the DSJ's status.
        agents[0].signal("STOP");
        hub.signal("TERM");
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(hub);
        hub = start_hub(&fleet, &format!("hub-{round}a.log"));
        tokio::time::sleep(Duration::from_secs(8)).await;
        exactly(
            &fleet,
            &seen,
            usize::try_from(want).unwrap(),
            &format!("round {round}: member-1 frozen across a SIGTERM restart"),
        )
        .await;
        agents[0].signal("CONT");
        wait_for_states(fleet.ports, &refs, "Connected", 4 * LIMIT).await;

        // A burst, and a SIGKILL somewhere inside it (its point moves from round to round).
        want += count + round;
        set_queue(&fleet, want).await;
        let into = Duration::from_millis(150 * (round % 7));
        tokio::time::sleep(into).await;
        hub.signal("KILL");
        drop(hub);
        // The last round: the hub stays down (the outage), and every agent is restarted at
        // once while it is, so they all reconnect together.
        if round == rounds {
            tokio::time::sleep(outage).await;
            agents.clear();
            agents = names
                .iter()
                .map(|m| fleet.start_agent(m, None, &format!("{m}-{round}.log")))
                .collect();
        }
        hub = start_hub(&fleet, &format!("hub-{round}b.log"));
        wait_for_states(fleet.ports, &refs, "Connected", 4 * LIMIT).await;
        settles(
            &fleet,
            &seen,
            usize::try_from(want).unwrap(),
            &format!("round {round}: SIGKILL {into:?} into a burst"),
        )
        .await;
    }
    sampler.abort();
    // Every queue item has its Job, spread over the members.
    for dsj in DSJS {
        let now = names_now(&fleet, dsj).await;
        let busy = now.values().filter(|n| !n.is_empty()).count();
        assert!(busy >= 2, "{dsj}: Jobs all in one member: {now:?}");
    }
    drop(hub);
}
