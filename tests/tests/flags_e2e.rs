//! The real binaries refuse out-of-range flags at startup: exit code 2 (clap's usage
//! error) and a message naming the flag and its range, before anything is started.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::bin;

/// Runs `binary args` and returns its exit code and stderr.
fn run(binary: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(bin(binary))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const TLS: [&str; 6] = [
    "--tls-cert",
    "c.pem",
    "--tls-key",
    "k.pem",
    "--tls-ca",
    "ca.pem",
];

#[test]
fn out_of_range_flags_are_refused_at_startup() {
    fn hub(extra: &[&'static str]) -> Vec<&'static str> {
        [&TLS[..], extra].concat()
    }
    fn agent(extra: &[&'static str]) -> Vec<&'static str> {
        [
            &["--hub", "127.0.0.1:7443", "--all-namespaces"][..],
            &TLS[..],
            extra,
        ]
        .concat()
    }
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        (
            "kedge-hub",
            hub(&["--heartbeat-interval", "0s"]),
            "must be between 100ms and 10m",
        ),
        (
            "kedge-hub",
            hub(&["--max-connections", "0"]),
            "0 is not in 1..=100000",
        ),
        (
            "kedge-hub",
            hub(&["--max-connections", "99999999999"]),
            "--max-connections",
        ),
        (
            "kedge-hub",
            hub(&["--lease-duration", "5124095576030431h"]),
            "must be between 1s and 10m",
        ),
        (
            "kedge-hub",
            hub(&["--cluster-profile-namespace", "Not_A_Namespace"]),
            "is not a namespace name",
        ),
        (
            "kedge-agent",
            agent(&["--report-interval", "0s"]),
            "must be between 50ms and 10m",
        ),
        (
            "kedge-agent",
            agent(&["--capacity-interval", "0s"]),
            "must be between 100ms and 1h",
        ),
        (
            "kedge-agent",
            agent(&["--reconnect-initial", "10s", "--reconnect-max", "1s"]),
            "--reconnect-max (1s) must be at least --reconnect-initial (10s)",
        ),
        (
            "kedge-agent",
            agent(&["--kinds", "Deployment"]),
            "write group/version/Kind",
        ),
        (
            "kubectl-kedge",
            vec!["dev-certs", "--dir", "unused", "--validity", "1000000years"],
            "must be between 1h and 3650days",
        ),
        (
            "kedge-sim",
            vec!["up", "--members", "0"],
            "0 is not in 1..=100",
        ),
        (
            "kedge-sim",
            vec!["up", "--heartbeat", "0s"],
            "must be between 100ms and 10m",
        ),
    ];
    for (binary, args, expected) in cases {
        let (code, stderr) = run(binary, &args);
        assert_eq!(
            code,
            Some(2),
            "{binary} {args:?} exited with {code:?}: {stderr}"
        );
        assert!(stderr.contains(expected), "{binary} {args:?}: {stderr}");
        let flag = args.iter().rev().find(|a| a.starts_with("--")).unwrap();
        assert!(
            stderr.contains(flag),
            "{binary} {args:?} does not name {flag}: {stderr}"
        );
    }
    assert!(
        !std::path::Path::new("unused").exists(),
        "dev-certs wrote files despite a bad flag"
    );
}

/// The agent denies by default: without `--namespaces` or an explicit `--all-namespaces` it
/// does not start, and an empty list is not read as "every namespace".
#[test]
fn an_agent_told_no_namespaces_does_not_start() {
    let base = [&["--hub", "127.0.0.1:7443"][..], &TLS[..]].concat();
    let (code, stderr) = run("kedge-agent", &base);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--namespaces") && stderr.contains("--all-namespaces"),
        "{stderr}"
    );
    let (code, stderr) = run("kedge-agent", &[&base[..], &["--namespaces", ","]].concat());
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--namespaces needs at least one namespace"),
        "{stderr}"
    );
}
