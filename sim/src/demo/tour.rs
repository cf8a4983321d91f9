//! The demo's script: timed steps in five scenes, repeated every [`TOUR_LENGTH`] seconds,
//! and what the view says about where the tour is. Pure: time is a parameter.

use std::time::Duration;

use crate::link::LinkSpec;

/// One scripted change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    /// The DSO's metric.
    Metric(u32),
    /// The DSJ's queue length.
    Queue(u32),
    /// member-2's nodes cordoned (`true`) or uncordoned.
    Member2Full(bool),
    /// member-3's agent frozen.
    CutOff,
    /// member-3's agent running again.
    Reconnect,
    /// Requests waiting across the inference fleet.
    Demand(u32),
    /// member-3's link emulator set to [`bad_link`].
    BadLink,
    /// member-3's link emulator back to the spec it started with.
    GoodLink,
    /// Nothing to do: the text says what the view shows by now; the label is for "next:".
    Note(&'static str),
}

impl Action {
    /// A few words for the countdown's "next: …".
    fn label(self) -> String {
        match self {
            Action::Metric(v) => format!("metric {v}"),
            Action::Queue(v) => format!("queue {v}"),
            Action::Member2Full(true) => "member-2 full".into(),
            Action::Member2Full(false) => "member-2 has room again".into(),
            Action::CutOff => "member-3 cut off".into(),
            Action::Reconnect => "member-3 back".into(),
            Action::Demand(v) => format!("{v} requests waiting"),
            Action::BadLink => "member-3's link goes bad".into(),
            Action::GoodLink => "member-3's link restored".into(),
            Action::Note(label) => label.into(),
        }
    }
}

/// At `at` seconds into a round, do `action`; `text` is its log line.
#[derive(Debug, Clone, Copy)]
pub(super) struct Step {
    pub(super) at: u64,
    pub(super) action: Action,
    text: &'static str,
}

const fn step(at: u64, action: Action, text: &'static str) -> Step {
    Step { at, action, text }
}

/// In a step's text: the inference DSO's engines when the line is written, the number the
/// view's table shows in the same frame (the script used to predict a count here, and the
/// HPA's dead zone often settles on another).
const ENGINES: &str = "{engines}";

/// The DSO and DSJ steps on one timeline; each text says what was seen to happen on the
/// local fleet. The DSJ's Jobs run 15 s each, so every queue of 10 is back to 0 before its
/// Jobs finish (a queue that stays at 10 would get 10 new Jobs each time they do).
pub(super) const SCRIPT: [Step; 23] = [
    step(
        0,
        Action::Metric(5),
        "metric 5: one replica per 5 → 1 replica",
    ),
    step(
        1,
        Action::Demand(30),
        "inference: 30 requests waiting on {engines} → more engines, until 5 to 11 wait on each",
    ),
    step(3, Action::Queue(10), "queue 10 → 10 Jobs, split 2:3:5"),
    step(
        12,
        Action::Metric(20),
        "metric 20 → 4 replicas, split 2:3:5",
    ),
    step(
        13,
        Action::Queue(0),
        "queue 0: no new Jobs; each member keeps its last 2 finished Jobs",
    ),
    step(
        20,
        Action::Demand(80),
        "inference: 80 waiting on {engines} → more engines (only above 11 per engine does it scale up)",
    ),
    step(24, Action::Metric(45), "metric 45 → 9 replicas"),
    step(
        40,
        Action::CutOff,
        "member-3 cut off (agent frozen): Unreachable in 3 s, share moves after 20 s grace; pods keep running",
    ),
    step(
        46,
        Action::Queue(10),
        "queue 10, member-3 unreachable → 10 Jobs, split 2:3 over member-1 and member-2",
    ),
    step(56, Action::Queue(0), "queue 0"),
    step(
        58,
        Action::Note("engines missing, not idle"),
        "inference: member-3's engines count as missing, never as idle: no scale-down ({engines} now)",
    ),
    step(
        75,
        Action::Reconnect,
        "member-3's agent is back: replicas rebalance by weight",
    ),
    step(
        78,
        Action::Member2Full(true),
        "member-2 full (nodes cordoned): new pods there stay Pending",
    ),
    step(
        80,
        Action::Queue(10),
        "queue 10 → 2:3:5, but member-2's 3 Jobs stay Pending",
    ),
    step(
        89,
        Action::Note("stuck Jobs move"),
        "stuck after 5 s: member-2 soft-tainted; its Jobs re-created in member-1/3, the stuck ones deleted",
    ),
    step(90, Action::Queue(0), "queue 0"),
    step(95, Action::Metric(10), "metric 10 → 2 replicas"),
    step(
        96,
        Action::Demand(10),
        "inference: 10 waiting on {engines} → fewer engines (only below 5 per engine does it scale down)",
    ),
    step(
        100,
        Action::Member2Full(false),
        "member-2 has room again (its soft taint lasts 1 min)",
    ),
    step(
        110,
        Action::BadLink,
        "member-3's link goes bad (600 ms RTT ±50, 5 % loss, 64 kbit/s): its RTT climbs",
    ),
    step(
        115,
        Action::Metric(40),
        "metric 40 → 8 replicas, 2:2:4; member-3, over the bad link, gets its 4 a second later",
    ),
    step(
        125,
        Action::Note("still Ready"),
        "member-3 stays Ready: heartbeats cross the bad link, no false Unreachable",
    ),
    step(
        138,
        Action::GoodLink,
        "member-3's link is perfect again: its smoothed RTT falls back over some 20 s",
    ),
];

/// The link of the bad-link scene (issue 32's example): `rtt=600ms,jitter=50ms,loss=5,
/// rate=64kbit`.
pub(super) fn bad_link() -> LinkSpec {
    LinkSpec {
        rtt: Duration::from_millis(600),
        jitter: Duration::from_millis(50),
        loss: 5.0,
        rate: Some(64_000),
        ..LinkSpec::default()
    }
}

/// Seconds from a round's start to the next: the tour then starts over.
pub(super) const TOUR_LENGTH: u64 = 145;

/// A part of the tour: from `start` until the next scene starts.
#[derive(Debug)]
struct Scene {
    start: u64,
    name: &'static str,
    /// What it demonstrates.
    shows: &'static str,
}

const SCENES: [Scene; 5] = [
    Scene {
        start: 0,
        name: "spread by weight",
        shows: "replicas, Jobs split 2:3:5; engines follow demand",
    },
    Scene {
        start: 40,
        name: "a member cut off",
        shows: "member-3's share moves; its engines count missing",
    },
    Scene {
        start: 75,
        name: "member-3 back, member-2 full",
        shows: "rebalance by weight; stuck Jobs moved",
    },
    Scene {
        start: 95,
        name: "scaling down",
        shows: "fewer replicas and engines; member-2 has room again",
    },
    Scene {
        start: 110,
        name: "a bad link",
        shows: "member-3 at 600 ms, 5 % loss: later, still Ready",
    },
];

/// The steps due at `t` seconds into a round once the first `done` have run.
pub(super) fn due(done: usize, t: u64) -> &'static [Step] {
    let rest = SCRIPT.get(done..).unwrap_or_default();
    let n = rest.iter().take_while(|s| s.at <= t).count();
    &rest[..n]
}

/// "1 engine", "3 engines".
fn engines_text(engines: i32) -> String {
    if engines == 1 {
        "1 engine".into()
    } else {
        format!("{engines} engines")
    }
}

/// The log line of `step` run `t` seconds after the demo started, when the inference DSO
/// has `engines` engines.
pub(super) fn log_line(t: u64, step: &Step, engines: i32) -> String {
    let text = step.text.replace(ENGINES, &engines_text(engines));
    format!("[{t:>3}s] {text}")
}

/// The log line when a round ends and the script starts over.
pub(super) fn restart_line(t: u64) -> String {
    format!("[{t:>3}s] the tour restarts: metric, queue and requests from the top")
}

/// Where the tour is `t` seconds into a round: the scene with what it demonstrates, then
/// the step, what comes next and when the tour restarts.
pub(super) fn render_tour(t: u64) -> String {
    let scene = SCENES.iter().rposition(|s| s.start <= t).unwrap_or(0);
    let done = SCRIPT.iter().take_while(|s| s.at <= t).count();
    let restart = TOUR_LENGTH.saturating_sub(t);
    let next = SCRIPT.get(done).map_or_else(String::new, |step| {
        format!(" · next: {} in {} s", step.action.label(), step.at - t)
    });
    format!(
        "scene {}/{}: {} - {}\nstep {done}/{}{next} · the tour restarts in {restart} s\n",
        scene + 1,
        SCENES.len(),
        SCENES[scene].name,
        SCENES[scene].shows,
        SCRIPT.len(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_is_in_order_and_inside_one_round() {
        assert!(SCRIPT.windows(2).all(|w| w[0].at <= w[1].at));
        assert!(SCRIPT.iter().all(|s| s.at < TOUR_LENGTH));
        assert!(SCENES.windows(2).all(|w| w[0].start < w[1].start));
        assert_eq!(SCENES[0].start, 0);
    }

    #[test]
    fn the_tour_lines_fit_80_columns() {
        for t in 0..TOUR_LENGTH {
            for line in render_tour(t).lines() {
                assert!(line.chars().count() <= 80, "{t} s: {line}");
            }
        }
    }

    #[test]
    fn due_steps_run_once_each() {
        assert_eq!(due(0, 0).len(), 1);
        assert_eq!(due(1, 0).len(), 0);
        assert_eq!(due(1, 3).len(), 2, "demand 30 and queue 10");
        assert_eq!(due(3, 144).len(), SCRIPT.len() - 3);
        assert!(due(SCRIPT.len(), 144).is_empty());
    }

    #[test]
    fn the_countdown_names_the_scene_the_next_step_and_the_restart() {
        assert_eq!(
            render_tour(5),
            "scene 1/5: spread by weight - replicas, Jobs split 2:3:5; engines follow demand\n\
             step 3/23 · next: metric 20 in 7 s · the tour restarts in 140 s\n"
        );
        let cut_off = render_tour(52);
        assert!(
            cut_off.starts_with("scene 2/5: a member cut off - "),
            "{cut_off}"
        );
        assert!(
            cut_off.ends_with("step 9/23 · next: queue 0 in 4 s · the tour restarts in 93 s\n"),
            "{cut_off}"
        );
        assert!(
            render_tour(57).contains("next: engines missing, not idle in 1 s"),
            "{}",
            render_tour(57)
        );
        let down = render_tour(108);
        assert!(down.starts_with("scene 4/5: scaling down - "), "{down}");
        assert!(
            down.ends_with(
                "step 19/23 · next: member-3's link goes bad in 2 s · the tour restarts in 37 s\n"
            ),
            "{down}"
        );
        assert!(
            render_tour(120)
                .ends_with("step 21/23 · next: still Ready in 5 s · the tour restarts in 25 s\n"),
            "{}",
            render_tour(120)
        );
        let last = render_tour(140);
        assert_eq!(
            last,
            "scene 5/5: a bad link - member-3 at 600 ms, 5 % loss: later, still Ready\n\
             step 23/23 · the tour restarts in 5 s\n"
        );
    }

    #[test]
    fn the_bad_link_scene_changes_the_metric_between_degrading_and_restoring_member_3() {
        assert_eq!(
            bad_link().to_string(),
            "rtt=600ms,jitter=50ms,loss=5,rate=64kbit"
        );
        let at = |action: Action| {
            SCRIPT
                .iter()
                .find(|s| s.action == action)
                .map(|s| s.at)
                .unwrap_or_else(|| panic!("no {action:?} step"))
        };
        let (bad, good) = (at(Action::BadLink), at(Action::GoodLink));
        let scene = SCENES.last().map_or(0, |s| s.start);
        assert_eq!(bad, scene, "the last scene starts with the bad link");
        assert!(
            (25..=30).contains(&(good - bad)),
            "bad for {} s",
            good - bad
        );
        assert!(
            SCRIPT
                .iter()
                .any(|s| matches!(s.action, Action::Metric(_)) && bad < s.at && s.at < good),
            "a metric change while the link is bad"
        );
        assert!(good < TOUR_LENGTH);
        assert_eq!(Action::BadLink.label(), "member-3's link goes bad");
        assert_eq!(Action::GoodLink.label(), "member-3's link restored");
        assert_eq!(
            log_line(138, &SCRIPT[22], 4),
            "[138s] member-3's link is perfect again: its smoothed RTT falls back over some 20 s"
        );
    }

    #[test]
    fn log_lines_carry_the_engines_they_are_given() {
        assert_eq!(
            log_line(21, &SCRIPT[5], 3),
            "[ 21s] inference: 80 waiting on 3 engines → more engines \
             (only above 11 per engine does it scale up)"
        );
        assert_eq!(
            log_line(1, &SCRIPT[1], 1),
            "[  1s] inference: 30 requests waiting on 1 engine → more engines, until 5 to 11 \
             wait on each"
        );
        assert_eq!(
            log_line(0, &SCRIPT[0], 7),
            "[  0s] metric 5: one replica per 5 → 1 replica"
        );
    }
}
