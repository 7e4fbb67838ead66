//! The per-thread binding token and the bound device (documented on [`ThreadContext`]).

use crate::device::Device;
use crate::driver::{self, RawContext, result};
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
///
/// CUDA makes a context current *per thread*. gpubind turns that into types:
///
/// * [`ThreadContext`] is the thread's one token. It is `!Send` and `!Sync`, so it can
///   never describe a thread other than the one that acquired it, and at most one exists
///   per thread at a time.
/// * [`ThreadContext::bind`] borrows the token **mutably** and returns a
///   [`BoundDevice`]. While that `BoundDevice` lives, the token cannot be bound again, so
///   the borrow checker proves that the device you allocate or launch on *is* the current
///   context. Everything that needs a current context — allocations, copies, streams,
///   module loads, launches — is a method of `BoundDevice` or of a type borrowed from it.
///
/// Binding is cheap: `bind` asks the driver which context is current (`cuCtxGetCurrent`,
/// a thread-local read) and calls `cuCtxSetCurrent` only when it is not already the
/// device's primary context. It never trusts a cached answer, because code outside
/// gpubind (cudarc's safe `CudaContext` API, re-exported as [`crate::cudarc`], or any
/// other library) can change the thread's current context behind the token.
///
/// # One thread, many GPUs
///
/// Bind the devices one after another; each `BoundDevice` ends before the next begins:
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::{Device, ThreadContext};
/// let mut ctx = ThreadContext::acquire()?;
/// let devices = Device::all()?;
/// let mut buffers = Vec::new();
/// for dev in &devices {
///     let gpu = ctx.bind(dev)?;          // borrows `ctx` until `gpu` is last used
///     buffers.push(gpu.clone_htod(&[1.0f32; 1024])?);
/// }                                      // slices outlive the binds: they hold Arc<Device>
/// # Ok(()) }
/// ```
///
/// # One thread per GPU
///
/// Each thread acquires its own token, as with [`std::thread::scope`]:
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::{Device, ThreadContext};
/// let devices = Device::all()?;
/// std::thread::scope(|s| {
///     for dev in &devices {
///         s.spawn(move || -> gpubind::Result<Vec<f32>> {
///             let mut ctx = ThreadContext::acquire()?;
///             let gpu = ctx.bind(dev)?;
///             let buf = gpu.alloc_zeros::<f32>(256)?;
///             gpu.dtoh(&buf)
///         });
///     }
/// });
/// # Ok(()) }
/// ```
///
/// # What the types forbid
///
/// Two devices bound at once from one token does not compile:
///
/// ```compile_fail,E0499
/// # fn main() -> gpubind::Result<()> {
/// # use gpubind::{Device, ThreadContext};
/// let mut ctx = ThreadContext::acquire()?;
/// let (d0, d1) = (Device::get(0)?, Device::get(1)?);
/// let a = ctx.bind(&d0)?;
/// let b = ctx.bind(&d1)?; // error[E0499]: `ctx` is already borrowed by `a`
/// let x = a.alloc_zeros::<f32>(4)?; // `a` is still used here
/// # Ok(()) }
/// ```
///
/// The fix is to finish with one binding before making the next: end `a`'s last use
/// before `ctx.bind(&d1)`, or put each binding in its own block.
///
/// A token cannot move to another thread, where it would describe the wrong thread:
///
/// ```compile_fail,E0277
/// # use gpubind::ThreadContext;
/// let ctx = ThreadContext::acquire().unwrap();
/// std::thread::spawn(move || drop(ctx)); // error[E0277]: `*mut ()` cannot be sent
/// ```
///
/// Acquire a token inside the thread instead (see "One thread per GPU" above).
#[derive(Debug)]
pub struct ThreadContext {
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
                    _not_send: PhantomData,
                })
            }
        })
    }

    /// Makes `device`'s primary context current on this thread and returns the proof.
    ///
    /// Retains the primary context on the first bind of this device in the process.
    /// Always checks the thread's current context with `cuCtxGetCurrent` (a thread-local
    /// read in the driver) and calls `cuCtxSetCurrent` only when it differs, so a context
    /// made current by code outside gpubind is never mistaken for the device's.
    ///
    /// The returned [`BoundDevice`] borrows `self` mutably: no second device can be
    /// bound through this token while it lives.
    pub fn bind(&mut self, device: &Arc<Device>) -> Result<BoundDevice<'_>> {
        device.check_poison()?;
        let (ctx, _retain_id) = device.primary_context()?;
        // `ctx` is retained for as long as `device` (an Arc we clone into the
        // BoundDevice) lives; making it current affects only this thread, whose single
        // token `self` is.
        driver::make_current(ctx.0)?;
        Ok(BoundDevice {
            device: Arc::clone(device),
            ctx,
            _token: PhantomData,
        })
    }

    /// Does nothing; kept so existing callers compile.
    ///
    /// The token used to cache which context it made current, and this cleared the
    /// cache after code outside gpubind changed the thread's context. [`bind`](Self::bind)
    /// now asks the driver every time (and every [`BoundDevice`] operation re-checks),
    /// so there is nothing to forget.
    pub fn forget_binding(&mut self) {}
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
///
/// # The current context during a binding
///
/// The borrow checker proves that no *gpubind* code rebinds the thread while a
/// `BoundDevice` lives. It cannot stop other code on the same thread from changing the
/// current context in the middle of a binding, and some of that code is safe: cudarc's
/// `CudaContext::new` and `CudaContext::new_non_primary` (reachable as
/// `gpubind::cudarc::driver::CudaContext`) leave their context current, and every cudarc
/// operation calls `bind_to_thread` first:
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::{Device, ThreadContext};
/// let mut ctx = ThreadContext::acquire()?;
/// let dev = Device::get(0)?;
/// let gpu = ctx.bind(&dev)?;
/// // Safe code, and now another context is current on this thread:
/// let other = gpubind::cudarc::driver::CudaContext::new_non_primary(0, 0).unwrap();
/// // gpubind notices: this module is loaded into device 0's primary context.
/// let module = gpu.load_ptx(".version 8.0\n.target sm_90\n.address_size 64\n")?;
/// drop(other); // destroying the foreign context cannot take the module with it
/// # Ok(()) }
/// ```
///
/// So the invariant a `BoundDevice` keeps is about its *operations*, not about every
/// instant: **each operation that depends on the current context (allocation, module
/// load, synchronous copies, stream and event creation, launches, `synchronize`, …)
/// runs with this device's primary context current.** Each such operation first checks
/// the thread's current context with `cuCtxGetCurrent` — a thread-local read inside the
/// driver, on the order of 10 ns, next to driver calls that cost microseconds — and calls
/// `cuCtxSetCurrent` only when it differs. The check runs in release builds too. Nothing
/// can change the context between the check and the driver call, because both happen on
/// this thread inside one gpubind call.
///
/// Stream-ordered work on a gpubind [`Stream`](crate::Stream) (memsets, copies, launches,
/// events, `synchronize` through [`BoundDevice::on`]) needs no such check: the driver runs
/// it in the stream's own context whatever is current, which the GPU suite `gpu_binding`
/// asserts. Work on the legacy default stream ([`default_stream`](Self::default_stream))
/// is checked like the rest, since that stream is the current context's.
///
/// After an operation, the bound context may stay current where a foreign library had
/// set its own: gpubind does not restore foreign contexts, just as cudarc's
/// `bind_to_thread` does not. Code that needs its context back sets it again (cudarc
/// does so before each of its operations).
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
        self.ensure_current()?;
        // This context is current (just checked).
        self.device.check(result::context::synchronize())
    }

    /// `(free, total)` device memory in bytes, as this context sees it (`cuMemGetInfo`).
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.ensure_current()?;
        // This context is current (just checked).
        self.device.check(result::memory::get_info())
    }

    /// Lets kernels and copies of the bound device access `peer`'s memory directly
    /// (`cuCtxEnablePeerAccess` in the bound context for `peer`'s primary context).
    /// Access is one way: `peer` reaching this device's memory needs the call the other
    /// way round. Already enabled is `Ok`. It stays enabled for the life of the contexts
    /// (gpubind offers no disable: work in flight, such as a collective's kernels, may
    /// rely on it).
    ///
    /// The bound device itself is [`Error::InvalidArgument`]; a pair without a peer path
    /// ([`Device::can_access_peer`] is `false`) is [`Error::NoPeerAccess`].
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{Device, ThreadContext};
    /// let (d0, d1) = (Device::get(0)?, Device::get(1)?);
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&d0)?;
    /// if d0.can_access_peer(&d1)? {
    ///     gpu.enable_peer_access(&d1)?; // kernels on d0 may now dereference d1's buffers
    /// }
    /// # Ok(()) }
    /// ```
    pub fn enable_peer_access(&self, peer: &Arc<Device>) -> Result<()> {
        if peer.ordinal() == self.ordinal() {
            return Err(Error::InvalidArgument(format!(
                "peer access from device {} to itself: a device always accesses its own memory",
                self.ordinal()
            )));
        }
        if !self.device.can_access_peer(peer)? {
            return Err(Error::NoPeerAccess {
                device: self.ordinal(),
                peer: peer.ordinal(),
            });
        }
        let (peer_ctx, _) = peer.primary_context()?;
        self.ensure_current()?;
        // SAFETY: the bound context is current (just checked); `peer_ctx` is `peer`'s
        // primary context, retained while `peer` lives; flags must be 0.
        let enabled = unsafe { result::context::enable_peer_access(peer_ctx.0) };
        self.device.check(enabled).map(|_newly| ())
    }

    /// The raw `CUcontext`, for calling cudarc or the driver directly.
    ///
    /// Changing the thread's current context with it (or with any other handle) is
    /// allowed: the next operation through a `BoundDevice` sets its own context again.
    ///
    /// # Safety
    ///
    /// The handle is valid while this `BoundDevice` lives. Code that uses it must not
    /// destroy it, reset the device, or release a retain of the primary context that it
    /// did not take itself.
    pub unsafe fn raw_context(&self) -> sys::CUcontext {
        self.ctx.0
    }

    /// Makes sure this device's primary context is current on this thread before a
    /// driver call that acts on the current context.
    ///
    /// Calls `cuCtxGetCurrent` (a thread-local read in the driver) and, only when the
    /// answer is not the bound context, `cuCtxSetCurrent` with it. Returns the driver's
    /// error if either call fails, in which case the operation must not go on.
    ///
    /// Every `BoundDevice` (and `BoundStream`) operation that depends on the current
    /// context calls this first: code outside gpubind may have changed the context
    /// during the binding (see "The current context during a binding" above).
    #[inline]
    pub(crate) fn ensure_current(&self) -> Result<()> {
        self.device.check_poison()?;
        // The bound context stays retained while `self.device` lives.
        driver::make_current(self.ctx.0)
    }

    /// [`Error::WrongDevice`] unless `other` is the bound device.
    pub(crate) fn expect_device(&self, what: &'static str, other: &Device) -> Result<()> {
        self.device.expect_same(what, other)
    }
}

#[cfg(test)]
impl BoundDevice<'static> {
    /// A binding of `device` that holds no context, for unit tests of calls that fail
    /// before their first driver call (`device` poisoned: every entry is refused).
    pub(crate) fn without_context_for_test(device: Arc<Device>) -> Self {
        BoundDevice {
            device,
            ctx: RawContext(std::ptr::null_mut()),
            _token: PhantomData,
        }
    }
}

impl std::fmt::Debug for BoundDevice<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundDevice")
            .field("device", &self.device.ordinal())
            .finish()
    }
}
