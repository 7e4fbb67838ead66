//! The element types ([`CollectiveType`]) and reduction operators ([`Op`]) of the
//! collectives, and their run-time description (`DType`).

use crate::memory::DeviceRepr;

/// `(kernel suffix, C type)` of every supported data type, in
/// [`CollectiveType::INDEX`] order: the names of the own kernels and their C types.
pub(crate) const DTYPES: [(&str, &str); 7] = [
    ("f32", "float"),
    ("f64", "double"),
    ("f16", "h16"),
    ("bf16", "b16"),
    ("i32", "int"),
    ("i64", "long long"),
    ("u8", "unsigned char"),
];

/// A reduction operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Sum (integers wrap).
    Sum,
    /// Product (integers wrap).
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Sum divided by the number of ranks (truncating division for integers).
    Avg,
}

impl Op {
    /// The op's code in the headers ranks agree on.
    #[cfg_attr(not(any(feature = "nccl", feature = "ipc")), allow(dead_code))]
    pub(crate) fn code(self) -> u8 {
        match self {
            Op::Sum => 0,
            Op::Prod => 1,
            Op::Min => 2,
            Op::Max => 3,
            Op::Avg => 4,
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// An element type the collectives support: `f32`, `f64`, `f16`, `bf16`, `i32`, `i64`,
/// `u8`. Sealed.
///
/// ```compile_fail,E0277
/// fn takes<T: gpubind::collective::CollectiveType>() {}
/// takes::<u16>(); // error[E0277]: `u16: CollectiveType` is not satisfied
/// ```
pub trait CollectiveType: DeviceRepr + sealed::Sealed {
    /// Short name, used in kernel names (`f32`, `bf16`, …).
    const NAME: &'static str;
    /// The C type the kernels use for it.
    const C_TYPE: &'static str;
    #[doc(hidden)]
    const INDEX: usize;
}

macro_rules! collective_type {
    ($($t:ty => $idx:literal;)*) => { $(
        impl sealed::Sealed for $t {}
        impl CollectiveType for $t {
            const NAME: &'static str = DTYPES[$idx].0;
            const C_TYPE: &'static str = DTYPES[$idx].1;
            const INDEX: usize = $idx;
        }
    )* };
}
collective_type! {
    f32 => 0;
    f64 => 1;
    half::f16 => 2;
    half::bf16 => 3;
    i32 => 4;
    i64 => 5;
    u8 => 6;
}

/// A data type at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DType {
    pub(crate) name: &'static str,
    pub(crate) size: usize,
    pub(crate) index: usize,
}

impl DType {
    pub(crate) fn of<T: CollectiveType>() -> DType {
        DType {
            name: T::NAME,
            size: std::mem::size_of::<T>(),
            index: T::INDEX,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_table_agrees_with_the_trait() {
        fn check<T: CollectiveType>(c: &str) {
            assert_eq!(DTYPES[T::INDEX], (T::NAME, T::C_TYPE));
            assert_eq!(T::C_TYPE, c);
        }
        check::<f32>("float");
        check::<f64>("double");
        check::<half::f16>("h16");
        check::<half::bf16>("b16");
        check::<i32>("int");
        check::<i64>("long long");
        check::<u8>("unsigned char");
        assert_eq!(DType::of::<half::bf16>().size, 2);
    }
}
