//! The autoscaling rule of a service (issue 63, "Autoscaling"): how many
//! replicas a service wants, from the load its routers measure.
//!
//! Pure and integer-only, so the market can apply it in `apply` to journaled
//! load samples and a replay reaches the same decisions. A sample is the
//! service's whole load at one time (the routers' sum): requests per second
//! (in thousandths) and requests in flight. The rule:
//!
//! - **Wanted replicas** are the load divided by the per-replica target,
//!   rounded up: 2.5 targets' worth of load wants 3 replicas.
//! - **Up** when the load has wanted more replicas than run for a whole
//!   `up_window_ms` (a spike shorter than that adds none), to the fewest the
//!   window wanted (not its peak: a burst inside the window does not
//!   overshoot).
//! - **Down** when it has wanted fewer for a whole `down_window_ms`, longer
//!   than the up window (scaling down is cheap to delay and costly to
//!   regret), to the most the window wanted.
//! - **Within bounds**: never below `min_replicas` nor above
//!   `max_replicas`, nor above what the budget affords (the caller says how
//!   many replica-hours it can still pay for at the service's price).
//! - **To zero** when `min_replicas` is 0 and no request came for a whole
//!   down window; **from zero** at once when a request waits (it is queued
//!   while the first replica starts).
//!
//! Each decision names its reason, for the service's feed and metrics.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// What a service scales on, per replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Target {
    /// Requests per second per replica, in thousandths (1 500: 1.5 rps).
    RequestsPerSecondMilli(u64),
    /// Requests in flight per replica.
    InFlight(u32),
}

/// A service's scaling terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// 0: the service scales to zero when idle.
    pub min_replicas: u32,
    pub max_replicas: u32,
    pub target: Target,
    /// How long the load must want more replicas before they are added.
    pub up_window_ms: u64,
    /// How long it must want fewer before replicas are removed.
    pub down_window_ms: u64,
}

/// Why a policy is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("max_replicas must be at least 1 and at least min_replicas")]
    Bounds,
    #[error("the per-replica target must be above 0")]
    Target,
    #[error("the down window must be at least the up window, and the up window at least 1 s")]
    Windows,
}

impl Policy {
    pub fn check(&self) -> Result<(), PolicyError> {
        if self.max_replicas == 0 || self.min_replicas > self.max_replicas {
            return Err(PolicyError::Bounds);
        }
        if matches!(self.target, Target::RequestsPerSecondMilli(0) | Target::InFlight(0)) {
            return Err(PolicyError::Target);
        }
        if self.up_window_ms < 1_000 || self.down_window_ms < self.up_window_ms {
            return Err(PolicyError::Windows);
        }
        Ok(())
    }

    /// The replicas `load` wants, before bounds: the load over the
    /// per-replica target, rounded up.
    pub fn wanted(&self, load: &Load) -> u32 {
        let wanted = match self.target {
            Target::RequestsPerSecondMilli(per_replica) => load.requests_per_second_milli.div_ceil(per_replica),
            Target::InFlight(per_replica) => u64::from(load.in_flight.div_ceil(per_replica)),
        };
        u32::try_from(wanted).unwrap_or(u32::MAX)
    }
}

/// The service's whole load at `at_ms`, as its routers measured it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    pub at_ms: u64,
    pub requests_per_second_milli: u64,
    pub in_flight: u32,
    /// Requests queued because no replica is ready (a service at zero).
    pub queued: u32,
}

/// Why the replica count changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The load wanted more replicas for the whole up window.
    LoadAbove,
    /// The load wanted fewer replicas for the whole down window.
    LoadBelow,
    /// No request for the whole down window, and the service may idle at zero.
    Idle,
    /// A request waits on a service at zero.
    Woken,
    /// Below `min_replicas` (a replica lost, or the policy changed).
    BelowMin,
    /// Above `max_replicas` (the policy changed).
    AboveMax,
    /// More run than the budget affords.
    Budget,
}

impl Reason {
    /// Its name on the service's feed and in metrics.
    pub fn name(self) -> &'static str {
        match self {
            Reason::LoadAbove => "load_above",
            Reason::LoadBelow => "load_below",
            Reason::Idle => "idle",
            Reason::Woken => "woken",
            Reason::BelowMin => "below_min",
            Reason::AboveMax => "above_max",
            Reason::Budget => "budget",
        }
    }
}

/// A change of the replica count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub from: u32,
    pub to: u32,
    pub reason: Reason,
}

/// The load samples of the longest window, oldest first: what one service's
/// rule remembers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scaler {
    samples: VecDeque<(u64, u32, bool)>,
}

/// Samples kept at most (a router reports about once a second; the longest
/// window the rule accepts is an hour).
pub const SAMPLES_MAX: usize = 3_600;

impl Scaler {
    /// Takes a sample and says whether `running` replicas should change,
    /// given that the budget affords at most `affordable` more hours of
    /// replicas at the service's price (`u32::MAX`: no budget).
    pub fn observe(&mut self, policy: &Policy, load: Load, running: u32, affordable: u32) -> Option<Decision> {
        let wanted = policy.wanted(&load);
        let busy = load.requests_per_second_milli > 0 || load.in_flight > 0 || load.queued > 0;
        // Samples must not go back in time; one that does replaces the window.
        if self.samples.back().is_some_and(|&(at, _, _)| at > load.at_ms) {
            self.samples.clear();
        }
        self.samples.push_back((load.at_ms, wanted, busy));
        // Kept: the samples of the longest window, and the last one before
        // it (the load as the window began).
        let horizon = load.at_ms.saturating_sub(policy.down_window_ms.max(policy.up_window_ms));
        while self.samples.len() > SAMPLES_MAX || self.samples.get(1).is_some_and(|&(at, _, _)| at <= horizon) {
            self.samples.pop_front();
        }
        let ceiling = policy.max_replicas.min(affordable);
        let decide = |to: u32, reason| (to != running).then_some(Decision { from: running, to, reason });
        // The bounds first: they hold whatever the load says.
        if running > ceiling {
            let reason = if running > policy.max_replicas { Reason::AboveMax } else { Reason::Budget };
            return decide(ceiling, reason);
        }
        let floor = policy.min_replicas.min(ceiling);
        if running < floor {
            return decide(floor, Reason::BelowMin);
        }
        if running == 0 {
            return match load.queued > 0 || load.in_flight > 0 {
                true => decide(wanted.max(1).min(ceiling), Reason::Woken),
                false => None,
            };
        }
        let up = self.over(load.at_ms, policy.up_window_ms).map(|(least, _, _)| least);
        if let Some(least) = up.filter(|least| *least > running) {
            return decide(least.min(ceiling), Reason::LoadAbove);
        }
        if let Some((_, most, any_busy)) = self.over(load.at_ms, policy.down_window_ms) {
            if !any_busy && policy.min_replicas == 0 {
                return decide(0, Reason::Idle);
            }
            if most < running {
                return decide(most.max(floor).max(1), Reason::LoadBelow);
            }
        }
        None
    }

    /// Over the last `window_ms` (when the samples cover it whole): the
    /// fewest and the most replicas wanted, and whether any sample saw a
    /// request. The last sample at or before the window's start counts: it
    /// is the load as the window began.
    fn over(&self, now_ms: u64, window_ms: u64) -> Option<(u32, u32, bool)> {
        let since = now_ms.checked_sub(window_ms)?;
        let start = self.samples.iter().rposition(|&(at, _, _)| at <= since)?;
        let within = self.samples.iter().skip(start);
        within.fold(None, |acc, &(_, wanted, busy)| match acc {
            None => Some((wanted, wanted, busy)),
            Some((least, most, any)) => Some((least.min(wanted), most.max(wanted), any || busy)),
        })
    }
}
