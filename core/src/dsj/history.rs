//! History-limit cleanup: which finished Jobs to delete.

use std::time::SystemTime;

/// A finished Job of one DSJ in one member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinishedJob {
    /// Job name.
    pub name: String,
    /// Succeeded (`true`) or failed (`false`).
    pub succeeded: bool,
    /// Completion (or failure) time.
    pub finished_at: SystemTime,
}

/// Names of the finished Jobs to delete so that at most `successful_limit` successful and
/// `failed_limit` failed Jobs remain, keeping the most recently finished (ties: the name
/// that sorts last is kept, so the choice is deterministic). Sorted by name.
pub fn jobs_to_delete(
    jobs: &[FinishedJob],
    successful_limit: u32,
    failed_limit: u32,
) -> Vec<String> {
    let mut doomed = Vec::new();
    for (succeeded, limit) in [(true, successful_limit), (false, failed_limit)] {
        let mut group: Vec<&FinishedJob> =
            jobs.iter().filter(|j| j.succeeded == succeeded).collect();
        group.sort_by(|a, b| {
            b.finished_at
                .cmp(&a.finished_at)
                .then_with(|| b.name.cmp(&a.name))
        });
        let keep = usize::try_from(limit).unwrap_or(usize::MAX);
        doomed.extend(group.into_iter().skip(keep).map(|j| j.name.clone()));
    }
    doomed.sort();
    doomed
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn job(name: &str, succeeded: bool, secs: u64) -> FinishedJob {
        FinishedJob {
            name: name.into(),
            succeeded,
            finished_at: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
        }
    }

    #[test]
    fn keeps_newest_per_outcome() {
        // Reference example: keep up to 2 failed and 2 successful, delete all older.
        let jobs = [
            job("s1", true, 10),
            job("s2", true, 20),
            job("s3", true, 30),
            job("f1", false, 5),
            job("f2", false, 15),
            job("f3", false, 25),
            job("f4", false, 35),
        ];
        assert_eq!(jobs_to_delete(&jobs, 2, 2), vec!["f1", "f2", "s1"]);
        assert_eq!(jobs_to_delete(&jobs, 100, 100), Vec::<String>::new());
        assert_eq!(jobs_to_delete(&jobs, 0, 4), vec!["s1", "s2", "s3"]);
        let tie = [job("a", true, 1), job("b", true, 1)];
        assert_eq!(jobs_to_delete(&tie, 1, 0), vec!["a"]);
    }
}
