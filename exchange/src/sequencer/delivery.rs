//! Lease delivery requests: bids with a workload, a lease's workload, host
//! encryption keys, delivery statuses, and the relay of a workload's logs
//! from its host to its renter (never journaled: logs are not market state).

use gpux_engine::{AccountId, Command, LeaseId};
use gpux_market::JournalEntry;
use gpux_protocol::delivery::limits::LOG_TAIL_BYTES_MAX;
use gpux_protocol::{DeliveryState, ErrorCode, ServerMessage, Workload};

use super::{
    error, Pending, Sequencer, Target, LOGS_PENDING_MAX, LOGS_PENDING_PER_ACCOUNT_MAX, LOGS_PENDING_PER_SUPPLIER_MAX, LOGS_WAIT_MS,
};
use gpux_gateway::link::{ConnectionId, DeliveryRequest, SharedFrame};

impl Sequencer {
    /// A bid carrying a workload, or opting in to re-match: each is journaled
    /// right before the bid; every lease the bid fills receives the
    /// workload, and is replaced if its host fails it.
    pub(super) fn bid(
        &mut self,
        connection: ConnectionId,
        id: u64,
        command: Command,
        workload: Option<Box<Workload>>,
        rematch: bool,
        volumes: Vec<gpux_protocol::VolumeMount>,
    ) {
        let Some(order) = command.new_order() else { return };
        if order.side != gpux_engine::Side::Buy && workload.is_some() {
            return self.reply(connection, error(Some(id), ErrorCode::WorkloadNotOnBid));
        }
        let spot = self.market.engine().instrument(order.instrument).is_some_and(|i| i.contract == gpux_engine::ContractKind::Spot);
        if rematch && (order.side != gpux_engine::Side::Buy || !spot) {
            return self.reply(connection, error(Some(id), ErrorCode::RematchNotOnSpotBid));
        }
        let (account, client_order_id) = (order.account, order.client_order_id);
        if let Err(code) = self.check_bid_volumes(account, &volumes) {
            return self.reply(connection, error(Some(id), code));
        }
        if let Some(workload) = workload {
            if self.journal(JournalEntry::BidWorkload { account, client_order_id, workload }).is_none() {
                return;
            }
        }
        if rematch && self.journal(JournalEntry::BidRematch { account, client_order_id }).is_none() {
            return;
        }
        if !volumes.is_empty() && self.journal(JournalEntry::BidVolumes { account, client_order_id, mounts: volumes }).is_none() {
            return;
        }
        self.apply_command(Some(connection), id, command);
    }

    pub(super) fn delivery(&mut self, connection: ConnectionId, id: u64, request: DeliveryRequest) {
        let Some(account) = self.account(connection) else { return };
        let reply = match request {
            DeliveryRequest::SetWorkload { lease, workload } => match self.set_workload(account, id, lease, workload) {
                Some(reply) => reply,
                None => return,
            },
            DeliveryRequest::SetEncryptionKey { key, signature } => match self.market.check_encryption_key(account, &key, &signature) {
                Err(code) => error(Some(id), code),
                Ok(()) => match self.journal(JournalEntry::EncryptionKey { account, key, signature }) {
                    Some((journal_seq, _)) => ServerMessage::Ack { id, journal_seq, order: None },
                    None => return,
                },
            },
            DeliveryRequest::HostKey { lease } => self.host_key(account, id, lease),
            DeliveryRequest::Status { lease, state } => match self.delivery_status(connection, account, id, lease, state) {
                Some(reply) => reply,
                None => return,
            },
            DeliveryRequest::Query { lease } => self.lease_delivery(account, id, lease),
            DeliveryRequest::Logs { lease, tail_bytes } => {
                match self.host_request(connection, account, id, lease, HostAsk::Logs { tail_bytes }) {
                    Some(reply) => reply,
                    None => return,
                }
            }
            DeliveryRequest::FabricProbe { report } => match self.market.check_fabric_probe(account, &report) {
                Err(code) => error(Some(id), code),
                Ok(()) => match self.journal(JournalEntry::FabricProbe { at_ms: self.market.clock_ms(), account, report }) {
                    Some((journal_seq, _)) => ServerMessage::Ack { id, journal_seq, order: None },
                    None => return,
                },
            },
            DeliveryRequest::LogsReply { request, data, truncated } => {
                self.logs_reply(account, request, data, truncated);
                ServerMessage::Received { id }
            }
            DeliveryRequest::Exec { lease, command, timeout_ms } => {
                match self.host_request(connection, account, id, lease, HostAsk::Exec { command, timeout_ms }) {
                    Some(reply) => reply,
                    None => return,
                }
            }
            DeliveryRequest::ExecReply { request, outcome } => {
                self.exec_reply(account, request, outcome);
                ServerMessage::Received { id }
            }
        };
        self.reply(connection, reply);
    }

    /// A renter sets its lease's workload; the market hands it to the host.
    /// None: the batch failed.
    fn set_workload(&mut self, account: AccountId, id: u64, lease: LeaseId, workload: Box<Workload>) -> Option<ServerMessage> {
        if let Err(code) = self.market.check_lease_workload(account, lease) {
            return Some(error(Some(id), code));
        }
        let (journal_seq, _) = self.journal(JournalEntry::LeaseWorkload { account, lease, workload })?;
        Some(ServerMessage::Ack { id, journal_seq, order: None })
    }

    /// A host's delivery status: journaled, relayed to the renter, counted;
    /// a failure on the host's side ends the lease `delivery_failed` (the
    /// market's follow-up command). None: the batch failed.
    fn delivery_status(
        &mut self,
        connection: ConnectionId,
        account: AccountId,
        id: u64,
        lease: LeaseId,
        state: DeliveryState,
    ) -> Option<ServerMessage> {
        if let Err(code) = self.market.check_delivery_status(account, lease, &state) {
            return Some(error(Some(id), code));
        }
        self.sessions.delivered(connection, lease);
        self.metrics.observe_delivery_status(&state);
        let at_ms = self.market.clock_ms();
        let (journal_seq, applied) = self.journal(JournalEntry::DeliveryStatus { at_ms, account, lease, state })?;
        if applied.first_running {
            let start_ms = self.market.engine().lease(lease).map_or(at_ms, |l| l.start_ms);
            self.metrics.observe_time_to_running(at_ms.saturating_sub(start_ms));
        }
        Some(ServerMessage::Ack { id, journal_seq, order: None })
    }

    /// The renter asks for its host's encryption key (to seal secrets).
    fn host_key(&self, account: AccountId, id: u64, lease: LeaseId) -> ServerMessage {
        let Some(info) = self.market.engine().lease(lease).filter(|l| l.renter == account) else {
            return error(Some(id), ErrorCode::UnknownLease);
        };
        match (self.market.deliveries().encryption_key(info.supplier), self.market.account_key(info.supplier)) {
            (Some(key), Some(identity)) => ServerMessage::HostKey {
                id,
                lease,
                encryption_key: hex::encode(key.key),
                identity_key: hex::encode(identity),
                signature: key.signature.clone(),
            },
            _ => error(Some(id), ErrorCode::NoEncryptionKey),
        }
    }

    /// A lease's workload and last status, for its renter or its host; for
    /// an archived lease, as it was when the lease left the hot state.
    fn lease_delivery(&self, account: AccountId, id: u64, lease: LeaseId) -> ServerMessage {
        let parties = |renter: AccountId, supplier: AccountId| renter == account || supplier == account;
        let archived;
        let delivery = match self.market.engine().lease(lease) {
            Some(info) if parties(info.renter, info.supplier) => self.market.deliveries().lease(lease),
            Some(_) => return error(Some(id), ErrorCode::UnknownLease),
            None => match self.store().archived_lease(lease) {
                Ok(Some(found)) if parties(found.info.renter, found.info.supplier) => {
                    archived = found.delivery;
                    archived.as_ref()
                }
                Ok(_) => return error(Some(id), ErrorCode::UnknownLease),
                Err(reason) => return super::queries::journal_unavailable(id, reason),
            },
        };
        let (state, at_ms) = match delivery.and_then(|d| d.state.clone()) {
            Some((state, at_ms)) => (Some(state), Some(at_ms)),
            None => (None, None),
        };
        let replica =
            self.market.services().replica_of(lease).filter(|_| self.market.engine().lease(lease).is_some_and(|l| l.supplier == account));
        let (workload, replica) = (delivery.and_then(|d| d.workload.clone()), replica.map(Box::new));
        let volumes = self.lease_volumes(account, lease).map(Box::new);
        ServerMessage::LeaseDelivery { id, lease, workload, state, at_ms, replica, volumes }
    }

    /// A renter asks its workload's host for its logs or to run a command:
    /// the host is asked, and the answer (or `host_unreachable` after
    /// `LOGS_WAIT_MS`, past a command's own timeout) comes later. None:
    /// nothing to answer now.
    fn host_request(
        &mut self,
        connection: ConnectionId,
        account: AccountId,
        id: u64,
        lease: LeaseId,
        ask: HostAsk,
    ) -> Option<ServerMessage> {
        let Some(info) = self.market.engine().lease(lease).filter(|l| l.renter == account) else {
            return Some(error(Some(id), ErrorCode::UnknownLease));
        };
        let host_connected = self.sessions.is_present(info.supplier);
        if !host_connected {
            return Some(error(Some(id), ErrorCode::HostUnreachable));
        }
        // The exchange-wide table, one per connection, and each renter's and
        // each supplier's share of it, an account and its sub-accounts as
        // one participant (docs/market-rules.md "Shared limits").
        let engine = self.market.engine();
        let (renter, supplier) = (engine.participant_of(account), engine.participant_of(info.supplier));
        let waits = self.host_waits.pending.values();
        let (mine, on_supplier) =
            waits.fold((0, 0), |(mine, on), w| (mine + usize::from(w.renter == renter), on + usize::from(w.supplier == supplier)));
        if self.host_waits.pending.len() >= LOGS_PENDING_MAX
            || mine >= LOGS_PENDING_PER_ACCOUNT_MAX
            || on_supplier >= LOGS_PENDING_PER_SUPPLIER_MAX
            || self.host_waits.pending.values().any(|w| w.connection == connection)
        {
            return Some(error(Some(id), ErrorCode::RateLimited));
        }
        let request = self.host_waits.next_request;
        self.host_waits.next_request += 1;
        let (exec, wanted, wait_ms) = match ask {
            HostAsk::Logs { tail_bytes } => {
                let tail_bytes = tail_bytes.min(LOG_TAIL_BYTES_MAX);
                (false, ServerMessage::LogsWanted { request, lease, tail_bytes }, LOGS_WAIT_MS)
            }
            HostAsk::Exec { command, timeout_ms } => {
                (true, ServerMessage::ExecWanted { request, lease, command, timeout_ms }, LOGS_WAIT_MS + u64::from(timeout_ms))
            }
        };
        let deadline_ms = self.market.clock_ms() + wait_ms;
        self.host_waits.pending.insert(request, HostWait { exec, connection, renter, supplier, id, lease, deadline_ms });
        let wanted = SharedFrame::new(wanted);
        // The agent that runs the lease (the one that reported it); before
        // any report, every agent of the account, of which only the lease's
        // own answers.
        let target = match self.sessions.runner_of(info.supplier, lease) {
            Some(runner) => Target::Connection(runner),
            None => Target::Account(info.supplier),
        };
        self.batch.pending.push((target, Pending::Frame(wanted)));
        None
    }

    /// The host's logs, relayed to the renter that asked (the tail kept
    /// within the limit). Late answers and other hosts' are dropped.
    fn logs_reply(&mut self, account: AccountId, request: u64, mut data: String, truncated: bool) {
        let supplier_of = |lease| self.market.engine().lease(lease).map(|l| l.supplier);
        let Some(wait) = self.host_waits.pending.get(&request) else { return };
        if supplier_of(wait.lease) != Some(account) {
            return;
        }
        if self.host_waits.pending.get(&request).is_some_and(|w| w.exec) {
            return;
        }
        let wait = self.host_waits.pending.remove(&request).expect("present");
        let limit = LOG_TAIL_BYTES_MAX as usize;
        let cut = data.len() > limit;
        if cut {
            let mut start = data.len() - limit;
            while !data.is_char_boundary(start) {
                start += 1;
            }
            data = data.split_off(start);
        }
        let answer = ServerMessage::LeaseLogs { id: wait.id, lease: wait.lease, data, truncated: truncated || cut };
        self.reply(wait.connection, answer);
    }

    /// The host's outcome of a renter's command, relayed to the renter
    /// (bounded by the gateway). Late answers and other hosts' are dropped.
    fn exec_reply(&mut self, account: AccountId, request: u64, outcome: gpux_protocol::delivery::ExecOutcome) {
        let Some(wait) = self.host_waits.pending.get(&request) else { return };
        if !wait.exec || self.market.engine().lease(wait.lease).map(|l| l.supplier) != Some(account) {
            return;
        }
        let wait = self.host_waits.pending.remove(&request).expect("present");
        self.reply(wait.connection, ServerMessage::LeaseExec { id: wait.id, lease: wait.lease, outcome });
    }

    /// Tells renters whose hosts did not send the logs in time.
    pub(super) fn expire_logs_requests(&mut self) {
        let now = self.market.clock_ms();
        let expired: Vec<u64> = self.host_waits.pending.iter().filter(|(_, w)| w.deadline_ms <= now).map(|(r, _)| *r).collect();
        for request in expired {
            if let Some(wait) = self.host_waits.pending.remove(&request) {
                self.reply(wait.connection, error(Some(wait.id), ErrorCode::HostUnreachable));
            }
        }
    }
}

/// What a renter asks of its lease's host through the exchange.
enum HostAsk {
    Logs { tail_bytes: u32 },
    Exec { command: Vec<String>, timeout_ms: u32 },
}

/// Renters' `lease_logs` and `lease_exec` requests waiting for their
/// hosts' answers, by the request number the host is asked with.
pub(super) struct HostWaits {
    pending: std::collections::BTreeMap<u64, HostWait>,
    next_request: u64,
}

impl Default for HostWaits {
    fn default() -> Self {
        HostWaits { pending: Default::default(), next_request: 1 }
    }
}

/// A renter's `lease_logs` (or `lease_exec`) request waiting for its
/// host's answer; both count in the same shares.
struct HostWait {
    /// A `lease_exec`: answered `lease_exec`, not `lease_logs`.
    exec: bool,
    connection: ConnectionId,
    /// The participants of the renter that asked and of the supplier
    /// asked (their shares).
    renter: AccountId,
    supplier: AccountId,
    id: u64,
    lease: LeaseId,
    deadline_ms: u64,
}
