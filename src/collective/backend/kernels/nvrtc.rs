//! The own backend's device code: one NVRTC-compiled module per device holding a
//! multi-input, multi-output reduce/copy kernel for every (data type, operator).
//!
//! `gb_<op>_<dtype>(Ptrs in, unsigned nin, Ptrs out, unsigned nout, u64 n, unsigned div)`
//! reads `n` elements from each of the `nin` inputs, combines them with `<op>`, divides
//! by `div` when `div > 1` (for [`Op::Avg`]) and writes the result to each of the
//! `nout` outputs. With one input it is a copy to many outputs (broadcast, all-gather).
//! Pointers may be local, peer (after `cuCtxEnablePeerAccess`) or mapped pinned host
//! memory. When every pointer is 16-byte aligned the kernel moves 16 bytes per load.
//!
//! Integers wrap (two's complement), like NCCL; `f16`/`bf16` are combined in `f32`.

use crate::collective::api::types::{DTYPES, DType, Op};
use crate::context::BoundDevice;
use crate::driver::result;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::Arc;

/// Most pointers one launch takes on each side; more are handled in several passes.
pub(crate) const MAXP: usize = 16;

/// Threads per block.
const BLOCK: u32 = 256;

/// The four combining operators compiled (`Avg` is `Sum` with a divisor).
const OPS: [&str; 4] = ["sum", "prod", "min", "max"];

fn op_index(op: Op) -> usize {
    match op {
        Op::Sum | Op::Avg => 0,
        Op::Prod => 1,
        Op::Min => 2,
        Op::Max => 3,
    }
}

/// Kernel name for a data type and operator.
pub(crate) fn kernel_name(dtype: &str, op: Op) -> String {
    format!("gb_{}_{dtype}", OPS[op_index(op)])
}

const PRELUDE: &str = r#"
typedef unsigned long long u64;
#define MAXP 16
struct Ptrs { u64 p[MAXP]; };
struct alignas(16) Vec16 { unsigned w[4]; };
struct h16 { unsigned short x; };
struct b16 { unsigned short x; };

template <typename T> struct Num {
    typedef T C;
    static __device__ __forceinline__ C ld(T v) { return v; }
    static __device__ __forceinline__ T st(C c) { return c; }
    static __device__ __forceinline__ C add(C a, C b) { return a + b; }
    static __device__ __forceinline__ C mul(C a, C b) { return a * b; }
    static __device__ __forceinline__ C div(C a, unsigned d) { return a / (C)d; }
};
template <> struct Num<int> {
    typedef int C;
    static __device__ __forceinline__ C ld(int v) { return v; }
    static __device__ __forceinline__ int st(C c) { return c; }
    static __device__ __forceinline__ C add(C a, C b) { return (int)((unsigned)a + (unsigned)b); }
    static __device__ __forceinline__ C mul(C a, C b) { return (int)((unsigned)a * (unsigned)b); }
    static __device__ __forceinline__ C div(C a, unsigned d) { return a / (int)d; }
};
template <> struct Num<long long> {
    typedef long long C;
    static __device__ __forceinline__ C ld(long long v) { return v; }
    static __device__ __forceinline__ long long st(C c) { return c; }
    static __device__ __forceinline__ C add(C a, C b) { return (long long)((u64)a + (u64)b); }
    static __device__ __forceinline__ C mul(C a, C b) { return (long long)((u64)a * (u64)b); }
    static __device__ __forceinline__ C div(C a, unsigned d) { return a / (long long)d; }
};
template <> struct Num<unsigned char> {
    typedef unsigned C;
    static __device__ __forceinline__ C ld(unsigned char v) { return v; }
    static __device__ __forceinline__ unsigned char st(C c) { return (unsigned char)(c & 0xffu); }
    static __device__ __forceinline__ C add(C a, C b) { return a + b; }
    static __device__ __forceinline__ C mul(C a, C b) { return a * b; }
    static __device__ __forceinline__ C div(C a, unsigned d) { return a / d; }
};
template <> struct Num<h16> {
    typedef float C;
    static __device__ __forceinline__ C ld(h16 v) {
        float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x)); return f;
    }
    static __device__ __forceinline__ h16 st(C c) {
        h16 v; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(v.x) : "f"(c)); return v;
    }
    static __device__ __forceinline__ C add(C a, C b) { return a + b; }
    static __device__ __forceinline__ C mul(C a, C b) { return a * b; }
    static __device__ __forceinline__ C div(C a, unsigned d) { return a / (float)d; }
};
template <> struct Num<b16> {
    typedef float C;
    static __device__ __forceinline__ C ld(b16 v) {
        union { unsigned u; float f; } c; c.u = ((unsigned)v.x) << 16; return c.f;
    }
    static __device__ __forceinline__ b16 st(C f) {
        union { unsigned u; float f; } c; c.f = f;
        unsigned u = c.u; b16 v;
        if ((u & 0x7fffffffu) > 0x7f800000u) { v.x = (unsigned short)((u >> 16) | 0x40u); return v; }
        u += 0x7fffu + ((u >> 16) & 1u);
        v.x = (unsigned short)(u >> 16);
        return v;
    }
    static __device__ __forceinline__ C add(C a, C b) { return a + b; }
    static __device__ __forceinline__ C mul(C a, C b) { return a * b; }
    static __device__ __forceinline__ C div(C a, unsigned d) { return a / (float)d; }
};

template <typename T, int OP>
__device__ __forceinline__ typename Num<T>::C combine(typename Num<T>::C a, typename Num<T>::C b) {
    if (OP == 0) return Num<T>::add(a, b);
    if (OP == 1) return Num<T>::mul(a, b);
    if (OP == 2) return b < a ? b : a;
    return a < b ? b : a;
}

template <typename T>
__device__ __forceinline__ T finish(typename Num<T>::C acc, unsigned d) {
    T t = Num<T>::st(acc);
    if (d > 1) t = Num<T>::st(Num<T>::div(Num<T>::ld(t), d));
    return t;
}

template <typename T, int OP>
__device__ __forceinline__ void reduce_body(const Ptrs& in, unsigned nin, const Ptrs& out,
                                            unsigned nout, u64 n, unsigned d) {
    typedef typename Num<T>::C C;
    constexpr unsigned V = 16 / sizeof(T);
    u64 mis = 0;
#pragma unroll
    for (unsigned i = 0; i < MAXP; ++i) {
        if (i < nin) mis |= in.p[i];
        if (i < nout) mis |= out.p[i];
    }
    const u64 nv = (mis & 15ull) == 0 ? n / V : 0;
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 v = tid; v < nv; v += stride) {
        union { Vec16 u; T t[V]; } a;
        a.u = ((const Vec16*)in.p[0])[v];
        C acc[V];
#pragma unroll
        for (unsigned k = 0; k < V; ++k) acc[k] = Num<T>::ld(a.t[k]);
#pragma unroll
        for (unsigned i = 1; i < MAXP; ++i) {
            if (i < nin) {
                a.u = ((const Vec16*)in.p[i])[v];
#pragma unroll
                for (unsigned k = 0; k < V; ++k) acc[k] = combine<T, OP>(acc[k], Num<T>::ld(a.t[k]));
            }
        }
#pragma unroll
        for (unsigned k = 0; k < V; ++k) a.t[k] = finish<T>(acc[k], d);
#pragma unroll
        for (unsigned o = 0; o < MAXP; ++o) {
            if (o < nout) ((Vec16*)out.p[o])[v] = a.u;
        }
    }
    for (u64 e = nv * V + tid; e < n; e += stride) {
        C acc = Num<T>::ld(((const T*)in.p[0])[e]);
#pragma unroll
        for (unsigned i = 1; i < MAXP; ++i) {
            if (i < nin) acc = combine<T, OP>(acc, Num<T>::ld(((const T*)in.p[i])[e]));
        }
        T t = finish<T>(acc, d);
#pragma unroll
        for (unsigned o = 0; o < MAXP; ++o) {
            if (o < nout) ((T*)out.p[o])[e] = t;
        }
    }
}

#define GB_KERNEL(OPNAME, OPID, NAME, T)                                                   \
    extern "C" __global__ void gb_##OPNAME##_##NAME(Ptrs in, unsigned nin, Ptrs out,       \
                                                     unsigned nout, u64 n, unsigned d) {   \
        reduce_body<T, OPID>(in, nin, out, nout, n, d);                                    \
    }
#define GB_TYPE(NAME, T)                                                                   \
    GB_KERNEL(sum, 0, NAME, T) GB_KERNEL(prod, 1, NAME, T)                                 \
    GB_KERNEL(min, 2, NAME, T) GB_KERNEL(max, 3, NAME, T)
"#;

/// The full CUDA source of the collective kernels.
pub(crate) fn source() -> String {
    let mut src = PRELUDE.to_owned();
    for (name, ctype) in DTYPES {
        let ctype = if ctype.contains(' ') {
            // Two-word C types get a one-word alias for the macro argument.
            let alias = format!("gb_{name}_t");
            src.push_str(&format!("typedef {ctype} {alias};\n"));
            alias
        } else {
            ctype.to_owned()
        };
        src.push_str(&format!("GB_TYPE({name}, {ctype})\n"));
    }
    src
}

/// A raw `CUfunction` that may cross threads.
#[derive(Clone, Copy)]
struct RawFn(sys::CUfunction);
// SAFETY: a function handle is a thread-agnostic identifier; it is only launched with
// its module's context current, and the module stays loaded while its device lives
// (`Device::kept`), which every launcher holds.
unsafe impl Send for RawFn {}
// SAFETY: as above; launching is thread-safe in the driver.
unsafe impl Sync for RawFn {}

/// The loaded kernels of one device: one set per device and process, kept by the device
/// ([`KernelSet::of`]). Its module is unloaded only with the device (by `Device`'s drop),
/// never by a communicator's drop: `cuModuleUnload` waits for every piece of work on the
/// device, so a communicator that unloaded its own module waited for unrelated user
/// kernels.
pub(crate) struct KernelSet {
    funcs: Vec<RawFn>,
    /// Blocks to launch at most (a few per SM: the kernels are grid-stride loops).
    max_blocks: u32,
}

/// The kernels' parameter block: `MAXP` addresses passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct Ptrs {
    p: [u64; MAXP],
}

impl KernelSet {
    /// The bound device's kernels: compiled (NVRTC, for this device's architecture) and
    /// loaded on the first call in the process, then shared by every communicator of the
    /// device. The module stays loaded while the device lives; whoever launches from
    /// the set holds an `Arc<Device>` of it.
    pub(crate) fn of(gpu: &BoundDevice<'_>) -> Result<Arc<KernelSet>> {
        gpu.device().kept(|| KernelSet::load(gpu))
    }

    /// Compiles and loads the kernels; the module is handed to the caller.
    fn load(gpu: &BoundDevice<'_>) -> Result<(KernelSet, Vec<sys::CUmodule>)> {
        let module = gpu.compile_and_load(&source(), "gpubind_collective.cu")?;
        let mut funcs = Vec::with_capacity(DTYPES.len() * OPS.len());
        for (name, _) in DTYPES {
            for op in [Op::Sum, Op::Prod, Op::Min, Op::Max] {
                let f = module.function(&kernel_name(name, op))?;
                // SAFETY: the handle is valid while the module is loaded; the device
                // keeps it loaded for its lifetime (`Device::kept`).
                funcs.push(RawFn(unsafe { f.raw() }));
            }
        }
        let sms = gpu.device().multiprocessor_count()?;
        let raw = module.into_raw().ok_or_else(|| {
            Error::InvalidArgument("the collective kernels' module has global views".into())
        })?;
        Ok((
            KernelSet {
                funcs,
                max_blocks: (sms * 8).max(1),
            },
            vec![raw],
        ))
    }

    /// Enqueues `outs[*][i] = op(ins[*][i])` for `i < n` on `stream`, dividing by
    /// `nranks` for [`Op::Avg`]; any number of inputs (≥ 1) and outputs.
    ///
    /// # Safety
    ///
    /// This set's device must be current and `stream` one of its streams. Every
    /// pointer must address `n` elements of `dtype` that this device can access
    /// (local, peer-enabled or mapped host memory) until the stream reaches this
    /// point; outputs must not overlap inputs except element-for-element.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn reduce(
        &self,
        stream: sys::CUstream,
        dtype: DType,
        op: Op,
        ins: &[u64],
        outs: &[u64],
        n: usize,
        nranks: usize,
    ) -> Result<()> {
        if n == 0 || outs.is_empty() {
            return Ok(());
        }
        if ins.is_empty() {
            return Err(Error::InvalidArgument(
                "a reduction needs at least one input".into(),
            ));
        }
        let div = if op == Op::Avg { nranks as u32 } else { 1 };
        let f = self.funcs[dtype.index * OPS.len() + op_index(op)];
        let copy = self.funcs[dtype.index * OPS.len()];
        // Fold inputs beyond MAXP into outs[0] first (never dividing before the end).
        let mut rest = ins;
        let first_out = outs[0];
        let mut acc: Option<u64> = None;
        while rest.len() + usize::from(acc.is_some()) > MAXP {
            let take = MAXP - usize::from(acc.is_some());
            let batch: Vec<u64> = acc
                .iter()
                .copied()
                .chain(rest[..take].iter().copied())
                .collect();
            // SAFETY: forwarded contract; outs[0] is written element-for-element.
            unsafe { self.launch(f, stream, &batch, &[first_out], n, dtype.size, 1)? };
            acc = Some(first_out);
            rest = &rest[take..];
        }
        let last: Vec<u64> = acc.iter().copied().chain(rest.iter().copied()).collect();
        let head = outs.len().min(MAXP);
        // SAFETY: forwarded contract.
        unsafe { self.launch(f, stream, &last, &outs[..head], n, dtype.size, div)? };
        for more in outs[head..].chunks(MAXP) {
            // SAFETY: copies the finished outs[0] to further outputs.
            unsafe { self.launch(copy, stream, &[first_out], more, n, dtype.size, 1)? };
        }
        Ok(())
    }

    /// One launch with at most `MAXP` inputs and outputs.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch(
        &self,
        f: RawFn,
        stream: sys::CUstream,
        ins: &[u64],
        outs: &[u64],
        n: usize,
        esize: usize,
        div: u32,
    ) -> Result<()> {
        debug_assert!(!ins.is_empty() && ins.len() <= MAXP && outs.len() <= MAXP);
        let mut pin = Ptrs { p: [0; MAXP] };
        pin.p[..ins.len()].copy_from_slice(ins);
        let mut pout = Ptrs { p: [0; MAXP] };
        pout.p[..outs.len()].copy_from_slice(outs);
        let (nin, nout, n64) = (ins.len() as u32, outs.len() as u32, n as u64);
        let work = n.div_ceil((16 / esize).max(1)) as u64;
        let blocks = work.div_ceil(BLOCK as u64).clamp(1, self.max_blocks as u64) as u32;
        let mut params: [*mut c_void; 6] = [
            &mut pin as *mut Ptrs as *mut c_void,
            &nin as *const u32 as *mut c_void,
            &mut pout as *mut Ptrs as *mut c_void,
            &nout as *const u32 as *mut c_void,
            &n64 as *const u64 as *mut c_void,
            &div as *const u32 as *mut c_void,
        ];
        // SAFETY: `f` takes (Ptrs, unsigned, Ptrs, unsigned, u64, unsigned), matching
        // `params`, which point to locals alive for the call (the driver copies them);
        // the memory contract is the caller's.
        unsafe {
            result::module::launch_kernel(
                f.0,
                (blocks, 1, 1),
                (BLOCK, 1, 1),
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_instantiates_every_kernel() {
        let src = source();
        for (name, _) in DTYPES {
            for op in [Op::Sum, Op::Prod, Op::Min, Op::Max, Op::Avg] {
                let k = kernel_name(name, op);
                let (o, t) = k.trim_start_matches("gb_").split_once('_').unwrap();
                assert!(src.contains(&format!("GB_TYPE({t},")), "{k}");
                assert!(OPS.contains(&o));
            }
        }
        assert_eq!(kernel_name("f16", Op::Avg), "gb_sum_f16");
        assert!(src.contains("typedef long long gb_i64_t;"));
    }

    #[test]
    fn ptrs_is_128_bytes() {
        assert_eq!(std::mem::size_of::<Ptrs>(), 8 * MAXP);
    }
}
