//! Hardware challenges (docs/agent.md "Hardware challenges"): the exchange
//! asks for a product or a memory pass over one of the host's GPUs; the
//! backend computes it and commits to it by a Merkle root, the agent sends
//! the root, then opens the leaves the exchange names. Asked in the message
//! handler, answered from the loop when no message waits. A challenge the
//! agent cannot answer is left to expire (the exchange records it
//! unanswered).

use anyhow::Result;
use gpux_client::Connection;
use gpux_engine::GpuId;
use gpux_protocol::{ClientMessage, ServerMessage};

use super::host::Host;
use crate::backend::{GpuBackend, MerkleProof};

/// A challenge the exchange sent, to answer.
pub(super) enum Asked {
    Compute { challenge: u64, gpu: GpuId, seed: String, n: u32 },
    Memory { challenge: u64, gpu: GpuId, seed: String, words_log2: u32, passes: u32 },
}

/// The challenges to answer, in the order asked.
#[derive(Default)]
pub(super) struct Challenges {
    asked: Vec<Asked>,
}

impl Challenges {
    pub(super) fn ask(&mut self, asked: Asked) {
        self.asked.push(asked);
    }

    pub(super) fn due(&self) -> bool {
        !self.asked.is_empty()
    }

    /// Answers every challenge asked so far.
    pub(super) async fn answer(&mut self, connection: &mut Connection, host: &Host, backend: &mut dyn GpuBackend) -> Result<()> {
        for asked in std::mem::take(&mut self.asked) {
            match asked {
                Asked::Compute { challenge, gpu, seed, n } => {
                    let Some((uuid, seed)) = challenged(host, challenge, gpu, &seed) else { continue };
                    let started = std::time::Instant::now();
                    let proof = match backend.challenge(&uuid, &seed, n) {
                        Ok(proof) => proof,
                        Err(error) => {
                            tracing::warn!(challenge, %uuid, %error, "could not compute the challenge");
                            continue;
                        }
                    };
                    let computed_ms = started.elapsed().as_millis() as u64;
                    if commit_and_open(connection, challenge, &uuid, proof, false).await? {
                        tracing::info!(challenge, %uuid, n, computed_ms, "hardware challenge answered");
                    }
                }
                Asked::Memory { challenge, gpu, seed, words_log2, passes } => {
                    let Some((uuid, seed)) = challenged(host, challenge, gpu, &seed) else { continue };
                    let started = std::time::Instant::now();
                    let proof = match backend.memory_challenge(&uuid, &seed, words_log2, passes) {
                        Ok(proof) => proof,
                        Err(error) => {
                            tracing::warn!(challenge, %uuid, %error, "could not run the memory challenge");
                            continue;
                        }
                    };
                    let computed_ms = started.elapsed().as_millis() as u64;
                    if commit_and_open(connection, challenge, &uuid, proof, true).await? {
                        tracing::info!(challenge, %uuid, words_log2, passes, computed_ms, "memory challenge answered");
                    }
                }
            }
        }
        Ok(())
    }
}

/// A challenge of one of the host's GPUs was decided (logged; its classes
/// are read again by the caller).
pub(super) fn decided(host: &Host, gpu: GpuId, kind: &str, outcome: gpux_engine::ChallengeOutcome, rate: u64, verified: bool) {
    let uuid = host.gpus.iter().find(|g| g.info.gpu == gpu).map(|g| g.info.uuid.clone()).unwrap_or_default();
    match outcome {
        gpux_engine::ChallengeOutcome::Passed => tracing::info!(%uuid, kind, rate, verified, "hardware challenge passed"),
        other => tracing::warn!(%uuid, kind, outcome = ?other, rate, "hardware challenge not passed"),
    }
}

/// The challenged GPU's UUID and the challenge's seed; `None` (logged)
/// for a GPU not on this host or a malformed seed.
fn challenged(host: &Host, challenge: u64, gpu: GpuId, seed: &str) -> Option<(String, [u8; 32])> {
    let Some(uuid) = host.gpus.iter().find(|g| g.info.gpu == gpu).map(|g| g.info.uuid.clone()) else {
        // The supplier's other hosts share its account and its pushes.
        tracing::debug!(challenge, ?gpu, "challenge for a GPU on another host");
        return None;
    };
    let Some(seed) = hex::decode(seed).ok().and_then(|bytes| <[u8; 32]>::try_from(bytes).ok()) else {
        tracing::warn!(challenge, "challenge with a malformed seed");
        return None;
    };
    Some((uuid, seed))
}

/// Sends a computed challenge's root, then opens the leaves the exchange
/// names (`challenge_opening`, or `memory_opening` for a memory challenge).
/// Whether the exchange took the opening (refusals are logged).
async fn commit_and_open(
    connection: &mut Connection,
    challenge: u64,
    uuid: &str,
    mut proof: Box<dyn MerkleProof>,
    memory: bool,
) -> Result<bool> {
    let id = connection.new_id();
    let commit = ClientMessage::ChallengeCommit { id, challenge, commitment: hex::encode(proof.root()) };
    let asked = match connection.request(commit).await? {
        ServerMessage::ChallengeRows { rows, .. } => rows,
        other => {
            tracing::warn!(challenge, ?other, "challenge commitment refused");
            return Ok(false);
        }
    };
    let leaves = match proof.open(&asked) {
        Ok(opened) => opened,
        Err(error) => {
            tracing::warn!(challenge, %uuid, %error, "could not open the challenge's leaves");
            return Ok(false);
        }
    };
    let id = connection.new_id();
    let opening = if memory {
        ClientMessage::MemoryOpening { id, challenge, leaves }
    } else {
        ClientMessage::ChallengeOpening { id, challenge, leaves }
    };
    match connection.request(opening).await? {
        ServerMessage::Ack { .. } => Ok(true),
        other => {
            tracing::warn!(challenge, ?other, "challenge opening refused");
            Ok(false)
        }
    }
}
