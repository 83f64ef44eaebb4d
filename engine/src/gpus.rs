//! The supply side: hosts, their GPUs, and what each GPU is doing over time.
//!
//! A GPU may sit in at most one spot ask and one preemptible ask at once, may
//! run one exclusive lease (spot or a delivered reserved window) and one
//! preemptible lease, and carries a list of future reserved-window
//! commitments (offered in an open ask, or sold as contracts). Every sale
//! checks these against the time it sells, which is what keeps one GPU from
//! being sold twice for overlapping time.

use crate::config::GpuSpec;
use crate::ids::{AccountId, ContractId, GpuId, HostId, InstrumentId, LeaseId, OrderId};
use crate::limits;

#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Host {
    pub name: String,
    pub owner: AccountId,
    /// GPUs in registration order; bit `i` of a `GpuSet` mask is `gpus[i]`.
    pub gpus: HostGpus,
    /// The host's region (an index into the listing's regions), declared
    /// with its first GPU; `None`: undeclared (no region-restricted bid
    /// trades with it).
    pub region: Option<u8>,
    /// The zone (data centre, availability zone) the host declared, shown
    /// only; empty if none.
    pub zone: String,
    /// The fabric that joins it to its supplier's other hosts, if declared.
    pub fabric: Option<crate::engine::clusters::HostFabric>,
}

/// A host's GPU ids, stored inline (no pointer to chase on the hot path of
/// every ask, fill and cancel).
#[derive(Clone)]
pub(crate) struct HostGpus {
    ids: [GpuId; limits::GPUS_PER_HOST_MAX as usize],
    len: u32,
}

impl HostGpus {
    pub fn new() -> Self {
        HostGpus { ids: [GpuId(0); limits::GPUS_PER_HOST_MAX as usize], len: 0 }
    }
    pub fn len(&self) -> usize {
        self.len as usize
    }
    pub fn push(&mut self, gpu: GpuId) {
        assert!(self.len < limits::GPUS_PER_HOST_MAX, "host is full");
        self.ids[self.len as usize] = gpu;
        self.len += 1;
    }
    pub fn get(&self, index: usize) -> Option<&GpuId> {
        self.ids[..self.len as usize].get(index)
    }
}

impl serde::Serialize for HostGpus {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(&self.ids[..self.len as usize])
    }
}

impl<'de> serde::Deserialize<'de> for HostGpus {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let ids = Vec::<GpuId>::deserialize(deserializer)?;
        if ids.len() > limits::GPUS_PER_HOST_MAX as usize {
            return Err(serde::de::Error::custom("more GPUs on a host than the limit"));
        }
        let mut gpus = HostGpus::new();
        for id in ids {
            gpus.push(id);
        }
        Ok(gpus)
    }
}

impl std::ops::Index<usize> for HostGpus {
    type Output = GpuId;
    fn index(&self, index: usize) -> &GpuId {
        &self.ids[..self.len as usize][index]
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum CommitmentHolder {
    Offered(OrderId),
    Sold(ContractId),
}

/// A reserved window `[start_ms, end_ms)` this GPU is offered or sold for.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Commitment {
    pub start_ms: u64,
    pub end_ms: u64,
    pub instrument: InstrumentId,
    pub holder: CommitmentHolder,
}

impl Commitment {
    /// Whether it overlaps `[start_ms, end_ms)` (`None`: open-ended).
    fn overlaps(&self, start_ms: u64, end_ms: Option<u64>) -> bool {
        self.end_ms > start_ms && end_ms.is_none_or(|end| self.start_ms < end)
    }
}

/// What never changes after registration, kept apart from the hot state so
/// that matching touches as few cache lines per GPU as possible.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct GpuDetails {
    pub uuid: String,
    pub spec: GpuSpec,
    /// Its last hardware (compute) challenge.
    pub challenge: Option<crate::engine::GpuVerification>,
    /// Its last memory-bandwidth challenge.
    pub memory: Option<crate::engine::MemoryVerification>,
    /// The last rates its correct answers showed (`None`: never measured),
    /// against which each class's minimums are held.
    pub measured_mflops: Option<u64>,
    pub measured_mbps: Option<u64>,
    /// It answered a hardware challenge correctly once (or was registered
    /// only in classes that ask for none): it no longer counts among its
    /// owner's unproven GPUs (`limits::GPUS_UNPROVEN_PER_ACCOUNT_MAX`).
    pub proven: bool,
}

impl GpuDetails {
    /// Whether the measured rates meet a class's minimums (a rate never
    /// measured does not disqualify; it only keeps the GPU unverified).
    pub fn fast_enough_for(&self, class: &crate::config::ClassSpec) -> bool {
        class.challenge.is_none_or(|c| self.measured_mflops.is_none_or(|m| m >= c.min_mflops))
            && class.memory_challenge.is_none_or(|c| self.measured_mbps.is_none_or(|m| m >= c.min_mbps))
    }

    /// Whether the GPU's last answer of every kind of challenge the class
    /// asks for was correct (what "verified in it" means).
    pub fn answered_for(&self, class: &crate::config::ClassSpec) -> bool {
        use crate::event::ChallengeOutcome::{Passed, TooSlow};
        (class.challenge.is_none() || self.challenge.is_some_and(|v| matches!(v.outcome, Passed | TooSlow)))
            && (class.memory_challenge.is_none() || self.memory.is_some_and(|v| matches!(v.outcome, Passed | TooSlow)))
    }

    pub fn rejected(&self) -> bool {
        self.challenge.is_some_and(|c| c.rejected)
    }
}

#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Gpu {
    pub host: HostId,
    pub index_on_host: u32,
    pub owner: AccountId,
    pub classes_mask: u64,
    pub online: bool,
    /// Its last hardware challenge verified it (bids that ask for verified
    /// GPUs match only these).
    pub verified: bool,
    pub spot_ask: Option<OrderId>,
    pub preemptible_ask: Option<OrderId>,
    /// A spot lease, or a reserved window being delivered.
    pub exclusive_lease: Option<LeaseId>,
    pub preemptible_lease: Option<LeaseId>,
    pub commitments: Vec<Commitment>,
}

impl Gpu {
    pub fn qualifies_for(&self, class: u16) -> bool {
        self.classes_mask & (1u64 << class) != 0
    }

    /// Whether any commitment overlaps `[start_ms, end_ms)`; an open end
    /// (`None`) overlaps every commitment that ends after `start_ms`.
    pub fn committed_during(&self, start_ms: u64, end_ms: Option<u64>) -> bool {
        self.commitments.iter().any(|commitment| commitment.overlaps(start_ms, end_ms))
    }

    /// Whether a sold window overlaps `[start_ms, end_ms)`. Offered (unsold)
    /// windows do not hold a GPU back from a lease: the lease withdraws the
    /// GPU from them instead (`Engine::withdraw_gpu_from_windows_during`).
    pub fn sold_during(&self, start_ms: u64, end_ms: Option<u64>) -> bool {
        self.commitments.iter().any(|c| matches!(c.holder, CommitmentHolder::Sold(_)) && c.overlaps(start_ms, end_ms))
    }

    /// The first offered window ask overlapping `[start_ms, end_ms)`.
    pub fn offered_during(&self, start_ms: u64, end_ms: Option<u64>) -> Option<OrderId> {
        self.commitments.iter().find_map(|c| match c.holder {
            CommitmentHolder::Offered(order) if c.overlaps(start_ms, end_ms) => Some(order),
            _ => None,
        })
    }

    /// The earliest sold window starting at or after `from_ms`.
    pub fn next_sold_start(&self, from_ms: u64) -> Option<u64> {
        self.commitments
            .iter()
            .filter(|commitment| matches!(commitment.holder, CommitmentHolder::Sold(_)) && commitment.start_ms >= from_ms)
            .map(|commitment| commitment.start_ms)
            .min()
    }

    pub fn remove_commitment(&mut self, instrument: InstrumentId, holder: CommitmentHolder) {
        self.commitments.retain(|c| !(c.instrument == instrument && c.holder == holder));
    }
}

/// Iterates the set bits of a mask, lowest first.
pub(crate) fn mask_bits(mut mask: u64) -> impl Iterator<Item = u32> {
    std::iter::from_fn(move || {
        (mask != 0).then(|| {
            let bit = mask.trailing_zeros();
            mask &= mask - 1;
            bit
        })
    })
}

/// The lowest `count` set bits of `mask`.
pub(crate) fn lowest_bits(mask: u64, count: u32) -> u64 {
    mask_bits(mask).take(count as usize).fold(0, |taken, bit| taken | (1u64 << bit))
}

/// The highest `count` set bits of `mask`.
pub(crate) fn highest_bits(mask: u64, count: u32) -> u64 {
    let mut taken = 0u64;
    let mut left = mask;
    for _ in 0..count {
        if left == 0 {
            break;
        }
        let bit = 63 - left.leading_zeros();
        taken |= 1u64 << bit;
        left &= !(1u64 << bit);
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_helpers_pick_bits_from_either_end() {
        assert_eq!(mask_bits(0b1011_0000).collect::<Vec<_>>(), [4, 5, 7]);
        assert_eq!(lowest_bits(0b1011_0000, 2), 0b0011_0000);
        assert_eq!(highest_bits(0b1011_0000, 2), 0b1010_0000);
        assert_eq!(lowest_bits(0b1, 5), 0b1);
    }
}
