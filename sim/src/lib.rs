//! kedge-sim: a Kubernetes API simulator hosting many virtual clusters.
//!
//! Each virtual cluster is an in-memory API server on its own loopback port
//! (plain HTTP) with simulated controllers (scheduler, kubelet, ReplicaSet,
//! Deployment, StatefulSet, Job, garbage collector, KEDA with its external-scaler gRPC calls).
//! Pods get loopback IPs unique in the process (`pod_ips`); pods of images mapped to local
//! executables run as real processes (`processes`). See `README.md`.
//!
//! The pure building blocks (selectors, quantities, patches, server-side apply, RBAC,
//! tables, JSONPath) do no I/O and are unit-tested against the Kubernetes API semantics
//! they reproduce; `link` emulates the network between an agent and the hub (delay, jitter,
//! loss, rate, blackouts, NAT rebinding) over real UDP.

pub mod api;
pub mod auth;
pub mod cluster;
pub mod controllers;
pub mod convert;
pub mod defaults;
pub mod demo;
pub mod engines;
pub mod error;
pub mod events;
pub mod fleet;
mod http;
pub mod jsonpath;
pub mod keda;
pub mod link;
pub mod openapi;
pub mod patch;
pub mod pod_ips;
pub mod processes;
pub mod protobuf;
pub use kedge_core::quantity;
pub mod rbac;
pub mod resources;
pub mod schema;
pub mod selector;
pub mod services;
pub mod sim;
pub mod store;
pub mod table;
pub mod util;
mod watch;

pub use cluster::{ANN_OUTCOME, ANN_RUN_SECONDS, Cluster, Faults, SimClock, SimConfig};
pub use error::{Error, Result};
pub use sim::Sim;
