//! Jobs of a `DistributedScaledJob`: how many to create, where, how failures taint members,
//! which reported Jobs are pending, what to do with duplicates, how pod templates are
//! overridden and which finished Jobs to clean up.

pub mod duplication;
pub mod history;
pub mod overrides;
pub mod pending;
mod plan;
pub mod scaling;
pub mod schedule;
pub mod taint;

pub use plan::{
    DsjMemberObservation, DsjPlan, DsjPlanInput, Eligibility, MemberJobs, Replacement, plan,
};
