//! Subcommands of the `kubectl-kedge` plugin.

pub mod crds;
pub mod dev_certs;
pub mod sessions;
