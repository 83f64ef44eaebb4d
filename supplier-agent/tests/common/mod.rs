//! Shared by the agent's integration tests: an in-process exchange on a
//! real socket, the real agent binary, a funded renter.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use gpux_engine::Role;
use gpux_protocol::*;
use gpux_supplier_agent::session::Connection;

/// A job's lease whose host says nothing for this long fails (the
/// exchange's `--job-silence-ms`, short for the tests).
pub const JOB_SILENCE_MS: u64 = 4_000;

/// The exchange in this process (the workspace's one harness,
/// `gpux-test-exchange`), with what a restart on the same address needs.
pub struct Exchange {
    running: Option<gpux_test_exchange::InProcess>,
    pub url: String,
    dir: std::path::PathBuf,
    operator: SigningKey,
    listen: std::net::SocketAddr,
    challenge_interval_ms: u64,
    clock_offset_ms: i64,
    /// The billing grace and the late-report window.
    billing: (u64, u64),
    /// Who may open an account.
    accounts: gpux_exchange::sequencer::AccountOpening,
}

/// The exchange's default billing grace and late-report window.
const BILLING_DEFAULT: (u64, u64) = (gpux_exchange::BILLING_GRACE_MS_DEFAULT, gpux_exchange::LATE_REPORT_WINDOW_MS_DEFAULT);

impl Exchange {
    pub fn start(dir: &std::path::Path, operator: &SigningKey) -> Exchange {
        Self::start_with_challenges(dir, operator, gpux_exchange::sequencer::CHALLENGE_INTERVAL_MS_DEFAULT)
    }

    /// An exchange that challenges idle GPUs every `interval_ms` on average.
    pub fn start_with_challenges(dir: &std::path::Path, operator: &SigningKey, interval_ms: u64) -> Exchange {
        let port = gpux_test_exchange::free_port();
        Self::start_on(
            dir,
            operator,
            format!("127.0.0.1:{port}").parse().expect("addr"),
            interval_ms,
            0,
            BILLING_DEFAULT,
            Default::default(),
        )
    }

    /// An exchange whose billing grace and late-report window are these
    /// (docs/market-rules.md "Late reports").
    pub fn start_with_billing(dir: &std::path::Path, operator: &SigningKey, grace_ms: u64, late_window_ms: u64) -> Exchange {
        let port = gpux_test_exchange::free_port();
        let listen = format!("127.0.0.1:{port}").parse().expect("addr");
        let interval_ms = gpux_exchange::sequencer::CHALLENGE_INTERVAL_MS_DEFAULT;
        Self::start_on(dir, operator, listen, interval_ms, 0, (grace_ms, late_window_ms), Default::default())
    }

    /// An exchange whose clock runs `clock_offset_ms` from this host's
    /// (negative: behind it, as if the host's clock ran ahead).
    pub fn start_skewed(dir: &std::path::Path, operator: &SigningKey, clock_offset_ms: i64) -> Exchange {
        let port = gpux_test_exchange::free_port();
        let listen = format!("127.0.0.1:{port}").parse().expect("addr");
        Self::start_on(
            dir,
            operator,
            listen,
            gpux_exchange::sequencer::CHALLENGE_INTERVAL_MS_DEFAULT,
            clock_offset_ms,
            BILLING_DEFAULT,
            Default::default(),
        )
    }

    /// An exchange that opens accounts by invitation only
    /// (`--account-opening invite`; docs/operations.md "Opening accounts").
    pub fn start_by_invitation(dir: &std::path::Path, operator: &SigningKey) -> Exchange {
        let port = gpux_test_exchange::free_port();
        let listen = format!("127.0.0.1:{port}").parse().expect("addr");
        let accounts =
            gpux_exchange::sequencer::AccountOpening { mode: gpux_exchange::sequencer::OpeningMode::Invite, ..Default::default() };
        Self::start_on(dir, operator, listen, gpux_exchange::sequencer::CHALLENGE_INTERVAL_MS_DEFAULT, 0, BILLING_DEFAULT, accounts)
    }

    /// Stops the exchange (a clean stop, as an operator's restart would).
    pub fn stop(&mut self) {
        if let Some(mut running) = self.running.take() {
            let _ = running.stop();
        }
    }

    pub fn start_again(&mut self) {
        *self = Self::start_on(
            &self.dir.clone(),
            &self.operator.clone(),
            self.listen,
            self.challenge_interval_ms,
            self.clock_offset_ms,
            self.billing,
            self.accounts,
        );
    }

    fn start_on(
        dir: &std::path::Path,
        operator: &SigningKey,
        listen: std::net::SocketAddr,
        challenge_interval_ms: u64,
        clock_offset_ms: i64,
        billing: (u64, u64),
        accounts: gpux_exchange::sequencer::AccountOpening,
    ) -> Exchange {
        let mut config = gpux_test_exchange::config(dir, operator.verifying_key().to_bytes());
        config.listen = listen;
        config.billing.grace_ms = billing.0;
        config.billing.late_window_ms = billing.1;
        config.clock_offset_ms = clock_offset_ms;
        config.challenge_interval_ms = challenge_interval_ms;
        config.accounts = accounts;
        config.job_silence_ms = JOB_SILENCE_MS;
        let running = gpux_test_exchange::InProcess::start(config);
        Exchange {
            url: running.url.clone(),
            running: Some(running),
            dir: dir.to_path_buf(),
            operator: operator.clone(),
            listen,
            challenge_interval_ms,
            clock_offset_ms,
            billing,
            accounts,
        }
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The rejections an exchange journaled (its data directory's journal
/// replayed as `gpux-audit` does), as JSON lines: an agent that knows its
/// own asks never sends a request the exchange refuses.
pub fn journaled_rejections(exchange_dir: &std::path::Path) -> Vec<String> {
    let mut market = gpux_market::MarketState::new(gpux_engine::EngineConfig::demo()).expect("market");
    let mut events = Vec::new();
    gpux_audit::replay_journal(&exchange_dir.join("journal.redb"), &mut market, &mut events, false).expect("replays");
    String::from_utf8(events).expect("utf-8").lines().filter(|line| line.contains(r#""rejected""#)).map(str::to_owned).collect()
}

pub struct Agent(pub Child);

/// The real agent binary on a scripted host (its log is discarded).
pub fn spawn_agent(config: &std::path::Path, host: &std::path::Path) -> Agent {
    Agent(
        Command::new(env!("CARGO_BIN_EXE_gpux-agent"))
            .arg("--config")
            .arg(config)
            .arg("--fake")
            .arg(host)
            .stderr(match std::env::var_os("GPUX_TEST_AGENT_LOG") {
                Some(path) => std::fs::OpenOptions::new().create(true).append(true).open(path).map_or(Stdio::null(), Stdio::from),
                None => Stdio::null(),
            })
            .spawn()
            .expect("agent starts"),
    )
}

/// A renter logged in with key `seed`, funded by the operator.
pub async fn funded_renter(exchange: &Exchange, operator: &SigningKey, seed: u8, amount_minor: u64) -> Connection {
    let renter = Connection::open(&exchange.url, &SigningKey::from_bytes(&[seed; 32]), Some(Role::Renter)).await.expect("renter");
    let mut admin = Connection::open(&exchange.url, operator, Some(Role::Operator)).await.expect("operator");
    let id = admin.new_id();
    let deposit = admin.request(ClientMessage::Deposit { id, account: renter.account, amount_minor }).await.expect("deposit");
    assert!(matches!(deposit, ServerMessage::Ack { .. }), "{deposit:?}");
    renter
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn write(path: &std::path::Path, text: &str) {
    std::fs::write(path, text).expect("write file");
}

/// The Python image the job tests run (`scripts/containers` builds it).
pub const PY_IMAGE: &str = "localhost/gpux-py:1";

/// The container engine's socket when it serves the job tests' Python
/// image (`scripts/containers start` makes both); `None` (the test skips)
/// without them, unless `GPUX_REQUIRE_CONTAINERS=1`.
pub fn socket() -> Option<String> {
    let ready = std::env::var("GPUX_DOCKER_SOCKET").ok().filter(|s| std::path::Path::new(s).exists());
    let image = ready.as_ref().is_some_and(|socket| {
        let output = std::process::Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket", socket])
            .arg(format!("http://d/v1.41/images/{PY_IMAGE}/json"))
            .output();
        output.is_ok_and(|o| String::from_utf8_lossy(&o.stdout) == "200")
    });
    if ready.is_some() && image {
        return ready;
    }
    assert!(
        std::env::var("GPUX_REQUIRE_CONTAINERS").as_deref() != Ok("1"),
        "GPUX_REQUIRE_CONTAINERS=1 but no engine with {PY_IMAGE}: run scripts/containers start"
    );
    eprintln!("SKIPPED: no container engine with {PY_IMAGE} (scripts/containers start makes it)");
    None
}

/// A job store token for the renter's own files.
pub async fn store_token(renter: &mut Connection) -> (String, String) {
    let id = renter.new_id();
    match renter.request(ClientMessage::JobStoreToken { id, job: None, lease: None, volume: None }).await.expect("token") {
        ServerMessage::JobStoreToken { url, token, .. } => (url, token),
        other => panic!("{other:?}"),
    }
}

/// The job's pushes until `done` holds (within `within`).
pub async fn await_job(renter: &mut Connection, job: JobId, within: Duration, mut done: impl FnMut(&JobInfo) -> bool) -> JobInfo {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, renter.next()).await.unwrap_or_else(|_| panic!("job {job} in time")).expect("message");
        if let ServerMessage::JobUpdate { job: info } = message {
            if info.job == job {
                eprintln!("job {job}: {:?}", info.state);
                if done(&info) {
                    return *info;
                }
            }
        }
    }
}

/// A job's run in the Python image: `command` on the bundle (if any), its
/// checkpoints in `/checkpoints` synced every 10 s, outputs in `/outputs`.
pub fn job_run(command: &[&str], bundle: Option<BundleRef>) -> JobRun {
    JobRun { bundle, checkpoint_interval_s: 10, ..JobRun::in_image(PY_IMAGE, command) }
}

/// A GPU model a fake job host declares.
pub const H100_GPU: &str = r#""vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link""#;
pub const A100_GPU: &str = r#""vendor": "nvidia", "model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "interconnect": "nv_link""#;

/// A fake one-GPU host `name` (`gpu`: its model's fields) on the docker
/// backend, offering each `(contract, floor)` of `offers`: its agent's
/// config and scripted host files, to start with `spawn_agent`.
pub fn job_host(
    dir: &std::path::Path,
    url: &str,
    socket: &str,
    name: &str,
    gpu: &str,
    offers: &[(&str, u64)],
) -> (std::path::PathBuf, std::path::PathBuf) {
    std::fs::create_dir_all(dir).expect("dir");
    let host = dir.join("host.json");
    write(&host, &format!(r#"{{"gpus": [{{"uuid": "GPU-{name}", {gpu}}}]}}"#));
    let offers: String = offers
        .iter()
        .map(|(contract, floor)| format!("[[offer]]\ncontract = \"{contract}\"\nprice_floor_minor_per_gpu_hour = {floor}\n\n"))
        .collect();
    let config = dir.join("agent.toml");
    write(
        &config,
        &format!(
            "exchange = \"{url}\"\nhost = \"{name}\"\nkey_file = \"{}\"\nsample_interval_ms = 1000\nreport_interval_ms = 1000\n\n{offers}\
             [delivery]\nbackend = \"docker\"\npublic_address = \"127.0.0.1\"\nstate_dir = \"{}\"\nstop_grace_ms = 1000\nready_after_ms = 500\n\n\
             [delivery.docker]\nsocket = \"{socket}\"\ngpu_devices = \"fake\"\n",
            dir.join("host.key").display(),
            dir.join("leases").display(),
        ),
    );
    (config, host)
}

/// `files` packed as a code bundle and put in the renter's job store: its
/// reference, and the store's URL and token.
pub async fn put_code(renter: &mut Connection, dir: &std::path::Path, files: &[(&str, &str)]) -> (BundleRef, String, String) {
    std::fs::create_dir_all(dir).expect("code dir");
    for (name, text) in files {
        write(&dir.join(name), text);
    }
    let bundle = gpux_jobs::bundle::pack(dir).expect("packs");
    let (url, token) = store_token(renter).await;
    let key = format!("{}/bundles/{}.tar.gz", renter.account.0, bundle.sha256_hex());
    let put = reqwest::Client::new()
        .put(format!("{url}/v1/objects/{key}"))
        .bearer_auth(&token)
        .body(bundle.bytes.clone())
        .send()
        .await
        .expect("put");
    assert_eq!(put.status(), 201, "the bundle is stored");
    (BundleRef { sha256: bundle.sha256_hex(), bytes: bundle.bytes.len() as u64 }, url, token)
}

/// An object of the job store, if it is there.
pub async fn store_get(url: &str, token: &str, key: &str) -> Option<Vec<u8>> {
    let answer = reqwest::Client::new().get(format!("{url}/v1/objects/{key}")).bearer_auth(token).send().await.expect("get");
    (answer.status() == 200).then_some(answer.bytes().await.expect("body").to_vec())
}

/// Waits until `instrument`'s book shows at least `asks` asks.
pub async fn await_asks(renter: &mut Connection, instrument: gpux_engine::InstrumentId, asks: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let id = renter.new_id();
        if let Ok(ServerMessage::BookOffers { offers, .. }) =
            renter.request(ClientMessage::BookOffers { id, instrument, offset: 0, after: None }).await
        {
            if offers.len() >= asks {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{asks} ask(s) on instrument {}", instrument.0);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A one-host job of one GPU on `instrument` for an hour at up to 3.00 a
/// GPU-hour, two retries, running `run`.
pub fn job_submission(name: &str, instrument: gpux_engine::InstrumentId, run: JobRun) -> JobSubmission {
    JobSubmission { retries: 2, ..JobSubmission::one_host(name, instrument, 1, 3_000_000, 1, 100_000_000, run) }
}

/// Submits `job` for `renter`: its id.
pub async fn submit_job(renter: &mut Connection, job: JobSubmission) -> JobId {
    let id = renter.new_id();
    match renter.request(ClientMessage::SubmitJob { id, job: Box::new(job) }).await.expect("submitted") {
        ServerMessage::Job { job, .. } => job.job,
        other => panic!("{other:?}"),
    }
}

/// `buyer` bids (IOC) for one spot GPU at 2.00 until the renter's lease
/// `lease` gets its preemption notice (within 20 s): when it did.
pub async fn preempt_with_spot_bid(renter: &mut Connection, buyer: &mut Connection, lease: gpux_engine::LeaseId) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let id = buyer.new_id();
        let mut order = OrderTicket::limit(id, gpux_engine::InstrumentId(0), gpux_engine::Side::Buy, 2_000_000, 1);
        order.time_in_force = gpux_engine::TimeInForce::Ioc;
        buyer.request(ClientMessage::NewOrder { id, order, workload: None }).await.expect("spot bid");
        if let Ok(Ok(ServerMessage::Private { event, .. })) = tokio::time::timeout(Duration::from_millis(700), renter.next()).await {
            if matches!(event.kind, gpux_engine::EventKind::PreemptionNotice { lease: noticed, .. } if noticed == lease) {
                return Instant::now();
            }
        }
        assert!(Instant::now() < deadline, "the preemptible lease {} was preempted", lease.0);
    }
}

/// The supplier's identity and encryption keys in `dir`, copied into each
/// of its hosts' directories `dir/<name>` (docs/agent.md "Clusters"): each
/// host's key file.
pub fn supplier_keys(dir: &std::path::Path, hosts: &[&str]) -> Vec<std::path::PathBuf> {
    let supplier_key = dir.join("supplier.key");
    gpux_supplier_agent::keys::load_or_create(&supplier_key).expect("the supplier's key");
    let supplier_x25519 = dir.join("supplier.key.x25519");
    gpux_supplier_agent::keys::load_or_create(&supplier_x25519).expect("the supplier's encryption key");
    hosts
        .iter()
        .map(|name| {
            std::fs::create_dir_all(dir.join(name)).expect("host dir");
            let key = dir.join(name).join("host.key");
            std::fs::copy(&supplier_key, &key).expect("copy the key");
            std::fs::copy(&supplier_x25519, dir.join(name).join("host.key.x25519")).expect("copy the encryption key");
            key
        })
        .collect()
}

/// Whether the container engine at `socket` holds lease `lease`'s
/// container of host `host` (the docker backend's name for it).
pub fn container_exists(socket: &str, host: &str, lease: gpux_engine::LeaseId) -> bool {
    let output = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket", socket])
        .arg(format!("http://d/v1.41/containers/gpux-{host}-lease-{}/json", lease.0))
        .output()
        .expect("curl runs");
    String::from_utf8_lossy(&output.stdout) == "200"
}

/// Seals the secrets to the lease's host, checking the host's signature on its key.
pub async fn send_secrets(renter: &mut Connection, lease: gpux_engine::LeaseId, workload: Workload, secrets: &Secrets) {
    let id = renter.new_id();
    let ServerMessage::HostKey { encryption_key, identity_key, signature, .. } =
        renter.request(ClientMessage::HostKey { id, lease }).await.expect("host key")
    else {
        panic!("host key")
    };
    let key: [u8; 32] = hex::decode(&encryption_key).expect("hex").try_into().expect("32 bytes");
    let identity: [u8; 32] = hex::decode(&identity_key).expect("hex").try_into().expect("32 bytes");
    assert!(gpux_protocol::delivery::encryption_key_certified(&key, &identity, &signature), "the host signed its encryption key");
    let workload = Workload { sealed: Some(secrets.seal(&key)), ..workload };
    let id = renter.new_id();
    let answer = renter.request(ClientMessage::SetWorkload { id, lease, workload: Box::new(workload) }).await.expect("set workload");
    assert!(matches!(answer, ServerMessage::Ack { .. }), "{answer:?}");
}

/// What the ledger moved out of `renter` for `leases`, net: its statement's
/// transfers of those leases out of its own accounts less those into them
/// (its payables left out). What a job's or a service's bill must come to.
pub async fn paid_for_leases(renter: &mut Connection, leases: &[gpux_engine::LeaseId]) -> i64 {
    let suffix = format!(":{}", renter.account.0);
    let mine = |label: &str| label.ends_with(&suffix) && !label.starts_with("payable");
    let (mut paid, mut after) = (0i64, None);
    loop {
        let id = renter.new_id();
        let ServerMessage::Statement { lines, next_after, .. } =
            renter.request(ClientMessage::Statement { id, after }).await.expect("statement")
        else {
            panic!("a statement")
        };
        for line in lines.iter().filter(|l| l.lease.is_some_and(|lease| leases.contains(&lease))) {
            match (mine(&line.from), mine(&line.to)) {
                (true, false) => paid += line.amount_minor as i64,
                (false, true) => paid -= line.amount_minor as i64,
                _ => {}
            }
        }
        match next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    paid
}
