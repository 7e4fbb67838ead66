//! Validation of cubin and fatbin images before the driver sees them.
//!
//! `cuModuleLoadData` takes a bare pointer: the driver learns how long the image is from
//! the image's own headers. A safe `load_cubin(&[u8])` must therefore make sure those
//! headers describe nothing outside the slice, or a few corrupt bytes become an
//! out-of-bounds read of host memory. [`validate`] accepts two formats and rejects
//! everything else with [`Error::InvalidArgument`]:
//!
//! * **ELF64 cubins** (what NVRTC and `nvcc -cubin` produce): little-endian, 64-bit,
//!   `e_machine == EM_CUDA`. The ELF header, the section header table and the program
//!   header table lie inside the slice; so does every section's contents (except
//!   `SHT_NOBITS`, which has none in the file) and every segment's file image. On top of
//!   the layout, the references the ELF format defines between those tables are checked,
//!   since a driver follows them as indices into the slice: `e_shstrndx`, each section's
//!   name offset, `sh_link` (and `sh_info` of relocation sections) are in range; string
//!   tables end in a NUL (so no string read runs off their end); each symbol's name is
//!   inside its string table and its section index in range; each relocation's symbol
//!   index is inside its symbol table. Extended numbering (`e_shnum == 0` with a section
//!   table, `e_phnum == 0xffff`, `e_shstrndx == 0xffff`), which no cubin needs, is refused.
//! * **Fatbins** (`0xBA55ED50`): the header (`u32 magic`, `u16 version`,
//!   `u16 header_size`, `u64 fat_size`) and the `fat_size` bytes after it lie inside the
//!   slice; inside them, each entry's fixed header (`u16 kind`, `u16 version`,
//!   `u32 header_size`, `u64 padded_size`, then `u32 payload_size`) and payload lie inside
//!   the fat region. An uncompressed ELF entry is validated as a cubin, bounded by its
//!   payload.
//!
//! What this does *not* check: the contents of NVIDIA-specific sections (`.nv.info`
//! attribute records, constant banks, code) and compressed fatbin payloads, which the
//! driver decompresses into its own buffer. Those are read by the driver inside bounds
//! this module has established (a section, a payload); their internal consistency is the
//! driver's to check, as for any image it loads. PTX text goes through `load_ptx`, which
//! passes a NUL-terminated copy.
//!
//! Every offset computation uses checked arithmetic; no input makes [`validate`] panic
//! (the `tests` and `proptests` submodules).

mod elf;
mod fatbin;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

use crate::error::{Error, Result};
use elf::{ELF_MAGIC, validate_elf};
use fatbin::{FATBIN_MAGIC, validate_fatbin};

/// Which kind of image [`validate`] accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ImageKind {
    /// An ELF64 cubin.
    Cubin,
    /// A fatbin.
    Fatbin,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(format!("load_cubin: {}", msg.into()))
}

/// Little-endian reads that fail instead of panicking.
fn bytes<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}
fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    bytes(b, at).map(u16::from_le_bytes)
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    bytes(b, at).map(u32::from_le_bytes)
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    bytes(b, at).map(u64::from_le_bytes)
}

/// `b[off .. off + len]`, if it lies inside `b`. Zero bytes lie inside any slice, at
/// any offset: nothing is read.
fn range(b: &[u8], off: u64, len: u64) -> Option<&[u8]> {
    if len == 0 {
        return Some(&[]);
    }
    let start = usize::try_from(off).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    b.get(start..end)
}

/// Checks `image` and says what it is; see the module docs for what is checked.
pub(crate) fn validate(image: &[u8]) -> Result<ImageKind> {
    if image.starts_with(&ELF_MAGIC) {
        validate_elf(image)?;
        return Ok(ImageKind::Cubin);
    }
    if u32_at(image, 0) == Some(FATBIN_MAGIC) {
        validate_fatbin(image)?;
        return Ok(ImageKind::Fatbin);
    }
    if image.starts_with(b"//") || image.starts_with(b".version") || image.starts_with(b"\n") {
        return Err(invalid(
            "this looks like PTX text; load it with `load_ptx` (cubins are ELF, fatbins start with 0xBA55ED50)",
        ));
    }
    Err(invalid(format!(
        "a {}-byte image that is neither an ELF64 cubin (\\x7fELF) nor a fatbin (0xBA55ED50); PTX goes through `load_ptx`",
        image.len()
    )))
}
