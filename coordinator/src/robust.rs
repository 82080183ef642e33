//! Robust statistics, in one place: medians, quantiles and the robust
//! z-score every detector stage uses (clock filtering, lateness, pace).
//!
//! Plain functions over slices; no state, no IO.

/// MAD × this estimates the standard deviation of normal data (1/Φ⁻¹(¾)):
/// a robust z-score is then read like an ordinary one, while one straggler
/// among the peers cannot inflate the spread it is judged against.
pub const MAD_TO_SIGMA: f64 = 1.4826;

/// Linear-interpolated quantile (reorders the slice); `None` when empty.
pub fn quantile(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    Some(v[lo] + (v[hi] - v[lo]) * (pos - lo as f64))
}

/// Median by [`quantile`] (reorders the slice); `None` when empty.
pub fn median(v: &mut [f64]) -> Option<f64> {
    quantile(v, 0.5)
}

/// Median as the mean of the two middle values (reorders the slice); 0 when
/// empty. Numerically not the same as [`median`] for an even count (a
/// different rounding), which is why both exist: the what-if and pace
/// stages were built and checked on this one.
pub fn midpoint_median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Robust z-score of `x` against a group's `center` and MAD (`mad` already
/// floored by the caller: a floor is a stage's own choice).
pub fn robust_z(x: f64, center: f64, mad: f64) -> f64 {
    (x - center) / (MAD_TO_SIGMA * mad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_quantiles() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(quantile(&mut [1.0, 2.0, 3.0, 4.0, 5.0], 0.25), Some(2.0));
        assert_eq!(midpoint_median(&mut []), 0.0);
        assert_eq!(midpoint_median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn robust_z_reads_as_sigmas_for_normal_data() {
        // MAD of a normal sample is ≈ 0.6745 σ: one σ away is z ≈ 1.
        assert!((robust_z(1.0, 0.0, 0.674_5) - 1.0).abs() < 1e-3);
        assert!(robust_z(-2.0, 0.0, 1.0) < 0.0);
    }
}
