//! Grouped GEMM (`cublasGemmGroupedBatchedEx`, cuBLAS 12.5 and later): groups of
//! products of different shapes in one call, their matrices at offsets of three buffers.

use super::gemm::{bind_stream, with_pointer_mode};
use super::handle::{Blas, refuse_aliasing, span_of};
use super::plan::{self, Plan, check_devices};
use super::sys::{self, check};
use super::types::{BlasScalar, DataType, GemmGroup};
use crate::access::Access;
use crate::context::BoundDevice;
use crate::device::Device;
use crate::driver::libraries as libs;
use crate::error::{MatmulError, Result};
use crate::memory::{DeviceMemory, DeviceMemoryMut, DeviceSlice, Tracked};
use crate::stream::BoundStream;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// The host arrays of one grouped call (one entry per non-empty group) and the matrix
/// addresses (one per product, in cuBLAS's operand order: all first operands, then all
/// second ones, then all C).
#[derive(Debug, Default)]
pub(crate) struct GroupedCall {
    pub(crate) transa: Vec<c_int>,
    pub(crate) transb: Vec<c_int>,
    pub(crate) m: Vec<c_int>,
    pub(crate) n: Vec<c_int>,
    pub(crate) k: Vec<c_int>,
    pub(crate) lda: Vec<c_int>,
    pub(crate) ldb: Vec<c_int>,
    pub(crate) ldc: Vec<c_int>,
    pub(crate) alpha: Vec<f32>,
    pub(crate) beta: Vec<f32>,
    pub(crate) size: Vec<c_int>,
    /// Each product's element offsets `[a, b, c]`, and whether cuBLAS's first operand
    /// is the caller's B (row-major groups: [`plan::plan`]).
    pub(crate) offsets: Vec<([usize; 3], bool)>,
}

/// Device tables of matrix addresses for grouped GEMMs, used in turn: writing one waits
/// only for the product that last read it, [`TABLES`] calls back, so the host runs ahead
/// of the device instead of waiting for each product (as freeing a table per call would).
#[derive(Default)]
pub(crate) struct AddressTables {
    tables: Vec<DeviceSlice<u64>>,
    next: usize,
}

/// How many address tables a [`Blas`] keeps.
const TABLES: usize = 4;

impl AddressTables {
    /// Writes `addresses` to the start of the next table (on the bound device's legacy
    /// stream, after the table's previous reader), grown when too short; its index.
    fn fill(&mut self, bound: &BoundDevice<'_>, addresses: &[u64]) -> Result<usize> {
        let slot = self.next;
        self.next = (self.next + 1) % TABLES;
        if self.tables.len() <= slot {
            self.tables.push(bound.clone_htod(addresses)?);
            return Ok(slot);
        }
        if self.tables[slot].len() < addresses.len() {
            let len = addresses.len().next_power_of_two();
            // SAFETY: written below before cuBLAS reads it; only the written part is read.
            self.tables[slot] = unsafe { bound.alloc::<u64>(len)? };
        }
        let table = &mut self.tables[slot];
        bound.htod_copy(addresses, &mut table.slice_mut(..addresses.len())?)?;
        Ok(slot)
    }
}

/// `error` in product `problem` of group `group`.
fn in_group(group: usize, problem: usize, error: MatmulError) -> MatmulError {
    MatmulError::InGroup {
        group,
        problem,
        error: Box::new(error),
    }
}

/// Checks that `offset + span` elements fit a buffer of `len`.
fn fits(operand: &'static str, offset: usize, span: usize, len: usize) -> Result<(), MatmulError> {
    let end = offset.checked_add(span).ok_or(MatmulError::TooLarge {
        what: "offset",
        value: offset,
    })?;
    if span == 0 || end <= len {
        return Ok(());
    }
    Err(MatmulError::BufferSize {
        operand,
        shape: format!("{span} elements at offset {offset}"),
        expected: end,
        found: len,
        exact: false,
    })
}

/// Checks every group against buffers of `lens = [A, B, C]` elements and builds the
/// call; C spans of two products must not overlap.
pub(crate) fn plan_grouped(
    groups: &[GemmGroup],
    dtype: DataType,
    lens: [usize; 3],
) -> Result<GroupedCall, MatmulError> {
    if !matches!(dtype, DataType::F16 | DataType::Bf16) {
        return Err(MatmulError::Unsupported {
            what: "grouped GEMM (f16 and bf16 only)".into(),
            dtype: dtype.name(),
        });
    }
    let mut call = GroupedCall::default();
    let mut outputs: Vec<(usize, usize, usize, usize)> = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        let err = |p, e| in_group(g, p, e);
        let [a, b, c] = plan::operands(&group.shape, None).map_err(|e| err(0, e))?;
        let spans = [a.matrix_span(), b.matrix_span(), c.matrix_span()];
        let [sa, sb, sc] = spans.map(|s| s.map_err(|e| err(0, e)));
        let (sa, sb, sc) = (sa?, sb?, sc?);
        let plan: Plan =
            plan::plan(&group.shape, dtype, None, [sa, sb, sc]).map_err(|e| err(0, e))?;
        for (p, &[oa, ob, oc]) in group.offsets.iter().enumerate() {
            fits("A", oa, sa, lens[0]).map_err(|e| err(p, e))?;
            fits("B", ob, sb, lens[1]).map_err(|e| err(p, e))?;
            fits("C", oc, sc, lens[2]).map_err(|e| err(p, e))?;
            if !plan.empty && sc > 0 {
                outputs.push((oc, oc + sc, g, p));
            }
        }
        if plan.empty || group.offsets.is_empty() {
            continue;
        }
        push_group(&mut call, group, &plan).map_err(|e| err(0, e))?;
    }
    outputs.sort_unstable();
    for w in outputs.windows(2) {
        if w[1].0 < w[0].1 {
            let (g, p) = (w[1].2, w[1].3);
            let input = "the C of another product";
            return Err(in_group(g, p, MatmulError::Aliasing { output: "C", input }));
        }
    }
    Ok(call)
}

/// Appends a checked, non-empty group.
fn push_group(call: &mut GroupedCall, group: &GemmGroup, plan: &Plan) -> Result<(), MatmulError> {
    call.transa.push(c_int::from(plan.transa));
    call.transb.push(c_int::from(plan.transb));
    call.m.push(plan.m);
    call.n.push(plan.n);
    call.k.push(plan.k);
    call.lda.push(plan.lda);
    call.ldb.push(plan.ldb);
    call.ldc.push(plan.ldc);
    call.alpha.push(group.shape.alpha as f32);
    call.beta.push(group.shape.beta as f32);
    let size = group.offsets.len();
    call.size
        .push(c_int::try_from(size).map_err(|_| MatmulError::TooLarge {
            what: "group size",
            value: size,
        })?);
    call.offsets
        .extend(group.offsets.iter().map(|&o| (o, plan.swapped)));
    Ok(())
}

impl<'b> BoundStream<'b> {
    /// Enqueues groups of matrix products of different shapes in one call (cuBLAS
    /// `GemmGroupedBatchedEx`), for f16 and bf16 (f32 accumulation): each [`GemmGroup`]
    /// has one [`Matmul`](super::Matmul) shape (dimensions, transposes, layout, leading
    /// dimensions, alpha, beta) and one product per entry of its offsets, reading its A
    /// and B and writing its C at those element offsets of `a`, `b` and `c` — the way a
    /// mixture of experts keeps every expert's weights in one tensor. `a` and `b` are
    /// claimed as read, `c` as written.
    ///
    /// Every matrix must lie within its buffer, two products' C (from first to last
    /// element) must not overlap, and `c` must not overlap `a` or `b`: otherwise a
    /// [`MatmulError::InGroup`](super::MatmulError::InGroup) naming the group and the
    /// product, or [`MatmulError::Aliasing`](super::MatmulError::Aliasing). cuBLAS
    /// before 12.5 lacks the entry point:
    /// [`MatmulError::NeedsCublas`](super::MatmulError::NeedsCublas). The matrices'
    /// addresses are copied to a small device table first (cuBLAS reads them there); the
    /// `Blas` keeps a few such tables and reuses them in turn, so the copy waits only for
    /// the grouped product that used the same table a few calls back.
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{blas::{GemmGroup, Matmul}, Device, ThreadContext};
    /// use half::bf16;
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let blas = gpu.new_blas()?;
    /// // Expert 0 takes 3 tokens, expert 1 takes 5: Y_e = X_e · W_eᵀ, 16 → 8 features.
    /// let x = gpu.clone_htod(&vec![bf16::ONE; 8 * 16])?;
    /// let w = gpu.clone_htod(&vec![bf16::ONE; 2 * 8 * 16])?;
    /// let mut y = gpu.alloc_zeros::<bf16>(8 * 8)?;
    /// let groups = [
    ///     GemmGroup::new(Matmul::new(3, 8, 16).transpose_b()).problem(0, 0, 0),
    ///     GemmGroup::new(Matmul::new(5, 8, 16).transpose_b()).problem(3 * 16, 8 * 16, 3 * 8),
    /// ];
    /// gpu.default_stream().matmul_grouped(&blas, &groups, &x, &w, &mut y)?;
    /// assert!(gpu.dtoh(&y)?.iter().all(|v| v.to_f32() == 16.0));
    /// # Ok(()) }
    /// ```
    pub fn matmul_grouped<T: BlasScalar>(
        &self,
        blas: &Blas,
        groups: &[GemmGroup],
        a: &impl DeviceMemory<T>,
        b: &impl DeviceMemory<T>,
        c: &mut impl DeviceMemoryMut<T>,
    ) -> Result<()> {
        let bound = self.bound();
        let device = bound.device();
        let matrices: [(_, &Device); 3] = [
            ("matrix A", a.device()),
            ("matrix B", b.device()),
            ("matrix C", c.device()),
        ];
        check_devices(device, blas.device(), &matrices)?;
        let call = plan_grouped(groups, T::DATA_TYPE, [a.len(), b.len(), c.len()])?;
        refuse_aliasing(("C", span_of(&*c)), &[("A", span_of(a)), ("B", span_of(b))])?;
        if call.size.is_empty() {
            return Ok(());
        }
        let grouped = grouped_entry_point()?;
        let elem = std::mem::size_of::<T>() as u64;
        let (pa, pb, pc) = (a.device_ptr(), b.device_ptr(), c.device_ptr());
        let at = |base: u64, off: usize| base + off as u64 * elem;
        let first = |&([oa, ob, _], swapped): &([usize; 3], bool)| {
            if swapped { at(pb, ob) } else { at(pa, oa) }
        };
        let second = |&([oa, ob, _], swapped): &([usize; 3], bool)| {
            if swapped { at(pa, oa) } else { at(pb, ob) }
        };
        let mut table: Vec<u64> = call.offsets.iter().map(first).collect();
        table.extend(call.offsets.iter().map(second));
        table.extend(call.offsets.iter().map(|(o, _)| at(pc, o[2])));
        let mut tables = blas.grouped_tables.borrow_mut();
        let slot = tables.fill(bound, &table)?;
        let table = &tables.tables[slot];
        bound.ensure_current()?;
        let shared = Arc::clone(&blas.shared);
        let _claim = self.claim([
            Some((a.tracker(), Access::Read)),
            Some((b.tracker(), Access::Read)),
            Some((c.tracker(), Access::Write)),
            Some((crate::graph::Owned::tracker(&*shared), Access::Write)),
            Some((Tracked::tracker(table), Access::Read)),
        ])?;
        let count = call.offsets.len() as u64;
        let ptrs = table.device_ptr();
        let arrays = (ptrs, ptrs + count * 8, ptrs + 2 * count * 8);
        let handle = blas.handle();
        let ty = T::DATA_TYPE.cuda();
        // SAFETY: the handle's context is current and the stream is one of its streams.
        // Every matrix the table points at lies within its claimed buffer (checked for
        // each product with the group's dimensions and leading dimensions); the C
        // matrices do not overlap each other or A and B; the table (device memory, as
        // cuBLAS requires, kept by the Blas) holds one address per product and operand
        // from its start and is claimed as read, so it is rewritten or freed only after
        // the product; the host arrays hold one entry per group and outlive the call
        // (host pointer mode, set for it).
        unsafe {
            bind_stream(blas, self.raw())?;
            with_pointer_mode(blas, sys::POINTER_MODE_HOST, || {
                let status = grouped(
                    handle,
                    call.transa.as_ptr(),
                    call.transb.as_ptr(),
                    call.m.as_ptr(),
                    call.n.as_ptr(),
                    call.k.as_ptr(),
                    call.alpha.as_ptr().cast::<c_void>(),
                    arrays.0 as *const *const c_void,
                    ty,
                    call.lda.as_ptr(),
                    arrays.1 as *const *const c_void,
                    ty,
                    call.ldb.as_ptr(),
                    call.beta.as_ptr().cast::<c_void>(),
                    arrays.2 as *const *mut c_void,
                    ty,
                    call.ldc.as_ptr(),
                    call.size.len() as c_int,
                    call.size.as_ptr(),
                    sys::COMPUTE_32F,
                );
                check(status, "cublasGemmGroupedBatchedEx")
            })
        }
    }
}

/// `cublasGemmGroupedBatchedEx` from the loaded cuBLAS, or
/// [`MatmulError::NeedsCublas`] naming the version that has it.
fn grouped_entry_point() -> Result<sys::GemmGroupedBatchedExFn> {
    let ex = sys::cublas_ex()?;
    match ex.gemm_grouped_batched_ex {
        Some(f) => Ok(f),
        None => Err(MatmulError::NeedsCublas {
            what: "matmul_grouped",
            symbol: "cublasGemmGroupedBatchedEx",
            needed: sys::GROUPED_GEMM_SINCE,
            loaded: libs::cublas()?.info.version,
        }
        .into()),
    }
}
