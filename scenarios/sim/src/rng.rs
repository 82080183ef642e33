//! Deterministic noise. Members of a collective each compute its transfer
//! time on their own, so the jitter must be a pure function of what they all
//! know (seed, communicator, sequence number), not a per-process RNG.

/// SplitMix64 finalizer: a good 64-bit mix of `x`.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Hashes several words into one.
pub fn hash(words: &[u64]) -> u64 {
    words.iter().fold(0x5157_0a11_u64, |h, w| mix(h ^ w))
}

/// FNV-1a of a byte string (stable across builds, unlike `DefaultHasher`).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Uniform in [0, 1) from a hash.
pub fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// Multiplier in [1 - jitter, 1 + jitter] from a hash.
pub fn jitter_factor(h: u64, jitter: f64) -> f64 {
    1.0 + jitter * (2.0 * unit(h) - 1.0)
}

/// Small sequential generator for per-thread noise (kernel durations).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }
    /// Multiplier in [1 - jitter, 1 + jitter].
    pub fn jitter(&mut self, jitter: f64) -> f64 {
        jitter_factor(self.next_u64(), jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_bounds_and_varies() {
        let mut r = Rng::new(1);
        let xs: Vec<f64> = (0..1000).map(|_| r.jitter(0.1)).collect();
        assert!(xs.iter().all(|x| (0.9..=1.1).contains(x)));
        let distinct = xs.iter().filter(|x| (**x - xs[0]).abs() > 1e-9).count();
        assert!(distinct > 900);
    }

    #[test]
    fn hash_is_order_sensitive() {
        assert_ne!(hash(&[1, 2]), hash(&[2, 1]));
        assert_eq!(fnv1a(b"abc"), fnv1a(b"abc"));
    }
}
