//! A deterministic hash of the engine's whole state (FNV-1a, 64 bit), so tests
//! and the exchange can prove that replaying a journal rebuilt the same state.
//! FNV is chosen over std's `DefaultHasher` because its output is fixed by its
//! definition, not by the Rust release.

pub struct StateHasher {
    state: u64,
}

impl StateHasher {
    pub fn new() -> Self {
        StateHasher { state: 0xcbf2_9ce4_8422_2325 }
    }

    pub fn bytes(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.state ^= byte as u64;
            self.state = self.state.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    pub fn u64(&mut self, value: u64) {
        self.bytes(&value.to_le_bytes());
    }

    pub fn finish(&self) -> u64 {
        self.state
    }
}

impl Default for StateHasher {
    fn default() -> Self {
        Self::new()
    }
}
