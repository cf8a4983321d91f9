//! Pod IPs: loopback addresses, unique across the whole process.
//!
//! Every virtual cluster shares the host's loopback, and `127.0.0.0/8` all routes to `lo` on
//! Linux, so a test can bind a server on a simulated pod's IP and port and reach it there
//! (an agent scraping its pods' metrics, say). For that no two live pods, in any cluster
//! of any `Sim` in the process, may hold the same address.
//!
//! Other simulator processes on the same host (test binaries run side by side, a second
//! `kedge-sim serve`) share the loopback too, and pods that run real processes listen on
//! their IPs. So each process starts handing out addresses at a random place of the
//! 16 M-address range: two processes meet only after thousands of pods each.

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::{LazyLock, Mutex};

/// The first address handed out.
pub const FIRST: Ipv4Addr = Ipv4Addr::new(127, 1, 0, 1);
/// The last address handed out; after it the pool wraps around to [`FIRST`].
pub const LAST: Ipv4Addr = Ipv4Addr::new(127, 254, 255, 254);

/// The process-wide pool. Held only for a lookup or an insert: never across I/O.
static POOL: LazyLock<Mutex<Pool>> =
    LazyLock::new(|| Mutex::new(Pool::new(FIRST, LAST).starting_at(crate::util::random_u64())));

/// Addresses from a range, handed out in order: a released address is handed out again only
/// after the pool has wrapped around, and never while it is in use. Host bytes `.0` and
/// `.255` are skipped (they look like network and broadcast addresses to people).
#[derive(Debug)]
pub struct Pool {
    first: u32,
    last: u32,
    next: u32,
    used: HashSet<u32>,
}

impl Pool {
    /// A pool of `first..=last` (swapped if given in the wrong order).
    pub fn new(first: Ipv4Addr, last: Ipv4Addr) -> Pool {
        let (a, b) = (u32::from(first), u32::from(last));
        let (first, last) = (a.min(b), a.max(b));
        Pool {
            first,
            last,
            next: first,
            used: HashSet::new(),
        }
    }

    /// The same pool, handing out its first address at `offset` (modulo the range's size).
    pub fn starting_at(mut self, offset: u64) -> Pool {
        let span = u64::from(self.last - self.first) + 1;
        self.next = self.first + (offset % span) as u32;
        self
    }

    /// The next free address, or `None` when every address of the range is in use.
    pub fn allocate(&mut self) -> Option<Ipv4Addr> {
        let span = u64::from(self.last - self.first) + 1;
        for _ in 0..span {
            let ip = self.next;
            self.next = if ip >= self.last { self.first } else { ip + 1 };
            let host = ip & 0xff;
            if host != 0 && host != 0xff && self.used.insert(ip) {
                return Some(Ipv4Addr::from(ip));
            }
        }
        None
    }

    /// Gives an address back; it is handed out again after the next wrap-around.
    pub fn release(&mut self, ip: Ipv4Addr) {
        self.used.remove(&u32::from(ip));
    }

    /// Addresses in use.
    pub fn in_use(&self) -> usize {
        self.used.len()
    }
}

/// The addresses one cluster's pods hold, by pod uid. Dropping it (the cluster's store goes
/// away) gives every address back to the process-wide pool.
#[derive(Debug, Default)]
pub(crate) struct Leases {
    by_uid: HashMap<String, Ipv4Addr>,
}

impl Leases {
    /// The pod's address: the one it holds, else a new one (`None`: the range is exhausted).
    pub(crate) fn lease(&mut self, uid: &str) -> Option<Ipv4Addr> {
        if let Some(ip) = self.by_uid.get(uid) {
            return Some(*ip);
        }
        let ip = pool().allocate()?;
        self.by_uid.insert(uid.to_string(), ip);
        Some(ip)
    }

    /// The pod is gone: its address goes back to the pool.
    pub(crate) fn release(&mut self, uid: &str) {
        if let Some(ip) = self.by_uid.remove(uid) {
            pool().release(ip);
        }
    }
}

impl Drop for Leases {
    fn drop(&mut self) {
        if self.by_uid.is_empty() {
            return;
        }
        let mut pool = pool();
        for ip in self.by_uid.values() {
            pool.release(*ip);
        }
    }
}

/// The pool stays consistent through a panic elsewhere (each operation is one insert or
/// remove), so a poisoned lock is recovered.
fn pool() -> std::sync::MutexGuard<'static, Pool> {
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::{FIRST, LAST, Leases, Pool, pool};

    #[test]
    fn addresses_come_in_order_skipping_network_and_broadcast_bytes() {
        let mut p = Pool::new(Ipv4Addr::new(127, 1, 0, 253), Ipv4Addr::new(127, 1, 1, 2));
        let got: Vec<_> = std::iter::from_fn(|| p.allocate()).collect();
        assert_eq!(
            got,
            [
                Ipv4Addr::new(127, 1, 0, 253),
                Ipv4Addr::new(127, 1, 0, 254),
                Ipv4Addr::new(127, 1, 1, 1),
                Ipv4Addr::new(127, 1, 1, 2),
            ]
        );
        assert_eq!(p.allocate(), None, "every address is in use");
    }

    #[test]
    fn a_released_address_returns_only_after_the_wrap_and_never_while_in_use() {
        let mut p = Pool::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 4));
        let a = p.allocate();
        let b = p.allocate();
        assert_eq!(a, Some(Ipv4Addr::new(10, 0, 0, 1)));
        p.release(Ipv4Addr::new(10, 0, 0, 1));
        // .1 is free again, but .3 and .4 come first.
        assert_eq!(p.allocate(), Some(Ipv4Addr::new(10, 0, 0, 3)));
        assert_eq!(p.allocate(), Some(Ipv4Addr::new(10, 0, 0, 4)));
        // Wrapped: .1 is free, .2 (b) is still in use.
        assert_eq!(p.allocate(), Some(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(b, Some(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(p.allocate(), None);
        assert_eq!(p.in_use(), 4);
    }

    #[test]
    fn a_pool_can_start_anywhere_in_its_range_and_still_hands_out_all_of_it() {
        let first = Ipv4Addr::new(10, 0, 0, 1);
        let p = Pool::new(first, Ipv4Addr::new(10, 0, 0, 4));
        let mut p = p.starting_at(6);
        let got: Vec<_> = std::iter::from_fn(|| p.allocate()).collect();
        assert_eq!(
            got,
            [
                Ipv4Addr::new(10, 0, 0, 3),
                Ipv4Addr::new(10, 0, 0, 4),
                Ipv4Addr::new(10, 0, 0, 1),
                Ipv4Addr::new(10, 0, 0, 2),
            ]
        );
    }

    #[test]
    fn leases_are_stable_per_pod_and_given_back_when_dropped() {
        let mut leases = Leases::default();
        let a = leases.lease("uid-a").expect("an address");
        assert_eq!(leases.lease("uid-a"), Some(a));
        let b = leases.lease("uid-b").expect("an address");
        assert_ne!(a, b);
        for ip in [a, b] {
            assert!((FIRST..=LAST).contains(&ip), "{ip} in the pool's range");
            assert!(ip.is_loopback());
        }
        let held = |ip: Ipv4Addr| pool().used.contains(&u32::from(ip));
        assert!(held(a) && held(b));
        leases.release("uid-a");
        assert!(!held(a));
        drop(leases);
        assert!(!held(b));
    }
}
