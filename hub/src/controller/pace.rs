//! Paces the re-planning that fleet changes cause by what it costs.
//!
//! Every session that comes or goes, and every report with new counts, is a fleet change;
//! the DSOs that involve it are planned again after a short coalescing window. In a
//! reconnect storm (a hub restart, a flapping link in front of thousands of members) the
//! changes never stop, and a DSO over 10,000 members takes ~100 ms to plan: back to back,
//! re-planning took a quarter of the hub's CPU in a 10,000-member restart, away from the
//! handshakes the storm is made of (docs/scale.md). So after a DSO reconciliation that took
//! `d`, the next batch of fleet-triggered re-planning waits until [`FACTOR`] × `d` (at most
//! [`LONGEST`]) have passed since it ended: re-planning in a storm runs at most a quarter of
//! the time while reconciliations take under [`LONGEST`] / [`FACTOR`], and is followed by a
//! [`LONGEST`] pause when they take longer; a member that joins in it waits at most that
//! pause and one reconciliation longer for its commands. `d` is the whole reconciliation, its
//! API calls included: a busy hub, or a slow hub cluster API server, re-plans less often
//! rather than queueing more of the same work. Small fleets, whose reconciliations take a few
//! milliseconds, only see the coalescing window.
//!
//! The pause is for storms, whose changes never stop. When the fleet has been quiet for
//! [`QUIET`] (no session came or went, no report changed a plan) the rest of the pause is cut
//! short ([`Pace::settled_or`] with [`quiet`]): the member that comes back last in a storm
//! waits for the reconciliation running then, [`QUIET`] and its own, not a whole pause. Changes
//! that come in bursts further apart than [`QUIET`] can then re-plan once per burst: at
//! most a reconciliation per `QUIET` + coalescing window + reconciliation.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// How many times a reconciliation's own duration the next fleet-triggered batch waits
/// after it ends.
pub const FACTOR: u32 = 3;

/// The longest wait one reconciliation can impose on the next batch, however long it took: a
/// member that joins waits at most this and one reconciliation for its commands (a slow API
/// server, or a reconciliation of 10,000 members on a busy hub, takes 0.5 s and more).
pub const LONGEST: Duration = Duration::from_secs(1);

/// How long the fleet must be quiet for the next batch to skip the rest of the pause.
pub const QUIET: Duration = Duration::from_millis(100);

/// What the DSO reconciliations have cost lately.
#[derive(Debug, Default)]
pub struct Pace {
    state: Mutex<State>,
    ended: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Reconciliations running now.
    running: usize,
    /// When the next fleet-triggered batch may start, at the earliest.
    next: Option<Instant>,
}

impl Pace {
    /// Marks a reconciliation as running until the returned guard is dropped.
    pub fn start(&self) -> Running<'_> {
        self.lock().running += 1;
        Running {
            pace: self,
            started: Instant::now(),
        }
    }

    /// Waits until no reconciliation runs and the last one's pause has passed, or, once
    /// `early` has resolved (the fleet went [`quiet`]), until no reconciliation runs.
    pub async fn settled_or(&self, early: impl Future<Output = ()>) {
        let mut early = std::pin::pin!(early);
        let mut cut = false;
        loop {
            let ended = self.ended.notified();
            let wait = {
                let state = self.lock();
                if state.running > 0 {
                    None
                } else {
                    match state.next {
                        Some(next) if next > Instant::now() && !cut => Some(next),
                        _ => return,
                    }
                }
            };
            // A reconciliation that ends while this sleeps may move `next` later.
            tokio::select! {
                () = tokio::time::sleep_until(wait.unwrap_or_else(Instant::now)),
                    if wait.is_some() => {}
                () = ended => {}
                () = &mut early, if !cut => cut = true,
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Resolves once `changes` has not changed for `quiet` (never once its sender is gone).
pub async fn quiet<T>(changes: &mut watch::Receiver<T>, quiet: Duration) {
    loop {
        changes.borrow_and_update();
        match tokio::time::timeout(quiet, changes.changed()).await {
            Err(_) => return,
            Ok(Ok(())) => {}
            Ok(Err(_)) => std::future::pending::<()>().await,
        }
    }
}

/// A reconciliation in progress (see [`Pace::start`]).
#[derive(Debug)]
pub struct Running<'a> {
    pace: &'a Pace,
    started: Instant,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let now = Instant::now();
        let pause = (now - self.started).saturating_mul(FACTOR).min(LONGEST);
        let mut state = self.pace.lock();
        state.running -= 1;
        let next = now + pause;
        state.next = Some(state.next.map_or(next, |n| n.max(next)));
        drop(state);
        self.pace.ended.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long `settled_or` takes from now with a fleet that never goes quiet, on a paused
    /// clock.
    async fn settles_after(pace: &Pace) -> Duration {
        settles_after_or(pace, std::future::pending()).await
    }

    /// How long `settled_or(early)` takes from now, on a paused clock.
    async fn settles_after_or(pace: &Pace, early: impl Future<Output = ()>) -> Duration {
        let from = Instant::now();
        pace.settled_or(early).await;
        from.elapsed()
    }

    /// A pace after one reconciliation of `took` (its pause is `FACTOR` × `took`).
    async fn after_one(took: Duration) -> Pace {
        let pace = Pace::default();
        let running = pace.start();
        tokio::time::sleep(took).await;
        drop(running);
        pace
    }

    /// A fleet whose members come back every `every` for `count` times, from now.
    fn storm(every: Duration, count: u32) -> watch::Receiver<u64> {
        let (tx, rx) = watch::channel(0);
        tokio::spawn(async move {
            for i in 1..=u64::from(count) {
                tokio::time::sleep(every).await;
                tx.send_replace(i);
            }
            // The fleet's changes outlive the storm.
            std::future::pending::<()>().await;
        });
        rx
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_run_yet_is_settled_at_once() {
        assert_eq!(settles_after(&Pace::default()).await, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn the_next_batch_waits_three_times_what_the_last_reconciliation_took() {
        let pace = after_one(Duration::from_millis(150)).await;
        assert_eq!(settles_after(&pace).await, Duration::from_millis(450));
        // Once passed, the pause is over.
        assert_eq!(settles_after(&pace).await, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_running_reconciliation_is_waited_for_and_then_its_pause() {
        let pace = std::sync::Arc::new(Pace::default());
        let other = pace.clone();
        let task = tokio::spawn(async move {
            let _running = other.start();
            tokio::time::sleep(Duration::from_millis(100)).await;
        });
        tokio::task::yield_now().await;
        // 100 ms still running, then 300 ms of pause.
        assert_eq!(settles_after(&pace).await, Duration::from_millis(400));
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reconciliation_imposes_at_most_the_longest_pause() {
        let pace = after_one(Duration::from_secs(10)).await;
        assert_eq!(settles_after(&pace).await, LONGEST);
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_fleet_cuts_the_pause_short() {
        let pace = after_one(Duration::from_millis(300)).await;
        // The last member of a storm came back 20 ms ago: the batch goes once the fleet has
        // been quiet for `QUIET`, not after the 900 ms pause.
        let mut changes = storm(Duration::from_millis(20), 1);
        tokio::time::sleep(Duration::from_millis(25)).await;
        let took = settles_after_or(&pace, quiet(&mut changes, QUIET)).await;
        assert_eq!(took, QUIET);
    }

    #[tokio::test(start_paused = true)]
    async fn a_storm_waits_out_the_pause() {
        let pace = after_one(Duration::from_millis(300)).await;
        // A member every 50 ms for 2 s: never quiet, so the whole pause.
        let mut changes = storm(Duration::from_millis(50), 40);
        let took = settles_after_or(&pace, quiet(&mut changes, QUIET)).await;
        assert_eq!(took, Duration::from_millis(900));
        // The storm ends at 2 s: quiet `QUIET` after its last member.
        let mut changes = storm(Duration::from_millis(50), 10);
        let pace = after_one(Duration::from_millis(300)).await;
        let took = settles_after_or(&pace, quiet(&mut changes, QUIET)).await;
        assert_eq!(took, Duration::from_millis(500 - 300) + QUIET);
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_fleet_still_waits_for_the_running_reconciliation() {
        let pace = std::sync::Arc::new(Pace::default());
        let other = pace.clone();
        let task = tokio::spawn(async move {
            let _running = other.start();
            tokio::time::sleep(Duration::from_millis(200)).await;
        });
        tokio::task::yield_now().await;
        // Quiet from the start: no pause after it, but the reconciliation runs to its end.
        assert_eq!(
            settles_after_or(&pace, std::future::ready(())).await,
            Duration::from_millis(200)
        );
        task.await.unwrap();
    }
}
