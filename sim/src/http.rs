//! The request and response shapes the API and its watches share: a parsed request, its
//! selectors, a streaming response, simulated time as `SystemTime`.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::error::Result;
use crate::rbac::UserInfo;
use crate::selector::{FieldSelector, LabelSelector};

/// A parsed request.
#[derive(Debug)]
pub(crate) struct Req {
    pub method: Method,
    pub segs: Vec<String>,
    pub query: Vec<(String, String)>,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The authenticated user; `None` for unauthenticated (admin) test access.
    pub user: Option<UserInfo>,
}

impl Req {
    pub(crate) fn q(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn flag(&self, key: &str) -> bool {
        matches!(self.q(key), Some("true" | "1"))
    }

    pub(crate) fn accept(&self) -> &str {
        self.headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    pub(crate) fn content_type(&self) -> &str {
        self.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
    }

    pub(crate) fn wants_table(&self) -> bool {
        self.accept().contains("as=Table")
    }

    /// Whether the client asked for metadata only (`as=PartialObjectMetadata` for an object
    /// or a watch, `as=PartialObjectMetadataList` for a list), as kube's `*_metadata` calls
    /// and metadata watchers do.
    pub(crate) fn wants_metadata(&self) -> bool {
        !self.wants_table() && self.accept().contains("as=PartialObjectMetadata")
    }
}

/// Label and field selectors of a request.
pub(crate) fn selectors(r: &Req, kind: &str) -> Result<(LabelSelector, FieldSelector)> {
    let l = LabelSelector::parse(r.q("labelSelector").unwrap_or_default())?;
    let f = FieldSelector::parse_for_kind(r.q("fieldSelector").unwrap_or_default(), kind)?;
    Ok((l, f))
}

/// A streaming response body.
pub(crate) fn stream_response(body: Body) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-cache, private"),
        ],
        body,
    )
        .into_response()
}

/// Simulated milliseconds as `SystemTime`.
pub(crate) fn system_time(ms: i64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(query: &[(&str, &str)]) -> Req {
        Req {
            method: Method::GET,
            segs: Vec::new(),
            query: query
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            headers: HeaderMap::new(),
            body: Bytes::new(),
            user: None,
        }
    }

    #[test]
    fn flags_and_selectors_come_from_the_query() {
        let r = req(&[
            ("watch", "1"),
            ("labelSelector", "app=web"),
            ("fieldSelector", "metadata.name=x"),
        ]);
        assert!(r.flag("watch"));
        assert!(!r.flag("allowWatchBookmarks"));
        assert!(!r.wants_table());
        let (labels, fields) = selectors(&r, "Pod").unwrap();
        assert_eq!(labels, LabelSelector::parse("app=web").unwrap());
        assert_eq!(
            fields,
            FieldSelector::parse_for_kind("metadata.name=x", "Pod").unwrap()
        );
        assert!(selectors(&req(&[("labelSelector", "a in (")]), "Pod").is_err());
    }

    #[test]
    fn system_time_clamps_before_the_epoch() {
        assert_eq!(system_time(-5), std::time::UNIX_EPOCH);
        assert_eq!(
            system_time(1_500),
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_500)
        );
    }
}
