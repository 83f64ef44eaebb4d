//! Load generator for the real exchange over loopback WebSockets: N
//! connections, each its own renter, each keeping K requests in flight
//! (K = 1 is strict request/response), alternating a resting bid and its
//! cancel so books stay bounded. Every request is a journaled, fsynced,
//! acknowledged command. Reports acknowledged commands/s and ack latency
//! percentiles (hdrhistogram), and, with `--disk`, the single-commit rate of
//! the disk under the journal.
//!
//! With `--nodes 3` it drives a replicated cluster of 3 nodes on loopback
//! instead (docs/operations.md "A replicated cluster"): every
//! acknowledgement is then on a majority's disks. With `--gateways G` the
//! clients connect to G `gpux-gateway` processes linked to the exchange
//! (spread evenly); adding `--capacity` opens logged-in connections to them
//! until they refuse, each gateway under `ulimit -n` of `--gateway-nofile`
//! (default 256), and prints how many they held at once.
//! `--subscribers S` adds S logged-in readers of the book the load moves;
//! `--market-data-version 2` has them read version 2 (batches, conflation).
//!
//! Run (from the workspace root):
//! `cargo build --release -p gpux-exchange --bins --examples &&
//!  target/release/examples/exchange-load --connections 100 --in-flight 16 --seconds 10`

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ed25519_dalek::{Signer, SigningKey};
use futures_util::{SinkExt, StreamExt};
use gpux_engine::*;
use gpux_protocol::*;
use hdrhistogram::Histogram;
use tokio_tungstenite::tungstenite::Message;

struct Args {
    connections: usize,
    in_flight: usize,
    seconds: u64,
    disk: bool,
    /// Extra connections that only subscribe to the book the load moves.
    subscribers: usize,
    /// Cluster nodes (0: the single exchange).
    nodes: u64,
    /// `gpux-gateway` processes the clients connect to (0: the exchange's own listener).
    gateways: usize,
    capacity: bool,
    gateway_nofile: u64,
    /// The subscribers' market-data version (docs/protocol.md "Market data").
    market_data_version: u8,
}

fn args() -> Args {
    let mut args = Args {
        connections: 100,
        in_flight: 16,
        seconds: 10,
        disk: false,
        subscribers: 0,
        nodes: 0,
        gateways: 0,
        capacity: false,
        gateway_nofile: 256,
        market_data_version: 1,
    };
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let mut index = 0;
    while index < raw.len() {
        let value = || raw.get(index + 1).and_then(|v| v.parse::<u64>().ok()).expect("a number after the flag");
        match raw[index].as_str() {
            "--connections" => args.connections = value() as usize,
            "--in-flight" => args.in_flight = value() as usize,
            "--seconds" => args.seconds = value(),
            "--subscribers" => args.subscribers = value() as usize,
            "--nodes" => args.nodes = value(),
            "--gateways" => args.gateways = value() as usize,
            "--gateway-nofile" => args.gateway_nofile = value(),
            "--market-data-version" => args.market_data_version = value() as u8,
            "--capacity" => {
                args.capacity = true;
                index -= 1;
            }
            "--disk" => {
                args.disk = true;
                index -= 1;
            }
            other => panic!("unknown flag {other}"),
        }
        index += 2;
    }
    args
}

fn main() {
    let args = args();
    let dir = std::env::temp_dir().join(format!("gpux-load-{}", std::process::id()));
    if args.disk {
        disk_commit_rate(&dir);
        return;
    }
    let binary = std::env::current_exe().expect("exe").parent().and_then(|p| p.parent()).expect("target dir").join("gpux-exchange");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let (mut children, addr) =
        if args.nodes > 0 { cluster(&binary, &dir, &operator, args.nodes) } else { single(&binary, &dir, &operator, args.gateways > 0) };
    let addrs = if args.gateways > 0 {
        let (link, secret) = addr.split_once(' ').expect("the link address and secret");
        gateways(&binary, link, std::path::Path::new(secret), &args, &mut children)
    } else {
        vec![addr]
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    if args.capacity {
        runtime.block_on(capacity(&addrs, &args));
    } else {
        runtime.block_on(drive(&addrs, &operator, &args));
    }
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn exchange(binary: &std::path::Path, data_dir: &std::path::Path, operator: &SigningKey) -> Command {
    let mut command = Command::new(binary);
    command.arg("--data-dir").arg(data_dir).args(["--listen", "127.0.0.1:0", "--metrics-listen", "off", "--console-listen", "off"]);
    // Every client of this probe comes from loopback: more than one
    // address's default share (256).
    command.args(["--connections-per-ip-max", "4096"]);
    command.arg("--operator-key").arg(hex::encode(operator.verifying_key().to_bytes())).stdout(Stdio::piped());
    command
}

/// Every line the processes print, with the index of the process.
fn lines_of(children: &mut [std::process::Child]) -> std::sync::mpsc::Receiver<(usize, String)> {
    use std::io::BufRead;
    let (lines, received) = std::sync::mpsc::channel();
    for (index, child) in children.iter_mut().enumerate() {
        let (stdout, lines) = (child.stdout.take().expect("stdout"), lines.clone());
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines.send((index, line));
            }
        });
    }
    received
}

fn listening(lines: &std::sync::mpsc::Receiver<(usize, String)>) -> String {
    loop {
        let (_, line) = lines.recv().expect("exchange output");
        if let Some(addr) = line.strip_prefix("gpux-exchange: listening on ws://") {
            return addr.to_string();
        }
    }
}

/// The exchange's client address; with `link`, its link address and
/// secret file instead (separated by a space).
fn single(binary: &std::path::Path, dir: &std::path::Path, operator: &SigningKey, link: bool) -> (Vec<std::process::Child>, String) {
    let mut command = exchange(binary, dir, operator);
    if link {
        command.args(["--link-listen", "127.0.0.1:0"]);
    }
    let child = command.spawn().unwrap_or_else(|e| panic!("start {}: {e} (build it with --bins)", binary.display()));
    let mut children = vec![child];
    let lines = lines_of(&mut children);
    let addr = if link {
        loop {
            let (_, line) = lines.recv().expect("exchange output");
            if let Some(rest) = line.strip_prefix("gpux-exchange: links for gateways on ") {
                break format!("{} {}", rest.split_whitespace().next().expect("address"), dir.join("link.secret").display());
            }
        }
    } else {
        listening(&lines)
    };
    std::thread::spawn(move || lines.iter().for_each(drop));
    (children, addr)
}

/// `args.gateways` gpux-gateway processes linked to `link`; their client addresses.
fn gateways(
    binary: &std::path::Path,
    link: &str,
    secret: &std::path::Path,
    args: &Args,
    children: &mut Vec<std::process::Child>,
) -> Vec<String> {
    let gateway = binary.with_file_name("gpux-gateway");
    let first = children.len();
    for index in 0..args.gateways {
        let mut command = Command::new("sh");
        let nofile = if args.capacity { args.gateway_nofile.to_string() } else { "$(ulimit -Hn)".to_string() };
        command.arg("-c").arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\"")).arg(&gateway);
        command.args(["--sequencer", link, "--listen", "127.0.0.1:0", "--name", &format!("gw-{index}")]);
        command.args(["--connections-per-ip-max", "1000000", "--connections-max", "1000000"]).arg("--link-secret-file").arg(secret);
        children.push(command.stdout(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("start {}: {e}", gateway.display())));
    }
    let lines = lines_of(&mut children[first..]);
    let mut addrs = Vec::new();
    while addrs.len() < args.gateways {
        let (_, line) = lines.recv().expect("gateway output");
        if let Some(rest) = line.split("listening on ws://").nth(1) {
            addrs.push(rest.split([',', ' ']).next().expect("address").to_string());
        }
    }
    std::thread::spawn(move || lines.iter().for_each(drop));
    addrs
}

/// Opens logged-in connections, spread over `addrs`, until every address
/// refuses one; prints how many were open at once.
async fn capacity(addrs: &[String], args: &Args) {
    let mut held = Vec::new();
    let mut full = vec![false; addrs.len()];
    let mut index = 0u64;
    while full.iter().any(|full| !full) {
        for (slot, addr) in addrs.iter().enumerate() {
            if full[slot] {
                continue;
            }
            index += 1;
            let mut seed = [0u8; 32];
            seed[..8].copy_from_slice(&(index + 5_000_000).to_le_bytes());
            let opened = tokio::time::timeout(Duration::from_secs(5), try_login(addr, &SigningKey::from_bytes(&seed))).await;
            match opened {
                Ok(Some(socket)) => held.push(socket),
                _ => full[slot] = true,
            }
        }
    }
    println!("{} gateway(s), ulimit -n {} each: {} logged-in connections held at once", addrs.len(), args.gateway_nofile, held.len());
}

async fn try_login(addr: &str, key: &SigningKey) -> Option<Socket> {
    let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{addr}")).await.ok()?;
    let nonce = loop {
        match socket.next().await?.ok()? {
            Message::Text(text) => {
                if let Ok(ServerMessage::Challenge { nonce, .. }) = decode_server_text(&text) {
                    break nonce;
                }
            }
            Message::Close(_) => return None,
            _ => {}
        }
    };
    let nonce: [u8; 32] = hex::decode(nonce).ok()?.try_into().ok()?;
    let auth = ClientMessage::Auth {
        id: 1,
        public_key: hex::encode(key.verifying_key().to_bytes()),
        signature: hex::encode(key.sign(&auth_payload(&nonce)).to_bytes()),
        role: Some(Role::Renter),
        cancel_on_disconnect: false,
        invite: None,
        market_data_version: None,
    };
    socket.send(Message::Binary(encode_client_binary(&auth).into())).await.ok()?;
    loop {
        let message = match socket.next().await?.ok()? {
            Message::Binary(bytes) => decode_server_binary(&bytes).ok()?,
            Message::Text(text) => decode_server_text(&text).ok()?,
            Message::Close(_) => return None,
            _ => continue,
        };
        match message {
            ServerMessage::Authenticated { .. } => return Some(socket),
            ServerMessage::Error { .. } => return None,
            _ => {}
        }
    }
}

/// `nodes` cluster nodes on loopback, started and initialized; returns
/// the leader's client address once it serves.
fn cluster(binary: &std::path::Path, dir: &std::path::Path, operator: &SigningKey, nodes: u64) -> (Vec<std::process::Child>, String) {
    std::fs::create_dir_all(dir).expect("data dir");
    let secret = dir.join("cluster.secret");
    std::fs::write(&secret, "exchange-load cluster secret").expect("secret");
    // Secret files are refused while others may read them.
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod 600");
    let mut children = Vec::new();
    for id in 1..=nodes {
        let mut command = exchange(binary, &dir.join(format!("node{id}")), operator);
        command.args(["--node-id", &id.to_string(), "--raft-listen", "127.0.0.1:0", "--cluster-secret-file"]).arg(&secret);
        children.push(command.spawn().unwrap_or_else(|e| panic!("start {}: {e} (build it with --bins)", binary.display())));
    }
    let lines = lines_of(&mut children);
    let mut raft = std::collections::BTreeMap::new();
    while raft.len() < nodes as usize {
        let (index, line) = lines.recv().expect("node output");
        if let Some(addr) = line.split(": raft on ").nth(1) {
            raft.insert(index as u64 + 1, addr.to_string());
        }
    }
    let mut init = Command::new(binary);
    init.args(["cluster", "init", "--peer", &raft[&1], "--cluster-secret-file"]).arg(&secret);
    for (id, addr) in &raft {
        init.args(["--node", &format!("{id}={addr}")]);
    }
    assert!(init.status().expect("cluster init").success(), "cluster init");
    let addr = listening(&lines);
    std::thread::spawn(move || lines.iter().for_each(drop));
    (children, addr)
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn recv(socket: &mut Socket) -> ServerMessage {
    loop {
        match socket.next().await.expect("open").expect("frame") {
            Message::Binary(bytes) => return decode_server_binary(&bytes).expect("decodes"),
            Message::Text(text) => return decode_server_text(&text).expect("decodes"),
            _ => continue,
        }
    }
}

async fn login(addr: &str, key: &SigningKey, role: Role) -> (Socket, AccountId) {
    login_reading(addr, key, role, None).await
}

async fn login_reading(addr: &str, key: &SigningKey, role: Role, market_data_version: Option<u8>) -> (Socket, AccountId) {
    let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{addr}")).await.expect("connect");
    let ServerMessage::Challenge { nonce, .. } = recv(&mut socket).await else { panic!("challenge") };
    let nonce: [u8; 32] = hex::decode(nonce).expect("hex").try_into().expect("32 bytes");
    let auth = ClientMessage::Auth {
        id: 1,
        public_key: hex::encode(key.verifying_key().to_bytes()),
        signature: hex::encode(key.sign(&auth_payload(&nonce)).to_bytes()),
        role: Some(role),
        cancel_on_disconnect: false,
        invite: None,
        market_data_version,
    };
    socket.send(Message::Binary(encode_client_binary(&auth).into())).await.expect("send");
    loop {
        if let ServerMessage::Authenticated { account, .. } = recv(&mut socket).await {
            return (socket, account);
        }
    }
}

async fn drive(addrs: &[String], operator: &SigningKey, args: &Args) {
    let (mut admin, _) = login(&addrs[0], operator, Role::Operator).await;
    let mut sockets = Vec::new();
    for index in 0..args.connections {
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&(index as u64 + 100).to_le_bytes());
        let (socket, account) = login(&addrs[index % addrs.len()], &SigningKey::from_bytes(&seed), Role::Renter).await;
        let deposit = ClientMessage::Deposit { id: 2, account, amount_minor: 1 << 50 };
        admin.send(Message::Binary(encode_client_binary(&deposit).into())).await.expect("send");
        loop {
            if let ServerMessage::Ack { .. } = recv(&mut admin).await {
                break;
            }
        }
        sockets.push(socket);
    }
    let mut watchers = Vec::new();
    for index in 0..args.subscribers {
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&(index as u64 + 1_000_000).to_le_bytes());
        let version = Some(args.market_data_version).filter(|version| *version != 1);
        let (mut socket, _) = login_reading(&addrs[index % addrs.len()], &SigningKey::from_bytes(&seed), Role::Renter, version).await;
        let subscribe = ClientMessage::Subscribe { id: 3, channel: Channel::Book, instrument: InstrumentId(0) };
        socket.send(Message::Binary(encode_client_binary(&subscribe).into())).await.expect("send");
        watchers.push(socket);
    }
    let latencies = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("bounds")));
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let watcher_tasks: Vec<_> = watchers.into_iter().map(|socket| tokio::spawn(count_updates(socket, deadline))).collect();
    let started = Instant::now();
    let tasks: Vec<_> =
        sockets.into_iter().map(|socket| tokio::spawn(connection_load(socket, args.in_flight, deadline, latencies.clone()))).collect();
    let mut acked = 0u64;
    for task in tasks {
        acked += task.await.expect("load task");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut seen = Seen::default();
    for task in watcher_tasks {
        let each = task.await.expect("watcher");
        seen.updates += each.updates;
        seen.conflated += each.conflated;
        seen.frames += each.frames;
    }
    if args.subscribers > 0 {
        let delivered = seen.updates + seen.conflated;
        println!(
            "{} book subscribers (market data v{}) received {} updates ({:.0}/s in all, {:.0}/s each; {} of them conflated) in {} frames",
            args.subscribers,
            args.market_data_version,
            delivered,
            delivered as f64 / elapsed,
            delivered as f64 / elapsed / args.subscribers as f64,
            seen.conflated,
            seen.frames,
        );
    }
    let histogram = latencies.lock().expect("histogram");
    println!(
        "{} connections x {} in flight: {:.0} acknowledged commands/s ({} in {:.1} s); ack latency us p50 {:.0} p99 {:.0} p99.9 {:.0} max {:.0}",
        args.connections,
        args.in_flight,
        acked as f64 / elapsed,
        acked,
        elapsed,
        histogram.value_at_quantile(0.5) as f64 / 1e3,
        histogram.value_at_quantile(0.99) as f64 / 1e3,
        histogram.value_at_quantile(0.999) as f64 / 1e3,
        histogram.max() as f64 / 1e3,
    );
}

/// What one subscriber read.
#[derive(Default)]
struct Seen {
    /// Book updates, one by one.
    updates: u64,
    /// Book updates stood for by `book_conflated` (market data v2).
    conflated: u64,
    /// WebSocket frames.
    frames: u64,
}

/// Reads a book subscription until the deadline, decoding every frame.
async fn count_updates(mut socket: Socket, deadline: Instant) -> Seen {
    let mut seen = Seen::default();
    fn count(seen: &mut Seen, message: &ServerMessage) {
        match message {
            ServerMessage::BookUpdate { .. } => seen.updates += 1,
            ServerMessage::BookConflated { from_seq, seq, .. } => seen.conflated += seq + 1 - from_seq,
            ServerMessage::MarketData { messages } => messages.iter().for_each(|inner| count(seen, inner)),
            _ => {}
        }
    }
    while let Ok(Some(Ok(frame))) = tokio::time::timeout_at(deadline.into(), socket.next()).await {
        if let Message::Binary(bytes) = frame {
            seen.frames += 1;
            if let Ok(message) = decode_server_binary(&bytes) {
                count(&mut seen, &message);
            }
        }
    }
    seen
}

/// Keeps `in_flight` requests outstanding until the deadline; returns acks.
async fn connection_load(mut socket: Socket, in_flight: usize, deadline: Instant, latencies: Arc<Mutex<Histogram<u64>>>) -> u64 {
    let mut sent_at: HashMap<u64, Instant> = HashMap::new();
    let mut resting: Vec<OrderId> = Vec::new();
    let mut next_id = 10u64;
    let mut acked = 0u64;
    let mut local = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("bounds");
    loop {
        while sent_at.len() < in_flight && Instant::now() < deadline {
            next_id += 1;
            let message = match resting.pop() {
                Some(order) => ClientMessage::CancelOrder { id: next_id, order },
                None => ClientMessage::NewOrder {
                    id: next_id,
                    order: OrderTicket::limit(next_id, InstrumentId(0), Side::Buy, 1_000_000 + (next_id % 100) * 1_000, 1),
                    workload: None,
                },
            };
            sent_at.insert(next_id, Instant::now());
            socket.feed(Message::Binary(encode_client_binary(&message).into())).await.expect("send");
        }
        socket.flush().await.expect("flush");
        if sent_at.is_empty() {
            break;
        }
        match recv(&mut socket).await {
            ServerMessage::Ack { id, order, .. } => {
                if let Some(at) = sent_at.remove(&id) {
                    local.record(at.elapsed().as_nanos().max(1) as u64).expect("in range");
                    acked += 1;
                }
                resting.extend(order);
            }
            ServerMessage::Reject { id, code, .. } => panic!("request {id} rejected: {code:?}"),
            ServerMessage::Error { code: ErrorCode::RateLimited, .. } => {
                // Over this connection's message rate: the message was dropped.
                // Its id is lost too, so the window shrinks by one and the run goes on.
                if let Some(&oldest) = sent_at.keys().min() {
                    sent_at.remove(&oldest);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            ServerMessage::Error { id, code, .. } => panic!("request {id:?} refused: {code:?}"),
            _ => {}
        }
    }
    latencies.lock().expect("histogram").add(&local).expect("same bounds");
    acked
}

/// Commits of one ~100-byte record each with `Durability::Immediate`, for 3 s.
fn disk_commit_rate(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).expect("dir");
    let db = redb::Database::create(dir.join("commit-rate.redb")).expect("db");
    let table: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("t");
    let record = [7u8; 100];
    let started = Instant::now();
    let mut commits = 0u64;
    while started.elapsed() < Duration::from_secs(3) {
        let mut transaction = db.begin_write().expect("begin");
        transaction.set_durability(redb::Durability::Immediate).expect("durability");
        transaction.open_table(table).expect("table").insert(commits, record.as_slice()).expect("insert");
        transaction.commit().expect("commit");
        commits += 1;
    }
    println!("single-record durable commits: {:.0}/s", commits as f64 / started.elapsed().as_secs_f64());
    let _ = std::fs::remove_dir_all(dir);
}
