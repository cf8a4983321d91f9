//! kedge-sim: a Kubernetes API simulator hosting many virtual clusters.
//!
//! Each virtual cluster is an in-memory API server on its own loopback port
//! (plain HTTP) with simulated controllers (scheduler, kubelet, ReplicaSet,
//! Deployment, StatefulSet, Job, garbage collector, KEDA). See `README.md`.

pub mod api;
pub mod cluster;
pub mod controllers;
pub mod defaults;
pub mod error;
pub mod interim;
pub mod keda;
pub mod openapi;
pub mod protobuf;
pub mod resources;
pub mod store;
pub mod util;
mod watch;

pub use cluster::{ANN_OUTCOME, ANN_RUN_SECONDS, Cluster, Faults, Sim, SimClock, SimConfig};
pub use error::{Error, Result};
