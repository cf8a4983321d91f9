//! Kubelet's restart back-off for a container that exits: the first restart at once, then
//! 10 s doubling to 5 min; a container that ran 10 min before exiting starts over.

use std::time::Duration;

/// The first delayed restart's wait.
pub(crate) const INITIAL: Duration = Duration::from_secs(10);
/// The longest wait.
pub(crate) const MAX: Duration = Duration::from_secs(300);
/// A run at least this long resets the back-off.
pub(crate) const RESET_AFTER: Duration = Duration::from_secs(600);

/// One container's back-off state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Backoff {
    /// The wait before the next restart; `None`: no exit seen since the last reset.
    next: Option<Duration>,
}

impl Backoff {
    /// The container exited after running `ran`: how long to wait before restarting it.
    pub(crate) fn after_exit(&mut self, ran: Duration) -> Duration {
        if ran >= RESET_AFTER {
            self.next = None;
        }
        match self.next {
            None => {
                self.next = Some(INITIAL);
                Duration::ZERO
            }
            Some(wait) => {
                self.next = Some((wait * 2).min(MAX));
                wait
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Backoff, MAX};

    #[test]
    fn waits_grow_from_nothing_through_ten_seconds_doubling_to_five_minutes() {
        let mut b = Backoff::default();
        let quick = Duration::from_secs(1);
        let waits: Vec<u64> = (0..8).map(|_| b.after_exit(quick).as_secs()).collect();
        assert_eq!(waits, [0, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(b.after_exit(quick), MAX);
    }

    #[test]
    fn ten_minutes_of_running_resets_the_back_off() {
        let mut b = Backoff::default();
        for _ in 0..5 {
            b.after_exit(Duration::from_secs(1));
        }
        assert_eq!(b.after_exit(Duration::from_secs(599)).as_secs(), 160);
        assert_eq!(b.after_exit(Duration::from_secs(600)), Duration::ZERO);
        assert_eq!(b.after_exit(Duration::from_secs(1)).as_secs(), 10);
    }
}
