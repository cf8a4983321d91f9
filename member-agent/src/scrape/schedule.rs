//! When each scrape target is due: pure, with time as a parameter.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kedge_protocol::{MAX_SCRAPE_TARGETS, MIN_SCRAPE_INTERVAL_MS, ScrapeTarget};
use tokio::time::Instant;

/// The longest interval honoured: longer ones would only risk overflowing the clock.
pub(crate) const MAX_SCRAPE_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// How often `target` is scraped: its interval within [`MIN_SCRAPE_INTERVAL_MS`] and
/// [`MAX_SCRAPE_INTERVAL`].
pub(crate) fn interval(target: &ScrapeTarget) -> Duration {
    Duration::from_millis(target.interval_ms).clamp(
        Duration::from_millis(MIN_SCRAPE_INTERVAL_MS),
        MAX_SCRAPE_INTERVAL,
    )
}

/// A target is one trigger of one hub object.
type Key = (String, u32);

#[derive(Debug)]
struct Entry {
    target: Arc<ScrapeTarget>,
    due: Instant,
    /// A scrape of it is under way: it is not started again until that one ends.
    running: bool,
}

/// The current targets and when each is next due.
#[derive(Debug, Default)]
pub(crate) struct Schedule {
    entries: BTreeMap<Key, Entry>,
}

impl Schedule {
    /// Replaces the targets with `targets` (the first [`MAX_SCRAPE_TARGETS`]; of two with
    /// the same owner and trigger, the later). A target that did not change keeps its
    /// schedule, so that a hub re-sending the same set does not make every pod scraped again
    /// at once; a new or changed one is due at `now`.
    pub(crate) fn replace(&mut self, targets: &[ScrapeTarget], now: Instant) {
        let mut old = std::mem::take(&mut self.entries);
        for target in targets.iter().take(MAX_SCRAPE_TARGETS) {
            let key = (target.owner.clone(), target.trigger);
            let entry = match old.remove(&key) {
                Some(entry) if *entry.target == *target => entry,
                _ => Entry {
                    target: Arc::new(target.clone()),
                    due: now,
                    running: false,
                },
            };
            self.entries.insert(key, entry);
        }
    }

    /// How many targets there are.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// When the next target not under way is due; `None` when none is.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.entries
            .values()
            .filter(|e| !e.running)
            .map(|e| e.due)
            .min()
    }

    /// The targets due at `now` and not under way, in key order, marked under way and due
    /// again one interval from `now` (so that targets due together stay together).
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<Arc<ScrapeTarget>> {
        self.entries
            .values_mut()
            .filter(|e| !e.running && e.due <= now)
            .map(|e| {
                e.running = true;
                e.due = now + interval(&e.target);
                e.target.clone()
            })
            .collect()
    }

    /// Records that a scrape of `target` ended; `false` when `target` has been replaced or
    /// removed meanwhile (its sample is for nothing the hub still asks for).
    pub(crate) fn finished(&mut self, target: &Arc<ScrapeTarget>) -> bool {
        match self
            .entries
            .get_mut(&(target.owner.clone(), target.trigger))
        {
            Some(entry) if Arc::ptr_eq(&entry.target, target) => {
                entry.running = false;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use kedge_protocol::{ScrapePort, WorkloadRef};

    pub(crate) fn target(owner: &str, trigger: u32, interval_ms: u64) -> ScrapeTarget {
        ScrapeTarget {
            owner: owner.into(),
            trigger,
            workload: WorkloadRef::deployment("apps", "web"),
            metric_name: "m".into(),
            port: ScrapePort::Number(5000),
            path: "/metrics".into(),
            https: false,
            interval_ms,
            timeout_ms: 500,
        }
    }

    fn owners(due: &[Arc<ScrapeTarget>]) -> Vec<(&str, u32)> {
        due.iter().map(|t| (t.owner.as_str(), t.trigger)).collect()
    }

    #[test]
    fn intervals_are_clamped() {
        assert_eq!(interval(&target("a", 0, 0)), Duration::from_secs(1));
        assert_eq!(
            interval(&target("a", 0, 2_500)),
            Duration::from_millis(2_500)
        );
        assert_eq!(interval(&target("a", 0, u64::MAX)), MAX_SCRAPE_INTERVAL);
    }

    #[test]
    fn targets_due_together_are_taken_together_and_not_restarted_while_running() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut schedule = Schedule::default();
        assert_eq!(schedule.next_due(), None);
        schedule.replace(
            &[
                target("ns/a", 0, 1_000),
                target("ns/b", 0, 3_000),
                target("ns/a", 1, 1_000),
            ],
            t0,
        );
        assert_eq!(schedule.next_due(), Some(t0));
        let first = schedule.take_due(t0);
        assert_eq!(owners(&first), [("ns/a", 0), ("ns/a", 1), ("ns/b", 0)]);
        // All under way: nothing is due until one ends.
        assert_eq!(schedule.next_due(), None);
        assert!(schedule.take_due(t0 + 10 * s).is_empty());
        assert!(schedule.finished(&first[0]) && schedule.finished(&first[1]));
        assert_eq!(schedule.next_due(), Some(t0 + s));
        assert!(schedule.take_due(t0 + s / 2).is_empty());
        assert_eq!(
            owners(&schedule.take_due(t0 + s)),
            [("ns/a", 0), ("ns/a", 1)]
        );
        // A scrape that outlived its interval runs again as soon as it ends.
        assert!(schedule.finished(&first[2]));
        assert_eq!(schedule.next_due(), Some(t0 + 3 * s));
        assert_eq!(owners(&schedule.take_due(t0 + 4 * s)), [("ns/b", 0)]);
    }

    #[test]
    fn a_new_set_keeps_the_schedule_of_unchanged_targets() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut schedule = Schedule::default();
        schedule.replace(&[target("ns/a", 0, 5_000), target("ns/b", 0, 5_000)], t0);
        let first = schedule.take_due(t0);
        assert_eq!(first.len(), 2);
        let mut changed = target("ns/b", 0, 5_000);
        changed.metric_name = "other".into();
        schedule.replace(
            &[target("ns/a", 0, 5_000), changed, target("ns/c", 0, 5_000)],
            t0 + s,
        );
        // Unchanged: still under way, due at t0 + 5 s. Changed and new: due now.
        assert_eq!(
            owners(&schedule.take_due(t0 + s)),
            [("ns/b", 0), ("ns/c", 0)]
        );
        assert!(schedule.finished(&first[0]), "ns/a is still asked for");
        assert!(
            !schedule.finished(&first[1]),
            "ns/b's old scrape is for nothing"
        );
        assert_eq!(schedule.next_due(), Some(t0 + 5 * s));
        // An empty set stops everything.
        schedule.replace(&[], t0 + 2 * s);
        assert_eq!((schedule.len(), schedule.next_due()), (0, None));
        assert!(schedule.take_due(t0 + 100 * s).is_empty());
    }

    #[test]
    fn the_number_of_targets_is_bounded() {
        let many: Vec<ScrapeTarget> = (0..MAX_SCRAPE_TARGETS as u32 + 10)
            .map(|i| target("ns/a", i, 1_000))
            .collect();
        let mut schedule = Schedule::default();
        schedule.replace(&many, Instant::now());
        assert_eq!(schedule.len(), MAX_SCRAPE_TARGETS);
        // The same owner and trigger twice: the later one.
        let mut later = target("ns/a", 0, 1_000);
        later.path = "/later".into();
        schedule.replace(&[target("ns/a", 0, 1_000), later], Instant::now());
        let due = schedule.take_due(Instant::now());
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].path, "/later");
    }
}
