//! kedge-core: the CRD types of kedge and every placement and scaling decision as pure,
//! deterministic functions. Nothing here performs I/O, reads a clock (time is a parameter),
//! spawns tasks or draws random numbers, so the hub, the CLI and the benchmarks all reach
//! the same decisions from the same inputs.

pub mod crd;
pub mod dsj;
pub mod dso;
pub mod duration;
mod error;
pub mod simulate;
pub mod validate;

pub use error::{Error, Result};
