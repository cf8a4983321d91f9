//! Which Jobs are kedge's. Every Job the agent creates, and its pod template, carries the
//! label `kedge.dev/distributedscaledjob=<DSJ name>` and the annotation
//! `kedge.dev/owner=<namespace>/<name>`; the agent watches only labelled Jobs and deletes a
//! Job only when both name the owner the hub gives. A Job kedge did not create is never
//! touched, whatever the hub says.

use std::fmt;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kedge_core::crd::conditions::{ANNOTATION_OWNER, LABEL_DSJ};
use kedge_protocol::{Failure, FailureCode, Retry, is_dns1123_label};

/// The DistributedScaledJob a Job belongs to, as the hub names it (`namespace/name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobOwner {
    namespace: String,
    name: String,
}

/// A DSJ name that is also a label value: an RFC 1123 subdomain of at most 63 characters.
fn is_label_value_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'.')
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

impl JobOwner {
    /// Parses the `owner` of a Job command; anything but `namespace/name` with a namespace
    /// name and a DSJ name that fits a label value is a permanent `Invalid` failure.
    pub fn parse(owner: &str) -> Result<Self, Failure> {
        let invalid = |why: &str| Failure {
            retry: Retry::Permanent,
            code: FailureCode::Invalid,
            message: format!("Job owner {owner:?} {why}"),
        };
        let (namespace, name) = owner
            .split_once('/')
            .ok_or_else(|| invalid("is not namespace/name"))?;
        if !is_dns1123_label(namespace) {
            return Err(invalid("has an invalid namespace (an RFC 1123 label)"));
        }
        if !is_label_value_name(name) {
            return Err(invalid(
                "has an invalid name (lowercase alphanumerics, '-' and '.', at most 63)",
            ));
        }
        Ok(Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }

    /// The DSJ's name: the value of the ownership label.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn mark(&self, meta: &mut ObjectMeta) {
        meta.labels
            .get_or_insert_default()
            .insert(LABEL_DSJ.to_owned(), self.name.clone());
        meta.annotations
            .get_or_insert_default()
            .insert(ANNOTATION_OWNER.to_owned(), self.to_string());
    }

    /// Puts the ownership label and annotation on `job` and on its pod template, so that
    /// the agent can watch the Job and its pods by label.
    pub fn stamp(&self, job: &mut Job) {
        self.mark(&mut job.metadata);
        let spec = job.spec.get_or_insert_default();
        self.mark(spec.template.metadata.get_or_insert_default());
    }

    /// Refuses, with a permanent `NotOwned` failure, a Job that kedge did not create for
    /// this owner: without the ownership label, or with another owner in the label or the
    /// annotation.
    pub fn check(&self, job: &ObjectMeta) -> Result<(), Failure> {
        let what = format!(
            "Job {}/{}",
            job.namespace.as_deref().unwrap_or_default(),
            job.name.as_deref().unwrap_or_default()
        );
        let not_owned = |why: String| Failure {
            retry: Retry::Permanent,
            code: FailureCode::NotOwned,
            message: format!("{what} {why}; kedge leaves it alone"),
        };
        let label = job.labels.as_ref().and_then(|l| l.get(LABEL_DSJ));
        let annotation = job
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_OWNER));
        match (label, annotation) {
            (None, _) => Err(not_owned(format!(
                "has no {LABEL_DSJ} label: kedge did not create it"
            ))),
            (Some(label), Some(owner)) if *label == self.name && *owner == self.to_string() => {
                Ok(())
            }
            (Some(label), owner) => Err(not_owned(format!(
                "belongs to {} ({LABEL_DSJ}={label}), not to {self}",
                owner.map_or("an unknown owner", String::as_str)
            ))),
        }
    }
}

impl fmt::Display for JobOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn owners_are_namespace_slash_a_name_that_fits_a_label() {
        let ok = JobOwner::parse("apps/work.v2").unwrap();
        assert_eq!(
            (ok.name(), ok.to_string().as_str()),
            ("work.v2", "apps/work.v2")
        );
        for bad in [
            "",
            "work",
            "/work",
            "apps/",
            "apps/work/extra",
            "Apps/work",
            "apps/Work",
            "apps/-work",
            "apps/work-",
            "ap.ps/work",
            &format!("apps/{}", "w".repeat(64)),
        ] {
            let failure = JobOwner::parse(bad).unwrap_err();
            assert_eq!(
                (failure.retry, failure.code),
                (Retry::Permanent, FailureCode::Invalid),
                "{bad:?}"
            );
        }
        assert!(JobOwner::parse(&format!("apps/{}", "w".repeat(63))).is_ok());
    }

    #[test]
    fn a_stamped_job_and_its_pod_template_carry_label_and_annotation() {
        let owner = JobOwner::parse("apps/work").unwrap();
        let mut job: Job = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "work-1", "labels": {"team": "a"}},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
        }))
        .unwrap();
        owner.stamp(&mut job);
        let labels = job.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.get("team").map(String::as_str), Some("a"));
        assert_eq!(labels.get(LABEL_DSJ).map(String::as_str), Some("work"));
        let template = job.spec.unwrap().template.metadata.unwrap();
        assert_eq!(
            template.labels.unwrap().get(LABEL_DSJ).map(String::as_str),
            Some("work")
        );
        assert_eq!(
            template
                .annotations
                .unwrap()
                .get(ANNOTATION_OWNER)
                .map(String::as_str),
            Some("apps/work")
        );
        assert!(owner.check(&job.metadata).is_ok());
    }

    #[test]
    fn only_jobs_labelled_and_annotated_for_this_owner_are_its_own() {
        let owner = JobOwner::parse("apps/work").unwrap();
        let meta = |label: Option<&str>, annotation: Option<&str>| ObjectMeta {
            name: Some("j".into()),
            namespace: Some("apps".into()),
            labels: label.map(|l| BTreeMap::from([(LABEL_DSJ.to_owned(), l.to_owned())])),
            annotations: annotation
                .map(|a| BTreeMap::from([(ANNOTATION_OWNER.to_owned(), a.to_owned())])),
            ..ObjectMeta::default()
        };
        let cases = [
            (None, None, false, "no label"),
            (
                None,
                Some("apps/work"),
                false,
                "an annotation without the label",
            ),
            (
                Some("work"),
                None,
                false,
                "the label without the annotation",
            ),
            (Some("work"), Some("other/work"), false, "another owner"),
            (
                Some("other"),
                Some("apps/work"),
                false,
                "another DSJ's label",
            ),
            (Some("work"), Some("apps/work"), true, "its own"),
        ];
        for (label, annotation, owned, what) in cases {
            match owner.check(&meta(label, annotation)) {
                Ok(()) => assert!(owned, "{what}: accepted"),
                Err(failure) => {
                    assert!(!owned, "{what}: refused: {}", failure.message);
                    assert_eq!(
                        (failure.retry, failure.code),
                        (Retry::Permanent, FailureCode::NotOwned),
                        "{what}"
                    );
                    assert!(
                        failure.message.contains("Job apps/j"),
                        "{}",
                        failure.message
                    );
                }
            }
        }
    }
}
