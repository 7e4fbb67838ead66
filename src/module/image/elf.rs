//! ELF64 cubins: the header, the program and section header tables, and the references
//! between sections (names, string tables, symbols, relocations) that a driver follows.

use super::{invalid, range, u16_at, u32_at, u64_at};
use crate::error::Result;

/// `\x7fELF`.
pub(super) const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
/// `EI_CLASS` value of a 64-bit ELF.
pub(super) const ELFCLASS64: u8 = 2;
/// `EI_DATA` value of a little-endian ELF.
pub(super) const ELFDATA2LSB: u8 = 1;
/// `e_machine` of NVIDIA CUDA code.
pub(super) const EM_CUDA: u16 = 190;
/// Size of the ELF64 file header.
pub(super) const EHDR_SIZE: usize = 64;
/// Minimum size of an ELF64 section header.
pub(super) const SHDR_SIZE: usize = 64;
/// Minimum size of an ELF64 program header.
pub(super) const PHDR_SIZE: usize = 56;
/// Size of an ELF64 symbol.
pub(super) const SYM_SIZE: u64 = 24;
/// Sizes of ELF64 relocations without and with addend.
pub(super) const REL_SIZE: u64 = 16;
pub(super) const RELA_SIZE: u64 = 24;

pub(super) const SHT_NULL: u32 = 0;
pub(super) const SHT_SYMTAB: u32 = 2;
pub(super) const SHT_STRTAB: u32 = 3;
pub(super) const SHT_RELA: u32 = 4;
pub(super) const SHT_DYNSYM: u32 = 11;
pub(super) const SHT_NOBITS: u32 = 8;
pub(super) const SHT_REL: u32 = 9;
/// Section indices from here up are reserved (`SHN_LORESERVE`): `SHN_ABS`, `SHN_COMMON`…
pub(super) const SHN_LORESERVE: u16 = 0xff00;
/// `e_shstrndx` escape to extended numbering.
pub(super) const SHN_XINDEX: u16 = 0xffff;
/// `e_phnum` escape to extended numbering.
pub(super) const PN_XNUM: u16 = 0xffff;

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

/// The ELF64 file header fields that locate the tables.
struct Header {
    phoff: u64,
    shoff: u64,
    phentsize: u16,
    phnum: u16,
    shentsize: u16,
    shnum: u16,
    shstrndx: u16,
}

/// The section table of a cubin whose sections all lie inside it.
struct Sections<'a> {
    elf: &'a [u8],
    list: Vec<Section>,
    shnum: u16,
}

/// Validates an ELF64 cubin occupying all of `elf`.
pub(super) fn validate_elf(elf: &[u8]) -> Result<()> {
    let header = read_header(elf)?;
    check_segments(elf, &header)?;
    if header.shnum == 0 {
        return check_no_sections(&header);
    }
    let sections = read_sections(elf, &header)?;
    sections.check_string_tables()?;
    sections.check_section_names(header.shstrndx)?;
    sections.check_symbols_and_relocations()
}

/// Reads the file header: identification, machine, table locations and sizes.
fn read_header(elf: &[u8]) -> Result<Header> {
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
    let header = Header {
        phoff: field64(32)?,
        shoff: field64(40)?,
        phentsize: field16(54)?,
        phnum: field16(56)?,
        shentsize: field16(58)?,
        shnum: field16(60)?,
        shstrndx: field16(62)?,
    };
    let ehsize = field16(52)?;
    if usize::from(ehsize) < EHDR_SIZE || usize::from(ehsize) > elf.len() {
        return Err(invalid(format!(
            "ELF header size {ehsize} is not in {EHDR_SIZE}..={}",
            elf.len()
        )));
    }
    Ok(header)
}

/// Program headers: the table, then each segment's bytes in the file.
fn check_segments(elf: &[u8], header: &Header) -> Result<()> {
    let Header {
        phoff,
        phentsize,
        phnum,
        ..
    } = *header;
    if phnum == PN_XNUM {
        return Err(invalid(
            "ELF extended program-header numbering is not supported",
        ));
    }
    if phnum == 0 {
        return Ok(());
    }
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
    Ok(())
}

/// An ELF without sections: nothing may refer to a section table.
fn check_no_sections(header: &Header) -> Result<()> {
    if header.shoff != 0 {
        return Err(invalid(
            "ELF extended section numbering (e_shnum 0 with a section table) is not supported",
        ));
    }
    if header.shstrndx != 0 {
        return Err(invalid(
            "ELF names a section-name table but has no sections",
        ));
    }
    Ok(())
}

/// Reads the section header table (`header.shnum > 0`): each section's contents lie inside
/// `elf` and its link names a section.
fn read_sections<'a>(elf: &'a [u8], header: &Header) -> Result<Sections<'a>> {
    let Header {
        shoff,
        shentsize,
        shnum,
        shstrndx,
        ..
    } = *header;
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
    let mut list = Vec::with_capacity(usize::from(shnum));
    for i in 0..usize::from(shnum) {
        let s = read_section(table, i * usize::from(shentsize))?;
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
        list.push(s);
    }
    Ok(Sections { elf, list, shnum })
}

/// The section header at `at` in the section header table.
fn read_section(table: &[u8], at: usize) -> Result<Section> {
    let truncated = || invalid("ELF section header table truncated");
    Ok(Section {
        name: u32_at(table, at).ok_or_else(truncated)?,
        kind: u32_at(table, at + 4).ok_or_else(truncated)?,
        offset: u64_at(table, at + 24).ok_or_else(truncated)?,
        size: u64_at(table, at + 32).ok_or_else(truncated)?,
        link: u32_at(table, at + 40).ok_or_else(truncated)?,
        info: u32_at(table, at + 44).ok_or_else(truncated)?,
    })
}

impl<'a> Sections<'a> {
    /// The bytes of `s` in the file (none for `SHT_NOBITS` and `SHT_NULL`).
    fn contents(&self, s: &Section) -> &'a [u8] {
        range(self.elf, s.offset, s.size).unwrap_or(&[])
    }

    /// The contents of string table `index`, which `what` names.
    fn strtab(&self, index: u32, what: &str) -> Result<&'a [u8]> {
        match self.list.get(index as usize) {
            Some(s) if s.kind == SHT_STRTAB => Ok(self.contents(s)),
            _ => Err(invalid(format!(
                "{what} names section {index}, which is not a string table"
            ))),
        }
    }

    /// String tables end in NUL, so no string starting inside one runs off its end.
    fn check_string_tables(&self) -> Result<()> {
        for (i, s) in self.list.iter().enumerate() {
            if s.kind == SHT_STRTAB && s.size > 0 && self.contents(s).last() != Some(&0) {
                return Err(invalid(format!(
                    "ELF string table {i} does not end in a NUL byte"
                )));
            }
        }
        Ok(())
    }

    /// Section names lie inside the section-name table `shstrndx` (if any).
    fn check_section_names(&self, shstrndx: u16) -> Result<()> {
        if shstrndx == 0 {
            return Ok(());
        }
        let shnum = self.shnum;
        if shstrndx >= shnum {
            return Err(invalid(format!(
                "ELF section-name table index {shstrndx} >= {shnum} sections"
            )));
        }
        let names = self.strtab(u32::from(shstrndx), "e_shstrndx")?;
        for (i, s) in self.list.iter().enumerate() {
            if s.kind != SHT_NULL && s.name as usize >= names.len() {
                return Err(invalid(format!(
                    "ELF section {i}'s name offset {} is outside the {}-byte name table",
                    s.name,
                    names.len()
                )));
            }
        }
        Ok(())
    }

    /// Symbols and relocations: indices the driver follows, section by section.
    fn check_symbols_and_relocations(&self) -> Result<()> {
        for (i, s) in self.list.iter().enumerate() {
            match s.kind {
                SHT_SYMTAB | SHT_DYNSYM => self.check_symbol_table(i, s)?,
                SHT_REL | SHT_RELA => self.check_relocations(i, s)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Each symbol of table `i` names a string inside its string table and a section
    /// that exists (or a reserved index).
    fn check_symbol_table(&self, i: usize, s: &Section) -> Result<()> {
        let shnum = self.shnum;
        let names = self.strtab(s.link, "a symbol table")?;
        if !s.size.is_multiple_of(SYM_SIZE) {
            return Err(invalid(format!(
                "ELF symbol table {i} is {} bytes, not a multiple of {SYM_SIZE}",
                s.size
            )));
        }
        for sym in self.contents(s).chunks_exact(SYM_SIZE as usize) {
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
        Ok(())
    }

    /// Relocation section `i` applies to a section that exists, links to a symbol table,
    /// and each relocation names a symbol of it.
    fn check_relocations(&self, i: usize, s: &Section) -> Result<()> {
        let shnum = self.shnum;
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
        let symtab = &self.list[s.link as usize];
        if !matches!(symtab.kind, SHT_SYMTAB | SHT_DYNSYM) {
            return Err(invalid(format!(
                "ELF relocation section {i} links to section {}, not a symbol table",
                s.link
            )));
        }
        let symbols = symtab.size / SYM_SIZE;
        if !s.size.is_multiple_of(entry) {
            return Err(invalid(format!(
                "ELF relocation section {i} is {} bytes, not a multiple of {entry}",
                s.size
            )));
        }
        for rel in self.contents(s).chunks_exact(entry as usize) {
            let sym = u64_at(rel, 8).unwrap_or(u64::MAX) >> 32;
            if sym >= symbols {
                return Err(invalid(format!(
                    "a relocation of section {i} names symbol {sym} of {symbols}"
                )));
            }
        }
        Ok(())
    }
}
