//! What the live view draws: pure functions from what was read to the lines on screen.

use std::collections::BTreeMap;
use std::path::Path;

use kedge_core::crd::{DistributedScaledJob, DistributedScaledObject};
use kube::ResourceExt;
use serde_json::Value;

use super::tour::render_tour;
use super::{DSJ_NAME, DSO_NAME, INFERENCE_DSO_NAME};
use crate::fleet::{FleetFacts, HUB_CLUSTER};

/// What one frame shows, read once per second: the log lines written in the same second
/// take their counts from it too, so the log and the tables never disagree.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The example DSO (`nginx`).
    pub dso: Option<DistributedScaledObject>,
    /// The example DSJ (`queue-worker`).
    pub dsj: Option<DistributedScaledJob>,
    /// The inference DSO (`vllm`).
    pub inference: Option<DistributedScaledObject>,
    /// The requests waiting across the inference fleet.
    pub demand: u32,
    /// Each member's link as the hub reported it at this read.
    pub links: Vec<LinkSample>,
    /// The same a few reads earlier: traffic is the difference.
    pub links_before: Vec<LinkSample>,
    /// Members behind a link emulator, and its spec now.
    pub emulated: BTreeMap<String, String>,
}

/// One member's link at one read of the hub's `/v1/sessions`; counters are the current
/// session's, so they start over when the member reconnects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkSample {
    /// The member.
    pub member: String,
    /// Whether its session is up (`Connected`).
    pub connected: bool,
    /// Smoothed round-trip time, microseconds.
    pub rtt_us: u64,
    /// UDP payload bytes both ways.
    pub bytes: u64,
    /// Packets the hub declared lost.
    pub lost: u64,
    /// When the hub read these figures, Unix milliseconds.
    pub sampled_unix_ms: i64,
}

/// The links in a `/v1/sessions` answer; entries without a member are skipped.
pub fn link_samples(sessions: &[Value]) -> Vec<LinkSample> {
    sessions
        .iter()
        .filter_map(|s| {
            let link = &s["link"];
            let n = |key: &str| link[key].as_u64().unwrap_or(0);
            Some(LinkSample {
                member: s["member"].as_str()?.to_owned(),
                connected: s["state"] == "Connected",
                rtt_us: n("rttUs"),
                bytes: n("bytesSent") + n("bytesReceived"),
                lost: n("lostPackets"),
                sampled_unix_ms: link["sampledUnixMs"].as_i64().unwrap_or(0),
            })
        })
        .collect()
}

/// Bytes per second from `before` to `now`, if both are of the same session and time passed.
fn rate(now: &LinkSample, before: Option<&LinkSample>) -> Option<u64> {
    let before = before?;
    let ms = u64::try_from(now.sampled_unix_ms - before.sampled_unix_ms).ok()?;
    let bytes = now.bytes.checked_sub(before.bytes)?;
    (ms > 0).then(|| bytes * 1000 / ms)
}

/// "<1 ms", "612 ms".
fn rtt_text(rtt_us: u64) -> String {
    if rtt_us < 1000 {
        "<1 ms".into()
    } else {
        format!("{} ms", (rtt_us + 500) / 1000)
    }
}

/// "950 B/s", "3.4 kB/s".
fn rate_text(bytes_per_s: u64) -> String {
    if bytes_per_s < 1000 {
        format!("{bytes_per_s} B/s")
    } else {
        format!("{:.1} kB/s", bytes_per_s as f64 / 1000.0)
    }
}

/// Reads of `/v1/sessions` (one a second) the traffic column spans.
pub(super) const TRAFFIC_WINDOW: usize = 5;

/// The links' section: per member the round trip, the traffic both ways between the two
/// reads, the packets lost in this session, and the emulator's spec if it has one.
pub fn render_links(
    now: &[LinkSample],
    before: &[LinkSample],
    emulated: &BTreeMap<String, String>,
) -> String {
    let mut out =
        format!("links as the hub measures them (traffic both ways, last {TRAFFIC_WINDOW} s)\n");
    out.push_str(&format!(
        "{:<10} {:>7} {:>10} {:>5}  {}\n",
        "MEMBER", "RTT", "TRAFFIC", "LOST", "LINK"
    ));
    for link in now {
        let before = before.iter().find(|b| b.member == link.member);
        let (rtt, traffic) = if link.connected {
            let traffic = rate(link, before).map_or_else(|| "-".into(), rate_text);
            (rtt_text(link.rtt_us), traffic)
        } else {
            ("-".into(), "-".into())
        };
        let spec = match emulated.get(&link.member).map(String::as_str) {
            None => "direct",
            Some("rtt=0s") => "emulated, perfect",
            Some(spec) => spec,
        };
        out.push_str(&format!(
            "{:<10} {rtt:>7} {traffic:>10} {:>5}  {spec}\n",
            link.member, link.lost
        ));
    }
    out
}

impl Snapshot {
    /// The inference DSO's engines, as its section shows them.
    pub fn engines(&self) -> i32 {
        engines(self.inference.as_ref())
    }
}

/// Engines of the inference DSO: the total current replicas the hub reports. The one
/// source of the count in the inference section and in the log.
pub fn engines(inference: Option<&DistributedScaledObject>) -> i32 {
    inference
        .and_then(|dso| dso.status.as_ref())
        .map_or(0, |s| s.total_current_replicas)
}

/// Log lines a screen must have room for before the header shrinks to three lines.
const MIN_LOG_LINES: usize = 3;

/// The whole view: the fixed header, where the tour is (`round_t` seconds into a round),
/// the DSO, the DSJ, the inference DSO and the script's log, fitted to `screen` if drawn
/// on one.
pub fn render(
    facts: &FleetFacts,
    snapshot: &Snapshot,
    log: &[String],
    (t, round_t): (u64, u64),
    screen: Option<Screen>,
) -> String {
    let body = render_body(snapshot, round_t);
    let full = format!("{}\n{body}", render_header(facts, t));
    // The full header while the newest few log lines still fit below the tables.
    let fits = |text: &str, screen: Screen| {
        let rows: usize = text.lines().map(|l| screen.height(l)).sum();
        rows + log.len().min(MIN_LOG_LINES) < screen.rows
    };
    let top = match screen {
        Some(screen) if !fits(&full, screen) => {
            format!("{}\n{body}", render_short_header(facts, t))
        }
        _ => full,
    };
    fit(&top, log, screen)
}

/// Everything below the header, up to the log's title.
fn render_body(snapshot: &Snapshot, round_t: u64) -> String {
    let mut out = render_tour(round_t);
    out.push('\n');
    out.push_str(&render_dso(snapshot.dso.as_ref()));
    out.push('\n');
    if !snapshot.links.is_empty() {
        let links = &snapshot.links;
        out.push_str(&render_links(
            links,
            &snapshot.links_before,
            &snapshot.emulated,
        ));
        out.push('\n');
    }
    out.push_str(&render_dsj(snapshot.dsj.as_ref()));
    out.push('\n');
    out.push_str(&render_inference(
        snapshot.inference.as_ref(),
        snapshot.demand,
    ));
    out.push_str("\nwhat happened:\n");
    out
}

/// The terminal the view is drawn on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Screen {
    /// Rows.
    pub rows: usize,
    /// Columns: a longer line wraps onto more rows.
    pub cols: usize,
}

impl Screen {
    /// Rows `line` takes.
    fn height(self, line: &str) -> usize {
        line.chars().count().max(1).div_ceil(self.cols.max(1))
    }
}

/// `top` and then the newest `log` lines that fit on `screen`, one row left for the cursor,
/// so the terminal never scrolls the header away; a `top` taller than the screen loses its
/// last lines, not its first. Without a screen, everything.
fn fit(top: &str, log: &[String], screen: Option<Screen>) -> String {
    let Some(screen) = screen else {
        let mut out = top.to_owned();
        for line in log {
            out.push_str(line);
            out.push('\n');
        }
        return out;
    };
    let mut room = screen.rows.saturating_sub(1);
    let mut out = String::new();
    for line in top.lines() {
        let height = screen.height(line);
        if height > room {
            return out;
        }
        room -= height;
        out.push_str(line);
        out.push('\n');
    }
    let newest: Vec<&String> = log
        .iter()
        .rev()
        .take_while(|line| {
            let height = screen.height(line);
            let fits = height <= room;
            room = room.saturating_sub(height);
            fits
        })
        .collect();
    for line in newest.into_iter().rev() {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The header in three lines, for a screen too short for the whole view: where the
/// kubeconfigs, the ops endpoint, the logs and `fleet.env` are.
pub fn render_short_header(facts: &FleetFacts, t: u64) -> String {
    let members = match facts.members.len() {
        0 => String::new(),
        1 => facts.kubeconfig(&facts.members[0]).display().to_string(),
        n => facts
            .kubeconfig(&format!("member-{{1..{n}}}"))
            .display()
            .to_string(),
    };
    format!(
        "kedge fleet demo  t={t}s  (Ctrl-C to stop; a taller terminal shows commands to try)\n\
         hub {}   ops {}   logs {}/\n\
         members {members}   all in {}\n{}",
        facts.kubeconfig(HUB_CLUSTER).display(),
        facts.ops_url,
        facts.logs().display(),
        facts.env_file().display(),
        dashboard_line(facts),
    )
}

/// The dashboard's URL, when the fleet runs one (`kubectl kedge dashboard`).
fn dashboard_line(facts: &FleetFacts) -> String {
    facts
        .dashboard_url
        .as_ref()
        .map(|url| {
            format!("dashboard {url}   (open it in a browser: every scene shows there too)\n")
        })
        .unwrap_or_default()
}

/// Commands to try in another terminal while the fleet runs.
pub fn next_commands(facts: &FleetFacts) -> Vec<String> {
    let hub = facts.kubeconfig(HUB_CLUSTER).display().to_string();
    let mut commands = vec![
        format!("kubectl --kubeconfig {hub} get dso,dsj"),
        format!("kubectl --kubeconfig {hub} describe dsj {DSJ_NAME}"),
    ];
    if let Some(member) = facts.members.first() {
        let kubeconfig = facts.kubeconfig(member).display().to_string();
        commands.push(format!("kubectl --kubeconfig {kubeconfig} get deploy,jobs"));
    }
    let plugin = format!("PATH={}:$PATH kubectl kedge", facts.bin_dir.display());
    commands.push(format!("{plugin} mc list-members --kubeconfig {hub}"));
    commands.push(format!("{plugin} sessions --hub {}", facts.ops_url));
    commands
}

/// The header every frame starts with: where the kubeconfigs, the hub's ops endpoint and
/// the logs are, and what to try.
pub fn render_header(facts: &FleetFacts, t: u64) -> String {
    let path = |p: &Path| p.display().to_string();
    let mut out = format!("kedge fleet demo  t={t}s  (Ctrl-C to stop)\n");
    out.push_str(&format!(
        "hub       {}   ops {}   logs {}/\n",
        path(&facts.kubeconfig(HUB_CLUSTER)),
        facts.ops_url,
        path(&facts.logs()),
    ));
    let members: Vec<String> = facts
        .members
        .iter()
        .map(|m| path(&facts.kubeconfig(m)))
        .collect();
    out.push_str(&format!("members   {}\n", members.join("  ")));
    out.push_str(&format!(
        "all this  {} (KEY=VALUE, for another terminal)\n",
        path(&facts.env_file())
    ));
    out.push_str(&dashboard_line(facts));
    for (i, command) in next_commands(facts).iter().enumerate() {
        let label = if i == 0 { "try" } else { "" };
        out.push_str(&format!("{label:<9} {command}\n"));
    }
    out
}

/// A bar of `n` blocks, at most 40.
fn bar(block: &str, n: i32) -> String {
    block.repeat(n.clamp(0, 40) as usize)
}

/// The DSO's section: totals, then desired and current replicas per member.
pub fn render_dso(dso: Option<&DistributedScaledObject>) -> String {
    let Some(dso) = dso else {
        return format!("waiting for DistributedScaledObject default/{DSO_NAME}...\n");
    };
    let status = dso.status.clone().unwrap_or_default();
    let mut out = format!(
        "dso/{}  desired total {}   current total {}   healthy members {}/{}\n\n",
        dso.name_any(),
        dso.spec
            .total_target_replicas
            .map_or_else(|| "(not set yet)".to_owned(), |t| t.to_string()),
        status.total_current_replicas,
        status.members_healthy_count,
        status.members_total_count
    );
    out.push_str(&format!(
        "{:<10} {:<12} {:>7} {:>7}  {}\n",
        "MEMBER", "STATE", "DESIRED", "CURRENT", "REPLICAS"
    ));
    for (member, s) in &status.member_cluster_statuses {
        out.push_str(&format!(
            "{:<10} {:<12} {:>7} {:>7}  {}\n",
            member,
            s.state.as_deref().unwrap_or("-"),
            s.desired_replicas,
            s.current_replicas,
            bar("█", s.current_replicas)
        ));
    }
    out
}

/// The inference scene's section: the queue, the fleet's per-engine average the hub serves
/// KEDA, and the engines per member with the pods each counted or missed.
pub fn render_inference(dso: Option<&DistributedScaledObject>, demand: u32) -> String {
    let Some(dso) = dso else {
        return format!("waiting for DistributedScaledObject default/{INFERENCE_DSO_NAME}...\n");
    };
    let status = dso.status.clone().unwrap_or_default();
    let reading = status.pod_metrics.first();
    let mut out = format!(
        "dso/{} (kedge-pod-metrics)  {} requests waiting   average {} per engine (target {})   engines {}\n\n",
        dso.name_any(),
        demand,
        reading
            .and_then(|r| r.average.clone())
            .unwrap_or_else(|| "-".into()),
        reading.map_or("-", |r| r.threshold.as_str()),
        engines(Some(dso)),
    );
    out.push_str(&format!(
        "{:<10} {:<12} {:>7} {:>7} {:>7}  {}\n",
        "MEMBER", "STATE", "ENGINES", "COUNTED", "MISSING", "ENGINES"
    ));
    for (member, s) in &status.member_cluster_statuses {
        let part = reading.and_then(|r| r.members.get(member));
        out.push_str(&format!(
            "{:<10} {:<12} {:>7} {:>7} {:>7}  {}\n",
            member,
            s.state.as_deref().unwrap_or("-"),
            s.current_replicas,
            part.map_or(0, |p| p.pods_counted),
            part.map_or(0, |p| p.pods_missing),
            bar("▓", s.current_replicas)
        ));
    }
    out
}

/// The DSJ's section: the trigger, Job totals, then per member the Jobs running (█) and
/// pending (░), stuck Jobs and the member's taint.
pub fn render_dsj(dsj: Option<&DistributedScaledJob>) -> String {
    let Some(dsj) = dsj else {
        return format!("waiting for DistributedScaledJob default/{DSJ_NAME}...\n");
    };
    let status = dsj.status.clone().unwrap_or_default();
    let mut out = format!(
        "dsj/{}  desired {}   running {}   pending {}\n",
        dsj.name_any(),
        status.desired_jobs,
        status.running_jobs,
        status.pending_jobs
    );
    for trigger in &status.trigger_metrics_status {
        out.push_str(&format!(
            "trigger {}: {} ({})\n",
            trigger.name,
            trigger.state,
            trigger.info.as_deref().unwrap_or("-")
        ));
    }
    out.push_str(&format!(
        "\n{:<10} {:<12} {:>7} {:>7} {:>5} {:<5}  {}\n",
        "MEMBER", "STATE", "RUNNING", "PENDING", "STUCK", "TAINT", "JOBS (█ running, ░ pending)"
    ));
    for (member, s) in &status.member_cluster_statuses {
        let taint = if s.hard_tainted {
            "hard"
        } else if s.soft_tainted {
            "soft"
        } else {
            "-"
        };
        // runningJobs counts every non-terminal Job, pending ones included.
        let started = s.running_jobs - s.pending_jobs;
        out.push_str(&format!(
            "{:<10} {:<12} {:>7} {:>7} {:>5} {:<5}  {}{}\n",
            member,
            s.state.as_deref().unwrap_or("-"),
            s.running_jobs,
            s.pending_jobs,
            s.stuck_jobs,
            taint,
            bar("█", started),
            bar("░", s.pending_jobs)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use kedge_core::crd::dsj::{DsjMemberClusterStatus, TriggerMetricStatus};
    use kedge_core::crd::{DistributedScaledJobSpec, DistributedScaledJobStatus};

    use super::super::VLLM_DSO_YAML;
    use super::*;

    fn member(state: &str, running: i32, pending: i32, stuck: i32) -> DsjMemberClusterStatus {
        DsjMemberClusterStatus {
            state: Some(state.to_owned()),
            running_jobs: running,
            pending_jobs: pending,
            stuck_jobs: stuck,
            ..DsjMemberClusterStatus::default()
        }
    }

    /// The example DSJ as the hub reports it while member-2's Jobs are stuck.
    fn dsj() -> DistributedScaledJob {
        let mut dsj = DistributedScaledJob::new(DSJ_NAME, DistributedScaledJobSpec::default());
        let soft = DsjMemberClusterStatus {
            soft_tainted: true,
            ..member("Ready", 3, 3, 3)
        };
        let hard = DsjMemberClusterStatus {
            hard_tainted: true,
            excluded: true,
            ..member("Unreachable", 7, 1, 0)
        };
        dsj.status = Some(DistributedScaledJobStatus {
            desired_jobs: 10,
            running_jobs: 12,
            pending_jobs: 4,
            member_cluster_statuses: BTreeMap::from([
                ("member-1".to_owned(), member("Ready", 2, 0, 0)),
                ("member-2".to_owned(), soft),
                ("member-3".to_owned(), hard),
            ]),
            trigger_metrics_status: vec![TriggerMetricStatus {
                name: "queue".into(),
                state: "Active".into(),
                info: Some("value 10 / target 1".into()),
                last_change_time: None,
            }],
            ..DistributedScaledJobStatus::default()
        });
        dsj
    }

    fn line_of<'a>(text: &'a str, start: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line starting with {start:?} in\n{text}"))
    }

    #[test]
    fn dsj_section_shows_totals_trigger_and_each_member() {
        let text = render_dsj(Some(&dsj()));
        assert_eq!(
            line_of(&text, "dsj/"),
            "dsj/queue-worker  desired 10   running 12   pending 4"
        );
        assert_eq!(
            line_of(&text, "trigger"),
            "trigger queue: Active (value 10 / target 1)"
        );
        let columns = |member: &str| -> Vec<String> {
            line_of(&text, member)
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        };
        // MEMBER STATE RUNNING PENDING STUCK TAINT BAR; running counts pending Jobs too, so
        // the bar has one block per Job: █ started, ░ pending.
        assert_eq!(
            columns("member-1"),
            ["member-1", "Ready", "2", "0", "0", "-", "██"]
        );
        assert_eq!(
            columns("member-2"),
            ["member-2", "Ready", "3", "3", "3", "soft", "░░░"]
        );
        assert_eq!(
            columns("member-3"),
            ["member-3", "Unreachable", "7", "1", "0", "hard", "██████░"]
        );
    }

    #[test]
    fn dsj_section_without_status_or_object() {
        let fresh = DistributedScaledJob::new(DSJ_NAME, DistributedScaledJobSpec::default());
        let text = render_dsj(Some(&fresh));
        assert!(text.starts_with("dsj/queue-worker  desired 0   running 0   pending 0\n"));
        assert!(!text.contains("member-"), "{text}");
        assert_eq!(
            render_dsj(None),
            "waiting for DistributedScaledJob default/queue-worker...\n"
        );
    }

    fn facts() -> FleetFacts {
        FleetFacts {
            dir: ".kedge-fleet".into(),
            bin_dir: "target/debug".into(),
            members: vec!["member-1".into(), "member-2".into(), "member-3".into()],
            ops_url: "http://127.0.0.1:41000".into(),
            hub_addr: "127.0.0.1:41001".into(),
            scaler_addr: "127.0.0.1:41002".into(),
            dashboard_url: Some("http://127.0.0.1:41003/".into()),
        }
    }

    #[test]
    fn view_puts_the_dsj_below_the_dso_and_the_log_last() {
        let log = vec!["[  3s] queue 10".to_owned()];
        let snapshot = Snapshot {
            dsj: Some(dsj()),
            ..Snapshot::default()
        };
        let text = render(&facts(), &snapshot, &log, (7, 7), None);
        assert!(text.starts_with("kedge fleet demo  t=7s"), "{text}");
        let tour = text.find("scene 1/5").unwrap_or(usize::MAX);
        let dso = text.find("DistributedScaledObject").unwrap_or(usize::MAX);
        let dsj = text.find("dsj/queue-worker").unwrap_or(usize::MAX);
        let log = text.find("[  3s] queue 10").unwrap_or(usize::MAX);
        assert!(tour < dso && dso < dsj && dsj < log, "{text}");
    }

    #[test]
    fn the_header_names_every_kubeconfig_the_ops_url_the_logs_and_the_fleet_file() {
        let text = render_header(&facts(), 12);
        for path in [
            ".kedge-fleet/hub.kubeconfig",
            ".kedge-fleet/member-1.kubeconfig",
            ".kedge-fleet/member-2.kubeconfig",
            ".kedge-fleet/member-3.kubeconfig",
            "http://127.0.0.1:41000",
            ".kedge-fleet/logs/",
            ".kedge-fleet/fleet.env",
            "dashboard http://127.0.0.1:41003/",
        ] {
            assert!(text.contains(path), "no {path} in\n{text}");
        }
        let tries: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("try"))
            .map(|l| l.trim_start_matches("try").trim())
            .collect();
        assert_eq!(tries, next_commands(&facts()));
        assert_eq!(
            tries,
            [
                "kubectl --kubeconfig .kedge-fleet/hub.kubeconfig get dso,dsj",
                "kubectl --kubeconfig .kedge-fleet/hub.kubeconfig describe dsj queue-worker",
                "kubectl --kubeconfig .kedge-fleet/member-1.kubeconfig get deploy,jobs",
                "PATH=target/debug:$PATH kubectl kedge mc list-members --kubeconfig .kedge-fleet/hub.kubeconfig",
                "PATH=target/debug:$PATH kubectl kedge sessions --hub http://127.0.0.1:41000",
            ]
        );
        // The header is the top of every frame.
        assert!(render(&facts(), &Snapshot::default(), &[], (12, 12), None).starts_with(&text));
    }

    #[test]
    fn the_short_header_names_the_kubeconfigs_the_ops_url_and_the_fleet_file() {
        assert_eq!(
            render_short_header(&facts(), 3),
            "kedge fleet demo  t=3s  (Ctrl-C to stop; a taller terminal shows commands to try)\n\
             hub .kedge-fleet/hub.kubeconfig   ops http://127.0.0.1:41000   logs .kedge-fleet/logs/\n\
             members .kedge-fleet/member-{1..3}.kubeconfig   all in .kedge-fleet/fleet.env\n\
             dashboard http://127.0.0.1:41003/   (open it in a browser: every scene shows there too)\n"
        );
    }

    #[test]
    fn the_engines_in_the_log_are_the_engines_in_the_table() {
        let snapshot = Snapshot {
            inference: Some(inference()),
            demand: 80,
            ..Snapshot::default()
        };
        let step = &super::super::tour::SCRIPT[5];
        let log = vec![super::super::tour::log_line(21, step, snapshot.engines())];
        let text = render(&facts(), &snapshot, &log, (21, 21), None);
        assert!(
            text.contains("   engines 5\n"),
            "the table shows 5 engines:\n{text}"
        );
        assert!(
            text.contains("[ 21s] inference: 80 waiting on 5 engines → "),
            "the log shows the same 5:\n{text}"
        );
        let table: i32 = line_of(&text, "member-1")
            .split_whitespace()
            .nth(2)
            .and_then(|n| n.parse().ok())
            .unwrap_or(-1);
        let table = table
            + line_of(&text, "member-3")
                .split_whitespace()
                .nth(2)
                .and_then(|n| n.parse::<i32>().ok())
                .unwrap_or(-1);
        assert_eq!(table, snapshot.engines(), "{text}");
    }

    /// The inference DSO with 5 engines: 3 in member-1, 2 in member-3 (cut off).
    fn inference() -> DistributedScaledObject {
        use kedge_core::crd::dso::{
            DistributedScaledObjectStatus, DsoMemberClusterStatus, PodMetricsMemberStatus,
            PodMetricsStatus,
        };
        let mut dso: DistributedScaledObject = serde_yaml::from_str(VLLM_DSO_YAML).unwrap();
        let member = |state: &str, current: i32| DsoMemberClusterStatus {
            state: Some(state.into()),
            current_replicas: current,
            ..DsoMemberClusterStatus::default()
        };
        let part = |counted: i64, missing: i64| PodMetricsMemberStatus {
            pods_counted: counted,
            pods_missing: missing,
            ..PodMetricsMemberStatus::default()
        };
        dso.status = Some(DistributedScaledObjectStatus {
            total_current_replicas: 5,
            member_cluster_statuses: BTreeMap::from([
                ("member-1".to_owned(), member("Ready", 3)),
                ("member-3".to_owned(), member("Unreachable", 2)),
            ]),
            pod_metrics: vec![PodMetricsStatus {
                threshold: "10".into(),
                average: Some("11.2".into()),
                members: BTreeMap::from([
                    ("member-1".to_owned(), part(3, 0)),
                    ("member-3".to_owned(), part(0, 2)),
                ]),
                ..PodMetricsStatus::default()
            }],
            ..DistributedScaledObjectStatus::default()
        });
        dso
    }

    #[test]
    fn the_inference_section_shows_the_queue_the_average_and_each_members_engines() {
        let dso = inference();
        let text = render_inference(Some(&dso), 40);
        assert_eq!(
            line_of(&text, "dso/"),
            "dso/vllm (kedge-pod-metrics)  40 requests waiting   average 11.2 per engine (target 10)   engines 5"
        );
        let columns = |m: &str| {
            line_of(&text, m)
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            columns("member-1"),
            ["member-1", "Ready", "3", "3", "0", "▓▓▓"]
        );
        assert_eq!(
            columns("member-3"),
            ["member-3", "Unreachable", "2", "0", "2", "▓▓"]
        );
        assert_eq!(
            render_inference(None, 0),
            "waiting for DistributedScaledObject default/vllm...\n"
        );
    }

    #[test]
    fn a_small_screen_keeps_the_header_and_the_newest_log_lines() {
        let log: Vec<String> = (1..=8).map(|i| format!("[  {i}s] step {i}")).collect();
        let full = render(&facts(), &Snapshot::default(), &log, (9, 9), None);
        let header = render_header(&facts(), 9);
        let lines = |text: &str| text.lines().count();
        // Room for all but 5 log lines (one row stays free for the cursor).
        let rows = lines(&full) - 5 + 1;
        let wide = Screen { rows, cols: 500 };
        let text = render(&facts(), &Snapshot::default(), &log, (9, 9), Some(wide));
        assert!(text.starts_with(&header), "{text}");
        assert_eq!(lines(&text), rows - 1);
        assert!(
            text.ends_with("[  6s] step 6\n[  7s] step 7\n[  8s] step 8\n"),
            "{text}"
        );
        assert!(!text.contains("step 5"), "{text}");
        // A screen too short for the full header gets the short one; long lines wrap, so
        // on 40 columns fewer of them fit, and the header still comes first.
        let narrow = Screen { rows: 20, cols: 40 };
        let text = render(&facts(), &Snapshot::default(), &log, (9, 9), Some(narrow));
        let used: usize = text.lines().map(|l| narrow.height(l)).sum();
        assert!(used < 20, "{used} rows:\n{text}");
        assert!(
            text.starts_with(&render_short_header(&facts(), 9)),
            "{text}"
        );
        // Room for the full header and tables but not 3 log lines: the short header, and the
        // 6 rows it saves go to the log.
        let rows = lines(&full) - log.len() + 2;
        let short = render(
            &facts(),
            &Snapshot::default(),
            &log,
            (9, 9),
            Some(Screen { rows, cols: 500 }),
        );
        assert!(
            short.starts_with(&render_short_header(&facts(), 9)),
            "{short}"
        );
        assert!(short.contains("scene 1/5"), "{short}");
        assert!(short.ends_with("[  8s] step 8\n"), "{short}");
        assert_eq!(lines(&short), rows - 1, "{short}");
        assert_eq!(fit("a\nb\n", &log, Some(Screen { rows: 0, cols: 80 })), "");
    }

    fn sample(member: &str, bytes: u64, sampled_unix_ms: i64) -> LinkSample {
        LinkSample {
            member: member.into(),
            connected: true,
            rtt_us: 612_400,
            bytes,
            lost: 7,
            sampled_unix_ms,
        }
    }

    #[test]
    fn link_samples_read_the_sessions_the_hub_reports() {
        let sessions: Vec<Value> = serde_json::from_str(
            r#"[{"member": "member-1", "state": "Connected", "sessions": 1,
                 "link": {"bytesSent": 900, "bytesReceived": 100, "packetsSent": 9,
                          "packetsReceived": 3, "lostPackets": 2, "rttUs": 412,
                          "handshakeBytes": 5000, "migrations": 0, "sampledUnixMs": 1000}},
                {"member": "member-2", "state": "Disconnected"},
                {"state": "Connected"}]"#,
        )
        .unwrap();
        assert_eq!(
            link_samples(&sessions),
            [
                LinkSample {
                    member: "member-1".into(),
                    connected: true,
                    rtt_us: 412,
                    bytes: 1000,
                    lost: 2,
                    sampled_unix_ms: 1000,
                },
                LinkSample {
                    member: "member-2".into(),
                    ..LinkSample::default()
                },
            ]
        );
    }

    #[test]
    fn the_links_section_shows_rtt_traffic_lost_and_the_emulated_spec() {
        let now = vec![
            LinkSample {
                rtt_us: 300,
                ..sample("member-1", 9_000, 6_000)
            },
            sample("member-2", 1_500, 6_000),
            sample("member-3", 20_000, 6_000),
            LinkSample {
                connected: false,
                ..sample("member-4", 0, 6_000)
            },
        ];
        // member-2 reconnected since (its counters started over): no rate.
        let before = vec![
            sample("member-1", 4_000, 1_000),
            sample("member-2", 2_000, 1_000),
            sample("member-3", 3_000, 1_000),
        ];
        let emulated = BTreeMap::from([
            ("member-1".to_owned(), "rtt=0s".to_owned()),
            (
                "member-3".to_owned(),
                "rtt=600ms,jitter=50ms,loss=5,rate=64kbit".to_owned(),
            ),
        ]);
        let text = render_links(&now, &before, &emulated);
        assert_eq!(
            text,
            "links as the hub measures them (traffic both ways, last 5 s)\n\
             MEMBER         RTT    TRAFFIC  LOST  LINK\n\
             member-1     <1 ms   1.0 kB/s     7  emulated, perfect\n\
             member-2    612 ms          -     7  direct\n\
             member-3    612 ms   3.4 kB/s     7  rtt=600ms,jitter=50ms,loss=5,rate=64kbit\n\
             member-4         -          -     7  direct\n"
        );
        assert!(text.lines().all(|l| l.chars().count() <= 80), "{text}");
        assert_eq!(rate_text(950), "950 B/s");
        assert_eq!(rate(&now[0], Some(&now[0])), None, "no time passed");
        assert_eq!(rate(&now[0], None), None);
    }

    #[test]
    fn the_links_sit_below_the_dso_when_the_hub_reported_them() {
        let snapshot = Snapshot {
            links: vec![sample("member-1", 0, 0)],
            ..Snapshot::default()
        };
        let text = render(&facts(), &snapshot, &[], (3, 3), None);
        let dso = text.find("DistributedScaledObject").unwrap_or(usize::MAX);
        let links = text.find("links as the hub").unwrap_or(usize::MAX);
        let dsj = text.find("DistributedScaledJob").unwrap_or(usize::MAX);
        assert!(dso < links && links < dsj, "{text}");
        let none = render(&facts(), &Snapshot::default(), &[], (3, 3), None);
        assert!(!none.contains("links as the hub"), "{none}");
    }

    #[test]
    fn bars_are_capped() {
        assert_eq!(bar("█", -1), "");
        assert_eq!(bar("░", 100).chars().count(), 40);
    }
}
