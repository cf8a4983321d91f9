//! The Job controller (with the TTL-after-finished controller): pods, completion, failure.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::events::record_event;
use super::{
    JOBS, MAX_CREATES_PER_PASS, PODS, Timers, condition, delete, deleting, name_of, new_pod,
    ns_name, phase, pod_ready, set_status, snapshot, strip_zero, terminal, uid_of,
};
use crate::cluster::{ANN_OUTCOME, ANN_RUN_SECONDS, SimConfig};
use crate::store::{Obj, Store, owner_uids};
use crate::util::{get_path, meta_mut, parse_rfc3339, rfc3339};

/// `objs` by the uid of each of their owners: one pass instead of one per owner, so that a
/// cluster with thousands of Jobs and pods is not quadratic.
fn by_owner(objs: &[Obj]) -> HashMap<&str, Vec<&Obj>> {
    let mut owned: HashMap<&str, Vec<&Obj>> = HashMap::new();
    for o in objs {
        for uid in owner_uids(o) {
            owned.entry(uid).or_default().push(o);
        }
    }
    owned
}

fn job_finished(j: &Value) -> bool {
    get_path(j, "status.conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                matches!(
                    c.get("type").and_then(Value::as_str),
                    Some("Complete" | "Failed")
                ) && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
}

pub(super) fn jobs(store: &mut Store, _cfg: &SimConfig, now: i64, timers: &mut Timers) {
    let pods = snapshot(store, PODS);
    let pods_by_job = by_owner(&pods);
    for j in snapshot(store, JOBS) {
        if deleting(&j) {
            continue;
        }
        let old = j.get("status").cloned().unwrap_or(json!({}));
        if job_finished(&j) {
            // ttlSecondsAfterFinished: the TTL controller deletes finished Jobs.
            if let (Some(ttl), Some(done)) = (
                get_path(&j, "spec.ttlSecondsAfterFinished").and_then(Value::as_i64),
                old.get("completionTime")
                    .or_else(|| {
                        old.get("conditions")
                            .and_then(Value::as_array)
                            .and_then(|cs| cs.last())
                            .and_then(|c| c.get("lastTransitionTime"))
                    })
                    .and_then(Value::as_str)
                    .and_then(parse_rfc3339),
            ) {
                let at = done.saturating_add(ttl.saturating_mul(1000));
                if now >= at {
                    delete(store, JOBS, &ns_name(&j), &name_of(&j), now);
                } else {
                    timers.at(at);
                }
            }
            continue;
        }
        let uid = uid_of(&j);
        let mine: Vec<&Obj> = pods_by_job.get(uid.as_str()).cloned().unwrap_or_default();
        let succeeded = mine.iter().filter(|p| phase(p) == "Succeeded").count() as i64;
        let failed = mine.iter().filter(|p| phase(p) == "Failed").count() as i64;
        let active: Vec<&&Obj> = mine
            .iter()
            .filter(|p| !terminal(p) && !deleting(p))
            .collect();
        let ready = active.iter().filter(|p| pod_ready(p)).count() as i64;
        let completions = get_path(&j, "spec.completions")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let parallelism = get_path(&j, "spec.parallelism")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let backoff = get_path(&j, "spec.backoffLimit")
            .and_then(Value::as_i64)
            .unwrap_or(6);
        let suspended = get_path(&j, "spec.suspend").and_then(Value::as_bool) == Some(true);
        let start = old
            .get("startTime")
            .and_then(Value::as_str)
            .map(str::to_string);
        let mut status = old.clone();
        if !status.is_object() {
            status = json!({});
        }
        let mut conditions: Vec<Value> = old
            .get("conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let deadline_hit = match (
            get_path(&j, "spec.activeDeadlineSeconds").and_then(Value::as_i64),
            start.as_deref().and_then(parse_rfc3339),
        ) {
            (Some(d), Some(s)) => {
                timers.at(s + d * 1000);
                now >= s + d * 1000
            }
            _ => false,
        };
        let fail_reason = if failed > backoff {
            Some((
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            ))
        } else if deadline_hit {
            Some((
                "DeadlineExceeded",
                "Job was active longer than specified deadline",
            ))
        } else {
            None
        };
        if let Some((reason, msg)) = fail_reason {
            for p in &active {
                delete(store, PODS, &ns_name(p), &name_of(p), now);
            }
            conditions.push(condition("FailureTarget", true, reason, msg, now, None));
            conditions.push(condition("Failed", true, reason, msg, now, None));
            record_event(store, &j, true, reason, msg, "job-controller", now);
            strip_update_time(&mut conditions);
            status["conditions"] = json!(conditions);
            status["active"] = json!(0);
            status["failed"] = json!(failed);
            status["ready"] = json!(0);
        } else if succeeded >= completions {
            conditions.push(condition(
                "SuccessCriteriaMet",
                true,
                "CompletionsReached",
                "Reached expected number of succeeded pods",
                now,
                None,
            ));
            conditions.push(condition(
                "Complete",
                true,
                "CompletionsReached",
                "Reached expected number of succeeded pods",
                now,
                None,
            ));
            strip_update_time(&mut conditions);
            record_event(
                store,
                &j,
                false,
                "Completed",
                "Job completed",
                "job-controller",
                now,
            );
            status["conditions"] = json!(conditions);
            status["completionTime"] = json!(rfc3339(now));
            status["active"] = json!(0);
            status["succeeded"] = json!(succeeded);
            status["ready"] = json!(0);
        } else if !suspended {
            if start.is_none() {
                status["startTime"] = json!(rfc3339(now));
            }
            let want = parallelism.min(completions - succeeded).max(0) - active.len() as i64;
            let template = get_path(&j, "spec.template").cloned().unwrap_or(json!({}));
            let job_ann = get_path(&j, "metadata.annotations")
                .cloned()
                .unwrap_or(json!({}));
            for _ in 0..want.clamp(0, MAX_CREATES_PER_PASS as i64) {
                let name = format!("{}-{}", name_of(&j), crate::util::name_suffix(5));
                let mut pod = new_pod("Job", "batch/v1", &j, &template, name.clone(), &[]);
                for k in [ANN_RUN_SECONDS, ANN_OUTCOME] {
                    if let Some(v) = job_ann.get(k)
                        && get_path(&pod, &format!("metadata.annotations.{k}")).is_none()
                    {
                        let meta = meta_mut(&mut pod);
                        let anns = meta.entry("annotations").or_insert(json!({}));
                        anns[k] = v.clone();
                    }
                }
                if store.create_internal(PODS, pod, now).is_ok() {
                    let msg = format!("Created pod: {name}");
                    record_event(
                        store,
                        &j,
                        false,
                        "SuccessfulCreate",
                        &msg,
                        "job-controller",
                        now,
                    );
                }
            }
            status["active"] =
                json!(active.len() as i64 + want.clamp(0, MAX_CREATES_PER_PASS as i64));
            status["succeeded"] = json!(succeeded);
            status["failed"] = json!(failed);
            status["ready"] = json!(ready);
            status["terminating"] = json!(0);
            status["uncountedTerminatedPods"] = json!({});
        }
        strip_zero(&mut status, &["active", "succeeded", "failed"]);
        set_status(store, JOBS, &j, status, now);
    }
}

fn strip_update_time(conds: &mut [Value]) {
    for c in conds {
        if let Some(m) = c.as_object_mut() {
            m.insert(
                "lastProbeTime".into(),
                m.get("lastTransitionTime").cloned().unwrap_or(Value::Null),
            );
            m.remove("lastUpdateTime");
        }
    }
}
