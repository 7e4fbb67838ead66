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
//! (unit tests and a proptest below).

use crate::error::{Error, Result};

/// `\x7fELF`.
const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
/// `EI_CLASS` value of a 64-bit ELF.
const ELFCLASS64: u8 = 2;
/// `EI_DATA` value of a little-endian ELF.
const ELFDATA2LSB: u8 = 1;
/// `e_machine` of NVIDIA CUDA code.
const EM_CUDA: u16 = 190;
/// Size of the ELF64 file header.
const EHDR_SIZE: usize = 64;
/// Minimum size of an ELF64 section header.
const SHDR_SIZE: usize = 64;
/// Minimum size of an ELF64 program header.
const PHDR_SIZE: usize = 56;
/// Size of an ELF64 symbol.
const SYM_SIZE: u64 = 24;
/// Sizes of ELF64 relocations without and with addend.
const REL_SIZE: u64 = 16;
const RELA_SIZE: u64 = 24;

const SHT_NULL: u32 = 0;
const SHT_SYMTAB: u32 = 2;
const SHT_STRTAB: u32 = 3;
const SHT_RELA: u32 = 4;
const SHT_DYNSYM: u32 = 11;
const SHT_NOBITS: u32 = 8;
const SHT_REL: u32 = 9;
/// Section indices from here up are reserved (`SHN_LORESERVE`): `SHN_ABS`, `SHN_COMMON`…
const SHN_LORESERVE: u16 = 0xff00;
/// `e_shstrndx` escape to extended numbering.
const SHN_XINDEX: u16 = 0xffff;
/// `e_phnum` escape to extended numbering.
const PN_XNUM: u16 = 0xffff;

/// Fatbin magic, little-endian `u32` at offset 0.
pub(crate) const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// Size of the fatbin header's fixed part.
const FATBIN_HEADER_SIZE: usize = 16;
/// Size of the fixed part of a fatbin entry header that we read.
const FATBIN_ENTRY_MIN: usize = 20;
/// Entry kind of an ELF (cubin) payload.
const FATBIN_KIND_ELF: u16 = 2;
/// Entry flags (`u64` at offset 40 of an entry header) marking a compressed payload.
const FATBIN_FLAG_COMPRESSED: u64 = 0x2000 | 0x8000;
/// Offset of the flags in an entry header.
const FATBIN_ENTRY_FLAGS_AT: usize = 40;

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

/// One section header, the fields we use.
#[derive(Clone, Copy)]
struct Section {
    name: u32,
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
    info: u32,
}

/// Validates an ELF64 cubin occupying all of `elf`.
fn validate_elf(elf: &[u8]) -> Result<()> {
    let short = || {
        invalid(format!(
            "a {}-byte ELF is shorter than its header",
            elf.len()
        ))
    };
    if elf.len() < EHDR_SIZE {
        return Err(short());
    }
    if elf[4] != ELFCLASS64 {
        return Err(invalid(format!("ELF class {} is not 64-bit (2)", elf[4])));
    }
    if elf[5] != ELFDATA2LSB {
        return Err(invalid(format!(
            "ELF data encoding {} is not little-endian (1)",
            elf[5]
        )));
    }
    let field16 = |at| u16_at(elf, at).ok_or_else(short);
    let field64 = |at| u64_at(elf, at).ok_or_else(short);
    let machine = field16(18)?;
    if machine != EM_CUDA {
        return Err(invalid(format!(
            "ELF machine {machine} is not CUDA ({EM_CUDA})"
        )));
    }
    let phoff = field64(32)?;
    let shoff = field64(40)?;
    let ehsize = field16(52)?;
    let phentsize = field16(54)?;
    let phnum = field16(56)?;
    let shentsize = field16(58)?;
    let shnum = field16(60)?;
    let shstrndx = field16(62)?;

    if usize::from(ehsize) < EHDR_SIZE || usize::from(ehsize) > elf.len() {
        return Err(invalid(format!(
            "ELF header size {ehsize} is not in {EHDR_SIZE}..={}",
            elf.len()
        )));
    }

    // Program headers: the table, then each segment's bytes in the file.
    if phnum == PN_XNUM {
        return Err(invalid(
            "ELF extended program-header numbering is not supported",
        ));
    }
    if phnum > 0 {
        if usize::from(phentsize) < PHDR_SIZE {
            return Err(invalid(format!(
                "ELF program header size {phentsize} < {PHDR_SIZE}"
            )));
        }
        let table_len = u64::from(phnum) * u64::from(phentsize);
        let table = range(elf, phoff, table_len).ok_or_else(|| {
            invalid(format!(
                "ELF program header table ({phnum} x {phentsize} bytes at {phoff}) runs past the {}-byte image",
                elf.len()
            ))
        })?;
        for i in 0..usize::from(phnum) {
            let at = i * usize::from(phentsize);
            let (off, filesz) = u64_at(table, at + 8)
                .zip(u64_at(table, at + 32))
                .ok_or_else(|| invalid("ELF program header table truncated"))?;
            if range(elf, off, filesz).is_none() {
                return Err(invalid(format!(
                    "ELF segment {i} ({filesz} bytes at {off}) runs past the {}-byte image",
                    elf.len()
                )));
            }
        }
    }

    // Section headers.
    if shnum == 0 {
        if shoff != 0 {
            return Err(invalid(
                "ELF extended section numbering (e_shnum 0 with a section table) is not supported",
            ));
        }
        if shstrndx != 0 {
            return Err(invalid(
                "ELF names a section-name table but has no sections",
            ));
        }
        return Ok(());
    }
    if shstrndx == SHN_XINDEX {
        return Err(invalid("ELF extended section-name index is not supported"));
    }
    if usize::from(shentsize) < SHDR_SIZE {
        return Err(invalid(format!(
            "ELF section header size {shentsize} < {SHDR_SIZE}"
        )));
    }
    let table_len = u64::from(shnum) * u64::from(shentsize);
    let table = range(elf, shoff, table_len).ok_or_else(|| {
        invalid(format!(
            "ELF section header table ({shnum} x {shentsize} bytes at {shoff}) runs past the {}-byte image",
            elf.len()
        ))
    })?;
    let mut sections = Vec::with_capacity(usize::from(shnum));
    for i in 0..usize::from(shnum) {
        let at = i * usize::from(shentsize);
        let truncated = || invalid("ELF section header table truncated");
        let s = Section {
            name: u32_at(table, at).ok_or_else(truncated)?,
            kind: u32_at(table, at + 4).ok_or_else(truncated)?,
            offset: u64_at(table, at + 24).ok_or_else(truncated)?,
            size: u64_at(table, at + 32).ok_or_else(truncated)?,
            link: u32_at(table, at + 40).ok_or_else(truncated)?,
            info: u32_at(table, at + 44).ok_or_else(truncated)?,
        };
        if s.kind != SHT_NULL && s.kind != SHT_NOBITS && range(elf, s.offset, s.size).is_none() {
            return Err(invalid(format!(
                "ELF section {i} ({} bytes at {}) runs past the {}-byte image",
                s.size,
                s.offset,
                elf.len()
            )));
        }
        if s.link >= u32::from(shnum) {
            return Err(invalid(format!(
                "ELF section {i} links to section {} of {shnum}",
                s.link
            )));
        }
        sections.push(s);
    }
    let contents = |s: &Section| range(elf, s.offset, s.size).unwrap_or(&[]);

    // String tables end in NUL, so no string starting inside one runs off its end.
    for (i, s) in sections.iter().enumerate() {
        if s.kind == SHT_STRTAB && s.size > 0 && contents(s).last() != Some(&0) {
            return Err(invalid(format!(
                "ELF string table {i} does not end in a NUL byte"
            )));
        }
    }
    let strtab = |index: u32, what: &str| -> Result<&[u8]> {
        match sections.get(index as usize) {
            Some(s) if s.kind == SHT_STRTAB => Ok(contents(s)),
            _ => Err(invalid(format!(
                "{what} names section {index}, which is not a string table"
            ))),
        }
    };

    // Section names.
    if shstrndx != 0 {
        if shstrndx >= shnum {
            return Err(invalid(format!(
                "ELF section-name table index {shstrndx} >= {shnum} sections"
            )));
        }
        let names = strtab(u32::from(shstrndx), "e_shstrndx")?;
        for (i, s) in sections.iter().enumerate() {
            if s.kind != SHT_NULL && s.name as usize >= names.len() {
                return Err(invalid(format!(
                    "ELF section {i}'s name offset {} is outside the {}-byte name table",
                    s.name,
                    names.len()
                )));
            }
        }
    }

    // Symbols and relocations: indices the driver follows.
    for (i, s) in sections.iter().enumerate() {
        match s.kind {
            SHT_SYMTAB | SHT_DYNSYM => {
                let names = strtab(s.link, "a symbol table")?;
                if s.size % SYM_SIZE != 0 {
                    return Err(invalid(format!(
                        "ELF symbol table {i} is {} bytes, not a multiple of {SYM_SIZE}",
                        s.size
                    )));
                }
                for sym in contents(s).chunks_exact(SYM_SIZE as usize) {
                    let name = u32_at(sym, 0).unwrap_or(u32::MAX);
                    let shndx = u16_at(sym, 6).unwrap_or(u16::MAX);
                    if name as usize >= names.len() {
                        return Err(invalid(format!(
                            "a symbol of table {i} has name offset {name} outside its {}-byte string table",
                            names.len()
                        )));
                    }
                    if shndx < SHN_LORESERVE && shndx >= shnum {
                        return Err(invalid(format!(
                            "a symbol of table {i} is in section {shndx} of {shnum}"
                        )));
                    }
                }
            }
            SHT_REL | SHT_RELA => {
                let entry = if s.kind == SHT_REL {
                    REL_SIZE
                } else {
                    RELA_SIZE
                };
                if s.info >= u32::from(shnum) {
                    return Err(invalid(format!(
                        "ELF relocation section {i} applies to section {} of {shnum}",
                        s.info
                    )));
                }
                let symtab = &sections[s.link as usize];
                if !matches!(symtab.kind, SHT_SYMTAB | SHT_DYNSYM) {
                    return Err(invalid(format!(
                        "ELF relocation section {i} links to section {}, not a symbol table",
                        s.link
                    )));
                }
                let symbols = symtab.size / SYM_SIZE;
                if s.size % entry != 0 {
                    return Err(invalid(format!(
                        "ELF relocation section {i} is {} bytes, not a multiple of {entry}",
                        s.size
                    )));
                }
                for rel in contents(s).chunks_exact(entry as usize) {
                    let sym = u64_at(rel, 8).unwrap_or(u64::MAX) >> 32;
                    if sym >= symbols {
                        return Err(invalid(format!(
                            "a relocation of section {i} names symbol {sym} of {symbols}"
                        )));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Validates a fatbin occupying a prefix of `image`.
fn validate_fatbin(image: &[u8]) -> Result<()> {
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn put16(b: &mut [u8], at: usize, v: u16) {
        b[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }
    fn put32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn put64(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }

    /// Offsets in [`synthetic_cubin`], for the corruption tests.
    pub(crate) struct Layout {
        pub shoff: usize,
        pub phoff: usize,
        pub text: usize,
        pub symtab: usize,
        pub rel: usize,
    }

    /// A small but structurally complete ELF64 CUDA image laid out as NVRTC does: header,
    /// section contents, section table, program table. Sections: NULL, `.shstrtab`,
    /// `.strtab`, `.symtab` (2 symbols), `.text.k`, `.rel.text.k` (1 relocation),
    /// `.nv.shared.k` (NOBITS, its size deliberately far larger than the file). One
    /// `PT_LOAD` segment covering `.text.k`.
    pub(crate) fn synthetic_cubin() -> (Vec<u8>, Layout) {
        let shstrtab: &[u8] =
            b"\0.shstrtab\0.strtab\0.symtab\0.text.k\0.rel.text.k\0.nv.shared.k\0";
        let strtab: &[u8] = b"\0k\0";
        let mut symtab = vec![0u8; 48];
        put32(&mut symtab, 24, 1); // "k"
        symtab[24 + 4] = 0x12; // STB_GLOBAL | STT_FUNC
        put16(&mut symtab, 24 + 6, 4); // in .text.k
        let text = [0u8; 32];
        let mut rel = vec![0u8; 16];
        put64(&mut rel, 8, (1u64 << 32) | 1); // symbol 1, type 1

        let mut b = vec![0u8; EHDR_SIZE];
        let place = |b: &mut Vec<u8>, data: &[u8]| {
            while !b.len().is_multiple_of(8) {
                b.push(0);
            }
            let off = b.len();
            b.extend_from_slice(data);
            off
        };
        let o_shstr = place(&mut b, shstrtab);
        let o_str = place(&mut b, strtab);
        let o_sym = place(&mut b, &symtab);
        let o_text = place(&mut b, &text);
        let o_rel = place(&mut b, &rel);
        // name offset, type, offset, size, link, info
        let sections: [(u32, u32, usize, usize, u32, u32); 7] = [
            (0, SHT_NULL, 0, 0, 0, 0),
            (1, SHT_STRTAB, o_shstr, shstrtab.len(), 0, 0),
            (11, SHT_STRTAB, o_str, strtab.len(), 0, 0),
            (19, SHT_SYMTAB, o_sym, symtab.len(), 2, 1),
            (27, 1, o_text, text.len(), 0, 0),
            (35, SHT_REL, o_rel, rel.len(), 3, 4),
            (47, SHT_NOBITS, 0, 1 << 40, 0, 0),
        ];
        let mut table = vec![0u8; sections.len() * SHDR_SIZE];
        for (i, &(name, kind, off, size, link, info)) in sections.iter().enumerate() {
            let at = i * SHDR_SIZE;
            put32(&mut table, at, name);
            put32(&mut table, at + 4, kind);
            put64(&mut table, at + 24, off as u64);
            put64(&mut table, at + 32, size as u64);
            put32(&mut table, at + 40, link);
            put32(&mut table, at + 44, info);
        }
        let shoff = place(&mut b, &table);
        let mut ph = vec![0u8; PHDR_SIZE];
        put32(&mut ph, 0, 1); // PT_LOAD
        put64(&mut ph, 8, o_text as u64);
        put64(&mut ph, 32, text.len() as u64);
        put64(&mut ph, 40, text.len() as u64);
        let phoff = place(&mut b, &ph);

        b[..4].copy_from_slice(&ELF_MAGIC);
        b[4] = ELFCLASS64;
        b[5] = ELFDATA2LSB;
        b[6] = 1; // EV_CURRENT
        b[7] = 0x33; // ELFOSABI_CUDA, as NVRTC writes
        put16(&mut b, 16, 2); // ET_EXEC
        put16(&mut b, 18, EM_CUDA);
        put32(&mut b, 20, 1);
        put64(&mut b, 32, phoff as u64);
        put64(&mut b, 40, shoff as u64);
        put16(&mut b, 52, EHDR_SIZE as u16);
        put16(&mut b, 54, PHDR_SIZE as u16);
        put16(&mut b, 56, 1);
        put16(&mut b, 58, SHDR_SIZE as u16);
        put16(&mut b, 60, sections.len() as u16);
        put16(&mut b, 62, 1);
        let layout = Layout {
            shoff,
            phoff,
            text: o_text,
            symtab: o_sym,
            rel: o_rel,
        };
        (b, layout)
    }

    /// A fatbin with one uncompressed ELF entry holding `elf`, and a second PTX entry.
    pub(crate) fn synthetic_fatbin(elf: &[u8]) -> Vec<u8> {
        let entry = |kind: u16, payload: &[u8]| {
            let padded = payload.len().div_ceil(8) * 8;
            let mut e = vec![0u8; 64];
            put16(&mut e, 0, kind);
            put16(&mut e, 2, 0x101);
            put32(&mut e, 4, 64);
            put64(&mut e, 8, padded as u64);
            put32(&mut e, 16, payload.len() as u32);
            put32(&mut e, 28, 90); // sm_90
            put64(&mut e, 40, 0x11); // 64-bit, Linux
            e.extend_from_slice(payload);
            e.resize(64 + padded, 0);
            e
        };
        let mut body = entry(FATBIN_KIND_ELF, elf);
        body.extend(entry(
            1,
            b".version 8.0\n.target sm_90\n.address_size 64\n\0",
        ));
        let mut b = vec![0u8; FATBIN_HEADER_SIZE];
        put32(&mut b, 0, FATBIN_MAGIC);
        put16(&mut b, 4, 1);
        put16(&mut b, 6, FATBIN_HEADER_SIZE as u16);
        put64(&mut b, 8, body.len() as u64);
        b.extend(body);
        b
    }

    fn rejected(image: &[u8], needle: &str) {
        match validate(image) {
            Err(Error::InvalidArgument(m)) => assert!(
                m.contains(needle),
                "expected an error mentioning {needle:?}, got {m:?}"
            ),
            other => panic!("expected InvalidArgument mentioning {needle:?}, got {other:?}"),
        }
    }

    #[test]
    fn synthetic_images_pass() {
        let (elf, _) = synthetic_cubin();
        assert_eq!(validate(&elf).unwrap(), ImageKind::Cubin);
        // Trailing bytes past everything the headers describe are harmless.
        let mut padded = elf.clone();
        padded.extend_from_slice(&[0xAA; 100]);
        assert_eq!(validate(&padded).unwrap(), ImageKind::Cubin);
        assert_eq!(
            validate(&synthetic_fatbin(&elf)).unwrap(),
            ImageKind::Fatbin
        );
    }

    #[test]
    fn other_formats_are_rejected() {
        rejected(b"", "neither an ELF64 cubin");
        rejected(&[0u8; 64], "neither an ELF64 cubin");
        rejected(b".version 8.0\n.target sm_90\n", "load_ptx");
        rejected(b"\x7fEL", "neither");
    }

    #[test]
    fn truncated_elf_is_rejected_at_every_length() {
        let (elf, l) = synthetic_cubin();
        for len in 0..elf.len() {
            let cut = &elf[..len];
            assert!(
                validate(cut).is_err(),
                "a cubin cut to {len} of {} bytes passed (section table at {}, program table at {})",
                elf.len(),
                l.shoff,
                l.phoff
            );
        }
    }

    #[test]
    fn corrupt_elf_headers_are_rejected() {
        let (elf, l) = synthetic_cubin();
        let with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = elf.clone();
            f(&mut b);
            b
        };
        rejected(&with(&|b| b[4] = 1), "not 64-bit");
        rejected(&with(&|b| b[5] = 2), "little-endian");
        rejected(&with(&|b| put16(b, 18, 62)), "not CUDA");
        rejected(&with(&|b| put16(b, 52, 10)), "header size");
        // Section table: past the end, overflowing, huge count, tiny entries.
        rejected(
            &with(&|b| put64(b, 40, elf.len() as u64)),
            "section header table",
        );
        rejected(
            &with(&|b| put64(b, 40, u64::MAX - 8)),
            "section header table",
        );
        rejected(&with(&|b| put16(b, 60, u16::MAX)), "section header table");
        rejected(&with(&|b| put16(b, 58, u16::MAX)), "section header table");
        rejected(&with(&|b| put16(b, 58, 8)), "section header size");
        rejected(&with(&|b| put16(b, 60, 0)), "extended section numbering");
        rejected(&with(&|b| put16(b, 62, 0xffff)), "extended section-name");
        rejected(&with(&|b| put16(b, 62, 9)), "section-name table index");
        rejected(&with(&|b| put16(b, 62, 4)), "not a string table");
        // Program table.
        rejected(&with(&|b| put64(b, 32, u64::MAX)), "program header table");
        rejected(&with(&|b| put16(b, 56, 0xfffe)), "program header table");
        rejected(&with(&|b| put16(b, 56, 0xffff)), "extended program-header");
        rejected(&with(&|b| put16(b, 54, 4)), "program header size");
        rejected(&with(&|b| put64(b, l.phoff + 32, 1 << 20)), "segment 0");
        rejected(&with(&|b| put64(b, l.phoff + 8, u64::MAX)), "segment 0");
    }

    #[test]
    fn corrupt_sections_are_rejected() {
        let (elf, l) = synthetic_cubin();
        let sh = |i: usize, field: usize| l.shoff + i * SHDR_SIZE + field;
        let with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = elf.clone();
            f(&mut b);
            b
        };
        // .text.k (section 4) past the end, or overflowing.
        rejected(
            &with(&|b| put64(b, sh(4, 24), elf.len() as u64)),
            "section 4",
        );
        rejected(&with(&|b| put64(b, sh(4, 32), u64::MAX)), "section 4");
        rejected(&with(&|b| put64(b, sh(4, 24), u64::MAX)), "section 4");
        // A NOBITS section may be any size; a PROGBITS one of that size may not.
        rejected(&with(&|b| put32(b, sh(6, 4), 1)), "section 6");
        // Links, names, string tables.
        rejected(&with(&|b| put32(b, sh(3, 40), 7)), "links to section 7");
        rejected(&with(&|b| put32(b, sh(3, 40), 4)), "not a string table");
        rejected(&with(&|b| put32(b, sh(4, 0), 1000)), "name offset");
        rejected(
            &with(&|b| {
                let strtab_off = u64_at(b, sh(2, 24)).unwrap() as usize;
                let strtab_len = u64_at(b, sh(2, 32)).unwrap() as usize;
                b[strtab_off + strtab_len - 1] = b'x';
            }),
            "does not end in a NUL",
        );
        // Symbols.
        rejected(&with(&|b| put32(b, l.symtab + 24, 99)), "name offset 99");
        rejected(&with(&|b| put16(b, l.symtab + 24 + 6, 50)), "section 50");
        rejected(&with(&|b| put64(b, sh(3, 32), 47)), "not a multiple");
        // Relocations.
        rejected(&with(&|b| put64(b, l.rel + 8, 5u64 << 32)), "symbol 5");
        rejected(&with(&|b| put32(b, sh(5, 44), 70)), "applies to section 70");
        rejected(&with(&|b| put32(b, sh(5, 40), 2)), "not a symbol table");
        rejected(&with(&|b| put64(b, sh(5, 32), 15)), "not a multiple");
        // An empty string table cannot hold even the empty name.
        rejected(&with(&|b| put64(b, sh(2, 32), 0)), "name offset 0");
        // A zero-length section or segment may point anywhere: nothing is read.
        let ok = with(&|b| {
            put64(b, sh(4, 32), 0);
            put64(b, sh(4, 24), u64::MAX);
            put64(b, l.phoff + 8, u64::MAX);
            put64(b, l.phoff + 32, 0);
        });
        assert_eq!(validate(&ok).unwrap(), ImageKind::Cubin);
        let _ = l.text;
    }

    #[test]
    fn corrupt_fatbins_are_rejected() {
        let (elf, _) = synthetic_cubin();
        let fat = synthetic_fatbin(&elf);
        let with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = fat.clone();
            f(&mut b);
            b
        };
        for len in 0..fat.len() {
            assert!(
                validate(&fat[..len]).is_err(),
                "a fatbin cut to {len} of {} bytes passed",
                fat.len()
            );
        }
        rejected(&with(&|b| put64(b, 8, fat.len() as u64)), "run past");
        rejected(&with(&|b| put64(b, 8, u64::MAX)), "run past");
        rejected(&with(&|b| put16(b, 6, 8)), "header size 8");
        rejected(&with(&|b| put16(b, 6, u16::MAX)), "run past");
        rejected(&with(&|b| put16(b, 4, 2)), "version 2");
        // First entry (at 16): header size, payload size, and the ELF inside.
        rejected(&with(&|b| put32(b, 16 + 4, u32::MAX)), "header size");
        rejected(&with(&|b| put32(b, 16 + 4, 4)), "header size 4");
        rejected(&with(&|b| put64(b, 16 + 8, u64::MAX)), "payload");
        rejected(&with(&|b| put64(b, 16 + 8, 1 << 20)), "payload");
        rejected(&with(&|b| put32(b, 16 + 16, u32::MAX)), "payload size");
        rejected(
            &with(&|b| put16(b, 16 + 64 + 60, u16::MAX)),
            "fatbin entry 0",
        );
        // A shorter fat size that ends inside the second entry's header.
        rejected(
            &with(&|b| {
                let first = 64 + elf.len().div_ceil(8) * 8;
                put64(b, 8, first as u64 + 8);
            }),
            "entry 1",
        );
    }

    #[test]
    fn compressed_elf_entries_are_bounded_not_parsed() {
        let (elf, _) = synthetic_cubin();
        let mut fat = synthetic_fatbin(&elf);
        // Mark entry 0 compressed (LZ4) and scribble over its payload: still accepted, as
        // the driver decompresses it into its own buffer.
        put64(&mut fat, 16 + 40, 0x11 | 0x2000);
        fat[16 + 64] = 0;
        assert_eq!(validate(&fat).unwrap(), ImageKind::Fatbin);
    }
}

#[cfg(test)]
mod proptests {
    use super::tests::{synthetic_cubin, synthetic_fatbin};
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = validate(&bytes);
        }

        #[test]
        fn random_bytes_behind_a_magic_never_panic(
            elf in any::<bool>(),
            bytes in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let mut b = if elf {
                vec![0x7f, b'E', b'L', b'F', 2, 1]
            } else {
                FATBIN_MAGIC.to_le_bytes().to_vec()
            };
            b.extend(bytes);
            let _ = validate(&b);
        }

        #[test]
        fn truncated_or_mutated_valid_images_never_panic(
            fatbin in any::<bool>(),
            cut in any::<prop::sample::Index>(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        ) {
            let (elf, _) = synthetic_cubin();
            let mut b = if fatbin { synthetic_fatbin(&elf) } else { elf };
            for (at, v) in flips {
                let i = at.index(b.len());
                b[i] = v;
            }
            let len = cut.index(b.len() + 1);
            let _ = validate(&b[..len]);
        }

        #[test]
        fn truncated_valid_images_never_validate(
            fatbin in any::<bool>(),
            cut in any::<prop::sample::Index>(),
        ) {
            // The synthetic images need every byte (their last table ends the file).
            let (elf, _) = synthetic_cubin();
            let b = if fatbin { synthetic_fatbin(&elf) } else { elf };
            let len = cut.index(b.len());
            prop_assert!(validate(&b[..len]).is_err());
        }
    }
}
