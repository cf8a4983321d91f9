//! Every dial of every virtual agent, kept so that a slow reconnect can be explained: how
//! many dials each agent needed, which ended how (welcomed, refused, closed by a stopping
//! hub, or no answer until the handshake timeout), and how long the agent then waited.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How a dial ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Handshake, Hello and Welcome: a session.
    Welcomed,
    /// No answer within the handshake timeout (the timeout it waited).
    Silent(Duration),
    /// The hub closed or reset the connection during the handshake.
    Closed,
    /// The hub answered the Hello with a refusal (its message).
    Refused(String),
    /// Anything else (a stream that failed after the handshake, no Welcome in time).
    Other(String),
}

impl Outcome {
    fn label(&self) -> &'static str {
        match self {
            Outcome::Welcomed => "welcomed",
            Outcome::Silent(_) => "no answer (handshake timeout)",
            Outcome::Closed => "closed by the hub",
            Outcome::Refused(_) => "refused",
            Outcome::Other(_) => "other",
        }
    }
}

/// One dial of one agent.
#[derive(Debug, Clone)]
pub(crate) struct Dial {
    pub(crate) agent: usize,
    pub(crate) started: Instant,
    pub(crate) ended: Instant,
    pub(crate) outcome: Outcome,
    /// The pause before the agent's next dial (zero after a welcome).
    pub(crate) then_waited: Duration,
}

/// Dials of every agent, in the order they ended.
#[derive(Debug, Default)]
pub(crate) struct DialLog(Mutex<Vec<Dial>>);

impl DialLog {
    pub(crate) fn record(&self, dial: Dial) {
        self.0.lock().unwrap().push(dial);
    }

    /// Dials that started at or after `since`.
    pub(crate) fn since(&self, since: Instant) -> Vec<Dial> {
        let log = self.0.lock().unwrap();
        log.iter().filter(|d| d.started >= since).cloned().collect()
    }
}

/// Where the hub restart's time went, from the dials of every agent.
#[derive(Debug)]
pub(crate) struct Restart {
    /// Dials in all, and by outcome (label, count).
    pub(crate) dials: usize,
    pub(crate) by_outcome: Vec<(&'static str, usize)>,
    /// Refusal messages (the first 70 characters) and how often.
    pub(crate) refusals: Vec<(String, usize)>,
    /// Agents by the number of dials they needed: (dials, agents).
    pub(crate) per_agent: Vec<(usize, usize)>,
    /// Silent dials that started in the gap between the old hub's exit and the new hub's
    /// first answer, and silent dials otherwise.
    pub(crate) silent_in_gap: usize,
    pub(crate) silent_otherwise: usize,
    /// Pauses between dials: longest, and summed over all agents.
    pub(crate) longest_pause: Duration,
    /// The last agent welcomed: its dials, relative to the new hub's start.
    pub(crate) last: Vec<String>,
    /// When each silent dial started, relative to the new hub's start, and its agent.
    pub(crate) silent_at: Vec<String>,
}

/// Summarises the dials of a hub restart: `stopped` when SIGTERM was sent, `exited` when the
/// old hub had exited, `started` when the new one was spawned.
pub(crate) fn restart(
    log: &DialLog,
    stopped: Instant,
    exited: Instant,
    started: Instant,
) -> Restart {
    let dials = log.since(stopped);
    let mut by_outcome: Vec<(&'static str, usize)> = Vec::new();
    let mut refusals: Vec<(String, usize)> = Vec::new();
    let mut per: std::collections::BTreeMap<usize, usize> = Default::default();
    for d in &dials {
        bump(&mut by_outcome, d.outcome.label());
        if let Outcome::Refused(message) = &d.outcome {
            bump(&mut refusals, message.chars().take(70).collect::<String>());
        }
        *per.entry(d.agent).or_default() += 1;
    }
    let mut per_agent: std::collections::BTreeMap<usize, usize> = Default::default();
    for n in per.values() {
        *per_agent.entry(*n).or_default() += 1;
    }
    let answered_at = dials
        .iter()
        .filter(|d| d.started >= exited && !matches!(d.outcome, Outcome::Silent(_)))
        .map(|d| d.ended)
        .min()
        .unwrap_or(exited);
    let silent = |d: &&Dial| matches!(d.outcome, Outcome::Silent(_));
    let silent_in_gap = dials
        .iter()
        .filter(silent)
        .filter(|d| d.started >= exited && d.started < answered_at)
        .count();
    let silent_otherwise = dials.iter().filter(silent).count() - silent_in_gap;
    let last_agent = dials
        .iter()
        .filter(|d| d.outcome == Outcome::Welcomed)
        .max_by_key(|d| d.ended)
        .map(|d| d.agent);
    let at = |t: Instant| {
        if t >= started {
            format!("+{:.2}s", (t - started).as_secs_f64())
        } else {
            format!("-{:.2}s", (started - t).as_secs_f64())
        }
    };
    let last = dials
        .iter()
        .filter(|d| Some(d.agent) == last_agent)
        .map(|d| {
            format!(
                "{}..{} {:?} then waited {:.2}s",
                at(d.started),
                at(d.ended),
                d.outcome,
                d.then_waited.as_secs_f64()
            )
        })
        .collect();
    by_outcome.sort();
    refusals.sort_by_key(|r| std::cmp::Reverse(r.1));
    Restart {
        dials: dials.len(),
        by_outcome,
        refusals,
        per_agent: per_agent.into_iter().collect(),
        silent_in_gap,
        silent_otherwise,
        longest_pause: dials
            .iter()
            .map(|d| d.then_waited)
            .max()
            .unwrap_or_default(),
        last,
        silent_at: dials
            .iter()
            .filter(silent)
            .map(|d| format!("agent {} at {}", d.agent, at(d.started)))
            .collect(),
    }
}

fn bump<K: PartialEq>(counts: &mut Vec<(K, usize)>, key: K) {
    match counts.iter_mut().find(|(k, _)| *k == key) {
        Some((_, n)) => *n += 1,
        None => counts.push((key, 1)),
    }
}

impl std::fmt::Display for Restart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "restart dials: {} in all; {:?}",
            self.dials, self.by_outcome
        )?;
        writeln!(
            f,
            "restart dials per agent (dials, agents): {:?}",
            self.per_agent
        )?;
        writeln!(
            f,
            "restart silent dials: {} started between the old hub's exit and the new hub's first answer, {} otherwise; longest pause {:.2}s",
            self.silent_in_gap,
            self.silent_otherwise,
            self.longest_pause.as_secs_f64()
        )?;
        for (message, n) in self.refusals.iter().take(5) {
            writeln!(f, "restart refusals: {n} × {message}")?;
        }
        for line in &self.last {
            writeln!(f, "restart last agent: {line}")?;
        }
        if !self.silent_at.is_empty() {
            writeln!(f, "restart silent dials: {}", self.silent_at.join(", "))?;
        }
        Ok(())
    }
}
