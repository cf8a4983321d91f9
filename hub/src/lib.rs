//! kedge hub: controllers, QUIC server, CA, member registry and the `kubectl-kedge` plugin.

pub mod cli;
