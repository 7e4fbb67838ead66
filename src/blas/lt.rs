//! cuBLASLt products with epilogues: the descriptors and algorithms (cached per shape in
//! the [`Blas`]), and [`BoundStream::matmul_lt`].

use super::call::{LtCall, matrix_claims};
use super::epilogue::{Epilogue, Extra, LtArgs, Role};
use super::gemm::{Ptrs, Scales};
use super::handle::Blas;
use super::plan::Plan;
use super::select::{self, AlgoSelection, Scratch};
use super::sys::{self, LtAlgo, LtDesc, LtHandle, LtHeuristic, LtLayout, LtPref, check};
use super::types::{BlasScalar, DataType, Matmul};
use crate::access::Access;
use crate::driver::result;
use crate::error::MatmulError;
use crate::error::{Error, Result};
use crate::memory::{DeviceMemory, DeviceMemoryMut};
use crate::stream::BoundStream;
use cudarc::driver::sys as driver;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// What selects a cuBLASLt descriptor set and algorithm: everything but the addresses
/// (whose alignments count) and the scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct LtKey {
    dtype: DataType,
    tf32: bool,
    epilogue: u32,
    trans: (bool, bool),
    mnk: (i32, i32, i32),
    ld: (i32, i32, i32),
    aux_ld: i64,
    /// Alignments of cuBLAS's A, B and C (the addend, or D itself), of the bias and aux
    /// operands, and of D, in bytes.
    align: [u32; 6],
}

#[cfg(test)]
impl LtKey {
    /// A bf16 `m`×64×64 product with no epilogue, all operands 256-byte aligned.
    pub(crate) fn example(m: i32) -> LtKey {
        LtKey {
            dtype: DataType::Bf16,
            tf32: false,
            epilogue: 1,
            trans: (false, false),
            mnk: (m, 64, 64),
            ld: (m, 64, m),
            aux_ld: 0,
            align: [256; 6],
        }
    }
}

/// The largest power of two (up to 256) that divides `addr`: what cuBLASLt may assume
/// of a pointer when it picks an algorithm.
pub(crate) fn alignment(addr: u64) -> u32 {
    if addr == 0 {
        256
    } else {
        1u32 << addr.trailing_zeros().min(8)
    }
}

/// A descriptor set with the algorithm chosen for it ([`AlgoSelection`]).
pub(crate) struct LtPlan {
    desc: LtDesc,
    /// cuBLAS's A, B and C (= D).
    layouts: [LtLayout; 3],
    algo: LtAlgo,
}

impl Drop for LtPlan {
    fn drop(&mut self) {
        // Descriptors exist only if cuBLASLt loaded (it created them).
        let Ok(api) = sys::cublaslt() else { return };
        for &l in &self.layouts {
            if !l.is_null() {
                // SAFETY: created by cublasLtMatrixLayoutCreate, destroyed once, here
                // (host objects: no product in flight refers to them).
                unsafe { (api.layout_destroy)(l) };
            }
        }
        if !self.desc.is_null() {
            // SAFETY: as above, for cublasLtMatmulDescCreate.
            unsafe { (api.desc_destroy)(self.desc) };
        }
    }
}

/// The most recently used descriptor sets of one [`Blas`].
#[derive(Default)]
pub(crate) struct LtPlans {
    plans: Vec<(LtKey, LtPlan)>,
}

/// How many descriptor sets a [`Blas`] keeps.
const LT_PLANS: usize = 32;

impl LtPlans {
    /// The plan for `key`, made by `make` on a miss.
    fn get_or_make(
        &mut self,
        key: LtKey,
        make: impl FnOnce() -> Result<LtPlan>,
    ) -> Result<&LtPlan> {
        let i = match self.position(&key) {
            Some(i) => i,
            None => {
                self.insert(key, make()?);
                self.plans.len() - 1
            }
        };
        Ok(&self.plans[i].1)
    }

    /// Where the plan for `key` is kept, if it is.
    fn position(&self, key: &LtKey) -> Option<usize> {
        self.plans.iter().position(|(k, _)| k == key)
    }

    /// Keeps `plan` for `key`, which has none (the oldest is dropped when full).
    fn insert(&mut self, key: LtKey, plan: LtPlan) {
        if self.plans.len() == LT_PLANS {
            self.plans.remove(0);
        }
        self.plans.push((key, plan));
    }

    /// Drops every plan (their algorithms were chosen under another selection).
    pub(crate) fn clear(&mut self) {
        self.plans.clear();
    }
}

/// Sets one attribute of a descriptor or preference to `value`.
///
/// # Safety
///
/// `obj` is a live object of the kind `set` takes, and `V` the attribute's C type.
unsafe fn set_attr<V>(
    set: sys::SetAttrFn,
    obj: *mut c_void,
    attr: c_int,
    value: &V,
    call: &'static str,
) -> Result<()> {
    // SAFETY: the caller's contract; `value` is read during the call only.
    let status = unsafe { set(obj, attr, (value as *const V).cast(), size_of::<V>()) };
    check(status, call)
}

/// The addresses a product passes to cuBLASLt besides A, B and C.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EpiloguePtrs {
    pub(crate) bias: u64,
    pub(crate) aux: u64,
    /// The addend cuBLASLt reads as C (0: none; C is then D).
    pub(crate) addend: u64,
}

impl EpiloguePtrs {
    pub(crate) fn of(extras: &[Extra<'_>]) -> Self {
        let find = |roles: &[Role]| {
            extras
                .iter()
                .find(|e| roles.contains(&e.role))
                .map_or(0, |e| e.ptr)
        };
        EpiloguePtrs {
            bias: find(&[Role::Bias, Role::BiasGrad]),
            aux: find(&[Role::Aux, Role::AuxOut, Role::ReluMask, Role::ReluMaskOut]),
            addend: find(&[Role::Addend]),
        }
    }

    /// What cuBLASLt reads as C for a product writing D at `d`: the addend, or D itself.
    pub(crate) fn c_read(&self, d: u64) -> u64 {
        if self.addend == 0 { d } else { self.addend }
    }

    /// Points `desc` at the bias and aux operands the epilogue uses.
    ///
    /// # Safety
    ///
    /// `desc` is a live matmul descriptor.
    unsafe fn set(&self, desc: LtDesc, epilogue: Epilogue) -> Result<()> {
        let api = sys::cublaslt()?;
        let (bias, aux) = (self.bias as *const c_void, self.aux as *const c_void);
        if epilogue.uses(Role::Bias) || epilogue.uses(Role::BiasGrad) {
            // SAFETY: the caller's contract; BIAS_POINTER is a `void*`.
            unsafe { set_attr(api.desc_set, desc, sys::DESC_BIAS_POINTER, &bias, SET_DESC)? };
        }
        if epilogue.aux_ld_used() {
            // SAFETY: as above; EPILOGUE_AUX_POINTER is a `void*`.
            let p = sys::DESC_EPILOGUE_AUX_POINTER;
            unsafe { set_attr(api.desc_set, desc, p, &aux, SET_DESC)? };
        }
        Ok(())
    }
}

const SET_DESC: &str = "cublasLtMatmulDescSetAttribute";
const SET_PREF: &str = "cublasLtMatmulPreferenceSetAttribute";

impl Epilogue {
    fn aux_ld_used(self) -> bool {
        [Role::Aux, Role::AuxOut, Role::ReluMask, Role::ReluMaskOut]
            .iter()
            .any(|&r| self.uses(r))
    }
}

/// What choosing an algorithm for a new plan needs besides the descriptors: the
/// selection, the device (whose timed choices apply), the product's shape (its scales)
/// and the stream whose earlier work a timing waits for (a gpubind stream that is not
/// capturing; none for another library's stream, the legacy stream or a capture).
pub(crate) struct Choose<'a> {
    pub(crate) selection: AlgoSelection,
    pub(crate) ordinal: usize,
    pub(crate) wait: Option<driver::CUstream>,
    pub(crate) shape: &'a Matmul,
}

/// A product's Lt-specific description: the plan and key plus what makes the descriptor.
pub(crate) struct LtProblem {
    pub(crate) plan: Plan,
    pub(crate) key: LtKey,
    pub(crate) epilogue: Epilogue,
    pub(crate) ptrs: EpiloguePtrs,
}

impl LtProblem {
    pub(crate) fn new(
        plan: Plan,
        shape: &Matmul,
        dtype: DataType,
        epilogue: Epilogue,
        (a, b, c): Ptrs,
        ptrs: EpiloguePtrs,
    ) -> Self {
        let (first, second) = if plan.swapped { (b, a) } else { (a, b) };
        let key = LtKey {
            dtype,
            tf32: shape.tf32,
            epilogue: epilogue.code(plan.swapped),
            trans: (plan.transa, plan.transb),
            mnk: (plan.m, plan.n, plan.k),
            ld: (plan.lda, plan.ldb, plan.ldc),
            aux_ld: epilogue.aux_ld(shape).map_or(0, |l| l as i64),
            align: [
                alignment(first),
                alignment(second),
                alignment(ptrs.c_read(c)),
                alignment(ptrs.bias),
                alignment(ptrs.aux),
                alignment(c),
            ],
        };
        LtProblem {
            plan,
            key,
            epilogue,
            ptrs,
        }
    }

    /// Creates the descriptors and chooses the algorithm as `how` says; with a note of
    /// what a timing found, for the log.
    ///
    /// # Safety
    ///
    /// The handle's context is current and `how.wait`, if any, is one of its streams.
    unsafe fn make(
        &self,
        handle: LtHandle,
        workspace: usize,
        how: &Choose<'_>,
    ) -> Result<(LtPlan, Option<String>)> {
        let api = sys::cublaslt()?;
        let (k, p) = (&self.key, &self.plan);
        let mut out = LtPlan {
            desc: std::ptr::null_mut(),
            layouts: [std::ptr::null_mut(); 3],
            algo: LtAlgo::default(),
        };
        let compute = k.dtype.compute(k.tf32);
        // SAFETY: writes one descriptor, owned (and destroyed) by `out`.
        let status = unsafe { (api.desc_create)(&mut out.desc, compute, k.dtype.scale_cuda()) };
        check(status, "cublasLtMatmulDescCreate")?;
        let (ta, tb) = (c_int::from(k.trans.0), c_int::from(k.trans.1));
        // SAFETY: a live descriptor; TRANSA/TRANSB are cublasOperation_t (int32),
        // EPILOGUE a uint32, EPILOGUE_AUX_LD an int64.
        unsafe {
            set_attr(api.desc_set, out.desc, sys::DESC_TRANSA, &ta, SET_DESC)?;
            set_attr(api.desc_set, out.desc, sys::DESC_TRANSB, &tb, SET_DESC)?;
            set_attr(
                api.desc_set,
                out.desc,
                sys::DESC_EPILOGUE,
                &k.epilogue,
                SET_DESC,
            )?;
            if self.epilogue.aux_ld_used() {
                let ld = sys::DESC_EPILOGUE_AUX_LD;
                set_attr(api.desc_set, out.desc, ld, &k.aux_ld, SET_DESC)?;
            }
            self.ptrs.set(out.desc, self.epilogue)?;
        }
        let dims = |t: bool, r: i32, c: i32| if t { (c, r) } else { (r, c) };
        let shapes = [
            (dims(p.transa, p.m, p.k), p.lda),
            (dims(p.transb, p.k, p.n), p.ldb),
            ((p.m, p.n), p.ldc),
        ];
        for (slot, ((rows, cols), ld)) in out.layouts.iter_mut().zip(shapes) {
            // SAFETY: writes one layout, owned (and destroyed) by `out`.
            let status = unsafe {
                (api.layout_create)(slot, k.dtype.cuda(), rows as u64, cols as u64, ld as i64)
            };
            check(status, "cublasLtMatrixLayoutCreate")?;
        }
        let mut note = None;
        out.algo = match how.selection {
            AlgoSelection::Timed { .. } if how.selection.requested() > 1 => {
                let count = how.selection.requested();
                match select::timed_choice(how.ordinal, count, &self.key) {
                    Some(Some(algo)) => algo,
                    Some(None) => self.heuristic(handle, &out, workspace, 1)?[0],
                    None => {
                        let candidates = self.heuristic(handle, &out, workspace, count)?;
                        let (best, what) = if candidates.len() > 1 {
                            // SAFETY: the caller's contract: the context is current and
                            // `how.wait` is one of its streams.
                            unsafe { self.time(handle, &out, &candidates, workspace, how) }?
                        } else {
                            (candidates.first().copied(), "one candidate".to_string())
                        };
                        note = Some(what);
                        select::keep_choice(how.ordinal, count, self.key, best)
                            .unwrap_or(candidates[0])
                    }
                }
            }
            _ => self.heuristic(handle, &out, workspace, 1)?[0],
        };
        Ok((out, note))
    }

    /// The fastest of `candidates` for `plan`'s descriptors, run on scratch memory on a
    /// stream of their own after `how.wait` drained; `None` when the scratch cannot be
    /// had or no candidate runs. With a note of the times, for the log.
    ///
    /// # Safety
    ///
    /// The handle's context is current and `how.wait`, if any, is one of its streams.
    unsafe fn time(
        &self,
        handle: LtHandle,
        plan: &LtPlan,
        candidates: &[LtAlgo],
        workspace: usize,
        how: &Choose<'_>,
    ) -> Result<(Option<LtAlgo>, String)> {
        let api = sys::cublaslt()?;
        let (k, p) = (&self.key, &self.plan);
        let at = select::scratch_layout(scratch_parts(p, k.dtype, k.aux_ld, workspace));
        let (n_cand, rounds) = (candidates.len(), select::ROUNDS);
        crate::driver::with_relaxed_capture_mode(|| -> Result<(Option<LtAlgo>, String)> {
            if let Some(stream) = how.wait {
                // SAFETY: the caller's contract: a live gpubind stream of the current
                // context, which only gpubind's captures (on streams of their own) could
                // capture; a host wait, which the relaxed mode allows.
                unsafe { result::stream::synchronize(stream) }?;
            }
            let events = 2 * n_cand * rounds;
            // SAFETY: the current context (the caller's contract) stays current here.
            let scratch = match unsafe { Scratch::new(at[6], k.dtype, events) } {
                Ok(s) => s,
                Err(e) => return Ok((None, format!("no scratch ({e}); heuristic"))),
            };
            let addr = |i: usize| scratch.base + at[i] as u64;
            // C is D in the scratch: an addend is never read by a timing.
            let ptrs = EpiloguePtrs {
                bias: addr(3),
                aux: addr(4),
                addend: 0,
            };
            // SAFETY: a live descriptor of this plan, used by this thread only.
            unsafe { ptrs.set(plan.desc, self.epilogue) }?;
            let scales = Scales::new(k.dtype, how.shape);
            let (alpha, beta) = scales.ptrs();
            let [la, lb, lc] = plan.layouts;
            let run = |algo: &LtAlgo| {
                // SAFETY: live handle, descriptor and layouts; every operand, the
                // epilogue's and the workspace lie in the scratch allocation at offsets
                // sized for what the layouts reach (`parts`), ordered on its stream;
                // alpha and beta are host scalars alive for the call.
                unsafe {
                    (api.matmul)(
                        handle,
                        plan.desc,
                        alpha,
                        addr(0) as *const c_void,
                        la,
                        addr(1) as *const c_void,
                        lb,
                        beta,
                        addr(2) as *const c_void,
                        lc,
                        addr(2) as *mut c_void,
                        lc,
                        algo,
                        addr(5) as *mut c_void,
                        workspace,
                        scratch.stream.cast(),
                    )
                }
            };
            // One untimed run of each (which also tells which run at all), then the
            // rounds, every candidate in turn. A candidate that fails any run (cuBLASLt
            // refuses it on the host) is out.
            let mut ran: Vec<bool> = candidates.iter().map(|a| run(a) == 0).collect();
            for round in 0..rounds {
                for (i, algo) in candidates.iter().enumerate() {
                    if !ran[i] {
                        continue;
                    }
                    let e = 2 * (round * n_cand + i);
                    // SAFETY: the scratch's live events and stream.
                    unsafe { result::event::record(scratch.event(e), scratch.stream) }?;
                    for _ in 0..select::REPS {
                        ran[i] &= run(algo) == 0;
                    }
                    // SAFETY: as above.
                    unsafe { result::event::record(scratch.event(e + 1), scratch.stream) }?;
                }
            }
            if !ran.contains(&true) {
                return Ok((None, "no candidate ran; heuristic".into()));
            }
            // A host wait (relaxed mode) for everything recorded above.
            scratch.wait()?;
            let mut times = vec![None; n_cand];
            for (i, t) in times.iter_mut().enumerate().filter(|(i, _)| ran[*i]) {
                let mut best = f32::INFINITY;
                for round in 0..rounds {
                    let e = 2 * (round * n_cand + i);
                    // SAFETY: both events recorded on one stream and complete.
                    let ms = unsafe {
                        crate::driver::version::event_elapsed_ms(
                            scratch.event(e),
                            scratch.event(e + 1),
                        )
                    }?;
                    best = best.min(ms);
                }
                *t = Some(best / select::REPS as f32);
            }
            let best = select::fastest(&times);
            let note = format!("ms per run {times:?}, fastest {best:?}");
            Ok((best.map(|i| candidates[i]), note))
        })?
    }

    /// The heuristic's first `count` algorithms for `plan`'s descriptors (at least one).
    fn heuristic(
        &self,
        handle: LtHandle,
        plan: &LtPlan,
        workspace: usize,
        count: usize,
    ) -> Result<Vec<LtAlgo>> {
        let api = sys::cublaslt()?;
        let mut pref: LtPref = std::ptr::null_mut();
        // SAFETY: writes one preference, destroyed below.
        check(
            unsafe { (api.pref_create)(&mut pref) },
            "cublasLtMatmulPreferenceCreate",
        )?;
        let mut results = vec![LtHeuristic::default(); count.max(1)];
        let mut found: c_int = 0;
        let out = (|| {
            let bytes = workspace as u64;
            // SAFETY: a live preference; MAX_WORKSPACE_BYTES is a uint64, the
            // MIN_ALIGNMENT_{A,B,C,D}_BYTES attributes (consecutive) uint32s.
            unsafe {
                let max = sys::PREF_MAX_WORKSPACE_BYTES;
                set_attr(api.pref_set, pref, max, &bytes, SET_PREF)?;
                for (i, align) in [0, 1, 2, 5].map(|i| self.key.align[i]).iter().enumerate() {
                    let attr = sys::PREF_MIN_ALIGNMENT_A_BYTES + i as c_int;
                    set_attr(api.pref_set, pref, attr, align, SET_PREF)?;
                }
            }
            let [a, b, c] = plan.layouts;
            // SAFETY: live handle, descriptors and preference; writes at most
            // `results.len()` results.
            let status = unsafe {
                (api.heuristic)(
                    handle,
                    plan.desc,
                    a,
                    b,
                    c,
                    c,
                    pref,
                    results.len() as c_int,
                    results.as_mut_ptr(),
                    &mut found,
                )
            };
            // CUBLAS_STATUS_NOT_SUPPORTED: no algorithm fits.
            if status == 15 || (status == 0 && found < 1) {
                return Err(MatmulError::NoAlgorithm(self.describe()).into());
            }
            check(status, "cublasLtMatmulAlgoGetHeuristic")
        })();
        // SAFETY: created above, destroyed once, here.
        unsafe { (api.pref_destroy)(pref) };
        let found = (found.max(0) as usize).min(results.len());
        let algos: Vec<LtAlgo> = results[..found]
            .iter()
            .filter(|r| r.state == 0)
            .map(|r| r.algo)
            .collect();
        out.and_then(|()| {
            if algos.is_empty() {
                Err(MatmulError::NoAlgorithm(self.describe()).into())
            } else {
                Ok(algos)
            }
        })
    }

    fn describe(&self) -> String {
        let k = &self.key;
        format!(
            "{:?} {}×{}×{} (column-major view, transposes {:?}) with epilogue {}",
            k.dtype,
            k.mnk.0,
            k.mnk.1,
            k.mnk.2,
            k.trans,
            self.epilogue.name()
        )
    }
}

/// Makes `blas`'s plan for `problem` if it has none, choosing its algorithm as the
/// handle's selection says (timing it, waiting for `wait` first, when timed): before the
/// product's buffers are claimed, and with no borrow of the plans held while it times
/// or logs.
///
/// # Safety
///
/// The handle's context is current and `wait`, if any, is a live stream of it.
pub(crate) unsafe fn prepare_lt(
    blas: &Blas,
    problem: &LtProblem,
    shape: &Matmul,
    wait: Option<driver::CUstream>,
) -> Result<()> {
    if blas.lt_plans.borrow().position(&problem.key).is_some() {
        return Ok(());
    }
    let handle = blas.lt_handle()?;
    let how = Choose {
        selection: blas.algo_selection(),
        ordinal: blas.shared.device.ordinal(),
        wait,
        shape,
    };
    // SAFETY: the caller's contract.
    let (plan, note) = unsafe { problem.make(handle, blas.shared.workspace.len(), &how) }?;
    blas.lt_plans.borrow_mut().insert(problem.key, plan);
    if let Some(note) = note {
        log::debug!("gpubind: timed {}: {note}", problem.describe());
    }
    Ok(())
}

/// Bytes of scratch a timing of the product planned as `p` reads and writes: what the
/// column-major layouts of cuBLAS's A, B and C reach (`(cols − 1)·ld + rows` elements
/// each), a bias of up to `max(m, n)` elements of up to 8 bytes, the aux operand's
/// `aux_ld·n` elements (as the product's own aux buffer holds), and the workspace.
pub(crate) fn scratch_parts(
    p: &Plan,
    dtype: DataType,
    aux_ld: i64,
    workspace: usize,
) -> [usize; 6] {
    let el = dtype.bytes();
    let u = |x: i32| x.max(0) as usize;
    // Saturating: a span too large for memory is refused by the allocation, never cut.
    let span = |rows: usize, cols: usize, ld: usize| {
        if rows == 0 || cols == 0 {
            0
        } else {
            (cols - 1)
                .saturating_mul(ld)
                .saturating_add(rows)
                .saturating_mul(el)
        }
    };
    let dims = |t: bool, r: i32, c: i32| if t { (u(c), u(r)) } else { (u(r), u(c)) };
    let (ar, ac) = dims(p.transa, p.m, p.k);
    let (br, bc) = dims(p.transb, p.k, p.n);
    let aux_ld = usize::try_from(aux_ld).unwrap_or(0);
    [
        span(ar, ac, u(p.lda)),
        span(br, bc, u(p.ldb)),
        span(u(p.m), u(p.n), u(p.ldc)),
        u(p.m.max(p.n)) * 8,
        aux_ld.saturating_mul(u(p.n)).saturating_mul(el),
        workspace,
    ]
}

/// Enqueues a checked Lt product on `stream`.
///
/// # Safety
///
/// As for [`enqueue_gemm`](super::gemm::enqueue_gemm), and the epilogue's operands at
/// `problem.ptrs` are live allocations of the lengths `LtCall::check` accepted, kept alive and
/// ordered like the matrices.
pub(crate) unsafe fn enqueue_lt(
    blas: &Blas,
    problem: &LtProblem,
    shape: &Matmul,
    stream: driver::CUstream,
    (a, b, c): Ptrs,
) -> Result<()> {
    let api = sys::cublaslt()?;
    let handle = blas.lt_handle()?;
    let shared = Arc::clone(&blas.shared);
    let ws = &shared.workspace;
    let mut plans = blas.lt_plans.borrow_mut();
    // `prepare_lt` made the plan (and timed it) before the product's buffers were
    // claimed; the heuristic serves should it be missing.
    let how = Choose {
        selection: AlgoSelection::Heuristic,
        ordinal: shared.device.ordinal(),
        wait: None,
        shape,
    };
    // SAFETY: the caller's contract: the context is current; no stream is waited for.
    let lt = plans.get_or_make(problem.key, || {
        unsafe { problem.make(handle, ws.len(), &how) }.map(|p| p.0)
    })?;
    // SAFETY: a live descriptor of this Blas, used by this thread only (`Blas` is not
    // `Sync`; the plans stay borrowed until the product is enqueued).
    unsafe { problem.ptrs.set(lt.desc, problem.epilogue)? };
    let (first, second) = if problem.plan.swapped { (b, a) } else { (a, b) };
    let scales = Scales::new(problem.key.dtype, shape);
    let (alpha, beta) = scales.ptrs();
    let [la, lb, lc] = lt.layouts;
    // cuBLASLt's C: the addend if there is one (C's layout and length, not overlapping
    // it: checked), else D itself.
    let c_in = problem.ptrs.c_read(c);
    // SAFETY: the caller's contract: the context is current, the stream is one of its
    // streams, the buffers hold what the layouts reach and are claimed; the workspace is
    // the handle's (claimed likewise), of the size the heuristic was told; alpha and
    // beta are host scalars of the scale type alive for the call; cuBLASLt's C is the
    // addend, a buffer of D's layout and length that does not overlap it (checked), or
    // D (in place, which cuBLASLt allows with identical layouts).
    let status = unsafe {
        (api.matmul)(
            handle,
            lt.desc,
            alpha,
            first as *const c_void,
            la,
            second as *const c_void,
            lb,
            beta,
            c_in as *const c_void,
            lc,
            c as *mut c_void,
            lc,
            &lt.algo,
            ws.device_ptr() as *mut c_void,
            ws.len(),
            stream.cast(),
        )
    };
    check(status, "cublasLtMatmul")
}

impl<'b> BoundStream<'b> {
    /// Enqueues a cuBLASLt product with an epilogue: `C = epilogue(alpha·op(A)·op(B) +
    /// beta·C)`, or `+ beta·addend` with [`LtArgs::addend`] (see [`Epilogue`] for what
    /// each computes and which operands of `args` it reads or writes). The same types,
    /// layouts, checks and claims as [`matmul`](Self::matmul) (not batched); the
    /// epilogue's inputs and the addend are claimed as reads, its outputs as writes. An
    /// epilogue the type does not take, an operand missing or extra, an addend of
    /// another length than C, overlapping an output, or with `beta` 0, or a combination
    /// cuBLASLt has no algorithm for is a [`MatmulError`].
    ///
    /// The descriptors and the algorithm are cached in the [`Blas`] per shape, layout,
    /// epilogue and operand alignment; the algorithm is cuBLASLt's heuristic's first, or
    /// the fastest of its candidates timed once ([`Blas::set_algo_selection`]).
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{blas::{Epilogue, LtArgs, Matmul}, Device, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let blas = gpu.new_blas()?;
    /// // Y = gelu(X·W + b), keeping Z = X·W + b for the backward pass.
    /// let (batch, inp, out) = (32, 64, 128);
    /// let shape = Matmul::new(batch, out, inp);
    /// let x = gpu.alloc_zeros::<f32>(batch * inp)?;
    /// let w = gpu.alloc_zeros::<f32>(inp * out)?;
    /// let b = gpu.alloc_zeros::<f32>(out)?;
    /// let mut y = gpu.alloc_zeros::<f32>(batch * out)?;
    /// let mut z = gpu.alloc_zeros::<f32>(shape.gelu_aux_len())?;
    /// let args = LtArgs::new().bias(&b).aux_out(&mut z);
    /// gpu.default_stream().matmul_lt(&blas, &shape, Epilogue::GeluAuxBias, &x, &w, &mut y, args)?;
    /// # Ok(()) }
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_lt<T: BlasScalar>(
        &self,
        blas: &Blas,
        shape: &Matmul,
        epilogue: Epilogue,
        a: &impl DeviceMemory<T>,
        b: &impl DeviceMemory<T>,
        c: &mut impl DeviceMemoryMut<T>,
        args: LtArgs<'_, T>,
    ) -> Result<()> {
        let call = LtCall::new::<T, _, _, _>(shape, epilogue, (a, b, &*c), args.extras());
        self.lt_call(blas, call)
    }

    /// Checks, claims and enqueues a described Lt product, the epilogue's operands each
    /// claimed as its role says. C is claimed as written: the public callers hold it by
    /// `&mut`, or ([`Enqueue`](super::Enqueue)) by `&` of device-only memory, which
    /// nothing reads or writes except through its tracker.
    pub(crate) fn lt_call(&self, blas: &Blas, call: LtCall<'_, '_>) -> Result<()> {
        let bound = self.bound();
        let plan = call.check(bound.device(), blas)?;
        if plan.empty {
            return Ok(());
        }
        let extras = &call.extras;
        // Every epilogue uses at most two operands (`tests`), and an addend makes three:
        // all are claimed below.
        if extras.len() > 3 {
            return Err(Error::InvalidArgument(
                "matmul_lt: more than three epilogue operands".into(),
            ));
        }
        bound.ensure_current()?;
        let problem = call.problem(plan);
        // A gpubind stream (never capturing: captures run on streams of their own) is
        // waited for before a timing; another library's stream or the legacy one is not
        // (docs/safety.md, "cudarc interop").
        let wait = match self.slot() {
            // SAFETY: the handle of this live stream, only waited for (nothing enqueued).
            crate::access::StreamSlot::Owned(s) if !s.foreign => Some(unsafe { self.raw() }),
            _ => None,
        };
        // SAFETY: the handle's context is current (checked above); `wait` is this live
        // stream of it.
        unsafe { prepare_lt(blas, &problem, call.shape, wait) }?;
        let shared = Arc::clone(&blas.shared);
        let [a, b, c] = matrix_claims(&call.matrices);
        let _claim = self.claim([
            a,
            b,
            c,
            Some((crate::graph::Owned::tracker(&*shared), Access::Write)),
            extras.first().map(Extra::claim),
            extras.get(1).map(Extra::claim),
            extras.get(2).map(Extra::claim),
        ])?;
        // SAFETY: the handle's context is current (checked above) and the stream is one
        // of its streams; the matrices and the epilogue's operands were checked against
        // the plan and, with the workspace, are claimed for this stream until after the
        // enqueue.
        unsafe { call.enqueue(blas, &problem, self.raw()) }
    }
}
