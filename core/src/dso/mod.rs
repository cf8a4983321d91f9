//! Replica distribution of a `DistributedScaledObject`: who runs how many replicas.
//!
//! The hub calls [`plan`] every time the total, a member's health or a member's report
//! changes; the result is the desired replica count per member with the reason for it.

pub mod distribute;
mod plan;

pub use plan::{
    DsoPlan, DsoPlanInput, MemberDecision, MemberObservation, MemberState, Reason, plan,
};
