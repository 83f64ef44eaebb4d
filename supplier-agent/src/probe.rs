//! The interconnect probe (docs/agent.md "Interconnect probe"): when a
//! cluster attempt is delivered, the agents of its members run one ring
//! all-reduce among themselves over their fabric addresses, as NCCL's ring
//! algorithm does it (a reduce-scatter, then an all-gather, each `ranks - 1`
//! steps of one chunk to the next rank while one comes from the previous),
//! and time it. Each rank's buffer is a known function of its rank, so every
//! rank checks the sum it ends with word by word: a ring that passes the
//! bytes on without adding them does not pass.
//!
//! Rank `r` listens on its member port + [`PROBE_PORT_OFFSET`] at its
//! fabric address and connects to rank `r + 1`'s; a connection opens with a
//! 32-byte hello naming the job, the attempt and the sender's rank, and any
//! other is dropped.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub use crate::limits::PROBE_PORT_OFFSET;
use gpux_engine::MemberAddress;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const HELLO_MAGIC: &[u8; 16] = b"gpux-probe-v1\0\0\0";

/// One ring: this member's place in it and what to reduce.
#[derive(Clone, Debug)]
pub struct Ring {
    pub job: u64,
    pub attempt: u32,
    pub rank: u32,
    /// Every member by rank (the job assignment's `peers`).
    pub members: Vec<MemberAddress>,
    /// Bytes of each rank's buffer (a multiple of 4).
    pub bytes: u64,
    /// The whole probe, connections included, must be over by then.
    pub deadline: Duration,
}

/// Why a probe did not complete.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("the ring's addresses are not usable: {0}")]
    Addresses(String),
    #[error("listening on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
    #[error("the ring did not complete in {0:?}")]
    Timeout(Duration),
    #[error("a ring connection failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("word {0} of the reduced buffer is not the ring's sum")]
    WrongSum(usize),
}

fn probe_address(member: &MemberAddress) -> Result<SocketAddr, ProbeError> {
    let ip: std::net::IpAddr = member.address.parse().map_err(|_| ProbeError::Addresses(member.address.clone()))?;
    let port = member.port.checked_add(PROBE_PORT_OFFSET).ok_or_else(|| ProbeError::Addresses(format!("port {}", member.port)))?;
    Ok(SocketAddr::new(ip, port))
}

fn hello(ring: &Ring, rank: u32) -> [u8; 32] {
    let mut hello = [0u8; 32];
    hello[..16].copy_from_slice(HELLO_MAGIC);
    hello[16..24].copy_from_slice(&ring.job.to_le_bytes());
    hello[24..28].copy_from_slice(&ring.attempt.to_le_bytes());
    hello[28..32].copy_from_slice(&rank.to_le_bytes());
    hello
}

/// Word `i` of rank `r`'s buffer: `f(i) + r * g(i)`, so the ring's sum is
/// `n f(i) + g(i) n (n - 1) / 2` (all wrapping), checked without the others' buffers.
fn word(rank: u32, i: u32) -> u32 {
    let f = i.wrapping_mul(0x9e37_79b1);
    let g = (i ^ 0x5bd1_e995).wrapping_mul(0x85eb_ca77) | 1;
    f.wrapping_add(rank.wrapping_mul(g))
}

fn sum(ranks: u32, i: u32) -> u32 {
    let f = i.wrapping_mul(0x9e37_79b1);
    let g = (i ^ 0x5bd1_e995).wrapping_mul(0x85eb_ca77) | 1;
    let pairs = (ranks as u64 * (ranks as u64 - 1) / 2) as u32;
    f.wrapping_mul(ranks).wrapping_add(g.wrapping_mul(pairs))
}

/// Runs the ring and returns how long its steps took (connections and the
/// start barrier excluded).
pub async fn run(ring: &Ring) -> Result<Duration, ProbeError> {
    match tokio::time::timeout(ring.deadline, run_ring(ring)).await {
        Ok(result) => result,
        Err(_) => Err(ProbeError::Timeout(ring.deadline)),
    }
}

async fn run_ring(ring: &Ring) -> Result<Duration, ProbeError> {
    let n = ring.members.len();
    let rank = ring.rank as usize;
    if n < 2 || rank >= n || ring.bytes < 4 * n as u64 {
        return Err(ProbeError::Addresses(format!("rank {rank} of {n}, {} bytes", ring.bytes)));
    }
    let own = probe_address(&ring.members[rank])?;
    let next = probe_address(&ring.members[(rank + 1) % n])?;
    let prev_rank = ((rank + n - 1) % n) as u32;
    let listener = TcpListener::bind(own).await.map_err(|e| ProbeError::Listen(own, e))?;
    let (mut to_next, mut from_prev) = tokio::try_join!(connect(next, hello(ring, ring.rank)), accept(&listener, hello(ring, prev_rank)))?;
    drop(listener);

    // Every rank holds both its connections before the clock starts.
    tokio::try_join!(to_next.write_all(&[1]), async { from_prev.read_exact(&mut [0u8; 1]).await.map(|_| ()) })?;
    let started = Instant::now();

    let words = (ring.bytes / 4) as usize;
    let mut buffer: Vec<u8> = (0..words as u32).flat_map(|i| word(ring.rank, i).to_le_bytes()).collect();
    let bounds = |chunk: usize| (chunk * words / n * 4, (chunk + 1) * words / n * 4);
    let mut incoming = vec![0u8; (words / n + 1) * 4];
    // Reduce-scatter: after step s, chunk (rank - s - 1) holds s + 2 ranks' sums.
    for step in 0..n - 1 {
        let (send_from, send_to) = bounds((rank + n - step) % n);
        let (recv_from, recv_to) = bounds((rank + n - step - 1) % n);
        let received = &mut incoming[..recv_to - recv_from];
        tokio::try_join!(to_next.write_all(&buffer[send_from..send_to]), from_prev.read_exact(received))?;
        for (mine, theirs) in buffer[recv_from..recv_to].chunks_exact_mut(4).zip(received.chunks_exact(4)) {
            let total = u32::from_le_bytes(mine[..4].try_into().expect("4 bytes"))
                .wrapping_add(u32::from_le_bytes(theirs.try_into().expect("4 bytes")));
            mine.copy_from_slice(&total.to_le_bytes());
        }
    }
    // All-gather: each rank passes on the chunk it completed last.
    for step in 0..n - 1 {
        let (send_from, send_to) = bounds((rank + 1 + n - step) % n);
        let (recv_from, recv_to) = bounds((rank + n - step) % n);
        let received = &mut incoming[..recv_to - recv_from];
        tokio::try_join!(to_next.write_all(&buffer[send_from..send_to]), from_prev.read_exact(received))?;
        buffer[recv_from..recv_to].copy_from_slice(received);
    }
    let elapsed = started.elapsed();
    let ranks = n as u32;
    if let Some(wrong) =
        buffer.chunks_exact(4).enumerate().position(|(i, w)| u32::from_le_bytes(w.try_into().expect("4 bytes")) != sum(ranks, i as u32))
    {
        return Err(ProbeError::WrongSum(wrong));
    }
    Ok(elapsed)
}

/// Connects to the next rank, again every 100 ms until it listens.
async fn connect(next: SocketAddr, hello: [u8; 32]) -> Result<TcpStream, ProbeError> {
    loop {
        match TcpStream::connect(next).await {
            Ok(mut stream) => {
                stream.set_nodelay(true)?;
                stream.write_all(&hello).await?;
                return Ok(stream);
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Accepts the previous rank's connection; any other is dropped.
async fn accept(listener: &TcpListener, expected: [u8; 32]) -> Result<TcpStream, ProbeError> {
    loop {
        let (mut stream, _) = listener.accept().await?;
        let mut hello = [0u8; 32];
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut hello)).await;
        if matches!(read, Ok(Ok(_))) && hello == expected {
            stream.set_nodelay(true)?;
            return Ok(stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Member ports whose probe ports the system just handed out as free
    /// (fixed ports collide with other tests' ephemeral ones).
    fn free_member_ports(n: u32) -> Vec<u16> {
        let mut held = Vec::new();
        while held.len() < n as usize {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            if listener.local_addr().expect("address").port() > 1_024 + PROBE_PORT_OFFSET {
                held.push(listener);
            }
        }
        held.iter().map(|l| l.local_addr().expect("address").port() - PROBE_PORT_OFFSET).collect()
    }

    fn ring(ranks: u32, bytes: u64) -> Vec<Ring> {
        let members: Vec<MemberAddress> =
            free_member_ports(ranks).into_iter().map(|port| MemberAddress { address: "127.0.0.1".into(), port }).collect();
        (0..ranks)
            .map(|rank| Ring { job: 7, attempt: 1, rank, members: members.clone(), bytes, deadline: Duration::from_secs(20) })
            .collect()
    }

    #[test]
    fn the_ring_sum_has_a_closed_form() {
        for ranks in [2u32, 3, 7, 64] {
            for i in [0u32, 1, 99, u32::MAX] {
                let direct = (0..ranks).fold(0u32, |total, r| total.wrapping_add(word(r, i)));
                assert_eq!(sum(ranks, i), direct, "{ranks} ranks, word {i}");
            }
        }
    }

    #[tokio::test]
    async fn every_rank_of_a_ring_ends_with_the_sum_and_a_time() {
        for ranks in [2, 3, 5] {
            // 1 MiB + 12 bytes: chunks of unequal size.
            let runs: Vec<_> = ring(ranks, (1 << 20) + 12).into_iter().map(|ring| tokio::spawn(async move { run(&ring).await })).collect();
            for run in runs {
                let elapsed = run.await.expect("joined").expect("the ring completes");
                assert!(elapsed > Duration::ZERO);
            }
        }
    }

    #[tokio::test]
    async fn a_member_that_never_comes_leaves_the_others_without_a_figure() {
        let mut rings = ring(3, 1 << 20);
        rings.pop();
        let runs: Vec<_> = rings
            .into_iter()
            .map(|ring| tokio::spawn(async move { run(&Ring { deadline: Duration::from_millis(800), ..ring }).await }))
            .collect();
        for run in runs {
            assert!(matches!(run.await.expect("joined"), Err(ProbeError::Timeout(_))));
        }
    }

    #[tokio::test]
    async fn a_stranger_on_the_probe_port_is_dropped_and_the_ring_completes() {
        let rings = ring(2, 1 << 20);
        let stranger = probe_address(&rings[0].members[1]).expect("an address");
        let runs: Vec<_> = rings.into_iter().map(|ring| tokio::spawn(async move { run(&ring).await })).collect();
        // Rank 1 listens; a connection with another job's hello is dropped.
        let mut intruder = loop {
            if let Ok(stream) = TcpStream::connect(stranger).await {
                break stream;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let _ = intruder.write_all(&[0u8; 32]).await;
        for run in runs {
            run.await.expect("joined").expect("the ring completes");
        }
    }
}
