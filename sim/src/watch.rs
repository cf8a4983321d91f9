//! Watch streams: initial events, resumption from a resourceVersion, selector
//! transitions, bookmarks and `410 Gone`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cluster::ClusterShared;
use crate::error::{Error, Result};
use crate::http::{Req, selectors, stream_response, system_time};
use crate::resources::ResourceDef;
use crate::selector::{FieldSelector, LabelSelector, labels_of};
use crate::store::{Event, EventKind, Obj};

/// Which objects a watch sees.
struct Filter {
    res: Arc<str>,
    ns: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn matches(&self, obj: &Value) -> bool {
        (self.labels.is_everything() || self.labels.matches(&labels_of(obj)))
            && self.fields.matches(obj)
    }
}

struct WatchState {
    c: Arc<ClusterShared>,
    def: Arc<ResourceDef>,
    version: String,
    api_version: String,
    rx: broadcast::Receiver<Arc<Event>>,
    pending: VecDeque<Bytes>,
    filter: Filter,
    last_rv: u64,
    bookmarks: bool,
    next_bookmark: Instant,
    deadline: Instant,
    cancel: CancellationToken,
    table: bool,
    /// Objects as `PartialObjectMetadata` (a metadata watch).
    metadata: bool,
    table_header_sent: bool,
    done: bool,
}

/// Starts a watch (`GET ...?watch=true`).
pub(crate) fn watch(
    c: &Arc<ClusterShared>,
    r: &Req,
    def: &Arc<ResourceDef>,
    version: &str,
    ns: Option<String>,
) -> Result<Response> {
    let (labels, fields) = selectors(r, crate::events::field_kind(def))?;
    let bookmarks = matches!(r.q("allowWatchBookmarks"), Some("true" | "1"));
    let send_initial = match r.q("sendInitialEvents") {
        Some("true" | "1") => true,
        None | Some("false" | "0" | "") => false,
        Some(v) => {
            return Err(Error::BadRequest(format!(
                "invalid sendInitialEvents {v:?}"
            )));
        }
    };
    if send_initial && r.q("resourceVersionMatch") != Some("NotOlderThan") {
        return Err(Error::Invalid(
            "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan".into(),
        ));
    }
    if send_initial && !bookmarks {
        return Err(Error::Invalid(
            "allowWatchBookmarks: Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true".into(),
        ));
    }
    let timeout = match r.q("timeoutSeconds") {
        None | Some("") => Duration::from_secs(1800),
        // Capped like the server's maximum request timeout; also keeps `Instant` arithmetic safe.
        Some(t) => Duration::from_secs(
            t.parse::<u64>()
                .map_err(|_| Error::BadRequest(format!("invalid timeoutSeconds {t:?}")))?
                .min(86_400),
        ),
    };
    let rv_param = r.q("resourceVersion").filter(|v| !v.is_empty());
    let rv_num = match rv_param {
        None => None,
        Some(v) => Some(
            v.parse::<u64>()
                .map_err(|_| Error::BadRequest(format!("invalid resourceVersion {v:?}")))?,
        ),
    };
    let filter = Filter {
        res: def.key.clone(),
        ns: if def.namespaced { ns } else { None },
        labels,
        fields,
    };
    let table = r
        .headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"));
    let store = c.store();
    let rx = store.subscribe();
    let mut st = WatchState {
        c: c.clone(),
        def: def.clone(),
        version: version.to_string(),
        api_version: def.api_version(version),
        rx,
        pending: VecDeque::new(),
        filter,
        last_rv: store.rv,
        bookmarks,
        next_bookmark: Instant::now() + c.config.bookmark_interval,
        deadline: Instant::now() + timeout,
        cancel: c.watch_token(),
        table,
        metadata: r.wants_metadata(),
        table_header_sent: false,
        done: false,
    };
    // Unset or "0" means "current state, then changes" (like a list followed by a watch).
    let replay_all = send_initial || matches!(rv_num, None | Some(0));
    if replay_all {
        let objs: Vec<Obj> = store
            .list(&def.key, st.filter.ns.as_deref())
            .filter(|o| st.filter.matches(o))
            .cloned()
            .collect();
        for o in objs {
            if let Some(b) = st.render(EventKind::Added.as_str(), &o) {
                st.pending.push_back(b);
            }
        }
        if send_initial {
            let b = st.bookmark(true);
            st.pending.push_back(b);
        }
    } else if let Some(rv) = rv_num {
        match store.events_since(rv) {
            Ok(events) => {
                for ev in events {
                    if let Some(b) = st.event(&ev) {
                        st.pending.push_back(b);
                    }
                }
            }
            Err(e) => {
                st.pending.push_back(error_event(&e));
                st.done = true;
            }
        }
    }
    drop(store);
    let stream = futures::stream::unfold(st, |mut st| async move {
        let chunk = st.next().await?;
        Some((Ok::<Bytes, Infallible>(chunk), st))
    });
    Ok(stream_response(Body::from_stream(stream)))
}

fn error_event(e: &Error) -> Bytes {
    let mut v =
        serde_json::to_vec(&json!({"type": "ERROR", "object": e.status()})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

impl WatchState {
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(b) = self.pending.pop_front() {
                return Some(b);
            }
            if self.done {
                return None;
            }
            tokio::select! {
                ev = self.rx.recv() => match ev {
                    Ok(ev) => {
                        if ev.rv <= self.last_rv {
                            continue;
                        }
                        let lag = self.c.faults().watch_lag;
                        if !lag.is_zero() {
                            tokio::time::sleep_until(Instant::from_std(ev.at + lag)).await;
                        }
                        self.last_rv = ev.rv;
                        // Its CRD is gone: kube-apiserver tears the resource's storage down
                        // and ends its watches; a new list answers 404.
                        if self.ends_with(&ev) {
                            self.done = true;
                            continue;
                        }
                        if let Some(b) = self.event(&ev) {
                            return Some(b);
                        }
                    }
                    Err(RecvError::Lagged(_)) => {
                        self.done = true;
                        return Some(error_event(&Error::Gone(format!(
                            "too old resource version: {} (watch fell behind)", self.last_rv
                        ))));
                    }
                    Err(RecvError::Closed) => return None,
                },
                _ = tokio::time::sleep_until(self.next_bookmark), if self.bookmarks => {
                    self.next_bookmark = Instant::now() + self.c.config.bookmark_interval;
                    return Some(self.bookmark(false));
                }
                _ = tokio::time::sleep_until(self.deadline) => return None,
                _ = self.cancel.cancelled() => return None,
            }
        }
    }

    /// Whether `ev` deletes the CRD that defines this watch's resource.
    fn ends_with(&self, ev: &Event) -> bool {
        self.def.crd
            && ev.kind == EventKind::Deleted
            && &*ev.res == "apiextensions.k8s.io/customresourcedefinitions"
            && ResourceDef::from_crd(&ev.obj).is_some_and(|d| d.key == self.def.key)
    }

    /// Renders a store event for this watch, translating selector transitions.
    fn event(&mut self, ev: &Event) -> Option<Bytes> {
        if ev.res != self.filter.res {
            return None;
        }
        if let Some(ns) = &self.filter.ns
            && *ns != ev.ns
        {
            return None;
        }
        let now_matches = self.filter.matches(&ev.obj);
        let kind = match ev.kind {
            EventKind::Modified => {
                let was = ev.old.as_ref().is_some_and(|o| self.filter.matches(o));
                match (was, now_matches) {
                    (true, true) => EventKind::Modified,
                    (false, true) => EventKind::Added,
                    (true, false) => EventKind::Deleted,
                    (false, false) => return None,
                }
            }
            k if now_matches => k,
            _ => return None,
        };
        let same_version =
            ev.obj.get("apiVersion").and_then(Value::as_str) == Some(self.api_version.as_str());
        if !self.table && !self.metadata && same_version {
            let obj = ev
                .json
                .get_or_init(|| serde_json::to_vec(&*ev.obj).unwrap_or_default());
            let mut out = Vec::with_capacity(obj.len() + 32);
            out.extend_from_slice(b"{\"type\":\"");
            out.extend_from_slice(kind.as_str().as_bytes());
            out.extend_from_slice(b"\",\"object\":");
            out.extend_from_slice(obj);
            out.extend_from_slice(b"}\n");
            return Some(Bytes::from(out));
        }
        self.render(kind.as_str(), &ev.obj)
    }

    fn render(&mut self, kind: &str, obj: &Value) -> Option<Bytes> {
        let event = crate::events::converted(&self.def, &self.api_version, obj);
        let obj = event.as_ref().unwrap_or(obj);
        let mut out = Vec::with_capacity(512);
        out.extend_from_slice(b"{\"type\":\"");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\",\"object\":");
        if self.table {
            let mut t = crate::table::to_table(
                &self.def.plural,
                std::slice::from_ref(obj),
                self.def.printer_columns.as_ref(),
                system_time(self.c.now()),
            );
            if self.table_header_sent {
                t["columnDefinitions"] = json!([]);
            }
            self.table_header_sent = true;
            t["metadata"] = json!({"resourceVersion": crate::util::meta_str(obj, "resourceVersion").unwrap_or_default()});
            serde_json::to_writer(&mut out, &t).ok()?;
        } else if self.metadata {
            serde_json::to_writer(&mut out, &crate::table::partial_metadata(obj)).ok()?;
        } else if obj.get("apiVersion").and_then(Value::as_str) == Some(self.api_version.as_str()) {
            serde_json::to_writer(&mut out, obj).ok()?;
        } else {
            let o = crate::convert::to_served(&self.def, &self.version, obj);
            serde_json::to_writer(&mut out, &o).ok()?;
        }
        out.extend_from_slice(b"}\n");
        Some(Bytes::from(out))
    }

    fn bookmark(&mut self, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": self.last_rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": self.def.kind, "apiVersion": self.api_version, "metadata": meta});
        let mut v =
            serde_json::to_vec(&json!({"type": "BOOKMARK", "object": obj})).unwrap_or_default();
        v.push(b'\n');
        Bytes::from(v)
    }
}
