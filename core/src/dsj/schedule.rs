//! Cluster scheduling of new Jobs: smooth weighted round robin and priority failover.

use std::collections::BTreeMap;

/// Persistent state of smooth weighted round robin (nginx's algorithm): each member's
/// running "current weight". Kept by the hub between polls so that proportions are exact
/// over time, not only within one poll.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WrrState {
    /// Current weight per member.
    pub current: BTreeMap<String, i64>,
}

impl WrrState {
    /// Picks the next member among `candidates` (name, weight > 0), in candidate order on
    /// ties: every candidate gains its weight, the largest is chosen and loses the sum of
    /// weights. Over W = Σ weights picks each member is chosen exactly weight times, spread
    /// evenly. Returns `None` when no candidate has a positive weight.
    pub fn pick(&mut self, candidates: &[(&str, u32)]) -> Option<String> {
        let total: i64 = candidates.iter().map(|(_, w)| i64::from(*w)).sum();
        if total == 0 {
            return None;
        }
        let mut best: Option<(&str, i64)> = None;
        for (name, weight) in candidates.iter().filter(|(_, w)| *w > 0) {
            let cw = self.current.entry((*name).to_owned()).or_insert(0);
            *cw += i64::from(*weight);
            if best.is_none_or(|(_, b)| *cw > b) {
                best = Some((name, *cw));
            }
        }
        let (name, _) = best?;
        if let Some(cw) = self.current.get_mut(name) {
            *cw -= total;
        }
        Some(name.to_owned())
    }

    /// Assigns `n` Jobs to `candidates` as `n` successive [`WrrState::pick`]s would, in
    /// O(Σ weights) instead of O(n): a full cycle of Σ weights picks gives every candidate
    /// exactly its weight and leaves the state unchanged, so only the remainder is picked
    /// one by one. Returns the count per candidate (all zero when no weight is positive).
    pub fn assign(&mut self, candidates: &[(&str, u32)], n: u64) -> Vec<u64> {
        let total: u64 = candidates.iter().map(|(_, w)| u64::from(*w)).sum();
        let mut counts = vec![0u64; candidates.len()];
        if total == 0 {
            return counts;
        }
        let cycles = n / total;
        for (count, (_, weight)) in counts.iter_mut().zip(candidates) {
            *count = cycles.saturating_mul(u64::from(*weight));
        }
        for _ in 0..n % total {
            if let Some(name) = self.pick(candidates)
                && let Some(i) = candidates.iter().position(|(c, _)| *c == name)
            {
                counts[i] += 1;
            }
        }
        counts
    }

    /// Drops state of members that are no longer part of the DSJ.
    pub fn retain(&mut self, members: &[&str]) {
        self.current
            .retain(|name, _| members.contains(&name.as_str()));
    }
}

/// The member priorityFailover chooses: the highest priority among `candidates`
/// (name, priority), the first listed on equal priority.
pub fn highest_priority<'a>(candidates: &[(&'a str, i32)]) -> Option<&'a str> {
    let mut best: Option<(&str, i32)> = None;
    for &(name, priority) in candidates {
        if best.is_none_or(|(_, p)| priority > p) {
            best = Some((name, priority));
        }
    }
    best.map(|(name, _)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smooth_and_exact() {
        let mut wrr = WrrState::default();
        let picks: Vec<String> = (0..10)
            .filter_map(|_| wrr.pick(&[("a", 2), ("b", 3)]))
            .collect();
        assert_eq!(picks, ["b", "a", "b", "a", "b", "b", "a", "b", "a", "b"]);
        let mut wrr = WrrState::default();
        let picks: Vec<String> = (0..7)
            .filter_map(|_| wrr.pick(&[("a", 5), ("b", 1), ("c", 1)]))
            .collect();
        // nginx's documented sequence for weights 5,1,1.
        assert_eq!(picks, ["a", "a", "b", "a", "c", "a", "a"]);
    }

    #[test]
    fn assign_equals_successive_picks() {
        let candidates = [("a", 2), ("b", 3), ("c", 0), ("d", 1)];
        for n in [0u64, 1, 5, 6, 7, 13, 100] {
            let mut one_by_one = WrrState::default();
            // Start from a non-trivial state.
            one_by_one.pick(&candidates);
            let mut batched = one_by_one.clone();
            let mut expected = vec![0u64; candidates.len()];
            for _ in 0..n {
                let name = one_by_one.pick(&candidates).expect("positive weights");
                let i = candidates
                    .iter()
                    .position(|(c, _)| *c == name)
                    .expect("a candidate");
                expected[i] += 1;
            }
            assert_eq!(batched.assign(&candidates, n), expected, "n = {n}");
            assert_eq!(batched, one_by_one, "same state after n = {n}");
        }
        let mut wrr = WrrState::default();
        assert_eq!(
            wrr.assign(&[("a", 1), ("b", 1)], 2_000_000_000),
            vec![1_000_000_000; 2]
        );
    }

    #[test]
    fn zero_weights_are_never_picked() {
        let mut wrr = WrrState::default();
        assert_eq!(wrr.pick(&[("a", 0)]), None);
        for _ in 0..5 {
            assert_eq!(wrr.pick(&[("a", 0), ("b", 1)]).as_deref(), Some("b"));
        }
    }

    #[test]
    fn priority_order() {
        assert_eq!(
            highest_priority(&[("a", 0), ("b", 100), ("c", 100)]),
            Some("b")
        );
        assert_eq!(highest_priority(&[]), None);
    }
}
