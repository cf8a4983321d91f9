//! `kubectl kedge mc`: the members registered on the hub (`MemberCluster`s), read and
//! deleted through the hub cluster's API with the caller's kubeconfig.

use std::path::PathBuf;
use std::time::SystemTime;

use clap::{Args, Subcommand};
use k8s_openapi::api::core::v1::Secret;
use kedge_core::crd::MemberCluster;
use kedge_core::crd::conditions::CONDITION_READY;
use kedge_core::crd::member::{MemberCapacity, MemberLink};
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
    /// The kubeconfig context of the hub cluster (as `kubectl --context`); default: the
    /// current context.
    #[arg(long, global = true)]
    pub context: Option<String>,
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
    #[command(after_help = "Examples:
  kubectl kedge mc setup-member edge-1 --namespaces shop,web --hub-address hub.example.com:7443 \\
    --member-kubeconfig edge-1.kubeconfig
  kubectl kedge mc setup-member edge-2 --namespaces shop --hub-address hub.example.com:7443 \\
    | kubectl --kubeconfig edge-2.kubeconfig apply -f -
  kubectl kedge mc setup-member edge-3 --namespaces shop --hub-address 10.0.0.5:7443 \\
    --hub-server-name kedge-hub --output helm-values > edge-3-values.yaml")]
    SetupMember(super::setup_member::SetupArgs),
    /// List members: state, versions, address, last heartbeat, certificate expiry, capacity
    /// and namespace policy; `-o wide` adds nodes, the Ready condition's message and why a
    /// `-` is unknown.
    #[command(after_help = "Examples:
  kubectl kedge mc list-members
  kubectl kedge mc list-members -o wide
  kubectl kedge mc --kubeconfig hub.kubeconfig list-members -o json
  kubectl kedge mc list-members --context mgmt")]
    ListMembers(ListArgs),
    /// Delete a member: the hub closes its session within a second and refuses its
    /// certificate from then on.
    #[command(after_help = "Examples:
  kubectl kedge mc delete-member edge-1
  kubectl kedge mc --hub-namespace kedge-system delete-member edge-1")]
    DeleteMember(DeleteArgs),
}

/// Arguments of `mc list-members`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Output format: table, wide (more columns) or json.
    #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "wide", "json"])]
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
    let client = kedge_net::kube_client::client_in(
        args.hub.kubeconfig.as_deref(),
        args.hub.context.as_deref(),
    )
    .await
    .map_err(|e| Error::HubCluster {
        what: "connecting to the hub cluster".into(),
        message: e.to_string(),
    })?;
    match &args.command {
        McCommand::ListMembers(list) => {
            // In pages, as kubectl reads (its --chunk-size): a fleet of 10,000 members is
            // not one response.
            let members = kedge_net::kube_client::list_paged(
                &Api::<MemberCluster>::all(client),
                &ListParams::default(),
                kedge_net::kube_client::LIST_PAGE,
                |m| m,
            )
            .await
            .map_err(|e| api_error("listing MemberClusters", e))?;
            if list.output == "json" {
                writeln!(out, "{}", serde_json::to_string_pretty(&members)?)?;
            } else {
                let wide = list.output == "wide";
                write!(out, "{}", render_members(&members, SystemTime::now(), wide))?;
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

/// Renders members as a table; `wide` adds nodes and a message saying why a cell is `-`.
pub fn render_members(members: &[MemberCluster], now: SystemTime, wide: bool) -> String {
    let mut header = vec![
        "NAME",
        "STATE",
        "AGENT",
        "KUBERNETES",
        "ADDRESS",
        "HEARTBEAT",
        "CERT-EXPIRES",
        "CPU",
        "MEMORY",
        "NAMESPACES",
        "GRANTS",
    ];
    if wide {
        header.extend(["RTT", "SENT", "RECEIVED", "B/S", "NODES", "MESSAGE"]);
    }
    let mut rows = vec![header.into_iter().map(String::from).collect()];
    rows.extend(members.iter().map(|m| member_row(m, now, wide)));
    table(&rows)
}

/// `-` for what the hub has not written.
fn dash(value: Option<&String>) -> String {
    value
        .filter(|s| !s.is_empty())
        .cloned()
        .unwrap_or_else(|| "-".into())
}

fn member_row(m: &MemberCluster, now: SystemTime, wide: bool) -> Vec<String> {
    let status = m.status.clone().unwrap_or_default();
    let capacity = status.capacity.as_ref();
    let grants: Vec<String> = m
        .spec
        .namespace_mappings
        .iter()
        .map(|g| format!("{}->{}", g.hub_namespace, g.member_namespaces.join("+")))
        .collect();
    let mut row = vec![
        dash(m.metadata.name.as_ref()),
        dash(status.state.as_ref()),
        dash(status.agent_version.as_ref()),
        dash(status.kubernetes_version.as_ref()),
        dash(status.address.as_ref()),
        status
            .last_heartbeat_time
            .as_ref()
            .map_or("-".into(), |t| sessions::ago(t.0.as_millisecond(), now)),
        status
            .certificate_expiry
            .as_ref()
            .map_or("-".into(), |t| sessions::expires(t.0.as_second(), now)),
        used_of(capacity, "cpu", cpu),
        used_of(capacity, "memory", memory),
        if m.spec.namespaces.is_empty() {
            "-".to_owned()
        } else {
            m.spec.namespaces.join(",")
        },
        if grants.is_empty() {
            "none".to_owned()
        } else {
            grants.join(";")
        },
    ];
    if wide {
        row.extend(link_cells(status.link.as_ref()));
        row.push(dash(
            capacity
                .and_then(|c| c.allocatable.get("nodes"))
                .map(|q| &q.0),
        ));
        row.push(message(m));
    }
    row
}

/// RTT, SENT, RECEIVED and B/S of the session's link: bytes the hub sent and received, and
/// what the session costs a second both ways together after its handshake (what a metered
/// link pays while kedge idles or works).
fn link_cells(link: Option<&MemberLink>) -> [String; 4] {
    let Some(link) = link else {
        return ["-".into(), "-".into(), "-".into(), "-".into()];
    };
    let seconds = match (&link.session_start, &link.observed_time) {
        (Some(start), Some(seen)) => {
            (seen.0.as_millisecond() - start.0.as_millisecond()) as f64 / 1000.0
        }
        _ => 0.0,
    };
    let after_handshake =
        (link.bytes_sent + link.bytes_received).saturating_sub(link.handshake_bytes);
    [
        format!("{}ms", link.rtt_milliseconds),
        bytes(link.bytes_sent),
        bytes(link.bytes_received),
        if seconds >= 1.0 {
            format!("{:.1}", after_handshake as f64 / seconds)
        } else {
            "-".into()
        },
    ]
}

/// Bytes as `B`, `KiB`, `MiB` or `GiB` with one decimal.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 3] = ["KiB", "MiB", "GiB"];
    if n < 1024 {
        return format!("{n}B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1}{}", UNITS[unit])
}

/// `requested/allocatable` of `resource`, each shown by `show`; `-` when not reported.
fn used_of(capacity: Option<&MemberCapacity>, resource: &str, show: fn(&str) -> String) -> String {
    let Some(capacity) = capacity else {
        return "-".into();
    };
    capacity
        .allocatable
        .get(resource)
        .map_or("-".into(), |total| {
            let used = capacity
                .allocated
                .get(resource)
                .map_or("0".into(), |q| show(&q.0));
            format!("{used}/{}", show(&total.0))
        })
}

/// The Ready condition's message, then why each `-` of the row is unknown.
fn message(m: &MemberCluster) -> String {
    let Some(status) = &m.status else {
        return "no status: the hub has not written one yet (is it running, and leading?)".into();
    };
    let mut parts: Vec<String> = status
        .conditions
        .iter()
        .filter(|c| c.type_ == CONDITION_READY && !c.message.is_empty())
        .map(|c| c.message.clone())
        .collect();
    let unknown = |v: &Option<String>| v.as_deref().is_none_or(str::is_empty);
    let never = status.agent_version.is_none() && status.last_heartbeat_time.is_none();
    if never {
        parts.push("agent, versions, address, times and capacity: no session yet".into());
    } else {
        if unknown(&status.kubernetes_version) {
            parts.push("KUBERNETES: the agent could not read the member's version".into());
        }
        if status.capacity.is_none() {
            parts.push("CPU, MEMORY: the agent has not reported capacity yet".into());
        }
    }
    if m.spec.namespaces.is_empty() {
        parts.push(
            "NAMESPACES: not recorded (setup-member --all-namespaces, or made by hand)".into(),
        );
    }
    parts.join("; ")
}

/// CPU as cores (`1.5`), from the hub's millicores (`1500m`) or any other form as written.
fn cpu(quantity: &str) -> String {
    match quantity.strip_suffix('m').map(str::parse::<u64>) {
        Some(Ok(millis)) if millis % 1000 == 0 => (millis / 1000).to_string(),
        Some(Ok(millis)) => format!("{:.1}", millis as f64 / 1000.0),
        _ => quantity.to_owned(),
    }
}

/// Memory in GiB (`96Gi`, `1.5Gi`) or, below 0.1 GiB, MiB, from the hub's bytes; as written
/// when not plain bytes.
fn memory(quantity: &str) -> String {
    const GIB: u64 = 1 << 30;
    match quantity.parse::<u64>() {
        Ok(0) => "0".into(),
        Ok(bytes) if bytes % GIB == 0 => format!("{}Gi", bytes / GIB),
        Ok(bytes) if bytes >= GIB / 10 => format!("{:.1}Gi", bytes as f64 / GIB as f64),
        Ok(bytes) => format!("{}Mi", bytes.div_ceil(1 << 20)),
        Err(_) => quantity.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
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
        let out = render_members(&[m, never], now, false);
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

    fn quantities(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, Quantity> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
            .collect()
    }

    #[test]
    fn capacity_is_shown_as_used_of_allocatable() {
        assert_eq!(cpu("24000m"), "24");
        assert_eq!(cpu("1500m"), "1.5");
        assert_eq!(cpu("2"), "2");
        assert_eq!(memory("103079215104"), "96Gi");
        assert_eq!(memory("1610612736"), "1.5Gi");
        assert_eq!(memory("52428800"), "50Mi");
        assert_eq!(memory("0"), "0");
        assert_eq!(memory("1Gi"), "1Gi");

        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut m = MemberCluster::new("edge-1", MemberClusterSpec::default());
        m.status = Some(MemberClusterStatus {
            state: Some("Ready".into()),
            agent_version: Some("0.1.0".into()),
            kubernetes_version: Some("v1.33.0".into()),
            capacity: Some(MemberCapacity {
                allocatable: quantities(&[
                    ("cpu", "24000m"),
                    ("memory", "103079215104"),
                    ("nodes", "3"),
                ]),
                allocated: quantities(&[("cpu", "1500m"), ("memory", "1610612736")]),
            }),
            conditions: vec![Condition {
                type_: CONDITION_READY.into(),
                status: "True".into(),
                message: "session 7 from 10.0.0.7:4433".into(),
                reason: "Connected".into(),
                last_transition_time: kedge_core::time::from_unix_ms(0),
                observed_generation: None,
            }],
            ..Default::default()
        });
        let out = render_members(std::slice::from_ref(&m), now, false);
        let row = out.lines().nth(1).unwrap();
        assert!(row.contains("1.5/24"), "{out}");
        assert!(row.contains("1.5Gi/96Gi"), "{out}");
        assert!(row.contains("none"), "no grants: {out}");
        assert!(!out.contains("NODES"), "{out}");

        let wide = render_members(&[m], now, true);
        let (header, row) = (wide.lines().next().unwrap(), wide.lines().nth(1).unwrap());
        assert!(
            header.contains("NODES") && header.ends_with("MESSAGE"),
            "{wide}"
        );
        assert!(row.contains(" 3 "), "{wide}");
        assert!(row.contains("session 7 from 10.0.0.7:4433"), "{wide}");
        assert!(header.contains("RTT") && header.contains("B/S"), "{wide}");
        assert!(row.contains("NAMESPACES: not recorded"), "{wide}");
    }

    #[test]
    fn wide_shows_what_the_link_carried_and_costs_after_its_handshake() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut m = MemberCluster::new("edge-1", MemberClusterSpec::default());
        m.status = Some(MemberClusterStatus {
            state: Some("Ready".into()),
            link: Some(MemberLink {
                session_start: Some(kedge_core::time::from_unix_ms(1_000_000)),
                observed_time: Some(kedge_core::time::from_unix_ms(1_100_000)),
                rtt_milliseconds: 612,
                bytes_sent: 5_000,
                bytes_received: 3 * 1024 * 1024,
                handshake_bytes: 1_000,
                ..Default::default()
            }),
            ..Default::default()
        });
        let wide = render_members(&[m], now, true);
        let row = wide.lines().nth(1).unwrap();
        // (5,000 + 3,145,728 - 1,000) bytes over 100 s.
        for cell in ["612ms", "4.9KiB", "3.0MiB", "31497.3"] {
            assert!(row.contains(cell), "{cell}: {wide}");
        }
        assert_eq!(bytes(0), "0B");
        assert_eq!(bytes(1023), "1023B");
        assert_eq!(bytes(5 << 30), "5.0GiB");
        assert_eq!(link_cells(None), ["-", "-", "-", "-"].map(String::from));
    }

    #[test]
    fn wide_says_why_a_cell_is_unknown() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let spec = MemberClusterSpec {
            namespaces: vec!["apps".into()],
            ..Default::default()
        };
        let unwritten = MemberCluster::new("edge-0", spec.clone());
        let mut pending = MemberCluster::new("edge-1", spec.clone());
        pending.status = Some(MemberClusterStatus {
            state: Some("Pending".into()),
            ..Default::default()
        });
        let mut blind = MemberCluster::new("edge-2", spec);
        blind.status = Some(MemberClusterStatus {
            state: Some("Ready".into()),
            agent_version: Some("0.1.0".into()),
            kubernetes_version: Some(String::new()),
            last_heartbeat_time: Some(kedge_core::time::from_unix_ms(999_999_000)),
            ..Default::default()
        });
        let out = render_members(&[unwritten, pending, blind], now, true);
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[1].contains("the hub has not written one yet"),
            "{out}"
        );
        assert!(lines[2].contains("no session yet"), "{out}");
        assert!(
            lines[3].contains("KUBERNETES: the agent could not read")
                && lines[3].contains("CPU, MEMORY: the agent has not reported"),
            "{out}"
        );
        assert!(!out.contains("NAMESPACES: not recorded"), "{out}");
    }
}
