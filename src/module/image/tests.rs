//! Synthetic cubins and fatbins, and the corruptions validation must reject.

use super::elf::*;
use super::fatbin::*;
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
    let shstrtab: &[u8] = b"\0.shstrtab\0.strtab\0.symtab\0.text.k\0.rel.text.k\0.nv.shared.k\0";
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
