//! A small deterministic generator for test data: SplitMix64, so that every run of every
//! test, on every machine, sees the same tensors.

/// SplitMix64 pseudo-random generator. Not for anything but test data.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator whose whole sequence is determined by `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`, with 24 random bits (every value is exact in f32).
    pub fn next_unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// Uniform in `[low, high)`.
    pub fn uniform(&mut self, low: f32, high: f32) -> f32 {
        low + (high - low) * self.next_unit()
    }

    /// `count` values uniform in `[low, high)`.
    pub fn uniform_vec(&mut self, count: usize, low: f32, high: f32) -> Vec<f32> {
        (0..count).map(|_| self.uniform(low, high)).collect()
    }

    /// `count` bf16 values, drawn uniform in `[low, high)` and rounded to nearest even.
    pub fn uniform_bf16_vec(&mut self, count: usize, low: f32, high: f32) -> Vec<u16> {
        (0..count)
            .map(|_| crate::bf16::from_f32(self.uniform(low, high)))
            .collect()
    }

    /// `true` with probability `probability`.
    pub fn chance(&mut self, probability: f32) -> bool {
        self.next_unit() < probability
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_sequence() {
        let mut first = Rng::new(7);
        let mut second = Rng::new(7);
        for _ in 0..100 {
            assert_eq!(first.next_u64(), second.next_u64());
        }
        assert_ne!(Rng::new(7).next_u64(), Rng::new(8).next_u64());
    }

    #[test]
    fn splitmix64_matches_its_published_sequence() {
        // First outputs of SplitMix64 seeded with 1234567.
        let mut rng = Rng::new(1_234_567);
        assert_eq!(rng.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(rng.next_u64(), 3_203_168_211_198_807_973);
    }

    #[test]
    fn uniform_stays_in_range() {
        let mut rng = Rng::new(1);
        for _ in 0..10_000 {
            let value = rng.uniform(-2.0, 3.0);
            assert!((-2.0..3.0).contains(&value), "{value}");
        }
    }
}
