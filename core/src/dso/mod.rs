//! Replica distribution of a `DistributedScaledObject`: who runs how many replicas.
//!
//! The hub calls [`outcome::outcome`] every time the total, a member's health or a member's
//! report changes: it turns what the hub knows of each member ([`member::MemberFacts`]) into
//! a [`member::MemberPhase`], plans with [`plan`] (the desired replica count per member with
//! the reason for it), and returns the status, Events and commands.

pub mod distribute;
pub mod member;
pub mod outcome;
mod plan;

pub use plan::{DsoPlan, DsoPlanInput, MemberDecision, MemberObservation, Reason, plan};
