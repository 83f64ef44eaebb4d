//! The gateway's usage-report verifier pool: a few threads that verify the
//! reports of all connections under ZIP-215, in batches of what is waiting.
//!
//! A connection hands its report over and awaits the verdict before it reads
//! its next frame, so each connection's reports reach the sequencer in the
//! order they were sent; batching happens across connections (many agents
//! reporting at once), where ed25519-zebra's batch equation verifies about
//! three times as many signatures per core as one at a time
//! (docs/PERFORMANCE.md). Under ZIP-215 a batch accepts exactly when every
//! report in it verifies alone, so the verdicts equal single verification's
//! (and the journal replay's). A batch that fails is split in halves until
//! the bad reports are found: a forged report costs its batch about
//! 2 log2(batch) smaller batches, not a single verification of every member.
//!
//! Jobs waiting are bounded by the connections open (one each at most).

use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use gpux_protocol::{verify_batch_zip215, UsageReport};
use tokio::sync::oneshot;

pub use crate::limits::BATCH_MAX;

struct Verification {
    report: UsageReport,
    key: [u8; 32],
    reply: oneshot::Sender<(UsageReport, bool)>,
}

/// A handle on the pool; clones share it. The threads end when the last
/// handle is dropped.
#[derive(Clone)]
pub struct Verifier {
    jobs: Sender<Verification>,
    batches: Arc<prometheus::IntCounter>,
}

impl Verifier {
    /// Starts `threads` verifier threads (at least one). `batches` counts the
    /// batches verified (a report alone is a batch of one).
    pub fn start(threads: usize, batches: prometheus::IntCounter) -> Verifier {
        let (jobs, queue) = crossbeam_channel::unbounded::<Verification>();
        let batches = Arc::new(batches);
        for n in 0..threads.max(1) {
            let queue = queue.clone();
            let batches = batches.clone();
            std::thread::Builder::new()
                .name(format!("gpux-verify-{n}"))
                .spawn(move || run(&queue, &batches))
                .expect("spawning a verifier thread");
        }
        Verifier { jobs, batches }
    }

    /// Whether `report` is signed by `key` under ZIP-215; gives the report
    /// back with the verdict. Verifies on the caller's task if the pool is
    /// gone (it never is while a handle lives, unless a thread panicked).
    pub async fn verify(&self, report: UsageReport, key: [u8; 32]) -> (UsageReport, bool) {
        let (reply, verdict) = oneshot::channel();
        if let Err(refused) = self.jobs.send(Verification { report, key, reply }) {
            let Verification { report, key, .. } = refused.into_inner();
            let verdict = report.verify_zip215(&key);
            return (report, verdict);
        }
        match verdict.await {
            Ok(answer) => answer,
            // The job was dropped with its thread: nothing to give back.
            Err(_) => unreachable_report(),
        }
    }

    /// Batches verified so far (for tests and the probe).
    pub fn batches(&self) -> u64 {
        self.batches.get()
    }
}

/// A verifier thread's panic drops the job, and with it the report; the
/// connection cannot continue meaningfully, so this panics its task too
/// (the gateway's per-connection task; the process goes on).
fn unreachable_report() -> ! {
    panic!("a usage-report verifier thread died holding a report")
}

fn run(queue: &Receiver<Verification>, batches: &prometheus::IntCounter) {
    let mut batch: Vec<Verification> = Vec::with_capacity(BATCH_MAX);
    let mut verdicts = Vec::with_capacity(BATCH_MAX);
    while let Ok(first) = queue.recv() {
        batch.push(first);
        while batch.len() < BATCH_MAX {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        batches.inc();
        verdicts.clear();
        verdicts.resize(batch.len(), false);
        let signed: Vec<(&UsageReport, [u8; 32])> = batch.iter().map(|job| (&job.report, job.key)).collect();
        settle(&signed, &mut verdicts);
        for (job, verdict) in batch.drain(..).zip(verdicts.iter()) {
            // A connection that closed meanwhile no longer waits: nothing to do.
            let _ = job.reply.send((job.report, *verdict));
        }
    }
}

/// Each report's verdict: the whole batch at once, else each half apart.
fn settle(reports: &[(&UsageReport, [u8; 32])], verdicts: &mut [bool]) {
    match reports {
        [] => {}
        [(report, key)] => verdicts[0] = report.verify_zip215(key),
        _ if verify_batch_zip215(reports) => verdicts.fill(true),
        _ => {
            let half = reports.len() / 2;
            let (left, right) = verdicts.split_at_mut(half);
            settle(&reports[..half], left);
            settle(&reports[half..], right);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer, SigningKey};
    use gpux_protocol::UsageBody;

    fn report(key: &SigningKey, seq: u32) -> UsageReport {
        let body = UsageBody {
            lease: gpux_engine::LeaseId(7),
            gpu_uuid: "GPU-test".into(),
            seq,
            start_ms: u64::from(seq) * 1000,
            end_ms: u64::from(seq) * 1000 + 1000,
            available_ms: 1000,
            utilisation_percent: 90,
            memory_used_mib_max: 1024,
            unhealthy_samples: 0,
            prev_hash: "00".repeat(32),
            readings: None,
        };
        let signature = hex::encode(key.sign(&body.signed_bytes()).to_bytes());
        UsageReport { body, signature }
    }

    #[test]
    fn settle_finds_each_forged_report_in_a_batch() {
        let honest = SigningKey::from_bytes(&[3; 32]);
        let other = SigningKey::from_bytes(&[4; 32]);
        for forged_at in [vec![], vec![0], vec![63], vec![5, 6, 40], (0..64).collect::<Vec<_>>()] {
            let reports: Vec<UsageReport> =
                (0..64).map(|n: u32| if forged_at.contains(&(n as usize)) { report(&other, n) } else { report(&honest, n) }).collect();
            let signed: Vec<(&UsageReport, [u8; 32])> = reports.iter().map(|r| (r, honest.verifying_key().to_bytes())).collect();
            let mut verdicts = vec![false; 64];
            settle(&signed, &mut verdicts);
            for (n, verdict) in verdicts.iter().enumerate() {
                assert_eq!(*verdict, !forged_at.contains(&n), "report {n} of forged {forged_at:?}");
                assert_eq!(*verdict, signed[n].0.verify_zip215(&signed[n].1), "batch and single verdicts agree");
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reports_from_many_tasks_are_batched_and_each_gets_its_own_verdict() {
        let batches = prometheus::IntCounter::new("batches", "batches").expect("a valid counter");
        let verifier = Verifier::start(1, batches);
        let honest = SigningKey::from_bytes(&[3; 32]);
        let other = SigningKey::from_bytes(&[4; 32]);
        let key = honest.verifying_key().to_bytes();
        let mut tasks = Vec::new();
        for task in 0..32u32 {
            let verifier = verifier.clone();
            let (honest, other) = (honest.clone(), other.clone());
            tasks.push(tokio::spawn(async move {
                for n in 0..20u32 {
                    let seq = task * 100 + n;
                    let forged = seq % 7 == 0;
                    let sent = if forged { report(&other, seq) } else { report(&honest, seq) };
                    let (back, verdict) = verifier.verify(sent, key).await;
                    assert_eq!(back.body.seq, seq, "the report comes back to its sender");
                    assert_eq!(verdict, !forged, "report {seq}");
                }
            }));
        }
        for task in tasks {
            task.await.expect("a reporting task");
        }
        assert!(verifier.batches() < 640, "{} batches for 640 reports: nothing was batched", verifier.batches());
    }
}
