//! openraft's own storage test suite (`openraft::testing::Suite`) against
//! the redb log and the market state machine: votes, log state, append,
//! truncate, purge, applied state and membership, snapshots, as Raft
//! expects them.

use gpux_replica::log_store::LogStore;
use gpux_replica::state_machine::MarketMachine;
use gpux_replica::{StorageError, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, MarketMachine, tempfile::TempDir> for Builder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, MarketMachine), StorageError> {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = LogStore::open(&dir.path().join("log.redb")).expect("log opens");
        let machine = MarketMachine::open(&dir.path().join("machine.redb"), gpux_engine::EngineConfig::demo()).expect("machine opens");
        Ok((dir, log, machine))
    }
}

#[test]
fn the_redb_log_and_the_market_machine_pass_openrafts_storage_suite() {
    Suite::test_all(Builder).expect("every storage test passes");
}
