//! The `hook` delivery backend: the owner's own program, run on every lease
//! event as `hook <event> <lease> <gpu uuids,comma-separated> <end_ms or ->`,
//! where event is `start`, `preempt` or `end`. A failed `start` is a failed
//! delivery on the host's side. The hook manages whatever it started, so
//! the agent sees it as running until the lease ends and has no logs of it.
//! Its own health check is `hook check - - -`: the GPUs a failed `start`
//! took off sale come back only once it exits 0.

use std::path::PathBuf;
use std::time::Duration;

use gpux_engine::LeaseId;
use gpux_protocol::{Endpoint, FailureCode};
use tokio::sync::Mutex;

use super::{DeliveryBackend, Failure, Found, Launch, Poll, Progress};

pub struct HookBackend {
    hook: PathBuf,
    /// Each lease's GPU UUIDs, for the later events.
    gpus: Mutex<std::collections::BTreeMap<LeaseId, String>>,
}

impl HookBackend {
    pub fn new(hook: PathBuf) -> Self {
        HookBackend { hook, gpus: Mutex::new(Default::default()) }
    }

    async fn run(&self, event: &str, lease: LeaseId, gpus: &str, until: &str) -> Result<(), String> {
        let status = tokio::process::Command::new(&self.hook).arg(event).arg(lease.to_string()).arg(gpus).arg(until).status().await;
        match status {
            Ok(status) if status.success() => Ok(()),
            Ok(status) => Err(format!("the delivery hook {} exited with {status}", self.hook.display())),
            Err(error) => Err(format!("the delivery hook {} could not run: {error}", self.hook.display())),
        }
    }
}

#[async_trait::async_trait]
impl DeliveryBackend for HookBackend {
    fn name(&self) -> &'static str {
        "hook"
    }

    fn runs_without_workload(&self) -> bool {
        true
    }

    async fn start(&self, job: &Launch, _progress: &Progress) -> Result<Vec<Endpoint>, Failure> {
        let uuids: Vec<&str> = job.gpus.iter().map(|g| g.uuid.as_str()).collect();
        let until = job.end_ms.map_or("-".to_string(), |ms| ms.to_string());
        self.gpus.lock().await.insert(job.lease, uuids.join(","));
        self.run("start", job.lease, &uuids.join(","), &until).await.map_err(|reason| Failure::new(FailureCode::HostError, reason))?;
        Ok(Vec::new())
    }

    async fn poll(&self, _lease: LeaseId) -> Poll {
        Poll::Running
    }

    async fn terminate(&self, job: &Launch, deadline_ms: u64) {
        let uuids: Vec<&str> = job.gpus.iter().map(|g| g.uuid.as_str()).collect();
        if let Err(error) = self.run("preempt", job.lease, &uuids.join(","), &deadline_ms.to_string()).await {
            tracing::warn!(lease = %job.lease, %error, "preempt hook failed");
        }
    }

    /// The `end` hook; its failure is a removal not confirmed, tried again
    /// (the owner's program is what says the GPUs are free).
    async fn remove(&self, lease: LeaseId, _grace: Duration) -> Result<(), String> {
        let gpus = self.gpus.lock().await.get(&lease).cloned().unwrap_or_default();
        let ended_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        self.run("end", lease, &gpus, &ended_ms.to_string()).await.map_err(|error| format!("end hook failed: {error}"))?;
        self.gpus.lock().await.remove(&lease);
        Ok(())
    }

    async fn logs(&self, _lease: LeaseId, _tail_bytes: u32) -> (String, bool) {
        (String::new(), false)
    }

    async fn found(&self, _lease: LeaseId) -> Result<Option<Found>, String> {
        Ok(None)
    }

    async fn find(&self) -> Result<Vec<Found>, String> {
        Ok(Vec::new()) // a hook keeps no record of what it started
    }

    /// The owner's own check (`hook check - - -`): whatever the hook needs
    /// to deliver (its scheduler, its storage) answers. What it printed on
    /// stderr is the reason when it does not.
    async fn health(&self) -> Result<(), String> {
        let output = tokio::process::Command::new(&self.hook)
            .args(["check", "-", "-", "-"])
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|error| format!("the delivery hook {} could not run: {error}", self.hook.display()))?;
        if output.status.success() {
            return Ok(());
        }
        let said = String::from_utf8_lossy(&output.stderr);
        let said = said.trim();
        let tail = &said[said.floor_char_boundary(said.len().saturating_sub(256))..];
        Err(format!("the delivery hook's check exited with {}: {tail}", output.status))
    }
}
