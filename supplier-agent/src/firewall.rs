//! The fabric's firewall (docs/agent.md "Firewall"): with `[fabric]
//! firewall = "nftables"`, the agent keeps one nftables table of its own,
//! `inet gpux_<host>`, that drops every new connection (TCP, UDP, any port)
//! to the host's fabric address unless it comes from the host itself or
//! from a member of a cluster this host serves now. Cluster containers share
//! the host's network and NCCL, Gloo and MPI open ports of their own
//! choosing, so the rule is by source, not by port.
//!
//! Each change replaces the whole table in one `nft -f` transaction (the
//! table is declared, deleted and declared again), so a failure leaves the
//! previous rules whole. The members by lease are kept in
//! `<state dir>/firewall.json`: a restarted agent puts back what its running
//! clusters need before it hears from the exchange. The table stays when the
//! agent stops (closed, not open).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use gpux_engine::LeaseId;

/// Why the firewall could not be set.
#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    #[error("running nft: {0}")]
    Spawn(std::io::Error),
    #[error("nft refused the table: {0}")]
    Refused(String),
    #[error("the firewall's state file: {0}")]
    State(#[from] crate::saved::SavedError),
}

/// One host's fabric firewall.
pub struct Firewall {
    table: String,
    fabric: IpAddr,
    state: PathBuf,
    /// The cluster members each lease on this host needs to reach it.
    members: BTreeMap<LeaseId, Vec<IpAddr>>,
}

impl Firewall {
    /// The firewall of `host` on `fabric`, with the members its state file
    /// kept (none when there is none).
    pub fn new(host: &str, fabric: IpAddr, state: PathBuf) -> Result<Firewall, FirewallError> {
        let name: String = host.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect();
        let members = crate::saved::read(&state)?.unwrap_or_default();
        Ok(Firewall { table: format!("gpux_{name}"), fabric, state, members })
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    /// The leases whose members it admits.
    pub fn leases(&self) -> Vec<LeaseId> {
        self.members.keys().copied().collect()
    }

    /// Admits `members` for `lease` (a cluster this host serves).
    pub fn admit(&mut self, lease: LeaseId, members: Vec<IpAddr>) -> Result<(), FirewallError> {
        self.members.insert(lease, members);
        self.apply()
    }

    /// Stops admitting what `lease` needed (its lease ended).
    pub fn forget(&mut self, leases: &[LeaseId]) -> Result<(), FirewallError> {
        let before = self.members.len();
        self.members.retain(|lease, _| !leases.contains(lease));
        if self.members.len() == before {
            return Ok(());
        }
        self.apply()
    }

    /// The sources admitted now: the host itself and every member of its
    /// clusters, of the fabric address's family.
    pub fn admitted(&self) -> BTreeSet<IpAddr> {
        let same_family = |a: &IpAddr| a.is_ipv4() == self.fabric.is_ipv4();
        std::iter::once(self.fabric).chain(self.members.values().flatten().copied()).filter(same_family).collect()
    }

    /// The table, as `nft -f` reads it: declared, deleted and declared again
    /// with the admitted sources, in one transaction.
    pub fn ruleset(&self) -> String {
        let (family, kind) = if self.fabric.is_ipv4() { ("ip", "ipv4_addr") } else { ("ip6", "ipv6_addr") };
        let elements: Vec<String> = self.admitted().iter().map(|a| a.to_string()).collect();
        let table = &self.table;
        format!(
            "table inet {table} {{}}\ndelete table inet {table}\ntable inet {table} {{\n\
             \tset members {{ type {kind}; elements = {{ {} }} }}\n\
             \tchain input {{\n\t\ttype filter hook input priority filter - 1; policy accept;\n\
             \t\t{family} daddr {} ct state new {family} saddr != @members drop\n\t}}\n}}\n",
            elements.join(", "),
            self.fabric,
        )
    }

    /// Installs the table as it stands and saves the members.
    pub fn apply(&self) -> Result<(), FirewallError> {
        crate::saved::write(&self.state, &self.members)?;
        run_nft(&["-f", "-"], Some(&self.ruleset()))
    }

    /// Removes the table (tests; an operator turning the firewall off).
    pub fn remove(&self) -> Result<(), FirewallError> {
        run_nft(&["delete", "table", "inet", &self.table], None)
    }
}

fn run_nft(args: &[&str], stdin: Option<&str>) -> Result<(), FirewallError> {
    let mut child = Command::new("nft")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(FirewallError::Spawn)?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).map_err(FirewallError::Spawn)?;
    }
    let output = child.wait_with_output().map_err(FirewallError::Spawn)?;
    match output.status.success() {
        true => Ok(()),
        false => Err(FirewallError::Refused(String::from_utf8_lossy(&output.stderr).trim().to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_admits_the_host_and_its_clusters_members_of_the_fabrics_family() {
        let dir = tempfile::tempdir().expect("dir");
        let fabric: IpAddr = "10.8.0.2".parse().expect("ip");
        let mut firewall = Firewall::new("dc1-node-02", fabric, dir.path().join("firewall.json")).expect("new");
        assert_eq!(firewall.table(), "gpux_dc1_node_02");
        firewall.members.insert(LeaseId(4), vec!["10.8.0.3".parse().expect("ip"), "fd00::3".parse().expect("ip")]);
        let ruleset = firewall.ruleset();
        assert!(ruleset.contains("elements = { 10.8.0.2, 10.8.0.3 }"), "{ruleset}");
        assert!(ruleset.contains("ip daddr 10.8.0.2 ct state new ip saddr != @members drop"), "{ruleset}");
        assert!(ruleset.starts_with("table inet gpux_dc1_node_02 {}\ndelete table inet gpux_dc1_node_02\n"), "replaced whole");
    }

    /// The members an older agent saved (before saved files recorded their
    /// format) are put back; a newer agent's file is refused, not misread.
    #[test]
    fn an_older_agents_members_are_read_and_a_newer_file_refused() {
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state-2026-12-06");
        let fabric: IpAddr = "10.8.0.2".parse().expect("ip");
        let firewall = Firewall::new("dc1-node-02", fabric, fixtures.join("firewall.json")).expect("an older agent's file");
        assert_eq!(firewall.leases(), vec![LeaseId(4)]);
        assert!(firewall.admitted().contains(&"10.8.0.4".parse::<IpAddr>().expect("ip")));
        let dir = tempfile::tempdir().expect("dir");
        let newer = dir.path().join("firewall.json");
        std::fs::write(&newer, r#"{"format":99,"state":{}}"#).expect("write");
        assert!(matches!(
            Firewall::new("dc1-node-02", fabric, newer),
            Err(FirewallError::State(crate::saved::SavedError::Newer { found: 99, .. }))
        ));
    }
}
