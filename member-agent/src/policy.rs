//! What the agent may touch, decided in the member cluster and never by the hub: the
//! namespaces and the workload kinds it was configured with. Everything else is refused with
//! a permanent, readable failure that the agent logs and reports, so that even a
//! compromised hub cannot make the agent act outside them.

use std::fmt;
use std::str::FromStr;

use kedge_protocol::{Failure, FailureCode, Retry};

/// The namespaces the agent may act in: the scope `--namespaces` / `--all-namespaces` give,
/// read and checked by `kedge-net` for the agent and its installs alike.
pub use kedge_net::agent_cli::NamespaceScope as NamespacePolicy;

/// A workload kind, as `--kinds` names it: `group/version/Kind`, or `v1/Kind` for the core
/// group.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkloadKind {
    /// `group/version`, or `version` for the core group: what `apiVersion` says.
    pub api_version: String,
    /// The kind, e.g. `Deployment`.
    pub kind: String,
}

impl WorkloadKind {
    /// The API group; empty for the core group.
    pub fn group(&self) -> &str {
        self.api_version
            .split_once('/')
            .map_or("", |(group, _)| group)
    }
}

impl fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.api_version, self.kind)
    }
}

/// A `--kinds` entry that is not `group/version/Kind` or `v1/Kind`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a kind: write group/version/Kind (e.g. apps/v1/Deployment), or version/Kind \
     for the core group (e.g. v1/ReplicationController)"
)]
pub struct BadKind(pub String);

impl FromStr for WorkloadKind {
    type Err = BadKind;

    fn from_str(s: &str) -> Result<Self, BadKind> {
        let bad = || BadKind(s.to_owned());
        let parts: Vec<&str> = s.trim().split('/').collect();
        let word = |p: &str| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        };
        if !parts.iter().all(|p| word(p)) {
            return Err(bad());
        }
        let (api_version, kind) = match parts.as_slice() {
            [group, version, kind] => (format!("{group}/{version}"), *kind),
            [version, kind] => ((*version).to_owned(), *kind),
            _ => return Err(bad()),
        };
        if !kind.starts_with(|c: char| c.is_ascii_uppercase()) || kind.contains('.') {
            return Err(bad());
        }
        Ok(Self {
            api_version,
            kind: kind.to_owned(),
        })
    }
}

/// The default of `--kinds`.
pub const DEFAULT_KINDS: &str = "apps/v1/Deployment,apps/v1/StatefulSet";

/// The workload kinds the agent may scale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindPolicy {
    allowed: Vec<WorkloadKind>,
}

impl KindPolicy {
    /// A policy allowing exactly `allowed`.
    pub fn new(allowed: &[WorkloadKind]) -> Self {
        let mut allowed = allowed.to_vec();
        allowed.sort();
        allowed.dedup();
        Self { allowed }
    }

    /// The allowed kinds, sorted.
    pub fn kinds(&self) -> &[WorkloadKind] {
        &self.allowed
    }

    /// Refuses a kind outside the policy with a permanent, readable failure.
    pub fn check(&self, api_version: &str, kind: &str) -> Result<(), Failure> {
        if self
            .allowed
            .iter()
            .any(|k| k.api_version == api_version && k.kind == kind)
        {
            return Ok(());
        }
        let allowed: Vec<String> = self.allowed.iter().map(ToString::to_string).collect();
        Err(Failure {
            retry: Retry::Permanent,
            code: FailureCode::KindNotAllowed,
            message: format!(
                "kind {api_version}/{kind} is not managed by this agent (allowed: {}); \
                 add it to the agent's --kinds (and its RBAC) to let kedge scale it",
                allowed.join(", ")
            ),
        })
    }
}

impl Default for KindPolicy {
    fn default() -> Self {
        let kinds: Vec<WorkloadKind> = DEFAULT_KINDS
            .split(',')
            .filter_map(|k| k.parse().ok())
            .collect();
        Self::new(&kinds)
    }
}

/// Everything the agent may touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Where.
    pub namespaces: NamespacePolicy,
    /// Which workload kinds (Jobs are always `batch/v1` Jobs carrying kedge's label).
    pub kinds: KindPolicy,
}

impl Policy {
    /// Refuses a workload outside the namespaces or kinds of the policy.
    pub fn check_workload(
        &self,
        namespace: &str,
        api_version: &str,
        kind: &str,
    ) -> Result<(), Failure> {
        self.namespaces.check(namespace)?;
        self.kinds.check(api_version, kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_with_and_without_a_group() {
        let k: WorkloadKind = "apps/v1/Deployment".parse().unwrap();
        assert_eq!(
            (k.api_version.as_str(), k.kind.as_str(), k.group()),
            ("apps/v1", "Deployment", "apps")
        );
        assert_eq!(k.to_string(), "apps/v1/Deployment");
        let k: WorkloadKind = "v1/ReplicationController".parse().unwrap();
        assert_eq!((k.api_version.as_str(), k.group()), ("v1", ""));
        let k: WorkloadKind = "argoproj.io/v1alpha1/Rollout".parse().unwrap();
        assert_eq!(k.api_version, "argoproj.io/v1alpha1");
        for bad in [
            "",
            "Deployment",
            "apps/v1/deployment",
            "apps/v1/",
            "/v1/Deployment",
            "apps/v1/Deployment/x",
            "apps/v1/*",
            "apps/*/Deployment",
            "apps /v1/Deployment",
        ] {
            let error = bad.parse::<WorkloadKind>().unwrap_err().to_string();
            assert!(error.contains("group/version/Kind"), "{bad:?}: {error}");
        }
    }

    #[test]
    fn kinds_outside_the_policy_are_refused_permanently() {
        let policy = KindPolicy::default();
        assert!(policy.check("apps/v1", "Deployment").is_ok());
        assert!(policy.check("apps/v1", "StatefulSet").is_ok());
        for (api_version, kind) in [
            ("apps/v1", "DaemonSet"),
            ("v1", "Deployment"),
            ("apps/v1beta1", "Deployment"),
            ("argoproj.io/v1alpha1", "Rollout"),
        ] {
            let refused = policy.check(api_version, kind).unwrap_err();
            assert_eq!(
                (refused.retry, refused.code),
                (Retry::Permanent, FailureCode::KindNotAllowed),
                "{api_version}/{kind}"
            );
            assert!(
                refused.message.contains(&format!("{api_version}/{kind}"))
                    && refused.message.contains("--kinds")
                    && refused
                        .message
                        .contains("apps/v1/Deployment, apps/v1/StatefulSet"),
                "{}",
                refused.message
            );
        }
    }

    #[test]
    fn a_workload_must_pass_both_namespace_and_kind() {
        let policy = Policy {
            namespaces: NamespacePolicy::Only(vec!["apps".into()]),
            kinds: KindPolicy::default(),
        };
        assert!(
            policy
                .check_workload("apps", "apps/v1", "Deployment")
                .is_ok()
        );
        let code = |ns, av, k| policy.check_workload(ns, av, k).unwrap_err().code;
        assert_eq!(
            code("kube-system", "apps/v1", "Deployment"),
            FailureCode::NamespaceNotAllowed
        );
        assert_eq!(
            code("apps", "apps/v1", "DaemonSet"),
            FailureCode::KindNotAllowed
        );
    }
}
