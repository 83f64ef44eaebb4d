//! Mutual challenge-response for the ports that only holders of a shared
//! secret may use: a gateway's link to the exchange (`link.secret`) and a
//! cluster's Raft port (the cluster secret). Each side sends a fresh random
//! nonce, then proves the secret with HMAC-SHA256 over both nonces, a
//! domain and its own role, and checks the other's proof; nothing a
//! listener captures works again (the next handshake has other nonces), and
//! a proof cannot be reflected back (the roles differ). docs/operations.md
//! "Ports and secrets".
//!
//! Also here, for both ports: the pool of connections still in their
//! handshake, and a throttle for the warnings failed handshakes write.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of a handshake nonce.
pub const NONCE_BYTES: usize = 32;

/// Which end of a connection proves: the one that connected, or the one
/// that accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Initiator,
    Responder,
}

/// A fresh nonce from the operating system's generator.
pub fn nonce() -> [u8; NONCE_BYTES] {
    use rand_core::RngCore;
    let mut nonce = [0u8; NONCE_BYTES];
    rand_core::OsRng.fill_bytes(&mut nonce);
    nonce
}

/// `role`'s proof that it holds `secret`, over both sides' nonces and the
/// bytes it states about itself (`bound`, e.g. its node id).
pub fn proof(
    secret: &[u8],
    domain: &[u8],
    role: Role,
    initiator: &[u8; NONCE_BYTES],
    responder: &[u8; NONCE_BYTES],
    bound: &[u8],
) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(domain);
    mac.update(match role {
        Role::Initiator => b":initiator:",
        Role::Responder => b":responder:",
    });
    mac.update(initiator);
    mac.update(responder);
    mac.update(&(bound.len() as u32).to_le_bytes());
    mac.update(bound);
    mac.finalize().into_bytes().into()
}

/// Whether a received proof is the expected one, compared in constant time.
pub fn same(expected: &[u8; 32], received: &[u8; 32]) -> bool {
    expected.iter().zip(received).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// Connections still in their handshake, oldest first, bounded: a newcomer
/// to a full pool takes the oldest one's place (its cancel handle `C` is
/// handed back to be fired). An honest peer's handshake takes a round trip,
/// so silent connections would have to arrive faster than that to crowd it
/// out, and never hold a place for long.
pub struct HandshakePool<C> {
    max: usize,
    waiting: Mutex<VecDeque<(u64, C)>>,
}

impl<C> HandshakePool<C> {
    pub fn new(max: usize) -> Self {
        HandshakePool { max: max.max(1), waiting: Mutex::new(VecDeque::new()) }
    }

    /// Enters connection `id`; returns the cancel handle of the oldest
    /// connection it displaced, if the pool was full.
    pub fn enter(&self, id: u64, cancel: C) -> Option<C> {
        let mut waiting = self.waiting.lock().expect("handshake pool lock");
        let evicted = if waiting.len() >= self.max { waiting.pop_front().map(|(_, cancel)| cancel) } else { None };
        waiting.push_back((id, cancel));
        evicted
    }

    /// Connection `id` finished its handshake (or failed it).
    pub fn leave(&self, id: u64) {
        self.waiting.lock().expect("handshake pool lock").retain(|(waiting, _)| *waiting != id);
    }

    pub fn len(&self) -> usize {
        self.waiting.lock().expect("handshake pool lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Throttles a warning to one per `every`: `should_log` answers with the
/// count suppressed since the last one logged, or `None` to stay quiet.
pub struct Throttle {
    every: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl Throttle {
    pub fn new(every: Duration) -> Self {
        Throttle { every, state: Mutex::new((None, 0)) }
    }

    pub fn should_log(&self) -> Option<u64> {
        let mut state = self.state.lock().expect("throttle lock");
        let (last, suppressed) = &mut *state;
        if last.is_some_and(|at| at.elapsed() < self.every) {
            *suppressed += 1;
            return None;
        }
        let count = std::mem::take(suppressed);
        *last = Some(Instant::now());
        Some(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_holds_only_for_its_secret_nonces_role_and_statement() {
        let (a, b) = (nonce(), nonce());
        assert_ne!(a, b, "fresh nonces");
        let p = proof(b"secret", b"gpux-test-v1", Role::Initiator, &a, &b, b"node 1");
        let holds = |secret: &[u8], domain: &[u8], role, responder: &[u8; 32], bound: &[u8]| {
            same(&proof(secret, domain, role, &a, responder, bound), &p)
        };
        assert!(holds(b"secret", b"gpux-test-v1", Role::Initiator, &b, b"node 1"));
        assert!(!holds(b"other", b"gpux-test-v1", Role::Initiator, &b, b"node 1"), "another secret");
        assert!(!holds(b"secret", b"gpux-test-v1", Role::Responder, &b, b"node 1"), "reflected");
        assert!(!holds(b"secret", b"gpux-test-v1", Role::Initiator, &nonce(), b"node 1"), "replayed to a new nonce");
        assert!(!holds(b"secret", b"gpux-test-v1", Role::Initiator, &b, b"node 2"), "another statement");
        assert!(!holds(b"secret", b"gpux-other-v1", Role::Initiator, &b, b"node 1"), "another port");
    }

    #[test]
    fn a_full_pool_gives_the_newcomer_the_oldest_place() {
        let pool = HandshakePool::new(2);
        assert_eq!(pool.enter(1, "one"), None);
        assert_eq!(pool.enter(2, "two"), None);
        assert_eq!(pool.enter(3, "three"), Some("one"));
        pool.leave(2);
        assert_eq!(pool.enter(4, "four"), None);
        assert_eq!(pool.len(), 2);
        let throttle = Throttle::new(Duration::from_secs(60));
        assert_eq!(throttle.should_log(), Some(0));
        assert_eq!((throttle.should_log(), throttle.should_log()), (None, None));
    }
}
