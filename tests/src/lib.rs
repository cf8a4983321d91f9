//! kedge-sim: an in-memory Kubernetes API simulator hosting many virtual clusters.
//!
//! The modules below are pure building blocks of the API server (no I/O, except
//! the UDP relay), each unit-tested against the Kubernetes API semantics they reproduce.

pub mod jsonpath;
pub mod patch;
pub mod quantity;
pub mod rbac;
pub mod relay;
pub mod selector;
pub mod table;
