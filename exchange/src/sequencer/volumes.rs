//! Volumes (docs/storage.md, docs/protocol.md "Volumes"): created, listed
//! and deleted (a deleted volume's files removed from the store); a bid's
//! mounts checked and journaled before it; the store tokens a lease's host
//! and the renter reach a volume's files with.

use gpux_engine::{AccountId, LeaseId};
use gpux_gateway::link::{ConnectionId, VolumeRequest};
use gpux_market::JournalEntry;
use gpux_protocol::jobs::StoreGrant;
use gpux_protocol::{ErrorCode, ServerMessage, VolumeMount};

use super::jobs::JOB_STORE_TOKEN_MS;

/// How long a host's volume token for an open-ended lease lasts (a year;
/// the store honours it only while the lease runs).
pub const HOST_VOLUME_TOKEN_OPEN_MS: u64 = 365 * 24 * gpux_engine::time::MS_PER_HOUR;
use super::{error, Sequencer};
use crate::job_store::{Grant, VolumeAccess};

impl Sequencer {
    pub(super) fn volume(&mut self, connection: ConnectionId, id: u64, request: VolumeRequest) {
        let Some(account) = self.account(connection) else { return self.reply(connection, error(Some(id), ErrorCode::NotAuthenticated)) };
        let at_ms = self.market.clock_ms();
        let entry = match request {
            VolumeRequest::List => {
                let volumes = self.market.volumes().list(account);
                return self.reply(connection, ServerMessage::Volumes { id, volumes });
            }
            VolumeRequest::Create { name, size_gib } => {
                // Volumes live in the job store: without one there is nowhere to keep them.
                if self.job_store.is_none() {
                    return self.reply(connection, error(Some(id), ErrorCode::JobStoreUnavailable));
                }
                if !self.journal_storage_price() {
                    return;
                }
                JournalEntry::CreateVolume { at_ms, account, name, size_gib }
            }
            VolumeRequest::Delete { name } => JournalEntry::DeleteVolume { at_ms, account, name },
        };
        // Refusals the market decides (limits, names, volumes in use) are
        // journaled too: the same journal refuses them again on replay.
        let Some((_, applied)) = self.journal(entry) else { return };
        let answer = match applied.volume {
            // A deleted volume's files are purged once the deletion is durable (`route`).
            Some(Ok(volume)) => ServerMessage::Volume { id, volume },
            Some(Err(code)) => error(Some(id), code),
            None => error(Some(id), ErrorCode::UnknownVolume),
        };
        self.reply(connection, answer);
    }

    /// Whether a bid's mounts may be journaled: each one of the account's
    /// volumes, none mounted read-write that another holder writes.
    pub(super) fn check_bid_volumes(&self, account: AccountId, mounts: &[VolumeMount]) -> Result<(), ErrorCode> {
        if mounts.is_empty() {
            return Ok(());
        }
        if self.job_store.is_none() {
            return Err(ErrorCode::JobStoreUnavailable);
        }
        self.market.volumes().check_mounts(account, mounts, self.market.clock_ms())
    }

    /// Journals the operator's storage price where the market's differs;
    /// false when the journal stopped.
    pub(super) fn journal_storage_price(&mut self) -> bool {
        let price = self.storage_minor_per_gib_month;
        if self.market.volumes().price_minor_per_gib_month() == price {
            return true;
        }
        let at_ms = self.market.clock_ms();
        self.journal(JournalEntry::StorageRules { at_ms, minor_per_gib_month: price }).is_some()
    }

    /// Charges storage hourly while priced volumes exist (journaled: the
    /// charges and the funds rule's deletions follow from the entry).
    pub(super) fn charge_storage(&mut self) {
        let now_ms = self.market.clock_ms();
        if self.market.volumes().charge_due(now_ms) {
            self.journal(JournalEntry::StorageCharge { at_ms: now_ms });
        }
    }

    /// A store token for volumes: `account`'s own for its volume `name`
    /// (readable and writable), or, with `lease`, the host's for the
    /// volumes attached to its running lease (read-only ones readable
    /// only). None when the volume or lease is not theirs.
    pub(super) fn volume_grant(
        &self,
        account: AccountId,
        name: &str,
        lease: Option<LeaseId>,
        expires_at_ms: u64,
    ) -> Result<Grant, ErrorCode> {
        match lease {
            None => {
                let volume = self.market.volumes().named(account, name).ok_or(ErrorCode::UnknownVolume)?;
                let access = VolumeAccess {
                    volume: volume.volume,
                    writable: true,
                    bytes_max: u64::from(volume.size_gib) * gpux_protocol::volumes::GIB,
                };
                Ok(Grant::Volume { owner: account, lease: None, volumes: vec![access], expires_at_ms })
            }
            Some(lease) => self.host_volume_grant(account, lease, expires_at_ms).ok_or(ErrorCode::UnknownVolume),
        }
    }

    /// The host's grant for every volume attached to its running `lease`.
    /// It lasts as long as the lease can (its end and an hour; an
    /// open-ended lease's, a year): the store honours it only while the
    /// lease runs and for the last sync after it, and a host syncs for the
    /// whole lease with the token it was handed (an hour's token left an
    /// open-ended lease's syncs refused after its first hour).
    fn host_volume_grant(&self, supplier: AccountId, lease: LeaseId, expires_at_ms: u64) -> Option<Grant> {
        let info = self.market.engine().lease(lease).filter(|l| l.active && l.supplier == supplier)?;
        let horizon = |end: Option<u64>| {
            end.map_or(self.clock.now_ms().saturating_add(HOST_VOLUME_TOKEN_OPEN_MS), |end| end.saturating_add(JOB_STORE_TOKEN_MS))
        };
        let expires_at_ms = expires_at_ms.max(horizon(info.end_ms));
        let volumes: Vec<VolumeAccess> = self
            .market
            .volumes()
            .attachments(lease)
            .into_iter()
            .map(|a| VolumeAccess { volume: a.volume, writable: !a.read_only, bytes_max: a.bytes_max })
            .collect();
        (!volumes.is_empty()).then_some(Grant::Volume { owner: info.renter, lease: Some(lease), volumes, expires_at_ms })
    }

    /// A running lease's volumes for its host `account` (`lease_delivery`).
    pub(super) fn lease_volumes(&self, account: AccountId, lease: LeaseId) -> Option<gpux_protocol::LeaseVolumes> {
        let info = self.market.engine().lease(lease).filter(|l| l.active && l.supplier == account)?;
        let volumes = self.market.volumes().attachments(lease);
        (!volumes.is_empty()).then(|| gpux_protocol::LeaseVolumes {
            renter: info.renter,
            volumes,
            store: self.host_volume_store_grant(lease),
        })
    }

    /// The store and a token for the volumes on `lease`, for its host: sent
    /// with `volumes_attached`.
    pub(super) fn host_volume_store_grant(&self, lease: LeaseId) -> Option<StoreGrant> {
        let issuer = self.job_store.as_ref()?;
        let supplier = self.market.engine().lease(lease)?.supplier;
        let expires_at_ms = self.clock.now_ms() + JOB_STORE_TOKEN_MS;
        let grant = self.host_volume_grant(supplier, lease, expires_at_ms)?;
        Some(StoreGrant { url: issuer.url.clone(), token: issuer.issue(&grant), expires_at_ms: grant.expires_at_ms() })
    }
}
