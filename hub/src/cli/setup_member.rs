//! `kubectl kedge mc setup-member`: enrolls a member in one command. It creates the
//! `MemberCluster` (the only way a member comes to exist) and a one-time, expiring bootstrap
//! token (only its hash is stored, in the hub namespace), then prints the agent's install
//! for the member cluster — or applies it there with `--member-kubeconfig`. The agent
//! generates its key itself and enrolls with the token; the token then stops working.
//!
//! Nothing is left half-done on the hub: when a later step fails, the `MemberCluster` and
//! the token created by this run are deleted again.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kedge_core::crd::{MemberCluster, MemberClusterSpec};
use kedge_net::identity::is_valid_member_name;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::discovery::Scope;
use serde_json::Value;

use super::{Error, NamespaceArgs, Result};
use crate::enroll::{bootstrap_secret_name, mint_bootstrap_token};
use crate::install::{AgentInstall, Credentials, agent_helm_values, agent_manifests};

/// Bounds of `--ttl`: long enough to carry the token to the member, short enough that a
/// leaked, unused token is soon worthless.
pub const TTL: (Duration, Duration) = (Duration::from_secs(60), Duration::from_secs(7 * 24 * 3600));

/// The field manager of what `setup-member` applies in a member cluster.
const FIELD_MANAGER: &str = "kubectl-kedge";

/// What `setup-member` prints without `--member-kubeconfig`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// The agent's install as Kubernetes manifests (`kubectl apply -f -`).
    Manifests,
    /// Values for the `kedge-agent` chart (`helm install -f -`).
    HelmValues,
}

/// Arguments of `mc setup-member`.
#[derive(Debug, Clone, Args)]
pub struct SetupArgs {
    /// The member's name: a lowercase RFC 1123 label, the identity in its certificate.
    pub name: String,
    /// Where the agent may act.
    #[command(flatten)]
    pub scope: NamespaceArgs,
    /// The hub's QUIC address as the member reaches it, HOST:PORT; several, comma-separated,
    /// for hubs in high availability.
    #[arg(long, value_delimiter = ',', required = true)]
    pub hub_address: Vec<String>,
    /// Name to verify in the hub's certificate, when HOST of --hub-address is not one of
    /// its names (the hub's --server-dns-names / --server-ips).
    #[arg(long)]
    pub hub_server_name: Option<String>,
    /// Apply the install to the member cluster with this kubeconfig instead of printing it.
    #[arg(long, conflicts_with = "output")]
    pub member_kubeconfig: Option<PathBuf>,
    /// What to print: the install's manifests, or the same install as values for the
    /// `kedge-agent` Helm chart (`helm install -f`).
    #[arg(long, value_enum, default_value_t = Output::Manifests)]
    pub output: Output,
    /// How long the bootstrap token works (1m to 7d).
    #[arg(long, default_value = "1h", value_parser = kedge_net::flags::duration_within(TTL.0, TTL.1))]
    pub ttl: Duration,
    /// The namespace the agent runs in, in the member cluster.
    #[arg(long, default_value = crate::install::agent::DEFAULT_AGENT_NAMESPACE)]
    pub agent_namespace: String,
    /// The agent image.
    #[arg(long, default_value = crate::install::agent::DEFAULT_IMAGE)]
    pub image: String,
    /// The agent image tag (default: this release).
    #[arg(long)]
    pub tag: Option<String>,
}

fn failed(what: impl Into<String>, message: impl Into<String>) -> Error {
    Error::HubCluster {
        what: what.into(),
        message: message.into(),
    }
}

/// The hub CA bundle from the hub's CA Secret.
async fn hub_ca(client: &kube::Client, hub_namespace: &str) -> Result<String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), hub_namespace);
    let what = format!("reading the hub CA (Secret {hub_namespace}/kedge-hub-ca)");
    let secret = secrets
        .get_opt("kedge-hub-ca")
        .await
        .map_err(|e| failed(&what, e.to_string()))?
        .ok_or_else(|| {
            failed(
                &what,
                "not found: start the hub without --tls-* files first (it creates its CA), or \
                 pass --hub-namespace where it runs",
            )
        })?;
    secret
        .data
        .as_ref()
        .and_then(|d| d.get("tls.crt"))
        .and_then(|pem| String::from_utf8(pem.0.clone()).ok())
        .filter(|pem| pem.contains("BEGIN CERTIFICATE"))
        .ok_or_else(|| failed(&what, "the Secret has no PEM certificate under tls.crt"))
}

/// Enrolls `args.name`: see the module documentation.
pub async fn run(
    client: kube::Client,
    hub_namespace: &str,
    args: &SetupArgs,
    out: &mut impl std::io::Write,
) -> Result<()> {
    let name = args.name.as_str();
    if !is_valid_member_name(name) {
        return Err(Error::Argument(format!(
            "{name:?} is not a valid member name (a lowercase RFC 1123 label, at most 63 characters)"
        )));
    }
    let namespaces = args.scope.scope();
    // Everything that can be checked without changing anything, first.
    let ca_pem = hub_ca(&client, hub_namespace).await?;
    let minted = mint_bootstrap_token(name, time::OffsetDateTime::now_utc(), args.ttl)
        .map_err(|e| Error::Argument(e.to_string()))?;
    let mut install = AgentInstall::new(
        args.hub_address.clone(),
        ca_pem,
        Credentials::Bootstrap {
            token: minted.token.as_str().to_owned(),
        },
        namespaces.clone(),
    );
    install.agent_namespace = args.agent_namespace.clone();
    install.hub_server_name = args.hub_server_name.clone();
    install.image = args.image.clone();
    if let Some(tag) = &args.tag {
        install.tag = tag.clone();
    }
    install
        .validate()
        .map_err(|e| Error::Argument(e.to_string()))?;
    let manifests = agent_manifests(&install);
    if let Some(path) = &args.member_kubeconfig {
        check_member_namespaces(name, path, &manifests).await?;
    }

    let members: Api<MemberCluster> = Api::all(client.clone());
    let spec = MemberClusterSpec {
        namespaces: namespaces.namespaces().unwrap_or_default().to_vec(),
        ..MemberClusterSpec::default()
    };
    let uid = match members
        .create(&PostParams::default(), &MemberCluster::new(name, spec))
        .await
    {
        Ok(created) => created.metadata.uid.unwrap_or_default(),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            return Err(failed(
                format!("creating MemberCluster {name}"),
                format!(
                    "member {name} exists; to enroll it again, delete it first with \
                     `kubectl kedge mc delete-member {name}` (that revokes its certificate)"
                ),
            ));
        }
        Err(e) => {
            return Err(failed(
                format!("creating MemberCluster {name}"),
                e.to_string(),
            ));
        }
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), hub_namespace);
    if uid.is_empty() {
        undo(&members, &secrets, name, None).await;
        return Err(failed(
            format!("creating MemberCluster {name}"),
            "the hub cluster returned it without a metadata.uid to bind its token to",
        ));
    }
    let token_name = bootstrap_secret_name(name);
    // Bound to this MemberCluster: a token of an earlier one of this name is refused anyway
    // (its uid differs); deleting it first keeps the name free for this one.
    let stored = async {
        let secret = minted
            .secret(&uid, hub_namespace)
            .map_err(|e| e.to_string())?;
        match secrets.delete(&token_name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(e.to_string()),
        }
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .map_err(|e| e.to_string())
    }
    .await;
    if let Err(e) = stored {
        undo(&members, &secrets, name, None).await;
        return Err(failed(
            format!("storing the bootstrap token of {name} (Secret {hub_namespace}/{token_name})"),
            e,
        ));
    }

    let expires = minted
        .expires_at
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    match &args.member_kubeconfig {
        None if args.output == Output::HelmValues => {
            writeln!(
                out,
                "# kedge-agent chart values for member {name} (helm install -f, in the \
                 namespace {}).\n# The bootstrap token in them works once, until {expires}.",
                install.agent_namespace
            )?;
            write!(
                out,
                "{}",
                serde_yaml::to_string(&agent_helm_values(&install))?
            )?;
        }
        None => {
            writeln!(
                out,
                "# kedge agent for member {name}: apply to the member cluster \
                 (kubectl apply -f -).\n# The bootstrap token in it works once, until {expires}."
            )?;
            for object in &manifests {
                let yaml = serde_yaml::to_string(object)?;
                write!(out, "---\n{yaml}")?;
            }
        }
        Some(path) => {
            if let Err(e) = apply_to_member(path, &manifests).await {
                undo(&members, &secrets, name, Some(&token_name)).await;
                return Err(e);
            }
            writeln!(
                out,
                "member {name} enrolled: MemberCluster created, {} objects applied to the member \
                 cluster; its agent enrolls with a one-time token (valid until {expires}).\n\
                 Watch it connect: kubectl kedge mc list-members",
                manifests.len()
            )?;
        }
    }
    Ok(())
}

/// Deletes what this run created on the hub (best effort: the error being reported matters
/// more than a failed cleanup, which `mc delete-member` finishes).
async fn undo(
    members: &Api<MemberCluster>,
    secrets: &Api<Secret>,
    name: &str,
    token: Option<&str>,
) {
    let _ = members.delete(name, &DeleteParams::default()).await;
    if let Some(token) = token {
        let _ = secrets.delete(token, &DeleteParams::default()).await;
    }
}

/// The namespaces `manifests` put objects in that they do not create themselves.
fn needed_namespaces(manifests: &[Value]) -> Vec<String> {
    let created: Vec<&str> = manifests
        .iter()
        .filter(|m| m["kind"] == "Namespace" && m["apiVersion"] == "v1")
        .filter_map(|m| m["metadata"]["name"].as_str())
        .collect();
    let mut needed: Vec<String> = Vec::new();
    for ns in manifests
        .iter()
        .filter_map(|m| m["metadata"]["namespace"].as_str())
    {
        if !created.contains(&ns) && !needed.iter().any(|n| n == ns) {
            needed.push(ns.to_owned());
        }
    }
    needed
}

/// What to say when `namespace` is missing in the member cluster of `kubeconfig`.
fn missing_namespace(member: &str, kubeconfig: &std::path::Path, namespace: &str) -> Error {
    failed(
        format!("checking the namespaces of member {member}"),
        format!(
            "namespace {namespace:?} does not exist in the member cluster ({}); the agent \
             acts in it, so it must exist first: create it with `kubectl --kubeconfig {} \
             create namespace {namespace}` and run setup-member again",
            kubeconfig.display(),
            kubeconfig.display(),
        ),
    )
}

/// Fails, before anything is created, when the member cluster lacks a namespace the
/// install puts objects in (the agent's Roles in each namespace it acts in).
async fn check_member_namespaces(
    member: &str,
    kubeconfig: &std::path::Path,
    manifests: &[Value],
) -> Result<()> {
    let client = kedge_net::kube_client::client(Some(kubeconfig))
        .await
        .map_err(|e| failed("connecting to the member cluster", e.to_string()))?;
    let namespaces: Api<Namespace> = Api::all(client);
    for namespace in needed_namespaces(manifests) {
        let found = namespaces.get_opt(&namespace).await.map_err(|e| {
            failed(
                format!("reading namespace {namespace} in member {member}"),
                e.to_string(),
            )
        })?;
        if found.is_none() {
            return Err(missing_namespace(member, kubeconfig, &namespace));
        }
    }
    Ok(())
}

/// Server-side applies `manifests`, in order, to the cluster of `kubeconfig`.
async fn apply_to_member(kubeconfig: &std::path::Path, manifests: &[Value]) -> Result<()> {
    let what = |m: &Value| {
        format!(
            "applying {} {} to the member cluster",
            m["kind"].as_str().unwrap_or("?"),
            m["metadata"]["name"].as_str().unwrap_or("?")
        )
    };
    let client = kedge_net::kube_client::client(Some(kubeconfig))
        .await
        .map_err(|e| failed("connecting to the member cluster", e.to_string()))?;
    for manifest in manifests {
        let object: DynamicObject = serde_json::from_value(manifest.clone())?;
        let types = object
            .types
            .clone()
            .ok_or_else(|| failed(what(manifest), "no apiVersion/kind"))?;
        let gvk = GroupVersionKind::try_from(&types)
            .map_err(|e| failed(what(manifest), e.to_string()))?;
        let (resource, caps): (ApiResource, _) = kube::discovery::pinned_kind(&client, &gvk)
            .await
            .map_err(|e| failed(what(manifest), e.to_string()))?;
        let api: Api<DynamicObject> = match (caps.scope, object.metadata.namespace.as_deref()) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
            _ => Api::all_with(client.clone(), &resource),
        };
        let name = object.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(manifest),
        )
        .await
        .map_err(|e| failed(what(manifest), e.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn needed_namespaces_are_those_the_install_does_not_create() {
        let manifests = [
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kedge-system"}}),
            json!({"kind": "ServiceAccount", "metadata": {"name": "a", "namespace": "kedge-system"}}),
            json!({"kind": "ClusterRole", "metadata": {"name": "r"}}),
            json!({"kind": "Role", "metadata": {"name": "w", "namespace": "default"}}),
            json!({"kind": "RoleBinding", "metadata": {"name": "w", "namespace": "default"}}),
            json!({"kind": "Role", "metadata": {"name": "w", "namespace": "shop"}}),
        ];
        assert_eq!(needed_namespaces(&manifests), ["default", "shop"]);
    }

    #[test]
    fn a_missing_namespace_names_the_cluster_and_the_fix() {
        let e = missing_namespace("m1", std::path::Path::new("/k/m1.kubeconfig"), "shop");
        let text = e.to_string();
        assert!(text.contains("member m1"), "{text}");
        assert!(
            text.contains("`kubectl --kubeconfig /k/m1.kubeconfig create namespace shop`"),
            "{text}"
        );
    }
}
