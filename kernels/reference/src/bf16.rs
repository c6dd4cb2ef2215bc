//! bf16 values as raw `u16` bit patterns, converted the way the kernels convert them.
//!
//! The kernels round with `__float2bfloat16_rn`: round to nearest, ties to even, and every
//! NaN becomes the canonical `0x7FFF`. [`from_f32`] reproduces that bit for bit, so a CPU
//! reference rounds exactly where and how its kernel does.

/// Converts `value` to bf16, rounding to nearest with ties to even.
pub fn from_f32(value: f32) -> u16 {
    if value.is_nan() {
        return 0x7fff;
    }
    let bits = value.to_bits();
    // Adding 0x7fff rounds the dropped half up when it is above one half; the extra lowest
    // kept bit breaks an exact tie towards the even neighbour. Cannot overflow: the largest
    // non-NaN pattern is -inf, 0xff80_0000.
    let rounding_bias = 0x7fff + ((bits >> 16) & 1);
    ((bits + rounding_bias) >> 16) as u16
}

/// Widens a bf16 to f32; exact, since bf16 is the top half of an f32.
pub fn to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// `value` rounded to the nearest bf16, as an f32.
pub fn round(value: f32) -> f32 {
    to_f32(from_f32(value))
}

/// Converts every element with [`from_f32`].
pub fn from_f32_slice(values: &[f32]) -> Vec<u16> {
    values.iter().copied().map(from_f32).collect()
}

/// Widens every element with [`to_f32`].
pub fn to_f32_slice(values: &[u16]) -> Vec<f32> {
    values.iter().copied().map(to_f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_values_convert_both_ways() {
        for (value, bits) in [
            (1.0f32, 0x3f80u16),
            (-2.0, 0xc000),
            (0.5, 0x3f00),
            (0.0, 0x0000),
            (-0.0, 0x8000),
            (f32::INFINITY, 0x7f80),
            (f32::NEG_INFINITY, 0xff80),
        ] {
            assert_eq!(from_f32(value), bits, "{value}");
            assert_eq!(to_f32(bits).to_bits(), value.to_bits(), "{bits:#06x}");
        }
    }

    #[test]
    fn ties_round_to_even() {
        // 1 + 2^-8 lies exactly between 1.0 (0x3F80, even) and 1 + 2^-7 (0x3F81, odd).
        assert_eq!(from_f32(f32::from_bits(0x3f80_8000)), 0x3f80);
        // 1 + 3 * 2^-8 lies between 0x3F81 (odd) and 0x3F82 (even).
        assert_eq!(from_f32(f32::from_bits(0x3f81_8000)), 0x3f82);
    }

    #[test]
    fn non_ties_round_to_nearest() {
        assert_eq!(from_f32(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(from_f32(f32::from_bits(0x3f80_7fff)), 0x3f80);
        // pi = 0x40490FDB: the dropped half 0x0FDB is below one half.
        assert_eq!(from_f32(std::f32::consts::PI), 0x4049);
    }

    #[test]
    fn the_largest_values_round_to_infinity() {
        assert_eq!(from_f32(f32::MAX), 0x7f80);
        assert_eq!(from_f32(-f32::MAX), 0xff80);
    }

    #[test]
    fn nan_becomes_the_canonical_nan() {
        assert_eq!(from_f32(f32::NAN), 0x7fff);
        assert_eq!(from_f32(f32::from_bits(0xffc0_0001)), 0x7fff);
        assert!(to_f32(0x7fff).is_nan());
    }

    #[test]
    fn round_is_idempotent() {
        let value = round(1.234_567);
        assert_eq!(value, 1.234_375);
        assert_eq!(round(value), value);
    }
}
