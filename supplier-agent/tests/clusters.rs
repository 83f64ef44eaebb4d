//! A cluster job end to end on the real container engine (issue
//! "Clusters"): three fake hosts of one supplier declare one fabric; a
//! renter's job on three nodes fills a cluster bid across them; every
//! container gets the rank environment (MASTER_ADDR, MASTER_PORT,
//! WORLD_SIZE, RANK, NODE_RANK, a hostfile) and a Python all-gather in each
//! reaches every peer over TCP and writes the ranks it saw to the job's
//! outputs. Then one host's agent is killed: the exchange finds its lease
//! silent and fails it (the host's fault), the job ends every member's
//! lease and bids a whole cluster again, and the renter is told.
//!
//! Needs `GPUX_DOCKER_SOCKET` and the `localhost/gpux-py:1` image
//! (`scripts/containers start` makes both); skipped without them unless
//! `GPUX_REQUIRE_CONTAINERS=1`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ed25519_dalek::SigningKey;
use gpux_engine::{InstrumentId, LeaseEndReason};
use gpux_protocol::*;

/// Each rank listens on its own port, connects to every other member and
/// sends its rank, takes theirs, and writes what it saw and what it was
/// told to the outputs; then it keeps training (sleeps) until stopped.
const ALLGATHER_PY: &str = r#"
import json, os, socket, sys, threading, time
env = {k: os.environ[k] for k in ["MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK",
                                  "NNODES", "NPROC_PER_NODE", "GPUX_PEERS", "GPUX_CLUSTER_PORT", "GPUX_HOSTFILE"]}
rank = int(env["NODE_RANK"])
peers = env["GPUX_PEERS"].split(",")
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", int(env["GPUX_CLUSTER_PORT"])))
server.listen(len(peers))
seen = {}
def accept():
    while len(seen) < len(peers) - 1:
        conn, _ = server.accept()
        seen[int(conn.recv(64).decode())] = True
        conn.close()
threading.Thread(target=accept, daemon=True).start()
for other, peer in enumerate(peers):
    if other == rank:
        continue
    host, port = peer.rsplit(":", 1)
    deadline = time.time() + 60
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=2) as s:
                s.sendall(str(rank).encode())
            break
        except OSError:
            if time.time() > deadline:
                sys.exit(f"rank {rank} never reached {peer}")
            time.sleep(0.2)
deadline = time.time() + 60
while len(seen) < len(peers) - 1 and time.time() < deadline:
    time.sleep(0.1)
with open(env["GPUX_HOSTFILE"]) as f:
    hostfile = f.read()
with open(os.path.join(os.environ["GPUX_OUTPUT_DIR"], f"rank-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "heard_from": sorted(seen), "env": env, "hostfile": hostfile}, f)
print(f"rank {rank} heard from {sorted(seen)}", flush=True)
time.sleep(int(sys.argv[1]))
"#;

/// A member port the system just handed out as free, with its probe port
/// (`PROBE_PORT_OFFSET` above) free too: fixed ports collide with other
/// tests' ephemeral ones (a probe that cannot listen never reports).
fn free_member_port() -> u16 {
    use gpux_supplier_agent::probe::PROBE_PORT_OFFSET;
    loop {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let member = probe.local_addr().expect("address").port().saturating_sub(PROBE_PORT_OFFSET);
        if member > 1_024 && std::net::TcpListener::bind(("127.0.0.1", member)).is_ok() {
            return member;
        }
    }
}

/// A fake one-GPU host `name` of the supplier whose key is `key` on the
/// docker backend and on fabric `ib0` at `gbps` (its members listen from
/// `port_base`, an 8 MiB interconnect probe), offering each `(contract,
/// floor)` of `offers`.
fn fabric_host(
    dir: &std::path::Path,
    key: &std::path::Path,
    url: &str,
    socket: &str,
    name: &str,
    (offers, port_base, gbps): (&[(&str, u64)], u16, u32),
) -> (std::path::PathBuf, std::path::PathBuf) {
    let offers: String = offers
        .iter()
        .map(|(contract, floor)| format!("[[offer]]\ncontract = \"{contract}\"\nprice_floor_minor_per_gpu_hour = {floor}\n\n"))
        .collect();
    std::fs::create_dir_all(dir).expect("dir");
    let host = dir.join("host.json");
    write(
        &host,
        &format!(
            r#"{{"gpus": [{{"uuid": "GPU-{name}", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"}}]}}"#
        ),
    );
    let config = dir.join("agent.toml");
    write(
        &config,
        &format!(
            "exchange = \"{url}\"\nhost = \"{name}\"\nkey_file = \"{}\"\nsample_interval_ms = 1000\nreport_interval_ms = 1000\n\
             region = \"us-east\"\nzone = \"z1\"\n\n\
             [fabric]\ngroup = \"ib0\"\ngbps = {gbps}\naddress = \"127.0.0.1\"\nport_base = {port_base}\nprobe_mib = 8\n\n{offers}\
             [delivery]\nbackend = \"docker\"\npublic_address = \"127.0.0.1\"\nstate_dir = \"{}\"\nstop_grace_ms = 1000\nready_after_ms = 500\n\n\
             [delivery.docker]\nsocket = \"{socket}\"\ngpu_devices = \"fake\"\n",
            key.display(),
            dir.join("leases").display(),
        ),
    );
    (config, host)
}

/// The names of the engine's containers of host `host` (its agent's label).
fn containers_of(socket: &str, host: &str) -> Vec<String> {
    let filters = format!(r#"{{"label":["gpux.host={host}"]}}"#);
    let output = std::process::Command::new("curl")
        .args(["-s", "-G", "--unix-socket", socket, "--data-urlencode"])
        .arg(format!("filters={filters}"))
        .arg("http://d/v1.41/containers/json?all=1")
        .output()
        .expect("curl runs");
    let listed: serde_json::Value = serde_json::from_slice(&output.stdout).expect("a container list");
    listed
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|c| c["Names"][0].as_str().map(|n| n.trim_start_matches('/').to_string()))
        .collect()
}

/// Removes what earlier runs of this test left (a killed agent's container).
fn remove_containers(socket: &str, hosts: &[&str]) {
    for host in hosts {
        for name in containers_of(socket, host) {
            let _ = std::process::Command::new("curl")
                .args(["-s", "-X", "DELETE", "--unix-socket", socket])
                .arg(format!("http://d/v1.41/containers/{name}?force=true"))
                .output();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_job_gets_its_ranks_reaches_every_peer_and_bids_whole_again_when_a_member_dies() {
    let Some(socket) = socket() else { return };
    const HOSTS: [&str; 3] = ["ib-a", "ib-b", "ib-c"];
    remove_containers(&socket, &HOSTS);
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(dir.path(), &operator);
    let mut renter = funded_renter(&exchange, &operator, 3, 1_000_000_000).await;

    let code = dir.path().join("code");
    std::fs::create_dir_all(&code).expect("code dir");
    write(&code.join("allgather.py"), ALLGATHER_PY);
    let bundle = gpux_jobs::bundle::pack(&code).expect("packs");
    let (url, token) = store_token(&mut renter).await;
    let http = reqwest::Client::new();
    let key = format!("{}/bundles/{}.tar.gz", renter.account.0, bundle.sha256_hex());
    let put = http.put(format!("{url}/v1/objects/{key}")).bearer_auth(&token).body(bundle.bytes.clone()).send().await.expect("put");
    assert_eq!(put.status(), 201, "the bundle is stored");

    // Three hosts of one supplier on one fabric, each its own ports (they
    // share one machine here). Each host holds a copy of the supplier's key
    // and encryption key (docs/agent.md "Clusters").
    let keys = supplier_keys(dir.path(), &HOSTS);
    let mut agents = Vec::new();
    let ports: Vec<u16> = HOSTS.iter().map(|_| free_member_port()).collect();
    for (index, name) in HOSTS.iter().enumerate() {
        let key = &keys[index];
        let (floor, port_base) = (2_000_000 + 100_000 * index as u64, ports[index]);
        // Loopback bears out 1 Gb/s, never 100 Tb/s (ib-c's false claim).
        let gbps = if *name == "ib-c" { 100_000 } else { 1 };
        let offers = [("spot", floor)];
        let (config, host) = fabric_host(&dir.path().join(name), key, &exchange.url, &socket, name, (&offers, port_base, gbps));
        agents.push(spawn_agent(&config, &host));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let id = renter.new_id();
        if let Ok(ServerMessage::BookOffers { offers, .. }) =
            renter.request(ClientMessage::BookOffers { id, instrument: InstrumentId(0), offset: 0, after: None }).await
        {
            if offers.len() >= 3 {
                assert!(
                    offers.iter().all(|o| o.fabric.as_ref().is_some_and(|f| f.name == "ib0" && f.hosts == 3 && f.probe.is_none())),
                    "{offers:?}"
                );
                break;
            }
        }
        assert!(Instant::now() < deadline, "the three hosts offer");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let submission = JobSubmission {
        name: "allgather".into(),
        instrument: InstrumentId(0),
        gpus: 3,
        one_host: false,
        limit_minor_per_gpu_hour: 3_000_000,
        hours: 1,
        budget_minor: 100_000_000,
        retries: 2,
        min_supplier_score_bps: 0,
        verified_only: false,
        nodes: 3,
        min_fabric_gbps: 1,
        restarts_on_error: 0,
        alternatives: Vec::new(),
        regions: Vec::new(),
        run: JobRun {
            image: PY_IMAGE.into(),
            command: vec!["python3".into(), "allgather.py".into(), "600".into()],
            bundle: Some(BundleRef { sha256: bundle.sha256_hex(), bytes: bundle.bytes.len() as u64 }),
            install: Vec::new(),
            checkpoint_dir: "/checkpoints".into(),
            outputs_dir: "/outputs".into(),
            checkpoint_interval_s: 10,
            shm_mib: 0,
            inputs: Vec::new(),
        },
    };
    let id = renter.new_id();
    let job = match renter.request(ClientMessage::SubmitJob { id, job: Box::new(submission) }).await.expect("submitted") {
        ServerMessage::Job { job, .. } => job.job,
        other => panic!("{other:?}"),
    };
    // Its leases are known once it is `starting`: the members probe the
    // fabric while their containers start.
    let starting =
        await_job(&mut renter, job, Duration::from_secs(30), |i| matches!(i.state, JobState::Starting { .. } | JobState::Running { .. }))
            .await;
    let (JobState::Starting { attempt: 1, leases } | JobState::Running { attempt: 1, leases }) = starting.state else {
        panic!("{:?}", starting.state)
    };
    assert_eq!(leases.len(), 3, "one lease per member");

    // The members' agents probed the fabric: a ring all-reduce over
    // loopback, each member's figure signed and recorded on its host, told
    // to the renter. It bears out 1 Gb/s; ib-c's 100 Tb/s claim it does not.
    let mut probed = std::collections::BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while probed.len() < 3 {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, renter.next()).await.expect("every member's probe in time").expect("message");
        if let ServerMessage::Private { event, .. } = message {
            if let gpux_engine::EventKind::FabricProbed { lease, claimed_gbps, ranks, mbps, borne_out, .. } = event.kind {
                probed.insert(lease, (claimed_gbps, ranks, mbps, borne_out));
            }
        }
    }
    for (rank, lease) in leases.iter().enumerate() {
        let (claimed, ranks, mbps, borne_out) = probed[lease];
        assert_eq!(ranks, 3);
        assert!(mbps >= 250, "rank {rank}: loopback carries more than 250 Mb/s: {probed:?}");
        assert_eq!((claimed, borne_out), if rank == 2 { (100_000, false) } else { (1, true) }, "rank {rank}: {probed:?}");
    }

    // Every rank's report reaches the store (the outputs sync every 10 s).
    let mut reports = Vec::new();
    for rank in 0..3 {
        let key = format!("{}/jobs/{}/outputs/rank-{rank}.json", renter.account.0, job.0);
        let deadline = Instant::now() + Duration::from_secs(90);
        let report: serde_json::Value = loop {
            let answer = http.get(format!("{url}/v1/objects/{key}")).bearer_auth(&token).send().await.expect("get");
            if answer.status() == 200 {
                break serde_json::from_slice(&answer.bytes().await.expect("body")).expect("json");
            }
            assert!(Instant::now() < deadline, "rank {rank} reported");
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        reports.push(report);
    }
    // Three agents under one supplier account: each member's logs come from
    // the agent that runs it, every time (the live half of `gpux job logs`).
    for round in 0..20 {
        for (rank, lease) in leases.iter().enumerate() {
            let id = renter.new_id();
            let answer = renter.request(ClientMessage::LeaseLogs { id, lease: *lease, tail_bytes: 16_384 }).await.expect("logs");
            let ServerMessage::LeaseLogs { data, .. } = answer else { panic!("round {round}, rank {rank}: {answer:?}") };
            assert!(data.contains(&format!("rank {rank} heard from")), "round {round}: rank {rank}'s own agent answered: {data:?}");
        }
    }
    for (rank, report) in reports.iter().enumerate() {
        let others: Vec<u64> = (0..3).filter(|r| *r != rank as u64).collect();
        assert_eq!(report["heard_from"], serde_json::json!(others), "rank {rank} heard from every peer: {report}");
        let env = &report["env"];
        assert_eq!(env["MASTER_ADDR"], "127.0.0.1");
        assert_eq!(env["MASTER_PORT"], ports[0].to_string(), "rank 0 is the cheapest host, ib-a");
        assert_eq!(env["WORLD_SIZE"], "3");
        assert_eq!(env["NNODES"], "3");
        assert_eq!(env["NODE_RANK"], rank.to_string());
        assert_eq!(env["RANK"], rank.to_string(), "one GPU a node: the global rank is the node's");
        assert_eq!(env["LOCAL_RANK"], "0");
        let peers: Vec<String> = ports.iter().map(|port| format!("127.0.0.1:{port}")).collect();
        assert_eq!(env["GPUX_PEERS"], peers.join(","));
        assert_eq!(env["GPUX_CLUSTER_PORT"], ports[rank].to_string());
        assert_eq!(report["hostfile"], "127.0.0.1 slots=1\n127.0.0.1 slots=1\n127.0.0.1 slots=1\n");
    }

    // Host ib-b dies: its agent killed. The exchange hears nothing more of
    // its lease and fails it; the job ends every member and bids again.
    agents[1].0.kill().expect("kill -9");
    let _ = agents[1].0.wait();
    // The renter is told of each member's end, then of the new attempt.
    let mut ended = std::collections::BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut bidding_again = false;
    while !bidding_again || !leases.iter().all(|lease| ended.contains_key(lease)) {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, renter.next()).await.expect("the job bids again in time").expect("message");
        match message {
            ServerMessage::Private { event, .. } => {
                if let gpux_engine::EventKind::LeaseEnded { lease, reason } = event.kind {
                    ended.insert(lease, reason);
                }
            }
            ServerMessage::JobUpdate { job: info } if info.job == job => {
                eprintln!("job {job}: {:?}", info.state);
                bidding_again |= matches!(info.state, JobState::Bidding { attempt: 2, .. });
            }
            _ => {}
        }
    }
    assert_eq!(ended.get(&leases[1]), Some(&LeaseEndReason::DeliveryFailed), "the silent member is the host's fault: {ended:?}");
    assert!(leases.iter().all(|lease| ended.contains_key(lease)), "every member's lease ended with the attempt: {ended:?}");
    // The live members' hosts stop their containers: nothing runs past its lease.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(containers_of(&socket, "ib-a").is_empty() && containers_of(&socket, "ib-c").is_empty()) {
        assert!(Instant::now() < deadline, "the surviving hosts removed their members' containers");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    drop(agents);
    remove_containers(&socket, &HOSTS);
}

/// A two-node job on the preemptible book; a spot buyer takes one member's
/// GPU: the member's workload gets the notice and SIGTERM, and the whole
/// cluster moves (never failed by the preempted member, nor by its peer
/// losing it), to a new cluster of the free hosts, where it finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_job_with_a_preempted_member_moves_whole_and_finishes() {
    let Some(socket) = socket() else { return };
    const HOSTS: [&str; 3] = ["pr-a", "pr-b", "pr-c"];
    remove_containers(&socket, &HOSTS);
    let dir = tempfile::tempdir().expect("temp dir");
    let operator = SigningKey::from_bytes(&[1; 32]);
    let exchange = Exchange::start(dir.path(), &operator);
    let mut renter = funded_renter(&exchange, &operator, 3, 1_000_000_000).await;
    let mut urgent = funded_renter(&exchange, &operator, 4, 1_000_000_000).await;
    let (bundle, _, _) = put_code(&mut renter, &dir.path().join("code"), &[("allgather.py", ALLGATHER_PY)]).await;

    // Three preemptible hosts of one supplier on one fabric; pr-a, the
    // cheapest, also sells spot.
    let keys = supplier_keys(dir.path(), &HOSTS);
    let mut agents = Vec::new();
    for (index, name) in HOSTS.iter().enumerate() {
        let key = &keys[index];
        let mut offers = vec![("preemptible", 1_000_000 + 100_000 * index as u64)];
        if index == 0 {
            offers.push(("spot", 2_000_000));
        }
        let (config, host) = fabric_host(&dir.path().join(name), key, &exchange.url, &socket, name, (&offers, free_member_port(), 1));
        agents.push(spawn_agent(&config, &host));
    }
    await_asks(&mut renter, InstrumentId(1), 3).await;
    await_asks(&mut renter, InstrumentId(0), 1).await;

    let run = job_run(&["python3", "allgather.py", "25"], Some(bundle));
    let submission = JobSubmission {
        gpus: 2,
        one_host: false,
        nodes: 2,
        min_fabric_gbps: 1,
        ..job_submission("preempted-cluster", InstrumentId(1), run)
    };
    let job = submit_job(&mut renter, submission).await;
    let running = await_job(&mut renter, job, Duration::from_secs(60), |i| matches!(i.state, JobState::Running { .. })).await;
    let JobState::Running { attempt: 1, leases } = running.state else { panic!("{:?}", running.state) };
    assert_eq!(leases.len(), 2);

    // A spot buyer takes pr-a's GPU: rank 0's lease gets its notice.
    preempt_with_spot_bid(&mut renter, &mut urgent, leases[0]).await;

    // The whole cluster moves: attempt 2 on pr-b and pr-c, and finishes.
    let mut states = Vec::new();
    let finished = await_job(&mut renter, job, Duration::from_secs(150), |i| {
        states.push(i.state.clone());
        i.state.is_over()
    })
    .await;
    assert_eq!(finished.state, JobState::Succeeded, "{states:?}");
    assert_eq!(finished.attempts, 2, "one move: {states:?}");
    assert_eq!(finished.last_move.map(|m| m.cause), Some(AttemptCause::Preempted));
    let second: Vec<_> = finished.leases.iter().filter(|l| !leases.contains(l)).collect();
    assert_eq!(second.len(), 2, "a whole new cluster: {:?}", finished.leases);
    drop(agents);
    remove_containers(&socket, &HOSTS);
}
