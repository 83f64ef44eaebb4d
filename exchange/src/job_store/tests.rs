use std::path::Path;
use std::sync::Arc;

use gpux_engine::{AccountId, LeaseId};
use gpux_protocol::JobId;

use super::*;

#[test]
fn a_store_the_exchange_cannot_speak_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let refused = open("ftp://host/path", dir.path()).expect_err("refused").to_string();
    assert!(refused.contains("expected local, file:///DIR, s3://BUCKET"), "{refused}");
    assert!(open("local", dir.path()).is_ok() && dir.path().join("job-store").is_dir());
}

/// A local store's root is owner-only, even one that existed with
/// wider modes: nothing below it is readable by another user.
#[test]
fn a_local_stores_root_is_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    open("local", dir.path()).expect("opens");
    let mode = |path: &Path| std::fs::metadata(path).expect("there").permissions().mode() & 0o777;
    assert_eq!(mode(&dir.path().join("job-store")), 0o700);
    let shared = dir.path().join("shared");
    std::fs::create_dir_all(&shared).expect("dir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    open(&format!("file://{}", shared.display()), dir.path()).expect("opens");
    assert_eq!(mode(&shared), 0o700);
}

#[test]
fn keys_parse_strictly() {
    let sha = "ab".repeat(32);
    assert_eq!(Key::parse(&format!("7/bundles/{sha}.tar.gz")), Some(Key::Bundle { owner: AccountId(7), sha256: sha.clone() }));
    assert_eq!(
        Key::parse("7/jobs/3/checkpoints/step-10.json"),
        Some(Key::Job { owner: AccountId(7), job: JobId(3), rest: "checkpoints/step-10.json".into() })
    );
    for bad in
        ["7/bundles/x.tar.gz", "7/jobs/3/other/a", "7/jobs/3/outputs/../a", "7/jobs/3/outputs", "x/jobs/3/outputs/a", "/7/jobs/3/outputs/a"]
    {
        assert_eq!(Key::parse(bad), None, "{bad}");
    }
}

#[test]
fn grants_open_what_they_name_only() {
    let issuer = Issuer::new("http://store".into(), [9; 32], Arc::default());
    let sha = "cd".repeat(32);
    let host = Grant::Host {
        renter: AccountId(7),
        job: JobId(3),
        lease: LeaseId(11),
        attempt: 1,
        bundle: Some(sha.clone()),
        inputs: vec!["ab".repeat(32)],
        expires_at_ms: 2_000,
    };
    let token = issuer.issue(&host);
    assert_eq!(verify(&[9; 32], &token, 1_000), Some(host.clone()));
    assert_eq!(verify(&[9; 32], &token, 2_000), None, "expired");
    assert_eq!(verify(&[8; 32], &token, 1_000), None, "another secret");
    let other = issuer.issue(&Grant::Host {
        renter: AccountId(7),
        job: JobId(4),
        lease: LeaseId(11),
        attempt: 1,
        bundle: None,
        inputs: Vec::new(),
        expires_at_ms: 2_000,
    });
    let forged = format!("{}.{}", other.split('.').next().expect("a body"), token.split('.').nth(1).expect("a tag"));
    assert_eq!(verify(&[9; 32], &forged, 1_000), None, "a changed body");
    let key = |k: &str| Key::parse(k).expect("valid");
    assert!(host.allows(Operation::Read, &key(&format!("7/bundles/{sha}.tar.gz"))));
    assert!(!host.allows(Operation::Write, &key(&format!("7/bundles/{sha}.tar.gz"))));
    assert!(!host.allows(Operation::Read, &key(&format!("7/bundles/{}.tar.gz", "ee".repeat(32)))));
    assert!(host.allows(Operation::Write, &key("7/jobs/3/outputs/model.bin")));
    assert!(host.allows(Operation::Read, &key(&format!("7/inputs/{}.tar.gz", "ab".repeat(32)))), "its job's input");
    assert!(!host.allows(Operation::Read, &key(&format!("7/inputs/{}.tar.gz", "ef".repeat(32)))), "another input");
    assert!(!host.allows(Operation::Read, &key("7/jobs/4/outputs/model.bin")), "another job");
    assert!(!host.allows(Operation::Read, &key("8/jobs/3/outputs/model.bin")), "another renter");
    let renter = Grant::Renter { account: AccountId(7), participant: None, expires_at_ms: 2_000 };
    assert!(renter.allows(Operation::Write, &key(&format!("7/bundles/{sha}.tar.gz"))));
    assert!(renter.allows(Operation::Read, &key("7/jobs/4/outputs/model.bin")));
    assert!(!renter.allows(Operation::Write, &key("7/jobs/4/outputs/model.bin")), "results are the host's to write");
    assert!(!renter.allows(Operation::Read, &key("8/jobs/4/outputs/model.bin")));
}

/// A cluster node that does not lead follows the running job leases from
/// the market it applied: a lease gone from it ended then (its host may
/// still put its output tail for the grace), a new one runs.
#[test]
fn running_leases_follow_a_nodes_applied_market() {
    let running = RunningLeases::default();
    running.sync(&[LeaseId(1), LeaseId(2)].into_iter().collect(), 1_000);
    assert_eq!(running.standing(LeaseId(1), 1_000), Standing::Running);
    running.sync(&[LeaseId(2), LeaseId(3)].into_iter().collect(), 2_000);
    assert_eq!(running.standing(LeaseId(1), 2_000 + LOG_GRACE_MS - 1), Standing::JustEnded);
    assert_eq!(running.standing(LeaseId(1), 2_000 + LOG_GRACE_MS), Standing::Ended);
    assert_eq!(running.standing(LeaseId(3), 2_000), Standing::Running);
    assert_eq!(running.standing(LeaseId(4), 2_000), Standing::Ended, "never ran");
}

/// Every node of a cluster derives the same token key from the cluster's
/// secret, another secret another key; a cluster refuses a job store only
/// one node holds.
#[test]
fn a_clusters_nodes_share_a_token_key_and_a_shared_backend() {
    assert_eq!(cluster_key(b"one secret"), cluster_key(b"one secret"));
    assert_ne!(cluster_key(b"one secret"), cluster_key(b"another"));
    let grant = Grant::Renter { account: AccountId(7), participant: None, expires_at_ms: 2_000 };
    let token = Issuer::new("http://a,http://b".into(), cluster_key(b"one secret"), Arc::default()).issue(&grant);
    assert_eq!(verify(&cluster_key(b"one secret"), &token, 1_000), Some(grant));
    for refused in ["local", "file:///srv/jobs"] {
        assert!(check_shared(refused).is_err(), "{refused}");
    }
    for shared in ["s3://bucket", "gs://bucket", "az://container"] {
        assert!(check_shared(shared).is_ok(), "{shared}");
    }
}

/// A cluster's secret rotated: the store verifies tokens under the new key
/// and, while the operator keeps the previous secret, under the old one (a
/// running job's host keeps the token its assignment carried); a token
/// under any other key never.
#[test]
fn a_store_keeps_accepting_tokens_signed_before_a_rotation_while_told_to() {
    let (old, new, other) = (cluster_key(b"old secret"), cluster_key(b"new secret"), cluster_key(b"someone else"));
    let grant = Grant::Renter { account: AccountId(7), participant: None, expires_at_ms: u64::MAX };
    let signed = |key: [u8; 32]| Issuer::new("http://a".into(), key, Arc::default()).issue(&grant);
    let store = || {
        let backend: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        StoreServer::new(backend, new, Arc::default(), 1 << 20, gpux_gateway::link::Clock::default())
    };
    let rotated = store();
    assert_eq!(rotated.verify_token(&signed(new)), Some(grant.clone()));
    assert_eq!(rotated.verify_token(&signed(old)), None, "without the previous secret, tokens before the rotation are refused");
    let rotating = store().also_accepting(old);
    assert_eq!(rotating.verify_token(&signed(old)), Some(grant.clone()));
    assert_eq!(rotating.verify_token(&signed(new)), Some(grant.clone()));
    assert_eq!(rotating.verify_token(&signed(other)), None);
}
