//! FNV-1a, 64 bits: the checksum of gpubind's wire formats (IPC handles, the rendezvous
//! frames), the name of a one-machine job's sockets, and the digest of a graph's
//! captured collectives. Not a cryptographic hash: it catches corruption and mix-ups,
//! not forgeries (docs/safety.md says where that matters).

/// FNV-1a (64 bits) of `bytes`.
pub(crate) fn fnv1a64<'a>(bytes: impl IntoIterator<Item = &'a u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::fnv1a64;

    #[test]
    fn fnv1a_known_values() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
