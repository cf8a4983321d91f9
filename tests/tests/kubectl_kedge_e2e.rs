//! The real `kubectl-kedge` binary as a newcomer meets it: output piped into a reader that
//! stops early (`kubectl kedge crds | head`) ends quietly and successfully; `sessions` says
//! where it looked and how to point it elsewhere; and on a real enrolled fleet (kedge-sim,
//! the real hub and agents) `mc list-members` fills every column and `sessions` finds the
//! hub from the hub's own variable.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use kedge_sim::fleet::{Fleet, FleetConfig};
use support::{bin, wait_for};

/// A repository file, from the tests crate's directory.
fn repo(path: &str) -> String {
    format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"))
}

/// Runs `kubectl-kedge args` with its standard output a pipe whose reader is already gone.
fn into_closed_pipe(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Command::new(bin("kubectl-kedge"))
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

fn assert_quiet_success(what: &str, out: &Output) {
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{what}: {:?}, stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_reader_that_stops_early_ends_the_command_quietly() {
    // `kubectl kedge crds | head -1`: 300 KB, far more than a pipe holds, so the command is
    // still writing when the reader goes.
    let mut child = Command::new(bin("kubectl-kedge"))
        .arg("crds")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert_eq!(first, "---\n");
    let out = child.wait_with_output().unwrap();
    assert_quiet_success("crds | head -1", &out);

    let scenario = repo("deploy/examples/simulate/dso-failover.yaml");
    for args in [
        vec!["crds"],
        vec!["install", "hub"],
        vec!["install", "hub", "-o", "helm-values"],
        vec!["uninstall", "hub", "--include-crds"],
        vec!["uninstall", "agent", "--namespaces", "shop"],
        vec!["simulate", "-f", &scenario],
        vec!["simulate", "-f", &scenario, "-o", "json"],
        vec!["--help"],
        vec!["mc", "list-members", "--help"],
    ] {
        assert_quiet_success(&args.join(" "), &into_closed_pipe(&args));
    }
    // A real failure still fails loudly.
    let out = into_closed_pipe(&["simulate", "-f", "no-such-file.yaml"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-file.yaml"));
}

#[test]
fn sessions_says_where_it_looked_and_how_to_point_elsewhere() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = Command::new(bin("kubectl-kedge"))
        .arg("sessions")
        .env_remove("KEDGE_HUB_OPS_URL")
        .env("KEDGE_HUB_OPS_LISTEN", format!("0.0.0.0:{port}"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    for expected in [
        &format!("http://127.0.0.1:{port}/v1/sessions") as &str,
        &format!("from KEDGE_HUB_OPS_LISTEN=0.0.0.0:{port}"),
        "onnection refused",
        "--hub URL or KEDGE_HUB_OPS_URL",
        "port-forward deploy/kedge-hub 8080",
    ] {
        assert!(said.contains(expected), "{expected:?} missing: {said}");
    }
}

/// Splits a kubectl-style table into rows of `(column, cell)`, by the columns of its header
/// (the cells are ASCII, so bytes and the characters the table pads by agree).
fn cells(table: &str) -> Vec<Vec<(String, String)>> {
    let mut lines = table.lines();
    let header = lines.next().unwrap();
    let starts: Vec<usize> = header
        .char_indices()
        .filter(|&(i, c)| c != ' ' && (i == 0 || header.as_bytes()[i - 1] == b' '))
        .map(|(i, _)| i)
        .collect();
    let cell = |line: &str, i: usize| {
        let from = starts[i].min(line.len());
        let to = starts.get(i + 1).map_or(line.len(), |&s| s.min(line.len()));
        line[from..to].trim().to_owned()
    };
    lines
        .map(|line| {
            (0..starts.len())
                .map(|i| (cell(header, i), cell(line, i)))
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_an_enrolled_fleet_every_member_column_is_filled() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = FleetConfig::new(2, dir.path().to_owned()).unwrap();
    // Tests run from target/<profile>/deps; the binaries are one level up.
    if config.bin_dir.ends_with("deps") {
        config.bin_dir.pop();
    }
    let fleet = Fleet::up(config).await.expect("fleet up");
    let hub_kubeconfig = fleet.kubeconfig("hub");
    let kedge = |args: &[&str]| {
        let mut command = tokio::process::Command::new(bin("kubectl-kedge"));
        command
            .args(args)
            .env("KUBECONFIG", &hub_kubeconfig)
            .env_remove("KEDGE_HUB_OPS_URL")
            .env_remove("KEDGE_HUB_OPS_LISTEN");
        command
    };

    // Capacity arrives with the agents' first reports; wait until the hub has written it.
    let wide = wait_for(
        Duration::from_secs(60),
        "list-members -o wide with every column filled",
        || async {
            let out = kedge(&["mc", "list-members", "-o", "wide"])
                .output()
                .await
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let table = String::from_utf8(out.stdout).unwrap();
            let rows = cells(&table);
            (rows.len() == 2
                && rows
                    .iter()
                    .flatten()
                    .all(|(_, value)| !value.is_empty() && value != "-"))
            .then_some(table)
        },
    )
    .await;
    eprintln!("{wide}");
    let rows = cells(&wide);
    for (row, member) in rows.iter().zip(["member-1", "member-2"]) {
        let cell = |column: &str| {
            row.iter()
                .find(|(c, _)| c == column)
                .map(|(_, v)| v.as_str())
                .unwrap()
        };
        assert_eq!(cell("NAME"), member);
        assert_eq!(cell("STATE"), "Ready");
        assert!(cell("KUBERNETES").starts_with("v1."), "{wide}");
        assert!(cell("ADDRESS").starts_with("127.0.0.1:"), "{wide}");
        assert!(cell("CPU").contains('/'), "{wide}");
        assert_eq!(cell("NAMESPACES"), "default");
        assert_eq!(cell("GRANTS"), "none");
        assert!(cell("MESSAGE").starts_with("session "), "{wide}");
    }
    // The default table has the same columns but NODES and MESSAGE, all filled as well.
    let out = kedge(&["mc", "list-members"]).output().await.unwrap();
    let table = String::from_utf8(out.stdout).unwrap();
    for row in cells(&table) {
        assert_eq!(row.len(), 11, "{table}");
        assert!(
            row.iter().all(|(_, v)| !v.is_empty() && v != "-"),
            "{table}"
        );
    }

    // A listing piped into a reader that is gone ends quietly, like the offline commands.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = kedge(&["mc", "list-members"])
        .stdout(writer)
        .output()
        .await
        .unwrap();
    assert_quiet_success("mc list-members into a closed pipe", &out);

    // `sessions` finds the hub from the hub's own variable (an unspecified address, as in a
    // cluster, is asked on loopback), and from KEDGE_HUB_OPS_URL.
    let port = fleet.ops_url().rsplit(':').next().unwrap().to_owned();
    for (variable, value) in [
        ("KEDGE_HUB_OPS_LISTEN", format!("0.0.0.0:{port}")),
        ("KEDGE_HUB_OPS_URL", fleet.ops_url()),
    ] {
        let out = kedge(&["sessions"])
            .env(variable, &value)
            .output()
            .await
            .unwrap();
        let listed = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{variable}={value}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            listed.lines().filter(|l| l.contains("Connected")).count(),
            2,
            "{listed}"
        );
    }

    // `--context` picks the hub cluster from a kubeconfig whose current context is a member,
    // as `kubectl --context` does.
    let all = dir.path().join("kubeconfig");
    let use_member = std::process::Command::new("/usr/bin/kubectl")
        .arg("--kubeconfig")
        .arg(&all)
        .args(["config", "use-context", "member-1"])
        .output()
        .unwrap();
    assert!(use_member.status.success());
    let in_all = |args: &[&str]| {
        let mut command = tokio::process::Command::new(bin("kubectl-kedge"));
        command.args(args).env("KUBECONFIG", &all);
        command
    };
    let out = in_all(&["mc", "list-members"]).output().await.unwrap();
    assert!(
        !out.status.success(),
        "a member cluster has no MemberClusters to list"
    );
    let out = in_all(&["mc", "list-members", "--context", "hub"])
        .output()
        .await
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(cells(&listed).len(), 2, "{listed}");
    let out = in_all(&["mc", "list-members", "--context", "nope"])
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("\"nope\""), "{err}");
    fleet.shutdown().await;
}
