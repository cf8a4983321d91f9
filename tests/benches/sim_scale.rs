//! Scale benchmark: N virtual clusters and W concurrent watches; reports the
//! server process's memory and the write → watch-event latency.
//!
//! `cargo bench -p kedge-e2e --bench sim_scale` (env: `SIM_BENCH_CLUSTERS`,
//! `SIM_BENCH_WATCHES`, `SIM_BENCH_ROUNDS`). The watch clients run in a child
//! process (this same binary with `--client`) so the measured memory is the
//! simulator's alone and both processes stay under the file-descriptor limit.

use std::io::Write as _;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kedge_sim::{Sim, SimConfig};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if let Some(i) = args.iter().position(|a| a == "--client") {
        let ports: Vec<u16> = args
            .get(i + 1)
            .map(|p| p.split(',').filter_map(|x| x.parse().ok()).collect())
            .unwrap_or_default();
        let watches = args.get(i + 2).and_then(|w| w.parse().ok()).unwrap_or(0);
        let rounds = args.get(i + 3).and_then(|w| w.parse().ok()).unwrap_or(0);
        rt.block_on(client(ports, watches, rounds));
    } else {
        rt.block_on(server());
    }
}

async fn server() {
    let clusters = env_usize("SIM_BENCH_CLUSTERS", 1000);
    let watches = env_usize("SIM_BENCH_WATCHES", 10_000);
    let rounds = env_usize("SIM_BENCH_ROUNDS", 10);
    let base = rss_mib();
    let names: Vec<String> = (0..clusters).map(|i| format!("c{i}")).collect();
    let t = Instant::now();
    let sim = Sim::start(&names, SimConfig::default(), None)
        .await
        .expect("start clusters");
    let start_secs = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after_clusters = rss_mib();

    let ports: Vec<String> = sim
        .clusters()
        .iter()
        .map(|c| c.url().rsplit(':').next().unwrap_or_default().to_string())
        .collect();
    let exe = std::env::current_exe().expect("current exe");
    let mut child = tokio::process::Command::new(exe)
        .arg("--client")
        .arg(ports.join(","))
        .arg(watches.to_string())
        .arg(rounds.to_string())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn client");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let connected = tokio::time::timeout(Duration::from_secs(300), lines.next_line())
        .await
        .expect("clients connect in time")
        .expect("read")
        .unwrap_or_default();
    assert!(connected.starts_with("connected"), "{connected}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after_watches = rss_mib();

    // Each round writes one ConfigMap in every cluster; every watch of that
    // cluster must see it.
    let t = Instant::now();
    for r in 0..rounds {
        for c in sim.clusters() {
            let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("bench-{r}"), "namespace": "default"},
                "data": {"t": unix_nanos().to_string()}});
            c.put_object(cm).expect("write");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let report = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
        .await
        .expect("client reports in time")
        .expect("read")
        .unwrap_or_default();
    let write_secs = t.elapsed().as_secs_f64();
    let _ = child.wait().await;
    let after_events = rss_mib();

    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name\t: ").map(str::to_string))
        .unwrap_or_default();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "| metric | value |");
    let _ = writeln!(out, "|---|---|");
    let _ = writeln!(
        out,
        "| machine | {} cores, {cpu} |",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    let _ = writeln!(
        out,
        "| clusters (3 nodes each) | {clusters} (started in {start_secs:.2} s) |"
    );
    let _ = writeln!(out, "| concurrent watches | {watches} |");
    let _ = writeln!(out, "| RSS before clusters | {base:.1} MiB |");
    let _ = writeln!(
        out,
        "| RSS with clusters | {after_clusters:.1} MiB ({:.1} KiB per cluster) |",
        (after_clusters - base) * 1024.0 / clusters.max(1) as f64
    );
    let _ = writeln!(
        out,
        "| RSS with watches | {after_watches:.1} MiB ({:.1} KiB per watch) |",
        (after_watches - after_clusters) * 1024.0 / watches.max(1) as f64
    );
    let _ = writeln!(
        out,
        "| RSS after {rounds} write rounds | {after_events:.1} MiB |"
    );
    let _ = writeln!(
        out,
        "| write rounds ({rounds} x {clusters} writes, 0.5 s apart) | {write_secs:.1} s |"
    );
    let _ = writeln!(out, "| watch-event latency | {report} |");
    drop(out);
    sim.shutdown().await;
}

async fn client(ports: Vec<u16>, watches: usize, rounds: usize) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<f64>();
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    for i in 0..watches {
        let port = ports[i % ports.len().max(1)];
        let tx = tx.clone();
        let ready_tx = ready_tx.clone();
        tokio::spawn(async move {
            let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
                return;
            };
            let req = "GET /api/v1/namespaces/default/configmaps?watch=true&resourceVersion=0&timeoutSeconds=3600 HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n\r\n";
            if s.write_all(req.as_bytes()).await.is_err() {
                return;
            }
            let mut buf = Vec::with_capacity(4096);
            let mut chunk = [0u8; 4096];
            let mut headers_done = false;
            loop {
                let Ok(n) = s.read(&mut chunk).await else {
                    return;
                };
                if n == 0 {
                    return;
                }
                let now = unix_nanos();
                buf.extend_from_slice(&chunk[..n]);
                if !headers_done {
                    if let Some(p) = find(&buf, b"\r\n\r\n") {
                        headers_done = true;
                        buf.drain(..p + 4);
                        let _ = ready_tx.send(());
                    } else {
                        continue;
                    }
                }
                // Each event carries the write time in data.t.
                while let Some(p) = find(&buf, b"\"t\":\"") {
                    let rest = &buf[p + 5..];
                    let Some(end) = rest.iter().position(|b| *b == b'"') else {
                        break;
                    };
                    let t: u128 = std::str::from_utf8(&rest[..end])
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(now);
                    let _ = tx.send(now.saturating_sub(t) as f64 / 1e6);
                    buf.drain(..p + 5 + end);
                }
                if buf.len() > 8192 {
                    let keep = buf.len() - 64;
                    buf.drain(..keep);
                }
            }
        });
    }
    drop(ready_tx);
    drop(tx);
    let mut ready = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    while ready < watches {
        match tokio::time::timeout_at(deadline, ready_rx.recv()).await {
            Ok(Some(())) => ready += 1,
            _ => break,
        }
    }
    println!("connected {ready}");
    let want = watches * rounds;
    let mut lat = Vec::with_capacity(want);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60 + rounds as u64);
    while lat.len() < want {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(ms)) => lat.push(ms),
            _ => break,
        }
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    println!(
        "{} of {want} events; p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        lat.len(),
        pct(0.5),
        pct(0.9),
        pct(0.99),
        lat.last().copied().unwrap_or(f64::NAN)
    );
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
