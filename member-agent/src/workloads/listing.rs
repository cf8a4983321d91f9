//! What one watch keeps, and a workload's status from what the watches of its kind and
//! namespace keep. No I/O: the watch tasks feed listings, the report loop reads them, behind
//! locks never held across an await.

use kedge_protocol::{Failure, WorkloadRef, WorkloadStatus};

use super::facts::{PendingPod, Target, WorkloadFacts};

/// Compact facts of the objects one watch follows, by name, and whether it has listed them
/// (or found it cannot).
#[derive(Debug)]
pub struct Listing<F> {
    /// Sorted by name: a vector, as a watch follows a few objects or a few dozen.
    entries: Vec<(String, F)>,
    listed: bool,
    failure: Option<Failure>,
}

impl<F> Default for Listing<F> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            listed: false,
            failure: None,
        }
    }
}

impl<F: PartialEq> Listing<F> {
    /// An object was added or changed: `Some` facts keep it, `None` forgets it (it left
    /// what the watch keeps). Whether anything changed.
    pub fn put(&mut self, name: String, facts: Option<F>) -> bool {
        let at = self.entries.binary_search_by(|(n, _)| n.cmp(&name));
        match (at, facts) {
            (Ok(i), Some(facts)) if self.entries[i].1 == facts => false,
            (Ok(i), Some(facts)) => {
                self.entries[i].1 = facts;
                true
            }
            (Err(i), Some(facts)) => {
                self.entries.insert(i, (name, facts));
                true
            }
            (Ok(i), None) => {
                self.entries.remove(i);
                true
            }
            (Err(_), None) => false,
        }
    }

    /// The watch (re)listed: `listed` replaces everything, and clears a failure. Whether
    /// anything changed (the first list always does).
    pub fn replace(&mut self, mut listed: Vec<(String, F)>) -> bool {
        listed.sort_by(|a, b| a.0.cmp(&b.0));
        listed.dedup_by(|a, b| a.0 == b.0);
        let changed = !self.listed || self.failure.is_some() || listed != self.entries;
        self.entries = listed;
        self.entries.shrink_to_fit();
        self.listed = true;
        self.failure = None;
        changed
    }

    /// The watch cannot list or watch, for a reason that will not pass by retrying soon
    /// (RBAC, a kind not served). Whether that is news.
    pub fn fail(&mut self, failure: Failure) -> bool {
        let changed = self.failure.as_ref() != Some(&failure);
        self.failure = Some(failure);
        changed
    }

    /// Whether the watch has listed once or failed: only then does it say anything.
    pub fn settled(&self) -> bool {
        self.listed || self.failure.is_some()
    }

    /// Why the watch fails, if it does.
    pub fn failure(&self) -> Option<&Failure> {
        self.failure.as_ref()
    }

    /// The facts of `name`, if kept.
    pub fn get(&self, name: &str) -> Option<&F> {
        self.entries
            .binary_search_by(|(n, _)| n.as_str().cmp(name))
            .ok()
            .map(|i| &self.entries[i].1)
    }

    /// Every object kept, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &F)> {
        self.entries.iter().map(|(n, f)| (n.as_str(), f))
    }
}

/// What the watches of one workload's kind and namespace know.
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    /// The workloads of its kind in its namespace.
    pub workloads: &'a Listing<WorkloadFacts>,
    /// Pending pods of its namespace.
    pub pods: &'a Listing<PendingPod>,
    /// KEDA ScaledObjects of its namespace.
    pub scaled_objects: &'a Listing<Target>,
    /// HorizontalPodAutoscalers of its namespace.
    pub hpas: &'a Listing<Target>,
}

/// The status of `workload` from what the watches know, at `now_unix_ms`; `None` until they
/// have all listed (a workload's counts without its pods, or an autoscaler not seen yet,
/// would be reported or restored wrongly). A workload the agent cannot watch, or whose pods
/// it cannot watch, is reported absent with the reason; autoscalers it cannot see count as
/// none (KEDA may not be installed).
pub fn status_of(
    workload: &WorkloadRef,
    seen: Seen<'_>,
    now_unix_ms: i64,
) -> Option<WorkloadStatus> {
    let Seen {
        workloads,
        pods,
        scaled_objects,
        hpas,
    } = seen;
    if !(workloads.settled() && pods.settled() && scaled_objects.settled() && hpas.settled()) {
        return None;
    }
    let absent = WorkloadStatus::absent(workload.clone());
    if let Some(failure) = workloads.failure().or(pods.failure()) {
        return Some(WorkloadStatus {
            failure: Some(failure.clone()),
            ..absent
        });
    }
    let Some(facts) = workloads.get(&workload.name) else {
        return Some(absent);
    };
    let mut status = WorkloadStatus {
        exists: true,
        spec_replicas: facts.spec_replicas,
        ready_replicas: facts.ready_replicas,
        available_replicas: facts.available_replicas,
        pod_cpu_millis: facts.pod_cpu_millis,
        pod_memory_bytes: facts.pod_memory_bytes,
        ..absent
    };
    if let Some(selector) = &facts.selector {
        let mut oldest: Option<i64> = None;
        for (_, pod) in pods.iter().filter(|(_, p)| selector.matches(&p.labels)) {
            status.pending_pods += 1;
            if let Some(since) = pod.unschedulable_since {
                status.unschedulable_pods += 1;
                oldest = Some(oldest.map_or(since, |o| o.min(since)));
            }
        }
        status.unschedulable_for_ms = oldest.map_or(0, |since| {
            u64::try_from(now_unix_ms.saturating_sub(since)).unwrap_or(0)
        });
    }
    let ns = &workload.namespace;
    let targets = |listing: &Listing<Target>, what: &str| {
        listing
            .iter()
            .find(|(_, t)| t.kind == workload.kind && t.name == workload.name)
            .map(|(name, _)| format!("{what} {ns}/{name}"))
    };
    status.conflict = targets(scaled_objects, "KEDA ScaledObject")
        .or_else(|| targets(hpas, "HorizontalPodAutoscaler"));
    Some(status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::facts::Selector;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use kedge_protocol::{FailureCode, Retry};

    fn web() -> WorkloadRef {
        WorkloadRef::deployment("apps", "web")
    }

    fn facts(replicas: i32, app: &str) -> WorkloadFacts {
        let selector: LabelSelector =
            serde_json::from_value(serde_json::json!({"matchLabels": {"app": app}})).unwrap();
        WorkloadFacts {
            spec_replicas: replicas,
            ready_replicas: 1,
            available_replicas: 1,
            pod_cpu_millis: 100,
            pod_memory_bytes: 64,
            selector: Selector::of(&selector),
        }
    }

    fn pending(app: &str, since: Option<i64>) -> PendingPod {
        PendingPod {
            labels: vec![("app".into(), app.into())],
            unschedulable_since: since,
        }
    }

    fn listed<F: PartialEq>(entries: Vec<(&str, F)>) -> Listing<F> {
        let mut l = Listing::default();
        l.replace(
            entries
                .into_iter()
                .map(|(n, f)| (n.to_owned(), f))
                .collect(),
        );
        l
    }

    fn forbidden() -> Failure {
        Failure {
            retry: Retry::Permanent,
            code: FailureCode::Forbidden,
            message: "watching: forbidden".into(),
        }
    }

    #[test]
    fn listings_keep_facts_by_name_and_say_what_changed() {
        let mut l: Listing<i32> = Listing::default();
        assert!(!l.settled());
        assert!(
            l.replace(vec![("b".into(), 2), ("a".into(), 1)]),
            "the first list"
        );
        assert!(l.settled());
        assert!(
            !l.replace(vec![("a".into(), 1), ("b".into(), 2)]),
            "the same again"
        );
        assert!(l.put("c".into(), Some(3)));
        assert!(!l.put("c".into(), Some(3)));
        assert!(l.put("c".into(), Some(4)));
        assert!(l.put("a".into(), None));
        assert!(!l.put("a".into(), None));
        assert_eq!(l.iter().collect::<Vec<_>>(), [("b", &2), ("c", &4)]);
        assert!(l.fail(forbidden()));
        assert!(!l.fail(forbidden()));
        assert!(
            l.replace(vec![("b".into(), 2), ("c".into(), 4)]),
            "a failure cleared"
        );
        assert_eq!(l.failure(), None);
        // An unsettled listing that fails is settled: it says why.
        let mut l: Listing<i32> = Listing::default();
        l.fail(forbidden());
        assert!(l.settled());
    }

    #[test]
    fn a_status_comes_from_the_workload_its_pending_pods_and_autoscalers() {
        let workloads = listed(vec![("web", facts(3, "web")), ("api", facts(2, "api"))]);
        let pods = listed(vec![
            ("web-1", pending("web", Some(10_000))),
            ("web-2", pending("web", Some(4_000))),
            ("web-3", pending("web", None)),
            ("api-1", pending("api", Some(1_000))),
        ]);
        let none = listed::<Target>(vec![]);
        let seen = Seen {
            workloads: &workloads,
            pods: &pods,
            scaled_objects: &none,
            hpas: &none,
        };
        let status = status_of(&web(), seen, 14_000).unwrap();
        assert!(status.exists && status.failure.is_none() && status.conflict.is_none());
        assert_eq!(
            (
                status.spec_replicas,
                status.ready_replicas,
                status.pod_cpu_millis
            ),
            (3, 1, 100)
        );
        assert_eq!((status.pending_pods, status.unschedulable_pods), (3, 2));
        assert_eq!(status.unschedulable_for_ms, 10_000);

        // Autoscalers targeting it, by kind and name; a ScaledObject named first.
        let hpas = listed(vec![
            (
                "other",
                Target {
                    kind: "StatefulSet".into(),
                    name: "web".into(),
                },
            ),
            (
                "web-hpa",
                Target {
                    kind: "Deployment".into(),
                    name: "web".into(),
                },
            ),
        ]);
        let seen_hpa = Seen {
            hpas: &hpas,
            ..seen
        };
        assert_eq!(
            status_of(&web(), seen_hpa, 0).unwrap().conflict.as_deref(),
            Some("HorizontalPodAutoscaler apps/web-hpa")
        );
        let sos = listed(vec![(
            "s",
            Target {
                kind: "Deployment".into(),
                name: "web".into(),
            },
        )]);
        let both = Seen {
            scaled_objects: &sos,
            ..seen_hpa
        };
        assert_eq!(
            status_of(&web(), both, 0).unwrap().conflict.as_deref(),
            Some("KEDA ScaledObject apps/s")
        );

        // Missing: absent, no failure.
        let only_api = listed(vec![("api", facts(2, "api"))]);
        let gone = status_of(
            &web(),
            Seen {
                workloads: &only_api,
                ..seen
            },
            0,
        )
        .unwrap();
        assert!(!gone.exists && gone.failure.is_none());
    }

    #[test]
    fn nothing_is_said_until_every_watch_listed_and_failures_are_reported() {
        let workloads = listed(vec![("web", facts(3, "web"))]);
        let pods = listed::<PendingPod>(vec![]);
        let none = listed::<Target>(vec![]);
        let unlisted = Listing::<Target>::default();
        let seen = Seen {
            workloads: &workloads,
            pods: &pods,
            scaled_objects: &none,
            hpas: &none,
        };
        assert!(
            status_of(
                &web(),
                Seen {
                    hpas: &unlisted,
                    ..seen
                },
                0
            )
            .is_none()
        );
        // KEDA not installed: no ScaledObjects, no failure.
        let mut no_keda = Listing::<Target>::default();
        no_keda.fail(Failure {
            retry: Retry::Permanent,
            code: FailureCode::NotFound,
            message: "not found".into(),
        });
        let status = status_of(
            &web(),
            Seen {
                scaled_objects: &no_keda,
                ..seen
            },
            0,
        )
        .unwrap();
        assert!(status.exists && status.failure.is_none());
        // Pods or the workload forbidden: absent, with the reason.
        let mut denied = Listing::<PendingPod>::default();
        denied.fail(forbidden());
        let status = status_of(
            &web(),
            Seen {
                pods: &denied,
                ..seen
            },
            0,
        )
        .unwrap();
        assert!(!status.exists);
        assert_eq!(status.failure, Some(forbidden()));
        let mut denied = listed(vec![("web", facts(3, "web"))]);
        denied.fail(forbidden());
        let status = status_of(
            &web(),
            Seen {
                workloads: &denied,
                ..seen
            },
            0,
        )
        .unwrap();
        assert_eq!(status.failure, Some(forbidden()));
    }
}
