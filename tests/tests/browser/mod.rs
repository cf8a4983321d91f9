//! A real headless Chromium for the web tests, driven over the Chrome DevTools Protocol.
//! `scripts/browser-env.sh` installs Debian's `chromium` (`make test` runs it first, so
//! parallel test binaries never race on a fresh clone); `KEDGE_CHROMIUM` names another binary.
//! Kept apart from `support` so that only the binaries that drive a browser compile it.
// Harness code: a panic is how a test fails.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

mod cdp;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use cdp::Cdp;

/// Longest Chromium may take to open its DevTools port (about a second here).
const LAUNCH_LIMIT: Duration = Duration::from_secs(20);
/// The window's and every new page's viewport, in CSS pixels.
pub const VIEWPORT: (u32, u32) = (1400, 900);
/// How often [`Page::wait_for`] evaluates its predicate.
const POLL: Duration = Duration::from_millis(100);

/// The Chromium binary, installed on first use by `scripts/browser-env.sh`.
pub fn chromium() -> &'static Path {
    static CHROMIUM: OnceLock<PathBuf> = OnceLock::new();
    CHROMIUM.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("workspace root");
        let out = std::process::Command::new("bash")
            .arg(root.join("scripts/browser-env.sh"))
            .output()
            .expect("cannot run scripts/browser-env.sh");
        assert!(
            out.status.success(),
            "scripts/browser-env.sh failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// A headless Chromium with a fresh profile; killed (that process only) when dropped.
pub struct Browser {
    child: Child,
    port: u16,
    cdp: Cdp,
    stderr_log: PathBuf,
    // Dropped after the process is gone (fields drop after `Drop::drop`).
    dir: tempfile::TempDir,
}

impl Browser {
    /// Starts Chromium and connects to it; panics with its stderr when it has not opened its
    /// DevTools port within 20 s.
    pub async fn launch() -> Browser {
        let dir = tempfile::tempdir().expect("temporary directory");
        let profile = dir.path().join("profile");
        let stderr_log = dir.path().join("stderr.log");
        let child = Command::new(chromium())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--window-size={},{}", VIEWPORT.0, VIEWPORT.1))
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr_log).expect("chromium's stderr log"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromium().display()));
        let mut starting = Starting {
            child: Some(child),
            stderr_log: stderr_log.clone(),
        };
        let (port, path) = starting
            .devtools_port(&profile.join("DevToolsActivePort"))
            .await;
        let cdp = Cdp::connect(&format!("ws://127.0.0.1:{port}{path}")).await;
        Browser {
            child: starting.child.take().unwrap(),
            port,
            cdp,
            stderr_log,
            dir,
        }
    }

    /// Opens a new tab on `url` (loaded, `document.readyState` complete) with a [`VIEWPORT`]
    /// viewport. Console messages and exceptions are recorded from before the first byte of
    /// the page.
    pub async fn new_page(&self, url: &str) -> Page {
        let target = self
            .cdp
            .call("Target.createTarget", json!({"url": "about:blank"}))
            .await;
        let id = target["targetId"]
            .as_str()
            .expect("Target.createTarget: targetId");
        let cdp = Cdp::connect(&format!("ws://127.0.0.1:{}/devtools/page/{id}", self.port)).await;
        cdp.call("Runtime.enable", json!({})).await;
        cdp.call("Page.enable", json!({})).await;
        let page = Page { cdp };
        // The window is 1400x900 but headless Chromium keeps room for a window frame; the
        // page gets all of it, so a screenshot is exactly that size.
        page.set_viewport(VIEWPORT.0, VIEWPORT.1).await;
        page.navigate(url).await;
        page
    }

    /// What Chromium wrote on stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// SIGKILL to exactly this process, then reaps it (its helper processes exit with it).
fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// A Chromium not yet connected to: killed if the launch panics.
struct Starting {
    child: Option<Child>,
    stderr_log: PathBuf,
}

impl Starting {
    /// The port and browser websocket path Chromium writes into its profile once listening.
    async fn devtools_port(&mut self, file: &Path) -> (u16, String) {
        let deadline = Instant::now() + LAUNCH_LIMIT;
        loop {
            // Written whole, but read it only once both lines are there.
            let text = std::fs::read_to_string(file).unwrap_or_default();
            if let Some((port, path)) = text.split_once('\n')
                && let Ok(port) = port.trim().parse()
                && path.trim().starts_with('/')
            {
                return (port, path.trim().to_owned());
            }
            let child = self.child.as_mut().unwrap();
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "chromium exited ({status}) before listening:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "chromium did not open its DevTools port within {LAUNCH_LIMIT:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            kill(child);
        }
    }
}

/// One tab.
pub struct Page {
    cdp: Cdp,
}

impl Page {
    /// Loads `url` and waits until `document.readyState` is complete; panics when the
    /// navigation fails (refused connection, bad URL).
    pub async fn navigate(&self, url: &str) {
        // The old document may still answer `complete` for a moment: a new one lacks the mark.
        self.eval("window.__kedgeOldDocument = true").await;
        let nav = self.cdp.call("Page.navigate", json!({"url": url})).await;
        if let Some(err) = nav["errorText"].as_str().filter(|e| !e.is_empty()) {
            panic!("navigating to {url} failed: {err}");
        }
        // A same-document navigation (only the fragment changes) has no loader and keeps it.
        let predicate = if nav.get("loaderId").is_some() {
            "!window.__kedgeOldDocument && document.readyState === 'complete'"
        } else {
            "document.readyState === 'complete'"
        };
        let what = format!("{url} loaded");
        self.wait_for(predicate, Duration::from_secs(15), &what)
            .await;
    }

    /// Evaluates `js` (awaiting a promise) and returns its value as JSON (`null` for
    /// `undefined`); a thrown exception is the `Err`, with its message and stack.
    pub async fn try_eval(&self, js: &str) -> Result<Value, String> {
        let reply = self
            .cdp
            .try_call(
                "Runtime.evaluate",
                json!({"expression": js, "returnByValue": true, "awaitPromise": true}),
            )
            .await?;
        if reply.get("exceptionDetails").is_some() {
            return Err(cdp::exception_text(&reply["exceptionDetails"]));
        }
        Ok(reply["result"].get("value").cloned().unwrap_or(Value::Null))
    }

    /// [`Page::try_eval`], panicking on an exception.
    pub async fn eval(&self, js: &str) -> Value {
        self.try_eval(js)
            .await
            .unwrap_or_else(|e| panic!("evaluating `{js}` threw: {e}"))
    }

    /// Evaluates `predicate` every 100 ms until its value is truthy and returns that value;
    /// an exception counts as not yet (the element may not exist yet). Panics after
    /// `timeout` naming `what`, with the last value, the console and the page's text.
    pub async fn wait_for(&self, predicate: &str, timeout: Duration, what: &str) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let last = self.try_eval(predicate).await;
            if let Ok(value) = &last
                && truthy(value)
            {
                return value.clone();
            }
            if Instant::now() >= deadline {
                let text = self
                    .try_eval("document.body ? document.body.innerText : ''")
                    .await
                    .map(|v| v.as_str().unwrap_or_default().to_owned())
                    .unwrap_or_else(|e| format!("(unreadable: {e})"));
                panic!(
                    "timed out after {timeout:?} waiting for {what}\n  predicate: {predicate}\n  \
                     last value: {last:?}\n  console:\n    {}\n  page text: {}",
                    self.console().join("\n    "),
                    excerpt(&text, 2000)
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// A PNG of the viewport written to `path` (parent directories created).
    pub async fn screenshot(&self, path: &Path) {
        let shot = self
            .cdp
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("Page.captureScreenshot: data"))
            .expect("Page.captureScreenshot: base64");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    /// Emulates a `width` x `height` CSS-pixel viewport (scale 1, desktop).
    pub async fn set_viewport(&self, width: u32, height: u32) {
        self.cdp
            .call(
                "Emulation.setDeviceMetricsOverride",
                json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}),
            )
            .await;
    }

    /// Every console call (`console.TYPE: text`) and uncaught exception (`uncaught: ...`).
    pub fn console(&self) -> Vec<String> {
        self.cdp.console()
    }

    /// Uncaught exceptions and `console.error` calls so far; a test asserts it is empty.
    pub fn js_errors(&self) -> Vec<String> {
        self.cdp.errors()
    }
}

/// JavaScript truthiness of a JSON value (`undefined` arrives as `null`).
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

/// The first `max` characters of `text`, marked when cut.
fn excerpt(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truthiness_follows_javascript() {
        for v in [json!(null), json!(false), json!(0), json!(0.0), json!("")] {
            assert!(!truthy(&v), "{v} is falsy");
        }
        for v in [
            json!(true),
            json!(1),
            json!(-0.5),
            json!("0"),
            json!([]),
            json!({}),
        ] {
            assert!(truthy(&v), "{v} is truthy");
        }
    }

    #[test]
    fn excerpts_cut_on_characters() {
        assert_eq!(excerpt("héllo", 2), "hé...");
        assert_eq!(excerpt("héllo", 5), "héllo");
    }
}
