//! The hub's TLS 1.3 session tickets, sealed with a key every hub process derives alike.
//!
//! A reconnecting agent that resumes its TLS session skips the certificate signature and its
//! verification on both ends (ECDSA P-256 verification was 8% of a restarted hub's CPU while
//! 10,000 agents came back, docs/scale.md). The tickets rustls keeps in a process's memory
//! die with it, so after a hub restart, or on another replica, every agent did a full
//! handshake. These tickets are sealed with AES-256-GCM under a key derived from the secret
//! the hub's address tokens come from (its server key, or the hub CA's key): the same after a
//! restart, a certificate renewal and on every replica. Whoever holds that secret can already
//! issue any member a certificate, so a ticket forged with it proves nothing a certificate
//! would not. The hub keeps nothing per session.
//!
//! A resumed session keeps the identity of its first handshake, which the hub checks again
//! at `Hello` as for any session (enrollment, revocation, expiry). Resumption is always
//! `psk_dhe_ke` in rustls, so each session's traffic keys still come from a fresh X25519
//! exchange: a leaked ticket key exposes no traffic.
//!
//! Keys roll: each [`EPOCH`] has its own, and a ticket opens only in the epoch it was sealed
//! in and the next, so it lives one to two epochs (rustls asks for expiry by key rolling, not
//! by a lifetime written in the ticket).

use std::time::{Duration, SystemTime};

use prometheus_client::metrics::counter::Counter;
use ring::aead::{self, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};

/// How long one ticket key is used to seal.
pub const EPOCH: Duration = Duration::from_secs(12 * 3600);

/// Bytes before the sealed session: the epoch (big-endian) and the nonce.
const HEADER: usize = 8 + NONCE_LEN;

/// Seals and opens the hub's session tickets (see the module's documentation).
pub struct SessionTickets {
    key: hkdf::Prk,
    rng: SystemRandom,
    /// Tickets opened: sessions that resumed (the hub's `kedge_hub_tls_resumptions_total`).
    opened: Counter,
    /// Seconds since the Unix epoch (a field so that tests can move the clock).
    now: fn() -> u64,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl SessionTickets {
    /// The tickets of the hub whose secret is `secret` (HKDF-SHA256 with a label of its own).
    pub fn derive(secret: &[u8]) -> Self {
        let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, b"kedge-hub session tickets v1");
        Self {
            key: salt.extract(secret),
            rng: SystemRandom::new(),
            opened: Counter::default(),
            now: unix_now,
        }
    }

    /// Tickets opened so far: sessions that resumed with one.
    pub fn opened(&self) -> u64 {
        self.opened.get()
    }

    /// The counter of [`Self::opened`], to register as a metric.
    pub fn opened_counter(&self) -> Counter {
        self.opened.clone()
    }

    fn epoch(&self) -> u64 {
        (self.now)() / EPOCH.as_secs()
    }

    fn key_of(&self, epoch: u64) -> Option<LessSafeKey> {
        let epoch = epoch.to_be_bytes();
        let info = [b"ticket key ".as_slice(), epoch.as_slice()];
        let okm = self.key.expand(&info, &aead::AES_256_GCM).ok()?;
        Some(LessSafeKey::new(UnboundKey::from(okm)))
    }
}

impl std::fmt::Debug for SessionTickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionTickets(..)")
    }
}

impl rustls::server::ProducesTickets for SessionTickets {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        u32::try_from(EPOCH.as_secs()).unwrap_or(u32::MAX)
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let epoch = self.epoch();
        let key = self.key_of(epoch)?;
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let mut ticket = Vec::with_capacity(HEADER + plain.len() + key.algorithm().tag_len());
        ticket.extend_from_slice(&epoch.to_be_bytes());
        ticket.extend_from_slice(&nonce);
        let mut sealed = plain.to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(epoch.to_be_bytes()),
            &mut sealed,
        )
        .ok()?;
        ticket.extend_from_slice(&sealed);
        Some(ticket)
    }

    /// `ticket` comes from the network: anything but a ticket this secret sealed in this
    /// epoch or the last is `None`.
    fn decrypt(&self, ticket: &[u8]) -> Option<Vec<u8>> {
        let epoch_bytes: [u8; 8] = ticket.get(..8)?.try_into().ok()?;
        let nonce: [u8; NONCE_LEN] = ticket.get(8..HEADER)?.try_into().ok()?;
        let epoch = u64::from_be_bytes(epoch_bytes);
        let now = self.epoch();
        if epoch != now && epoch.checked_add(1) != Some(now) {
            return None;
        }
        let key = self.key_of(epoch)?;
        let mut sealed = ticket.get(HEADER..)?.to_vec();
        let plain = key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(epoch_bytes),
                &mut sealed,
            )
            .ok()?;
        let plain = plain.to_vec();
        self.opened.inc();
        Some(plain)
    }
}

#[cfg(test)]
mod tests {
    use rustls::server::ProducesTickets;

    use super::*;

    fn at(secret: &[u8], now: fn() -> u64) -> SessionTickets {
        SessionTickets {
            now,
            ..SessionTickets::derive(secret)
        }
    }

    /// The start of an epoch (12 h epochs since the Unix epoch).
    const START: u64 = 41_666 * 43_200;

    #[test]
    fn a_ticket_sealed_by_one_hub_process_opens_in_another_with_the_same_secret() {
        let sealed = SessionTickets::derive(b"hub secret")
            .encrypt(b"session")
            .unwrap();
        let next = SessionTickets::derive(b"hub secret");
        assert_eq!(next.decrypt(&sealed).as_deref(), Some(&b"session"[..]));
        assert_eq!(next.opened(), 1);
        let other = SessionTickets::derive(b"another secret");
        assert_eq!(other.decrypt(&sealed), None);
    }

    #[test]
    fn a_ticket_opens_in_its_epoch_and_the_next_only() {
        assert_eq!(EPOCH.as_secs(), 43_200);
        let sealed = at(b"s", || START + 1).encrypt(b"session").unwrap();
        assert!(at(b"s", || START + 43_200 - 1).decrypt(&sealed).is_some());
        assert!(
            at(b"s", || START + 2 * 43_200 - 1)
                .decrypt(&sealed)
                .is_some()
        );
        assert_eq!(
            at(b"s", || START + 2 * 43_200).decrypt(&sealed),
            None,
            "expired"
        );
        assert_eq!(
            at(b"s", || START - 1).decrypt(&sealed),
            None,
            "from a later epoch"
        );
    }

    #[test]
    fn a_tampered_truncated_or_empty_ticket_is_refused() {
        let tickets = SessionTickets::derive(b"s");
        let sealed = tickets.encrypt(b"session").unwrap();
        for i in [0, 7, 8, 19, 20, sealed.len() - 1] {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            assert_eq!(tickets.decrypt(&bad), None, "byte {i} flipped");
        }
        for len in 0..sealed.len() {
            assert_eq!(tickets.decrypt(&sealed[..len]), None, "cut to {len}");
        }
        assert_eq!(tickets.opened(), 0);
    }

    #[test]
    fn two_tickets_of_one_session_differ() {
        let tickets = SessionTickets::derive(b"s");
        assert_ne!(tickets.encrypt(b"same"), tickets.encrypt(b"same"));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_are_refused_without_a_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            proptest::prop_assert_eq!(SessionTickets::derive(b"s").decrypt(&bytes), None);
        }
    }
}
