//! Services (docs/services.md, docs/protocol.md "Services"): specs checked
//! against the book they bid on and journaled, scales and deletes, and a
//! service's state and the account's services.

use gpux_engine::ContractKind;
use gpux_gateway::link::{ConnectionId, ServiceRequest};
use gpux_market::services::limits;
use gpux_market::JournalEntry;
use gpux_protocol::{ErrorCode, ServerMessage, ServiceId, ServiceSpec};

use super::{error, Sequencer};

impl Sequencer {
    pub(super) fn service(&mut self, connection: ConnectionId, id: u64, request: ServiceRequest) {
        let Some(account) = self.account(connection) else { return self.reply(connection, error(Some(id), ErrorCode::NotAuthenticated)) };
        let at_ms = self.market.clock_ms();
        let entry = match request {
            ServiceRequest::Status { service } => return self.reply(connection, self.service_answer(id, service, account)),
            ServiceRequest::List { offset } => {
                let (services, more) = self.market.services().list(account, offset as usize, limits::SERVICES_PAGE_MAX);
                let next_offset = more.then_some(offset + services.len() as u32);
                return self.reply(connection, ServerMessage::Services { id, services, next_offset });
            }
            ServiceRequest::Bill { service, offset } => {
                if let Some(refusal) = self.service_bill(connection, account, id, service, offset) {
                    self.reply(connection, refusal);
                }
                return;
            }
            ServiceRequest::Create { spec, floor } => {
                match self.check_service(&spec).and_then(|()| self.check_floor(&spec, floor.as_ref())) {
                    Err(message) => {
                        return self.reply(connection, ServerMessage::Error { id: Some(id), code: ErrorCode::ServiceInvalid, message })
                    }
                    // A service without a floor keeps the first entry's layout.
                    Ok(()) if floor.is_none() => JournalEntry::CreateService { at_ms, account, spec },
                    Ok(()) => JournalEntry::CreateServiceV2 { at_ms, account, spec, terms: gpux_market::services::ServiceTerms { floor } },
                }
            }
            ServiceRequest::Scale { service, replicas } => JournalEntry::ScaleService { at_ms, account, service, replicas },
            ServiceRequest::Delete { service } => JournalEntry::DeleteService { at_ms, account, service },
            ServiceRequest::Update { service, run } => {
                let mut spec = match self.market.services().info(service, account) {
                    Some(info) => info.spec,
                    None => return self.reply(connection, error(Some(id), ErrorCode::UnknownService)),
                };
                spec.set_run(run.clone());
                if let Err(message) = self.check_service(&spec) {
                    return self.reply(connection, ServerMessage::Error { id: Some(id), code: ErrorCode::ServiceInvalid, message });
                }
                JournalEntry::UpdateService { at_ms, account, service, run }
            }
            ServiceRequest::Load { service, router, load } => {
                // Checked before journaling: a load the market would refuse
                // is not worth a journal entry a second.
                if let Err(code) = self.market.services().accepts_load(service, account) {
                    return self.reply(connection, error(Some(id), code));
                }
                let Some((journal_seq, applied)) = self.journal(JournalEntry::ServiceLoad { at_ms, account, service, router, load }) else {
                    return;
                };
                if let Some(reason) = applied.scaled {
                    self.metrics.service_scalings.with_label_values(&[reason]).inc();
                }
                return self.reply(connection, ServerMessage::Ack { id, journal_seq, order: None });
            }
        };
        // Refusals the market decides (limits, unknown services, scales out
        // of bounds) are journaled too: the same journal refuses them again
        // on replay, and nothing else changes.
        let Some((_, applied)) = self.journal(entry) else { return };
        let answer = match applied.service {
            Some(Ok(service)) => self.service_answer(id, service, account),
            Some(Err(code)) => error(Some(id), code),
            None => error(Some(id), ErrorCode::UnknownService),
        };
        self.reply(connection, answer);
    }

    /// Hands the invoices' worker the service's bill: the transfers of
    /// every lease its replicas ran on since it was created, signed like
    /// an invoice. `Some`: the refusal to send instead.
    fn service_bill(
        &mut self,
        connection: ConnectionId,
        account: gpux_engine::AccountId,
        id: u64,
        service: ServiceId,
        offset: u32,
    ) -> Option<ServerMessage> {
        let Some((leases, created_at_ms)) = self.market.services().bill_of(service, account) else {
            return Some(error(Some(id), ErrorCode::UnknownService));
        };
        self.leases_bill(connection, account, id, leases.into_iter().collect(), created_at_ms, format!("service-{}", service.0), offset)
    }

    fn service_answer(&self, id: u64, service: ServiceId, account: gpux_engine::AccountId) -> ServerMessage {
        match self.market.services().info(service, account) {
            Some(info) => ServerMessage::Service { id, service: Box::new(info) },
            None => error(Some(id), ErrorCode::UnknownService),
        }
    }

    /// A floor's bounds and book: a spot book of the spec's GPU class, the
    /// spec's on a preemptible book, the floor's limit on its tick and
    /// within its band; the refusal's message.
    fn check_floor(&self, spec: &ServiceSpec, floor: Option<&gpux_protocol::ServiceFloor>) -> Result<(), String> {
        let Some(floor) = floor else { return Ok(()) };
        let invalid = |why: String| format!("{}: floor: {why}", ErrorCode::ServiceInvalid.message());
        floor.check(spec).map_err(|e| format!("{}: {e}", ErrorCode::ServiceInvalid.message()))?;
        let engine = self.market.engine();
        let book = engine.instrument(floor.instrument).ok_or_else(|| invalid("instrument: no such book".into()))?;
        let rest = engine.instrument(spec.instrument).ok_or_else(|| invalid("the service's instrument: no such book".into()))?;
        if book.contract != ContractKind::Spot || rest.contract != ContractKind::Preemptible || book.class != rest.class {
            return Err(invalid(format!(
                "instrument: a spot book of the service's class ({}) beside a service on its preemptible book",
                rest.class
            )));
        }
        limit_on_book(&book, floor.limit_minor_per_gpu_hour).map_err(invalid)
    }

    /// The spec's bounds, its book (spot or preemptible, the limit on its
    /// tick and within its band) and its regions; the refusal's message.
    fn check_service(&self, spec: &ServiceSpec) -> Result<(), String> {
        let invalid = |why: String| format!("{}: {why}", ErrorCode::ServiceInvalid.message());
        spec.check().map_err(|e| invalid(e.to_string()))?;
        let instrument = self.market.engine().instrument(spec.instrument).ok_or_else(|| invalid("instrument: no such book".into()))?;
        if !matches!(instrument.contract, ContractKind::Spot | ContractKind::Preemptible) {
            return Err(invalid("instrument: a spot or preemptible book".into()));
        }
        limit_on_book(&instrument, spec.limit_minor_per_gpu_hour).map_err(invalid)?;
        let known = &self.market.engine().config().regions;
        if let Some(unknown) = spec.regions.iter().find(|r| !known.contains(r)) {
            return Err(invalid(format!("regions: `{unknown}` is not a region of this exchange")));
        }
        Ok(())
    }
}

/// A limit price on `book`'s tick and within its band; the refusal's field
/// and rule otherwise.
fn limit_on_book(book: &gpux_engine::InstrumentInfo, price: u64) -> Result<(), String> {
    if !price.is_multiple_of(book.tick_minor.max(1))
        || !(book.price_min_minor_per_gpu_hour..=book.price_max_minor_per_gpu_hour).contains(&price)
    {
        return Err(format!(
            "limit_minor_per_gpu_hour: a multiple of the book's tick ({}) from {} to {}",
            book.tick_minor, book.price_min_minor_per_gpu_hour, book.price_max_minor_per_gpu_hour
        ));
    }
    Ok(())
}
