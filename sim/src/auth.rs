//! Optional bearer-token authentication with RBAC enforcement. Requests without
//! an `Authorization` header are admin (test access); requests with a token the
//! cluster issued are authorized by the RBAC objects in the store.

use serde_json::Value;

use crate::error::{Error, Result};
use crate::rbac::{RbacSource, RequestAttributes, UserInfo, authorize, forbidden_message};
use crate::store::Store;

const RBAC: &str = "rbac.authorization.k8s.io";

/// The store's RBAC objects.
struct StoreRbac<'a>(&'a Store);

impl RbacSource for StoreRbac<'_> {
    fn role(&self, namespace: &str, name: &str) -> Option<Value> {
        self.0
            .get(&format!("{RBAC}/roles"), namespace, name)
            .map(|o| (**o).clone())
    }

    fn cluster_role(&self, name: &str) -> Option<Value> {
        self.0
            .get(&format!("{RBAC}/clusterroles"), "", name)
            .map(|o| (**o).clone())
    }

    fn role_bindings(&self, namespace: &str) -> Vec<Value> {
        self.0
            .list(&format!("{RBAC}/rolebindings"), Some(namespace))
            .map(|o| (**o).clone())
            .collect()
    }

    fn cluster_role_bindings(&self) -> Vec<Value> {
        self.0
            .list(&format!("{RBAC}/clusterrolebindings"), None)
            .map(|o| (**o).clone())
            .collect()
    }
}

/// Checks a resource request of `user`; `Err(Forbidden)` with the real message if denied.
pub fn check(store: &Store, user: &UserInfo, attrs: &RequestAttributes) -> Result<()> {
    let decision = authorize(&StoreRbac(store), user, attrs);
    if decision.allowed {
        Ok(())
    } else {
        Err(Error::Forbidden(forbidden_message(
            user,
            attrs,
            &decision.reason,
        )))
    }
}

/// The RBAC verb of an HTTP request.
pub fn verb(method: &axum::http::Method, named: bool, watch: bool) -> &'static str {
    use axum::http::Method;
    match (method, named) {
        (&Method::GET | &Method::HEAD, true) => "get",
        (&Method::GET | &Method::HEAD, false) if watch => "watch",
        (&Method::GET | &Method::HEAD, false) => "list",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        _ => "unknown",
    }
}
