//! A tiny seeded pseudo-random stream for decisions that must replay from a
//! seed: the simulator's losses and the fault decorator's faults.
#![forbid(unsafe_code)]

/// splitmix64: tiny, seedable, good enough for fault decisions.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// True with probability `pct` percent. A zero rate draws nothing, so enabling
    /// one fault does not change the decisions of another.
    pub fn chance(&mut self, pct: f64) -> bool {
        if pct <= 0.0 {
            return false;
        }
        // 53 random bits as a uniform float in [0, 100).
        ((self.next_u64() >> 11) as f64) * (100.0 / (1u64 << 53) as f64) < pct
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}
