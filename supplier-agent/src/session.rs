//! One agent session against the exchange: log in with the host key,
//! register the host's GPUs (resuming those registered before), keep one
//! ask per configured contract kind covering every healthy, free GPU at the
//! owner's floor price, report health changes, and run the delivery hook on
//! every lease event for this host.
//!
//! The agent re-derives its asks from what it knows (GPU health, its leases)
//! whenever that changes, by cancelling its ask of a kind and placing a new
//! one: simple, and always consistent with the engine's view.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ed25519_dalek::{Signer, SigningKey};
use futures_util::{SinkExt, StreamExt};
use gpux_engine::{
    AccountId, Event, EventKind, GpuInfo, GpuSet, HostId, InstrumentId, LeaseId, LeaseKind, OrderId, RejectCode, Role, Side,
};
use gpux_protocol::*;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::backend::GpuBackend;
use crate::config::{AgentConfig, OfferedContract};

/// An authenticated connection to the exchange, with request/answer by id.
/// Messages that arrive while waiting for an answer are queued for `next`.
pub struct Connection {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    backlog: std::collections::VecDeque<ServerMessage>,
    next_id: u64,
    pub account: AccountId,
}

impl Connection {
    pub async fn open(url: &str, key: &SigningKey, role: Role) -> Result<Connection> {
        let (mut socket, _) = tokio_tungstenite::connect_async(url).await.with_context(|| format!("connecting to {url}"))?;
        let nonce = match read(&mut socket).await? {
            ServerMessage::Challenge { nonce, .. } => nonce,
            other => bail!("expected a challenge, got {other:?}"),
        };
        let nonce: [u8; 32] = hex::decode(nonce).ok().and_then(|n| n.try_into().ok()).context("challenge nonce is not 32 hex bytes")?;
        let auth = ClientMessage::Auth {
            id: 1,
            public_key: hex::encode(key.verifying_key().to_bytes()),
            signature: hex::encode(key.sign(&auth_payload(&nonce)).to_bytes()),
            role: Some(role),
        };
        socket.send(Message::Text(encode_client_text(&auth).into())).await?;
        let mut backlog = std::collections::VecDeque::new();
        loop {
            match read(&mut socket).await? {
                ServerMessage::Authenticated { account, .. } => return Ok(Connection { socket, backlog, next_id: 1, account }),
                ServerMessage::Error { code, message, .. } => bail!("the exchange refused the host key: {code:?}: {message}"),
                other => backlog.push_back(other),
            }
        }
    }

    pub fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Sends a request and waits for the message answering its id.
    pub async fn request(&mut self, message: ClientMessage) -> Result<ServerMessage> {
        let id = message.id();
        self.socket.send(Message::Text(encode_client_text(&message).into())).await?;
        loop {
            let message = read(&mut self.socket).await?;
            if answer_id(&message) == Some(id) {
                return Ok(message);
            }
            self.backlog.push_back(message);
        }
    }

    /// The next pushed message (private events, market data).
    pub async fn next(&mut self) -> Result<ServerMessage> {
        match self.backlog.pop_front() {
            Some(message) => Ok(message),
            None => read(&mut self.socket).await,
        }
    }
}

fn answer_id(message: &ServerMessage) -> Option<u64> {
    match message {
        ServerMessage::Ack { id, .. }
        | ServerMessage::Reject { id, .. }
        | ServerMessage::Subscribed { id, .. }
        | ServerMessage::Unsubscribed { id, .. }
        | ServerMessage::Instruments { id, .. }
        | ServerMessage::Orders { id, .. }
        | ServerMessage::Gpus { id, .. }
        | ServerMessage::Stats { id, .. }
        | ServerMessage::Balance { id, .. }
        | ServerMessage::UsageAccepted { id, .. }
        | ServerMessage::UsageRejected { id, .. }
        | ServerMessage::Pong { id, .. } => Some(*id),
        ServerMessage::Error { id, .. } => *id,
        _ => None,
    }
}

async fn read(socket: &mut WebSocketStream<MaybeTlsStream<TcpStream>>) -> Result<ServerMessage> {
    loop {
        match socket.next().await.context("the exchange closed the connection")?? {
            Message::Text(text) => {
                return decode_server_text(&text).map_err(|e| anyhow::anyhow!("undecodable server message: {}", e.message))
            }
            Message::Binary(bytes) => {
                return decode_server_binary(&bytes).map_err(|e| anyhow::anyhow!("undecodable server message: {}", e.message))
            }
            Message::Close(frame) => bail!("the exchange closed the connection: {frame:?}"),
            _ => continue,
        }
    }
}

/// What the agent knows about one of its GPUs.
struct HostGpu {
    info: GpuInfo,
    healthy: bool,
}

pub struct Agent {
    config: AgentConfig,
    key: SigningKey,
    backend: Box<dyn GpuBackend>,
}

/// The agent's live state in a session.
struct Session {
    connection: Connection,
    host: HostId,
    gpus: Vec<HostGpu>,
    /// Ask instruments per offered contract kind.
    instruments: BTreeMap<OfferedContract, InstrumentId>,
    tick_minor: u64,
    asks: BTreeMap<OfferedContract, OrderId>,
    /// Running leases on this host: kind and GPU mask.
    leases: BTreeMap<LeaseId, (LeaseKind, u64)>,
    next_client_order_id: u64,
}

impl Agent {
    pub fn new(config: AgentConfig, key: SigningKey, backend: Box<dyn GpuBackend>) -> Self {
        Agent { config, key, backend }
    }

    /// Runs one session until the exchange goes away or `stop` fires.
    pub async fn run(mut self, stop: impl std::future::Future<Output = ()>) -> Result<()> {
        let mut connection = Connection::open(&self.config.exchange, &self.key, Role::Supplier).await?;
        tracing::info!(account = %connection.account, public_key = %hex::encode(self.key.verifying_key().to_bytes()), "logged in");
        let gpus = self.register(&mut connection).await?;
        let host = gpus.first().map(|g| g.info.host).context("no GPU of this host qualifies for any listed class")?;
        let (instruments, tick_minor) = self.instruments(&mut connection, &gpus).await?;
        let mut session = Session {
            connection,
            host,
            gpus,
            instruments,
            tick_minor,
            asks: BTreeMap::new(),
            leases: BTreeMap::new(),
            next_client_order_id: crate::session::client_order_id_base(),
        };
        for contract in session.instruments.keys().copied().collect::<Vec<_>>() {
            self.reoffer(&mut session, contract).await?;
        }
        let mut sampling = tokio::time::interval(Duration::from_millis(self.config.sample_interval_ms));
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => return Ok(()),
                _ = sampling.tick() => self.sample(&mut session).await?,
                message = session.connection.next() => self.on_message(&mut session, message?).await?,
            }
        }
    }

    /// Registers every GPU the exchange does not know yet, then returns the
    /// host's GPUs as the exchange sees them.
    async fn register(&mut self, connection: &mut Connection) -> Result<Vec<HostGpu>> {
        let inventory = self.backend.inventory()?;
        let known = my_gpus(connection).await?;
        for gpu in &inventory {
            if known.iter().any(|k| k.uuid == gpu.uuid) {
                continue;
            }
            let id = connection.new_id();
            let request =
                ClientMessage::RegisterGpu { id, host: self.config.host.clone(), gpu_uuid: gpu.uuid.clone(), spec: gpu.spec.clone() };
            match connection.request(request).await? {
                ServerMessage::Ack { .. } => tracing::info!(uuid = %gpu.uuid, model = %gpu.spec.model, "registered"),
                ServerMessage::Reject { code: RejectCode::GpuNotQualified, .. } => {
                    tracing::warn!(uuid = %gpu.uuid, model = %gpu.spec.model, "meets no listed class; not offered")
                }
                other => bail!("registering {}: {other:?}", gpu.uuid),
            }
        }
        let on_host: BTreeSet<&str> = inventory.iter().map(|g| g.uuid.as_str()).collect();
        Ok(my_gpus(connection)
            .await?
            .into_iter()
            .filter(|info| info.host_name == self.config.host && on_host.contains(info.uuid.as_str()))
            .map(|info| HostGpu { healthy: info.online, info })
            .collect())
    }

    /// The spot and preemptible instruments of the class these GPUs qualify for.
    async fn instruments(&self, connection: &mut Connection, gpus: &[HostGpu]) -> Result<(BTreeMap<OfferedContract, InstrumentId>, u64)> {
        let class = gpus.first().and_then(|g| g.info.classes.first()).context("no qualified GPU")?.clone();
        let id = connection.new_id();
        let ServerMessage::Instruments { instruments, .. } = connection.request(ClientMessage::Instruments { id }).await? else {
            bail!("the exchange did not list its instruments");
        };
        let mut found = BTreeMap::new();
        let mut tick_minor = 1;
        for offer in &self.config.offers {
            let suffix = match offer.contract {
                OfferedContract::Spot => "SPOT",
                OfferedContract::Preemptible => "PREEMPT",
            };
            let symbol = format!("{class}/{suffix}");
            let instrument = instruments.iter().find(|i| i.symbol == symbol).with_context(|| format!("the exchange lists no {symbol}"))?;
            tick_minor = instrument.tick_minor;
            found.insert(offer.contract, instrument.instrument);
        }
        Ok((found, tick_minor))
    }

    /// GPUs that can be sold now in a contract kind, as a mask over the host.
    fn free_mask(&self, session: &Session, contract: OfferedContract) -> u64 {
        let busy = session
            .leases
            .values()
            .filter(|(kind, _)| contract == OfferedContract::Preemptible || *kind != LeaseKind::Preemptible)
            .fold(0u64, |mask, (_, gpus)| mask | gpus);
        session.gpus.iter().filter(|g| g.healthy).fold(0u64, |mask, g| mask | (1u64 << g.info.index_on_host)) & !busy
    }

    /// Replaces the ask of one contract kind with one over the GPUs free now.
    async fn reoffer(&self, session: &mut Session, contract: OfferedContract) -> Result<()> {
        if let Some(order) = session.asks.remove(&contract) {
            let id = session.connection.new_id();
            session.connection.request(ClientMessage::CancelOrder { id, order }).await?;
        }
        let mask = self.free_mask(session, contract);
        let (Some(&instrument), Some(offer)) =
            (session.instruments.get(&contract), self.config.offers.iter().find(|o| o.contract == contract))
        else {
            return Ok(());
        };
        if mask == 0 {
            return Ok(());
        }
        let price = offer.price_floor_minor_per_gpu_hour.div_ceil(session.tick_minor) * session.tick_minor;
        session.next_client_order_id += 1;
        let mut order = OrderTicket::limit(session.next_client_order_id, instrument, Side::Sell, price, mask.count_ones());
        order.supply = Some(GpuSet { host: session.host, gpu_mask: mask });
        let id = session.connection.new_id();
        match session.connection.request(ClientMessage::NewOrder { id, order }).await? {
            ServerMessage::Ack { order: Some(order), .. } => {
                tracing::info!(?contract, gpus = mask.count_ones(), price, "offered");
                session.asks.insert(contract, order);
            }
            // A GPU can be busy in a way the agent has not heard of yet (a
            // window delivery); the next event or sample offers again.
            ServerMessage::Reject { code, .. } => tracing::warn!(?contract, ?code, "offer refused"),
            other => bail!("offering: {other:?}"),
        }
        Ok(())
    }

    async fn sample(&mut self, session: &mut Session) -> Result<()> {
        let samples = self.backend.sample(now_ms())?;
        let mut changed = false;
        for sample in samples {
            let Some(gpu) = session.gpus.iter_mut().find(|g| g.info.uuid == sample.uuid) else { continue };
            if gpu.healthy == sample.healthy {
                continue;
            }
            gpu.healthy = sample.healthy;
            changed = true;
            tracing::warn!(uuid = %sample.uuid, healthy = sample.healthy, "GPU health changed");
            let (gpu_id, online) = (gpu.info.gpu, sample.healthy);
            let id = session.connection.new_id();
            session.connection.request(ClientMessage::SetGpuOnline { id, gpu: gpu_id, online }).await?;
        }
        if changed {
            for contract in session.instruments.keys().copied().collect::<Vec<_>>() {
                self.reoffer(session, contract).await?;
            }
        }
        Ok(())
    }

    async fn on_message(&mut self, session: &mut Session, message: ServerMessage) -> Result<()> {
        let ServerMessage::Private { event } = message else { return Ok(()) };
        let Event { kind, .. } = event;
        let reoffer = match kind {
            EventKind::LeaseCreated { lease, kind, host, gpu_mask, end_ms, .. } if host == session.host => {
                session.leases.insert(lease, (kind, gpu_mask));
                self.deliver("start", session, lease, gpu_mask, end_ms).await;
                // An exclusive lease also takes the GPUs out of the preemptible ask.
                kind != LeaseKind::Preemptible
            }
            EventKind::PreemptionNotice { lease, ends_at_ms } => {
                if let Some(&(_, mask)) = session.leases.get(&lease) {
                    self.deliver("preempt", session, lease, mask, Some(ends_at_ms)).await;
                }
                false
            }
            EventKind::LeaseEnded { lease, .. } => match session.leases.remove(&lease) {
                Some((_, mask)) => {
                    self.deliver("end", session, lease, mask, None).await;
                    true
                }
                None => false,
            },
            EventKind::OrderClosed { order, .. } => {
                let closed: Vec<OfferedContract> = session.asks.iter().filter(|(_, o)| **o == order).map(|(c, _)| *c).collect();
                for contract in &closed {
                    session.asks.remove(contract);
                }
                !closed.is_empty()
            }
            _ => false,
        };
        if reoffer {
            for contract in session.instruments.keys().copied().collect::<Vec<_>>() {
                self.reoffer(session, contract).await?;
            }
        }
        Ok(())
    }

    /// Runs the owner's delivery hook (or logs) for a lease event.
    async fn deliver(&self, event: &str, session: &Session, lease: LeaseId, mask: u64, until_ms: Option<u64>) {
        let uuids: Vec<&str> =
            session.gpus.iter().filter(|g| mask & (1u64 << g.info.index_on_host) != 0).map(|g| g.info.uuid.as_str()).collect();
        let until = until_ms.map_or("-".to_string(), |ms| ms.to_string());
        tracing::info!(event, %lease, gpus = %uuids.join(","), %until, "lease event");
        let Some(hook) = &self.config.delivery_hook else { return };
        let status = tokio::process::Command::new(hook).arg(event).arg(lease.to_string()).arg(uuids.join(",")).arg(&until).status().await;
        match status {
            Ok(status) if status.success() => {}
            Ok(status) => tracing::error!(%lease, %status, hook = %hook_name(hook), "delivery hook failed"),
            Err(error) => tracing::error!(%lease, %error, hook = %hook_name(hook), "delivery hook could not run"),
        }
    }
}

fn hook_name(hook: &std::path::Path) -> String {
    PathBuf::from(hook).display().to_string()
}

async fn my_gpus(connection: &mut Connection) -> Result<Vec<GpuInfo>> {
    let id = connection.new_id();
    match connection.request(ClientMessage::MyGpus { id }).await? {
        ServerMessage::Gpus { gpus, .. } => Ok(gpus),
        other => bail!("listing registered GPUs: {other:?}"),
    }
}

/// Client order ids start from the clock so that a restarted agent never
/// reuses the id of an ask still open from its previous run.
fn client_order_id_base() -> u64 {
    now_ms() * 1_000
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
