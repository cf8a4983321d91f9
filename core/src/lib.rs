//! kedge-core: the CRD types of kedge and every placement and scaling decision as pure,
//! deterministic functions. Nothing here performs I/O, reads a clock (time is a parameter),
//! spawns tasks or draws random numbers, so the hub, the CLI and the benchmarks all reach
//! the same decisions from the same inputs.
//!
//! What the hub calls:
//!
//! - [`crd::crds`] — the CRDs to install; [`crd::conditions`] — annotation, condition,
//!   reason and label strings.
//! - [`validate::dso`] / [`validate::dsj`] — spec + annotations → typed settings, or an
//!   [`Error`] naming every offending field (for an `InvalidSpec` condition).
//! - [`dso::plan`] — settings, `spec.totalTargetReplicas` and one
//!   [`dso::MemberObservation`] per registered member → desired replicas per member with
//!   a [`dso::Reason`], the shortfall when capacity runs out, and how much was rebalanced.
//! - [`dsj::plan`] — settings, trigger readings, per-member Job counts, the
//!   [`dsj::taint::TaintBook`] and the round-robin state → Jobs to create per member,
//!   replacements of stuck Jobs, and the next round-robin state.
//! - [`dsj::taint::TaintBook::observe`] — feed stuck Jobs (see
//!   [`validate::FailoverTiming::is_stuck`]) and failed creates;
//!   [`dsj::duplication::resolve_duplicate`] — what to delete of a source/failover pair;
//!   [`dsj::overrides::apply_pod_overrides`] — the pod template for a member (with
//!   warnings for unknown containers); [`dsj::history::jobs_to_delete`] — history limits.
//! - [`simulate::simulate`] — the engine of `kubectl kedge simulate`.

pub mod crd;
pub mod dsj;
pub mod dso;
pub mod duration;
mod error;
pub mod events;
pub mod keda_object;
pub mod limits;
pub mod podmetrics;
pub mod quantity;
pub mod simulate;
pub mod tenancy;
pub mod time;
pub mod validate;

pub use error::{Error, Result};
