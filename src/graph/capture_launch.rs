//! [`CaptureLaunch`]: the kernel-launch builder of a [`Capture`].

use super::capture::Capture;
use crate::access::{Access, AccessTracker};
use crate::driver::result;
use crate::error::{Error, Result};
use crate::launch::LaunchConfig;
use crate::memory::DeviceRepr;
use crate::module::{Function, KernelArg, LaunchArg, ModuleHold, WritableArg, arg_access};
use std::ffi::c_void;

/// A buffer argument of a captured launch: its tracker, the bytes it passes (`None`:
/// all of its allocation), and how the kernel uses them.
type ArgBuffer<'buf> = (&'buf AccessTracker, Option<(u64, u64)>, Access);

/// A kernel launch being captured; see [`Capture::launch`].
#[must_use = "a launch does nothing until `.launch()` is called"]
pub struct CaptureLaunch<'l, 'c, 'buf> {
    capture: &'l mut Capture<'c, 'buf>,
    func: &'l Function<'buf>,
    cfg: LaunchConfig,
    args: Vec<*mut c_void>,
    /// Arguments given by value ([`value`](CaptureLaunch::value)), boxed so their
    /// addresses in `args` stay put.
    values: Vec<Box<dyn std::any::Any>>,
    /// The gpubind buffers among the arguments, the bytes each passes (`None`: all),
    /// and whether the kernel reads or writes them.
    buffers: Vec<ArgBuffer<'buf>>,
    error: Option<Error>,
}

impl std::fmt::Debug for CaptureLaunch<'_, '_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptureLaunch")
            .field("function", &self.func.name())
            .field("config", &self.cfg)
            .field("args", &self.args.len())
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<'l, 'c, 'buf> CaptureLaunch<'l, 'c, 'buf> {
    /// A launch of `func` into `capture`, failing with `error` (if any) when launched.
    pub(super) fn new(
        capture: &'l mut Capture<'c, 'buf>,
        func: &'l Function<'buf>,
        cfg: LaunchConfig,
        error: Option<Error>,
    ) -> Self {
        CaptureLaunch {
            capture,
            func,
            cfg,
            args: Vec::new(),
            values: Vec::new(),
            buffers: Vec::new(),
            error,
        }
    }

    /// Appends an argument, borrowed for the graph's lifetime. A gpubind buffer passed
    /// by `&` is claimed as read at every launch of the graph, one passed by `&mut` as
    /// written (see [`LaunchBuilder::arg`](crate::LaunchBuilder::arg)); within the
    /// graph, reads captured on two branches of a [`fork`](Capture::fork) stay
    /// concurrent. A `&mut` borrow lasts as long as the graph: a buffer that the graph
    /// writes more than once, or that other code uses while the graph lives, goes by
    /// [`arg_written`](Self::arg_written). Errors (another device's memory, a size
    /// mismatch) are reported by [`launch`](Self::launch). Plain data that does not
    /// live as long as the graph goes by [`value`](Self::value).
    pub fn arg<L: LaunchArg<'buf>>(&mut self, arg: L) -> &mut Self {
        let access = arg_access::<L>();
        self.push_arg(arg.into_arg(), access)
    }

    /// Appends an argument that the kernel writes, borrowed shared for the graph's
    /// lifetime, and claimed as written at every launch of the graph (as by
    /// [`arg`](Self::arg) with `&mut`). Shared borrows let one graph write a buffer in
    /// several kernels, and let other code use the buffer between the graph's launches
    /// (the claims order them; see [`Capture`](super::Capture)).
    ///
    /// ```no_run
    /// # fn f(gpu: &gpubind::BoundDevice<'_>, add_one: &gpubind::Function<'_>) -> gpubind::Result<()> {
    /// use gpubind::LaunchConfig;
    /// let x = gpu.alloc_zeros::<f32>(1024)?;
    /// let n = 1024u32;
    /// let graph = gpu.capture(|c| {
    ///     for _ in 0..3 {
    ///         // SAFETY: (float*, unsigned) matches `add_one`, which stays in bounds.
    ///         unsafe {
    ///             c.launch(add_one, LaunchConfig::for_num_elems(n))
    ///                 .arg_written(&x).arg(&n)
    ///                 .launch()?
    ///         };
    ///     }
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn arg_written<A: WritableArg + ?Sized>(&mut self, arg: &'buf A) -> &mut Self {
        self.push_arg(arg, Access::Write)
    }

    /// Appends `arg`, a buffer of which is claimed with `access`.
    fn push_arg<A: KernelArg + ?Sized>(&mut self, arg: &'buf A, access: Access) -> &mut Self {
        if self.error.is_none()
            && let Some(dev) = arg.arg_device()
        {
            self.error = self
                .capture
                .device
                .expect_same("kernel argument", dev)
                .err();
        }
        if self.error.is_none() {
            self.error = self
                .func
                .check_arg_size(self.args.len(), arg.param_size(), || arg.describe())
                .err();
        }
        if let Some(t) = arg.access_tracker() {
            self.buffers.push((t, arg.arg_span(), access));
        }
        self.args.push(arg.param_ptr());
        self
    }

    /// Appends a plain-data argument by value: the kernel node keeps a copy of its bytes
    /// (taken at capture), so unlike [`arg`](Self::arg) nothing stays borrowed. For
    /// scalars computed inside the capture:
    ///
    /// ```no_run
    /// # fn f(gpu: &gpubind::BoundDevice<'_>, scale: &gpubind::Function<'_>) -> gpubind::Result<()> {
    /// use gpubind::LaunchConfig;
    /// let x = gpu.alloc_zeros::<f32>(1024)?;
    /// let graph = gpu.capture(|c| {
    ///     for k in 0..4u32 {
    ///         // SAFETY: (float*, unsigned, float) matches `scale`, which stays in bounds.
    ///         unsafe {
    ///             c.launch(scale, LaunchConfig::for_num_elems(1024))
    ///                 .arg_written(&x).value(1024u32).value(k as f32 + 0.5)
    ///                 .launch()?
    ///         };
    ///     }
    ///     Ok(())
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn value<T: DeviceRepr>(&mut self, v: T) -> &mut Self {
        if self.error.is_none() {
            self.error = self
                .func
                .check_arg_size(self.args.len(), std::mem::size_of::<T>(), || {
                    std::any::type_name::<T>().to_owned()
                })
                .err();
        }
        let boxed = Box::new(v);
        // The heap copy does not move when the box does: the pointer stays valid while
        // `self.values` holds it.
        self.args.push(&*boxed as *const T as *mut c_void);
        self.values.push(boxed);
        self
    }

    /// Captures the kernel launch (it runs at each launch of the graph). The same checks
    /// as [`LaunchBuilder::launch`](crate::LaunchBuilder::launch), before the driver is
    /// called. May be called again (another node).
    ///
    /// # Safety
    ///
    /// The contract of [`LaunchBuilder::launch`](crate::LaunchBuilder::launch), for every
    /// launch of the graph: argument types match the kernel, the kernel stays inside the
    /// buffers passed and writes only those passed by `&mut` or
    /// [`arg_written`](Self::arg_written) (the others are claimed as reads: other
    /// streams may read them while a launch runs), and any other memory it reaches (raw
    /// addresses, page-locked host buffers) stays alive and unused by the host and other
    /// streams while any launch of the graph may run. A [`ManagedSlice`](crate::ManagedSlice) the kernel writes must
    /// not be read through [`as_slice`](crate::ManagedSlice::as_slice) while a launch may
    /// run (the graph borrows it shared).
    pub unsafe fn launch(&mut self) -> Result<()> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        self.func.check_launch(&self.cfg, self.args.len())?;
        // The kernel stays inside the bytes each argument passes (the launch contract).
        for &(t, span, access) in &self.buffers {
            match span {
                Some((lo, bytes)) => self.capture.record_span(t, access, lo, bytes)?,
                None => self.capture.record(t, access)?,
            }
        }
        // The module's unload waits for the graph's launches; with global views, the
        // launches are ordered against the globals' other uses like a write.
        let (_, access) = self.func.module_use();
        match self.func.module_hold() {
            ModuleHold::Borrowed(module) => self.capture.record(module, access)?,
            ModuleHold::Owned(loaded) => self.capture.record_owned_use(loaded, access)?,
        }
        self.capture.session.borrow_mut().uses.last_kernel = Some(self.func.interned());
        let LaunchConfig {
            grid_dim: g,
            block_dim: b,
            shared_mem_bytes,
        } = self.cfg;
        let (func, stream, args) = (self.func, self.capture.stream.0, &mut self.args);
        self.capture.marked(|| {
            // SAFETY: the function belongs to the bound (current) context and the stream
            // is capturing: the driver records a kernel node, copying the parameter
            // bytes, which point at values borrowed for 'buf. The kernel's memory safety
            // at each launch of the graph is the caller's contract.
            self.capture.device.check(unsafe {
                result::module::launch_kernel(
                    func.raw(),
                    g,
                    b,
                    shared_mem_bytes,
                    stream,
                    args.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            })
        })
    }
}
