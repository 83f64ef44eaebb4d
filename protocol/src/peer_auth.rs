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

/// An address as shares count it: IPv4 (an IPv4-mapped IPv6 address read
/// as IPv4), or an IPv6 /64 (what one host or customer is given).
pub fn address_key(ip: std::net::IpAddr) -> u128 {
    match ip.to_canonical() {
        std::net::IpAddr::V4(v4) => u128::from(u32::from(v4)),
        std::net::IpAddr::V6(v6) => (u128::from(v6) >> 64) << 64 | 1,
    }
}

/// Connections still in their handshake, oldest first, bounded in all and
/// per address (a quarter of the pool each): a newcomer from an address at
/// its share takes the place of that address's oldest, and a newcomer to a
/// full pool the place of the oldest connection of the address holding the
/// most (its cancel handle `C` is handed back to be fired). One address's
/// flood of silent connections only churns its own places: an honest peer
/// from another address, however far away, keeps its place for its
/// handshake's round trips.
pub struct HandshakePool<C> {
    max: usize,
    waiting: Mutex<VecDeque<(u64, u128, C)>>,
}

impl<C> HandshakePool<C> {
    pub fn new(max: usize) -> Self {
        HandshakePool { max: max.max(1), waiting: Mutex::new(VecDeque::new()) }
    }

    /// The places one address may hold.
    pub fn per_address(&self) -> usize {
        (self.max / 4).max(1)
    }

    /// Enters connection `id` from `address` ([`address_key`]); returns
    /// the cancel handle of the connection it displaced, if any.
    pub fn enter(&self, id: u64, address: u128, cancel: C) -> Option<C> {
        let mut waiting = self.waiting.lock().expect("handshake pool lock");
        let held = |address: u128| waiting.iter().filter(|(_, a, _)| *a == address).count();
        let victim = if held(address) >= self.per_address() {
            Some(address)
        } else if waiting.len() >= self.max {
            let mut counts: std::collections::HashMap<u128, usize> = std::collections::HashMap::new();
            for (_, a, _) in waiting.iter() {
                *counts.entry(*a).or_default() += 1;
            }
            counts.into_iter().max_by_key(|&(_, count)| count).map(|(heaviest, _)| heaviest)
        } else {
            None
        };
        let evicted = victim.and_then(|victim| {
            let at = waiting.iter().position(|(_, a, _)| *a == victim)?;
            waiting.remove(at).map(|(_, _, cancel)| cancel)
        });
        waiting.push_back((id, address, cancel));
        evicted
    }

    /// Connection `id` finished its handshake (or failed it).
    pub fn leave(&self, id: u64) {
        self.waiting.lock().expect("handshake pool lock").retain(|(waiting, _, _)| *waiting != id);
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
    fn a_full_pool_gives_the_newcomer_the_oldest_place_of_the_address_holding_the_most() {
        let pool = HandshakePool::new(8);
        assert_eq!(pool.per_address(), 2);
        // One address floods: it churns its own two places.
        assert_eq!(pool.enter(1, 7, "flood-1"), None);
        assert_eq!(pool.enter(2, 7, "flood-2"), None);
        assert_eq!(pool.enter(3, 7, "flood-3"), Some("flood-1"));
        // An honest peer keeps its place however long the flood goes on.
        assert_eq!(pool.enter(4, 1, "honest"), None);
        for n in 5..100 {
            assert!(pool.enter(n, 7, "flood").is_some_and(|evicted| evicted.starts_with("flood")));
        }
        // Many addresses fill the pool: a newcomer takes a place of one holding the most.
        for (n, address) in (100..).zip([20, 20, 21, 21, 22]) {
            pool.enter(n, address, "other");
        }
        assert_eq!(pool.len(), 8);
        assert!(pool.enter(200, 30, "newcomer").is_some_and(|evicted| evicted != "honest"));
        pool.leave(4);
        assert_eq!(pool.len(), 7);
        let v4: std::net::IpAddr = "203.0.113.9".parse().expect("ip");
        assert_eq!(address_key(v4), address_key("::ffff:203.0.113.9".parse().expect("ip")));
        assert_eq!(address_key("2001:db8::1".parse().expect("ip")), address_key("2001:db8::2".parse().expect("ip")));
        let throttle = Throttle::new(Duration::from_secs(60));
        assert_eq!(throttle.should_log(), Some(0));
        assert_eq!((throttle.should_log(), throttle.should_log()), (None, None));
    }
}
