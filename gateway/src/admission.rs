//! Who gets a socket, and for how long before it must be a session.
//!
//! Every accepted TCP connection takes a [`Ticket`] first: under the caps on
//! all connections, on connections from one remote IP and on connections not
//! logged in yet, or it is closed at once (cheaply: nothing is read from it).
//! The gateway then bounds each step: TLS and the WebSocket upgrade within
//! the handshake timeout, a login or a subscription within the login
//! timeout, then the idle timeout (docs/protocol.md "Limits and abuse").
//!
//! Accepting itself can fail, most often for want of file descriptors; the
//! accept loops here back off exponentially instead of spinning, and log
//! such failures at most once per [`LOG_EVERY`] with the count of the lines
//! they held back, so an attack can neither burn a core nor fill the disk.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};

use crate::metrics::GatewayMetrics;

/// Caps and deadlines of the WebSocket listener.
#[derive(Clone, Copy, Debug)]
pub struct AdmissionLimits {
    /// Connections at once, all kinds (clamped to what the process's
    /// descriptor limit allows, see [`descriptor_budget`]).
    pub connections_max: usize,
    /// Connections at once from one remote IP address.
    pub per_ip_max: usize,
    /// Connections at once that have not logged in.
    pub unauthenticated_max: usize,
    /// From TCP accept to a completed TLS handshake and WebSocket upgrade.
    pub handshake_timeout: Duration,
    /// From the upgrade to a login or a first subscription.
    pub login_timeout: Duration,
}

pub use crate::limits::{CONNECTIONS_MAX_DEFAULT, DESCRIPTORS_RESERVED, PER_IP_MAX_DEFAULT, UNAUTHENTICATED_MAX_DEFAULT};
pub const HANDSHAKE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
pub const LOGIN_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

impl Default for AdmissionLimits {
    fn default() -> Self {
        AdmissionLimits {
            connections_max: CONNECTIONS_MAX_DEFAULT,
            per_ip_max: PER_IP_MAX_DEFAULT,
            unauthenticated_max: UNAUTHENTICATED_MAX_DEFAULT,
            handshake_timeout: HANDSHAKE_TIMEOUT_DEFAULT,
            login_timeout: LOGIN_TIMEOUT_DEFAULT,
        }
    }
}

/// How many client connections the process's descriptor limit allows
/// (soft `RLIMIT_NOFILE` less [`DESCRIPTORS_RESERVED`]); `None` if unknown.
pub fn descriptor_budget() -> Option<usize> {
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).ok()?;
    Some((soft as usize).saturating_sub(DESCRIPTORS_RESERVED).max(1))
}

/// Why a connection was refused at accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `connections_max` reached.
    Full,
    /// `per_ip_max` reached for its address.
    PerIp,
    /// `unauthenticated_max` reached.
    Unauthenticated,
}

impl Refusal {
    pub const ALL: [Refusal; 3] = [Refusal::Full, Refusal::PerIp, Refusal::Unauthenticated];

    pub fn label(self) -> &'static str {
        match self {
            Refusal::Full => "connections_max",
            Refusal::PerIp => "per_ip_max",
            Refusal::Unauthenticated => "unauthenticated_max",
        }
    }
}

/// The connection counts behind the caps.
pub struct Admission {
    limits: AdmissionLimits,
    metrics: Arc<GatewayMetrics>,
    total: AtomicUsize,
    unauthenticated: AtomicUsize,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
}

impl Admission {
    pub fn new(limits: AdmissionLimits, metrics: Arc<GatewayMetrics>) -> Arc<Admission> {
        Arc::new(Admission {
            limits,
            metrics,
            total: AtomicUsize::new(0),
            unauthenticated: AtomicUsize::new(0),
            per_ip: Mutex::new(HashMap::new()),
        })
    }

    pub fn limits(&self) -> &AdmissionLimits {
        &self.limits
    }

    /// Connections held now, and how many of them have not logged in.
    pub fn counts(&self) -> (usize, usize) {
        (self.total.load(Ordering::Relaxed), self.unauthenticated.load(Ordering::Relaxed))
    }

    /// A ticket for a new (not yet logged-in) connection from `ip`, or why not.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Ticket, Refusal> {
        let mut per_ip = self.per_ip.lock().expect("admission lock");
        if self.total.load(Ordering::Relaxed) >= self.limits.connections_max {
            return Err(Refusal::Full);
        }
        if self.unauthenticated.load(Ordering::Relaxed) >= self.limits.unauthenticated_max {
            return Err(Refusal::Unauthenticated);
        }
        let from_ip = per_ip.entry(ip).or_insert(0);
        if *from_ip >= self.limits.per_ip_max {
            return Err(Refusal::PerIp);
        }
        *from_ip += 1;
        self.total.fetch_add(1, Ordering::Relaxed);
        self.unauthenticated.fetch_add(1, Ordering::Relaxed);
        self.metrics.connections_unauthenticated.inc();
        Ok(Ticket { admission: self.clone(), ip, logged_in: false })
    }
}

/// One admitted connection; dropping it gives its place back.
pub struct Ticket {
    admission: Arc<Admission>,
    ip: IpAddr,
    logged_in: bool,
}

impl Ticket {
    /// The connection logged in: it no longer counts as unauthenticated.
    pub fn logged_in(&mut self) {
        if !self.logged_in {
            self.logged_in = true;
            self.admission.unauthenticated.fetch_sub(1, Ordering::Relaxed);
            self.admission.metrics.connections_unauthenticated.dec();
        }
    }

    /// The client's address.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    pub fn is_logged_in(&self) -> bool {
        self.logged_in
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.logged_in {
            self.admission.unauthenticated.fetch_sub(1, Ordering::Relaxed);
            self.admission.metrics.connections_unauthenticated.dec();
        }
        self.admission.total.fetch_sub(1, Ordering::Relaxed);
        let mut per_ip = self.admission.per_ip.lock().expect("admission lock");
        if let Some(count) = per_ip.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                per_ip.remove(&self.ip);
            }
        }
    }
}

/// Lines of one kind logged at most this often.
pub const LOG_EVERY: Duration = Duration::from_secs(10);
const BACKOFF_FIRST: Duration = Duration::from_millis(5);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Backs off after failed accepts and keeps their log quiet.
pub struct AcceptBackoff {
    what: &'static str,
    delay: Duration,
    suppressed: u64,
    logged_at: Option<Instant>,
}

impl AcceptBackoff {
    pub fn new(what: &'static str) -> Self {
        AcceptBackoff { what, delay: Duration::ZERO, suppressed: 0, logged_at: None }
    }

    /// Records a failed accept; returns how long to wait before the next.
    pub fn failed(&mut self, error: &std::io::Error, now: Instant) -> Duration {
        self.delay = if self.delay.is_zero() { BACKOFF_FIRST } else { (self.delay * 2).min(BACKOFF_MAX) };
        if self.logged_at.is_none_or(|at| now.duration_since(at) >= LOG_EVERY) {
            tracing::warn!(listener = self.what, %error, suppressed = self.suppressed, "accept failed; backing off");
            self.logged_at = Some(now);
            self.suppressed = 0;
        } else {
            self.suppressed += 1;
        }
        self.delay
    }

    pub fn succeeded(&mut self) {
        self.delay = Duration::ZERO;
    }

    /// Log lines held back since the last one written.
    pub fn suppressed(&self) -> u64 {
        self.suppressed
    }
}

/// The next accepted connection; failures back off (and are counted).
pub async fn accept(listener: &TcpListener, backoff: &mut AcceptBackoff, metrics: &GatewayMetrics) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(accepted) => {
                backoff.succeeded();
                return accepted;
            }
            Err(error) => {
                metrics.accept_errors.inc();
                let wait = backoff.failed(&error, Instant::now());
                tokio::time::sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: usize, per_ip: usize, unauthenticated: usize) -> AdmissionLimits {
        AdmissionLimits { connections_max: total, per_ip_max: per_ip, unauthenticated_max: unauthenticated, ..Default::default() }
    }

    #[test]
    fn caps_refuse_with_their_reason_and_tickets_give_their_place_back() {
        let admission = Admission::new(limits(4, 2, 3), Arc::new(GatewayMetrics::default()));
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        let b: IpAddr = "10.0.0.2".parse().expect("ip");
        let c: IpAddr = "10.0.0.3".parse().expect("ip");
        let mut first = admission.admit(a).expect("first");
        let _second = admission.admit(a).expect("second");
        assert_eq!(admission.admit(a).err(), Some(Refusal::PerIp));
        let _third = admission.admit(b).expect("third");
        assert_eq!(admission.admit(c).err(), Some(Refusal::Unauthenticated), "three not logged in");
        first.logged_in();
        assert_eq!(admission.counts(), (3, 2));
        let _fourth = admission.admit(b).expect("a login made room");
        assert_eq!(admission.admit(c).err(), Some(Refusal::Full));
        drop(first);
        assert_eq!(admission.counts(), (3, 3));
        assert_eq!(admission.admit(c).err(), Some(Refusal::Unauthenticated));
        drop(_second);
        let _fifth = admission.admit(a).expect("a's place came back");
        assert_eq!(admission.per_ip.lock().expect("lock").get(&a), Some(&1));
    }

    #[test]
    fn failed_accepts_back_off_up_to_a_second_and_log_once_per_period() {
        let mut backoff = AcceptBackoff::new("test");
        let error = std::io::Error::from_raw_os_error(24); // EMFILE
        let start = Instant::now();
        let waits: Vec<Duration> = (0..10).map(|i| backoff.failed(&error, start + Duration::from_millis(i))).collect();
        assert_eq!(waits[0], Duration::from_millis(5));
        assert_eq!(waits[1], Duration::from_millis(10));
        assert_eq!(waits[9], Duration::from_secs(1), "capped");
        assert_eq!(backoff.suppressed(), 9, "one line written, nine held back");
        backoff.failed(&error, start + LOG_EVERY);
        assert_eq!(backoff.suppressed(), 0, "the next period writes one line with the count");
        backoff.succeeded();
        assert_eq!(backoff.failed(&error, start + LOG_EVERY * 2), Duration::from_millis(5), "a success resets the delay");
    }
}
