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

/// A GPU's hot state, one cache line (`align(64)`, asserted below): the
/// record admission and matching read for every GPU an ask names, most of
/// them cold in cache with hundreds of thousands registered. Ids are stored
/// without `Option`'s tag ([`MaybeId`]) and the reserved-window commitments,
/// which most GPUs never have, behind one pointer. Encoded as the record it
/// replaced (options and a list), so snapshots did not change with it.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
#[repr(align(64))]
pub(crate) struct Gpu {
    pub host: HostId,
    pub index_on_host: u32,
    pub owner: AccountId,
    pub classes_mask: u64,
    pub online: bool,
    /// Its last hardware challenge verified it (bids that ask for verified
    /// GPUs match only these).
    pub verified: bool,
    pub spot_ask: MaybeId<OrderId>,
    pub preemptible_ask: MaybeId<OrderId>,
    /// A spot lease, or a reserved window being delivered.
    pub exclusive_lease: MaybeId<LeaseId>,
    pub preemptible_lease: MaybeId<LeaseId>,
    #[serde(with = "boxed_commitments")]
    commitments: Commitments,
}

const _: () = assert!(std::mem::size_of::<Gpu>() == 64, "a GPU's hot state is one cache line");

/// An optional id in 8 bytes: `u64::MAX` is none (no order or lease id
/// reaches it: an order id's low half is a slab slot, far below `u32::MAX`;
/// lease ids count up from 0). Encoded as `Option`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct MaybeId<T> {
    raw: u64,
    id: std::marker::PhantomData<T>,
}

/// Ids a [`MaybeId`] holds.
pub(crate) trait RawId: Copy {
    fn raw(self) -> u64;
    fn from_raw(raw: u64) -> Self;
}

impl RawId for OrderId {
    fn raw(self) -> u64 {
        self.0
    }
    fn from_raw(raw: u64) -> Self {
        OrderId(raw)
    }
}

impl RawId for LeaseId {
    fn raw(self) -> u64 {
        self.0
    }
    fn from_raw(raw: u64) -> Self {
        LeaseId(raw)
    }
}

impl<T: RawId> MaybeId<T> {
    pub const NONE: MaybeId<T> = MaybeId { raw: u64::MAX, id: std::marker::PhantomData };

    pub fn get(self) -> Option<T> {
        (self.raw != u64::MAX).then(|| T::from_raw(self.raw))
    }

    pub fn set(&mut self, id: Option<T>) {
        *self = MaybeId::from(id);
    }

    pub fn is_some(self) -> bool {
        self.raw != u64::MAX
    }

    pub fn is_none(self) -> bool {
        self.raw == u64::MAX
    }
}

impl<T: RawId> From<Option<T>> for MaybeId<T> {
    fn from(id: Option<T>) -> Self {
        let raw = id.map_or(u64::MAX, T::raw);
        assert!(id.is_none() || raw != u64::MAX, "an id at the none sentinel");
        MaybeId { raw, id: std::marker::PhantomData }
    }
}

impl<T: RawId> PartialEq<Option<T>> for MaybeId<T> {
    fn eq(&self, other: &Option<T>) -> bool {
        self.raw == MaybeId::from(*other).raw
    }
}

impl<T: RawId + std::fmt::Debug> std::fmt::Debug for MaybeId<T> {
    /// As the `Option` it stands for (the state hash prints it).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

impl<T: RawId + serde::Serialize> serde::Serialize for MaybeId<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.get().serialize(serializer)
    }
}

impl<'de, T: RawId + serde::Deserialize<'de>> serde::Deserialize<'de> for MaybeId<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let id = Option::<T>::deserialize(deserializer)?;
        if id.is_some_and(|id| id.raw() == u64::MAX) {
            return Err(serde::de::Error::custom("an id at the none sentinel"));
        }
        Ok(MaybeId::from(id))
    }
}

/// A GPU's commitments behind one thin pointer: 8 bytes in the hot record
/// where a `Vec` takes 24 (the list is allocated for the few GPUs that
/// are offered or sold for reserved windows).
#[allow(clippy::box_collection)]
type Commitments = Option<Box<Vec<Commitment>>>;

/// The commitments encoded as the plain list they were.
mod boxed_commitments {
    use super::{Commitment, Commitments};

    pub fn serialize<S: serde::Serializer>(commitments: &Commitments, serializer: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(commitments.as_deref().map_or(&[][..], Vec::as_slice), serializer)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Commitments, D::Error> {
        let commitments: Vec<Commitment> = serde::Deserialize::deserialize(deserializer)?;
        Ok((!commitments.is_empty()).then(|| Box::new(commitments)))
    }
}

impl Gpu {
    /// A GPU just registered: online, unverified, in no ask or lease.
    pub fn new(host: HostId, index_on_host: u32, owner: AccountId, classes_mask: u64) -> Gpu {
        Gpu {
            host,
            index_on_host,
            owner,
            classes_mask,
            online: true,
            verified: false,
            spot_ask: MaybeId::NONE,
            preemptible_ask: MaybeId::NONE,
            exclusive_lease: MaybeId::NONE,
            preemptible_lease: MaybeId::NONE,
            commitments: None,
        }
    }

    /// Its reserved-window commitments.
    pub fn commitments(&self) -> &[Commitment] {
        self.commitments.as_deref().map_or(&[], Vec::as_slice)
    }

    pub fn commit(&mut self, commitment: Commitment) {
        self.commitments.get_or_insert_default().push(commitment);
    }
    pub fn qualifies_for(&self, class: u16) -> bool {
        self.classes_mask & (1u64 << class) != 0
    }

    /// Whether any commitment overlaps `[start_ms, end_ms)`; an open end
    /// (`None`) overlaps every commitment that ends after `start_ms`.
    pub fn committed_during(&self, start_ms: u64, end_ms: Option<u64>) -> bool {
        self.commitments().iter().any(|commitment| commitment.overlaps(start_ms, end_ms))
    }

    /// Whether a sold window overlaps `[start_ms, end_ms)`. Offered (unsold)
    /// windows do not hold a GPU back from a lease: the lease withdraws the
    /// GPU from them instead (`Engine::withdraw_gpu_from_windows_during`).
    pub fn sold_during(&self, start_ms: u64, end_ms: Option<u64>) -> bool {
        self.commitments().iter().any(|c| matches!(c.holder, CommitmentHolder::Sold(_)) && c.overlaps(start_ms, end_ms))
    }

    /// The first offered window ask overlapping `[start_ms, end_ms)`.
    pub fn offered_during(&self, start_ms: u64, end_ms: Option<u64>) -> Option<OrderId> {
        self.commitments().iter().find_map(|c| match c.holder {
            CommitmentHolder::Offered(order) if c.overlaps(start_ms, end_ms) => Some(order),
            _ => None,
        })
    }

    /// The earliest sold window starting at or after `from_ms`.
    pub fn next_sold_start(&self, from_ms: u64) -> Option<u64> {
        self.commitments()
            .iter()
            .filter(|commitment| matches!(commitment.holder, CommitmentHolder::Sold(_)) && commitment.start_ms >= from_ms)
            .map(|commitment| commitment.start_ms)
            .min()
    }

    pub fn remove_commitment(&mut self, instrument: InstrumentId, holder: CommitmentHolder) {
        if let Some(commitments) = &mut self.commitments {
            commitments.retain(|c| !(c.instrument == instrument && c.holder == holder));
            if commitments.is_empty() {
                self.commitments = None;
            }
        }
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

    /// The record as it was before it became one cache line.
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Before {
        host: HostId,
        index_on_host: u32,
        owner: AccountId,
        classes_mask: u64,
        online: bool,
        verified: bool,
        spot_ask: Option<OrderId>,
        preemptible_ask: Option<OrderId>,
        exclusive_lease: Option<LeaseId>,
        preemptible_lease: Option<LeaseId>,
        commitments: Vec<Commitment>,
    }

    /// Snapshots read and write the GPU record unchanged: it encodes as the
    /// record before, ids as options and the commitments as a list, and
    /// decodes back to the same state; an id at the sentinel is refused.
    #[test]
    fn the_one_line_record_encodes_as_the_record_before() {
        fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
            bincode::serde::encode_to_vec(value, bincode::config::standard()).expect("encodes")
        }
        let mut gpu = Gpu::new(HostId(2), 3, AccountId(4), 0b101);
        gpu.spot_ask.set(Some(OrderId::from_parts(7, 1)));
        gpu.exclusive_lease.set(Some(LeaseId(9)));
        let window = Commitment { start_ms: 10, end_ms: 20, instrument: InstrumentId(5), holder: CommitmentHolder::Sold(ContractId(6)) };
        gpu.commit(window);
        let before = Before {
            host: HostId(2),
            index_on_host: 3,
            owner: AccountId(4),
            classes_mask: 0b101,
            online: true,
            verified: false,
            spot_ask: Some(OrderId::from_parts(7, 1)),
            preemptible_ask: None,
            exclusive_lease: Some(LeaseId(9)),
            preemptible_lease: None,
            commitments: vec![window],
        };
        assert_eq!(encode(&gpu), encode(&before));
        let config = bincode::config::standard();
        let (decoded, _): (Gpu, usize) = bincode::serde::decode_from_slice(&encode(&before), config).expect("decodes");
        assert_eq!(format!("{:?}{:?}", decoded.spot_ask, decoded.preemptible_lease), "Some(OrderId(4294967303))None");
        assert_eq!(decoded.commitments().len(), 1);
        // Emptied, the commitments go back to none and encode as an empty list.
        gpu.remove_commitment(InstrumentId(5), CommitmentHolder::Sold(ContractId(6)));
        assert!(gpu.commitments.is_none());
        let sentinel = Before { exclusive_lease: Some(LeaseId(u64::MAX)), commitments: Vec::new(), ..before };
        assert!(bincode::serde::decode_from_slice::<Gpu, _>(&encode(&sentinel), config).is_err());
    }
}
