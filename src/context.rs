//! The per-thread binding token and the bound device.
//!
//! CUDA makes a context current *per thread*. gpubind turns that into types:
//!
//! * [`ThreadContext`] is the thread's one token. It is `!Send` and `!Sync`, so it can
//!   never describe a thread other than the one that acquired it, and at most one exists
//!   per thread at a time.
//! * [`ThreadContext::bind`] borrows the token **mutably** and returns a
//!   [`BoundDevice`]. While that `BoundDevice` lives, the token cannot be bound again, so
//!   the borrow checker proves that the device you allocate or launch on *is* the current
//!   context. Everything that needs a current context — allocations, copies, streams,
//!   module loads, launches — is a method of `BoundDevice` or of a type borrowed from it.
//!
//! Binding is cheap: the token remembers which context it made current and skips
//! `cuCtxSetCurrent` when you bind the same device again.
//!
//! # One thread, many GPUs
//!
//! Bind the devices one after another; each `BoundDevice` ends before the next begins:
//!
//! ```no_run
//! # fn main() -> gpubind::Result<()> {
//! use gpubind::{Device, ThreadContext};
//! let mut ctx = ThreadContext::acquire()?;
//! let devices = Device::all()?;
//! let mut buffers = Vec::new();
//! for dev in &devices {
//!     let gpu = ctx.bind(dev)?;          // borrows `ctx` until `gpu` is last used
//!     buffers.push(gpu.clone_htod(&[1.0f32; 1024])?);
//! }                                      // slices outlive the binds: they hold Arc<Device>
//! # Ok(()) }
//! ```
//!
//! # One thread per GPU
//!
//! Each thread acquires its own token, as with [`std::thread::scope`]:
//!
//! ```no_run
//! # fn main() -> gpubind::Result<()> {
//! use gpubind::{Device, ThreadContext};
//! let devices = Device::all()?;
//! std::thread::scope(|s| {
//!     for dev in &devices {
//!         s.spawn(move || -> gpubind::Result<Vec<f32>> {
//!             let mut ctx = ThreadContext::acquire()?;
//!             let gpu = ctx.bind(dev)?;
//!             let buf = gpu.alloc_zeros::<f32>(256)?;
//!             gpu.dtoh(&buf)
//!         });
//!     }
//! });
//! # Ok(()) }
//! ```
//!
//! # What the types forbid
//!
//! Two devices bound at once from one token does not compile:
//!
//! ```compile_fail,E0499
//! # fn main() -> gpubind::Result<()> {
//! # use gpubind::{Device, ThreadContext};
//! let mut ctx = ThreadContext::acquire()?;
//! let (d0, d1) = (Device::get(0)?, Device::get(1)?);
//! let a = ctx.bind(&d0)?;
//! let b = ctx.bind(&d1)?; // error[E0499]: `ctx` is already borrowed by `a`
//! let x = a.alloc_zeros::<f32>(4)?; // `a` is still used here
//! # Ok(()) }
//! ```
//!
//! The fix is to finish with one binding before making the next: end `a`'s last use
//! before `ctx.bind(&d1)`, or put each binding in its own block.
//!
//! A token cannot move to another thread, where it would describe the wrong thread:
//!
//! ```compile_fail,E0277
//! # use gpubind::ThreadContext;
//! let ctx = ThreadContext::acquire().unwrap();
//! std::thread::spawn(move || drop(ctx)); // error[E0277]: `*mut ()` cannot be sent
//! ```
//!
//! Acquire a token inside the thread instead (see "One thread per GPU" above).

use crate::device::Device;
use crate::driver::{Check, RawContext};
use crate::error::{Error, Result};
use crate::sync::thread_local_slot;
use cudarc::driver::sys;
use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;

thread_local_slot! {
    /// Whether this thread holds a live `ThreadContext`.
    static SLOT_TAKEN: Cell<bool> = Cell::new(false);
}

/// This thread's binding token: at most one per thread, never shared or sent.
///
/// ```
/// use gpubind::{Error, ThreadContext};
/// let ctx = ThreadContext::acquire().unwrap();
/// assert_eq!(ThreadContext::acquire().unwrap_err(), Error::ThreadContextTaken);
/// drop(ctx);
/// assert!(ThreadContext::acquire().is_ok()); // the slot is free again
/// ```
///
/// Acquiring needs no driver, so it works (and is tested) on machines without a GPU.
#[derive(Debug)]
pub struct ThreadContext {
    /// Retain id of the context this token last made current, if it knows one.
    current: Option<u64>,
    /// `*mut ()` makes the token `!Send` and `!Sync`.
    _not_send: PhantomData<*mut ()>,
}

impl ThreadContext {
    /// Takes this thread's token, or [`Error::ThreadContextTaken`] if one is alive.
    pub fn acquire() -> Result<ThreadContext> {
        SLOT_TAKEN.with(|taken| {
            if taken.get() {
                Err(Error::ThreadContextTaken)
            } else {
                taken.set(true);
                Ok(ThreadContext {
                    current: None,
                    _not_send: PhantomData,
                })
            }
        })
    }

    /// Makes `device`'s primary context current on this thread and returns the proof.
    ///
    /// Retains the primary context on the first bind of this device in the process.
    /// If this token already made that context current, no driver call is made.
    ///
    /// The returned [`BoundDevice`] borrows `self` mutably: no second device can be
    /// bound through this token while it lives.
    pub fn bind(&mut self, device: &Arc<Device>) -> Result<BoundDevice<'_>> {
        let (ctx, retain_id) = device.primary_context()?;
        if self.current != Some(retain_id) {
            // Forget first: if the call fails the thread's current context is unknown.
            self.current = None;
            // SAFETY: `ctx` is retained for as long as `device` (an Arc we clone into
            // the BoundDevice) lives; setting it current affects only this thread, whose
            // single token `self` is.
            unsafe { sys::cuCtxSetCurrent(ctx.0) }.check("cuCtxSetCurrent")?;
            self.current = Some(retain_id);
        }
        Ok(BoundDevice {
            device: Arc::clone(device),
            ctx,
            _token: PhantomData,
        })
    }

    /// Forgets which context this token made current, so the next [`bind`](Self::bind)
    /// calls `cuCtxSetCurrent` again.
    ///
    /// Call this after code outside gpubind changed the thread's current context
    /// (cudarc's `bind_to_thread`, a raw `cuCtxSetCurrent`, another library). gpubind's
    /// own drops restore the context they change, so they never need it.
    pub fn forget_binding(&mut self) {
        self.current = None;
    }
}

impl Drop for ThreadContext {
    fn drop(&mut self) {
        // `try_with`: during thread teardown the slot may already be gone.
        let _ = SLOT_TAKEN.try_with(|taken| taken.set(false));
    }
}

/// Proof that `device`'s context is current on this thread, for as long as `'a` borrows
/// the [`ThreadContext`] mutably.
///
/// All context-dependent operations live here: memory ([`alloc_zeros`](Self::alloc_zeros),
/// [`clone_htod`](Self::clone_htod), [`dtoh`](Self::dtoh), …), streams and events
/// ([`default_stream`](Self::default_stream), [`new_stream`](Self::new_stream)),
/// modules ([`compile_and_load`](Self::compile_and_load)). Resources these create —
/// slices, streams, events, modules — hold an `Arc<Device>` instead of a borrow, so they
/// outlive the binding and can be used again under a later binding of the same device
/// (checked at run time: see [`Error::WrongDevice`]).
///
/// A `BoundDevice` is neither `Send` nor `Sync`:
///
/// ```compile_fail,E0277
/// # use gpubind::{Device, ThreadContext};
/// fn needs_send<T: Send>(_: T) {}
/// let mut ctx = ThreadContext::acquire().unwrap();
/// let dev = Device::get(0).unwrap();
/// needs_send(ctx.bind(&dev).unwrap()); // error[E0277]
/// ```
///
/// and cannot outlive its token:
///
/// ```compile_fail,E0515
/// # use gpubind::{BoundDevice, Device, ThreadContext};
/// fn bind_here(dev: &std::sync::Arc<Device>) -> BoundDevice<'static> {
///     let mut ctx = ThreadContext::acquire().unwrap();
///     ctx.bind(dev).unwrap() // error[E0515]: returns a value referencing local `ctx`
/// }
/// ```
///
/// Pass `&mut ThreadContext` down instead and bind where the work is done.
pub struct BoundDevice<'a> {
    device: Arc<Device>,
    ctx: RawContext,
    /// The mutable borrow of the token: what makes a second bind a compile error.
    _token: PhantomData<&'a mut ThreadContext>,
}

impl<'a> BoundDevice<'a> {
    /// The bound device.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// The bound device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.device.ordinal()
    }

    /// Waits for all work in this context (`cuCtxSynchronize`).
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: this context is current (the type's invariant).
        unsafe { sys::cuCtxSynchronize() }.check("cuCtxSynchronize")
    }

    /// `(free, total)` device memory in bytes, as this context sees it (`cuMemGetInfo`).
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: this context is current; writes two size_t.
        unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) }.check("cuMemGetInfo_v2")?;
        Ok((free, total))
    }

    /// The raw `CUcontext`, for calling cudarc or the driver directly.
    ///
    /// # Safety
    ///
    /// The handle is valid while this `BoundDevice` lives. Code that uses it must leave
    /// this context current when it returns (or call
    /// [`ThreadContext::forget_binding`] afterwards), and must not destroy it.
    pub unsafe fn raw_context(&self) -> sys::CUcontext {
        self.ctx.0
    }

    /// [`Error::WrongDevice`] unless `other` is the bound device.
    pub(crate) fn expect_device(&self, what: &'static str, other: &Device) -> Result<()> {
        self.device.expect_same(what, other)
    }
}

impl std::fmt::Debug for BoundDevice<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundDevice")
            .field("device", &self.device.ordinal())
            .finish()
    }
}
