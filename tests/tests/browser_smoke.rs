//! The browser harness itself, on a real headless Chromium: a page that follows server-sent
//! events from an axum server on loopback (the dashboard's shape), a screenshot, and the
//! JavaScript errors a page test asserts on.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod browser;

use std::convert::Infallible;
use std::path::Path;
use std::time::{Duration, Instant};

use axum::Router;
use axum::response::Html;
use axum::response::sse::{Event, Sse};
use axum::routing::get;
use futures::Stream;
use tokio::sync::watch;

use browser::Browser;

const WAIT: Duration = Duration::from_secs(5);

const PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>kedge browser smoke</title>
<style>body { font: 20px sans-serif; margin: 40px; background: #f4f6fa; }
#out { padding: 16px; border: 2px solid #2a5db0; background: #fff; }</style></head>
<body><h1>kedge browser smoke</h1><p id="out">waiting</p>
<script>
const out = document.getElementById("out");
const source = new EventSource("/events");
source.onmessage = (e) => { out.textContent = e.data; };
console.log("smoke page started");
</script></body></html>"#;

const BROKEN: &str = r#"<!doctype html>
<html><body><p>broken</p>
<script>console.error("kedge smoke: logged error"); null.missing;</script></body></html>"#;

/// Each connection gets the current message, then every new one (level-triggered, as the
/// dashboard pushes its state).
fn events(mut rx: watch::Receiver<String>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    rx.mark_changed();
    Sse::new(futures::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        let data = rx.borrow_and_update().clone();
        Some((Ok(Event::default().data(data)), rx))
    }))
}

/// Serves the two pages and the event stream on 127.0.0.1; the base URL.
async fn serve(rx: watch::Receiver<String>) -> String {
    let app = Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route("/broken", get(|| async { Html(BROKEN) }))
        .route("/events", get(move || async move { events(rx) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

#[tokio::test]
async fn a_page_follows_server_sent_events_and_is_captured() {
    let started = Instant::now();
    let (tx, rx) = watch::channel("first message".to_owned());
    let base = serve(rx).await;
    let browser = Browser::launch().await;
    let page = browser.new_page(&format!("{base}/")).await;

    let shown = "document.getElementById('out').textContent";
    page.wait_for(
        &format!("{shown} === 'first message'"),
        WAIT,
        "the first event on the page",
    )
    .await;
    tx.send("second message".to_owned()).unwrap();
    page.wait_for(
        &format!("{shown} === 'second message'"),
        WAIT,
        "the second event on the page",
    )
    .await;
    assert_eq!(page.eval("document.title").await, "kedge browser smoke");
    assert!(
        page.console()
            .contains(&"console.log: smoke page started".to_owned()),
        "{:?}",
        page.console()
    );

    // A new page's viewport is the window's size; a test can change it.
    assert_eq!(
        page.eval("[innerWidth, innerHeight]").await,
        serde_json::json!([1400, 900])
    );
    let shot =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-screenshots/browser-smoke.png");
    page.screenshot(&shot).await;
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(
        png.len() > 5_000,
        "a {} byte screenshot is blank",
        png.len()
    );
    assert_eq!(png_size(&png), (1400, 900));
    page.set_viewport(800, 600).await;
    assert_eq!(
        page.eval("[innerWidth, innerHeight]").await,
        serde_json::json!([800, 600])
    );

    assert_eq!(page.js_errors(), Vec::<String>::new());
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn errors_and_exceptions_are_reported() {
    let (_tx, rx) = watch::channel(String::new());
    let base = serve(rx).await;
    let browser = Browser::launch().await;
    let page = browser.new_page(&format!("{base}/broken")).await;

    page.wait_for("true", WAIT, "a loaded page").await;
    let deadline = Instant::now() + WAIT;
    while page.js_errors().len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let errors = page.js_errors();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert_eq!(errors[0], "console.error: kedge smoke: logged error");
    assert!(
        errors[1].starts_with("TypeError: Cannot read properties of null"),
        "{errors:?}"
    );
    assert!(
        errors[1].contains(&format!("({base}/broken:3:")),
        "{errors:?}"
    );

    let thrown = page
        .try_eval("(() => { throw new Error('from eval'); })()")
        .await;
    assert!(thrown.unwrap_err().starts_with("Error: from eval"));
    assert_eq!(
        page.try_eval("undefined").await,
        Ok(serde_json::Value::Null)
    );
    assert_eq!(
        page.try_eval("Promise.resolve(42)").await,
        Ok(serde_json::json!(42))
    );
}

/// Width and height from a PNG's IHDR chunk.
fn png_size(png: &[u8]) -> (u32, u32) {
    let be = |b: &[u8]| u32::from_be_bytes(b.try_into().unwrap());
    (be(&png[16..20]), be(&png[20..24]))
}

#[tokio::test]
#[should_panic(expected = "waiting for a heading that never comes")]
async fn a_wait_that_times_out_names_what_it_waited_for() {
    let (_tx, rx) = watch::channel("shown".to_owned());
    let base = serve(rx).await;
    let browser = Browser::launch().await;
    let page = browser.new_page(&format!("{base}/")).await;
    page.wait_for(
        "document.querySelector('h2').textContent",
        Duration::from_millis(300),
        "a heading that never comes",
    )
    .await;
}
