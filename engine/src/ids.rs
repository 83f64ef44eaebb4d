//! Identifier newtypes. Every id the engine hands out is dense and assigned in
//! command order, so replaying a journal reproduces the same ids.

use serde::{Deserialize, Serialize};

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

id_type!(
    /// A participant of the exchange (renter, supplier, aggregator or operator).
    AccountId(u32)
);
id_type!(
    /// A tradable instrument: a GPU class crossed with a contract kind.
    InstrumentId(u32)
);
id_type!(
    /// A supplier's host, as registered with its first GPU.
    HostId(u32)
);
id_type!(
    /// A registered GPU (or MIG slice) that can be offered.
    GpuId(u32)
);
id_type!(
    /// A lease: a renter's right to use concrete GPUs for a time at a price.
    LeaseId(u64)
);
id_type!(
    /// One reserved-window contract unit: one GPU for one window.
    ContractId(u64)
);
id_type!(
    /// An order. The low 32 bits index the engine's order slab and the high 32
    /// bits count reuses of that slot, so lookup is a direct index, never a hash,
    /// and a stale id never reaches a newer order in the same slot.
    OrderId(u64)
);

impl OrderId {
    pub fn from_parts(slot: u32, generation: u32) -> Self {
        OrderId(((generation as u64) << 32) | slot as u64)
    }
    pub fn slot(self) -> u32 {
        self.0 as u32
    }
    pub fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }
}
