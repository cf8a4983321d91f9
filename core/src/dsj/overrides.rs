//! Per-member pod overrides applied to the Job template when a Job is created there.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodTemplateSpec, ResourceRequirements, Toleration};

use crate::crd::dsj::PodOverrides;

/// The identity under which tolerations are de-duplicated.
fn toleration_key(t: &Toleration) -> (Option<&str>, Option<&str>, Option<&str>, Option<&str>) {
    (
        t.key.as_deref(),
        t.operator.as_deref(),
        t.effect.as_deref(),
        t.value.as_deref(),
    )
}

/// Merges tolerations: base first, then overrides; an override with the same
/// (key, operator, effect, value) replaces the base entry in place (last writer wins), and
/// duplicates within either list collapse to one.
pub fn merge_tolerations(base: &[Toleration], overrides: &[Toleration]) -> Vec<Toleration> {
    let mut out: Vec<Toleration> = Vec::with_capacity(base.len() + overrides.len());
    for t in base.iter().chain(overrides) {
        match out
            .iter_mut()
            .find(|o| toleration_key(o) == toleration_key(t))
        {
            Some(existing) => *existing = t.clone(),
            None => out.push(t.clone()),
        }
    }
    out
}

fn merge_resources(container: &mut Container, resources: &crate::crd::dsj::ResourcesOverride) {
    let current = container
        .resources
        .get_or_insert_with(ResourceRequirements::default);
    if let Some(requests) = &resources.requests {
        current
            .requests
            .get_or_insert_with(BTreeMap::new)
            .extend(requests.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    if let Some(limits) = &resources.limits {
        current
            .limits
            .get_or_insert_with(BTreeMap::new)
            .extend(limits.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    // A present list replaces, even an empty one (that clears the claims).
    if let Some(claims) = &resources.claims {
        current.claims = Some(claims.clone());
    }
}

/// Applies `overrides` to a copy of the Job's pod template: nodeSelector merged (override
/// values win), tolerations merged and de-duplicated, affinity replaced, and per container
/// image replaced, env merged by name, resources merged. Overrides for containers the
/// template does not have are ignored; one warning per such name is returned for the hub
/// to emit as an Event.
pub fn apply_pod_overrides(
    template: &PodTemplateSpec,
    overrides: &PodOverrides,
) -> (PodTemplateSpec, Vec<String>) {
    let mut out = template.clone();
    let mut warnings = Vec::new();
    let spec = out.spec.get_or_insert_with(Default::default);
    if let Some(selector) = &overrides.node_selector {
        spec.node_selector
            .get_or_insert_with(BTreeMap::new)
            .extend(selector.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    if let Some(tolerations) = &overrides.tolerations {
        let base = spec.tolerations.take().unwrap_or_default();
        spec.tolerations = Some(merge_tolerations(&base, tolerations));
    }
    if let Some(affinity) = &overrides.affinity {
        spec.affinity = Some(affinity.clone());
    }
    for (name, o) in overrides.container_overrides.iter().flatten() {
        let Some(container) = spec.containers.iter_mut().find(|c| &c.name == name) else {
            warnings.push(format!(
                "podOverrides.containerOverrides.{name}: no container {name:?} in \
                 scaledJobSpec.jobTargetRef.template.spec.containers; override ignored"
            ));
            continue;
        };
        if let Some(image) = &o.image {
            container.image = Some(image.clone());
        }
        if let Some(env) = &o.env {
            let vars = container.env.get_or_insert_with(Vec::new);
            for var in env {
                match vars.iter_mut().find(|v| v.name == var.name) {
                    Some(existing) => *existing = var.clone(),
                    None => vars.push(var.clone()),
                }
            }
        }
        if let Some(resources) = &o.resources {
            merge_resources(container, resources);
        }
    }
    (out, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template() -> PodTemplateSpec {
        serde_yaml::from_str(
            r#"
spec:
  nodeSelector: {zone: a, disk: ssd}
  tolerations:
  - {key: gpu, operator: Exists, effect: NoSchedule, tolerationSeconds: 10}
  - {key: spot, operator: Equal, value: "true", effect: NoSchedule}
  affinity:
    podAntiAffinity: {}
  containers:
  - name: processor
    image: myapp:latest
    env: [{name: LOG_LEVEL, value: info}, {name: KEEP, value: "1"}]
    resources:
      requests: {cpu: 100m, memory: 128Mi}
      claims: [{name: gpu}]
  - name: sidecar
    image: proxy:1
  restartPolicy: Never
"#,
        )
        .expect("template parses")
    }

    fn overrides() -> PodOverrides {
        serde_yaml::from_str(
            r#"
nodeSelector: {nodepool: gpu, zone: b}
tolerations:
- {key: gpu, operator: Exists, effect: NoSchedule}
- {key: gpu, operator: Exists, effect: NoSchedule}
- {key: edge, operator: Exists}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
      - matchExpressions: [{key: region, operator: In, values: [us-east-1]}]
containerOverrides:
  processor:
    image: my-registry.local/processor:v2
    env: [{name: LOG_LEVEL, value: debug}, {name: NEW, value: x}]
    resources:
      requests: {cpu: 200m}
      limits: {cpu: "1", memory: 1Gi}
      claims: []
  missing:
    image: nope
"#,
        )
        .expect("overrides parse")
    }

    #[test]
    fn reference_overrides() {
        let (pod, warnings) = apply_pod_overrides(&template(), &overrides());
        let spec = pod.spec.expect("spec kept");
        let selector = spec.node_selector.expect("selector");
        assert_eq!(
            selector.get("zone").map(String::as_str),
            Some("b"),
            "override wins"
        );
        assert_eq!(
            selector.get("disk").map(String::as_str),
            Some("ssd"),
            "base kept"
        );
        assert_eq!(selector.get("nodepool").map(String::as_str), Some("gpu"));
        let tolerations = spec.tolerations.expect("tolerations");
        assert_eq!(tolerations.len(), 3, "gpu de-duplicated: {tolerations:?}");
        assert_eq!(tolerations[0].key.as_deref(), Some("gpu"));
        assert_eq!(
            tolerations[0].toleration_seconds, None,
            "override replaced the base entry"
        );
        assert_eq!(tolerations[1].key.as_deref(), Some("spot"));
        assert_eq!(tolerations[2].key.as_deref(), Some("edge"));
        let affinity = spec.affinity.expect("affinity");
        assert!(
            affinity.node_affinity.is_some() && affinity.pod_anti_affinity.is_none(),
            "replaced"
        );
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("my-registry.local/processor:v2"));
        let env: Vec<(&str, Option<&str>)> = c
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.as_str(), e.value.as_deref()))
            .collect();
        assert_eq!(
            env,
            vec![
                ("LOG_LEVEL", Some("debug")),
                ("KEEP", Some("1")),
                ("NEW", Some("x"))
            ]
        );
        let resources = c.resources.as_ref().expect("resources");
        let requests = resources.requests.as_ref().expect("requests");
        assert_eq!(requests.get("cpu").map(|q| q.0.as_str()), Some("200m"));
        assert_eq!(requests.get("memory").map(|q| q.0.as_str()), Some("128Mi"));
        assert_eq!(resources.limits.as_ref().map(BTreeMap::len), Some(2));
        assert_eq!(resources.claims, Some(vec![]), "empty list clears claims");
        assert_eq!(
            spec.containers[1].image.as_deref(),
            Some("proxy:1"),
            "other container untouched"
        );
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("\"missing\""), "{warnings:?}");
    }

    #[test]
    fn claims_kept_when_not_given() {
        let mut o = overrides();
        if let Some(c) = o
            .container_overrides
            .as_mut()
            .and_then(|m| m.get_mut("processor"))
        {
            c.resources = Some(crate::crd::dsj::ResourcesOverride::default());
        }
        let (pod, _) = apply_pod_overrides(&template(), &o);
        let claims = pod
            .spec
            .and_then(|s| s.containers[0].resources.clone())
            .and_then(|r| r.claims);
        assert_eq!(claims.map(|c| c.len()), Some(1));
    }
}
