//! A job's files against the real job store (the exchange's store server
//! on a local directory): what each cluster member syncs (issue "Jobs that
//! hold up": shards rolled back when a member's stale copy of another
//! rank's file was put again). Two and three members whose shards differ in
//! size and content sync, restore and sync again; the store holds each
//! rank's newest shard after every attempt.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use gpux_engine::{AccountId, MemberAddress};
use gpux_exchange::job_store::{Grant, Issuer, StoreServer};
use gpux_protocol::{JobAssignment, JobId};
use gpux_supplier_agent::delivery::jobs::JobFiles;

const SECRET: [u8; 32] = [7; 32];
const RENTER: AccountId = AccountId(4);
const JOB: JobId = JobId(9);

/// The store's server on a temporary directory; its URL.
async fn store(dir: &std::path::Path) -> String {
    let objects = gpux_exchange::job_store::open("local", dir).expect("store");
    // Every lease runs: the sequencer's side of a host token is not under test here.
    let running = std::sync::Arc::new(gpux_exchange::job_store::RunningLeases::default());
    running.replace((0..64).map(gpux_engine::LeaseId));
    let server = StoreServer::new(objects, SECRET, running, 1 << 30, gpux_gateway::link::Clock::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, server.router()).await });
    url
}

/// Member `rank` of `nodes` for attempt `attempt`, its files under `dir`.
fn member(url: &str, dir: &std::path::Path, attempt: u32, rank: u32, nodes: u32) -> JobFiles {
    let expires_at_ms = gpux_gateway::link::Clock::default().now_ms() + 3_600_000;
    let token = Issuer::new(url.into(), SECRET, Default::default()).issue(&Grant::Host {
        renter: RENTER,
        job: JOB,
        lease: gpux_engine::LeaseId(attempt as u64),
        attempt,
        bundle: None,
        inputs: Vec::new(),
        expires_at_ms,
    });
    let peers = (0..nodes).map(|r| MemberAddress { address: format!("10.0.0.{r}"), port: 29_500 }).collect();
    let run = common::job_run(&["python3"], None);
    let assignment = JobAssignment { job: JOB, attempt, renter: RENTER, world_gpus: nodes, node_rank: rank, nodes, run, peers };
    JobFiles {
        assignment,
        dir: dir.join(format!("attempt-{attempt}-rank-{rank}")),
        pip_cache: dir.join("pip-cache"),
        store_url: url.into(),
        token,
        resumed: false,
        uploaded: Arc::default(),
    }
}

/// The store's checkpoints: file -> content.
async fn stored(url: &str, files: &JobFiles) -> BTreeMap<String, String> {
    let http = reqwest::Client::new();
    let answer =
        http.get(format!("{url}/v1/list/{}/jobs/{}/checkpoints", RENTER.0, JOB.0)).bearer_auth(&files.token).send().await.expect("list");
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&answer.bytes().await.expect("body")).expect("json");
    let mut found = BTreeMap::new();
    for item in listed {
        let key = item["key"].as_str().expect("key").to_string();
        let body = http.get(format!("{url}/v1/objects/{key}")).bearer_auth(&files.token).send().await.expect("get");
        found.insert(key.rsplit('/').next().expect("name").to_string(), body.text().await.expect("text"));
    }
    found
}

fn write_shard(files: &JobFiles, rank: u32, step: u32) {
    // Each rank's shard differs in size and content: rank r writes r+1 lines.
    let text: String = (0..=rank).map(|line| format!("rank {rank} step {step} line {line}\n")).collect();
    std::fs::write(files.checkpoints().join(format!("shard-{rank}.txt")), text).expect("write");
}

fn shard(rank: u32, step: u32) -> String {
    (0..=rank).map(|line| format!("rank {rank} step {step} line {line}\n")).collect()
}

async fn members_keep_each_others_newest_shards(nodes: u32) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = store(&dir.path().join("store")).await;
    // Attempt 1: every member writes its shard at step 10 and syncs.
    let mut first = Vec::new();
    for rank in 0..nodes {
        let mut files = member(&url, dir.path(), 1, rank, nodes);
        files.prepare().await.expect("prepared");
        write_shard(&files, rank, 10);
        assert_eq!(files.sync().await.expect("synced"), 1, "rank {rank} puts its own shard");
        first.push(files);
    }
    let expected: BTreeMap<String, String> = (0..nodes).map(|r| (format!("shard-{r}.txt"), shard(r, 10))).collect();
    assert_eq!(stored(&url, &first[0]).await, expected);

    // Attempt 2: every member restores every rank's shard; each writes its
    // own again at steps that differ (rank 0 the last). A member that syncs
    // before another rank wrote must not put its stale copy back.
    let mut second = Vec::new();
    for rank in 0..nodes {
        let mut files = member(&url, dir.path(), 2, rank, nodes);
        files.prepare().await.expect("restored");
        assert!(files.resumed);
        for other in 0..nodes {
            let restored = std::fs::read_to_string(files.checkpoints().join(format!("shard-{other}.txt"))).expect("restored shard");
            assert_eq!(restored, shard(other, 10));
        }
        second.push(files);
    }
    for rank in (0..nodes).rev() {
        write_shard(&second[rank as usize], rank, 100 + rank);
        assert_eq!(second[rank as usize].sync().await.expect("synced"), 1, "rank {rank} puts only what it changed");
    }
    // Every member syncs again (its periodic sync, its final one): each
    // holds the others' step-10 copies, which differ from the store's in
    // size and content: none is put back.
    for files in &second {
        assert_eq!(files.sync().await.expect("synced"), 0, "nothing changed since");
    }
    // A member touching a file without changing it puts nothing either.
    let path = second[0].checkpoints().join("shard-0.txt");
    std::fs::write(&path, std::fs::read(&path).expect("read")).expect("rewrite");
    assert_eq!(second[0].sync().await.expect("synced"), 0, "same content: not put again");
    let expected: BTreeMap<String, String> = (0..nodes).map(|r| (format!("shard-{r}.txt"), shard(r, 100 + r))).collect();
    assert_eq!(stored(&url, &second[0]).await, expected, "every rank's newest shard, none rolled back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_member_never_puts_back_another_ranks_shard_two_members() {
    members_keep_each_others_newest_shards(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_member_never_puts_back_another_ranks_shard_three_members() {
    members_keep_each_others_newest_shards(3).await;
}
