//! Usage reports on the agent's side: one hash chain per lease and GPU, the
//! reports not yet acknowledged, and both kept on disk so that nothing is
//! lost while the exchange is unreachable or the agent restarts.
//!
//! Files (next to the host key): `<key>.chains.json` holds each chain's next
//! position and hash; `<key>.reports.jsonl` holds the unacknowledged reports
//! in order. Both record their format and are rewritten whole through a
//! temporary file, fsync and rename (`crate::saved`), so a crash leaves
//! either the old or the new version. Resending a report the exchange
//! already accepted is harmless (it answers duplicate).

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

pub use crate::limits::PENDING_REPORTS_MAX;
use anyhow::Result;
use ed25519_dalek::SigningKey;
use gpux_engine::LeaseId;
use gpux_protocol::{genesis_hash, Readings, UsageBody, UsageReport};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Chain {
    lease: LeaseId,
    gpu_uuid: String,
    next_seq: u32,
    prev_hash: String,
    next_start_ms: u64,
}

/// The readings of one GPU over one report interval: what the report
/// signs, and what renters read back as the lease's telemetry.
pub use gpux_protocol::TelemetrySample as Interval;

pub struct ReportBook {
    chains_path: PathBuf,
    pending_path: PathBuf,
    chains: BTreeMap<(LeaseId, String), Chain>,
    pending: VecDeque<UsageReport>,
}

impl ReportBook {
    /// Opens the book kept next to `key_file`, loading what a previous run left.
    pub fn open(key_file: &Path) -> Result<Self> {
        let chains_path = key_file.with_extension("chains.json");
        let pending_path = key_file.with_extension("reports.jsonl");
        let chains: Vec<Chain> = crate::saved::read(&chains_path)?.unwrap_or_default();
        let pending: VecDeque<UsageReport> = crate::saved::read_lines(&pending_path)?.into();
        let chains = chains.into_iter().map(|chain| ((chain.lease, chain.gpu_uuid.clone()), chain)).collect();
        Ok(ReportBook { chains_path, pending_path, chains, pending })
    }

    /// Where the next report of a chain starts (the lease start for a new one).
    pub fn next_start_ms(&self, lease: LeaseId, gpu_uuid: &str, lease_start_ms: u64) -> u64 {
        self.chains.get(&(lease, gpu_uuid.to_string())).map_or(lease_start_ms, |chain| chain.next_start_ms)
    }

    /// Signs the next report of a chain, queues it and persists both files.
    pub fn record(&mut self, lease: LeaseId, gpu_uuid: &str, interval: Interval, key: &SigningKey) -> Result<()> {
        anyhow::ensure!(
            self.pending.len() < PENDING_REPORTS_MAX,
            "{PENDING_REPORTS_MAX} usage reports wait for the exchange; not recording more"
        );
        let chain = self.chains.entry((lease, gpu_uuid.to_string())).or_insert_with(|| Chain {
            lease,
            gpu_uuid: gpu_uuid.to_string(),
            next_seq: 1,
            prev_hash: genesis_hash(),
            next_start_ms: interval.start_ms,
        });
        let body = UsageBody {
            lease,
            gpu_uuid: gpu_uuid.to_string(),
            seq: chain.next_seq,
            start_ms: interval.start_ms,
            end_ms: interval.end_ms,
            available_ms: interval.available_ms,
            utilisation_percent: interval.utilisation_percent,
            memory_used_mib_max: interval.memory_used_mib_max,
            unhealthy_samples: interval.unhealthy_samples,
            prev_hash: chain.prev_hash.clone(),
            // Signed with the rest (version 2) when the GPU read either.
            readings: (interval.temperature_c_max.is_some() || interval.power_w_mean.is_some())
                .then_some(Readings { temperature_c_max: interval.temperature_c_max, power_w_mean: interval.power_w_mean }),
        };
        let report = UsageReport::sign(body, key);
        chain.next_seq += 1;
        chain.prev_hash = report.hash();
        chain.next_start_ms = interval.end_ms;
        self.pending.push_back(report);
        self.persist()
    }

    pub fn front(&self) -> Option<&UsageReport> {
        self.pending.front()
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The front report was answered (accepted, duplicate or refused for good).
    pub fn acknowledge_front(&mut self) -> Result<()> {
        self.pending.pop_front();
        self.persist()
    }

    /// Forgets the chains of a lease whose last report was acknowledged.
    pub fn close_lease(&mut self, lease: LeaseId) -> Result<()> {
        self.chains.retain(|(chain_lease, _), _| *chain_lease != lease);
        self.persist()
    }

    fn persist(&self) -> Result<()> {
        let chains: Vec<&Chain> = self.chains.values().collect();
        crate::saved::write(&self.chains_path, &chains)?;
        crate::saved::write_lines(&self.pending_path, &self.pending)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interval(start_ms: u64, end_ms: u64) -> Interval {
        Interval { start_ms, end_ms, available_ms: end_ms - start_ms, ..Interval::default() }
    }

    #[test]
    fn chains_and_unacknowledged_reports_survive_a_restart() {
        let dir = tempfile::tempdir().expect("temp dir");
        let key_file = dir.path().join("host.key");
        let key = SigningKey::from_bytes(&[4; 32]);
        {
            let mut book = ReportBook::open(&key_file).expect("open");
            book.record(LeaseId(1), "GPU-a", interval(100, 200), &key).expect("record");
            book.record(LeaseId(1), "GPU-a", interval(200, 300), &key).expect("record");
            book.acknowledge_front().expect("ack");
        }
        let mut book = ReportBook::open(&key_file).expect("reopen");
        assert_eq!(book.pending(), 1);
        let second = book.front().expect("the unacknowledged report").clone();
        assert_eq!((second.body.seq, second.body.start_ms), (2, 200));
        assert_eq!(book.next_start_ms(LeaseId(1), "GPU-a", 0), 300);
        book.record(LeaseId(1), "GPU-a", interval(300, 400), &key).expect("record");
        book.acknowledge_front().expect("ack");
        let third = book.front().expect("third").clone();
        assert_eq!(third.body.seq, 3);
        assert_eq!(third.body.prev_hash, second.hash(), "the chain continues across the restart");
    }

    /// What the agent of 2026-12-06, before saved files recorded their
    /// format, left on disk (tests/fixtures/state-2026-12-06: lease 17's
    /// chains on two GPUs, two reports unacknowledged) is read by this one,
    /// and the chains continue.
    #[test]
    fn an_older_agents_reports_and_chains_are_read_and_continued() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state-2026-12-06");
        let dir = tempfile::tempdir().expect("temp dir");
        for name in ["host.chains.json", "host.reports.jsonl"] {
            std::fs::copy(fixtures.join(name), dir.path().join(name)).expect("copy");
        }
        let key_file = dir.path().join("host.key");
        let key = SigningKey::from_bytes(&[4; 32]);
        let mut book = ReportBook::open(&key_file).expect("an older agent's files");
        assert_eq!(book.pending(), 2);
        let front = book.front().expect("front").clone();
        assert_eq!((front.body.lease, front.body.gpu_uuid.as_str(), front.body.seq), (LeaseId(17), "GPU-a", 2));
        assert!(front.verify_with(&key.verifying_key()), "the report as signed");
        assert_eq!(book.next_start_ms(LeaseId(17), "GPU-a", 0), 1_796_223_840_000);
        book.acknowledge_front().expect("ack");
        let gpu_b = book.front().expect("GPU-b's report").clone();
        book.record(LeaseId(17), "GPU-b", interval(1_796_223_780_000, 1_796_223_840_000), &key).expect("record");
        book.acknowledge_front().expect("ack");
        let next = book.front().expect("the next").clone();
        assert_eq!((next.body.seq, next.body.prev_hash.clone()), (2, gpu_b.hash()), "GPU-b's chain goes on");
        let written = std::fs::read_to_string(dir.path().join("host.reports.jsonl")).expect("text");
        assert!(written.starts_with("{\"format\":2}\n"), "rewritten in this agent's format: {written}");
    }
}
