//! A link emulator for the agent↔hub QUIC path, over real UDP on loopback: the agent dials
//! [`LinkEmulator::local_addr`] instead of the hub, and the emulator forwards datagrams both
//! ways as a [`LinkSpec`] says (`rtt=600ms,jitter=50ms,loss=5,rate=64kbit,
//! blackout=30s/120s,rebind=20s,seed=7`). `kedge-sim up --link MEMBER:SPEC` puts one in
//! front of a member's agent; tests drive one directly.
//!
//! - `spec.rs`: the SPEC syntax (parse, `Display`).
//! - `shaper.rs`: the decisions, pure: loss, jitter, rate queue, blackout phase, from one
//!   seeded splitmix64 generator per direction, so a seed reproduces them.
//! - `emulator.rs`: sockets and tasks. One client at a time (the agent): a datagram from
//!   a new client address replaces the session with a fresh upstream socket. `rebind`
//!   replaces the upstream socket on a schedule, rotating 127.0.0.x where possible.
//!
//! What it does not model is listed in `sim/README.md` ("Link emulator").

mod emulator;
mod shaper;
mod spec;

pub use emulator::{DirectionStats, LinkEmulator, LinkStats, MAX_IN_FLIGHT};
pub use shaper::QUEUE_BYTES;
pub use spec::{Blackout, KEYS, LinkSpec, MIN_REBIND, SpecError};
