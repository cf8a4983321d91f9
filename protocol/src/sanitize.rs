//! Making agent-supplied text safe to show: every string an agent sends may end up in
//! Kubernetes status, Events, log lines or `kubectl kedge sessions`, so the hub cuts it to a
//! documented length and strips control characters before any of them sees it.
//!
//! [`clean_text`] is the one function that does it; [`AgentMessage::sanitized`] applies it to
//! every string of a message with the limit that suits the field.

use crate::{
    Ack, AgentMessage, CommandResult, CommandTarget, Failure, Hello, JobRef, JobStatus,
    MAX_SAMPLE_PODS, MAX_SCRAPE_TARGETS, MAX_TEXT_BYTES, PodConditionSet, PodMetricsReport,
    PodMetricsSample, StatusReport, WorkloadRef, WorkloadStatus,
};

/// Whether `name` is an RFC 1123 DNS label (at most 63 lower-case letters, digits and '-',
/// starting and ending with a letter or digit): what a member, and so a MemberCluster, may
/// be named.
pub fn is_dns1123_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Longest Kubernetes reference an agent may send (a namespace, name, kind, apiVersion, or a
/// `namespace/name` pair): every valid one fits (63 + 1 + 253 bytes), so cleaning never
/// changes a reference the hub itself handed out.
pub const MAX_REF_BYTES: usize = 320;

/// Longest free-text message an agent may send (a failure message, the description of who
/// else scales a workload). Kubernetes Events hold at most 1 KiB of message.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// Marks text that was cut.
const ELLIPSIS: char = '…';

/// Characters that reorder or hide text on a terminal or web page without being control
/// characters (Unicode bidirectional formatting, as in "Trojan Source").
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Whether `c` must not reach a status, log line or terminal as it is.
fn is_unsafe(c: char) -> bool {
    c.is_control() || is_bidi_control(c) || matches!(c, '\u{2028}' | '\u{2029}')
}

/// What an unsafe character becomes: a line break or tab a space, anything else nothing.
fn replacement(c: char) -> Option<char> {
    if !is_unsafe(c) {
        Some(c)
    } else if c.is_whitespace() {
        Some(' ')
    } else {
        None
    }
}

/// `text` made safe to show: whitespace control characters (tab, newline, carriage return,
/// line and paragraph separators, …) become a space, other control characters (C0, DEL, C1) and bidirectional formatting
/// characters are dropped, and the result is cut to at most `max_bytes` bytes at a
/// character boundary, ending in `…` when something was cut (if `max_bytes` leaves room
/// for it). Text that is already clean and short enough is returned unchanged.
///
/// Pure; never panics.
pub fn clean_text(text: &str, max_bytes: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_bytes));
    let mut cut = false;
    for c in text.chars().filter_map(replacement) {
        if out.len() + c.len_utf8() > max_bytes {
            cut = true;
            break;
        }
        out.push(c);
    }
    if cut {
        let room = max_bytes.saturating_sub(ELLIPSIS.len_utf8());
        if max_bytes >= ELLIPSIS.len_utf8() {
            while out.len() > room {
                out.pop();
            }
            out.push(ELLIPSIS);
        }
    }
    out
}

fn text(value: &mut String, max_bytes: usize) {
    // Most strings are clean: leave them without reallocating.
    let clean = value.len() <= max_bytes && !value.chars().any(is_unsafe);
    if !clean {
        *value = clean_text(value, max_bytes);
    }
}

fn reference(value: &mut String) {
    text(value, MAX_REF_BYTES);
}

fn workload(w: &mut WorkloadRef) {
    let WorkloadRef {
        api_version,
        kind,
        namespace,
        name,
    } = w;
    for field in [api_version, kind, namespace, name] {
        reference(field);
    }
}

fn failure(f: &mut Failure) {
    let Failure {
        retry: _,
        code: _,
        message,
    } = f;
    text(message, MAX_MESSAGE_BYTES);
}

fn hello(h: &mut Hello) {
    let Hello {
        protocol_version: _,
        agent_version,
        kubernetes_version,
        last_applied_revision: _,
        namespaces,
    } = h;
    text(agent_version, MAX_TEXT_BYTES);
    text(kubernetes_version, MAX_TEXT_BYTES);
    namespaces.iter_mut().for_each(reference);
}

fn ack(a: &mut Ack) {
    let Ack {
        revision: _,
        results,
    } = a;
    for CommandResult { target, failure: f } in results {
        match target {
            CommandTarget::Workload(w) => workload(w),
            CommandTarget::Job(name) => reference(name),
        }
        if let Some(f) = f {
            failure(f);
        }
    }
}

fn workload_status(s: &mut WorkloadStatus) {
    let WorkloadStatus {
        workload: w,
        exists: _,
        spec_replicas: _,
        ready_replicas: _,
        available_replicas: _,
        pending_pods: _,
        unschedulable_pods: _,
        unschedulable_for_ms: _,
        pod_cpu_millis: _,
        pod_memory_bytes: _,
        failure: f,
        conflict,
    } = s;
    workload(w);
    if let Some(f) = f {
        failure(f);
    }
    if let Some(conflict) = conflict {
        text(conflict, MAX_MESSAGE_BYTES);
    }
}

fn job_status(j: &mut JobStatus) {
    let JobStatus {
        namespace,
        name,
        owner,
        phase: _,
        created_unix_ms: _,
        any_pod_running_or_completed: _,
        true_pod_conditions,
        pending_reason,
        failure_reason,
        finished_unix_ms: _,
        replaces,
        template,
    } = j;
    for field in [namespace, name, owner] {
        reference(field);
    }
    for PodConditionSet {
        true_conditions,
        pods: _,
    } in true_pod_conditions
    {
        true_conditions
            .iter_mut()
            .for_each(|c| text(c, MAX_TEXT_BYTES));
    }
    for reason in [pending_reason, failure_reason, template]
        .into_iter()
        .flatten()
    {
        text(reason, MAX_TEXT_BYTES);
    }
    if let Some(replaces) = replaces {
        reference(replaces);
    }
}

fn report(r: &mut StatusReport) {
    let StatusReport {
        full: _,
        more: _,
        workloads,
        jobs,
        removed_jobs,
        capacity: _,
    } = r;
    workloads.iter_mut().for_each(workload_status);
    jobs.iter_mut().for_each(job_status);
    for JobRef { namespace, name } in removed_jobs {
        reference(namespace);
        reference(name);
    }
}

/// A sample's text cleaned, its counts bounded and a sum that is not a finite number turned
/// into what it means: no pod of the member has a usable value.
fn pod_metrics_sample(s: &mut PodMetricsSample) {
    let PodMetricsSample {
        owner,
        trigger: _,
        sum,
        counted,
        missing,
        scraped_unix_ms: _,
        error,
    } = s;
    reference(owner);
    *counted = (*counted).min(MAX_SAMPLE_PODS);
    *missing = (*missing).min(MAX_SAMPLE_PODS - *counted);
    if !sum.is_finite() {
        *missing += *counted;
        *counted = 0;
        *sum = 0.0;
        *error = Some("the agent sent a sum that is not a finite number".to_string());
    }
    if let Some(e) = error {
        text(e, MAX_MESSAGE_BYTES);
    }
}

fn pod_metrics(r: &mut PodMetricsReport) {
    r.samples.truncate(MAX_SCRAPE_TARGETS);
    r.samples.iter_mut().for_each(pod_metrics_sample);
}

impl AgentMessage {
    /// This message with every string cleaned by [`clean_text`]: references (names,
    /// namespaces, kinds, owners) to [`MAX_REF_BYTES`], versions, reasons and condition types
    /// to [`MAX_TEXT_BYTES`], free-text messages to [`MAX_MESSAGE_BYTES`]. The hub applies it
    /// to every message it reads from an agent, before anything else sees the message.
    pub fn sanitized(mut self) -> Self {
        match &mut self {
            AgentMessage::Hello(h) => hello(h),
            AgentMessage::Heartbeat(_) => {}
            // A CSR is bytes the hub parses and never shows; it carries no text.
            AgentMessage::Renew(_) => {}
            AgentMessage::Ack(a) => ack(a),
            AgentMessage::Report(r) => report(r),
            AgentMessage::PodMetrics(r) => pod_metrics(r),
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn control_characters_are_dropped_and_whitespace_ones_become_spaces() {
        assert_eq!(clean_text("v1.2.3", 64), "v1.2.3");
        assert_eq!(clean_text("a\nb\tc\r\n", 64), "a b c  ");
        assert_eq!(clean_text("red\u{1b}[31m\u{7}\u{7f}\u{9b}", 64), "red[31m");
        assert_eq!(clean_text("safe\u{202E}txt.exe", 64), "safetxt.exe");
        assert_eq!(clean_text("", 0), "");
    }

    #[test]
    fn long_text_is_cut_at_a_character_boundary_with_an_ellipsis() {
        assert_eq!(clean_text("abcdef", 6), "abcdef");
        assert_eq!(clean_text("abcdefg", 6), "abc…");
        // "é" is two bytes: the cut never splits one.
        assert_eq!(clean_text("ééééé", 7), "éé…");
        // No room for the ellipsis: cut only.
        assert_eq!(clean_text("abcdef", 2), "ab");
        let long = "x".repeat(10_000);
        assert_eq!(clean_text(&long, MAX_TEXT_BYTES).len(), MAX_TEXT_BYTES);
    }

    const NASTY: &str = "\u{1b}]0;owned\u{7}\nline\u{202E}";
    const CLEAN: &str = "]0;owned line";

    fn nasty_failure() -> Option<Failure> {
        Some(Failure {
            retry: crate::Retry::Permanent,
            code: crate::FailureCode::Other,
            message: NASTY.into(),
        })
    }

    fn reference_of(s: &str) -> WorkloadRef {
        WorkloadRef {
            api_version: s.into(),
            kind: s.into(),
            namespace: s.into(),
            name: s.into(),
        }
    }

    fn report_of(s: &str, f: Option<Failure>) -> StatusReport {
        StatusReport {
            full: true,
            more: false,
            workloads: vec![WorkloadStatus {
                failure: f.clone(),
                conflict: Some(s.into()),
                ..WorkloadStatus::absent(reference_of(s))
            }],
            jobs: vec![JobStatus {
                namespace: s.into(),
                name: s.into(),
                owner: s.into(),
                phase: crate::JobPhase::Pending,
                created_unix_ms: 0,
                any_pod_running_or_completed: false,
                true_pod_conditions: vec![PodConditionSet {
                    true_conditions: vec![s.into()],
                    pods: 1,
                }],
                pending_reason: Some(s.into()),
                failure_reason: Some(s.into()),
                finished_unix_ms: None,
                replaces: Some(s.into()),
                template: Some(s.into()),
            }],
            removed_jobs: vec![JobRef {
                namespace: s.into(),
                name: s.into(),
            }],
            capacity: None,
        }
    }

    fn ack_of(s: &str, f: Option<Failure>) -> Ack {
        Ack {
            revision: 1,
            results: vec![
                CommandResult {
                    target: CommandTarget::Workload(reference_of(s)),
                    failure: f.clone(),
                },
                CommandResult {
                    target: CommandTarget::Job(s.into()),
                    failure: f,
                },
            ],
        }
    }

    fn hello_of(s: &str) -> Hello {
        Hello {
            protocol_version: 3,
            agent_version: s.into(),
            kubernetes_version: s.into(),
            last_applied_revision: 0,
            namespaces: vec![s.into()],
        }
    }

    #[test]
    fn every_string_of_every_agent_message_is_cleaned() {
        let clean_failure = nasty_failure().map(|f| Failure {
            message: CLEAN.into(),
            ..f
        });
        for (nasty, clean) in [
            (
                AgentMessage::Hello(hello_of(NASTY)),
                AgentMessage::Hello(hello_of(CLEAN)),
            ),
            (
                AgentMessage::Ack(ack_of(NASTY, nasty_failure())),
                AgentMessage::Ack(ack_of(CLEAN, clean_failure.clone())),
            ),
            (
                AgentMessage::Report(report_of(NASTY, nasty_failure())),
                AgentMessage::Report(report_of(CLEAN, clean_failure.clone())),
            ),
        ] {
            assert_eq!(nasty.sanitized(), clean);
        }
    }

    #[test]
    fn a_pod_metrics_sample_is_bounded_and_a_sum_that_is_no_number_counts_as_missing() {
        let sample = |sum: f64, counted: u32, missing: u32| PodMetricsSample {
            owner: format!("ns/{}\u{202E}x", "n".repeat(400)),
            trigger: 0,
            sum,
            counted,
            missing,
            scraped_unix_ms: 1,
            error: Some("bad\npod".into()),
        };
        let samples = [
            sample(f64::NAN, 3, 1),
            sample(f64::INFINITY, 2, 0),
            sample(4.5, u32::MAX, u32::MAX),
            sample(-2.0, 2, 1),
        ];
        let mut report = PodMetricsReport {
            samples: std::iter::repeat_n(samples.clone(), MAX_SCRAPE_TARGETS)
                .flatten()
                .collect(),
        };
        pod_metrics(&mut report);
        assert_eq!(report.samples.len(), MAX_SCRAPE_TARGETS);
        let [nan, inf, huge, negative] = &report.samples[..4] else {
            panic!("four samples")
        };
        for s in [nan, inf] {
            assert_eq!((s.sum, s.counted), (0.0, 0));
            assert!(s.error.as_deref().unwrap().contains("not a finite number"));
        }
        assert_eq!(nan.missing, 4);
        assert_eq!(inf.missing, 2);
        assert_eq!((huge.counted, huge.missing), (MAX_SAMPLE_PODS, 0));
        assert_eq!(
            (negative.sum, negative.counted, negative.missing),
            (-2.0, 2, 1)
        );
        assert_eq!(negative.error.as_deref(), Some("bad pod"));
        assert!(negative.owner.len() <= MAX_REF_BYTES && !negative.owner.contains('\u{202E}'));
    }

    #[test]
    fn valid_kubernetes_references_pass_unchanged() {
        let owner = format!("{}/{}", "n".repeat(63), "d".repeat(253));
        let mut job = owner.clone();
        reference(&mut job);
        assert_eq!(job, owner);
        let long = "v".repeat(MAX_TEXT_BYTES * 4);
        let AgentMessage::Hello(hello) = AgentMessage::Hello(hello_of(&long)).sanitized() else {
            unreachable!()
        };
        assert_eq!(hello.agent_version.len(), MAX_TEXT_BYTES);
        assert!(hello.agent_version.ends_with(ELLIPSIS));
        assert_eq!(hello.namespaces[0].len(), MAX_REF_BYTES);
    }

    proptest! {
        #[test]
        fn cleaned_text_is_short_safe_and_stable(text in any::<String>(), max in 0usize..64) {
            let out = clean_text(&text, max);
            prop_assert!(out.len() <= max);
            prop_assert!(!out.chars().any(is_unsafe));
            prop_assert_eq!(clean_text(&out, max), out.clone());
        }

        #[test]
        fn clean_short_text_is_unchanged(text in "[^\\p{Cc}]{0,40}") {
            prop_assume!(!text.chars().any(is_unsafe));
            prop_assert_eq!(clean_text(&text, 4 * 40), text);
        }

        #[test]
        fn cleaned_text_keeps_the_safe_characters_in_order(text in any::<String>(), max in 0usize..64) {
            let kept: String = text
                .chars()
                .filter(|c| !is_unsafe(*c) || c.is_whitespace())
                .map(|c| if is_unsafe(c) { ' ' } else { c })
                .collect();
            let out = clean_text(&text, max);
            let body = out.strip_suffix(ELLIPSIS).filter(|_| kept.len() > max).unwrap_or(&out);
            prop_assert!(kept.starts_with(body), "{:?} is not a prefix of {:?}", body, kept);
        }
    }
}
