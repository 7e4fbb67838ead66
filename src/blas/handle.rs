//! The [`Blas`] handle: a cuBLAS handle, a cuBLASLt handle (created on first use) and the
//! workspace both use, shared with the graphs that captured products of the handle.

use super::lt::LtPlans;
use super::select::AlgoSelection;
use super::sys::{self, LtHandle, check};
use crate::access::AccessTracker;
use crate::context::BoundDevice;
use crate::device::Device;
use crate::driver::libraries::{self as libs, CublasHandle};
use crate::error::Result;
use crate::graph::Owned;
use crate::memory::{DeviceMemory, DeviceSlice, Tracked};
use std::cell::{Cell, RefCell};
use std::sync::{Arc, OnceLock};

/// A cuBLAS handle of one device, with its workspace and a cuBLASLt handle (for
/// [`matmul_lt`](crate::BoundStream::matmul_lt), when cuBLASLt loads).
///
/// `Send` (it may move to another thread with its device) but not `Sync`: cuBLAS handles
/// must not be used by two threads at once. Products take `&Blas` — one thread's
/// products run one after the other, so a model that borrows its buffers shared can hold
/// its handle beside them — and no `&Blas` reaches another thread. The
/// handles and the workspace are shared with every graph that captured a product of this
/// `Blas` ([`Enqueue::matmul`](super::Enqueue::matmul)): dropping the `Blas` destroys them
/// only once the last such graph is gone too.
pub struct Blas {
    pub(crate) shared: Arc<Shared>,
    /// cuBLASLt descriptors and algorithms of recent [`matmul_lt`] shapes, borrowed by
    /// one product at a time (the `RefCell` also keeps `Blas` from being `Sync`).
    ///
    /// [`matmul_lt`]: crate::BoundStream::matmul_lt
    pub(crate) lt_plans: RefCell<LtPlans>,
    /// The device tables of matrix addresses that grouped GEMMs read, used in turn.
    pub(crate) grouped_tables: RefCell<super::grouped::AddressTables>,
    /// How new cuBLASLt shapes get their algorithm.
    selection: Cell<AlgoSelection>,
}

/// What a [`Blas`] shares with the graphs that captured its products: the handles (which
/// the captured kernels may refer to) and the workspace (which they use at each launch).
pub(crate) struct Shared {
    pub(crate) device: Arc<Device>,
    pub(crate) handle: CublasHandle,
    /// The cuBLASLt handle (as an address: see `Send`), created by `new_blas` or by the
    /// first Lt product.
    lt: OnceLock<usize>,
    /// The workspace (`cublasSetWorkspace_v2`, and `cublasLtMatmul`'s argument): cuBLAS
    /// then never allocates one of its own, which a graph capture cannot have. Every
    /// product claims it as written, so products of one handle on different streams, and
    /// launches of graphs that captured them, are ordered around it.
    pub(crate) workspace: DeviceSlice<u8>,
}

impl Owned for Shared {
    fn tracker(&self) -> &AccessTracker {
        Tracked::tracker(&self.workspace)
    }
}

// SAFETY: the handles are used only through a `Blas` (not `Sync`: one thread at a time,
// whose current context is the handle's, which BoundStream proves) and destroyed by the
// last owner's drop; a graph holding `Shared` never calls into them. The workspace is
// device memory ordered by its tracker.
unsafe impl Send for Shared {}
// SAFETY: as for Send: `&Shared` exposes the tracker and the handle values, which only
// a `Blas`, on its one thread, passes to cuBLAS.
unsafe impl Sync for Shared {}
// SAFETY: as for Shared; the cached cuBLASLt descriptors are host objects used only
// through the `Blas` (not `Sync`), by one product at a time (`RefCell`); moving it moves
// them with it.
unsafe impl Send for Blas {}

/// The workspace size NVIDIA recommends for cuBLAS (`cublasSetWorkspace`): 32 MiB on
/// Hopper (compute capability 9.x) and later, 4 MiB before.
pub(crate) fn workspace_bytes(compute_capability: (u32, u32)) -> usize {
    if compute_capability.0 >= 9 {
        32 << 20
    } else {
        4 << 20
    }
}

impl std::fmt::Debug for Blas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blas")
            .field("device", &self.shared.device.ordinal())
            .field("workspace_bytes", &self.shared.workspace.len())
            .finish_non_exhaustive()
    }
}

impl Blas {
    /// The handle's device.
    pub fn device(&self) -> &Arc<Device> {
        &self.shared.device
    }

    /// How [`matmul_lt`](crate::BoundStream::matmul_lt) products of a shape this `Blas`
    /// has not planned get their algorithm: cuBLASLt's heuristic (the default) or the
    /// fastest of its candidates, timed once per shape and device ([`AlgoSelection`]).
    /// Shapes planned before are planned again under the new selection.
    ///
    /// Plain products ([`matmul`](crate::BoundStream::matmul) and the others through
    /// cuBLAS) keep cuBLAS's own choice: a product whose algorithm should be timed goes
    /// through `matmul_lt` with [`Epilogue::Default`](super::Epilogue::Default).
    pub fn set_algo_selection(&self, selection: AlgoSelection) {
        if self.selection.replace(selection) != selection {
            self.lt_plans.borrow_mut().clear();
        }
    }

    /// The selection [`set_algo_selection`](Self::set_algo_selection) set.
    pub fn algo_selection(&self) -> AlgoSelection {
        self.selection.get()
    }

    /// The cuBLAS handle.
    pub(crate) fn handle(&self) -> CublasHandle {
        self.shared.handle
    }

    /// The cuBLASLt handle, created by `new_blas` or, if that failed, on first use (the
    /// handle's context must be current).
    pub(crate) fn lt_handle(&self) -> Result<LtHandle> {
        if let Some(&h) = self.shared.lt.get() {
            return Ok(h as LtHandle);
        }
        let api = sys::cublaslt()?;
        let mut h: LtHandle = std::ptr::null_mut();
        // SAFETY: the caller made the handle's context current; writes one handle.
        check(unsafe { (api.create)(&mut h) }, "cublasLtCreate")?;
        // Set only here, by the one thread that holds this `Blas`, and unset just above.
        let _ = self.shared.lt.set(h as usize);
        Ok(h)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // A handle exists only if the library loaded (it created the handle).
        let Ok(api) = libs::cublas() else { return };
        let destroy = api.destroy;
        let handle = self.handle as usize;
        let lt = self
            .lt
            .get()
            .copied()
            .and_then(|h| sys::cublaslt().ok().map(|api| (api.destroy, h)));
        // cuBLAS documents that cublasDestroy synchronises the device, so it runs on the
        // release thread, bounded by GPUBIND_DROP_TIMEOUT (crate::teardown::release).
        crate::teardown::release(
            crate::teardown::Teardown {
                what: format_args!("a cuBLAS handle"),
                device: &self.device,
                waited: Ok(()),
                call: "cublasDestroy_v2",
                runs: crate::teardown::Runs::OnReleaseThread,
            },
            move || {
                if let Some((destroy_lt, h)) = lt {
                    // SAFETY: created by cublasLtCreate in this context; destroyed once,
                    // here; no product of it is pending (the Blas and every graph that
                    // captured one are gone).
                    let status = unsafe { destroy_lt(h as LtHandle) };
                    if let Err(e) = check(status, "cublasLtDestroy") {
                        log::warn!("gpubind: dropping a cuBLASLt handle: {e}");
                    }
                }
                // SAFETY: created by cublasCreate in this context (current while this
                // runs); destroyed once, here.
                let status = unsafe { destroy(handle as CublasHandle) };
                check(status, "cublasDestroy_v2")
            },
        );
    }
}

impl<'a> BoundDevice<'a> {
    /// Creates a cuBLAS handle for the bound device; [`Error::NoCublas`] if no `libcublas`
    /// fitting the driver can be loaded (which one: [`cublas_info`](crate::cublas_info)). It also creates a
    /// cuBLASLt handle when cuBLASLt loads (else [`matmul_lt`] reports why).
    ///
    /// [`matmul_lt`]: crate::BoundStream::matmul_lt
    ///
    /// [`Error::NoCublas`]: crate::Error::NoCublas
    pub fn new_blas(&self) -> Result<Blas> {
        self.ensure_current()?;
        let api = libs::cublas()?;
        let bytes = workspace_bytes(self.device().compute_capability()?);
        // SAFETY: scratch that cuBLAS writes before it reads; never read by gpubind.
        let workspace = unsafe { self.alloc::<u8>(bytes)? };
        let mut handle: CublasHandle = std::ptr::null_mut();
        // SAFETY: the bound context is current; writes one handle.
        check(unsafe { (api.create)(&mut handle) }, "cublasCreate_v2")?;
        let blas = Blas {
            shared: Arc::new(Shared {
                device: Arc::clone(self.device()),
                handle,
                lt: OnceLock::new(),
                workspace,
            }),
            lt_plans: RefCell::default(),
            grouped_tables: RefCell::default(),
            selection: Cell::default(),
        };
        // The cuBLASLt handle now if cuBLASLt loads, so that a capture never has to
        // create it; without cuBLASLt, plain products still work and `matmul_lt` reports
        // why (it tries again).
        if let Err(e) = blas.lt_handle() {
            log::debug!("gpubind: no cuBLASLt handle yet: {e}");
        }
        Ok(blas)
    }
}

/// [`MatmulError::Aliasing`](super::MatmulError::Aliasing) when `output` overlaps one of
/// `inputs` (one allocation, overlapping bytes).
pub(crate) fn refuse_aliasing(
    output: (&'static str, crate::memory::ByteSpan),
    inputs: &[(&'static str, crate::memory::ByteSpan)],
) -> Result<()> {
    for (name, span) in inputs {
        if output.1.overlaps(span) {
            return Err(super::MatmulError::Aliasing {
                output: output.0,
                input: name,
            }
            .into());
        }
    }
    Ok(())
}

/// The byte span of `m`.
pub(crate) fn span_of<T, M: DeviceMemory<T> + ?Sized>(m: &M) -> crate::memory::ByteSpan {
    crate::memory::ByteSpan::of(m)
}
