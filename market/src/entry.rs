//! The journal's entries: everything that changes the market, in the order
//! the sequencer accepted it. Replaying the entries through
//! [`MarketState::apply`](crate::MarketState::apply) from any snapshot
//! rebuilds the same state; nothing else changes it.

use gpux_engine::{AccountId, GpuId, Input, LeaseId};
use gpux_protocol::challenge::ChallengeError;
use gpux_protocol::{DeliveryState, LivenessReport, UsageReport, Workload};
use serde::{Deserialize, Serialize};

/// One journaled input: an engine command, or market state the engine does
/// not hold (key bindings, usage reports, delivery records).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JournalEntry {
    Engine(Input),
    /// The binding of an account to the public key that proved it.
    BindKey {
        public_key: [u8; 32],
        account: AccountId,
    },
    /// A usage report as received from `account` at `at_ms`; replay verifies
    /// it again and derives the same outcome and charge. A report without
    /// readings, in version 1's layout (journals from before readings
    /// decode unchanged); one with readings is a [`JournalEntry::UsageReportV2`].
    UsageReport {
        at_ms: u64,
        account: AccountId,
        #[serde(with = "gpux_protocol::usage_v1_record")]
        report: UsageReport,
    },
    /// A bid's workload; the bid's own `Engine` entry follows it directly.
    /// The secret part is sealed (never in clear here).
    BidWorkload {
        account: AccountId,
        client_order_id: u64,
        workload: Box<Workload>,
    },
    /// A renter set the workload of its lease.
    LeaseWorkload {
        account: AccountId,
        lease: LeaseId,
        workload: Box<Workload>,
    },
    /// A host published its encryption key (signature checked before journaling).
    EncryptionKey {
        account: AccountId,
        key: [u8; 32],
        signature: String,
    },
    /// A host reported a lease's delivery status at `at_ms`.
    DeliveryStatus {
        at_ms: u64,
        account: AccountId,
        lease: LeaseId,
        state: DeliveryState,
    },
    /// A spot bid opted in to re-match; the bid's own `Engine` entry follows
    /// it directly (after its `BidWorkload`, if it has one).
    BidRematch {
        account: AccountId,
        client_order_id: u64,
    },
    /// The exchange challenged a GPU's hardware (docs/market-rules.md
    /// "Verified hardware"); the market numbers the challenge.
    ChallengeIssued {
        at_ms: u64,
        gpu: GpuId,
        seed: [u8; 32],
        n: u32,
    },
    /// The GPU's owner committed to its answer; `open_seed` (drawn after
    /// it arrived) names the rows it must open.
    ChallengeCommitted {
        at_ms: u64,
        account: AccountId,
        challenge: u64,
        commitment: [u8; 32],
        open_seed: [u8; 32],
    },
    /// The owner opened its answer and the sequencer checked it: the
    /// verdict (the opening itself is not kept: it is `n` hashes and 8
    /// rows, and says nothing more than the verdict).
    ChallengeAnswered {
        at_ms: u64,
        account: AccountId,
        challenge: u64,
        verdict: Result<(), ChallengeError>,
    },
    /// No answer came in time.
    ChallengeExpired {
        at_ms: u64,
        challenge: u64,
    },
    /// A supplier's last session closed while it supplied active leases
    /// (docs/market-rules.md "Reliability score").
    SupplierDisconnected {
        at_ms: u64,
        account: AccountId,
    },
    /// A renter's signed observation of its lease's endpoint, received at
    /// `at_ms` (checked before journaling: the renter's own lease, signed by
    /// its key, in time order; docs/market-rules.md "Disputes").
    Liveness {
        at_ms: u64,
        account: AccountId,
        report: LivenessReport,
    },
    /// `by` added an API key to its account or one of its sub-accounts
    /// (`account`), checked before journaling (docs/protocol.md "Keys and
    /// scopes").
    AddKey {
        at_ms: u64,
        by: AccountId,
        account: AccountId,
        public_key: [u8; 32],
        scopes: gpux_protocol::Scopes,
        expires_at_ms: Option<u64>,
        label: String,
    },
    /// `by` revoked a key of its account or of one of its sub-accounts.
    RevokeKey {
        at_ms: u64,
        by: AccountId,
        public_key: [u8; 32],
    },
    /// The listing the journal starts with (docs/market-rules.md "The
    /// listing"): the first entry of a journal written since the listing
    /// file; older journals start with the demo listing. Anywhere else it
    /// is refused (`MarketError::GenesisNotFirst`).
    Genesis {
        listing: Box<gpux_engine::EngineConfig>,
    },
    /// A usage report with readings (temperature and power, signed as
    /// version 2), applied as a `UsageReport`.
    UsageReportV2 {
        at_ms: u64,
        account: AccountId,
        report: UsageReport,
    },
    /// Usage reports after this entry are checked by `rule`
    /// (docs/market-rules.md "Usage reports"); the exchange journals it once
    /// when it first runs a version that checks by ZIP-215.
    SignatureRule {
        rule: gpux_settlement::SignatureRule,
    },
    /// The exchange challenged a GPU's memory bandwidth (docs/market-rules.md
    /// "Verified hardware"): `passes` over `2^words_log2` words; committed,
    /// answered and expired as a `ChallengeIssued` challenge is.
    MemoryChallengeIssued {
        at_ms: u64,
        gpu: GpuId,
        seed: [u8; 32],
        words_log2: u32,
        passes: u32,
    },
    /// `AddKey` with the key that added it (`by_key`): the added key never
    /// outlives it nor holds more scopes (checked before journaling), and
    /// is revoked with it (docs/protocol.md "Keys and scopes"). What the
    /// exchange journals since keys keep their lineage.
    AddKeyBy {
        at_ms: u64,
        by: AccountId,
        by_key: [u8; 32],
        account: AccountId,
        public_key: [u8; 32],
        scopes: gpux_protocol::Scopes,
        expires_at_ms: Option<u64>,
        label: String,
    },
    /// A renter submitted a job (docs/jobs.md "A job's life"): the market
    /// numbers it and calls for its first bid.
    SubmitJob {
        at_ms: u64,
        terms: crate::jobs::JobTerms,
    },
    /// The renter cancelled a job: its bid or leases end.
    CancelJob {
        at_ms: u64,
        account: AccountId,
        job: crate::jobs::JobId,
    },
    /// The live exchange found a job's lease silent (its supplier said
    /// nothing of it for the exchange's `--job-silence-ms`): its delivery
    /// fails, the host's fault, and the job resumes elsewhere.
    JobLeaseSilent {
        at_ms: u64,
        lease: LeaseId,
    },
    /// The renter resizes a running job to `gpus` (it bids for the new
    /// size; once filled it restarts there).
    ResizeJob {
        at_ms: u64,
        account: AccountId,
        job: crate::jobs::JobId,
        gpus: u32,
    },
    /// A cluster member's interconnect probe, as its supplier signed it
    /// (checked before journaling): the market records its bus bandwidth
    /// on the lease's host (docs/market-rules.md "Interconnect probe").
    FabricProbe {
        at_ms: u64,
        account: AccountId,
        report: Box<gpux_protocol::FabricProbeReport>,
    },
    /// A renter's GPU probe observation of its lease, received at `at_ms`
    /// (checked before journaling: the renter's own lease, signed by the
    /// lease's probe key, in time order; docs/market-rules.md "Disputes").
    /// Appended.
    GpuProbe {
        at_ms: u64,
        account: AccountId,
        report: Box<gpux_protocol::GpuProbeReport>,
    },
    /// Jobs follow the rules of `version` from this entry on
    /// (`gpux_market::jobs::JOB_RULES`, docs/market-rules.md "Jobs"); the
    /// exchange journals it once when it first runs a build with newer
    /// rules, so a journal written before replays under the rules it ran
    /// under. Appended.
    JobRules {
        version: u32,
    },
    /// `SubmitJob` with what the job does beyond its retries: restarts
    /// after its workload's errors, other books, regions
    /// (`gpux_market::jobs::JobRecovery`). What the exchange journals
    /// since 2026-12-07. Appended.
    SubmitJobV2 {
        at_ms: u64,
        terms: crate::jobs::JobTerms,
        recovery: crate::jobs::JobRecovery,
    },
    /// A cluster job's held member exit waited `CLUSTER_EXIT_HOLD_MS` with
    /// no host fault among its peers: it counts as the workload's error
    /// (docs/jobs.md "Clusters"). Journaled by the live exchange when due.
    /// Appended.
    JobExitHoldEnded {
        at_ms: u64,
        job: crate::jobs::JobId,
    },
    /// A renter created a service (docs/services.md): the market numbers it
    /// and calls for its replicas' bids. Appended.
    CreateService {
        at_ms: u64,
        account: AccountId,
        spec: Box<gpux_protocol::ServiceSpec>,
    },
    /// The renter set how many replicas its service keeps. Appended.
    ScaleService {
        at_ms: u64,
        account: AccountId,
        service: gpux_protocol::ServiceId,
        replicas: u32,
    },
    /// The renter deleted its service: bids cancelled, leases ended. Appended.
    DeleteService {
        at_ms: u64,
        account: AccountId,
        service: gpux_protocol::ServiceId,
    },
    /// The renter's rolling update of its service's run. Appended.
    UpdateService {
        at_ms: u64,
        account: AccountId,
        service: gpux_protocol::ServiceId,
        run: gpux_protocol::ServiceRun,
    },
    /// A router's load of a service (`service_load`): summed over the
    /// service's routers and run through its autoscaling. Appended.
    ServiceLoad {
        at_ms: u64,
        account: AccountId,
        service: gpux_protocol::ServiceId,
        router: u32,
        load: gpux_protocol::ServiceLoad,
    },
    /// A renter created a volume (docs/storage.md). Appended.
    CreateVolume {
        at_ms: u64,
        account: AccountId,
        name: String,
        size_gib: u32,
    },
    /// The renter deleted its volume; its files leave the store. Appended.
    DeleteVolume {
        at_ms: u64,
        account: AccountId,
        name: String,
    },
    /// A bid's volumes (checked before journaling); the bid's own `Engine`
    /// entry follows it directly (after its `BidWorkload`). Appended.
    BidVolumes {
        account: AccountId,
        client_order_id: u64,
        mounts: Vec<gpux_protocol::VolumeMount>,
    },
    /// The storage price from here on (the exchange's flag, journaled when
    /// it differs from the market's): storage until now is charged at the
    /// old price. Appended.
    StorageRules {
        at_ms: u64,
        minor_per_gib_month: u64,
    },
    /// Storage charged to `at_ms` (hourly while priced volumes exist), and
    /// the funds rule's deletions. Appended.
    StorageCharge {
        at_ms: u64,
    },
    /// `CreateService` with what a service has beyond its spec (a floor of
    /// replicas on a book that does not preempt). What the exchange
    /// journals for a service with a floor. Appended.
    CreateServiceV2 {
        at_ms: u64,
        account: AccountId,
        spec: Box<gpux_protocol::ServiceSpec>,
        terms: crate::services::ServiceTerms,
    },
}

impl JournalEntry {
    /// The entry for a usage report: version 1's layout without readings,
    /// version 2's with them.
    pub fn usage(at_ms: u64, account: AccountId, report: UsageReport) -> JournalEntry {
        match report.body.readings {
            None => JournalEntry::UsageReport { at_ms, account, report },
            Some(_) => JournalEntry::UsageReportV2 { at_ms, account, report },
        }
    }

    /// The usage report the entry carries, if it carries one.
    pub fn usage_report(&self) -> Option<&UsageReport> {
        match self {
            JournalEntry::UsageReport { report, .. } | JournalEntry::UsageReportV2 { report, .. } => Some(report),
            _ => None,
        }
    }

    /// The exchange time the entry carries, if it carries one.
    pub fn at_ms(&self) -> Option<u64> {
        match self {
            JournalEntry::Engine(input) => Some(input.at_ms),
            JournalEntry::UsageReport { at_ms, .. }
            | JournalEntry::UsageReportV2 { at_ms, .. }
            | JournalEntry::DeliveryStatus { at_ms, .. }
            | JournalEntry::ChallengeIssued { at_ms, .. }
            | JournalEntry::MemoryChallengeIssued { at_ms, .. }
            | JournalEntry::ChallengeCommitted { at_ms, .. }
            | JournalEntry::ChallengeAnswered { at_ms, .. }
            | JournalEntry::ChallengeExpired { at_ms, .. }
            | JournalEntry::Liveness { at_ms, .. }
            | JournalEntry::SupplierDisconnected { at_ms, .. }
            | JournalEntry::AddKey { at_ms, .. }
            | JournalEntry::RevokeKey { at_ms, .. }
            | JournalEntry::AddKeyBy { at_ms, .. }
            | JournalEntry::SubmitJob { at_ms, .. }
            | JournalEntry::SubmitJobV2 { at_ms, .. }
            | JournalEntry::JobExitHoldEnded { at_ms, .. }
            | JournalEntry::CreateService { at_ms, .. }
            | JournalEntry::CreateServiceV2 { at_ms, .. }
            | JournalEntry::ScaleService { at_ms, .. }
            | JournalEntry::DeleteService { at_ms, .. }
            | JournalEntry::ServiceLoad { at_ms, .. }
            | JournalEntry::UpdateService { at_ms, .. }
            | JournalEntry::CreateVolume { at_ms, .. }
            | JournalEntry::DeleteVolume { at_ms, .. }
            | JournalEntry::StorageRules { at_ms, .. }
            | JournalEntry::StorageCharge { at_ms, .. }
            | JournalEntry::CancelJob { at_ms, .. }
            | JournalEntry::JobLeaseSilent { at_ms, .. }
            | JournalEntry::ResizeJob { at_ms, .. }
            | JournalEntry::FabricProbe { at_ms, .. }
            | JournalEntry::GpuProbe { at_ms, .. } => Some(*at_ms),
            JournalEntry::BindKey { .. }
            | JournalEntry::BidWorkload { .. }
            | JournalEntry::LeaseWorkload { .. }
            | JournalEntry::EncryptionKey { .. }
            | JournalEntry::BidRematch { .. }
            | JournalEntry::BidVolumes { .. }
            | JournalEntry::SignatureRule { .. }
            | JournalEntry::JobRules { .. }
            | JournalEntry::Genesis { .. } => None,
        }
    }
}
