//! One Chrome DevTools Protocol connection: commands matched to their responses by id, the
//! events a page test needs (console messages, uncaught exceptions) kept, the rest dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::SinkExt;
use futures::stream::{SplitSink, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// Longest a single command may wait for its response (a screenshot of a large page is the
/// slowest, well under a second here).
pub const COMMAND_LIMIT: Duration = Duration::from_secs(15);

type Sink = SplitSink<WebSocketStream<MaybeTlsStream<TcpStream>>, Message>;
type Reply = Result<Value, String>;

/// What the page reported on its own: every console call and every uncaught exception.
#[derive(Default)]
pub struct Events {
    /// `console.TYPE: text`, in order.
    pub console: Vec<String>,
    /// Uncaught exceptions and `console.error` calls, in order.
    pub errors: Vec<String>,
}

pub struct Cdp {
    sink: tokio::sync::Mutex<Sink>,
    next_id: AtomicU64,
    // A std mutex: held only to insert or take an entry, never across an await.
    pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>,
    events: Arc<Mutex<Events>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Cdp {
    /// Connects to a DevTools websocket (`ws://127.0.0.1:PORT/devtools/...`).
    pub async fn connect(url: &str) -> Cdp {
        let (ws, _) = tokio::time::timeout(COMMAND_LIMIT, tokio_tungstenite::connect_async(url))
            .await
            .unwrap_or_else(|_| {
                panic!("DevTools websocket {url}: no handshake within {COMMAND_LIMIT:?}")
            })
            .unwrap_or_else(|e| panic!("DevTools websocket {url}: {e}"));
        let (sink, mut stream) = ws.split();
        let pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>> = Arc::default();
        let events: Arc<Mutex<Events>> = Arc::default();
        let reader = tokio::spawn({
            let pending = pending.clone();
            let events = events.clone();
            async move {
                while let Some(Ok(msg)) = stream.next().await {
                    let Ok(text) = msg.to_text() else { continue };
                    let Ok(msg) = serde_json::from_str::<Value>(text) else {
                        continue;
                    };
                    dispatch(&msg, &pending, &events);
                }
                // Closed: every waiting command fails now instead of at its timeout.
                pending.lock().unwrap().clear();
            }
        });
        Cdp {
            sink: tokio::sync::Mutex::new(sink),
            next_id: AtomicU64::new(1),
            pending,
            events,
            reader,
        }
    }

    /// Sends `method` with `params`; its `result`, or the protocol's error message.
    pub async fn try_call(&self, method: &str, params: Value) -> Reply {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        let msg = json!({"id": id, "method": method, "params": params}).to_string();
        if let Err(e) = self.sink.lock().await.send(Message::text(msg)).await {
            self.pending.lock().unwrap().remove(&id);
            return Err(format!("{method}: cannot send: {e}"));
        }
        match tokio::time::timeout(COMMAND_LIMIT, rx).await {
            Ok(Ok(reply)) => reply.map_err(|e| format!("{method}: {e}")),
            Ok(Err(_)) => Err(format!("{method}: the DevTools connection closed")),
            Err(_) => {
                self.pending.lock().unwrap().remove(&id);
                Err(format!("{method}: no response within {COMMAND_LIMIT:?}"))
            }
        }
    }

    /// [`Cdp::try_call`], panicking on an error.
    pub async fn call(&self, method: &str, params: Value) -> Value {
        self.try_call(method, params)
            .await
            .unwrap_or_else(|e| panic!("DevTools {e}"))
    }

    pub fn console(&self) -> Vec<String> {
        self.events.lock().unwrap().console.clone()
    }

    pub fn errors(&self) -> Vec<String> {
        self.events.lock().unwrap().errors.clone()
    }
}

impl Drop for Cdp {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Routes one incoming message: a response to its waiting command, a console call or an
/// exception to [`Events`]; other events are ignored.
fn dispatch(
    msg: &Value,
    pending: &Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    events: &Mutex<Events>,
) {
    if let Some(id) = msg["id"].as_u64() {
        let Some(tx) = pending.lock().unwrap().remove(&id) else {
            return;
        };
        let reply = match msg.get("error") {
            Some(e) => Err(e["message"].as_str().unwrap_or("unknown error").to_owned()),
            None => Ok(msg["result"].clone()),
        };
        let _ = tx.send(reply);
        return;
    }
    let params = &msg["params"];
    match msg["method"].as_str() {
        Some("Runtime.consoleAPICalled") => {
            let kind = params["type"].as_str().unwrap_or("log");
            let text = params["args"]
                .as_array()
                .map(|args| args.iter().map(remote_text).collect::<Vec<_>>().join(" "))
                .unwrap_or_default();
            let line = format!("console.{kind}: {text}");
            let mut events = events.lock().unwrap();
            if kind == "error" || kind == "assert" {
                events.errors.push(line.clone());
            }
            events.console.push(line);
        }
        Some("Runtime.exceptionThrown") => {
            let line = exception_text(&params["exceptionDetails"]);
            let mut events = events.lock().unwrap();
            events.console.push(format!("uncaught: {line}"));
            events.errors.push(line);
        }
        _ => {}
    }
}

/// A `Runtime.RemoteObject` as text: a primitive's value, else its description.
pub fn remote_text(obj: &Value) -> String {
    match &obj["value"] {
        Value::String(s) => s.clone(),
        Value::Null => obj["unserializableValue"]
            .as_str()
            .or(obj["description"].as_str())
            .unwrap_or(obj["type"].as_str().unwrap_or("undefined"))
            .to_owned(),
        other => other.to_string(),
    }
}

/// A `Runtime.ExceptionDetails` as text: the exception's description (message and stack)
/// when there is one, else the summary, with where it was thrown.
pub fn exception_text(details: &Value) -> String {
    let what = details["exception"]["description"]
        .as_str()
        .map(str::to_owned)
        .or_else(|| {
            details["exception"]
                .get("value")
                .map(|_| remote_text(&details["exception"]))
        })
        .unwrap_or_else(|| details["text"].as_str().unwrap_or("exception").to_owned());
    match details["url"].as_str().filter(|u| !u.is_empty()) {
        Some(url) => format!(
            "{what} ({url}:{}:{})",
            details["lineNumber"].as_u64().unwrap_or(0) + 1,
            details["columnNumber"].as_u64().unwrap_or(0) + 1
        ),
        None => what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(msgs: &[Value]) -> Events {
        let pending = Mutex::default();
        let events = Mutex::default();
        for m in msgs {
            dispatch(m, &pending, &events);
        }
        events.into_inner().unwrap()
    }

    #[test]
    fn console_calls_and_exceptions_are_kept_and_errors_singled_out() {
        let events = run(&[
            json!({"method": "Runtime.consoleAPICalled", "params": {"type": "log",
                "args": [{"type": "string", "value": "hello"}, {"type": "number", "value": 3}]}}),
            json!({"method": "Runtime.consoleAPICalled", "params": {"type": "error",
                "args": [{"type": "object", "description": "Error: bad"}]}}),
            json!({"method": "Runtime.exceptionThrown", "params": {"exceptionDetails": {
                "text": "Uncaught", "url": "http://x/app.js", "lineNumber": 4, "columnNumber": 0,
                "exception": {"type": "object", "description": "TypeError: x is null"}}}}),
            json!({"method": "Page.loadEventFired", "params": {}}),
        ]);
        assert_eq!(
            events.console,
            [
                "console.log: hello 3",
                "console.error: Error: bad",
                "uncaught: TypeError: x is null (http://x/app.js:5:1)"
            ]
        );
        assert_eq!(
            events.errors,
            [
                "console.error: Error: bad",
                "TypeError: x is null (http://x/app.js:5:1)"
            ]
        );
    }

    #[test]
    fn a_thrown_primitive_and_a_bare_summary_read_as_text() {
        assert_eq!(
            exception_text(
                &json!({"text": "Uncaught", "exception": {"type": "string", "value": "boom"}})
            ),
            "boom"
        );
        assert_eq!(
            exception_text(&json!({"text": "Uncaught SyntaxError"})),
            "Uncaught SyntaxError"
        );
    }

    #[test]
    fn responses_reach_their_command_by_id() {
        let pending = Mutex::new(HashMap::new());
        let (tx1, mut rx1) = oneshot::channel();
        let (tx2, mut rx2) = oneshot::channel();
        pending.lock().unwrap().insert(1, tx1);
        pending.lock().unwrap().insert(2, tx2);
        let events = Mutex::default();
        dispatch(
            &json!({"id": 2, "error": {"code": -32000, "message": "no such target"}}),
            &pending,
            &events,
        );
        dispatch(&json!({"id": 1, "result": {"ok": true}}), &pending, &events);
        dispatch(&json!({"id": 9, "result": {}}), &pending, &events);
        assert_eq!(rx1.try_recv().unwrap(), Ok(json!({"ok": true})));
        assert_eq!(rx2.try_recv().unwrap(), Err("no such target".to_owned()));
        assert!(pending.lock().unwrap().is_empty());
    }
}
