//! How many connections the exchange holds at once, what each costs in
//! memory, and how fast it reaps silent sockets: the `gpux-exchange` binary
//! as a child process (its resident memory and CPU time read from /proc),
//! and real sockets from this process.
//!
//! Run (docs/PERFORMANCE.md "Connections"):
//!
//! ```text
//! cargo build --release -p gpux-exchange -p gpux-benches
//! target/release/connection-capacity [connections] [silent]
//! ```
//!
//! 1. **Idle readers**: `connections` (default 8 000) anonymous connections,
//!    each subscribed to a trades feed, opened one after another and held;
//!    the exchange's resident memory (VmRSS) before and after, divided by
//!    the count. Then closed.
//! 2. **Logged-in sessions**: as many connections, each logged in with its
//!    own key (a new account each), held; memory per connection as above,
//!    on a fresh exchange process.
//! 3. **Silent sockets**: `silent` (default 1 000) TCP connections that never
//!    send a byte; the time from the last one's connect until the exchange
//!    has closed every one (the handshake deadline is 5 s), and the
//!    exchange's CPU time meanwhile.
//!
//! Both processes need a descriptor limit above `connections` (`ulimit -n`).

use gpux_benches::process::{cpu_ns, Spawned};
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use gpux_client::Connection;
use gpux_engine::{InstrumentId, Role};
use gpux_protocol::{Channel, ClientMessage, ServerMessage};

fn main() {
    let mut args = std::env::args().skip(1);
    let connections: usize = args.next().map_or(8_000, |a| a.parse().expect("connections is a number"));
    let silent: usize = args.next().map_or(1_000, |a| a.parse().expect("silent is a number"));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(run(connections, silent));
}

async fn run(connections: usize, silent: usize) {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = start_exchange(&dir.path().join("exchange"), connections + silent + 64);
    let pid = exchange.child.id();
    println!("exchange pid {pid}, {} CPUs", std::thread::available_parallelism().map_or(0, |n| n.get()));

    // 1. Idle anonymous readers.
    let before = rss_kib(pid);
    let started = Instant::now();
    let mut held = Vec::with_capacity(connections);
    for n in 0..connections {
        let mut connection = Connection::open_anonymous(&exchange.url()).await.expect("connects");
        let id = connection.new_id();
        let answer = connection
            .request(ClientMessage::Subscribe { id, channel: Channel::Trades, instrument: InstrumentId((n % 8) as u32) })
            .await
            .expect("subscribes");
        assert!(matches!(answer, ServerMessage::Subscribed { .. }), "{answer:?}");
        held.push(connection);
    }
    let opened = started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(pid);
    report("idle readers (anonymous, subscribed to trades)", connections, opened, before, after);
    drop(held);
    drop(exchange);

    // 2. Logged-in sessions, one account each, on a fresh process (freed
    // memory is kept by the allocator and would hide the cost).
    let exchange = start_exchange(&dir.path().join("exchange-2"), connections + silent + 64);
    let pid = exchange.child.id();
    let before = rss_kib(pid);
    let started = Instant::now();
    let mut held = Vec::with_capacity(connections);
    for n in 0..connections {
        let mut seed = [7u8; 32];
        seed[..8].copy_from_slice(&(n as u64).to_le_bytes());
        let key = SigningKey::from_bytes(&seed);
        held.push(Connection::open(&exchange.url(), &key, Some(Role::Renter)).await.expect("logs in"));
    }
    let opened = started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(pid);
    report("logged-in sessions (a new account each)", connections, opened, before, after);
    drop(held);
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 3. Silent sockets.
    let address = exchange.addr.clone();
    let cpu_before = cpu_ns(pid);
    let mut sockets = Vec::with_capacity(silent);
    for _ in 0..silent {
        sockets.push(std::net::TcpStream::connect(&address).expect("tcp connects"));
    }
    let last_connected = Instant::now();
    let mut reaped_after = Vec::with_capacity(silent);
    for socket in &mut sockets {
        socket.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        let mut buffer = [0u8; 64];
        // EOF or a reset: the exchange closed it.
        while let Ok(read) = socket.read(&mut buffer) {
            if read == 0 {
                break;
            }
        }
        reaped_after.push(last_connected.elapsed());
    }
    let all_reaped = last_connected.elapsed();
    let cpu = Duration::from_nanos(cpu_ns(pid) - cpu_before);
    println!(
        "silent sockets: {silent} reaped {:.2} s after the last connected (handshake deadline 5.00 s); exchange CPU {:.0} ms in all, {:.0} us per socket",
        all_reaped.as_secs_f64(),
        cpu.as_secs_f64() * 1e3,
        cpu.as_secs_f64() * 1e6 / silent as f64,
    );
}

fn report(what: &str, count: usize, opened: Duration, before_kib: u64, after_kib: u64) {
    let grown = after_kib.saturating_sub(before_kib);
    println!(
        "{what}: {count} held; opened in {:.1} s ({:.0}/s); exchange RSS {} -> {} MiB, {:.1} KiB per connection",
        opened.as_secs_f64(),
        count as f64 / opened.as_secs_f64(),
        before_kib / 1024,
        after_kib / 1024,
        grown as f64 / count as f64,
    );
}

/// Resident memory of a process, KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the exchange's status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .expect("VmRSS")
}

/// The exchange with room for `connections_max` connections, printing its
/// "at most" lines (the descriptor budget it found).
fn start_exchange(data_dir: &Path, connections_max: usize) -> Spawned {
    let cap = connections_max.to_string();
    let args = ["--connections-max", cap.as_str(), "--connections-per-ip-max", cap.as_str(), "--unauthenticated-max", cap.as_str()];
    let exchange = gpux_benches::process::start_exchange(data_dir, &args);
    for line in exchange.before.iter().filter(|line| line.contains("at most")) {
        println!("{line}");
    }
    exchange
}
