//! The `gpux` binary against a real exchange (in-process, real socket, real
//! redb files): a renter and a GPU owner go through the whole tour with the
//! CLI alone (keys, login, funding, an offer, a bid that fills, the lease,
//! the statement), and every kind of failure exits with its documented code
//! and a message saying what to do.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Output;

use ed25519_dalek::SigningKey;
use gpux_engine::{EngineConfig, GpuSpec, Role};
use gpux_protocol::{ClientMessage, ServerMessage};

struct Exchange {
    url: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

fn start_exchange(data_dir: &Path, operator_public_key: [u8; 32]) -> Exchange {
    let port = free_port();
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let config = gpux_exchange::ExchangeConfig {
        data_dir: data_dir.to_path_buf(),
        listen: format!("127.0.0.1:{port}").parse().expect("address"),
        operator_keys: [operator_public_key].into_iter().collect(),
        engine: EngineConfig::demo(),
        limits: gpux_exchange::gateway::GatewayLimits::default(),
        metrics_listen: None,
        console_listen: None,
        tls: None,
        billing: gpux_exchange::core::BillingPolicy { fee_bps: 250, grace_ms: 600_000 },
        clock_offset_ms: 0,
        on_listening: None,
    };
    std::thread::spawn(move || gpux_exchange::run_until(config, gpux_exchange::Stop::Channel(stopped)));
    let url = format!("ws://127.0.0.1:{port}");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Exchange { url, _stop: stop };
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("the exchange did not start");
}

fn gpux(url: &str, key: &Path, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_gpux"))
        .args(["--url", url, "--key"])
        .arg(key)
        .args(args)
        .output()
        .expect("the gpux binary runs")
}

fn ok(output: Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "gpux failed: {}\n{stdout}", String::from_utf8_lossy(&output.stderr));
    stdout
}

fn key_of(path: &Path) -> SigningKey {
    let text = std::fs::read_to_string(path).expect("key file");
    SigningKey::from_bytes(&hex::decode(text.trim()).expect("hex").try_into().expect("32 bytes"))
}

/// Registers one H100 for the supplier, as its agent would.
fn register_gpu(url: &str, supplier: &SigningKey) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let mut connection = gpux_client::Connection::open(url, supplier, Some(Role::Supplier)).await.expect("supplier login");
        let id = connection.new_id();
        let message = ClientMessage::RegisterGpu { id, host: "cli-host".into(), gpu_uuid: "GPU-cli-0".into(), spec: GpuSpec::h100_sxm() };
        assert!(matches!(connection.request(message).await.expect("answer"), ServerMessage::Ack { .. }));
    });
}

#[test]
fn a_renter_and_a_gpu_owner_trade_with_the_cli_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let key = |name: &str| -> PathBuf { dir.path().join(format!("{name}.key")) };
    let offline = "ws://127.0.0.1:1";
    for name in ["operator", "renter", "supplier"] {
        assert!(ok(gpux(offline, &key(name), &["keys", "create"])).contains("public key"));
    }
    let again = gpux(offline, &key("renter"), &["keys", "create"]);
    assert_eq!(again.status.code(), Some(2), "a key is never overwritten");
    let operator_public = ok(gpux(offline, &key("operator"), &["keys", "show"]));
    let operator_public: [u8; 32] = hex::decode(operator_public.trim()).expect("hex").try_into().expect("32 bytes");
    let exchange = start_exchange(&dir.path().join("data"), operator_public);
    let url = exchange.url.as_str();

    let login = ok(gpux(url, &key("renter"), &["login", "--role", "renter"]));
    let renter_account: u32 = login.split_whitespace().nth(4).and_then(|a| a.parse().ok()).expect("an account id");
    ok(gpux(url, &key("supplier"), &["login", "--role", "supplier"]));
    ok(gpux(url, &key("operator"), &["login"]));
    assert!(ok(gpux(url, &key("renter"), &["balance"])).contains("available $0.00"));
    ok(gpux(url, &key("operator"), &["deposit", &renter_account.to_string(), "100"]));
    assert!(ok(gpux(url, &key("renter"), &["balance"])).contains("available $100.00"));

    register_gpu(url, &key_of(&key("supplier")));
    assert!(ok(gpux(url, &key("supplier"), &["gpus"])).contains("NVIDIA H100 80GB HBM3"));
    assert!(ok(gpux(url, &key("supplier"), &["offer", "H100-SXM-80G/SPOT", "--price", "2", "--host", "0", "--gpus", "0"]))
        .contains("offer placed"));
    assert!(ok(gpux(url, &key("supplier"), &["offers"])).contains("$2.00"));
    let book = ok(gpux(url, &key("renter"), &["book", "H100-SXM-80G/SPOT", "--once"]));
    assert!(book.contains("$2.00") && book.contains("ask"), "{book}");
    let json_book = ok(gpux(url, &key("renter"), &["--json", "book", "0", "--once"]));
    assert!(json_book.lines().any(|l| l.starts_with("{\"book_snapshot\"")), "{json_book}");

    let bought = ok(gpux(url, &key("renter"), &["buy", "H100-SXM-80G/SPOT", "1", "--price", "2.50", "--hours", "2"]));
    assert!(bought.contains("accepted") && bought.contains("filled 1 GPU(s)") && bought.contains("lease"), "{bought}");
    let leases = ok(gpux(url, &key("renter"), &["leases"]));
    let lease_id = leases.lines().nth(1).and_then(|l| l.split_whitespace().next()).expect("a lease line").to_string();
    assert!(leases.contains("spot") && leases.contains("$2.00"), "{leases}");
    assert!(ok(gpux(url, &key("renter"), &["end-lease", &lease_id])).contains("lease ended"));
    let statement = ok(gpux(url, &key("renter"), &["statement"]));
    assert!(statement.contains("external") && statement.contains(&format!("available:{renter_account}")), "{statement}");
    let json = ok(gpux(url, &key("renter"), &["--json", "balance"]));
    assert!(json.trim().starts_with("{\"balance\":"), "{json}");
    let calendar = ok(gpux(url, &key("renter"), &["instruments", "--calendar"]));
    assert!(calendar.lines().skip(1).all(|l| l.contains(" to ")), "only reserved windows: {calendar}");
}

#[test]
fn failures_exit_with_their_code_and_say_what_to_do() {
    let dir = tempfile::tempdir().expect("temp dir");
    let renter = dir.path().join("renter.key");
    let missing = gpux("ws://127.0.0.1:1", &renter, &["balance"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("gpux keys create"));

    ok(gpux("ws://127.0.0.1:1", &renter, &["keys", "create"]));
    let unreachable = gpux("ws://127.0.0.1:1", &renter, &["balance"]);
    assert_eq!(unreachable.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&unreachable.stderr).contains("is it running?"));

    let exchange = start_exchange(&dir.path().join("data"), [0; 32]);
    let url = exchange.url.as_str();
    let no_account = gpux(url, &renter, &["balance"]);
    assert_eq!(no_account.status.code(), Some(1), "a key without an account is refused");
    assert!(String::from_utf8_lossy(&no_account.stderr).contains("gpux login --role renter"));

    ok(gpux(url, &renter, &["login", "--role", "renter"]));
    let unknown = gpux(url, &renter, &["buy", "NOPE/SPOT", "1", "--price", "1"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("gpux instruments"));
    let too_precise = gpux(url, &renter, &["buy", "0", "1", "--price", "1.0000001"]);
    assert_eq!(too_precise.status.code(), Some(2));
    let off_tick = gpux(url, &renter, &["buy", "0", "1", "--price", "2.0005"]);
    assert_eq!(off_tick.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&off_tick.stderr).contains("PriceOffTick"));
    let unfunded = gpux(url, &renter, &["buy", "0", "1", "--price", "2"]);
    assert_eq!(unfunded.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unfunded.stderr).contains("InsufficientFunds"));
    let usage = gpux(url, &renter, &["buy"]);
    assert_eq!(usage.status.code(), Some(2), "clap usage errors exit 2");
}
