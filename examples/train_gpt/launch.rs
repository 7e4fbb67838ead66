//! The buffers `train_gpt`'s kernel launches take ([`In`]), wherever the launches go
//! (gpubind's [`Issue`](gpubind::Issue): a stream or a graph capture).

use gpubind::{DeviceMemory, DeviceRepr, WritableArg};

/// A buffer a kernel reads or writes, of `f32`, of the activation type (`f32` or `bf16`,
/// fixed when the module is compiled) or of `u32` tokens: [`Gpt`](crate::gpt::Gpt) keeps
/// each buffer's element type what its kernel parameter says. Taken by shared reference —
/// the buffers a kernel writes go by `arg_written`, claimed as writes — because a captured
/// launch borrows its buffers shared for the graph's lifetime: one wrapper serves both
/// issuers.
pub trait In: WritableArg {
    /// Elements.
    fn len(&self) -> usize;
    /// The device address of the first element.
    fn addr(&self) -> u64;
}
macro_rules! buffer {
    ($($ty:ident),*) => {$(
        impl<T: DeviceRepr> In for gpubind::$ty<'_, T> {
            fn len(&self) -> usize {
                DeviceMemory::len(self)
            }
            fn addr(&self) -> u64 {
                DeviceMemory::device_ptr(self)
            }
        }
    )*};
}
buffer!(DeviceView, DeviceViewMut);
impl<T: DeviceRepr> In for gpubind::DeviceSlice<T> {
    fn len(&self) -> usize {
        DeviceMemory::len(self)
    }
    fn addr(&self) -> u64 {
        DeviceMemory::device_ptr(self)
    }
}
