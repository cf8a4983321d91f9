//! What the benches read of a process from `/proc` (Linux only), and the machine they ran on.

#![allow(dead_code)]

/// An environment variable parsed as `T`, or `default`.
pub(crate) fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What `/proc/PID/status` says of a process's memory, in KiB.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Memory {
    /// `VmRSS`: resident now.
    pub(crate) rss: u64,
    /// `VmHWM`: the most ever resident.
    pub(crate) peak: u64,
    /// `RssAnon`: heap, stacks (the rest of `VmRSS` is mostly the binary's mapped pages).
    pub(crate) anon: u64,
}

/// The memory of process `pid`; panics when it is gone (a bench must not report a guess).
pub(crate) fn memory(pid: u32) -> Memory {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e} (did the process exit?)"));
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    Memory {
        rss: field("VmRSS:"),
        peak: field("VmHWM:"),
        anon: field("RssAnon:"),
    }
}

/// CPU time process `pid` has used so far (user + system), from `/proc/PID/stat`.
pub(crate) fn cpu_time(pid: u32) -> std::time::Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/stat: {e} (did the process exit?)"));
    // The command name (field 2) may hold spaces: count fields after its closing ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .unwrap_or_else(|| panic!("/proc/{pid}/stat: no ')'"));
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    let ticks: u64 = [11, 12]
        .iter()
        .map(|&i| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("/proc/{pid}/stat: no utime/stime"))
        })
        .sum();
    // USER_HZ is 100 on every Linux architecture kedge targets.
    std::time::Duration::from_millis(ticks * 10)
}

/// Average CPU use of `pid` over `window`, in millicores (what a Kubernetes request counts).
pub(crate) async fn millicores(pid: u32, window: std::time::Duration) -> u64 {
    let before = cpu_time(pid);
    tokio::time::sleep(window).await;
    let used = cpu_time(pid).saturating_sub(before);
    (used.as_secs_f64() / window.as_secs_f64() * 1000.0).round() as u64
}

/// `KIB KiB (M.M MiB)`.
pub(crate) fn mib(kib: u64) -> String {
    format!("{kib} KiB ({:.1} MiB)", kib as f64 / 1024.0)
}

/// RSS, with the part that is not the binary's or libraries' pages.
pub(crate) fn rss(m: Memory) -> String {
    format!("{}, of which anonymous {}", mib(m.rss), mib(m.anon))
}

/// The CPU model and the number of cores.
pub(crate) fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU", |(_, m)| m.trim())
        .to_owned();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{model}, {cores} cores, {}", std::env::consts::ARCH)
}

/// The comma-separated counts in `$name`, or `default`; a bad entry stops the bench.
pub(crate) fn counts(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|c| {
            c.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{name}: {c:?} is not a count"))
        })
        .collect()
}

/// Why the release binary at `binary` may not be the code in the workspace: it is missing, or
/// older than a source file of one of `crates` (workspace directories). `cargo bench` builds
/// the bench, not the binaries it starts; a stale one measures code that is gone.
pub(crate) fn stale(binary: &std::path::Path, crates: &[&str]) -> Option<String> {
    let built = match std::fs::metadata(binary).and_then(|m| m.modified()) {
        Ok(built) => built,
        Err(e) => return Some(format!("{}: {e}", binary.display())),
    };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut newest: Option<(std::time::SystemTime, std::path::PathBuf)> = None;
    let mut pending: Vec<std::path::PathBuf> = crates
        .iter()
        .flat_map(|c| [root.join(c).join("src"), root.join(c).join("Cargo.toml")])
        .collect();
    while let Some(path) = pending.pop() {
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&path) {
                pending.extend(entries.flatten().map(|e| e.path()));
            }
        } else if let Ok(modified) = meta.modified()
            && newest.as_ref().is_none_or(|(t, _)| modified > *t)
        {
            newest = Some((modified, path));
        }
    }
    let (changed, file) = newest?;
    (changed > built).then(|| {
        format!(
            "{} was built before {} changed: rebuild it (cargo build --release --workspace --bins)",
            binary.display(),
            file.strip_prefix(&root).unwrap_or(&file).display()
        )
    })
}
