//! What a router knows of its service: the ready replicas it may send
//! requests to (each with its requests outstanding and whether the
//! router's own probe finds it healthy), and the service's keys.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, RwLock};

use gpux_engine::LeaseId;
use gpux_protocol::{ReplicaState, ServiceInfo, ServiceState};
use sha2::Digest;

/// One ready replica.
#[derive(Debug)]
pub struct Replica {
    pub lease: LeaseId,
    /// `host:port` of the service's port.
    pub endpoint: String,
    /// Requests sent to it and not yet answered in full.
    pub outstanding: AtomicU32,
    /// The router's probe of its readiness path last answered (or no
    /// probe has run yet: the exchange said it is ready).
    pub healthy: AtomicBool,
}

/// The replicas and keys, replaced whole by each update from the feed.
#[derive(Debug, Default)]
pub struct Known {
    pub replicas: Vec<Arc<Replica>>,
    /// SHA-256 of each key the service accepts (empty: none needed).
    pub key_hashes: Vec<[u8; 32]>,
    pub readiness_path: Option<String>,
    /// The service is gone (deleted or failed): every request is refused.
    pub gone: bool,
    /// Whether the feed told anything yet.
    pub heard: bool,
    /// The service scales on its routers' load.
    pub scales: bool,
}

#[derive(Debug, Default)]
pub struct Table {
    known: RwLock<Known>,
}

/// Holds one request outstanding on a replica until dropped (when its
/// answer's body ended, or the request failed).
pub struct Outstanding(Arc<Replica>);

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Outstanding {
    pub fn replica(&self) -> &Arc<Replica> {
        &self.0
    }
}

impl Table {
    /// The service as the exchange says it is now: ready replicas kept
    /// (with their counts and health) or added, the others dropped.
    pub fn update(&self, info: &ServiceInfo) {
        let mut known = self.known.write().unwrap_or_else(|p| p.into_inner());
        let ready: Vec<(LeaseId, String)> =
            info.replicas.iter().filter(|r| r.state == ReplicaState::Ready).filter_map(|r| Some((r.lease?, r.endpoint.clone()?))).collect();
        let replicas = ready
            .into_iter()
            .map(|(lease, endpoint)| match known.replicas.iter().find(|r| r.lease == lease && r.endpoint == endpoint) {
                Some(kept) => kept.clone(),
                None => Arc::new(Replica { lease, endpoint, outstanding: AtomicU32::new(0), healthy: AtomicBool::new(true) }),
            })
            .collect();
        known.replicas = replicas;
        known.key_hashes = info.spec.key_hashes.iter().filter_map(|h| hex::decode(h).ok()?.try_into().ok()).collect();
        known.readiness_path = info.spec.readiness_path.clone();
        known.gone = matches!(info.state, ServiceState::Deleted | ServiceState::Failed);
        known.scales = info.spec.scaling.is_some();
        known.heard = true;
    }

    /// Whether `authorization` (the request's header) carries one of the
    /// service's keys: `Bearer KEY`, compared by SHA-256 in constant time.
    pub fn admits(&self, authorization: Option<&[u8]>) -> bool {
        let known = self.known.read().unwrap_or_else(|p| p.into_inner());
        if known.key_hashes.is_empty() {
            return true;
        }
        let Some(key) = authorization.and_then(|h| h.strip_prefix(b"Bearer ")) else { return false };
        let hash: [u8; 32] = sha2::Sha256::digest(key).into();
        known.key_hashes.iter().fold(false, |found, known| found | constant_time_eq(known, &hash))
    }

    pub fn gone(&self) -> bool {
        self.known.read().unwrap_or_else(|p| p.into_inner()).gone
    }

    /// The healthy replica with the fewest requests outstanding, not among
    /// `tried`, counted as one more outstanding.
    pub fn pick(&self, tried: &[LeaseId]) -> Option<Outstanding> {
        let known = self.known.read().unwrap_or_else(|p| p.into_inner());
        let best = known
            .replicas
            .iter()
            .filter(|r| r.healthy.load(Ordering::Relaxed) && !tried.contains(&r.lease))
            .min_by_key(|r| (r.outstanding.load(Ordering::Relaxed), r.lease))?;
        best.outstanding.fetch_add(1, Ordering::Relaxed);
        Some(Outstanding(best.clone()))
    }

    /// Every replica now, and the readiness path, for the health probe.
    pub fn snapshot(&self) -> (Vec<Arc<Replica>>, Option<String>) {
        let known = self.known.read().unwrap_or_else(|p| p.into_inner());
        (known.replicas.clone(), known.readiness_path.clone())
    }

    pub fn scales(&self) -> bool {
        self.known.read().unwrap_or_else(|p| p.into_inner()).scales
    }

    /// Requests outstanding on the replicas now.
    pub fn in_flight(&self) -> u32 {
        let known = self.known.read().unwrap_or_else(|p| p.into_inner());
        known.replicas.iter().map(|r| r.outstanding.load(Ordering::Relaxed)).sum()
    }

    /// Replicas the router may send to now.
    pub fn routable(&self) -> usize {
        let known = self.known.read().unwrap_or_else(|p| p.into_inner());
        known.replicas.iter().filter(|r| r.healthy.load(Ordering::Relaxed)).count()
    }
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
