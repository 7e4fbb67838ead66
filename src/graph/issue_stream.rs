//! [`Issue`] for a [`BoundStream`]: memsets and copies into buffers borrowed shared and
//! claimed as written, and [`StreamLaunch`], the eager [`KernelLaunch`].

use super::issue::{Issue, KernelLaunch};
use crate::access::Access;
use crate::copy::DeviceOnlyMemory;
use crate::driver::result;
use crate::error::Result;
use crate::launch::LaunchConfig;
use crate::memory::{ByteSpan, DeviceMemory, DeviceRepr, MemsetValue, expect_len};
use crate::module::{Function, KernelArg, WritableArg};
use crate::stream::BoundStream;
use std::any::Any;

impl<'buf> Issue<'buf> for BoundStream<'_> {
    type Launch<'l>
        = StreamLaunch<'l, 'buf>
    where
        Self: 'l,
        'buf: 'l;

    fn memset_zeros<T, D>(&mut self, dst: &'buf D) -> Result<()>
    where
        T: DeviceRepr,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        self.bound().expect_device("destination", dst.device())?;
        if dst.is_empty() {
            return Ok(());
        }
        // Written through a shared borrow: sound for device-only memory, whose every
        // other use is claimed through the same tracker (see `Issue`).
        let _claim = self.claim([Some((dst.tracker(), Access::Write))])?;
        // SAFETY: a stream of the bound device (context checked by the claim); in-bounds
        // range of a live allocation, whose other uses are ordered around this one
        // (claimed above) and whose free waits for it.
        let zeroed = unsafe {
            result::copy::memset_d8_async(dst.device_ptr(), 0, dst.num_bytes(), self.raw())
        };
        self.bound().device().check(zeroed)
    }

    fn memset<T, D>(&mut self, dst: &'buf D, value: T) -> Result<()>
    where
        T: MemsetValue,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        self.bound().expect_device("destination", dst.device())?;
        if dst.is_empty() {
            return Ok(());
        }
        let _claim = self.claim([Some((dst.tracker(), Access::Write))])?;
        // SAFETY: as in `memset_zeros`; the stream handle is valid while `self` lives.
        unsafe {
            crate::memory::memset_raw(
                self.bound().device(),
                dst.device_ptr(),
                dst.len(),
                value.memset_pattern(),
                Some(self.raw()),
            )
        }
    }

    fn dtod<T, S, D>(&mut self, src: &'buf S, dst: &'buf D) -> Result<()>
    where
        T: DeviceRepr,
        S: DeviceMemory<T> + ?Sized,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        self.bound().expect_device("source", src.device())?;
        self.bound().expect_device("destination", dst.device())?;
        expect_len("dtod", dst.len(), src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let (s, d) = (ByteSpan::of(src), ByteSpan::of(dst));
        if s.overlaps(&d) {
            return Err(crate::error::Error::InvalidArgument(format!(
                "dtod: source {:#x} and destination {:#x} overlap ({} bytes each)",
                s.addr, d.addr, s.bytes
            )));
        }
        // One claim, sorted and merged: both may be parts of one allocation.
        let _claim = self.claim([
            Some((src.tracker(), Access::Read)),
            Some((dst.tracker(), Access::Write)),
        ])?;
        // SAFETY: a stream of the bound device (context checked by the claim); in-bounds
        // ranges of live allocations of this device that do not overlap (checked above),
        // whose other uses are ordered around this copy (claimed above) and whose frees
        // wait for it.
        let copied =
            unsafe { result::copy::dtod_async(d.addr, s.addr, src.num_bytes(), self.raw()) };
        self.bound().device().check(copied)
    }

    fn launch<'l>(&'l mut self, func: &'l Function<'buf>, cfg: LaunchConfig) -> Self::Launch<'l> {
        StreamLaunch {
            stream: self,
            func,
            cfg,
            args: Args::new(),
        }
    }
}

/// A kernel launch on a stream through [`Issue::launch`]: a [`LaunchBuilder`] whose
/// arguments are collected first and passed to it at [`launch`](KernelLaunch::launch),
/// so that plain data given by value ([`value`](KernelLaunch::value)) lives in the
/// builder rather than in the caller's frame.
///
/// [`LaunchBuilder`]: crate::LaunchBuilder
#[must_use = "a launch does nothing until `.launch()` is called"]
pub struct StreamLaunch<'l, 'buf> {
    stream: &'l BoundStream<'l>,
    func: &'l Function<'l>,
    cfg: LaunchConfig,
    args: Args<'buf>,
}

impl std::fmt::Debug for StreamLaunch<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamLaunch")
            .field("function", &self.func.name())
            .field("stream", self.stream)
            .field("config", &self.cfg)
            .field("args", &self.args.len())
            .finish_non_exhaustive()
    }
}

/// How many arguments a [`StreamLaunch`] keeps inline before spilling to the heap (as
/// many as a [`LaunchBuilder`](crate::LaunchBuilder) does).
const INLINE_ARGS: usize = 12;

/// The arguments of a [`StreamLaunch`], in order: inline for up to [`INLINE_ARGS`], so a
/// typical launch allocates nothing.
struct Args<'buf> {
    inline: [Option<Pending<'buf>>; INLINE_ARGS],
    n: usize,
    spill: Vec<Pending<'buf>>,
}

impl<'buf> Args<'buf> {
    fn new() -> Self {
        Args {
            inline: [const { None }; INLINE_ARGS],
            n: 0,
            spill: Vec::new(),
        }
    }

    fn len(&self) -> usize {
        self.n + self.spill.len()
    }

    fn push(&mut self, a: Pending<'buf>) {
        if self.n < INLINE_ARGS {
            self.inline[self.n] = Some(a);
            self.n += 1;
        } else {
            self.spill.push(a);
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Pending<'buf>> {
        self.inline[..self.n].iter().flatten().chain(&self.spill)
    }
}

/// One argument of a [`StreamLaunch`], as the caller gave it.
enum Pending<'buf> {
    /// Passed by `&`: claimed as read.
    Read(&'buf dyn KernelArg),
    /// Passed to `arg_written`: claimed as written.
    Written(&'buf dyn WritableArg),
    /// Plain data given by value.
    Value(Value),
}

macro_rules! inline_values {
    ($($variant:ident($ty:ty)),* $(,)?) => {
        /// Plain data given by value: the common scalars inline, anything else boxed.
        enum Value {
            $($variant($ty),)*
            Boxed(Box<dyn KernelArg + Send + Sync>),
        }

        impl Value {
            #[inline]
            fn new<T: DeviceRepr>(v: T) -> Value {
                // One of these type tests holds or none, decided at compile time.
                let any: &dyn Any = &v;
                $(if let Some(&x) = any.downcast_ref::<$ty>() {
                    return Value::$variant(x);
                })*
                Value::Boxed(Box::new(v))
            }

            #[inline]
            fn as_arg(&self) -> &dyn KernelArg {
                match self {
                    $(Value::$variant(x) => x,)*
                    Value::Boxed(b) => &**b,
                }
            }
        }
    };
}
inline_values!(
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    Usize(usize),
    Isize(isize),
    F32(f32),
    F64(f64),
);

impl<'buf> KernelLaunch<'buf> for StreamLaunch<'_, 'buf> {
    fn arg<A: KernelArg>(&mut self, arg: &'buf A) -> &mut Self {
        self.args.push(Pending::Read(arg));
        self
    }

    fn arg_written<A: WritableArg>(&mut self, arg: &'buf A) -> &mut Self {
        self.args.push(Pending::Written(arg));
        self
    }

    fn value<T: DeviceRepr>(&mut self, v: T) -> &mut Self {
        self.args.push(Pending::Value(Value::new(v)));
        self
    }

    unsafe fn launch(&mut self) -> Result<()> {
        let mut l = self.stream.launch(self.func, self.cfg);
        for a in self.args.iter() {
            match a {
                Pending::Read(x) => l.arg(*x),
                Pending::Written(x) => l.arg_written(*x),
                Pending::Value(v) => l.arg(v.as_arg()),
            };
        }
        // SAFETY: the caller's contract is this one's, which includes
        // `LaunchBuilder::launch`'s; the arguments are those given, in order, claimed as
        // given (`&`: read, `arg_written`: write), the values alive in `self.args`.
        unsafe { l.launch() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The arguments come back in the order given, of the kind given, inline and after
    /// spilling.
    #[test]
    fn arguments_keep_their_order_and_kind() {
        let vals: Vec<u32> = (0..2 * INLINE_ARGS as u32 + 3).collect();
        let mut args = Args::new();
        for v in &vals {
            args.push(match v % 3 {
                0 => Pending::Read(v),
                1 => Pending::Written(v),
                _ => Pending::Value(Value::new(*v)),
            });
        }
        assert_eq!(args.len(), vals.len());
        assert_eq!(args.spill.len(), vals.len() - INLINE_ARGS);
        let seen: Vec<(u32, u32)> = args
            .iter()
            .map(|a| {
                let (kind, arg) = match a {
                    Pending::Read(x) => (0, *x),
                    Pending::Written(x) => (1, *x as &dyn KernelArg),
                    Pending::Value(v) => (2, v.as_arg()),
                };
                // SAFETY: every argument is a u32: 4 readable bytes (`KernelArg`).
                (kind, unsafe { *(arg.param_ptr() as *const u32) })
            })
            .collect();
        let want: Vec<(u32, u32)> = vals.iter().map(|&v| (v % 3, v)).collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn values_keep_their_bytes_inline_or_boxed() {
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Pair {
            a: u32,
            b: u32,
        }
        // SAFETY: repr(C), two u32 (no padding), every bit pattern valid.
        unsafe impl DeviceRepr for Pair {}
        let bytes = |v: &Value| {
            let a = v.as_arg();
            // SAFETY: `param_ptr` points to `param_size` readable bytes while `v` lives
            // (`KernelArg`'s contract).
            unsafe { std::slice::from_raw_parts(a.param_ptr() as *const u8, a.param_size()) }
                .to_vec()
        };
        let v = Value::new(7u32);
        assert!(matches!(v, Value::U32(7)));
        assert_eq!(bytes(&v), 7u32.to_ne_bytes());
        let v = Value::new(-1.5f32);
        assert!(matches!(v, Value::F32(_)));
        assert_eq!(bytes(&v), (-1.5f32).to_ne_bytes());
        let v = Value::new(Pair { a: 1, b: 2 });
        assert!(matches!(v, Value::Boxed(_)));
        let want: Vec<u8> = [1u32.to_ne_bytes(), 2u32.to_ne_bytes()].concat();
        assert_eq!(bytes(&v), want);
        assert!(v.as_arg().describe().contains("Pair"));
    }
}
