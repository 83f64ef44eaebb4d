//! Test harness for the real `gpux-exchange` binary: start it on a temporary
//! data directory and a free loopback port, and talk to it over real
//! WebSocket connections as an authenticated client would.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ed25519_dalek::{Signer, SigningKey};
use futures_util::{SinkExt, StreamExt};
use gpux_engine::*;
use gpux_protocol::*;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use gpux_test_exchange::Launch;

/// The exchange binary as a child process (the workspace's one harness,
/// `gpux-test-exchange`), started the ways these tests need.
pub use gpux_test_exchange::Spawned as Exchange;

/// The ways these tests start the exchange binary they were built with.
pub trait Start {
    fn start(data_dir: &Path, operator: Option<&SigningKey>) -> Exchange;
    fn start_with(data_dir: &Path, operator: Option<&SigningKey>, extra: &[&str]) -> Exchange;
    /// On a given listen address (a restart that clients reconnect to).
    fn start_on(data_dir: &Path, operator: Option<&SigningKey>, listen: &str, extra: &[&str]) -> Exchange;
    /// With these environment variables set (the job store's S3 settings).
    fn start_with_env(data_dir: &Path, operator: Option<&SigningKey>, extra: &[&str], env: &[(&str, &str)]) -> Exchange;
    /// Under a descriptor limit (`ulimit -n`), its log (stderr, at the
    /// `GPUX_LOG` level given) written to `log`.
    fn start_limited(data_dir: &Path, nofile: u32, log: &Path, log_level: &str, extra: &[&str]) -> Exchange;
    /// With its stderr (the log at `log_level`, and what the live market
    /// prints) appended to `log`.
    fn start_logged(data_dir: &Path, log: &Path, log_level: &str, extra: &[&str]) -> Exchange;
}

const BINARY: &str = env!("CARGO_BIN_EXE_gpux-exchange");

fn launch<'a>(command: Command, operator: Option<&'a SigningKey>, listen: &'a str, extra: &'a [&'a str], stderr: Stdio) -> Launch<'a> {
    Launch { command, operator, listen, metrics: "127.0.0.1:0", extra, stderr }
}

impl Start for Exchange {
    fn start(data_dir: &Path, operator: Option<&SigningKey>) -> Exchange {
        Self::start_with(data_dir, operator, &[])
    }

    fn start_with(data_dir: &Path, operator: Option<&SigningKey>, extra: &[&str]) -> Exchange {
        Self::start_on(data_dir, operator, "127.0.0.1:0", extra)
    }

    fn start_on(data_dir: &Path, operator: Option<&SigningKey>, listen: &str, extra: &[&str]) -> Exchange {
        Exchange::launch(data_dir, launch(Command::new(BINARY), operator, listen, extra, Stdio::inherit()))
    }

    fn start_with_env(data_dir: &Path, operator: Option<&SigningKey>, extra: &[&str], env: &[(&str, &str)]) -> Exchange {
        let mut command = Command::new(BINARY);
        command.envs(env.iter().copied());
        Exchange::launch(data_dir, launch(command, operator, "127.0.0.1:0", extra, Stdio::inherit()))
    }

    fn start_limited(data_dir: &Path, nofile: u32, log: &Path, log_level: &str, extra: &[&str]) -> Exchange {
        let mut command = Command::new("sh");
        command.arg("-c").arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\"")).arg(BINARY);
        command.env("GPUX_LOG", log_level);
        let log = std::fs::File::create(log).expect("log file");
        Exchange::launch(data_dir, launch(command, None, "127.0.0.1:0", extra, Stdio::from(log)))
    }

    fn start_logged(data_dir: &Path, log: &Path, log_level: &str, extra: &[&str]) -> Exchange {
        let mut command = Command::new(BINARY);
        command.env("GPUX_LOG", log_level);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log file");
        Exchange::launch(data_dir, launch(command, None, "127.0.0.1:0", extra, Stdio::from(log)))
    }
}

pub struct Client {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// Messages read while waiting for a reply, delivered by `recv` later.
    backlog: std::collections::VecDeque<ServerMessage>,
    pub nonce: [u8; 32],
    pub binary: bool,
    next_id: u64,
}

pub fn key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

impl Client {
    pub async fn connect(addr: &str) -> Client {
        Self::connect_with_receive_buffer(addr, None).await
    }

    /// Connects with a small kernel receive buffer, to play a slow reader.
    pub async fn connect_with_receive_buffer(addr: &str, receive_buffer: Option<u32>) -> Client {
        Self::connect_via(addr, receive_buffer, None).await
    }

    /// Connects from `source`, an address of this host (a test address on
    /// `lo`: the exchange sees it as the client's, not as loopback).
    pub async fn connect_from(addr: &str, source: std::net::IpAddr) -> Client {
        Self::connect_via(addr, None, Some(source)).await
    }

    async fn connect_via(addr: &str, receive_buffer: Option<u32>, source: Option<std::net::IpAddr>) -> Client {
        let socket_addr: std::net::SocketAddr = addr.parse().expect("socket address");
        let tcp = if socket_addr.is_ipv4() { tokio::net::TcpSocket::new_v4() } else { tokio::net::TcpSocket::new_v6() }.expect("socket");
        if let Some(bytes) = receive_buffer {
            tcp.set_recv_buffer_size(bytes).expect("set receive buffer");
        }
        if let Some(source) = source {
            tcp.bind(std::net::SocketAddr::new(source, 0)).expect("bind the source address");
        }
        let stream = tcp.connect(socket_addr).await.expect("tcp connects");
        let (socket, _) =
            tokio_tungstenite::client_async(format!("ws://{addr}"), MaybeTlsStream::Plain(stream)).await.expect("websocket connects");
        let mut client = Client { socket, backlog: Default::default(), nonce: [0; 32], binary: false, next_id: 1 };
        match client.recv().await {
            ServerMessage::Challenge { nonce, .. } => client.nonce = hex::decode(nonce).expect("hex").try_into().expect("32 bytes"),
            other => panic!("expected a challenge, got {other:?}"),
        }
        client
    }

    pub fn auth_message(&mut self, key: &SigningKey, role: Option<Role>) -> ClientMessage {
        let signature = key.sign(&auth_payload(&self.nonce));
        ClientMessage::Auth {
            id: self.id(),
            public_key: hex::encode(key.verifying_key().to_bytes()),
            signature: hex::encode(signature.to_bytes()),
            role,
            cancel_on_disconnect: false,
            invite: None,
            market_data_version: None,
        }
    }

    /// Connects and authenticates within 5 s, or `None` (nobody listens,
    /// or the connection closed): for tests that fail over between
    /// addresses.
    pub async fn try_login(addr: &str, key: &SigningKey, role: Role) -> Option<(Client, AccountId)> {
        let attempt = async {
            let stream = TcpStream::connect(addr).await.ok()?;
            let (socket, _) = tokio_tungstenite::client_async(format!("ws://{addr}"), MaybeTlsStream::Plain(stream)).await.ok()?;
            let mut client = Client { socket, backlog: Default::default(), nonce: [0; 32], binary: false, next_id: 1 };
            loop {
                let Message::Text(text) = client.socket.next().await?.ok()? else { continue };
                if let Ok(ServerMessage::Challenge { nonce, .. }) = decode_server_text(&text) {
                    client.nonce = hex::decode(nonce).ok()?.try_into().ok()?;
                    break;
                }
            }
            let auth = client.auth_message(key, Some(role));
            let frame = Message::Text(encode_client_text(&auth).into());
            client.socket.send(frame).await.ok()?;
            loop {
                let Message::Text(text) = client.socket.next().await?.ok()? else { continue };
                match decode_server_text(&text).ok()? {
                    ServerMessage::Authenticated { account, .. } => return Some((client, account)),
                    ServerMessage::Error { .. } => return None,
                    _ => {}
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(5), attempt).await.ok().flatten()
    }

    /// Connects and authenticates; returns the account.
    pub async fn login(addr: &str, key: &SigningKey, role: Role) -> (Client, AccountId) {
        let mut client = Client::connect(addr).await;
        let auth = client.auth_message(key, Some(role));
        client.send(&auth).await;
        let account = client
            .recv_until(|m| match m {
                ServerMessage::Authenticated { account, .. } => Some(*account),
                ServerMessage::Error { code, .. } => panic!("auth failed: {code:?}"),
                _ => None,
            })
            .await;
        (client, account)
    }

    pub fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub async fn send(&mut self, message: &ClientMessage) {
        let frame = if self.binary {
            Message::Binary(encode_client_binary(message).into())
        } else {
            Message::Text(encode_client_text(message).into())
        };
        self.socket.send(frame).await.expect("send");
    }

    /// Subscribes and waits for the confirmation (and, for a book, its snapshot).
    pub async fn request_subscribe(&mut self, id: u64, channel: Channel, instrument: InstrumentId) {
        self.send(&ClientMessage::Subscribe { id, channel, instrument }).await;
        self.recv_until(|m| matches!(m, ServerMessage::Subscribed { id: i, .. } if *i == id).then_some(())).await;
        if channel == Channel::Book {
            self.recv_until(|m| matches!(m, ServerMessage::BookSnapshot { .. }).then_some(())).await;
        }
    }

    /// Queues a message without flushing (for floods); see `flush`.
    pub async fn send_nowait(&mut self, message: &ClientMessage) {
        self.socket.feed(Message::Text(encode_client_text(message).into())).await.expect("feed");
    }

    pub async fn flush(&mut self) {
        self.socket.flush().await.expect("flush");
    }

    pub async fn send_raw(&mut self, frame: Message) {
        self.socket.send(frame).await.expect("send raw");
    }

    /// The next server message (5 s timeout).
    pub async fn recv(&mut self) -> ServerMessage {
        if let Some(message) = self.backlog.pop_front() {
            return message;
        }
        self.recv_wire().await
    }

    async fn recv_wire(&mut self) -> ServerMessage {
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(5), self.socket.next())
                .await
                .expect("a server message within 5 s")
                .expect("connection open")
                .expect("valid frame");
            match frame {
                Message::Text(text) => return decode_server_text(&text).expect("server text decodes"),
                Message::Binary(bytes) => return decode_server_binary(&bytes).expect("server binary decodes"),
                Message::Close(frame) => panic!("closed: {frame:?}"),
                _ => continue,
            }
        }
    }

    /// The next message that is not a private event or market data.
    pub async fn recv_reply(&mut self) -> ServerMessage {
        loop {
            match self.recv().await {
                ServerMessage::Private { .. } | ServerMessage::BookUpdate { .. } | ServerMessage::Trade { .. } => continue,
                other => return other,
            }
        }
    }

    /// Reads until `pick` returns something, skipping other messages.
    pub async fn recv_until<T>(&mut self, mut pick: impl FnMut(&ServerMessage) -> Option<T>) -> T {
        loop {
            let message = self.recv().await;
            if let Some(found) = pick(&message) {
                return found;
            }
        }
    }

    /// Reads until the close frame; returns its reason.
    pub async fn closed_reason(&mut self) -> String {
        loop {
            match tokio::time::timeout(Duration::from_secs(5), self.socket.next()).await.expect("close within 5 s") {
                Some(Ok(Message::Close(Some(frame)))) => return frame.reason.to_string(),
                Some(Ok(Message::Close(None))) | None | Some(Err(_)) => return String::new(),
                Some(Ok(_)) => continue,
            }
        }
    }

    /// Reads everything up to the close frame (5 s between frames at
    /// most); returns what was read and the close reason.
    pub async fn read_to_close(&mut self) -> (Vec<ServerMessage>, String) {
        let mut read: Vec<ServerMessage> = self.backlog.drain(..).collect();
        loop {
            match tokio::time::timeout(Duration::from_secs(5), self.socket.next()).await.expect("a frame within 5 s") {
                Some(Ok(Message::Text(text))) => read.push(decode_server_text(&text).expect("server text decodes")),
                Some(Ok(Message::Binary(bytes))) => read.push(decode_server_binary(&bytes).expect("server binary decodes")),
                Some(Ok(Message::Close(Some(frame)))) => return (read, frame.reason.to_string()),
                Some(Ok(Message::Close(None))) | None | Some(Err(_)) => return (read, String::new()),
                Some(Ok(_)) => continue,
            }
        }
    }

    /// Sends a request and waits for its ack or reject (or error) by id;
    /// whatever else arrives meanwhile stays queued for `recv`.
    pub async fn request(&mut self, message: ClientMessage) -> ServerMessage {
        let id = message.id();
        self.send(&message).await;
        loop {
            let message = self.recv_wire().await;
            if message.answer_to() == Some(id) {
                return message;
            }
            self.backlog.push_back(message);
        }
    }

    /// Like `request`, but `None` when the connection is gone or no answer
    /// comes within 5 s (for tests where the serving node may change).
    pub async fn try_request(&mut self, message: ClientMessage) -> Option<ServerMessage> {
        let id = message.id();
        let frame = Message::Text(encode_client_text(&message).into());
        self.socket.send(frame).await.ok()?;
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(5), self.socket.next()).await.ok()??.ok()?;
            let Message::Text(text) = frame else { continue };
            let message = decode_server_text(&text).ok()?;
            if message.answer_to() == Some(id) {
                return Some(message);
            }
        }
    }

    /// Like `place`, but `None` when the connection is gone (for crash tests,
    /// where the exchange dies mid-request).
    pub async fn try_place(&mut self, order: OrderTicket) -> Option<ServerMessage> {
        let id = self.id();
        let frame = Message::Text(encode_client_text(&ClientMessage::NewOrder { id, order, workload: None }).into());
        self.socket.send(frame).await.ok()?;
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(5), self.socket.next()).await.ok()??.ok()?;
            let Message::Text(text) = frame else { continue };
            let message = decode_server_text(&text).ok()?;
            match &message {
                ServerMessage::Ack { id: i, .. } | ServerMessage::Reject { id: i, .. } if *i == id => return Some(message),
                ServerMessage::Error { id: Some(i), .. } if *i == id => return Some(message),
                _ => {}
            }
        }
    }

    /// Every open order of the account, following pages.
    pub async fn open_orders(&mut self) -> Vec<gpux_protocol::views::Order> {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let id = self.id();
            self.send(&ClientMessage::OpenOrders { id, after }).await;
            let (orders, next) = self
                .recv_until(|m| match m {
                    ServerMessage::Orders { id: i, orders, next_after } if *i == id => Some((orders.clone(), *next_after)),
                    _ => None,
                })
                .await;
            all.extend(orders);
            match next {
                Some(next) => after = Some(next),
                None => return all,
            }
        }
    }

    /// Registers an H100 (`h100_spec`) as GPU `gpu_uuid` of host `host`,
    /// with no region or fabric; the registration is acknowledged.
    pub async fn register_h100(&mut self, host: &str, gpu_uuid: &str) {
        let id = self.id();
        let message = ClientMessage::RegisterGpu {
            id,
            host: host.into(),
            gpu_uuid: gpu_uuid.into(),
            spec: h100_spec(),
            region: None,
            zone: None,
            fabric: None,
        };
        let registered = self.request(message).await;
        assert!(matches!(registered, ServerMessage::Ack { .. }), "{registered:?}");
    }

    pub async fn place(&mut self, order: OrderTicket) -> ServerMessage {
        let id = self.id();
        self.request(ClientMessage::NewOrder { id, order, workload: None }).await
    }
}

pub fn h100_spec() -> GpuSpec {
    GpuSpec::h100_sxm()
}

pub fn ticket(client_order_id: u64, side: Side, price: u64, quantity: u32) -> OrderTicket {
    OrderTicket::limit(client_order_id, InstrumentId(0), side, price, quantity)
}

/// The value of the first series in a Prometheus text body whose line
/// starts with `name` (give a trailing space or `{` to be exact).
pub fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or_else(|| panic!("{name} in {body}"))
}

/// Scrapes the metrics until the series `name` (as for [`metric`]) is at
/// least `value`, for what is counted after the event a test saw (10 s at
/// most); returns the last body.
pub async fn await_metric_at_least(addr: &str, name: &str, value: f64) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let body = scrape(addr).await;
        let now = body.lines().find_map(|line| line.strip_prefix(name).and_then(|rest| rest.trim().parse::<f64>().ok()));
        if now.is_some_and(|now| now >= value) {
            return body;
        }
        assert!(std::time::Instant::now() < deadline, "{name} never reached {value}: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `GET /metrics` from the exchange's metrics port, the whole response.
pub async fn scrape(addr: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("metrics port");
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("request");
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response)).await.expect("in time").expect("response");
    response
}

/// `GET path` over HTTP/1.1 with these headers: the status and the body.
pub async fn http_get(addr: &str, path: &str, headers: &[(&str, String)]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("HTTP port");
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.expect("request");
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut response)).await.expect("in time").expect("response");
    let status = response.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or_else(|| panic!("a status line: {response}"));
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default();
    (status, body)
}

/// A `gpux-gateway` process (built beside `gpux-exchange`) linked to the
/// first of `sequencers` that answers; its log goes nowhere.
pub struct Gateway {
    child: Child,
    pub addr: String,
}

impl Gateway {
    pub fn start(sequencers: &[&str], secret: &std::path::Path) -> Gateway {
        Self::start_with(sequencers, secret, &[])
    }

    /// `start` with more arguments (`--link-tls-ca FILE`).
    pub fn start_with(sequencers: &[&str], secret: &std::path::Path, extra: &[&str]) -> Gateway {
        let binary = std::path::Path::new(env!("CARGO_BIN_EXE_gpux-exchange")).with_file_name("gpux-gateway");
        assert!(binary.exists(), "{} is built with the workspace (cargo build -p gpux-gateway)", binary.display());
        let mut child = Command::new(binary)
            .args(["--listen", "127.0.0.1:0", "--name", "test-gateway"])
            .args(sequencers.iter().flat_map(|address| ["--sequencer", address]))
            .arg("--link-secret-file")
            .arg(secret)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("gpux-gateway starts");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        let mut addr = None;
        while addr.is_none() && lines.read_line(&mut line).unwrap_or(0) > 0 {
            addr = line.trim().strip_prefix("gpux-gateway: listening on ws://").and_then(|rest| rest.split(',').next()).map(str::to_string);
            line.clear();
        }
        let addr = addr.expect("the gateway listens");
        std::thread::spawn(move || for _ in lines.lines().map_while(Result::ok) {});
        Gateway { child, addr }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes a secret file as an operator would: readable by its owner only
/// (the exchange refuses one that others may read).
pub fn write_secret(path: &std::path::Path, contents: impl AsRef<[u8]>) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, contents).expect("a secret file");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
}

/// The s3s-fs server, on `port`, over `data`.
pub struct S3Server(Child);

impl S3Server {
    pub fn start(binary: &Path, port: u16, data: &Path) -> S3Server {
        let child = Command::new(binary)
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--access-key", "gpuxtest", "--secret-key", "gpuxtestsecret"])
            .arg(data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("s3s-fs starts");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "s3s-fs listened");
            std::thread::sleep(Duration::from_millis(50));
        }
        S3Server(child)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The s3s-fs binary (`GPUX_S3S_FS`), or `None` (the test skips) where
/// none is and `GPUX_REQUIRE_S3` is not set.
pub fn s3s_fs() -> Option<std::path::PathBuf> {
    match std::env::var_os("GPUX_S3S_FS").map(std::path::PathBuf::from) {
        Some(path) if path.exists() => Some(path),
        _ => {
            assert!(
                std::env::var("GPUX_REQUIRE_S3").as_deref() != Ok("1"),
                "GPUX_REQUIRE_S3=1 but GPUX_S3S_FS names no s3s-fs binary (scripts/test installs it)"
            );
            eprintln!("SKIPPED: no S3-compatible server (set GPUX_S3S_FS; scripts/test does)");
            None
        }
    }
}

/// The environment that points the exchange's `s3://` job store at the
/// s3s-fs server on `endpoint`.
pub fn s3_env(endpoint: &str) -> Vec<(String, String)> {
    [
        ("AWS_ENDPOINT", endpoint),
        ("AWS_ACCESS_KEY_ID", "gpuxtest"),
        ("AWS_SECRET_ACCESS_KEY", "gpuxtestsecret"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ALLOW_HTTP", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Puts `body` at `key` in the job store at `url`: the status and the answer's text.
pub async fn put(url: &str, token: &str, key: &str, body: Vec<u8>) -> (u16, String) {
    let answer = reqwest::Client::new().put(format!("{url}/v1/objects/{key}")).bearer_auth(token).body(body).send().await.expect("put");
    let status = answer.status().as_u16();
    (status, answer.text().await.unwrap_or_default())
}

/// Gets `key` from the job store at `url`: the status and the body.
pub async fn get(url: &str, token: &str, key: &str) -> (u16, Vec<u8>) {
    let answer = reqwest::Client::new().get(format!("{url}/v1/objects/{key}")).bearer_auth(token).send().await.expect("get");
    let status = answer.status().as_u16();
    (status, answer.bytes().await.map(|b| b.to_vec()).unwrap_or_default())
}

/// The job's state as its renter sees it.
pub async fn job_state(renter: &mut Client, job: JobId) -> JobState {
    let id = renter.id();
    match renter.request(ClientMessage::JobStatus { id, job }).await {
        ServerMessage::Job { job, .. } => job.state,
        other => panic!("{other:?}"),
    }
}

/// Waits until the job runs on a lease other than `not`; that lease.
pub async fn running_lease(renter: &mut Client, job: JobId, not: Option<gpux_engine::LeaseId>) -> gpux_engine::LeaseId {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let JobState::Running { leases, .. } | JobState::Starting { leases, .. } = job_state(renter, job).await {
            if leases.first().is_some_and(|l| Some(*l) != not) {
                return leases[0];
            }
        }
        assert!(Instant::now() < deadline, "the job runs on a new lease");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A host's token for the job its running `lease` runs.
pub async fn host_token(supplier: &mut Client, lease: gpux_engine::LeaseId) -> String {
    let id = supplier.id();
    match supplier.request(ClientMessage::JobStoreToken { id, job: None, lease: Some(lease), volume: None }).await {
        ServerMessage::JobStoreToken { token, .. } => token,
        other => panic!("{other:?}"),
    }
}

/// The supplier `key` logged in as publishes its hosts' encryption key
/// (bids that carry a workload then trade with its asks).
pub async fn publish_encryption_key(supplier: &mut Client, key: &SigningKey) {
    let encryption_key = [5u8; 32];
    let mut signed = gpux_protocol::delivery::ENCRYPTION_KEY_DOMAIN.to_vec();
    signed.extend_from_slice(&encryption_key);
    let signature = hex::encode(key.sign(&signed).to_bytes());
    let id = supplier.id();
    let published = supplier.request(ClientMessage::SetEncryptionKey { id, encryption_key: hex::encode(encryption_key), signature }).await;
    assert!(matches!(published, ServerMessage::Ack { .. }), "{published:?}");
}
