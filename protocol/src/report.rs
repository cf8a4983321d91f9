//! Keeping reports within the wire's limits: bounded text, and reports split across frames.

use serde::Serialize;

use crate::{MAX_TEXT_BYTES, StatusReport};

/// Bytes kept free in each part for what a part's size estimate leaves out: the message's
/// variant tag and the growth of the lists' varint length prefixes.
const SPLIT_SLACK: usize = 64;

/// `text` cut to at most [`MAX_TEXT_BYTES`] bytes, at a character boundary: every string read
/// from a member cluster goes through this before it goes on the wire.
pub fn bounded_text(text: &str) -> String {
    if text.len() <= MAX_TEXT_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_TEXT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

fn encoded_len<T: Serialize + ?Sized>(value: &T) -> usize {
    // Serializing into a counter cannot fail for these types; an error counts as too large.
    postcard::serialize_with_flavor(value, postcard::ser_flavors::Size::default())
        .unwrap_or(usize::MAX)
}

impl StatusReport {
    /// This report as one or more parts whose frames hold at most `max_bytes` each. The first
    /// part carries `full`, the workloads and the capacity; the Jobs and removed Jobs are
    /// spread over the parts in order; every part but the last has `more` set, and the last
    /// keeps this report's `more`. A single entry larger than a part goes alone.
    pub fn split(self, max_bytes: usize) -> Vec<StatusReport> {
        let budget = max_bytes.saturating_sub(SPLIT_SLACK);
        if encoded_len(&self) <= budget {
            return vec![self];
        }
        let StatusReport {
            full,
            more,
            workloads,
            jobs,
            removed_jobs,
            capacity,
        } = self;
        let mut parts = Vec::new();
        let mut part = StatusReport {
            full,
            more: true,
            workloads,
            capacity,
            ..StatusReport::default()
        };
        let empty = |part: &StatusReport| part.jobs.is_empty() && part.removed_jobs.is_empty();
        let mut size = encoded_len(&part);
        for job in jobs {
            let n = encoded_len(&job);
            if size.saturating_add(n) > budget && !empty(&part) {
                parts.push(std::mem::replace(&mut part, continuation()));
                size = encoded_len(&part);
            }
            size = size.saturating_add(n);
            part.jobs.push(job);
        }
        for job in removed_jobs {
            let n = encoded_len(&job);
            if size.saturating_add(n) > budget && !empty(&part) {
                parts.push(std::mem::replace(&mut part, continuation()));
                size = encoded_len(&part);
            }
            size = size.saturating_add(n);
            part.removed_jobs.push(job);
        }
        part.more = more;
        parts.push(part);
        parts
    }
}

fn continuation() -> StatusReport {
    StatusReport {
        more: true,
        ..StatusReport::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        AgentMessage, ClusterCapacity, JobPhase, JobRef, JobStatus, PodConditionSet, encode,
    };

    fn job(i: usize) -> JobStatus {
        JobStatus {
            namespace: "apps".into(),
            name: format!("work-{i:05}"),
            owner: "apps/work".into(),
            phase: JobPhase::Pending,
            created_unix_ms: 1_767_225_600_000 + i as i64,
            any_pod_running_or_completed: false,
            true_pod_conditions: vec![PodConditionSet {
                true_conditions: vec!["PodScheduled".into()],
                pods: 1,
            }],
            pending_reason: Some("Unschedulable".into()),
            failure_reason: None,
            finished_unix_ms: None,
            replaces: Some(format!("work-{:05}", i + 1)),
            template: None,
        }
    }

    #[test]
    fn text_is_cut_at_a_character_boundary() {
        assert_eq!(bounded_text("Unschedulable"), "Unschedulable");
        let long = "é".repeat(MAX_TEXT_BYTES);
        let cut = bounded_text(&long);
        assert!(cut.len() <= MAX_TEXT_BYTES && cut.len() >= MAX_TEXT_BYTES - 1);
        assert!(cut.chars().all(|c| c == 'é'));
    }

    #[test]
    fn a_small_report_is_one_part() {
        let report = StatusReport {
            full: true,
            jobs: vec![job(1)],
            ..StatusReport::default()
        };
        assert_eq!(report.clone().split(4096), vec![report]);
    }

    #[test]
    fn a_large_report_is_split_into_frames_that_fit_and_keep_every_entry() {
        let jobs: Vec<JobStatus> = (0..1000).map(job).collect();
        let removed: Vec<JobRef> = (0..300)
            .map(|i| JobRef {
                namespace: "apps".into(),
                name: format!("old-{i}"),
            })
            .collect();
        let capacity = ClusterCapacity {
            nodes: 3,
            ..ClusterCapacity::default()
        };
        let max = 4096;
        for (full, more) in [(true, false), (false, false), (true, true)] {
            let report = StatusReport {
                full,
                more,
                workloads: vec![],
                jobs: jobs.clone(),
                removed_jobs: removed.clone(),
                capacity: Some(capacity),
            };
            let whole = postcard::to_stdvec(&report).unwrap().len();
            let parts = report.split(max);
            // Parts are filled, not one entry each.
            let least = whole.div_ceil(max);
            assert!(
                (least..=2 * least).contains(&parts.len()),
                "{} parts for {whole} bytes",
                parts.len()
            );
            for (i, part) in parts.iter().enumerate() {
                let frame = encode(&AgentMessage::Report(part.clone())).unwrap();
                assert!(frame.len() <= max, "part {i}: {} bytes", frame.len());
                assert_eq!(part.full, full && i == 0, "part {i}");
                assert_eq!(part.capacity.is_some(), i == 0, "part {i}");
                let last = i == parts.len() - 1;
                assert_eq!(part.more, if last { more } else { true }, "part {i}");
            }
            let all: Vec<JobStatus> = parts.iter().flat_map(|p| p.jobs.clone()).collect();
            assert_eq!(all, jobs);
            let gone: Vec<JobRef> = parts.iter().flat_map(|p| p.removed_jobs.clone()).collect();
            assert_eq!(gone, removed);
        }
    }
}
