//! `kubectl kedge mc`: the members registered on the hub (`MemberCluster`s), read and
//! deleted through the hub cluster's API with the caller's kubeconfig.

use std::path::PathBuf;
use std::time::SystemTime;

use clap::{Args, Subcommand};
use k8s_openapi::api::core::v1::Secret;
use kedge_core::crd::MemberCluster;
use kube::api::{Api, DeleteParams, ListParams};

use super::{Error, Result, sessions, table};
use crate::enroll::bootstrap_secret_name;

/// Arguments of `mc`.
#[derive(Debug, Args)]
pub struct McArgs {
    /// The hub cluster to talk to.
    #[command(flatten)]
    pub hub: HubCluster,
    /// The subcommand.
    #[command(subcommand)]
    pub command: McCommand,
}

/// Where the hub cluster and the hub's namespace are.
#[derive(Debug, Clone, Args)]
pub struct HubCluster {
    /// Kubeconfig of the hub cluster; default: $KUBECONFIG, then ~/.kube/config, then
    /// in-cluster.
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace the hub runs in (where bootstrap tokens are kept).
    #[arg(
        long,
        global = true,
        env = "KEDGE_HUB_NAMESPACE",
        default_value = "kedge-system"
    )]
    pub hub_namespace: String,
}

/// Subcommands of `mc`.
#[derive(Debug, Subcommand)]
pub enum McCommand {
    /// Enroll a member: create its MemberCluster and a one-time bootstrap token, and print
    /// the agent's install for the member cluster (or apply it with --member-kubeconfig).
    SetupMember(super::setup_member::SetupArgs),
    /// List members: state, versions, address, last heartbeat, certificate expiry and
    /// namespace policy.
    ListMembers(ListArgs),
    /// Delete a member: the hub closes its session within a second and refuses its
    /// certificate from then on.
    DeleteMember(DeleteArgs),
}

/// Arguments of `mc list-members`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Output format: table or json.
    #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
    pub output: String,
}

/// Arguments of `mc delete-member`.
#[derive(Debug, Clone, Args)]
pub struct DeleteArgs {
    /// The member's name.
    pub name: String,
}

/// Runs an `mc` subcommand.
pub async fn run(args: &McArgs, out: &mut impl std::io::Write) -> Result<()> {
    let client = kedge_net::kube_client::client(args.hub.kubeconfig.as_deref())
        .await
        .map_err(|e| Error::HubCluster {
            what: "connecting to the hub cluster".into(),
            message: e.to_string(),
        })?;
    match &args.command {
        McCommand::ListMembers(list) => {
            let members = Api::<MemberCluster>::all(client)
                .list(&ListParams::default())
                .await
                .map_err(|e| api_error("listing MemberClusters", e))?
                .items;
            if list.output == "json" {
                writeln!(out, "{}", serde_json::to_string_pretty(&members)?)?;
            } else {
                write!(out, "{}", render_members(&members, SystemTime::now()))?;
            }
            Ok(())
        }
        McCommand::SetupMember(setup) => {
            super::setup_member::run(client, &args.hub.hub_namespace, setup, out).await
        }
        McCommand::DeleteMember(delete) => {
            delete_member(client, &args.hub.hub_namespace, &delete.name, out).await
        }
    }
}

fn api_error(what: &str, error: kube::Error) -> Error {
    let message = match &error {
        kube::Error::Api(status) if status.code == 403 => format!(
            "{}; managing members needs rights on memberclusters.kedge.dev (cluster-scoped)",
            status.message
        ),
        _ => error.to_string(),
    };
    Error::HubCluster {
        what: what.into(),
        message,
    }
}

async fn delete_member(
    client: kube::Client,
    hub_namespace: &str,
    name: &str,
    out: &mut impl std::io::Write,
) -> Result<()> {
    let members: Api<MemberCluster> = Api::all(client.clone());
    match members.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {
            return Err(Error::HubCluster {
                what: format!("deleting member {name}"),
                message: format!(
                    "no MemberCluster {name:?}; `kubectl kedge mc list-members` lists them"
                ),
            });
        }
        Err(e) => return Err(api_error(&format!("deleting MemberCluster {name}"), e)),
    }
    // An unused bootstrap token of the member must not enroll it again.
    let secrets: Api<Secret> = Api::namespaced(client, hub_namespace);
    match secrets
        .delete(&bootstrap_secret_name(name), &DeleteParams::default())
        .await
    {
        Ok(_) => writeln!(out, "bootstrap token of {name} deleted")?,
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(e) => return Err(api_error("deleting the member's bootstrap token", e)),
    }
    writeln!(
        out,
        "membercluster.kedge.dev/{name} deleted: the hub closes its session and refuses its \
         certificate; enroll it again with `kubectl kedge mc setup-member {name}`"
    )?;
    Ok(())
}

/// Renders members as a table.
pub fn render_members(members: &[MemberCluster], now: SystemTime) -> String {
    let dash = |v: Option<&String>| v.filter(|s| !s.is_empty()).cloned().unwrap_or("-".into());
    let mut rows = vec![
        [
            "NAME",
            "STATE",
            "AGENT",
            "KUBERNETES",
            "ADDRESS",
            "HEARTBEAT",
            "CERT-EXPIRES",
            "NAMESPACES",
            "GRANTS",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for m in members {
        let status = m.status.clone().unwrap_or_default();
        let namespaces = if m.spec.namespaces.is_empty() {
            "-".to_owned()
        } else {
            m.spec.namespaces.join(",")
        };
        let grants: Vec<String> = m
            .spec
            .namespace_mappings
            .iter()
            .map(|g| format!("{}->{}", g.hub_namespace, g.member_namespaces.join("+")))
            .collect();
        rows.push(vec![
            dash(m.metadata.name.as_ref()),
            dash(status.state.as_ref()),
            dash(status.agent_version.as_ref()),
            dash(status.kubernetes_version.as_ref()),
            dash(status.address.as_ref()),
            status
                .last_heartbeat_time
                .map_or("-".into(), |t| sessions::ago(t.0.as_millisecond(), now)),
            status
                .certificate_expiry
                .map_or("-".into(), |t| sessions::expires(t.0.as_second(), now)),
            namespaces,
            if grants.is_empty() {
                "-".to_owned()
            } else {
                grants.join(";")
            },
        ]);
    }
    table(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kedge_core::crd::member::NamespaceMapping;
    use kedge_core::crd::{MemberClusterSpec, MemberClusterStatus};
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn members_table_shows_state_versions_address_times_and_policy() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut m = MemberCluster::new(
            "edge-1",
            MemberClusterSpec {
                namespaces: vec!["apps".into(), "web".into()],
                namespace_mappings: vec![NamespaceMapping {
                    hub_namespace: "team-a".into(),
                    member_namespaces: vec!["shop".into()],
                }],
                ..Default::default()
            },
        );
        m.status = Some(MemberClusterStatus {
            state: Some("Ready".into()),
            agent_version: Some("0.1.0".into()),
            kubernetes_version: Some("v1.33.1".into()),
            address: Some("10.0.0.7:4433".into()),
            last_heartbeat_time: Some(kedge_core::time::from_unix_ms(999_995_000)),
            certificate_expiry: Some(kedge_core::time::from_unix_ms(1_000_000_000 + 7_200_000)),
            ..Default::default()
        });
        let never = MemberCluster::new("edge-2", MemberClusterSpec::default());
        let out = render_members(&[m, never], now);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("NAME"), "{out}");
        for cell in [
            "edge-1",
            "Ready",
            "0.1.0",
            "v1.33.1",
            "10.0.0.7:4433",
            "5s ago",
            "2h",
            "apps,web",
            "team-a->shop",
        ] {
            assert!(lines[1].contains(cell), "{cell} missing: {out}");
        }
        assert!(lines[2].starts_with("edge-2"), "{out}");
        assert!(lines[2].matches(" - ").count() >= 6, "{out}");
    }
}
