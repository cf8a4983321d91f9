//! The real Helm engine for the chart tests: `scripts/helm-env.sh` installs the pinned
//! helm-python-sdk (Helm v4's Go library) and kubernetes-validate in `target/pyenv` once,
//! and `scripts/helm_chart.py` renders, lints, installs, upgrades and uninstalls with it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

/// Longest a single Helm call may take (an install waits for nothing; render takes ~1 s).
const HELM_LIMIT: std::time::Duration = std::time::Duration::from_secs(180);

/// The workspace root (the e2e crate lives in `tests/`).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// A chart under `deploy/charts`.
pub fn chart(name: &str) -> PathBuf {
    workspace().join("deploy/charts").join(name)
}

/// The virtualenv's Python, installed on first use (`make test` installs it beforehand, so
/// parallel test binaries never race on a fresh clone).
pub fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = Command::new("bash")
            .arg(workspace().join("scripts/helm-env.sh"))
            .output()
            .expect("cannot run scripts/helm-env.sh");
        assert!(
            out.status.success(),
            "scripts/helm-env.sh failed (it needs python3 with venv and PyPI):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        workspace().join(path)
    })
}

/// Runs `scripts/helm_chart.py ARGS` with `values` as JSON on stdin; its JSON answer.
pub fn helm(args: &[&str], values: &Value) -> Value {
    let mut child = Command::new(python())
        .arg(workspace().join("scripts/helm_chart.py"))
        .args(args)
        .current_dir(workspace())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start the chart helper");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(values.to_string().as_bytes())
        .unwrap();
    // Bounded: a Helm call that hangs (an API server that never answers) fails the test.
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    let out = match rx.recv_timeout(HELM_LIMIT) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("helm_chart.py {args:?} did not finish within {HELM_LIMIT:?}");
        }
    };
    assert!(
        out.status.success(),
        "helm_chart.py {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "helm_chart.py {args:?}: not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// What Helm rendered for `chart` in `namespace`: its objects (CRDs apart), every one
/// validated; or Helm's refusal.
pub fn render(chart_name: &str, namespace: &str, values: &Value) -> Result<Rendered, String> {
    let path = chart(chart_name);
    let out = helm(&["render", path.to_str().unwrap(), namespace], values);
    if let Some(e) = out["error"].as_str() {
        return Err(e.to_owned());
    }
    let list = |k: &str| out[k].as_array().cloned().unwrap_or_default();
    Ok(Rendered {
        objects: list("objects"),
        crds: list("crds"),
        invalid: list("invalid")
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        unvalidated: list("unvalidated")
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
    })
}

/// A chart rendered by Helm.
#[derive(Debug)]
pub struct Rendered {
    /// The templates' objects.
    pub objects: Vec<Value>,
    /// The chart's `crds/`.
    pub crds: Vec<Value>,
    /// Schema violations found by kubernetes-validate (strict).
    pub invalid: Vec<String>,
    /// Kinds kubernetes-validate has no schema for.
    pub unvalidated: Vec<String>,
}

impl Rendered {
    /// The objects of `kind`.
    pub fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.objects.iter().filter(|o| o["kind"] == kind).collect()
    }

    /// The one object of `kind` named `name`.
    pub fn get(&self, kind: &str, name: &str) -> &Value {
        self.objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
    }
}
