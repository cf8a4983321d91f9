//! When the controllers (and the KEDA loop) want to look again: a leaf both share.

/// The earliest simulated time a controller wants to look again.
#[derive(Debug, Default)]
pub(crate) struct Timers(pub(crate) Option<i64>);

impl Timers {
    /// Asks for a look at simulated time `t` (the earliest request wins).
    pub(crate) fn at(&mut self, t: i64) {
        self.0 = Some(self.0.map_or(t, |x| x.min(t)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earliest_time_wins() {
        let mut timers = Timers::default();
        assert_eq!(timers.0, None);
        timers.at(50);
        timers.at(80);
        assert_eq!(timers.0, Some(50));
        timers.at(20);
        assert_eq!(timers.0, Some(20));
    }
}
