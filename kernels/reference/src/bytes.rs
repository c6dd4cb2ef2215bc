//! Little-endian byte images of device buffers, the form [`crate::Arg::Input`] takes and
//! [`crate::Case::check`] receives.

/// The bytes of `values`, little-endian.
pub fn from_f32s(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|value| value.to_le_bytes())
        .collect()
}

/// The bytes of bf16 (or any 16-bit) `values`, little-endian.
pub fn from_u16s(values: &[u16]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|value| value.to_le_bytes())
        .collect()
}

/// Reads `bytes` as little-endian f32 values; `None` if the length is not a multiple of 4.
pub fn to_f32s(bytes: &[u8]) -> Option<Vec<f32>> {
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(4)
            .map(|chunk| f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]))
            .collect(),
    )
}

/// Reads `bytes` as little-endian u16 values; `None` if the length is odd.
pub fn to_u16s(bytes: &[u8]) -> Option<Vec<u16>> {
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(2)
            .map(|chunk| u16::from_le_bytes([chunk[0], chunk[1]]))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_survive_a_round_trip() {
        let floats = [1.0f32, -2.5, f32::MIN_POSITIVE];
        assert_eq!(to_f32s(&from_f32s(&floats)).unwrap(), floats);
        assert_eq!(from_f32s(&[1.0]), [0x00, 0x00, 0x80, 0x3f]);
        let halves = [0x3f80u16, 0xffff];
        assert_eq!(to_u16s(&from_u16s(&halves)).unwrap(), halves);
        assert_eq!(from_u16s(&[0x3f80]), [0x80, 0x3f]);
    }

    #[test]
    fn ragged_lengths_are_refused() {
        assert_eq!(to_f32s(&[0; 6]), None);
        assert_eq!(to_u16s(&[0; 3]), None);
    }
}
