//! The human table of a simulation report (`-o table`).

use std::fmt::Write as _;

use super::run::{ConditionReport, Report, StepReport};
use crate::crd::conditions::CONDITION_READY;
use crate::dsj::taint::TaintLevel;
use crate::dso::Reason;

fn row(out: &mut String, cells: &[String], widths: &[usize]) {
    let line: Vec<String> = cells
        .iter()
        .zip(widths)
        .map(|(c, w)| format!("{c:<w$}"))
        .collect();
    let _ = writeln!(out, "{}", line.join("  ").trim_end());
}

fn table(header: Vec<String>, rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(String::len).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    row(&mut out, &header, &widths);
    for r in &rows {
        row(&mut out, r, &widths);
    }
    out
}

/// A condition's status, with its reason when it is `unhealthy`.
fn condition(conditions: &[ConditionReport], type_: &str, unhealthy: &str) -> String {
    match conditions.iter().find(|c| c.type_ == type_) {
        Some(c) if c.status == unhealthy => format!("{} {}", c.status, c.reason),
        Some(c) => c.status.clone(),
        None => "-".to_owned(),
    }
}

/// Renders a report as an aligned text table, one row per step. DSO cells show the desired
/// replicas with a marker for anything but a plain weighted share; DSJ cells show Jobs to
/// create, with the member's Jobs before the step and its taint.
pub fn render_table(report: &Report) -> String {
    let mut notes: Vec<String> = Vec::new();
    let mut rows = Vec::new();
    let is_dso = matches!(report.steps.first(), Some(StepReport::Dso(_)));
    for (i, step) in report.steps.iter().enumerate() {
        let mut cells = vec![(i + 1).to_string()];
        match step {
            StepReport::Dso(s) => {
                cells.push(s.replicas.to_string());
                cells.push(s.total.to_string());
                for name in &report.members {
                    let desired = s.desired.get(name).copied().unwrap_or(0);
                    let reason = s.reasons.get(name).copied().unwrap_or(Reason::Weighted);
                    if matches!(reason, Reason::Weighted | Reason::SpillOver) {
                        cells.push(desired.to_string());
                    } else {
                        cells.push(format!("{desired}*"));
                        notes.push(format!("step {}: {name}: {}", i + 1, reason.describe()));
                    }
                }
                cells.push(s.shortfall.to_string());
                cells.push(s.moved.to_string());
                if s.paused {
                    notes.push(format!("step {}: paused by annotation", i + 1));
                }
            }
            StepReport::Dsj(s) => {
                cells.push(s.desired_jobs.to_string());
                cells.push(s.to_create.to_string());
                for name in &report.members {
                    let create = s.create.get(name).copied().unwrap_or(0);
                    let running = s.running.get(name).copied().unwrap_or(0);
                    let pending = s.pending.get(name).copied().unwrap_or(0);
                    let taint = match s.taints.get(name) {
                        Some(TaintLevel::Soft) => " soft",
                        Some(TaintLevel::Hard) => " HARD",
                        _ => "",
                    };
                    cells.push(format!("+{create} ({running}/{pending}){taint}"));
                    let replaced = s.replacements.get(name).copied().unwrap_or(0);
                    if replaced > 0 {
                        notes.push(format!(
                            "step {}: {name}: {replaced} replacing stuck Jobs",
                            i + 1
                        ));
                    }
                    let deleted = s.deleted.get(name).copied().unwrap_or(0);
                    if deleted > 0 {
                        notes.push(format!(
                            "step {}: {name}: {deleted} deleted by duplicationPolicy",
                            i + 1
                        ));
                    }
                    let failed = s.failed_creates.get(name).copied().unwrap_or(0);
                    if failed > 0 {
                        notes.push(format!("step {}: {name}: {failed} creates failed", i + 1));
                    }
                }
                cells.push(s.unplaced.to_string());
                cells.push(condition(&s.conditions, CONDITION_READY, "False"));
                cells.push(condition(&s.conditions, "Degraded", "True"));
                if s.paused {
                    notes.push(format!("step {}: paused by annotation", i + 1));
                }
                for e in &s.events {
                    notes.push(format!(
                        "step {}: {} {}: {}",
                        i + 1,
                        e.type_,
                        e.reason,
                        e.note
                    ));
                }
            }
        }
        rows.push(cells);
    }
    let mut header = vec!["STEP".to_owned()];
    if is_dso {
        header.extend(["REPLICAS".to_owned(), "TOTAL".to_owned()]);
    } else {
        header.extend(["DESIRED".to_owned(), "CREATE".to_owned()]);
    }
    header.extend(report.members.iter().map(|m| m.to_uppercase()));
    if is_dso {
        header.extend(["SHORTFALL".to_owned(), "MOVED".to_owned()]);
    } else {
        header.extend([
            "UNPLACED".to_owned(),
            "READY".to_owned(),
            "DEGRADED".to_owned(),
        ]);
    }
    let mut out = table(header, rows);
    if !is_dso {
        out.push_str(
            "member cells: +created (jobs/pending before the step) [taint]; READY, DEGRADED: \
             the conditions, with the reason when not healthy; Events below\n",
        );
    }
    for note in notes {
        let _ = writeln!(out, "* {note}");
    }
    out
}
