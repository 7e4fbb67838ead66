//! Random and mutated images never make validation panic.

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
