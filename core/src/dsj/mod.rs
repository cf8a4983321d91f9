//! Jobs of a `DistributedScaledJob`: how many to create, where, how failures taint members,
//! which reported Jobs are pending, what to do with duplicates, how pod templates are
//! overridden and which finished Jobs to clean up, and [`step`]: one poll, as the hub and the
//! simulator run it.

pub mod duplication;
pub mod history;
pub mod metrics;
pub mod outcome;
pub mod overrides;
pub mod pending;
pub mod persist;
mod plan;
pub mod render;
pub mod scaling;
pub mod schedule;
pub mod step;
pub mod taint;

pub use plan::{
    DsjMemberObservation, DsjPlan, DsjPlanInput, Eligibility, MemberJobs, Replacement, plan,
};
