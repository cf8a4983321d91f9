//! A process pod's status from its containers' states, in the shape kubelet writes: phase,
//! conditions, containerStatuses with state, lastState and restartCount. Pure.

use serde_json::{Value, json};

use crate::util::rfc3339;

/// How a container process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Exit {
    /// Exit code (128 + signal when killed by one).
    pub code: i32,
    /// Simulated ms when it started and finished.
    pub started: i64,
    pub finished: i64,
}

impl Exit {
    fn json(&self) -> Value {
        json!({"terminated": {
            "exitCode": self.code,
            "reason": if self.code == 0 { "Completed" } else { "Error" },
            "startedAt": rfc3339(self.started),
            "finishedAt": rfc3339(self.finished),
            "containerID": "",
        }})
    }
}

/// Where a container is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    /// Not running: kubelet's reason (`ContainerCreating`, `CreateContainerConfigError`,
    /// `CrashLoopBackOff`) and message.
    Waiting { reason: String, message: String },
    /// Running as process `pid` since `started` (simulated ms).
    Running { pid: u32, started: i64 },
    /// Ended and not restarted.
    Terminated(Exit),
}

/// One container as the process kubelet sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Container {
    pub name: String,
    pub image: String,
    /// The executable its image maps to.
    pub program: String,
    pub state: State,
    pub ready: bool,
    pub restarts: u32,
    pub last: Option<Exit>,
    /// Its first process started (the pod leaves Pending).
    pub ever_started: bool,
}

impl Container {
    /// A container not started yet.
    pub(crate) fn new(name: &str, image: &str, program: &str) -> Container {
        Container {
            name: name.to_string(),
            image: image.to_string(),
            program: program.to_string(),
            state: State::Waiting {
                reason: "ContainerCreating".into(),
                message: String::new(),
            },
            ready: false,
            restarts: 0,
            last: None,
            ever_started: false,
        }
    }

    fn json(&self) -> Value {
        let (state, id) = match &self.state {
            State::Waiting { reason, message } => {
                let mut w = json!({"reason": reason});
                if !message.is_empty() {
                    w["message"] = json!(message);
                }
                (json!({"waiting": w}), None)
            }
            State::Running { pid, started } => (
                json!({"running": {"startedAt": rfc3339(*started)}}),
                Some(format!("kedge-sim://{pid}")),
            ),
            State::Terminated(exit) => (exit.json(), None),
        };
        let mut out = json!({
            "name": self.name,
            "image": self.image,
            "imageID": format!("kedge-sim://{}", self.program),
            "ready": self.ready,
            "started": matches!(self.state, State::Running { .. }),
            "restartCount": self.restarts,
            "state": state,
            "lastState": self.last.as_ref().map(Exit::json).unwrap_or(json!({})),
        });
        if let Some(id) = id {
            out["containerID"] = json!(id);
        }
        out
    }
}

/// The pod's restart policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// `spec.restartPolicy` (default `Always`).
    pub(crate) fn of(pod: &Value) -> RestartPolicy {
        match crate::util::get_path(pod, "spec.restartPolicy").and_then(Value::as_str) {
            Some("Never") => RestartPolicy::Never,
            Some("OnFailure") => RestartPolicy::OnFailure,
            _ => RestartPolicy::Always,
        }
    }

    /// Whether a container that exited with `code` starts again.
    pub(crate) fn restarts(self, code: i32) -> bool {
        match self {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => code != 0,
            RestartPolicy::Never => false,
        }
    }
}

/// The pod facts its status repeats.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PodFacts<'a> {
    pub pod_ip: &'a str,
    pub host_ip: &'a str,
    /// When the process kubelet took the pod (simulated ms).
    pub start_time: i64,
}

fn phase(cs: &[Container]) -> &'static str {
    let ended: Option<Vec<&Exit>> = cs
        .iter()
        .map(|c| match &c.state {
            State::Terminated(e) => Some(e),
            _ => None,
        })
        .collect();
    match ended {
        Some(exits) if !exits.is_empty() => {
            if exits.iter().all(|e| e.code == 0) {
                "Succeeded"
            } else {
                "Failed"
            }
        }
        _ if cs.iter().any(|c| c.ever_started) => "Running",
        _ => "Pending",
    }
}

/// A condition keeping its `lastTransitionTime` while its status stays the same.
fn condition(old: Option<&Value>, t: &str, ok: bool, reason: Option<&str>, now: i64) -> Value {
    let status = if ok { "True" } else { "False" };
    let prev = old
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == t));
    let since = match prev {
        Some(p) if p["status"] == status => p["lastTransitionTime"].clone(),
        _ => json!(rfc3339(now)),
    };
    let mut c =
        json!({"type": t, "status": status, "lastProbeTime": null, "lastTransitionTime": since});
    if let Some(r) = reason {
        c["reason"] = json!(r);
    }
    c
}

/// The pod's status; `old` is the status stored now (its PodScheduled condition and
/// transition times are kept).
pub(crate) fn pod_status(
    old: Option<&Value>,
    cs: &[Container],
    facts: PodFacts<'_>,
    now: i64,
) -> Value {
    let phase = phase(cs);
    let terminal = matches!(phase, "Succeeded" | "Failed");
    let ready = !terminal && cs.iter().all(|c| c.ready);
    let unready = if terminal {
        Some("PodCompleted")
    } else if ready {
        None
    } else {
        Some("ContainersNotReady")
    };
    let scheduled = old
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|c| c["type"] == "PodScheduled").cloned())
        .unwrap_or_else(|| condition(None, "PodScheduled", true, None, now));
    let mut ready_cond = condition(old, "Ready", ready, unready, now);
    let mut containers_ready = condition(old, "ContainersReady", ready, unready, now);
    if !ready && !terminal {
        let names: Vec<&str> = cs
            .iter()
            .filter(|c| !c.ready)
            .map(|c| c.name.as_str())
            .collect();
        let msg = format!("containers with unready status: [{}]", names.join(" "));
        ready_cond["message"] = json!(msg);
        containers_ready["message"] = json!(msg);
    }
    json!({
        "phase": phase,
        "conditions": [
            condition(old, "PodReadyToStartContainers", !terminal, None, now),
            condition(old, "Initialized", true, None, now),
            ready_cond,
            containers_ready,
            scheduled,
        ],
        "hostIP": facts.host_ip,
        "hostIPs": [{"ip": facts.host_ip}],
        "podIP": facts.pod_ip,
        "podIPs": [{"ip": facts.pod_ip}],
        "startTime": rfc3339(facts.start_time),
        "qosClass": "BestEffort",
        "containerStatuses": cs.iter().map(Container::json).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::{Container, Exit, PodFacts, RestartPolicy, State, pod_status};

    const FACTS: PodFacts<'static> = PodFacts {
        pod_ip: "127.1.0.9",
        host_ip: "172.18.0.2",
        start_time: 1_000,
    };

    fn cond<'a>(s: &'a Value, t: &str) -> &'a Value {
        s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == t)
            .unwrap()
    }

    #[test]
    fn a_running_unready_container_makes_a_running_unready_pod() {
        let mut c = Container::new("app", "img:1", "/bin/app");
        c.state = State::Running {
            pid: 42,
            started: 2_000,
        };
        c.ever_started = true;
        let s = pod_status(None, std::slice::from_ref(&c), FACTS, 3_000);
        assert_eq!(s["phase"], "Running");
        assert_eq!(cond(&s, "Ready")["status"], "False");
        assert_eq!(
            cond(&s, "Ready")["message"],
            "containers with unready status: [app]"
        );
        assert_eq!(s["containerStatuses"][0]["containerID"], "kedge-sim://42");
        c.ready = true;
        let later = pod_status(Some(&s), std::slice::from_ref(&c), FACTS, 9_000);
        assert_eq!(cond(&later, "Ready")["status"], "True");
        assert_eq!(
            cond(&later, "Initialized")["lastTransitionTime"],
            cond(&s, "Initialized")["lastTransitionTime"],
            "an unchanged condition keeps its transition time"
        );
    }

    #[test]
    fn phases_follow_exits_and_the_restart_policy() {
        let exit = |code| Exit {
            code,
            started: 1,
            finished: 2,
        };
        let mut c = Container::new("job", "img", "/bin/job");
        assert_eq!(pod_status(None, &[c.clone()], FACTS, 5)["phase"], "Pending");
        c.state = State::Terminated(exit(0));
        assert_eq!(
            pod_status(None, &[c.clone()], FACTS, 5)["phase"],
            "Succeeded"
        );
        c.state = State::Terminated(exit(3));
        let s = pod_status(None, &[c.clone()], FACTS, 5);
        assert_eq!(s["phase"], "Failed");
        assert_eq!(
            s["containerStatuses"][0]["state"]["terminated"]["reason"],
            "Error"
        );
        assert!(RestartPolicy::Always.restarts(0));
        assert!(RestartPolicy::OnFailure.restarts(1) && !RestartPolicy::OnFailure.restarts(0));
        assert!(!RestartPolicy::Never.restarts(1));
    }
}
