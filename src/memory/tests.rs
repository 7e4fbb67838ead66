//! Unit tests of the memory traits and slice ranges.

use super::private::{MemsetPattern as P, MemsetSealed};
use super::{AccessTracker, ByteSpan};
use super::{check_disjoint, resolve};

#[test]
fn overlap_is_shared_bytes_of_one_allocation() {
    let (a, b) = (AccessTracker::default(), AccessTracker::default());
    let o = |(t, x, n): (&AccessTracker, u64, u64), (u, y, m): (&AccessTracker, u64, u64)| {
        ByteSpan::new(t, x, n).overlaps(&ByteSpan::new(u, y, m))
    };
    assert!(o((&a, 0, 64), (&a, 63, 1)));
    assert!(o((&a, 16, 8), (&a, 0, 64)));
    assert!(!o((&a, 0, 64), (&a, 64, 64)), "adjacent");
    assert!(!o((&a, 0, 64), (&b, 0, 64)), "another allocation");
    assert!(!o((&a, 0, 0), (&a, 0, 64)), "empty");
    assert!(!o((&a, u64::MAX - 1, 8), (&a, 0, 8)), "no wrap-around");
}
use crate::Error;
use proptest::prelude::*;

#[test]
fn disjoint_ranges_are_checked() {
    assert!(check_disjoint(&[0..8, 8..10], 10).is_ok());
    assert!(check_disjoint(&[8..10, 0..8, 3..3, 5..5], 10).is_ok());
    assert!(matches!(
        check_disjoint(&[0..8, 7..10], 10),
        Err(Error::InvalidArgument(m)) if m.contains("range 1 (7..10) overlaps range 0 (0..8)")
    ));
    assert!(matches!(
        check_disjoint(&[0..8, 8..11], 10),
        Err(Error::OutOfBounds {
            start: 8,
            end: 11,
            len: 10
        })
    ));
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = [0..1, 5..3];
    assert!(matches!(
        check_disjoint(&reversed, 10),
        Err(Error::OutOfBounds { .. })
    ));
}

proptest! {
    /// Accepted ranges are in bounds and no byte is in two of them.
    #[test]
    fn accepted_ranges_are_disjoint(
        ranges in proptest::collection::vec((0usize..40, 0usize..40), 0..6),
        len in 0usize..40,
    ) {
        let ranges: Vec<_> = ranges.into_iter().map(|(a, b)| a..b).collect();
        let mut owner = vec![None; 40];
        let ok = check_disjoint(&ranges, len).is_ok();
        let mut disjoint = true;
        for (i, r) in ranges.iter().enumerate() {
            if r.start > r.end || r.end > len {
                disjoint = false;
                continue;
            }
            for slot in &mut owner[r.clone()] {
                disjoint &= slot.replace(i).is_none();
            }
        }
        prop_assert_eq!(ok, disjoint);
    }
}

#[test]
fn memset_values_pick_the_driver_call_of_their_width() {
    assert_eq!(0xABu8.memset_pattern(), P::D8(0xAB));
    assert_eq!((-1i8).memset_pattern(), P::D8(0xFF));
    assert_eq!(0xABCDu16.memset_pattern(), P::D16(0xABCD));
    assert_eq!((-2i16).memset_pattern(), P::D16(0xFFFE));
    assert_eq!(0xDEAD_BEEFu32.memset_pattern(), P::D32(0xDEAD_BEEF));
    assert_eq!((-1i32).memset_pattern(), P::D32(u32::MAX));
    assert_eq!(1.5f32.memset_pattern(), P::D32(1.5f32.to_bits()));
    let h = half::f16::from_f32(-0.25);
    assert_eq!(h.memset_pattern(), P::D16(h.to_bits()));
    let b = half::bf16::from_f32(3.0);
    assert_eq!(b.memset_pattern(), P::D16(b.to_bits()));
    // The width always equals the element's size.
    fn width<T: super::MemsetValue>(v: T) -> bool {
        v.memset_pattern().width() == std::mem::size_of::<T>()
    }
    assert!(width(1u8) && width(1i8) && width(1u16) && width(1i16));
    assert!(width(1u32) && width(1i32) && width(1f32));
    assert!(width(half::f16::ONE) && width(half::bf16::ONE));
}

#[test]
#[allow(clippy::reversed_empty_ranges)]
fn ranges_resolve_against_len() {
    assert_eq!(resolve(.., 10).unwrap(), (0, 10));
    assert_eq!(resolve(2..5, 10).unwrap(), (2, 3));
    assert_eq!(resolve(2..=5, 10).unwrap(), (2, 4));
    assert_eq!(resolve(10.., 10).unwrap(), (10, 0));
    assert_eq!(
        resolve(3..11, 10).unwrap_err(),
        Error::OutOfBounds {
            start: 3,
            end: 11,
            len: 10
        }
    );
    assert_eq!(
        resolve(5..3, 10).unwrap_err(),
        Error::OutOfBounds {
            start: 5,
            end: 3,
            len: 10
        }
    );
}
