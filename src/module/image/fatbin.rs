//! The fatbin container: its header, its entries, and the ELF inside uncompressed ones.

use super::elf::validate_elf;
use super::{invalid, range, u16_at, u32_at, u64_at};
use crate::error::{Error, Result};

/// Fatbin magic, little-endian `u32` at offset 0.
pub(super) const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// Size of the fatbin header's fixed part.
pub(super) const FATBIN_HEADER_SIZE: usize = 16;
/// Size of the fixed part of a fatbin entry header that we read.
pub(super) const FATBIN_ENTRY_MIN: usize = 20;
/// Entry kind of an ELF (cubin) payload.
pub(super) const FATBIN_KIND_ELF: u16 = 2;
/// Entry flags (`u64` at offset 40 of an entry header) marking a compressed payload.
pub(super) const FATBIN_FLAG_COMPRESSED: u64 = 0x2000 | 0x8000;
/// Offset of the flags in an entry header.
pub(super) const FATBIN_ENTRY_FLAGS_AT: usize = 40;

/// Validates a fatbin occupying a prefix of `image`.
pub(super) fn validate_fatbin(image: &[u8]) -> Result<()> {
    let short = || {
        invalid(format!(
            "a {}-byte fatbin is shorter than its {FATBIN_HEADER_SIZE}-byte header",
            image.len()
        ))
    };
    let version = u16_at(image, 4).ok_or_else(short)?;
    let header_size = u16_at(image, 6).ok_or_else(short)?;
    let fat_size = u64_at(image, 8).ok_or_else(short)?;
    if version != 1 {
        return Err(invalid(format!("fatbin version {version} is not 1")));
    }
    if usize::from(header_size) < FATBIN_HEADER_SIZE {
        return Err(invalid(format!(
            "fatbin header size {header_size} < {FATBIN_HEADER_SIZE}"
        )));
    }
    let fat = Some(())
        .filter(|_| usize::from(header_size) <= image.len())
        .and_then(|_| range(image, u64::from(header_size), fat_size))
        .ok_or_else(|| {
        invalid(format!(
            "fatbin header ({header_size} bytes) plus contents ({fat_size} bytes) run past the {}-byte image",
            image.len()
        ))
    })?;
    // Entries follow each other until the end of the fat region.
    let mut at = 0usize;
    let mut index = 0usize;
    while at < fat.len() {
        let entry = &fat[at..];
        let truncated = || {
            invalid(format!(
                "fatbin entry {index} at offset {at}: its header runs past the contents"
            ))
        };
        let kind = u16_at(entry, 0).ok_or_else(truncated)?;
        let entry_header = u32_at(entry, 4).ok_or_else(truncated)?;
        let padded = u64_at(entry, 8).ok_or_else(truncated)?;
        let payload_size = u32_at(entry, 16).ok_or_else(truncated)?;
        if (entry_header as usize) < FATBIN_ENTRY_MIN || entry_header as usize > entry.len() {
            return Err(invalid(format!(
                "fatbin entry {index}: header size {entry_header} is not in {FATBIN_ENTRY_MIN}..={}",
                entry.len()
            )));
        }
        let payload = range(entry, u64::from(entry_header), padded).ok_or_else(|| {
            invalid(format!(
                "fatbin entry {index}: {padded}-byte payload after a {entry_header}-byte header runs past the contents"
            ))
        })?;
        if u64::from(payload_size) > padded {
            return Err(invalid(format!(
                "fatbin entry {index}: payload size {payload_size} > its padded size {padded}"
            )));
        }
        let flags = u64_at(entry, FATBIN_ENTRY_FLAGS_AT)
            .filter(|_| entry_header as usize >= FATBIN_ENTRY_FLAGS_AT + 8)
            .unwrap_or(0);
        if kind == FATBIN_KIND_ELF && flags & FATBIN_FLAG_COMPRESSED == 0 {
            let elf = payload.get(..payload_size as usize).unwrap_or(payload);
            validate_elf(elf).map_err(|e| match e {
                Error::InvalidArgument(m) => {
                    Error::InvalidArgument(format!("{m} (in the ELF of fatbin entry {index})"))
                }
                other => other,
            })?;
        }
        // `entry_header + padded <= entry.len()`, so this cannot overflow or pass the end.
        at += entry_header as usize + payload.len();
        index += 1;
    }
    Ok(())
}
