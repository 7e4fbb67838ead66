//! [`LaunchBuilder`]: one kernel launch, from [`BoundStream::launch`] to the driver call:
//! argument collection, the checks, the claim of the buffer arguments (and of the
//! module's tracker), and [`DriverLaunch`], the call that ends it.

use super::LaunchConfig;
use super::args::{Args, INLINE_ARGS};
use crate::access::{self, Access, AccessTracker, Use};
use crate::device::Device;
use crate::device::poison::KernelName;
use crate::driver::result;
use crate::error::{Error, Result};
use crate::module::{Function, KernelArg, LaunchArg, WritableArg, arg_access, func_attribute};
use crate::stream::BoundStream;
use cudarc::driver::sys;
use std::ffi::c_void;

/// Builds one kernel launch; see [`BoundStream::launch`].
///
/// Launch arguments are checked against the kernel's parameter list where the driver
/// reports it (`cuFuncGetParamInfo`, CUDA 12.4+; older drivers, or a version capped below
/// 12.4 with `GPUBIND_ASSUME_DRIVER_VERSION`, skip the check): a wrong count or a wrong
/// size is [`Error::LaunchArgs`], a slice of another device is [`Error::WrongDevice`].
#[must_use = "a launch does nothing until `.launch()` is called"]
pub struct LaunchBuilder<'s, 'a> {
    pub(crate) stream: &'s BoundStream<'s>,
    pub(crate) func: &'s Function<'s>,
    pub(crate) cfg: LaunchConfig,
    /// The argument pointers, the buffer arguments (claimed with the module when the
    /// kernel is enqueued) and the first errors found.
    args: Args<'a>,
}

impl std::fmt::Debug for LaunchBuilder<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchBuilder")
            .field("function", &self.func.name)
            .field("stream", self.stream)
            .field("config", &self.cfg)
            .field("args", &self.args.len())
            .field("error", &{
                let (error, size_error) = self.args.errors();
                error.or(size_error)
            })
            .finish_non_exhaustive()
    }
}

/// Up to this many buffer arguments, a launch claims them with smaller inline arrays.
const FEW_ARGS: usize = 4;

impl<'m> Function<'m> {
    /// The checks [`LaunchBuilder::launch`] makes before the driver call, for a launch of
    /// `nargs` arguments of `cfg` (the launch builder's, and those of any other launch path,
    /// such as a graph capture's). Inlined: it is on every launch's path. The usual launch
    /// (the device's limits already read, every dimension non-zero and the whole
    /// configuration within the default limits) is one pass of compares
    /// ([`LaunchConfig::quick_check`], which passes nothing that the checks one by one
    /// refuse); any other goes through the checks one by one, out of line. The
    /// argument-count error is built out of line.
    #[inline]
    pub(crate) fn check_launch(&self, cfg: &LaunchConfig, nargs: usize) -> Result<()> {
        let quick = self
            .module
            .device
            .known_launch_limits()
            .is_some_and(|dev| cfg.quick_check(dev, &self.limits));
        if !quick {
            self.check_config(cfg)?;
        }
        if let Some(expected) = &self.params
            && expected.len() != nargs
        {
            return Err(self.arg_count_error(expected.len(), nargs));
        }
        Ok(())
    }

    /// [`check_launch`](Self::check_launch)'s configuration checks one by one: non-zero
    /// dimensions, then the device's and the kernel's limits (read from the driver at the
    /// first launch of the device).
    #[cold]
    #[inline(never)]
    fn check_config(&self, cfg: &LaunchConfig) -> Result<()> {
        cfg.validate()?;
        cfg.check_limits(
            &self.name,
            self.module.device.launch_limits()?,
            &self.limits,
            || {
                let _guard = self.module.device.enter()?;
                func_attribute(
                    self.raw,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                )
            },
        )
    }

    /// [`Error::LaunchArgs`] for `nargs` arguments to a kernel of `expected` parameters.
    #[cold]
    #[inline(never)]
    fn arg_count_error(&self, expected: usize, nargs: usize) -> Error {
        Error::LaunchArgs {
            kernel: self.name.clone(),
            reason: format!("the kernel takes {expected} parameter(s), {nargs} given"),
        }
    }

    /// [`Error::LaunchArgs`] if argument `i` (of `size` bytes) does not fit parameter `i`
    /// where the driver reports the sizes.
    pub(crate) fn check_arg_size(
        &self,
        i: usize,
        size: usize,
        describe: impl FnOnce() -> String,
    ) -> Result<()> {
        match self.params.as_ref().and_then(|p| p.get(i)) {
            Some(&want) if want != size => Err(self.arg_size_error(i, want, size, describe())),
            _ => Ok(()),
        }
    }

    /// [`Error::LaunchArgs`] for argument `i`, a `size`-byte `what`, passed to parameter
    /// `i` of `want` bytes.
    #[cold]
    #[inline(never)]
    fn arg_size_error(&self, i: usize, want: usize, size: usize, what: String) -> Error {
        Error::LaunchArgs {
            kernel: self.name.clone(),
            reason: format!(
                "parameter {i} is {want} bytes, but argument {i} is a {size}-byte {what}"
            ),
        }
    }

    /// The module's tracker of the streams its kernels run on (its unload waits for
    /// them), and how a launch uses it: a write when the module has global views (any of
    /// its kernels may write a global without being passed it), else a read. Every
    /// launch claims it with its buffers (or takes the fast path on all of them); graph
    /// launches record themselves there too.
    pub(crate) fn module_use(&self) -> (&AccessTracker, Access) {
        (
            &self.module.loaded.uses,
            if self.globals {
                Access::Write
            } else {
                Access::Read
            },
        )
    }

    /// The name as recorded for [`Error::ContextPoisoned`].
    pub(crate) fn interned(&self) -> &'static KernelName {
        self.interned
    }
}

/// Keeps [`Error::WrongDevice`] in `args` unless `other` is `stream`'s device (the check
/// of [`BoundDevice::expect_device`](crate::BoundDevice), inlined: one compare; the error
/// is built out of line).
#[inline(always)]
fn check_device(args: &mut Args<'_>, stream: &BoundStream<'_>, what: &'static str, other: &Device) {
    #[cold]
    #[inline(never)]
    fn wrong(args: &mut Args<'_>, stream: &BoundStream<'_>, what: &'static str, other: &Device) {
        if let Err(e) = stream.bound().expect_device(what, other) {
            args.set_error(e);
        }
    }
    if stream.bound().device().ordinal() != other.ordinal() {
        wrong(args, stream, what, other);
    }
}

impl<'b> BoundStream<'b> {
    /// Starts a launch of `func` on this stream.
    #[inline]
    pub fn launch<'s, 'a>(
        &'s self,
        func: &'s Function<'_>,
        cfg: LaunchConfig,
    ) -> LaunchBuilder<'s, 'a> {
        // The module's device is checked at `launch`, before the arguments' errors.
        LaunchBuilder {
            stream: self,
            func,
            cfg,
            args: Args::new(),
        }
    }
}

impl<'s, 'a> LaunchBuilder<'s, 'a> {
    /// Appends an argument. Memory of another device is reported at `launch`.
    ///
    /// A gpubind buffer passed by `&mut` is claimed as a **write**: the launch runs after
    /// every pending use of it on other streams, and every later use (on any stream, from
    /// the host, or its free) waits for the kernel. One passed by `&` is claimed as a
    /// **read**: the launch waits only for the pending write, launches that only read it
    /// on other streams run concurrently, and the next write (and the free) waits for
    /// it. The kernel must not write through a buffer passed by `&` ([`launch`]'s
    /// contract); see [`LaunchArg`]. A buffer passed both ways in one launch (two views of
    /// one allocation) is claimed once, as a write. Plain data is passed by `&`.
    ///
    /// [`launch`]: Self::launch
    ///
    /// The builder is taken by `&mut` (as in cudarc), so a chain
    /// `stream.launch(&f, cfg).arg(&a).arg(&b).launch()` moves nothing; to build one
    /// across statements, keep it in a variable: `let mut l = stream.launch(&f, cfg);
    /// l.arg(&a); unsafe { l.launch() }`. It may be launched again.
    #[inline(always)]
    pub fn arg<L: LaunchArg<'a>>(&mut self, arg: L) -> &mut Self {
        let access = arg_access::<L>();
        let arg: &'a L::Target = arg.into_arg();
        let this = self;
        // The first error of each kind is kept (`Args::set_error`); each is built out of
        // line, only when found.
        if let Some(dev) = arg.arg_device() {
            check_device(&mut this.args, this.stream, "kernel argument", dev);
        }
        if let Some(t) = arg.access_tracker() {
            this.args.push_buf(t, access);
        }
        let i = this.args.len();
        if let Some(&want) = this.func.params.as_ref().and_then(|p| p.get(i)) {
            let got = arg.param_size();
            if want != got {
                // Only a mismatch pays for describing the argument.
                let func = this.func;
                this.args
                    .set_size_error(|| func.arg_size_error(i, want, got, arg.describe()));
            }
        }
        this.args.push_ptr(arg.param_ptr());
        this
    }

    /// Appends a buffer argument that the kernel writes, borrowed shared: claimed as a
    /// write, as by [`arg`](Self::arg) with `&mut`. For a buffer of which only a shared
    /// reference is at hand (one held in an `Arc`, or borrowed by a graph); never for a
    /// [`ManagedSlice`](crate::ManagedSlice), whose host slices a shared borrow does not
    /// keep away (see [`launch`](Self::launch)'s contract). Takes only a [`WritableArg`]:
    /// a buffer shared for reading with another process, or a shared
    /// [`ManagedView`](crate::ManagedView), does not compile here.
    #[inline(always)]
    pub fn arg_written<A: WritableArg + ?Sized>(&mut self, arg: &'a A) -> &mut Self {
        self.arg(arg);
        if let Some(t) = arg.access_tracker() {
            self.args.mark_written(t);
        }
        self
    }

    /// Enqueues the kernel.
    ///
    /// Fails before the driver is called with [`Error::InvalidArgument`] for a zero
    /// dimension, [`Error::LaunchLimit`] for a configuration over a device or kernel
    /// limit (see [`Function::attributes`](crate::Function::attributes)), [`Error::LaunchArgs`] or
    /// [`Error::WrongDevice`] for arguments that do not fit.
    ///
    /// # Safety
    ///
    /// * The arguments must have the types the kernel declares (gpubind checks the count
    ///   and byte sizes where the driver reports them, i.e. from CUDA 12.4; never the
    ///   types).
    /// * The kernel must only access memory inside the buffers passed to it, and the
    ///   globals of its own module (never writing a `__constant__` one through a
    ///   pointer): gpubind orders those against their views' uses (see
    ///   [`Module::global`](crate::Module::global)).
    /// * The kernel must not write through a buffer passed by `&`: gpubind claims it as
    ///   a read, so kernels on other streams may read it at the same time (see
    ///   [`LaunchArg`]). Pass the buffers it writes by `&mut` (or to
    ///   [`arg_written`](Self::arg_written)).
    /// * gpubind's device, pool and managed buffers passed as arguments need nothing more:
    ///   the launch is ordered after their pending uses (a read after their pending write,
    ///   a write after every pending use), and their later uses and frees are ordered after
    ///   the kernel as those of a read or a write. Any *other* memory the kernel reaches —
    ///   device addresses passed as plain integers or inside your own structs, and
    ///   page-locked host buffers ([`PinnedHostBuffer`](crate::PinnedHostBuffer),
    ///   [`RegisteredHost`](crate::RegisteredHost)), which the host reads and writes
    ///   directly through `Deref` — must stay alive and must not be accessed by the host or
    ///   by other streams until this stream has passed the launch (synchronize it, or
    ///   record and wait for an event).
    /// * A [`ManagedSlice`](crate::ManagedSlice) the kernel writes must be passed as
    ///   `&mut`: a shared one may be read by the host through
    ///   [`as_slice`](crate::ManagedSlice::as_slice) while the launch is enqueued.
    /// * The kernel must not write a buffer shared for reading with another process
    ///   (`ipc::Shared`, `ipc::SharedImport`) that it is passed by `&`: the other process
    ///   reads it at the same time, ordered by nothing. Passing one as written (`&mut`,
    ///   [`arg_written`](Self::arg_written)) does not compile (it is no
    ///   [`WritableArg`](crate::WritableArg)); their `view_mut` is the `unsafe` way to
    ///   write one.
    pub unsafe fn launch(&mut self) -> Result<()> {
        // SAFETY: the caller's contract is this function's; `LaunchKernel` enqueues the kernel
        // with exactly what it is given.
        unsafe { self.enqueue(LaunchKernel) }
    }

    /// The path every launch takes, ordinary or with attributes ([`crate::launch`]): the
    /// configuration and argument checks, then `driver.check` (the attributes' own
    /// checks, before anything is claimed), then the claim of the buffer arguments (and
    /// of the module's tracker once it has global views), then `driver.call`, with the
    /// claim held. Inlined into each caller, so the ordinary launch pays nothing for the
    /// attributes' path.
    ///
    /// # Safety
    ///
    /// [`launch`](Self::launch)'s contract.
    #[inline(always)]
    pub(crate) unsafe fn enqueue(&mut self, driver: impl DriverLaunch) -> Result<()> {
        if self.stream.bound().device().ordinal() != self.func.module.device().ordinal() {
            return Err(self.module_device_error());
        }
        let (error, size_error) = self.args.errors();
        if let Some(e) = error {
            return Err(e.clone());
        }
        self.func.check_launch(&self.cfg, self.args.len())?;
        if let Some(e) = size_error {
            return Err(e.clone());
        }
        driver.check(self)?;
        self.stream.ensure_stream_context()?;
        // The fast path ([`crate::access`]): when every buffer and the module publish this
        // stream, nothing waits and nothing changes; hold the stream's gate across the
        // enqueue and take no tracker lock. Never for a foreign stream, whose claim id
        // nothing publishes: its launches claim, and record its end mark.
        let slot = self.stream.slot();
        let id = slot.id();
        let (module, module_access) = self.func.module_use();
        let gate = slot.lock_gate();
        if module.admits(id, module_access) && self.args.all_admit(id) {
            // SAFETY: forwarded; every buffer is ordered on this stream, and the gate
            // keeps it so until the enqueue returns (`crate::access::fast`).
            let launched = unsafe { self.call_driver(driver) };
            drop(gate);
            // A fresh `Ok` writes one word; returning `launched` itself would copy an
            // `Error`'s size through the stack.
            return if launched.is_ok() { Ok(()) } else { launched };
        }
        drop(gate);
        // SAFETY: forwarded: this function's contract; the stream context is checked.
        unsafe { self.enqueue_claiming(driver) }
    }

    /// [`Error::WrongDevice`] for a kernel of another device than the stream's.
    #[cold]
    #[inline(never)]
    fn module_device_error(&self) -> Error {
        Error::WrongDevice {
            what: "kernel module",
            bound: self.stream.bound().device().ordinal(),
            found: self.func.module.device().ordinal(),
        }
    }

    /// [`enqueue`](Self::enqueue)'s slow path: claims the buffers and the module's
    /// tracker (a read, or a write once the module has global views: its kernels may
    /// write them without being passed them) from before the enqueue until after it, in
    /// one sorted claim. The launch is ordered after their pending uses on other streams,
    /// and recorded (and published, for the fast path) as their latest.
    ///
    /// # Safety
    ///
    /// As for `enqueue`; the stream context is checked.
    #[inline(never)]
    unsafe fn enqueue_claiming(&mut self, driver: impl DriverLaunch) -> Result<()> {
        let tracked = &self.args;
        let n = tracked.buffers() + 1;
        let module = Some(self.func.module_use());
        let mut few_uses: [Use<'_>; FEW_ARGS];
        let mut few_locks: access::Locks<'_, FEW_ARGS>;
        let mut inline_uses: [Use<'_>; INLINE_ARGS];
        let mut inline_locks: access::Locks<'_, INLINE_ARGS>;
        let _claim_few;
        let _claim_inline;
        let _claim_spilled;
        if n <= FEW_ARGS {
            // The usual launch: smaller arrays to fill and to drop.
            few_uses = tracked.uses_array::<FEW_ARGS>();
            few_uses[n - 1] = module;
            few_locks = access::locks::<FEW_ARGS>();
            _claim_few =
                access::claim(self.stream.slot(), &mut few_uses[..n], &mut few_locks[..n])?;
        } else if n <= INLINE_ARGS {
            inline_uses = tracked.uses_array::<INLINE_ARGS>();
            inline_uses[n - 1] = module;
            inline_locks = access::locks::<INLINE_ARGS>();
            _claim_inline = access::claim(
                self.stream.slot(),
                &mut inline_uses[..n],
                &mut inline_locks[..n],
            )?;
        } else {
            let mut uses: Vec<Use<'_>> = tracked.uses().collect();
            uses.push(module);
            let locks: Vec<Option<access::Held<'_>>> = uses.iter().map(|_| None).collect();
            _claim_spilled = access::claim(self.stream.slot(), &mut uses, locks)?;
        }
        // SAFETY: forwarded (the claim is held until this returns).
        unsafe { self.call_driver(driver) }
    }

    /// The last step of every launch, with its claim held: notes the kernel for
    /// `Error::ContextPoisoned`, then enqueues it.
    ///
    /// # Safety
    ///
    /// As for [`enqueue`](Self::enqueue), with the launch's buffers claimed.
    #[inline(always)]
    unsafe fn call_driver<D: DriverLaunch>(&mut self, driver: D) -> Result<()> {
        // Named in the error if this kernel poisons the context.
        self.stream
            .bound()
            .device()
            .poison_state()
            .launching(self.func.interned);
        // SAFETY: the stream's handle, valid while it is borrowed.
        let stream = unsafe { self.stream.raw() };
        // SAFETY: `DriverLaunch::call`'s contract: the function belongs to the bound
        // (current) context and the stream to it; each arg pointer points at a value
        // borrowed for 'a, which outlives this call (the driver copies the parameter bytes
        // before returning); the buffers are claimed (the caller's). Memory safety of the
        // kernel itself is the caller's contract.
        let called = unsafe {
            driver.call(
                self.func.raw,
                &self.cfg,
                stream,
                self.args.ptrs_mut().as_mut_ptr(),
            )
        };
        self.stream.bound().device().check(called)
    }
}

/// The driver call that ends a launch, and the checks it needs first: [`LaunchKernel`]
/// (`cuLaunchKernel`) or a launch with attributes (`cuLaunchKernelEx`, [`crate::launch`]).
/// A trait rather than closures so that the ordinary launch inlines it.
pub(crate) trait DriverLaunch {
    /// Checks beyond the ordinary launch's, before anything is claimed.
    fn check(&self, launch: &LaunchBuilder<'_, '_>) -> Result<()>;
    /// Enqueues `func` with `cfg` on `stream` with `params`.
    ///
    /// # Safety
    ///
    /// `func` and `stream` belong to the current context; `params` points to one valid
    /// pointer per kernel parameter, each to that parameter's bytes, alive for the call;
    /// the launch's buffers are claimed; the kernel's own conduct is
    /// [`LaunchBuilder::launch`]'s contract. Implementations enqueue exactly this.
    unsafe fn call(
        self,
        func: sys::CUfunction,
        cfg: &LaunchConfig,
        stream: sys::CUstream,
        params: *mut *mut c_void,
    ) -> Result<()>;
}

/// The ordinary launch: `cuLaunchKernel`, nothing more to check.
pub(crate) struct LaunchKernel;

impl DriverLaunch for LaunchKernel {
    #[inline(always)]
    fn check(&self, _: &LaunchBuilder<'_, '_>) -> Result<()> {
        Ok(())
    }

    #[inline(always)]
    unsafe fn call(
        self,
        func: sys::CUfunction,
        cfg: &LaunchConfig,
        stream: sys::CUstream,
        params: *mut *mut c_void,
    ) -> Result<()> {
        // SAFETY: the trait's contract: a function and stream of the current context,
        // parameters alive for the call (the driver copies them before returning).
        unsafe {
            result::module::launch_kernel(
                func,
                cfg.grid_dim,
                cfg.block_dim,
                cfg.shared_mem_bytes,
                stream,
                params,
                std::ptr::null_mut(),
            )
        }
    }
}
