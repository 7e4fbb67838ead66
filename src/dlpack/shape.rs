//! Row-major contiguous shapes: element counts and strides.

use crate::error::{Error, Result};

/// Row-major contiguous strides for `shape`.
pub(super) fn compact_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1].max(1));
    }
    strides
}

/// Element count of `shape`, or an error for negative or overflowing extents.
pub(super) fn shape_len(shape: &[i64]) -> Result<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        let d = usize::try_from(d)
            .map_err(|_| Error::InvalidArgument(format!("negative extent {d} in shape")))?;
        acc.checked_mul(d)
            .ok_or_else(|| Error::InvalidArgument(format!("shape {shape:?} overflows usize")))
    })
}
