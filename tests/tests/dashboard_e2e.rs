//! `kubectl kedge dashboard` in a real headless Chromium, on a simulated fleet with the real
//! hub and agents: the fleet, a DSO's split and a DSJ's Jobs as the page shows them, the page
//! following a new total and a member cut off, an Event full of HTML shown as text, and the
//! server's loopback and Content-Security-Policy guards. Screenshots go to
//! target/dashboard-screenshots (the README shows one).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod browser;
mod support;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use browser::{Browser, Page};
use serde_json::{Value, json};
use support::dso::*;
use support::*;

const MEMBERS: [&str; 3] = ["member-1", "member-2", "member-3"];
/// Longest wait for the page to show something the API already has (the page updates within
/// a second of a change; the rest is the hub deciding and the fleet acting).
const PAGE: Duration = Duration::from_secs(20);

fn screenshots() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/dashboard-screenshots")
}

/// The text of column `col` of each row of table `#id`, by its `data-member`.
async fn column(page: &Page, id: &str, col: usize) -> Value {
    page.eval(&format!(
        "Object.fromEntries([...document.querySelectorAll('#{id} tr[data-member]')].map(r => [r.dataset.member, r.children[{col}].textContent]))"
    ))
    .await
}

/// Waits until column `col` of table `#id` reads `want` (member → text).
async fn wait_column(page: &Page, id: &str, col: usize, want: Value, what: &str) {
    let js = format!(
        "(() => {{ const got = Object.fromEntries([...document.querySelectorAll('#{id} tr[data-member]')].map(r => [r.dataset.member, r.children[{col}].textContent])); return JSON.stringify(got) === JSON.stringify({want}); }})()"
    );
    page.wait_for(&js, PAGE, what).await;
}

async fn go(page: &Page, hash: &str) {
    page.eval(&format!("location.hash = {}", json!(hash))).await;
}

/// The page's main text shows no JavaScript value that slipped into the DOM as text.
async fn no_stray_values(page: &Page, what: &str) {
    let text = page.eval("document.getElementById('main').innerText").await;
    let text = text.as_str().unwrap_or_default();
    for stray in ["null", "undefined", "NaN", "[object "] {
        assert!(!text.contains(stray), "{what} shows {stray:?}:\n{text}");
    }
}

/// One raw HTTP/1.1 GET with the given `Host`; the status line and headers.
fn raw_get(port: u16, host: &str) -> String {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = stream.read_to_string(&mut out);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_fleet_and_follows_it_in_a_real_browser() {
    let (_dir, fleet) = start_with(&MEMBERS, |c| c.job_duration = Duration::from_secs(300)).await;
    for member in MEMBERS {
        deployment(&fleet.sim, member, "web", 1).await;
    }
    let _hub = fleet.start_hub_with("hub.log", &["--dsj-enabled", "true"]);
    let mut agents: Vec<Option<Proc>> = MEMBERS
        .iter()
        .map(|m| Some(fleet.start_agent(m, None, &format!("{m}.log"))))
        .collect();
    wait_for_states(fleet.ports, &MEMBERS, "Connected", LIMIT).await;

    // A DSO over all three (weights 1:2:3) and a DSJ over two (2:3).
    let hub = fleet.sim.cluster("hub").unwrap();
    hub.set_metric("default", "web", "0", 30.0);
    let members = "  memberClusters:\n  - {name: member-1, weight: 1}\n  - {name: member-2, weight: 2}\n  - {name: member-3, weight: 3}";
    apply(&fleet, &dso_yaml("web", members, "web-metric"), "web.yaml").await;
    fleet
        .wait_split("web", &MEMBERS, &[1, 2, 3], "1:2:3 of 6")
        .await;
    apply(&fleet, &dsj_yaml("queue"), "work.yaml").await;
    set_queue(&fleet, 5).await;

    // The dashboard, with the hub cluster's kubeconfig as a user would run it.
    let port = free_tcp_port();
    let hub_kubeconfig = fleet.kubeconfig("hub").display().to_string();
    let dashboard = Proc::spawn(
        &bin("kubectl-kedge"),
        &[
            "dashboard",
            "--kubeconfig",
            &hub_kubeconfig,
            "--port",
            &port.to_string(),
        ]
        .map(String::from),
        fleet.dir.join("dashboard.log"),
    );
    let url = format!("http://127.0.0.1:{port}/");
    wait_for(LIMIT, "the dashboard listening", || async {
        std::net::TcpStream::connect(("127.0.0.1", port))
            .ok()
            .map(|_| ())
    })
    .await;

    // The server's guards: a foreign Host (DNS rebinding) is refused; the page has a CSP.
    let refused = raw_get(port, "attacker.example:80");
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    let served = raw_get(port, &format!("localhost:{port}"));
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    assert!(
        served.contains("content-security-policy: default-src 'none'; script-src 'self'"),
        "{served}"
    );

    let browser = Browser::launch().await;
    let page = browser.new_page(&url).await;
    page.set_viewport(1400, 900).await;

    // --- Fleet: every member, its state and versions, and the summary.
    page.wait_for(
        "document.querySelectorAll('#members .row[data-member]').length === 3 && document.querySelector('[data-count=ready]').textContent === '3 ready'",
        PAGE,
        "three Ready members on the fleet page",
    )
    .await;
    let row = page
        .eval("[...document.querySelector('#members .row[data-member=\"member-1\"]').children].map(c => c.textContent)")
        .await;
    let cells: Vec<&str> = row
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(cells[0], "member-1");
    assert_eq!(cells[1], "Ready");
    assert!(cells[2].ends_with(" ago"), "heartbeat age: {cells:?}");
    assert_eq!(cells[4], "v1.33.0-kedge-sim", "{cells:?}");
    assert!(cells[5].starts_with("in "), "certificate expiry: {cells:?}");
    // member-1 runs both workloads.
    page.wait_for(
        "document.querySelector('#members .row[data-member=\"member-1\"] [data-col=work]').textContent.includes('default/web')",
        PAGE,
        "member-1's workloads",
    )
    .await;
    // Filter and sort.
    page.eval("{ const f = document.getElementById('filter'); f.value = 'member-2'; f.dispatchEvent(new Event('input')); }")
        .await;
    page.wait_for(
        "document.querySelectorAll('#members .row[data-member]').length === 1",
        PAGE,
        "the filter leaves member-2",
    )
    .await;
    page.eval("{ const f = document.getElementById('filter'); f.value = ''; f.dispatchEvent(new Event('input')); document.querySelector('.row.head [data-col=name]').click(); }")
        .await;
    page.wait_for(
        "[...document.querySelectorAll('#members .row[data-member]')].map(r => r.dataset.member).join() === 'member-3,member-2,member-1'",
        PAGE,
        "names sorted descending",
    )
    .await;
    no_stray_values(&page, "the fleet page").await;
    page.screenshot(&screenshots().join("fleet.png")).await;

    // --- DSO: the split, its reasons and the chart.
    go(&page, "#/dso/default/web").await;
    wait_column(
        &page,
        "split",
        4,
        json!({"member-1": "1", "member-2": "2", "member-3": "3"}),
        "the DSO's desired split 1:2:3",
    )
    .await;
    let why = column(&page, "split", 7).await;
    assert!(
        why["member-2"].as_str().unwrap().contains("weight 2 of 6"),
        "{why}"
    );
    assert_eq!(
        page.eval("document.querySelector('[data-stat=total] .value').textContent")
            .await,
        "6"
    );
    // The metric doubles: KEDA scales the DSO to 12 and the page follows.
    hub.set_metric("default", "web", "0", 60.0);
    wait_column(
        &page,
        "split",
        4,
        json!({"member-1": "2", "member-2": "4", "member-3": "6"}),
        "the split after the metric doubled",
    )
    .await;
    page.wait_for(
        "document.querySelector('[data-stat=total] .value').textContent === '12'",
        PAGE,
        "the total 12",
    )
    .await;
    page.wait_for(
        "document.querySelectorAll('#chart path.total').length === 1 && document.querySelectorAll('#chart path.series').length === 6",
        PAGE,
        "the chart with the total and three members (desired and current)",
    )
    .await;

    // An Event whose note is HTML shows as text: no element, no script.
    let event = json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "web.html", "namespace": "default"},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "test", "reportingInstance": "test", "action": "Test",
        "type": "Warning", "reason": "Injected",
        "note": "<img src=x onerror=\"window.__pwned=1\"><b>bold</b><script>window.__pwned=2</script>",
        "regarding": {"apiVersion": "kedge.dev/v1alpha1", "kind": "DistributedScaledObject", "name": "web", "namespace": "default"},
    });
    let event_file = fleet.dir.join("event.json");
    std::fs::write(&event_file, event.to_string()).unwrap();
    fleet
        .kubectl(&["create", "-f", event_file.to_str().unwrap()])
        .await;
    page.wait_for(
        "[...document.querySelectorAll('#events li[data-reason=Injected] .note')].some(n => n.textContent.startsWith('<img src=x'))",
        PAGE,
        "the injected Event on the DSO page, as text",
    )
    .await;
    let injected = page
        .eval("({img: document.querySelectorAll('#main img, #events img').length, b: document.querySelectorAll('#events b').length, scripts: document.querySelectorAll('script').length, pwned: window.__pwned === undefined ? null : window.__pwned})")
        .await;
    assert_eq!(
        injected,
        json!({"img": 0, "b": 0, "scripts": 1, "pwned": null})
    );
    // Pod metrics, as the hub writes them for a `kedge-pod-metrics` trigger, get a section.
    let pod_metrics = json!({"status": {"podMetrics": [{
        "trigger": "engines", "metricName": "vllm:num_requests_waiting", "threshold": "10",
        "average": "12.5", "podsCounted": 3, "podsMissing": 1, "missingCountedAs": "0",
        "members": {"member-1": {"sum": "25", "podsCounted": 2, "podsMissing": 0},
                    "member-3": {"sum": "0", "podsCounted": 0, "podsMissing": 1, "stale": true, "message": "no fresh sample"}},
    }]}});
    fleet
        .kubectl(&[
            "patch",
            "dso/web",
            "--subresource=status",
            "--type=merge",
            "-p",
            &pod_metrics.to_string(),
        ])
        .await;
    page.wait_for(
        "document.querySelector('.podmetrics[data-trigger=engines]')?.textContent.includes('vllm:num_requests_waiting averages 12.5 per pod (target 10)')",
        PAGE,
        "the pod metrics section",
    )
    .await;
    no_stray_values(&page, "the DSO page").await;
    page.screenshot(&screenshots().join("dso.png")).await;

    // --- DSJ: Jobs per member (queue 5 at weights 2:3).
    go(&page, "#/dsj/default/work").await;
    wait_column(
        &page,
        "jobs",
        2,
        json!({"member-1": "2", "member-2": "3"}),
        "the DSJ's running Jobs 2:3",
    )
    .await;
    assert_eq!(
        page.eval("document.querySelector('[data-stat=desired] .value').textContent")
            .await,
        "5"
    );
    assert_eq!(
        page.eval("document.querySelector('[data-stat=strategy] .value').textContent")
            .await,
        "weightedRoundRobin"
    );
    no_stray_values(&page, "the DSJ page").await;
    page.screenshot(&screenshots().join("dsj.png")).await;

    // --- Cut member-3 off: the fleet page and the DSO page follow.
    agents[2] = None;
    go(&page, "#/").await;
    page.wait_for(
        "document.querySelector('#members .row[data-member=\"member-3\"]')?.dataset.state === 'Unreachable' && document.querySelector('[data-count=unreachable]').textContent === '1 unreachable'",
        PAGE,
        "member-3 Unreachable on the fleet page",
    )
    .await;
    page.screenshot(&screenshots().join("fleet-unreachable.png"))
        .await;
    go(&page, "#/dso/default/web").await;
    page.wait_for(
        "(() => { const r = document.querySelector('#split tr[data-member=\"member-3\"]'); return r && /unreachable|excluded/.test(r.children[7].textContent); })()",
        PAGE,
        "member-3's share explained as unreachable on the DSO page",
    )
    .await;
    // Its share moves after the grace period (3 s): 12 over weights 1:2 → 4:8.
    page.wait_for(
        "(() => { const d = Object.fromEntries([...document.querySelectorAll('#split tr[data-member]')].map(r => [r.dataset.member, r.children[4].textContent])); return d['member-1'] === '4' && d['member-2'] === '8'; })()",
        PAGE,
        "member-3's share moved to member-1 and member-2",
    )
    .await;

    assert_eq!(page.js_errors(), Vec::<String>::new(), "JavaScript errors");
    assert!(
        agents.iter().take(2).all(Option::is_some),
        "member-1 and member-2 keep running"
    );

    // --- A user who may read DSOs, DSJs and Events in `default` only: the dashboard shows
    // what they may read and says what they may not.
    let viewer_kubeconfig = viewer(&fleet).await;
    let viewer_port = free_tcp_port();
    let _viewer_dashboard = Proc::spawn(
        &bin("kubectl-kedge"),
        &[
            "dashboard",
            "--kubeconfig",
            viewer_kubeconfig.to_str().unwrap(),
            "--namespace",
            "default",
            "--port",
            &viewer_port.to_string(),
        ]
        .map(String::from),
        fleet.dir.join("viewer-dashboard.log"),
    );
    wait_for(LIMIT, "the viewer's dashboard listening", || async {
        std::net::TcpStream::connect(("127.0.0.1", viewer_port))
            .ok()
            .map(|_| ())
    })
    .await;
    let viewer_page = browser
        .new_page(&format!("http://127.0.0.1:{viewer_port}/#/workloads"))
        .await;
    viewer_page
        .wait_for(
            "document.querySelector('#errors .error')?.textContent.includes('cannot read memberclusters.kedge.dev') && document.querySelectorAll('#dso-list a').length === 1",
            PAGE,
            "the viewer's page: the DSO, and why members are missing",
        )
        .await;
    let banner = viewer_page
        .eval("document.querySelector('#errors').textContent")
        .await;
    assert!(
        banner.as_str().unwrap().contains("forbidden")
            || banner.as_str().unwrap().contains("Forbidden"),
        "{banner}"
    );
    viewer_page
        .screenshot(&screenshots().join("viewer-workloads.png"))
        .await;
    assert_eq!(viewer_page.js_errors(), Vec::<String>::new());
    drop(dashboard);
}

/// A kubeconfig for ServiceAccount `default/viewer`, which may get, list and watch DSOs,
/// DSJs and Events in `default`, and nothing else.
async fn viewer(fleet: &Fleet) -> PathBuf {
    let rbac = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: viewer, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: viewer, namespace: default}
rules:
- apiGroups: [kedge.dev]
  resources: [distributedscaledobjects, distributedscaledjobs]
  verbs: [get, list, watch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: viewer, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: viewer}
subjects:
- {kind: ServiceAccount, name: viewer, namespace: default}
"#;
    apply(fleet, rbac, "viewer.yaml").await;
    let hub = fleet.sim.cluster("hub").unwrap();
    let token = hub.service_account_token("default", "viewer");
    let path = fleet.dir.join("viewer.kubeconfig");
    std::fs::write(&path, hub.kubeconfig_with_token(&token)).unwrap();
    path
}
