//! What the controllers decided about load balancers, published to the forwarders.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;

/// Transport of one Service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// `TCP` (the default).
    Tcp,
    /// `UDP`.
    Udp,
}

/// One listening port of a load balancer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Frontend {
    /// The Service's external address and port.
    pub addr: SocketAddr,
    /// Its transport.
    pub protocol: Protocol,
}

/// Every frontend of a cluster with the endpoints it forwards to (may be empty).
pub type Forwards = BTreeMap<Frontend, Vec<SocketAddr>>;

/// The forwards the controllers decided, published to [`run`].
#[derive(Debug)]
pub struct LoadBalancers {
    published: watch::Sender<Arc<Forwards>>,
}

impl Default for LoadBalancers {
    fn default() -> Self {
        LoadBalancers {
            published: watch::Sender::new(Arc::new(Forwards::new())),
        }
    }
}

impl LoadBalancers {
    /// The forwards now in effect.
    pub fn current(&self) -> Arc<Forwards> {
        self.published.borrow().clone()
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<Arc<Forwards>> {
        self.published.subscribe()
    }

    pub(super) fn publish(&self, forwards: Forwards) {
        self.published.send_if_modified(|old| {
            let changed = **old != forwards;
            if changed {
                *old = Arc::new(forwards);
            }
            changed
        });
    }
}
