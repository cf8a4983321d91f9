//! [`DsjState`] to and from `status.scheduling` of a DSJ: the hub writes what one poll leaves
//! and reads it back on the next, so a hub restart loses no taint, forgets no stuck Job and
//! reuses no Job name.

use std::collections::BTreeMap;
use std::time::SystemTime;

use super::schedule::WrrState;
use super::step::DsjState;
use super::taint::{Taint, TaintBook, TaintLevel, TaintPolicy, TaintScope};
use crate::crd::dsj::{DsjScheduling, TaintRecord};
use crate::time::{from_time, to_time};
use crate::validate::DsjSettings;

/// The taints a DSJ saved in `status.scheduling`, following `policy`. Records that are
/// inconsistent (a negative size) are dropped rather than trusted.
pub fn saved_taints(
    saved: &DsjScheduling,
    policy: TaintPolicy,
) -> impl Iterator<Item = ((String, TaintScope), Taint)> + '_ {
    saved.taints.iter().filter_map(move |r| {
        let scope = match &r.class {
            None => TaintScope::Cluster,
            Some(class) => TaintScope::Workload {
                class: class.clone(),
                size: u32::try_from(r.size.unwrap_or(0)).ok()?,
                priority: r.priority.unwrap_or(0),
            },
        };
        let taint = Taint {
            policy,
            soft_until: r.soft_until.as_ref().map(from_time),
            hard_until: r.hard_until.as_ref().map(from_time),
        };
        Some(((r.member.clone(), scope), taint))
    })
}

impl DsjState {
    /// The state saved in `status.scheduling`, under the current spec's rules. Taints whose
    /// record is inconsistent (a negative size) are dropped rather than trusted.
    pub fn from_status(settings: &DsjSettings, saved: &DsjScheduling) -> DsjState {
        let mut taints = TaintBook::new(settings);
        taints.taints = saved_taints(saved, TaintPolicy::new(settings)).collect();
        DsjState {
            taints,
            wrr: WrrState {
                current: saved.round_robin.clone(),
            },
            stuck: saved.stuck_jobs.iter().cloned().collect(),
        }
    }

    /// What to save in `status.scheduling`.
    pub fn to_status(&self, next_job_index: i64) -> DsjScheduling {
        DsjScheduling {
            taints: self
                .taints
                .taints
                .iter()
                .map(|((member, scope), t)| {
                    let (class, size, priority) = match scope {
                        TaintScope::Cluster => (None, None, None),
                        TaintScope::Workload {
                            class,
                            size,
                            priority,
                        } => (Some(class.clone()), Some(i64::from(*size)), Some(*priority)),
                    };
                    TaintRecord {
                        member: member.clone(),
                        class,
                        size,
                        priority,
                        soft_until: t.soft_until.map(to_time),
                        hard_until: t.hard_until.map(to_time),
                    }
                })
                .collect(),
            round_robin: self.wrr.current.clone(),
            stuck_jobs: self.stuck.iter().cloned().collect(),
            next_job_index,
            member_jobs: BTreeMap::new(),
        }
    }

    /// What the hard taints of `member` in force at `now` that apply to this DSJ (its own and
    /// those shared by others) cover: `cluster`, or
    /// `CLASS>=SIZE@PRIORITY`.
    pub fn hard_taint_scopes(
        &self,
        settings: &DsjSettings,
        member: &str,
        now: SystemTime,
    ) -> Vec<String> {
        let priority = super::step::priority(settings, member);
        let mut scopes: Vec<String> = self
            .taints
            .applying(member, priority, &settings.cluster_strategy)
            .filter(|(_, t)| t.level(now) == TaintLevel::Hard)
            .map(|(scope, _)| match scope {
                TaintScope::Cluster => "cluster".to_owned(),
                TaintScope::Workload {
                    class,
                    size,
                    priority,
                } => format!("{class}>={size}@{priority}"),
            })
            .collect();
        scopes.sort();
        scopes.dedup();
        scopes
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::crd::DistributedScaledJobSpec;
    use crate::dsj::step::{create_failed, taint_level};
    use crate::validate;

    fn settings(extra: &str) -> DsjSettings {
        let yaml = format!(
            "memberClusters:\n- {{name: a, scheduling: {{priority: 1}}}}\n\
             scaledJobSpec:\n  jobTargetRef:\n    template:\n      spec:\n        \
             containers: [{{name: c, image: busybox}}]\n  triggers:\n  - {{type: rabbitmq, name: q}}\n{extra}"
        );
        let spec: DistributedScaledJobSpec = serde_yaml::from_str(&yaml).unwrap();
        validate::dsj(&spec, &BTreeMap::new()).unwrap()
    }

    #[test]
    fn state_survives_a_round_trip_through_status() {
        let s = settings("");
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut state = DsjState::default();
        create_failed(&s, &mut state, "a", now);
        create_failed(&s, &mut state, "a", now);
        state.stuck.insert("job-1".into());
        state.wrr.current.insert("a".into(), 3);
        let saved = state.to_status(42);
        assert_eq!(saved.next_job_index, 42);
        // Through JSON, as it is stored.
        let saved: DsjScheduling =
            serde_json::from_value(serde_json::to_value(&saved).unwrap()).unwrap();
        let back = DsjState::from_status(&s, &saved);
        assert_eq!(back.stuck, state.stuck);
        assert_eq!(back.wrr, state.wrr);
        assert_eq!(taint_level(&s, &back, "a", now), TaintLevel::Hard);
        assert_eq!(back.hard_taint_scopes(&s, "a", now), ["cluster"]);
        // Whole seconds are what the API server keeps; the level does not depend on more.
        let later = now + Duration::from_secs(301);
        assert_eq!(taint_level(&s, &back, "a", later), TaintLevel::None);
    }

    #[test]
    fn workload_taints_keep_their_scope() {
        let s = settings(
            "clusterScheduling:\n  strategy: priorityFailover\n  workloadAffinity: {class: gpu, size: 2}\n",
        );
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut state = DsjState::default();
        state.taints.reconfigure(&s);
        state
            .taints
            .observe("a", Some(1), crate::dsj::taint::TaintEvent::JobStuck, now);
        state
            .taints
            .observe("a", Some(1), crate::dsj::taint::TaintEvent::JobStuck, now);
        let back = DsjState::from_status(&s, &state.to_status(0));
        assert_eq!(back.hard_taint_scopes(&s, "a", now), ["gpu>=2@1"]);
        assert_eq!(taint_level(&s, &back, "a", now), TaintLevel::Hard);
        // A record with a negative size is not trusted.
        let mut bad = state.to_status(0);
        bad.taints[0].size = Some(-1);
        assert!(DsjState::from_status(&s, &bad).taints.taints.is_empty());
    }
}
