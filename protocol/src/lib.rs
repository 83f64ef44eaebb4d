//! gpux-protocol: the messages that cross the wire between clients and the
//! exchange, and the one codec that turns them into frames.
//!
//! Every message has two encodings of the same serde model: JSON text frames
//! for people and scripts, and bincode 2 binary frames for low-latency
//! clients. The model is deliberately plain (externally tagged enums, no
//! flattening, no untagged unions) so that both encodings are total and
//! round-trip; `codec` (frames) and `record` (bincode records, under the
//! binary frames) are the only places that know either format, and every
//! decode is bounded.
//!
//! Modules depend in one direction: `record` <- `usage`, `delivery`,
//! `access` <- `messages` <- `codec`.

pub mod access;
pub mod challenge;
pub mod codec;
pub mod delivery;
pub mod fabric;
pub mod gpu_probe;
pub mod history;
pub mod invite;
pub mod invoice;
pub mod jobs;
pub mod liveness;
pub mod memory;
pub mod messages;
pub mod peer_auth;
pub mod record;
pub mod search;
pub mod secret_file;
pub mod services;
mod signed;
pub mod tls;
pub mod usage;
pub mod views;
pub mod volumes;

pub use access::{KeyInfo, Scope, Scopes};
pub use codec::*;
pub use delivery::{DeliveryState, Endpoint, FailureCode, Fault, RestartPolicy, Sealed, Secrets, Workload, WorkloadError};
pub use fabric::{FabricProbeBody, FabricProbeReport};
pub use gpu_probe::{GpuProbeBody, GpuProbeReport, ProbeGpu};
pub use history::{Candle, CandleInterval, Fill, FillCursor, Liquidity, TradePrint, TradeRecord};
pub use invoice::{Invoice, InvoiceItem, InvoiceLine, InvoiceTax, InvoiceTotals};
pub use jobs::{
    AttemptCause, AttemptMove, BookChoice, BundleRef, InputSource, JobAlternative, JobAssignment, JobFailure, JobId, JobInfo, JobInput,
    JobRun, JobState, JobSubmission, PreemptionAhead,
};
pub use liveness::{LivenessBody, LivenessReport};
pub use messages::*;
pub use record::{decode_record, decode_snapshot, encode_record, RecordError, RECORD_BYTES_MAX, SNAPSHOT_BYTES_MAX};
pub use services::{
    ReplicaAssignment, ReplicaInfo, ReplicaState, RolloutState, ScalingDecision, ScalingTarget, ServiceFloor, ServiceId, ServiceInfo,
    ServiceLoad, ServiceRun, ServiceScaling, ServiceSpec, ServiceState,
};
pub use signed::{verify_signed_batch_zip215, SignedItem};
pub use usage::*;
pub use volumes::{LeaseVolumes, VolumeAttachment, VolumeId, VolumeInfo, VolumeMount, VolumeState};
