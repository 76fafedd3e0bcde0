//! A hasher for keys that are spread already and looked up on every event: a stack (its content
//! hash, computed once), a pid. std's SipHash guards maps whose keys someone could pick to
//! collide; these come from the kernel or were hashed once already, and a multiplication spreads
//! them at a fraction of its cost.

use std::hash::{BuildHasherDefault, Hasher};

/// Maps keyed by stacks or pids on a hot path: `HashMap<K, V, hashing::Spread>`.
pub type Spread = BuildHasherDefault<Multiply>;

#[derive(Default)]
pub struct Multiply(u64);

/// Fibonacci hashing's multiplier: 2^64 / the golden ratio, odd.
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for Multiply {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(26) ^ n).wrapping_mul(GOLDEN);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::hash::BuildHasher;

    use super::*;

    #[test]
    fn neighbouring_pids_land_far_apart() {
        let spread = Spread::default();
        let hashes: Vec<u64> = (1000u32..1008).map(|pid| spread.hash_one(pid)).collect();
        // hashbrown picks a bucket by the low bits and checks the top seven: both differ.
        let low: HashSet<u64> = hashes.iter().map(|h| h & 0xff).collect();
        let top: HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert_eq!((low.len(), top.len()), (8, 8), "{hashes:x?}");
    }
}
