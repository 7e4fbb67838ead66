//! Element types and their DLPack dtypes.

use super::header::{DLDataType, type_code};
use crate::memory::DeviceRepr;

/// Element types with a DLPack dtype.
///
/// # Safety
///
/// `DTYPE` must describe `Self` exactly (`bits == 8 * size_of::<Self>()`, one lane).
pub unsafe trait DlpackDtype: DeviceRepr {
    /// The dtype.
    const DTYPE: DLDataType;
}

macro_rules! dlpack_dtype {
    ($($t:ty => $code:ident),* $(,)?) => { $(
        // SAFETY: a primitive of exactly `bits` bits, one lane, of that type code.
        unsafe impl DlpackDtype for $t {
            const DTYPE: DLDataType = DLDataType {
                code: type_code::$code,
                bits: (8 * std::mem::size_of::<$t>()) as u8,
                lanes: 1,
            };
        }
    )* };
}
dlpack_dtype!(
    i8 => INT, i16 => INT, i32 => INT, i64 => INT, isize => INT,
    u8 => UINT, u16 => UINT, u32 => UINT, u64 => UINT, usize => UINT,
    f32 => FLOAT, f64 => FLOAT, half::f16 => FLOAT, half::bf16 => BFLOAT,
);
