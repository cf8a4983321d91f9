//! The agent's memory of the Jobs it manages and their pods, fed by watch events: compact
//! facts per object, the Jobs whose status may have changed since the last report, and
//! whether every watch has listed once. No I/O; the watch tasks and the report loop share
//! it behind a lock that is never held across an await.

use std::collections::{BTreeSet, HashMap};

use kedge_protocol::{JobRef, JobStatus};

use super::facts::{JobFacts, PodFacts, status_of};

/// Managed Jobs and their pods.
#[derive(Debug, Default)]
pub struct JobIndex {
    jobs: HashMap<JobRef, JobFacts>,
    /// Pods by the Job that controls them, sorted by pod name. A Job has one pod or a few,
    /// so a vector, not a map: a map's smallest node holds eleven entries.
    pods: HashMap<JobRef, Vec<(String, PodFacts)>>,
    dirty: BTreeSet<JobRef>,
    /// Watches that have not completed their first list.
    unlisted: usize,
}

fn in_scope(key: &JobRef, namespace: Option<&str>) -> bool {
    namespace.is_none_or(|ns| key.namespace == ns)
}

/// Where pod `name` is, or would go, in pods sorted by name.
fn position(pods: &[(String, PodFacts)], name: &str) -> Result<usize, usize> {
    pods.binary_search_by(|(pod, _)| pod.as_str().cmp(name))
}

impl JobIndex {
    /// An empty index that is complete once `watches` watches have each listed once.
    pub fn new(watches: usize) -> Self {
        Self {
            unlisted: watches,
            ..Self::default()
        }
    }

    /// One watch completed its first list.
    pub fn listed(&mut self) {
        self.unlisted = self.unlisted.saturating_sub(1);
    }

    /// Whether every watch has listed once: only then does the index hold every managed Job.
    pub fn complete(&self) -> bool {
        self.unlisted == 0
    }

    /// Managed Jobs known.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Whether no managed Job is known.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// A Job was added or changed; whether its facts changed.
    pub fn apply_job(&mut self, key: JobRef, facts: JobFacts) -> bool {
        if self.jobs.get(&key) == Some(&facts) {
            return false;
        }
        self.dirty.insert(key.clone());
        self.jobs.insert(key, facts);
        true
    }

    /// A Job was deleted; whether it was known.
    pub fn delete_job(&mut self, key: &JobRef) -> bool {
        if self.jobs.remove(key).is_none() {
            return false;
        }
        self.dirty.insert(key.clone());
        true
    }

    /// A watch (re)listed the Jobs of `namespace` (every namespace when `None`): they
    /// replace what was known there. Whether anything changed.
    pub fn replace_jobs(
        &mut self,
        namespace: Option<&str>,
        listed: Vec<(JobRef, JobFacts)>,
    ) -> bool {
        let listed: HashMap<JobRef, JobFacts> = listed.into_iter().collect();
        let gone: Vec<JobRef> = self
            .jobs
            .keys()
            .filter(|k| in_scope(k, namespace) && !listed.contains_key(*k))
            .cloned()
            .collect();
        let mut changed = false;
        for key in gone {
            changed |= self.delete_job(&key);
        }
        for (key, facts) in listed {
            changed |= self.apply_job(key, facts);
        }
        changed
    }

    /// A pod of Job `job` was added or changed; whether its facts changed.
    pub fn apply_pod(&mut self, job: JobRef, pod: String, facts: PodFacts) -> bool {
        let pods = self.pods.entry(job.clone()).or_default();
        match position(pods, &pod) {
            Ok(i) if pods[i].1 == facts => return false,
            Ok(i) => pods[i].1 = facts,
            Err(i) => {
                pods.reserve_exact(1);
                pods.insert(i, (pod, facts));
            }
        }
        self.dirty.insert(job);
        true
    }

    /// A pod of Job `job` was deleted; whether it was known.
    pub fn delete_pod(&mut self, job: &JobRef, pod: &str) -> bool {
        let Some(pods) = self.pods.get_mut(job) else {
            return false;
        };
        let Ok(i) = position(pods, pod) else {
            return false;
        };
        pods.remove(i);
        if pods.is_empty() {
            self.pods.remove(job);
        }
        self.dirty.insert(job.clone());
        true
    }

    /// A watch (re)listed the managed pods of `namespace` (every namespace when `None`):
    /// they replace what was known there. Whether anything changed.
    pub fn replace_pods(
        &mut self,
        namespace: Option<&str>,
        listed: Vec<(JobRef, String, PodFacts)>,
    ) -> bool {
        let mut by_job: HashMap<JobRef, Vec<(String, PodFacts)>> = HashMap::new();
        for (job, pod, facts) in listed {
            by_job.entry(job).or_default().push((pod, facts));
        }
        for pods in by_job.values_mut() {
            pods.sort_by(|a, b| a.0.cmp(&b.0));
            pods.dedup_by(|a, b| a.0 == b.0);
            pods.shrink_to_fit();
        }
        let stale: Vec<JobRef> = self
            .pods
            .keys()
            .filter(|k| in_scope(k, namespace))
            .cloned()
            .collect();
        let mut changed = false;
        for job in stale {
            let now = by_job.remove(&job).unwrap_or_default();
            if self.pods.get(&job) != Some(&now) {
                changed = true;
                self.dirty.insert(job.clone());
                if now.is_empty() {
                    self.pods.remove(&job);
                } else {
                    self.pods.insert(job, now);
                }
            }
        }
        for (job, pods) in by_job {
            changed = true;
            self.dirty.insert(job.clone());
            self.pods.insert(job, pods);
        }
        changed
    }

    /// The Jobs whose status may have changed since the last call (known or gone).
    pub fn take_dirty(&mut self) -> BTreeSet<JobRef> {
        std::mem::take(&mut self.dirty)
    }

    /// The status of one managed Job, `None` when it does not exist.
    pub fn status(&self, key: &JobRef) -> Option<JobStatus> {
        let job = self.jobs.get(key)?;
        Some(status_of(
            key,
            job,
            self.pods
                .get(key)
                .into_iter()
                .flatten()
                .map(|(_, facts)| facts),
        ))
    }

    /// The status of every managed Job, by namespace and name.
    pub fn statuses(&self) -> Vec<JobStatus> {
        let mut keys: Vec<&JobRef> = self.jobs.keys().collect();
        keys.sort();
        keys.into_iter().filter_map(|k| self.status(k)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::facts::{Outcome, PodPhase};
    use kedge_protocol::JobPhase;

    fn key(ns: &str, name: &str) -> JobRef {
        JobRef {
            namespace: ns.into(),
            name: name.into(),
        }
    }

    fn facts(uid: &str) -> JobFacts {
        JobFacts {
            uid: uid.into(),
            owner: "apps/work".into(),
            created_unix_ms: 1,
            finished: None,
            replaces: None,
            template: None,
        }
    }

    fn pod(uid: &str, phase: PodPhase) -> PodFacts {
        PodFacts {
            job_uid: uid.into(),
            phase,
            true_conditions: vec![],
            waiting_reason: None,
        }
    }

    #[test]
    fn events_mark_only_jobs_whose_facts_changed() {
        let mut index = JobIndex::new(2);
        assert!(!index.complete());
        let a = key("apps", "a");
        assert!(index.apply_job(a.clone(), facts("ua")));
        assert!(!index.apply_job(a.clone(), facts("ua")), "same facts");
        assert_eq!(index.take_dirty(), BTreeSet::from([a.clone()]));
        assert!(index.take_dirty().is_empty());
        // A pod event dirties its Job; the pod decides the phase.
        assert!(index.apply_pod(a.clone(), "a-1".into(), pod("ua", PodPhase::Running)));
        assert!(!index.apply_pod(a.clone(), "a-1".into(), pod("ua", PodPhase::Running)));
        assert_eq!(index.take_dirty(), BTreeSet::from([a.clone()]));
        assert_eq!(index.status(&a).unwrap().phase, JobPhase::Running);
        assert!(index.delete_pod(&a, "a-1"));
        assert!(!index.delete_pod(&a, "a-1"));
        assert_eq!(index.status(&a).unwrap().phase, JobPhase::Pending);
        let done = JobFacts {
            finished: Some((Outcome::Succeeded, Some(5))),
            ..facts("ua")
        };
        assert!(index.apply_job(a.clone(), done));
        assert_eq!(index.status(&a).unwrap().phase, JobPhase::Succeeded);
        assert!(index.delete_job(&a));
        assert!(!index.delete_job(&a));
        assert_eq!(index.status(&a), None);
        assert_eq!(index.take_dirty(), BTreeSet::from([a]));
        index.listed();
        index.listed();
        assert!(index.complete());
    }

    #[test]
    fn a_job_with_several_pods_keeps_each_once_whatever_the_order() {
        let mut index = JobIndex::new(1);
        let a = key("apps", "a");
        index.apply_job(a.clone(), facts("ua"));
        for (name, phase) in [
            ("a-2", PodPhase::Pending),
            ("a-0", PodPhase::Failed),
            ("a-1", PodPhase::Pending),
        ] {
            assert!(index.apply_pod(a.clone(), name.into(), pod("ua", phase)));
        }
        assert!(!index.apply_pod(a.clone(), "a-0".into(), pod("ua", PodPhase::Failed)));
        assert_eq!(index.status(&a).unwrap().phase, JobPhase::Pending);
        assert!(index.apply_pod(a.clone(), "a-1".into(), pod("ua", PodPhase::Running)));
        assert_eq!(index.status(&a).unwrap().phase, JobPhase::Running);
        assert!(index.delete_pod(&a, "a-1"));
        assert!(!index.delete_pod(&a, "a-1"));
        assert_eq!(index.status(&a).unwrap().phase, JobPhase::Pending);
        // A relist in another order is no change.
        index.take_dirty();
        assert!(!index.replace_pods(
            None,
            vec![
                (a.clone(), "a-2".into(), pod("ua", PodPhase::Pending)),
                (a.clone(), "a-0".into(), pod("ua", PodPhase::Failed)),
            ]
        ));
        assert!(index.take_dirty().is_empty());
        let sets = &index.status(&a).unwrap().true_pod_conditions;
        assert_eq!(sets.iter().map(|s| s.pods).sum::<u32>(), 2, "{sets:?}");
    }

    #[test]
    fn a_relist_replaces_only_its_namespace() {
        let mut index = JobIndex::new(1);
        let (a, b, c) = (key("apps", "a"), key("apps", "b"), key("batch", "c"));
        for (k, uid) in [(&a, "ua"), (&b, "ub"), (&c, "uc")] {
            index.apply_job(k.clone(), facts(uid));
            index.apply_pod(k.clone(), "p".into(), pod(uid, PodPhase::Running));
        }
        index.take_dirty();
        // apps is relisted: a unchanged, b gone, d new; batch is untouched.
        let d = key("apps", "d");
        assert!(index.replace_jobs(
            Some("apps"),
            vec![(a.clone(), facts("ua")), (d.clone(), facts("ud"))]
        ));
        assert_eq!(index.take_dirty(), BTreeSet::from([b.clone(), d.clone()]));
        assert_eq!(index.len(), 3);
        assert!(!index.replace_jobs(
            Some("apps"),
            vec![(a.clone(), facts("ua")), (d.clone(), facts("ud"))]
        ));
        // Pods relisted in apps: a's pod now pending, d gets one; c's pod stays.
        assert!(index.replace_pods(
            Some("apps"),
            vec![
                (a.clone(), "p".into(), pod("ua", PodPhase::Pending)),
                (d.clone(), "p".into(), pod("ud", PodPhase::Running)),
            ]
        ));
        assert_eq!(
            index.take_dirty(),
            BTreeSet::from([a.clone(), b, d.clone()])
        );
        assert_eq!(index.status(&a).unwrap().phase, JobPhase::Pending);
        assert_eq!(index.status(&d).unwrap().phase, JobPhase::Running);
        assert_eq!(index.status(&c).unwrap().phase, JobPhase::Running);
        // Every namespace relisted empty: everything goes.
        assert!(index.replace_jobs(None, vec![]));
        assert!(index.replace_pods(None, vec![]));
        assert!(index.is_empty() && index.statuses().is_empty());
        assert_eq!(index.take_dirty(), BTreeSet::from([a, c, d]));
    }
}
