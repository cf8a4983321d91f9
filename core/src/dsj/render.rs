//! The Jobs a DSJ creates: deterministic names (a retry or a hub restart re-sends the same
//! name, and the member's API server refuses a second Job of that name), the
//! `jobTargetRef` with the member's `podOverrides`, and the DSJ's labels and annotations
//! plus kedge's own.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::overrides::apply_pod_overrides;
use crate::crd::DistributedScaledJobSpec;
use crate::crd::conditions::{
    ANNOTATION_OWNER, ANNOTATION_PAUSED, ANNOTATION_PAUSED_REPLICAS, ANNOTATION_REPLACES,
    ANNOTATION_TEMPLATE, LABEL_DSJ, LABEL_MEMBER,
};

/// Annotations of the DSJ that are not copied onto its Jobs: kubectl's bookkeeping and the
/// pause switches, which mean something else on a Job.
const NOT_COPIED: &[&str] = &[
    "kubectl.kubernetes.io/last-applied-configuration",
    ANNOTATION_PAUSED,
    ANNOTATION_PAUSED_REPLICAS,
];

/// Longest Job name: the Job controller puts it in a pod label (`job-name`, at most 63).
const MAX_NAME: usize = 63;

/// A stable, short hash (FNV-1a, 64 bit): the same on every hub and every run, unlike std's
/// `DefaultHasher`, which may change between Rust releases.
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

fn fnv(parts: impl Hash) -> u64 {
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    parts.hash(&mut h);
    h.finish()
}

/// The name of the DSJ's `seq`-th Job: `NAME-UUUUU-SEQ`, where `UUUUU` comes from the DSJ's
/// uid, so a DSJ deleted and re-created under the same name never reuses a name of Jobs
/// left from the old one. The DSJ name is shortened to keep the whole within 63 characters.
pub fn job_name(dsj_name: &str, dsj_uid: &str, seq: u64) -> String {
    let suffix = format!("-{:05x}-{seq:x}", fnv(dsj_uid) & 0xf_ffff);
    let room = MAX_NAME.saturating_sub(suffix.len());
    let base: String = dsj_name.chars().take(room).collect();
    format!("{}{suffix}", base.trim_end_matches(['-', '.']))
}

/// What a Job is made from besides the spec.
#[derive(Clone, Copy, Debug)]
pub struct JobOf<'a> {
    /// The DSJ's namespace (the Job's namespace in the member).
    pub namespace: &'a str,
    /// The DSJ's name.
    pub dsj: &'a str,
    /// The DSJ's labels.
    pub labels: &'a BTreeMap<String, String>,
    /// The DSJ's annotations.
    pub annotations: &'a BTreeMap<String, String>,
    /// Member the Job is placed in.
    pub member: &'a str,
    /// The Job's name.
    pub name: &'a str,
    /// For a failover Job, the stuck Job it replaces.
    pub replaces: Option<&'a str>,
}

/// `jobTargetRef` with `member`'s `podOverrides`, and the warnings for overrides naming
/// containers the template does not have.
fn member_job_spec(spec: &DistributedScaledJobSpec, member: &str) -> (JobSpec, Vec<String>) {
    let mut job_spec = spec.scaled_job_spec.job_target_ref.clone();
    let overrides = spec
        .member_clusters
        .iter()
        .find(|m| m.name == member)
        .and_then(|m| m.pod_overrides.as_ref());
    let mut warnings = Vec::new();
    if let Some(overrides) = overrides {
        let (template, w) = apply_pod_overrides(&job_spec.template, overrides);
        job_spec.template = template;
        warnings = w;
    }
    (job_spec, warnings)
}

fn hash_of(job_spec: &JobSpec) -> String {
    // Serialized through serde_json::Value: object keys sorted, so the text (and the hash)
    // depends only on the content.
    let text = serde_json::to_value(job_spec)
        .map(|v| v.to_string())
        .unwrap_or_default();
    format!("{:016x}", fnv(text))
}

/// The template hash (`kedge.dev/template`) a Job rendered now for `member` carries: it
/// changes exactly when that member's Job spec (`jobTargetRef` plus its `podOverrides`)
/// does, so a Job whose hash differs was made from an earlier spec.
pub fn template_hash(spec: &DistributedScaledJobSpec, member: &str) -> String {
    hash_of(&member_job_spec(spec, member).0)
}

/// Renders one Job from `jobTargetRef` with the member's `podOverrides`, and the warnings
/// for overrides naming containers the template does not have (the hub emits them as
/// Events).
pub fn job(spec: &DistributedScaledJobSpec, of: &JobOf<'_>) -> (Job, Vec<String>) {
    let (mut job_spec, warnings) = member_job_spec(spec, of.member);
    let template = hash_of(&job_spec);
    let mut labels = of.labels.clone();
    labels.insert(LABEL_DSJ.to_owned(), of.dsj.to_owned());
    labels.insert(LABEL_MEMBER.to_owned(), of.member.to_owned());
    let pod_meta = job_spec
        .template
        .metadata
        .get_or_insert_with(Default::default);
    pod_meta
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(LABEL_DSJ.to_owned(), of.dsj.to_owned());
    let mut annotations: BTreeMap<String, String> = of
        .annotations
        .iter()
        .filter(|(k, _)| !NOT_COPIED.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    annotations.insert(
        ANNOTATION_OWNER.to_owned(),
        format!("{}/{}", of.namespace, of.dsj),
    );
    if let Some(source) = of.replaces {
        annotations.insert(ANNOTATION_REPLACES.to_owned(), source.to_owned());
    }
    annotations.insert(ANNOTATION_TEMPLATE.to_owned(), template);
    let job = Job {
        metadata: ObjectMeta {
            name: Some(of.name.to_owned()),
            namespace: Some(of.namespace.to_owned()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(job_spec),
        status: None,
    };
    (job, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_deterministic_unique_per_dsj_and_short() {
        let a = job_name("reports", "uid-1", 7);
        assert_eq!(a, job_name("reports", "uid-1", 7));
        assert_ne!(a, job_name("reports", "uid-1", 8));
        assert_ne!(a, job_name("reports", "uid-2", 7));
        assert!(a.starts_with("reports-") && a.ends_with("-7"), "{a}");
        let long = job_name(&"x".repeat(253), "uid", u64::MAX);
        assert_eq!(long.len(), 63, "{long}");
        assert!(long.ends_with("-ffffffffffffffff"), "{long}");
        // A name cut at a dash does not leave a double dash.
        let cut = job_name(&format!("{}-y", "a".repeat(39)), "uid", u64::MAX);
        assert!(!cut.contains("--"), "{cut}");
    }

    #[test]
    fn the_template_hash_changes_with_the_member_job_spec_only() {
        let spec = |image: &str, edge_image: &str| -> DistributedScaledJobSpec {
            serde_yaml::from_str(&format!(
                r#"
memberClusters:
- name: edge-1
  podOverrides: {{containerOverrides: {{worker: {{image: {edge_image}}}}}}}
- name: edge-2
scaledJobSpec:
  pollingInterval: 5
  jobTargetRef:
    template:
      spec:
        restartPolicy: Never
        containers: [{{name: worker, image: {image}}}]
  triggers: [{{type: rabbitmq, metadata: {{value: "1"}}}}]
"#
            ))
            .unwrap()
        };
        let base = spec("worker:1", "worker:edge");
        let h = |s: &DistributedScaledJobSpec, m: &str| template_hash(s, m);
        assert_eq!(
            h(&base, "edge-1"),
            h(&spec("worker:1", "worker:edge"), "edge-1")
        );
        assert_ne!(
            h(&base, "edge-1"),
            h(&base, "edge-2"),
            "overrides are part of it"
        );
        // A new image changes edge-2's Jobs; edge-1 overrides the image, so its Jobs stay.
        let new_image = spec("worker:2", "worker:edge");
        assert_ne!(h(&base, "edge-2"), h(&new_image, "edge-2"));
        assert_eq!(h(&base, "edge-1"), h(&new_image, "edge-1"));
        // Changing only a scaling field changes no Job.
        let mut polling = base.clone();
        polling.scaled_job_spec.polling_interval = Some(60);
        assert_eq!(h(&base, "edge-2"), h(&polling, "edge-2"));
        assert_eq!(h(&base, "edge-2").len(), 16);
    }

    #[test]
    fn a_job_carries_overrides_labels_annotations_and_its_source() {
        let spec: DistributedScaledJobSpec = serde_yaml::from_str(
            r#"
memberClusters:
- name: edge-1
  podOverrides:
    nodeSelector: {gpu: "true"}
    containerOverrides:
      worker: {image: worker:edge}
      sidecar: {image: nope}
scaledJobSpec:
  jobTargetRef:
    backoffLimit: 2
    template:
      spec:
        restartPolicy: Never
        containers: [{name: worker, image: worker:1}]
  triggers: [{type: rabbitmq, metadata: {value: "1"}}]
"#,
        )
        .unwrap();
        let labels = BTreeMap::from([("team".to_owned(), "a".to_owned())]);
        let annotations = BTreeMap::from([
            ("note".to_owned(), "x".to_owned()),
            (ANNOTATION_PAUSED.to_owned(), "false".to_owned()),
        ]);
        let of = JobOf {
            namespace: "jobs",
            dsj: "reports",
            labels: &labels,
            annotations: &annotations,
            member: "edge-1",
            name: "reports-abcde-1",
            replaces: Some("reports-abcde-0"),
        };
        let (job, warnings) = job(&spec, &of);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("sidecar"));
        let meta = &job.metadata;
        assert_eq!(meta.name.as_deref(), Some("reports-abcde-1"));
        assert_eq!(meta.namespace.as_deref(), Some("jobs"));
        let labels = meta.labels.as_ref().unwrap();
        assert_eq!(labels["team"], "a");
        assert_eq!(labels[LABEL_DSJ], "reports");
        assert_eq!(labels[LABEL_MEMBER], "edge-1");
        let annotations = meta.annotations.as_ref().unwrap();
        assert_eq!(annotations["note"], "x");
        assert_eq!(annotations[ANNOTATION_OWNER], "jobs/reports");
        assert_eq!(annotations[ANNOTATION_REPLACES], "reports-abcde-0");
        assert!(!annotations.contains_key(ANNOTATION_PAUSED));
        assert_eq!(
            annotations[ANNOTATION_TEMPLATE],
            template_hash(&spec, "edge-1")
        );
        let spec = job.spec.unwrap();
        assert_eq!(spec.backoff_limit, Some(2));
        let pod = spec.template;
        assert_eq!(pod.metadata.unwrap().labels.unwrap()[LABEL_DSJ], "reports");
        let pod = pod.spec.unwrap();
        assert_eq!(pod.containers[0].image.as_deref(), Some("worker:edge"));
        assert_eq!(pod.node_selector.unwrap()["gpu"], "true");
    }
}
