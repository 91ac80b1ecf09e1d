//! The generated workload: credit messages with new, UUID-shaped ids, spread over `ACCOUNTS`.

/// Accounts the business effect spreads its updates over.
pub const ACCOUNTS: i64 = 10_000;

/// One message: credit `amount` to `account`. `version` grows with every message, so the
/// versioned handler always advances (the stale path is not what is measured).
#[derive(Clone, Debug)]
pub struct Credit {
    pub id: String,
    pub account: i64,
    pub amount: i64,
    pub version: i64,
}

/// Generates messages with new ids (36 characters, the length of the peers' UUIDs); the low 48
/// bits of the sequence number are in the id, so ids never repeat.
pub struct Gen {
    pub next: u64,
    tag: u32,
}

impl Gen {
    pub fn new(tag: u32) -> Self {
        Gen { next: 0, tag }
    }

    pub fn one(&mut self) -> Credit {
        self.next += 1;
        let seq = self.next;
        // A UUID-shaped id, random-looking (like a v4 UUID), so records spread over the B-tree.
        let h = splitmix64(seq ^ (u64::from(self.tag) << 40));
        Credit {
            id: format!(
                "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
                h >> 32,
                (h >> 16) & 0xffff,
                h & 0xfff,
                seq >> 48,
                seq & 0xffff_ffff_ffff
            ),
            account: ((seq as i64).wrapping_mul(7919)).rem_euclid(ACCOUNTS),
            amount: (seq % 1000) as i64 + 1,
            version: seq as i64,
        }
    }

    pub fn take(&mut self, n: usize) -> Vec<Credit> {
        (0..n).map(|_| self.one()).collect()
    }
}

/// A bijective 64-bit mixer (SplitMix64's finalizer).
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
