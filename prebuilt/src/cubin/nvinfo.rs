//! `.nv.info.<function>` sections: the attribute records that give each entry's parameter
//! sizes (`EIATTR_KPARAM_INFO`) and their total (`EIATTR_CBANK_PARAM_SIZE`).

use super::*;

/// One record of an `.nv.info` section.
#[derive(Debug)]
pub(super) struct Attribute<'data> {
    pub(super) format: u8,
    pub(super) attribute: u8,
    /// The value: nothing for NVAL, one byte for BVAL, two for HVAL, the payload for SVAL.
    pub(super) value: &'data [u8],
}

/// Splits an `.nv.info` section into its records.
pub(super) fn attributes(section: &[u8]) -> Result<Vec<Attribute<'_>>, String> {
    let mut records = Vec::new();
    let mut rest = section;
    while !rest.is_empty() {
        let at = section.len() - rest.len();
        let Some(&[format, attribute, low, high]) = rest.get(..4) else {
            return Err(format!(
                "attribute record at byte {at} is cut short ({} bytes left)",
                rest.len()
            ));
        };
        let (value, length) = match format {
            EIFMT_NVAL => (&rest[..0], 4),
            EIFMT_BVAL => (&rest[2..3], 4),
            EIFMT_HVAL => (&rest[2..4], 4),
            EIFMT_SVAL => {
                let size = usize::from(u16::from_le_bytes([low, high]));
                let Some(value) = rest.get(4..4 + size) else {
                    return Err(format!(
                        "attribute {attribute:#04x} at byte {at} claims {size} bytes but only {} \
                         remain",
                        rest.len() - 4
                    ));
                };
                (value, 4 + size)
            }
            _ => {
                return Err(format!(
                    "attribute {attribute:#04x} at byte {at} has unknown format {format:#04x}"
                ))
            }
        };
        records.push(Attribute {
            format,
            attribute,
            value,
        });
        rest = rest.get(length..).unwrap_or_default();
    }
    Ok(records)
}

/// One parameter as an `EIATTR_KPARAM_INFO(_V2)` record describes it.
#[derive(Debug)]
pub(super) struct KernelParameter {
    ordinal: u16,
    offset: u16,
    size: u32,
}

impl KernelParameter {
    fn parse(attribute: u8, value: &[u8]) -> Option<Self> {
        let value: &[u8; 12] = value.try_into().ok()?;
        let [_, _, _, _, o0, o1, f0, f1, s0, s1, s2, s3] = *value;
        let word = u32::from_le_bytes([s0, s1, s2, s3]);
        let size = match attribute {
            EIATTR_KPARAM_INFO => word >> 18,
            EIATTR_KPARAM_INFO_V2 => word & 0xffff,
            _ => return None,
        };
        Some(KernelParameter {
            ordinal: u16::from_le_bytes([o0, o1]),
            offset: u16::from_le_bytes([f0, f1]),
            size,
        })
    }
}

/// The parameter sizes, in ordinal order, from a kernel's `.nv.info.<symbol>` section.
pub(super) fn parameter_sizes(symbol: &str, section: &[u8]) -> Result<Vec<u32>, CubinError> {
    let in_section = |what: String| malformed(format!("in `.nv.info.{symbol}`: {what}"));
    let mut parameters = Vec::new();
    let mut block_size = None;
    for record in attributes(section).map_err(in_section)? {
        match (record.format, record.attribute) {
            (EIFMT_SVAL, EIATTR_KPARAM_INFO | EIATTR_KPARAM_INFO_V2) => {
                let parameter =
                    KernelParameter::parse(record.attribute, record.value).ok_or_else(|| {
                        in_section(format!(
                            "parameter record {:#04x} is {} bytes, not 12",
                            record.attribute,
                            record.value.len()
                        ))
                    })?;
                parameters.push(parameter);
            }
            (EIFMT_HVAL, EIATTR_CBANK_PARAM_SIZE) => {
                if let &[low, high] = record.value {
                    block_size = Some(u32::from(u16::from_le_bytes([low, high])));
                }
            }
            _ => {}
        }
    }

    parameters.sort_by_key(|parameter| parameter.ordinal);
    let ordinals_ok = parameters
        .iter()
        .enumerate()
        .all(|(index, parameter)| usize::from(parameter.ordinal) == index);
    if !ordinals_ok {
        let ordinals: Vec<u16> = parameters
            .iter()
            .map(|parameter| parameter.ordinal)
            .collect();
        return Err(in_section(format!(
            "parameter ordinals are {ordinals:?}, not 0 to {}",
            parameters.len().saturating_sub(1)
        )));
    }
    if let Some(block_size) = block_size {
        let end = parameters
            .iter()
            .map(|parameter| u32::from(parameter.offset) + parameter.size)
            .max()
            .unwrap_or(0);
        if parameters.is_empty() && block_size > 0 {
            return Err(in_section(format!(
                "a {block_size}-byte parameter block but no parameter records"
            )));
        }
        if end > block_size {
            return Err(in_section(format!(
                "parameters end at byte {end} of a {block_size}-byte parameter block"
            )));
        }
    }
    Ok(parameters.iter().map(|parameter| parameter.size).collect())
}
