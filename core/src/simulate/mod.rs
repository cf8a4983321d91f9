//! `kubectl kedge simulate`: run the planners on a scenario file, without any cluster.
//!
//! A scenario gives the resource kind and spec, the members at the start, and steps (a DSO
//! total, or DSJ trigger readings, plus optional member changes). After each step the
//! reachable members are taken to run what was decided; time advances by `interval`
//! between steps, which ages unreachable members, unschedulable replicas and pending Jobs.

mod render;
mod run;
mod scenario;

pub use render::render_table;
pub use run::{
    ConditionReport, DsjStepReport, DsoStepReport, EventReport, Report, StepReport, simulate,
};
pub use scenario::{AnyScenario, KIND_DSJ, KIND_DSO, Scenario, ScenarioMember, Step, parse};
