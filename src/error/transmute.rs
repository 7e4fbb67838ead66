//! [`TransmuteRefusal`]: why memory cannot be viewed as another element type.

use std::fmt;

/// Why a [`transmute`](crate::DeviceSlice::transmute) was refused ([`Error::Transmute`](crate::Error::Transmute)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransmuteRefusal {
    /// The byte length is not a multiple of the new type's size.
    Length,
    /// The address is not a multiple of the new type's alignment.
    Alignment,
    /// The new type has size 0: no element count fits.
    ZeroSized,
}

impl fmt::Display for TransmuteRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TransmuteRefusal::Length => "the byte length is not a multiple of its size",
            TransmuteRefusal::Alignment => "the address is not aligned for it",
            TransmuteRefusal::ZeroSized => "it has no size",
        })
    }
}
