//! Events the controllers publish: one type for DSOs and DSJs, decided in kedge-core; and
//! their volume: what one reconciliation publishes stays a handful, whatever the fleet size.

/// Severity of an Event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// Something worth knowing.
    Normal,
    /// Something worth acting on.
    Warning,
}

/// An Event to publish about a DSO or DSJ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Severity.
    pub kind: EventKind,
    /// Reason (one of the `EVENT_*` constants).
    pub reason: &'static str,
    /// Action, for `events.k8s.io/v1`.
    pub action: &'static str,
    /// What happened, naming members.
    pub note: String,
}

impl Event {
    /// A `Normal` Event of the `Reconcile` action.
    pub fn normal(reason: &'static str, note: String) -> Self {
        Self {
            kind: EventKind::Normal,
            reason,
            action: "Reconcile",
            note,
        }
    }

    /// A `Warning` Event of the `Reconcile` action.
    pub fn warning(reason: &'static str, note: String) -> Self {
        Self {
            kind: EventKind::Warning,
            ..Self::normal(reason, note)
        }
    }
}

/// Events of the same reason that one reconciliation publishes one by one; beyond, one Event
/// names this many and counts the rest.
pub const ALIKE_SHOWN: usize = 5;

/// Folds events that share a reason into one once there are more than [`ALIKE_SHOWN`] of
/// them (as client-go's event aggregator combines similar Events): its note is the first
/// notes and how many more there were; the first event of the reason gives everything else.
/// Order is kept: each reason where it first appeared. Half of a large fleet lost at once is
/// one Event, not thousands of API writes made while the reconciliation waits.
pub fn fold_alike<E>(
    events: Vec<E>,
    reason: impl Fn(&E) -> &str,
    note: impl Fn(&E) -> &str,
    with_note: impl Fn(E, String) -> E,
) -> Vec<E> {
    let mut by_reason: Vec<Vec<E>> = Vec::new();
    for event in events {
        match by_reason
            .iter_mut()
            .find(|same| reason(&same[0]) == reason(&event))
        {
            Some(same) => same.push(event),
            None => by_reason.push(vec![event]),
        }
    }
    by_reason
        .into_iter()
        .flat_map(|mut same| {
            if same.len() <= ALIKE_SHOWN {
                return same;
            }
            let more = same.len() - ALIKE_SHOWN;
            let notes: Vec<&str> = same.iter().take(ALIKE_SHOWN).map(&note).collect();
            let folded = format!("{}; and {more} more", notes.join("; "));
            same.truncate(1);
            same.into_iter()
                .map(|first| with_note(first, folded.clone()))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fold(events: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
        fold_alike(events.to_vec(), |e| e.0, |e| &e.1, |e, note| (e.0, note))
    }

    #[test]
    fn a_few_stay_apart_and_many_of_a_reason_become_one() {
        let few: Vec<_> = (0..3).map(|i| ("Lost", format!("m{i}"))).collect();
        assert_eq!(fold(&few), few);
        let mut many: Vec<_> = (0..9).map(|i| ("Lost", format!("m{i}"))).collect();
        many.insert(4, ("Returned", "r1".to_owned()));
        assert_eq!(
            fold(&many),
            vec![
                ("Lost", "m0; m1; m2; m3; m4; and 4 more".to_owned()),
                ("Returned", "r1".to_owned()),
            ]
        );
    }
}
