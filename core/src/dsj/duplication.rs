//! What to do when a stuck source Job and its failover replacement both exist.

use serde::{Deserialize, Serialize};

use crate::validate::DuplicationPolicy;

/// Phase of one Job of a source/failover pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum JobPhase {
    /// Created, pods not running yet.
    Pending,
    /// Pods running.
    Running,
    /// Finished successfully.
    Succeeded,
    /// Finished with failure.
    Failed,
    /// Deleted or never created.
    Gone,
}

impl JobPhase {
    fn active(self) -> bool {
        matches!(self, JobPhase::Pending | JobPhase::Running)
    }
    fn healthy(self) -> bool {
        matches!(self, JobPhase::Running | JobPhase::Succeeded)
    }
}

/// The action on a pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum DuplicateAction {
    /// Leave both.
    KeepBoth,
    /// Delete the source Job.
    DeleteSource,
    /// Delete the failover Job.
    DeleteFailover,
}

/// Resolves a source/failover pair under `policy`:
/// `keepAll` keeps both; `immediateSourceCleanup` deletes the source as soon as the failover
/// Job exists; `preferFailover` deletes the source once the failover Job is confirmed
/// healthy (running or succeeded); `preferSource` deletes the failover Job once the source
/// is healthy again. Finished or deleted Jobs are never "deleted" again.
pub fn resolve_duplicate(
    policy: DuplicationPolicy,
    source: JobPhase,
    failover: JobPhase,
) -> DuplicateAction {
    match policy {
        DuplicationPolicy::KeepAll => DuplicateAction::KeepBoth,
        DuplicationPolicy::ImmediateSourceCleanup
            if source.active() && failover != JobPhase::Gone =>
        {
            DuplicateAction::DeleteSource
        }
        DuplicationPolicy::PreferFailover if source.active() && failover.healthy() => {
            DuplicateAction::DeleteSource
        }
        DuplicationPolicy::PreferSource if failover.active() && source.healthy() => {
            DuplicateAction::DeleteFailover
        }
        _ => DuplicateAction::KeepBoth,
    }
}

#[cfg(test)]
mod tests {
    use super::DuplicateAction::*;
    use super::JobPhase::*;
    use super::*;

    #[test]
    fn four_policies() {
        use DuplicationPolicy as P;
        let cases = [
            (P::KeepAll, Pending, Running, KeepBoth),
            (P::KeepAll, Running, Running, KeepBoth),
            (P::ImmediateSourceCleanup, Pending, Pending, DeleteSource),
            (P::ImmediateSourceCleanup, Succeeded, Pending, KeepBoth),
            (P::ImmediateSourceCleanup, Pending, Gone, KeepBoth),
            (P::PreferFailover, Pending, Pending, KeepBoth),
            (P::PreferFailover, Pending, Running, DeleteSource),
            (P::PreferFailover, Running, Succeeded, DeleteSource),
            (P::PreferFailover, Pending, Failed, KeepBoth),
            (P::PreferSource, Pending, Running, KeepBoth),
            (P::PreferSource, Running, Pending, DeleteFailover),
            (P::PreferSource, Running, Running, DeleteFailover),
            (P::PreferSource, Failed, Running, KeepBoth),
        ];
        for (policy, source, failover, expected) in cases {
            assert_eq!(
                resolve_duplicate(policy, source, failover),
                expected,
                "{policy:?} {source:?} {failover:?}"
            );
        }
    }
}
