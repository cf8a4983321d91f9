//! One process pod: its files (volumes, a kubeconfig with its ServiceAccount's token), one
//! process per container with its probes, restarts with back-off, and the status written
//! after every change. The store lock is taken only to read objects and to write status.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::sync::watch;

use super::backoff::Backoff;
use super::probes::{Probe, Tracker};
use super::rewrite::Rewrite;
use super::spec::{self, Blocked, PodAddrs, Source};
use super::status::{self, Container, Exit, PodFacts, RestartPolicy, State};
use super::volumes::{self, Volume};
use crate::cluster::ClusterShared;
use crate::store::{Obj, WriteScope};
use crate::util::{get_path, meta_mut, meta_str};

/// How long a blocked container (a missing Secret, say) waits before kubelet tries again.
const RETRY: Duration = Duration::from_secs(2);
/// PATH of a container process (a container image's usual one).
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Tells a pod's supervisor to stop: `Some(grace)` between SIGTERM and SIGKILL.
pub(crate) type Stop = watch::Receiver<Option<Duration>>;

/// What the process kubelet hands a supervisor.
#[derive(Debug)]
pub(crate) struct PodRun {
    pub c: Arc<ClusterShared>,
    /// The pod as bound (its spec does not change).
    pub pod: Obj,
    /// The executable of each container, in spec order.
    pub programs: Vec<PathBuf>,
    pub pod_ip: String,
    pub host_ip: String,
    pub start_time: i64,
    /// The pod's files: `volumes/`, `kubeconfig`, `logs/`.
    pub dir: PathBuf,
}

/// A process group's leader; dropping it kills whatever of the group is left, so a
/// container's children never outlive it.
#[derive(Debug)]
struct Group(Option<rustix::process::Pid>);

impl Group {
    fn signal(&self, sig: rustix::process::Signal) {
        if let Some(pid) = self.0 {
            let _ = rustix::process::kill_process_group(pid, sig);
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.signal(rustix::process::Signal::KILL);
    }
}

/// How a container's run ended.
enum Ended {
    Exited(i32),
    Stopped,
}

struct Ctx {
    run: PodRun,
    uid: String,
    ns: String,
    name: String,
    containers: Mutex<Vec<Container>>,
    kubeconfig: Option<PathBuf>,
    /// The ServiceAccount token in the kubeconfig, also what `serviceAccountToken` volumes hold.
    token: String,
    /// Held while a container writes the pod's volumes.
    volumes: tokio::sync::Mutex<()>,
}

impl Ctx {
    fn states(&self) -> MutexGuard<'_, Vec<Container>> {
        // Each change is one assignment: the states stay consistent through a panic.
        self.containers.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn spec(&self, i: usize) -> &Value {
        &self.run.pod["spec"]["containers"][i]
    }

    fn addrs(&self) -> PodAddrs<'_> {
        PodAddrs {
            pod_ip: &self.run.pod_ip,
            host_ip: &self.run.host_ip,
        }
    }

    fn update(&self, i: usize, f: impl FnOnce(&mut Container)) {
        if let Some(c) = self.states().get_mut(i) {
            f(c);
        }
        self.publish();
    }

    /// Writes the pod's status if it changed (never when the pod is gone or replaced).
    fn publish(&self) {
        let cs = self.states().clone();
        let c = &self.run.c;
        let now = c.now();
        let facts = PodFacts {
            pod_ip: &self.run.pod_ip,
            host_ip: &self.run.host_ip,
            start_time: self.run.start_time,
        };
        {
            let mut store = c.store();
            let Some(pod) = store.get("/pods", &self.ns, &self.name).cloned() else {
                return;
            };
            if meta_str(&pod, "uid") != Some(&self.uid) {
                return;
            }
            let status = status::pod_status(pod.get("status"), &cs, facts, now);
            if pod.get("status") == Some(&status) {
                return;
            }
            let Some(def) = store.def("/pods") else {
                return;
            };
            let mut new = (*pod).clone();
            new["status"] = status;
            meta_mut(&mut new).remove("resourceVersion");
            if let Err(e) = store.update(&def, &self.ns, &self.name, new, WriteScope::Internal, now)
            {
                tracing::debug!(error = %e, pod = %self.name, "process pod status write failed");
            }
        }
        c.wake.notify_one();
    }

    /// Reads a Secret or ConfigMap of the pod's namespace.
    fn lookup(&self, source: Source, name: &str) -> Option<Value> {
        let key = match source {
            Source::Secret => "/secrets",
            Source::ConfigMap => "/configmaps",
        };
        self.run
            .c
            .store()
            .get(key, &self.ns, name)
            .map(|o| (**o).clone())
    }

    fn volume_dir(&self, name: &str) -> PathBuf {
        self.run.dir.join("volumes").join(name)
    }

    /// The container's program, argv and env, its volumes written out.
    async fn prepare(&self, i: usize) -> Result<(Vec<String>, Vec<(String, String)>), Blocked> {
        let lookup = |s: Source, n: &str| self.lookup(s, n);
        let pod_volumes = volumes::volumes(&self.run.pod, self.addrs(), &self.token, &lookup)?;
        let env = spec::env(&self.run.pod, self.spec(i), self.addrs(), &lookup)?;
        let args = spec::args(self.spec(i), &env);
        let _one_writer = self.volumes.lock().await;
        for v in &pod_volumes {
            write_volume(&self.volume_dir(&v.name), v)
                .await
                .map_err(|e| Blocked {
                    reason: "ContainerCreating",
                    message: format!("MountVolume.SetUp failed for volume \"{}\" : {e}", v.name),
                })?;
        }
        let mounts = volumes::mounts(self.spec(i), &|v| self.volume_dir(v));
        let rw = Rewrite::new(mounts, &self.run.pod_ip);
        let args = args.iter().map(|a| rw.apply(a)).collect();
        let mut env: Vec<(String, String)> =
            env.into_iter().map(|(k, v)| (k, rw.apply(&v))).collect();
        if let Some(kc) = &self.kubeconfig
            && !env.iter().any(|(k, _)| k == "KUBECONFIG")
        {
            env.push(("KUBECONFIG".into(), kc.display().to_string()));
        }
        Ok((args, env))
    }

    fn spawn(
        &self,
        i: usize,
        run: u32,
        args: &[String],
        env: &[(String, String)],
    ) -> std::io::Result<Child> {
        let log = super::logs::log_path(&self.run.dir, &self.states()[i].name, run);
        if let Some(parent) = log.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let out = std::fs::File::create(&log)?;
        let err = out.try_clone()?;
        Command::new(&self.run.programs[i])
            .args(args)
            .env_clear()
            .env("PATH", PATH)
            .env("HOSTNAME", &self.name)
            .env("HOME", &self.run.dir)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.run.dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
    }

    fn grace(&self) -> Duration {
        let secs = get_path(&self.run.pod, "spec.terminationGracePeriodSeconds")
            .and_then(Value::as_u64)
            .unwrap_or(30);
        Duration::from_secs(secs)
    }
}

/// Writes a volume's files in place, each replaced whole (a running container never reads
/// half a file); what else is in the directory (an `emptyDir`'s data) stays.
async fn write_volume(dir: &Path, v: &Volume) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    tokio::fs::create_dir_all(dir).await?;
    for f in &v.files {
        let path = dir.join(&f.path);
        if let Some(parent) = path.parent() {
            tokio::fs::create_dir_all(parent).await?;
        }
        let tmp = path.with_file_name(format!(
            ".{}.kedge-sim-new",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("file")
        ));
        tokio::fs::write(&tmp, &f.data).await?;
        // Owner-readable at least: the process runs as this user, not as the pod's.
        let mode = f.mode | 0o400;
        tokio::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).await?;
        tokio::fs::rename(&tmp, &path).await?;
    }
    Ok(())
}

/// Waits `d` unless told to stop first (then `true`).
async fn wait_or_stop(d: Duration, stop: &mut Stop) -> bool {
    if stop.borrow().is_some() {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(d) => stop.borrow().is_some(),
        _ = stop.changed() => true,
    }
}

/// SIGTERM to the group, SIGKILL after the grace period (a later, shorter one wins); the
/// exit code.
async fn terminate(child: &mut Child, group: &Group, stop: &mut Stop, grace: Duration) -> i32 {
    group.signal(rustix::process::Signal::TERM);
    let mut deadline = tokio::time::Instant::now() + grace;
    loop {
        tokio::select! {
            status = child.wait() => return exit_code(status),
            _ = tokio::time::sleep_until(deadline) => break,
            changed = stop.changed() => {
                let shorter = (*stop.borrow()).map(|g| tokio::time::Instant::now() + g);
                match (changed, shorter) {
                    (Ok(()), Some(d)) if d < deadline => deadline = d,
                    (Err(_), _) => break,
                    _ => {}
                }
            }
        }
    }
    group.signal(rustix::process::Signal::KILL);
    exit_code(child.wait().await)
}

fn exit_code(status: std::io::Result<std::process::ExitStatus>) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    match status {
        Ok(s) => s.code().or(s.signal().map(|sig| 128 + sig)).unwrap_or(1),
        Err(_) => 1,
    }
}

/// Runs one process of container `i` until it exits or the pod stops; probes it meanwhile.
async fn watch_run(ctx: &Ctx, i: usize, mut child: Child, stop: &mut Stop) -> Ended {
    let group = Group(
        child
            .id()
            .and_then(|id| rustix::process::Pid::from_raw(id as i32)),
    );
    let readiness = Probe::parse(ctx.spec(i), "readinessProbe");
    let liveness = Probe::parse(ctx.spec(i), "livenessProbe");
    let start = tokio::time::Instant::now();
    let mut ready = Tracker::default();
    let mut live = Tracker::passing();
    let mut next_ready = readiness.as_ref().map(|p| start + p.initial_delay);
    let mut next_live = liveness.as_ref().map(|p| start + p.initial_delay);
    if readiness.is_none() {
        ctx.update(i, |c| c.ready = true);
    }
    let far = || tokio::time::Instant::now() + Duration::from_secs(3600);
    loop {
        tokio::select! {
            status = child.wait() => return Ended::Exited(exit_code(status)),
            _ = stop.changed() => {
                let grace = (*stop.borrow()).unwrap_or_default();
                terminate(&mut child, &group, stop, grace).await;
                return Ended::Stopped;
            }
            _ = tokio::time::sleep_until(next_ready.unwrap_or_else(far)), if next_ready.is_some() => {
                let Some(p) = &readiness else { continue };
                if ready.observe(p.check(&ctx.run.pod_ip).await, p) {
                    let now_ready = ready.passing;
                    ctx.update(i, |c| c.ready = now_ready);
                }
                next_ready = Some(tokio::time::Instant::now() + p.period);
            }
            _ = tokio::time::sleep_until(next_live.unwrap_or_else(far)), if next_live.is_some() => {
                let Some(p) = &liveness else { continue };
                live.observe(p.check(&ctx.run.pod_ip).await, p);
                if !live.passing {
                    tracing::info!(pod = %ctx.name, "liveness probe failed: restarting the container");
                    let code = terminate(&mut child, &group, stop, ctx.grace()).await;
                    return Ended::Exited(code);
                }
                next_live = Some(tokio::time::Instant::now() + p.period);
            }
        }
    }
}

/// Starts container `i` (at simulated `started`) and watches it: its exit code, or `None`
/// when the pod stops.
async fn run_once(
    ctx: &Ctx,
    i: usize,
    started: i64,
    args: &[String],
    env: &[(String, String)],
    stop: &mut Stop,
) -> Option<i32> {
    let run = ctx.states()[i].restarts;
    match ctx.spawn(i, run, args, env) {
        Ok(child) => {
            let pid = child.id().unwrap_or_default();
            ctx.update(i, |c| {
                c.state = State::Running { pid, started };
                c.ever_started = true;
            });
            match watch_run(ctx, i, child, stop).await {
                Ended::Stopped => None,
                Ended::Exited(code) => Some(code),
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, pod = %ctx.name, "starting a container process failed");
            Some(128)
        }
    }
}

/// Container `i` exited and restarts after `wait`: its last state, and `CrashLoopBackOff`
/// while it waits.
fn backing_off(ctx: &Ctx, i: usize, exit: Exit, wait: Duration) {
    let (name, pod) = (ctx.states()[i].name.clone(), ctx.name.clone());
    ctx.update(i, |c| {
        c.ready = false;
        c.state = if wait.is_zero() {
            State::Terminated(exit.clone())
        } else {
            State::Waiting {
                reason: "CrashLoopBackOff".into(),
                message: format!(
                    "back-off {}s restarting failed container={name} pod={pod}_{}({})",
                    wait.as_secs(),
                    ctx.ns,
                    ctx.uid
                ),
            }
        };
        c.last = Some(exit);
    });
}

/// Container `i`: resolve, start, watch, restart as the pod's policy says, until it ends
/// for good or the pod stops.
async fn run_container(ctx: &Ctx, i: usize, mut stop: Stop) {
    let policy = RestartPolicy::of(&ctx.run.pod);
    let mut backoff = Backoff::default();
    loop {
        let (args, env) = match ctx.prepare(i).await {
            Ok(ready) => ready,
            Err(b) => {
                ctx.update(i, |c| {
                    c.state = State::Waiting {
                        reason: b.reason.into(),
                        message: b.message,
                    };
                });
                if wait_or_stop(RETRY, &mut stop).await {
                    return;
                }
                continue;
            }
        };
        let (started, ran) = (ctx.run.c.now(), Instant::now());
        let Some(code) = run_once(ctx, i, started, &args, &env, &mut stop).await else {
            return;
        };
        let exit = Exit {
            code,
            started,
            finished: ctx.run.c.now(),
        };
        if !policy.restarts(code) {
            ctx.update(i, |c| {
                c.state = State::Terminated(exit);
                c.ready = false;
            });
            return;
        }
        let wait = backoff.after_exit(ran.elapsed());
        backing_off(ctx, i, exit, wait);
        if wait_or_stop(wait, &mut stop).await {
            return;
        }
        ctx.update(i, |c| c.restarts += 1);
    }
}

/// Writes the kubeconfig with a token of the pod's ServiceAccount (none when the pod opts
/// out of a token with `automountServiceAccountToken: false`).
async fn kubeconfig(run: &PodRun, ns: &str, token: &str) -> std::io::Result<Option<PathBuf>> {
    if get_path(&run.pod, "spec.automountServiceAccountToken").and_then(Value::as_bool)
        == Some(false)
    {
        return Ok(None);
    }
    let url = format!("http://{}", run.c.addr);
    let yaml = crate::cluster::kubeconfig_yaml(&run.c.name, &url, ns, Some(token));
    let path = run.dir.join("kubeconfig");
    tokio::fs::write(&path, yaml).await?;
    Ok(Some(path))
}

/// Runs a process pod until its containers end for good or it is told to stop.
pub(crate) async fn supervise(run: PodRun, stop: Stop) {
    let ns = meta_str(&run.pod, "namespace")
        .unwrap_or_default()
        .to_string();
    let name = meta_str(&run.pod, "name").unwrap_or_default().to_string();
    let uid = meta_str(&run.pod, "uid").unwrap_or_default().to_string();
    let containers: Vec<Container> = get_path(&run.pod, "spec.containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .zip(&run.programs)
        .map(|(c, program)| {
            let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or_default();
            Container::new(s("name"), s("image"), &program.display().to_string())
        })
        .collect();
    let sa = get_path(&run.pod, "spec.serviceAccountName")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let token = run
        .c
        .issue_token(crate::rbac::UserInfo::service_account(&ns, sa));
    // A pod of the same name before this one leaves its files; a new pod starts clean.
    let _ = tokio::fs::remove_dir_all(&run.dir).await;
    let kubeconfig = match tokio::fs::create_dir_all(&run.dir).await {
        Ok(()) => kubeconfig(&run, &ns, &token).await,
        Err(e) => Err(e),
    };
    let kubeconfig = kubeconfig.unwrap_or_else(|e| {
        tracing::warn!(error = %e, pod = %name, dir = %run.dir.display(), "writing the pod's kubeconfig failed");
        None
    });
    let ctx = Ctx {
        run,
        uid,
        ns,
        name,
        containers: Mutex::new(containers),
        kubeconfig,
        token,
        volumes: tokio::sync::Mutex::new(()),
    };
    ctx.publish();
    let n = ctx.states().len();
    futures::future::join_all((0..n).map(|i| run_container(&ctx, i, stop.clone()))).await;
}
