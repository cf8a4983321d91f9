//! The agent's command line as both binaries know it: the names of the flags and environment
//! variables that `kedge-agent`'s clap definition declares and that `kubectl kedge install
//! agent` and `setup-member` write into the agent's Deployment, and the one reading of the
//! namespace scope (`--namespaces`, `--all-namespaces`) that the agent enforces and the
//! installs render. The Helm chart `deploy/charts/kedge-agent` writes the same flags in its
//! template; `tests/tests/charts.rs` holds it to these names.

use kedge_protocol::{Failure, FailureCode, Retry, is_dns1123_label};

/// Long flag names (without the leading `--`) of `kedge-agent`.
pub mod flag {
    /// The hub addresses, `HOST:PORT`, comma-separated.
    pub const HUB: &str = "hub";
    /// The name to verify in the hub's certificate.
    pub const HUB_SERVER_NAME: &str = "hub-server-name";
    /// The member's client certificate (PEM file).
    pub const TLS_CERT: &str = "tls-cert";
    /// The member's private key (PEM file).
    pub const TLS_KEY: &str = "tls-key";
    /// The hub CA bundle (PEM file).
    pub const TLS_CA: &str = "tls-ca";
    /// The file holding the one-time bootstrap token.
    pub const BOOTSTRAP_TOKEN_FILE: &str = "bootstrap-token-file";
    /// The Secret where the agent keeps its enrolled identity.
    pub const IDENTITY_SECRET: &str = "identity-secret";
    /// The agent's own namespace.
    pub const AGENT_NAMESPACE: &str = "agent-namespace";
    /// The ops endpoint's address.
    pub const OPS_LISTEN: &str = "ops-listen";
    /// The namespaces the agent may act in, comma-separated.
    pub const NAMESPACES: &str = "namespaces";
    /// Act in every namespace.
    pub const ALL_NAMESPACES: &str = "all-namespaces";
    /// The workload kinds the agent may scale, comma-separated.
    pub const KINDS: &str = "kinds";
    /// The log format.
    pub const LOG_FORMAT: &str = "log-format";

    /// `--name`, as it is written on a command line.
    pub fn dashed(name: &str) -> String {
        format!("--{name}")
    }
}

/// Environment variables `kedge-agent` reads that its install sets.
pub mod env {
    /// The hub addresses (the same as `--hub`); the install takes it from the bootstrap
    /// Secret.
    pub const HUB: &str = "KEDGE_AGENT_HUB";
    /// The agent's own namespace (the default of `--agent-namespace`), from the downward API.
    pub const POD_NAMESPACE: &str = "POD_NAMESPACE";
}

/// Where the agent may act. There is no default: an agent is told its namespaces, or
/// explicitly told it may act in all of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespaceScope {
    /// Only these namespaces (never empty once [`NamespaceScope::parse`] accepted it).
    Only(Vec<String>),
    /// Every namespace (`--all-namespaces`, not recommended).
    All,
}

impl NamespaceScope {
    /// The scope the two flags give, unchecked: every namespace with `all`, else the entries
    /// of `namespaces` trimmed, blanks dropped, sorted and without repeats.
    pub fn from_flags(namespaces: &[String], all: bool) -> Self {
        if all {
            return Self::All;
        }
        let mut only: Vec<String> = namespaces
            .iter()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        only.sort();
        only.dedup();
        Self::Only(only)
    }

    /// The scope the two flags give, checked with [`NamespaceScope::problems`]; the error
    /// lists every problem.
    pub fn parse(namespaces: &[String], all: bool) -> Result<Self, String> {
        let scope = Self::from_flags(namespaces, all);
        match scope.problems().as_slice() {
            [] => Ok(scope),
            problems => Err(problems.join("; ")),
        }
    }

    /// Everything wrong with the scope: an empty list, which must not silently mean
    /// "everywhere", and each entry that is not a namespace name.
    pub fn problems(&self) -> Vec<String> {
        match self {
            Self::All => Vec::new(),
            Self::Only(list) if list.is_empty() => vec![format!(
                "no namespaces: the agent denies by default; --{} needs at least one namespace \
                 (or --{}, not recommended)",
                flag::NAMESPACES,
                flag::ALL_NAMESPACES
            )],
            Self::Only(list) => list
                .iter()
                .filter(|n| !is_dns1123_label(n))
                .map(|n| {
                    let shown: String = n.chars().take(64).collect();
                    format!(
                        "namespace {shown:?} is not a namespace name (lowercase alphanumerics \
                         and '-', at most 63)"
                    )
                })
                .collect(),
        }
    }

    /// The allowed namespaces, or `None` when every namespace is.
    pub fn namespaces(&self) -> Option<&[String]> {
        match self {
            Self::Only(allowed) => Some(allowed),
            Self::All => None,
        }
    }

    /// Whether the agent may act in `namespace`.
    pub fn allows(&self, namespace: &str) -> bool {
        match self {
            Self::All => true,
            Self::Only(allowed) => allowed.iter().any(|n| n == namespace),
        }
    }

    /// Refuses a namespace outside the scope with a permanent, readable failure.
    pub fn check(&self, namespace: &str) -> Result<(), Failure> {
        if self.allows(namespace) {
            return Ok(());
        }
        let allowed = self.namespaces().unwrap_or_default().join(", ");
        Err(Failure {
            retry: Retry::Permanent,
            code: FailureCode::NamespaceNotAllowed,
            message: format!(
                "namespace {namespace:?} is not managed by this agent (allowed: {allowed}); \
                 add it to the agent's --{} (and its RBAC) to let kedge act there",
                flag::NAMESPACES
            ),
        })
    }

    /// The agent's arguments that give this scope: `--all-namespaces`, or `--namespaces`
    /// with the sorted list without repeats.
    pub fn args(&self) -> Vec<String> {
        match self {
            Self::All => vec![flag::dashed(flag::ALL_NAMESPACES)],
            Self::Only(list) => {
                let mut list: Vec<&str> = list.iter().map(String::as_str).collect();
                list.sort_unstable();
                list.dedup();
                vec![flag::dashed(flag::NAMESPACES), list.join(",")]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_flags_read_as_a_sorted_list_or_everything() {
        let scope = NamespaceScope::parse(&strings(&["web", " apps", "", "web"]), false).unwrap();
        assert_eq!(scope, NamespaceScope::Only(strings(&["apps", "web"])));
        assert_eq!(scope.args(), ["--namespaces", "apps,web"]);
        assert_eq!(
            NamespaceScope::parse(&[], true),
            Ok(NamespaceScope::All),
            "--all-namespaces needs no list"
        );
        assert_eq!(NamespaceScope::All.args(), ["--all-namespaces"]);
        // Rendered from a list as given, too.
        let given = NamespaceScope::Only(strings(&["web", "apps", "web"]));
        assert_eq!(given.args(), ["--namespaces", "apps,web"]);
    }

    #[test]
    fn an_empty_list_allows_nothing_rather_than_everything() {
        for empty in [&[][..], &[" ", ""][..], &["\t", "  "][..]] {
            let error = NamespaceScope::parse(&strings(empty), false).unwrap_err();
            assert!(
                error.contains("no namespaces")
                    && error.contains("--namespaces needs at least one"),
                "{error}"
            );
        }
        assert!(!NamespaceScope::Only(Vec::new()).allows("apps"));
    }

    #[test]
    fn names_that_are_not_namespaces_are_all_reported() {
        let huge = "x".repeat(1 << 16);
        let error = NamespaceScope::parse(&strings(&["apps", "Web", "kube_system", &huge]), false)
            .unwrap_err();
        for part in ["\"Web\"", "\"kube_system\""] {
            assert!(error.contains(part), "{part}: {error}");
        }
        // A hostile entry is shown cut short.
        assert!(error.len() < 600, "{}", error.len());
    }

    #[test]
    fn namespaces_outside_the_scope_are_refused_permanently() {
        let scope = NamespaceScope::Only(strings(&["apps"]));
        assert!(scope.check("apps").is_ok());
        let refused = scope.check("kube-system").unwrap_err();
        assert_eq!(
            (refused.retry, refused.code),
            (Retry::Permanent, FailureCode::NamespaceNotAllowed)
        );
        assert!(
            refused.message.contains("\"kube-system\"")
                && refused.message.contains("--namespaces")
                && refused.message.contains("allowed: apps"),
            "{}",
            refused.message
        );
        assert!(NamespaceScope::All.check("anything").is_ok());
        assert_eq!(NamespaceScope::All.namespaces(), None);
    }
}
