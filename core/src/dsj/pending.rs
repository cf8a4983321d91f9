//! KEDA's pending rule, applied to the Job facts a member agent reports.

use kedge_protocol::{JobPhase, JobStatus};

/// Whether a reported Job counts as pending for a ScaledJob whose scaling strategy lists
/// `pending_pod_conditions` (KEDA `getPendingJobCount`, as of 2.18): a finished Job never
/// is; with conditions listed, an unfinished Job is pending unless one of its pods has every
/// listed condition `True`; with none, unless one of its pods is `Running` or `Succeeded`.
pub fn is_pending(job: &JobStatus, pending_pod_conditions: &[String]) -> bool {
    if matches!(job.phase, JobPhase::Succeeded | JobPhase::Failed) {
        return false;
    }
    if pending_pod_conditions.is_empty() {
        return !job.any_pod_running_or_completed;
    }
    !job.true_pod_conditions.iter().any(|set| {
        set.pods > 0
            && pending_pod_conditions
                .iter()
                .all(|wanted| set.true_conditions.iter().any(|c| c == wanted))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kedge_protocol::PodConditionSet;

    /// A pod of the Job, as KEDA's tests build them: a phase and the conditions `True`.
    struct Pod(&'static str, &'static [&'static str]);

    /// The facts an agent reports for a Job with `pods` (phase as the agent maps it).
    fn job(pods: &[Pod]) -> JobStatus {
        let running = pods.iter().any(|p| matches!(p.0, "Running" | "Succeeded"));
        let mut sets: Vec<PodConditionSet> = Vec::new();
        for pod in pods {
            let mut conditions: Vec<String> = pod.1.iter().map(|c| (*c).to_owned()).collect();
            conditions.sort();
            match sets.iter_mut().find(|s| s.true_conditions == conditions) {
                Some(set) => set.pods += 1,
                None => sets.push(PodConditionSet {
                    true_conditions: conditions,
                    pods: 1,
                }),
            }
        }
        JobStatus {
            namespace: "ns".into(),
            name: "j".into(),
            owner: "ns/dsj".into(),
            phase: if running {
                JobPhase::Running
            } else {
                JobPhase::Pending
            },
            created_unix_ms: 0,
            any_pod_running_or_completed: running,
            true_pod_conditions: sets,
            pending_reason: None,
            failure_reason: None,
            finished_unix_ms: None,
            replaces: None,
            template: None,
        }
    }

    /// KEDA's `TestGetPendingJobCount` cases (`pkg/scaling/executor/scale_jobs_test.go`),
    /// plus finished Jobs, which KEDA never lists as pending.
    #[test]
    fn keda_pending_cases() {
        let listed: &[&str] = &["Ready", "PodScheduled"];
        let both: &[&str] = &["Ready", "PodScheduled"];
        let cases: &[(&str, &[&str], Vec<Pod>, bool)] = &[
            ("succeeded pod", &[], vec![Pod("Succeeded", &[])], false),
            ("running pod", &[], vec![Pod("Running", &[])], false),
            ("failed pod", &[], vec![Pod("Failed", &[])], true),
            ("pending pod", &[], vec![Pod("Pending", &[])], true),
            ("unknown pod", &[], vec![Pod("Unknown", &[])], true),
            ("no pod yet", &[], vec![], true),
            ("no conditions", listed, vec![Pod("", &[])], true),
            ("only Ready", listed, vec![Pod("", &["Ready"])], true),
            (
                "only PodScheduled",
                listed,
                vec![Pod("", &["PodScheduled"])],
                true,
            ),
            ("both", listed, vec![Pod("", both)], false),
            (
                "two pods with both",
                listed,
                vec![Pod("", both), Pod("", both)],
                false,
            ),
            (
                "one of two pods with both",
                listed,
                vec![Pod("", both), Pod("", &["Ready"])],
                false,
            ),
            (
                "two pods with one each",
                listed,
                vec![Pod("", &["Ready"]), Pod("", &["PodScheduled"])],
                true,
            ),
            (
                "one of three pods with both",
                listed,
                vec![Pod("", &[]), Pod("", &["Ready"]), Pod("", both)],
                false,
            ),
            (
                "three pods, none with both",
                listed,
                vec![
                    Pod("", &[]),
                    Pod("", &["Ready"]),
                    Pod("", &["PodScheduled"]),
                ],
                true,
            ),
            (
                "empty list falls back to running",
                &[],
                vec![Pod("Running", &["Ready"])],
                false,
            ),
        ];
        for (what, conditions, pods, pending) in cases {
            let conditions: Vec<String> = conditions.iter().map(|c| (*c).to_owned()).collect();
            assert_eq!(is_pending(&job(pods), &conditions), *pending, "{what}");
        }
    }

    #[test]
    fn finished_jobs_are_never_pending() {
        for phase in [JobPhase::Succeeded, JobPhase::Failed] {
            let finished = JobStatus {
                phase,
                ..job(&[Pod("Failed", &[])])
            };
            assert!(!is_pending(&finished, &[]));
            assert!(!is_pending(&finished, &["Ready".to_owned()]));
        }
    }
}
