//! `gpubench`: gpubind against cudarc 0.19's safe API and against raw driver calls, in one
//! run, on one machine. See `docs/performance.md`.
//!
//! ```text
//! gpubench [--iters N] [--quick] [--rounds R] [--markdown]
//! ```
//!
//! Prints the machine, then ONE table: per-operation cost of a small async memset, a
//! 4-byte synchronous host-to-device copy and kernel launches (one by one, and 16 of them
//! as one CUDA graph launch); a temporary per op allocated on a stream, launched on and
//! dropped (stream-ordered memory); the cost of switching
//! contexts on one thread; and the GPU memory a process uses after listing devices and
//! after its first bind (measured from a child process). Each per-op figure is the median
//! of `R` rounds that interleave the three implementations, after a warm-up.
//!
//! Without a CUDA driver it prints one line (`no CUDA driver found: ...`) and exits 1.

#![deny(unsafe_op_in_unsafe_fn)]

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, PushKernelArg, sys,
};
use gpubind::{Device, DeviceAttribute};
use gpubind::{DeviceSlice, LaunchConfig, Module, Output, Stream, ThreadContext};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

type R<T> = Result<T, Box<dyn std::error::Error>>;

/// The argument that turns a re-executed gpubench into a footprint child.
const CHILD_ARG: &str = "--footprint-child";
/// Bytes of the memset buffers.
const MEMSET_BYTES: usize = 256;
/// Elements of the kernel-argument buffers.
const TOUCH_N: u32 = 32;
/// Ops per timed batch in `submit` mode (small enough never to fill the launch queue).
const SUBMIT_BATCH: usize = 256;

const KERNELS: &str = r#"
extern "C" __global__ void empty() {}
extern "C" __global__ void touch(float* a, const float* b, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = b[i];
}
extern "C" __global__ void peek(const float* a, const float* b, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && a[i] != b[i]) __threadfence_block();
}
"#;

// ---------------------------------------------------------------------------------------
// Options and entry point
// ---------------------------------------------------------------------------------------

struct Opts {
    iters: usize,
    rounds: usize,
    markdown: bool,
}

const USAGE: &str = "usage: gpubench [--iters N (default 100000)] [--quick (iters 10000)] \
                     [--rounds R (default 5)] [--markdown]";

fn parse_args(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        iters: 100_000,
        rounds: 5,
        markdown: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut num = |name: &str| -> Result<usize, String> {
            it.next()
                .and_then(|v| v.parse::<usize>().ok())
                .filter(|&v| v > 0)
                .ok_or_else(|| format!("{name} needs a positive integer\n{USAGE}"))
        };
        match a.as_str() {
            "--iters" => o.iters = num("--iters")?,
            "--rounds" => o.rounds = num("--rounds")?,
            "--quick" => o.iters = 10_000,
            "--markdown" => o.markdown = true,
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(o)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(CHILD_ARG) {
        let kind = args.get(2).cloned().unwrap_or_default();
        if let Err(e) = footprint_child(&kind) {
            eprintln!("gpubench footprint child ({kind}): {e}");
            std::process::exit(1);
        }
        return;
    }
    let opts = match parse_args(&args[1..]) {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(2);
        }
    };
    if !gpubind::driver_available() {
        eprintln!("{}", gpubind::Error::NoDriver);
        std::process::exit(1);
    }
    match run(&opts) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("gpubench: {e}");
            std::process::exit(1);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------------------

/// The three implementations compared in every row.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Impl {
    Gpubind = 0,
    Cudarc = 1,
    Raw = 2,
}
const IMPLS: [Impl; 3] = [Impl::Gpubind, Impl::Cudarc, Impl::Raw];

/// What one call of a measured closure must do.
#[derive(Clone, Copy)]
enum Step {
    /// One iteration of the measured work.
    Op,
    /// Wait until all work enqueued so far has finished.
    Sync,
}

/// How the time is taken.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `Instant` around the whole loop plus the final synchronize: throughput.
    Wall,
    /// Only the time spent inside the enqueueing calls, in batches of [`SUBMIT_BATCH`]
    /// with an untimed synchronize between batches: the host-side cost per op.
    Submit,
}

/// Nanoseconds per iteration of `f(Step::Op)`.
fn measure(mode: Mode, iters: usize, mut f: impl FnMut(Step) -> R<()>) -> R<f64> {
    f(Step::Sync)?; // start with an idle queue
    let busy = match mode {
        Mode::Wall => {
            let t = Instant::now();
            for _ in 0..iters {
                f(Step::Op)?;
            }
            f(Step::Sync)?;
            t.elapsed()
        }
        Mode::Submit => {
            let mut busy = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                let n = SUBMIT_BATCH.min(iters - done);
                let t = Instant::now();
                for _ in 0..n {
                    f(Step::Op)?;
                }
                busy += t.elapsed();
                f(Step::Sync)?;
                done += n;
            }
            busy
        }
    };
    Ok(busy.as_nanos() as f64 / iters as f64)
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

/// Slices per round: a round's iterations run as this many slices, and every slice runs
/// the three implementations back to back (the order rotating), so the three share each
/// slice's few milliseconds of machine state. One long run per implementation per round
/// (the first design) let the host's drift between them (clock, neighbours on a shared
/// machine) move one round's gpubind/raw ratio by ±10 %, more than the 3 % goal.
const SLICES: usize = 10;

/// Warms each implementation up, then runs `rounds` rounds that interleave the three (in
/// [`SLICES`] slices per round, the order rotating every slice) and returns each one's
/// median ns/iteration over rounds. `f(imp, k)` runs `k` iterations of `imp` and returns
/// its ns/iteration, or `None` for an implementation that cannot do the row.
fn bench_row(
    rounds: usize,
    iters: usize,
    mut f: impl FnMut(Impl, usize) -> R<Option<f64>>,
) -> R<[Option<f64>; 3]> {
    let warm = (iters / 10).max(100);
    for imp in IMPLS {
        f(imp, warm)?;
    }
    let slices = SLICES.min(iters).max(1);
    let mut samples: [Vec<f64>; 3] = Default::default();
    let mut paired = Vec::new();
    let mut turn = 0;
    for _ in 0..rounds {
        // Per implementation: total ns and iterations over the round's slices.
        let mut total = [(0.0f64, 0usize, true); 3];
        for s in 0..slices {
            let k = iters / slices + usize::from(s < iters % slices);
            for j in 0..3 {
                let imp = IMPLS[(turn + j) % 3];
                let t = &mut total[imp as usize];
                match f(imp, k)? {
                    Some(ns) if t.2 => {
                        t.0 += ns * k as f64;
                        t.1 += k;
                    }
                    _ => t.2 = false,
                }
            }
            turn += 1;
        }
        let round = total.map(|(ns, k, ok)| (ok && k > 0).then(|| ns / k as f64));
        for (imp, ns) in round.iter().enumerate() {
            if let Some(ns) = ns {
                samples[imp].push(*ns);
            }
        }
        if let [Some(g), _, Some(raw)] = round
            && raw > 0.0
        {
            paired.push(g / raw);
        }
    }
    // The same ratio paired within each round (the three ran in the same slices), which
    // cancels drift between rounds and within them: its spread says how far one run's
    // ratio can be trusted. The table shows it (and judges the goals by its median): see
    // `Row::paired`.
    let stats = median(paired.clone()).map(|m| {
        let (lo, hi) = paired
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        Paired {
            median: m,
            min: lo,
            max: hi,
        }
    });
    LAST_PAIRED.with(|p| p.set(stats));
    Ok(samples.map(median))
}

/// gpubind/raw measured back to back within each round: the median and range over rounds.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Paired {
    median: f64,
    min: f64,
    max: f64,
}

thread_local! {
    /// The paired ratio of the last `bench_row` (read by the row it becomes).
    static LAST_PAIRED: std::cell::Cell<Option<Paired>> = const { std::cell::Cell::new(None) };
}

/// `Err` naming `call` unless `r` is success.
fn ck(r: sys::CUresult, call: &'static str) -> R<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(gpubind::Error::driver(call, r).into())
    }
}

/// `cuStreamSynchronize`.
fn raw_sync(stream: sys::CUstream) -> R<()> {
    // SAFETY: callers pass a live stream of the current context.
    ck(
        unsafe { sys::cuStreamSynchronize(stream) },
        "cuStreamSynchronize",
    )
}

/// `cuLaunchKernel` with `cfg`'s dimensions.
///
/// # Safety
///
/// `f` and `stream` belong to the current context; `params` points at one pointer per
/// kernel parameter, each to a value of that parameter's type (null for no parameters).
#[inline]
unsafe fn raw_launch(
    f: sys::CUfunction,
    cfg: LaunchConfig,
    stream: sys::CUstream,
    params: *mut *mut std::ffi::c_void,
) -> R<()> {
    let (g, b) = (cfg.grid_dim, cfg.block_dim);
    // SAFETY: the caller's contract above.
    let r = unsafe {
        sys::cuLaunchKernel(
            f,
            g.0,
            g.1,
            g.2,
            b.0,
            b.1,
            b.2,
            cfg.shared_mem_bytes,
            stream,
            params,
            std::ptr::null_mut(),
        )
    };
    ck(r, "cuLaunchKernel")
}

fn set_current(ctx: sys::CUcontext) -> R<()> {
    // SAFETY: every context passed here is retained or created by this program and alive.
    ck(unsafe { sys::cuCtxSetCurrent(ctx) }, "cuCtxSetCurrent")
}

// ---------------------------------------------------------------------------------------
// The resources of each implementation
// ---------------------------------------------------------------------------------------

struct GpubindSide {
    stream: Stream,
    stream2: Stream,
    buf: DeviceSlice<u8>,
    buf2: DeviceSlice<u8>,
    word: DeviceSlice<u32>,
    a: DeviceSlice<f32>,
    b: DeviceSlice<f32>,
    module: Option<Module>,
}

struct CudarcSide {
    /// Multi-stream context object (its `new_stream` turns cudarc's event tracking on).
    _ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// A second stream of the same context object, for the hand-off row.
    stream2: Arc<CudaStream>,
    buf: CudaSlice<u8>,
    a: CudaSlice<f32>,
    b: CudaSlice<f32>,
    empty: Option<CudaFunction>,
    touch: Option<CudaFunction>,
    peek: Option<CudaFunction>,
    _module: Option<Arc<CudaModule>>,
    /// A second `CudaContext` object of the same primary context, used only through its
    /// default stream (single-stream mode: no event tracking), for the htod row.
    _single: Arc<CudaContext>,
    single_default: Arc<CudaStream>,
    word: CudaSlice<u32>,
    /// A third `CudaContext` object of the same primary context, with its own stream: the
    /// "other context" of the re-bind row.
    other: CudarcExtra,
}

/// A cudarc context object with one stream and one memset buffer.
struct CudarcExtra {
    _ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    buf: CudaSlice<u8>,
}

impl CudarcExtra {
    fn new(ctx: Arc<CudaContext>) -> R<CudarcExtra> {
        let stream = ctx.new_stream()?;
        let buf = stream.alloc_zeros::<u8>(MEMSET_BYTES)?;
        stream.synchronize()?;
        Ok(CudarcExtra {
            _ctx: ctx,
            stream,
            buf,
        })
    }
}

/// Raw driver resources in the primary context of one device.
struct RawSide {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    stream2: sys::CUstream,
    /// For the hand-off row's event record + wait.
    event: sys::CUevent,
    buf: sys::CUdeviceptr,
    buf2: sys::CUdeviceptr,
    word: sys::CUdeviceptr,
    a: sys::CUdeviceptr,
    b: sys::CUdeviceptr,
    module: sys::CUmodule,
    empty: sys::CUfunction,
    touch: sys::CUfunction,
    peek: sys::CUfunction,
}

impl RawSide {
    fn new(dev: &Device, cubin: Option<&[u8]>) -> R<RawSide> {
        let mut r = RawSide {
            dev: dev.raw_device(),
            ctx: std::ptr::null_mut(),
            stream: std::ptr::null_mut(),
            stream2: std::ptr::null_mut(),
            event: std::ptr::null_mut(),
            buf: 0,
            buf2: 0,
            word: 0,
            a: 0,
            b: 0,
            module: std::ptr::null_mut(),
            empty: std::ptr::null_mut(),
            touch: std::ptr::null_mut(),
            peek: std::ptr::null_mut(),
        };
        // SAFETY: valid device handle; writes one context handle. Released in Drop.
        ck(
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut r.ctx, r.dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        set_current(r.ctx)?;
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the primary context is current; each call writes one handle/address;
        // everything created here is destroyed in Drop (or with the context).
        unsafe {
            ck(sys::cuStreamCreate(&mut r.stream, flags), "cuStreamCreate")?;
            ck(sys::cuStreamCreate(&mut r.stream2, flags), "cuStreamCreate")?;
            ck(
                sys::cuEventCreate(
                    &mut r.event,
                    sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
                ),
                "cuEventCreate",
            )?;
            ck(
                sys::cuMemAlloc_v2(&mut r.buf, MEMSET_BYTES),
                "cuMemAlloc_v2",
            )?;
            ck(
                sys::cuMemAlloc_v2(&mut r.buf2, MEMSET_BYTES),
                "cuMemAlloc_v2",
            )?;
            ck(sys::cuMemAlloc_v2(&mut r.word, 4), "cuMemAlloc_v2")?;
            let bytes = TOUCH_N as usize * 4;
            ck(sys::cuMemAlloc_v2(&mut r.a, bytes), "cuMemAlloc_v2")?;
            ck(sys::cuMemAlloc_v2(&mut r.b, bytes), "cuMemAlloc_v2")?;
            ck(sys::cuMemsetD8_v2(r.b, 0, bytes), "cuMemsetD8_v2")?;
        }
        if let Some(cubin) = cubin {
            // SAFETY: `cubin` is a complete NVRTC cubin for this device, alive for the call.
            ck(
                unsafe { sys::cuModuleLoadData(&mut r.module, cubin.as_ptr().cast()) },
                "cuModuleLoadData",
            )?;
            // SAFETY: valid module of the current context; NUL-terminated names.
            unsafe {
                ck(
                    sys::cuModuleGetFunction(&mut r.empty, r.module, c"empty".as_ptr()),
                    "cuModuleGetFunction",
                )?;
                ck(
                    sys::cuModuleGetFunction(&mut r.touch, r.module, c"touch".as_ptr()),
                    "cuModuleGetFunction",
                )?;
                ck(
                    sys::cuModuleGetFunction(&mut r.peek, r.module, c"peek".as_ptr()),
                    "cuModuleGetFunction",
                )?;
            }
        }
        Ok(r)
    }

    fn make_current(&self) -> R<()> {
        set_current(self.ctx)
    }
}

impl Drop for RawSide {
    fn drop(&mut self) {
        if self.ctx.is_null() {
            return;
        }
        // SAFETY: frees exactly what `new` created, in its context, once; then drops
        // our retain of the primary context.
        unsafe {
            sys::cuCtxSetCurrent(self.ctx);
            for p in [self.buf, self.buf2, self.word, self.a, self.b] {
                if p != 0 {
                    sys::cuMemFree_v2(p);
                }
            }
            for s in [self.stream, self.stream2] {
                if !s.is_null() {
                    sys::cuStreamDestroy_v2(s);
                }
            }
            if !self.event.is_null() {
                sys::cuEventDestroy_v2(self.event);
            }
            if !self.module.is_null() {
                sys::cuModuleUnload(self.module);
            }
            sys::cuDevicePrimaryCtxRelease_v2(self.dev);
        }
    }
}

struct Env {
    tc: ThreadContext,
    dev: Arc<Device>,
    g: GpubindSide,
    c: CudarcSide,
    r: RawSide,
    /// Why no kernels could be compiled, if so.
    kernel_error: Option<String>,
    /// The kernels' cubin, for the graph rows' own modules.
    cubin: Option<Vec<u8>>,
}

fn setup(mut tc: ThreadContext, dev: Arc<Device>) -> R<Env> {
    let (major, minor) = dev.compute_capability()?;
    let cubin = gpubind::compile(
        KERNELS,
        "gpubench.cu",
        &[format!("--gpu-architecture=sm_{major}{minor}")],
        Output::Cubin,
    );
    let (cubin, kernel_error) = match cubin {
        Ok(c) => (Some(c), None),
        Err(e) => (None, Some(e.to_string())),
    };

    tc.forget_binding();
    let g = {
        let gpu = tc.bind(&dev)?;
        GpubindSide {
            stream: gpu.new_stream()?,
            stream2: gpu.new_stream()?,
            buf: gpu.alloc_zeros(MEMSET_BYTES)?,
            buf2: gpu.alloc_zeros(MEMSET_BYTES)?,
            word: gpu.alloc_zeros(1)?,
            a: gpu.alloc_zeros(TOUCH_N as usize)?,
            b: gpu.alloc_zeros(TOUCH_N as usize)?,
            module: cubin.as_deref().map(|c| gpu.load_cubin(c)).transpose()?,
        }
    };

    let ctx = CudaContext::new(dev.ordinal())?;
    let stream = ctx.new_stream()?;
    let module = cubin
        .clone()
        .map(|c| ctx.load_module(cudarc::nvrtc::Ptx::from_binary(c)))
        .transpose()?;
    let single = CudaContext::new(dev.ordinal())?;
    let single_default = single.default_stream();
    let c = CudarcSide {
        buf: stream.alloc_zeros::<u8>(MEMSET_BYTES)?,
        a: stream.alloc_zeros::<f32>(TOUCH_N as usize)?,
        b: stream.alloc_zeros::<f32>(TOUCH_N as usize)?,
        empty: module
            .as_ref()
            .map(|m| m.load_function("empty"))
            .transpose()?,
        touch: module
            .as_ref()
            .map(|m| m.load_function("touch"))
            .transpose()?,
        peek: module
            .as_ref()
            .map(|m| m.load_function("peek"))
            .transpose()?,
        _module: module,
        word: single_default.alloc_zeros::<u32>(1)?,
        single_default,
        _single: single,
        other: CudarcExtra::new(CudaContext::new(dev.ordinal())?)?,
        stream2: ctx.new_stream()?,
        _ctx: ctx,
        stream,
    };
    c.stream.synchronize()?;
    c.single_default.synchronize()?;

    let r = RawSide::new(&dev, cubin.as_deref())?;
    tc.forget_binding();
    Ok(Env {
        tc,
        dev,
        g,
        c,
        r,
        kernel_error,
        cubin,
    })
}

impl Env {
    fn no_kernels(&self) -> Box<dyn std::error::Error> {
        format!(
            "no kernels: {}",
            self.kernel_error.as_deref().unwrap_or("unknown")
        )
        .into()
    }
}

// ---------------------------------------------------------------------------------------
// Rows
// ---------------------------------------------------------------------------------------

fn memset_row(env: &mut Env, mode: Mode, imp: Impl, n: usize) -> R<Option<f64>> {
    Ok(Some(match imp {
        Impl::Gpubind => {
            env.tc.forget_binding();
            let gpu = env.tc.bind(&env.dev)?;
            let s = gpu.on(&env.g.stream)?;
            let buf = &mut env.g.buf;
            measure(mode, n, |step| match step {
                Step::Op => Ok(s.memset_zeros_async(buf)?),
                Step::Sync => Ok(s.synchronize()?),
            })?
        }
        Impl::Cudarc => {
            let (s, buf) = (&env.c.stream, &mut env.c.buf);
            measure(mode, n, |step| match step {
                Step::Op => Ok(s.memset_zeros(buf)?),
                Step::Sync => Ok(s.synchronize()?),
            })?
        }
        Impl::Raw => {
            let r = &env.r;
            r.make_current()?;
            measure(mode, n, |step| match step {
                // SAFETY: current primary context; a live 256-byte allocation; our stream.
                Step::Op => ck(
                    unsafe { sys::cuMemsetD8Async(r.buf, 0, MEMSET_BYTES, r.stream) },
                    "cuMemsetD8Async",
                ),
                Step::Sync => raw_sync(r.stream),
            })?
        }
    }))
}

/// A 4-byte upload that has *landed* when the op returns: gpubind `htod_copy` (copy, then
/// wait for the legacy stream, because a pageable `cuMemcpyHtoD` returns once the data is
/// staged); raw `cuMemcpyHtoD_v2` + `cuStreamSynchronize(0)`; cudarc `memcpy_htod` +
/// `synchronize` on the default stream of a single-stream context.
fn htod_row(env: &mut Env, imp: Impl, n: usize) -> R<Option<f64>> {
    let host = [7u32];
    Ok(Some(match imp {
        Impl::Gpubind => {
            env.tc.forget_binding();
            let gpu = env.tc.bind(&env.dev)?;
            let word = &mut env.g.word;
            measure(Mode::Wall, n, |step| match step {
                Step::Op => Ok(gpu.htod_copy(&host, word)?),
                Step::Sync => Ok(gpu.synchronize()?),
            })?
        }
        Impl::Cudarc => {
            let (s, word) = (&env.c.single_default, &mut env.c.word);
            measure(Mode::Wall, n, |step| match step {
                Step::Op => {
                    s.memcpy_htod(&host, word)?;
                    Ok(s.synchronize()?)
                }
                Step::Sync => Ok(s.synchronize()?),
            })?
        }
        Impl::Raw => {
            let r = &env.r;
            r.make_current()?;
            measure(Mode::Wall, n, |step| match step {
                // SAFETY: current context; 4 live bytes on each side; the wait makes the
                // copy complete before `host` could go away.
                Step::Op => {
                    ck(
                        unsafe { sys::cuMemcpyHtoD_v2(r.word, host.as_ptr().cast(), 4) },
                        "cuMemcpyHtoD_v2",
                    )?;
                    raw_sync(std::ptr::null_mut())
                }
                // SAFETY: a current context exists.
                Step::Sync => ck(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize"),
            })?
        }
    }))
}

/// A stream-ordered 4-byte upload from pageable memory, not waited for per op: gpubind
/// `BoundStream::htod_async`, cudarc `memcpy_htod` on its stream, raw `cuMemcpyHtoDAsync_v2`.
fn htod_async_row(env: &mut Env, imp: Impl, n: usize) -> R<Option<f64>> {
    let host = [7u32];
    Ok(Some(match imp {
        Impl::Gpubind => {
            env.tc.forget_binding();
            let gpu = env.tc.bind(&env.dev)?;
            let s = gpu.on(&env.g.stream)?;
            let word = &mut env.g.word;
            measure(Mode::Wall, n, |step| match step {
                // SAFETY: `host` is pageable and outlives the final synchronize.
                Step::Op => Ok(unsafe { s.htod_async(&host, word) }?),
                Step::Sync => Ok(s.synchronize()?),
            })?
        }
        Impl::Cudarc => {
            let (s, word) = (&env.c.stream, &mut env.c.word);
            measure(Mode::Wall, n, |step| match step {
                Step::Op => Ok(s.memcpy_htod(&host, word)?),
                Step::Sync => Ok(s.synchronize()?),
            })?
        }
        Impl::Raw => {
            let r = &env.r;
            r.make_current()?;
            measure(Mode::Wall, n, |step| match step {
                // SAFETY: current context; 4 live bytes on each side; `host` outlives the
                // final synchronize; our stream.
                Step::Op => ck(
                    unsafe { sys::cuMemcpyHtoDAsync_v2(r.word, host.as_ptr().cast(), 4, r.stream) },
                    "cuMemcpyHtoDAsync_v2",
                ),
                Step::Sync => raw_sync(r.stream),
            })?
        }
    }))
}

fn one_thread() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn touch_cfg() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (TOUCH_N, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn cudarc_cfg(c: LaunchConfig) -> cudarc::driver::LaunchConfig {
    cudarc::driver::LaunchConfig {
        grid_dim: c.grid_dim,
        block_dim: c.block_dim,
        shared_mem_bytes: c.shared_mem_bytes,
    }
}

fn empty_launch_row(env: &mut Env, mode: Mode, imp: Impl, n: usize) -> R<Option<f64>> {
    let cfg = one_thread();
    Ok(Some(match imp {
        Impl::Gpubind => {
            let module = env.g.module.as_ref().ok_or_else(|| env.no_kernels())?;
            let f = module.function("empty")?;
            env.tc.forget_binding();
            let gpu = env.tc.bind(&env.dev)?;
            let s = gpu.on(&env.g.stream)?;
            measure(mode, n, |step| match step {
                // SAFETY: `empty` takes no parameters and touches no memory.
                Step::Op => Ok(unsafe { s.launch(&f, cfg).launch() }?),
                Step::Sync => Ok(s.synchronize()?),
            })?
        }
        Impl::Cudarc => {
            let f = env.c.empty.as_ref().ok_or_else(|| env.no_kernels())?;
            let s = &env.c.stream;
            let ccfg = cudarc_cfg(cfg);
            measure(mode, n, |step| match step {
                Step::Op => {
                    let mut b = s.launch_builder(f);
                    // SAFETY: `empty` takes no parameters and touches no memory.
                    unsafe { b.launch(ccfg) }?;
                    Ok(())
                }
                Step::Sync => Ok(s.synchronize()?),
            })?
        }
        Impl::Raw => {
            let r = &env.r;
            if r.empty.is_null() {
                return Err(env.no_kernels());
            }
            r.make_current()?;
            measure(mode, n, |step| match step {
                // SAFETY: a function and a stream of the current context; no parameters.
                Step::Op => unsafe { raw_launch(r.empty, cfg, r.stream, std::ptr::null_mut()) },
                Step::Sync => raw_sync(r.stream),
            })?
        }
    }))
}

fn args_launch_row(env: &mut Env, mode: Mode, imp: Impl, n: usize) -> R<Option<f64>> {
    let cfg = touch_cfg();
    let len = TOUCH_N;
    Ok(Some(match imp {
        Impl::Gpubind => {
            let module = env.g.module.as_ref().ok_or_else(|| env.no_kernels())?;
            let f = module.function("touch")?;
            env.tc.forget_binding();
            let gpu = env.tc.bind(&env.dev)?;
            let s = gpu.on(&env.g.stream)?;
            let (a, b) = (&mut env.g.a, &env.g.b);
            measure(mode, n, |step| match step {
                // SAFETY: (float*, const float*, unsigned) matches `touch`; it stays
                // inside the TOUCH_N elements of both buffers.
                Step::Op => {
                    Ok(unsafe { s.launch(&f, cfg).arg(&mut *a).arg(b).arg(&len).launch() }?)
                }
                Step::Sync => Ok(s.synchronize()?),
            })?
        }
        Impl::Cudarc => {
            let f = env.c.touch.as_ref().ok_or_else(|| env.no_kernels())?;
            let (s, a, b) = (&env.c.stream, &mut env.c.a, &env.c.b);
            let ccfg = cudarc_cfg(cfg);
            measure(mode, n, |step| match step {
                Step::Op => {
                    let mut lb = s.launch_builder(f);
                    lb.arg(&mut *a).arg(b).arg(&len);
                    // SAFETY: as for gpubind above.
                    unsafe { lb.launch(ccfg) }?;
                    Ok(())
                }
                Step::Sync => Ok(s.synchronize()?),
            })?
        }
        Impl::Raw => {
            let r = &env.r;
            if r.touch.is_null() {
                return Err(env.no_kernels());
            }
            r.make_current()?;
            let (mut pa, mut pb, mut pn) = (r.a, r.b, len);
            measure(mode, n, |step| match step {
                Step::Op => {
                    let mut params: [*mut std::ffi::c_void; 3] = [
                        (&mut pa as *mut sys::CUdeviceptr).cast(),
                        (&mut pb as *mut sys::CUdeviceptr).cast(),
                        (&mut pn as *mut u32).cast(),
                    ];
                    // SAFETY: as for gpubind above; `params` points at three live values
                    // of the kernel's parameter types.
                    unsafe { raw_launch(r.touch, cfg, r.stream, params.as_mut_ptr()) }
                }
                Step::Sync => raw_sync(r.stream),
            })?
        }
    }))
}

/// A temporary of `bytes` per op: allocated zeroed on the stream, written by a kernel
/// (`touch`, into its first TOUCH_N floats), dropped. gpubind `BoundStream::alloc_zeros`
/// (pool allocation + memset, freed in stream order by the drop); cudarc
/// `CudaStream::alloc_zeros` + drop (stream-ordered in cudarc 0.19); raw
/// `cuMemAllocAsync` + `cuMemsetD8Async` + launch + `cuMemFreeAsync`. No host wait inside
/// the loop in any of them.
fn temporaries_row(env: &mut Env, mode: Mode, bytes: usize, imp: Impl, n: usize) -> R<Option<f64>> {
    let cfg = touch_cfg();
    let len = TOUCH_N;
    let elems = bytes / 4;
    Ok(Some(match imp {
        Impl::Gpubind => {
            let module = env.g.module.as_ref().ok_or_else(|| env.no_kernels())?;
            let f = module.function("touch")?;
            env.tc.forget_binding();
            let gpu = env.tc.bind(&env.dev)?;
            let s = gpu.on(&env.g.stream)?;
            let b = &env.g.b;
            measure(mode, n, |step| match step {
                Step::Op => {
                    let mut tmp = s.alloc_zeros::<f32>(elems)?;
                    // SAFETY: (float*, const float*, unsigned) matches `touch`; it stays
                    // inside the first TOUCH_N elements of both buffers.
                    unsafe { s.launch(&f, cfg).arg(&mut tmp).arg(b).arg(&len).launch() }?;
                    drop(tmp);
                    Ok(())
                }
                Step::Sync => Ok(s.synchronize()?),
            })?
        }
        Impl::Cudarc => {
            let f = env.c.touch.as_ref().ok_or_else(|| env.no_kernels())?;
            let (s, b) = (&env.c.stream, &env.c.b);
            let ccfg = cudarc_cfg(cfg);
            measure(mode, n, |step| match step {
                Step::Op => {
                    let mut tmp = s.alloc_zeros::<f32>(elems)?;
                    let mut lb = s.launch_builder(f);
                    lb.arg(&mut tmp).arg(b).arg(&len);
                    // SAFETY: as for gpubind above.
                    unsafe { lb.launch(ccfg) }?;
                    drop(lb);
                    drop(tmp);
                    Ok(())
                }
                Step::Sync => Ok(s.synchronize()?),
            })?
        }
        Impl::Raw => {
            let r = &env.r;
            if r.touch.is_null() {
                return Err(env.no_kernels());
            }
            r.make_current()?;
            let (mut pb, mut pn) = (r.b, len);
            measure(mode, n, |step| match step {
                Step::Op => {
                    let mut pa: sys::CUdeviceptr = 0;
                    // SAFETY: the primary context is current; our stream; `pa` is freed
                    // below, on the same stream, after the memset and the kernel.
                    unsafe {
                        ck(
                            sys::cuMemAllocAsync(&mut pa, bytes, r.stream),
                            "cuMemAllocAsync",
                        )?;
                        ck(
                            sys::cuMemsetD8Async(pa, 0, bytes, r.stream),
                            "cuMemsetD8Async",
                        )?;
                    }
                    let mut params: [*mut std::ffi::c_void; 3] = [
                        (&mut pa as *mut sys::CUdeviceptr).cast(),
                        (&mut pb as *mut sys::CUdeviceptr).cast(),
                        (&mut pn as *mut u32).cast(),
                    ];
                    // SAFETY: as for gpubind above; `params` points at three live values
                    // of the kernel's parameter types.
                    unsafe { raw_launch(r.touch, cfg, r.stream, params.as_mut_ptr()) }?;
                    // SAFETY: allocated above on this stream; every use is ordered before.
                    ck(
                        unsafe { sys::cuMemFreeAsync(pa, r.stream) },
                        "cuMemFreeAsync",
                    )
                }
                Step::Sync => raw_sync(r.stream),
            })?
        }
    }))
}

/// A launch whose two buffers are both read (`peek`, which writes nothing): gpubind's
/// read claims, on the fast path once both buffers publish the stream for reads.
fn reads_launch_row(env: &mut Env, mode: Mode, imp: Impl, n: usize) -> R<Option<f64>> {
    let cfg = touch_cfg();
    let len = TOUCH_N;
    Ok(Some(match imp {
        Impl::Gpubind => {
            let module = env.g.module.as_ref().ok_or_else(|| env.no_kernels())?;
            let f = module.function("peek")?;
            env.tc.forget_binding();
            let gpu = env.tc.bind(&env.dev)?;
            let s = gpu.on(&env.g.stream)?;
            let (a, b) = (&env.g.a, &env.g.b);
            measure(mode, n, |step| match step {
                // SAFETY: (const float*, const float*, unsigned) matches `peek`; it reads
                // the TOUCH_N elements of both buffers and writes nothing.
                Step::Op => Ok(unsafe { s.launch(&f, cfg).arg(a).arg(b).arg(&len).launch() }?),
                Step::Sync => Ok(s.synchronize()?),
            })?
        }
        Impl::Cudarc => {
            let f = env.c.peek.as_ref().ok_or_else(|| env.no_kernels())?;
            let (s, a, b) = (&env.c.stream, &env.c.a, &env.c.b);
            let ccfg = cudarc_cfg(cfg);
            measure(mode, n, |step| match step {
                Step::Op => {
                    let mut lb = s.launch_builder(f);
                    lb.arg(a).arg(b).arg(&len);
                    // SAFETY: as for gpubind above.
                    unsafe { lb.launch(ccfg) }?;
                    Ok(())
                }
                Step::Sync => Ok(s.synchronize()?),
            })?
        }
        Impl::Raw => {
            let r = &env.r;
            if r.peek.is_null() {
                return Err(env.no_kernels());
            }
            r.make_current()?;
            let (mut pa, mut pb, mut pn) = (r.a, r.b, len);
            measure(mode, n, |step| match step {
                Step::Op => {
                    let mut params: [*mut std::ffi::c_void; 3] = [
                        (&mut pa as *mut sys::CUdeviceptr).cast(),
                        (&mut pb as *mut sys::CUdeviceptr).cast(),
                        (&mut pn as *mut u32).cast(),
                    ];
                    // SAFETY: as for gpubind above; `params` points at three live values
                    // of the kernel's parameter types.
                    unsafe { raw_launch(r.peek, cfg, r.stream, params.as_mut_ptr()) }
                }
                Step::Sync => raw_sync(r.stream),
            })?
        }
    }))
}

/// Kernels per graph in the graph rows.
const GRAPH_K: usize = 16;

/// The graph rows' resources: per implementation, a graph of [`GRAPH_K`] `touch`
/// launches, and what launching the same kernels one by one needs. gpubind's graph
/// borrows its module and buffers (`'g`).
struct GraphBench<'g> {
    g_func: gpubind::Function<'g>,
    g_a: &'g DeviceSlice<f32>,
    g_b: &'g DeviceSlice<f32>,
    g_exec: gpubind::GraphExec<'g>,
    /// A context object with event tracking off (cudarc's capture needs it: a capture may
    /// not wait on events recorded outside it), its stream, kernel and buffers.
    c_graph: cudarc::driver::CudaGraph,
    c_stream: Arc<CudaStream>,
    c_func: CudaFunction,
    c_a: CudaSlice<f32>,
    c_b: CudaSlice<f32>,
    _c_module: Arc<CudaModule>,
    _c_ctx: Arc<CudaContext>,
    r_graph: sys::CUgraph,
    r_exec: sys::CUgraphExec,
}

impl<'g> GraphBench<'g> {
    fn new(
        env: &mut Env,
        module: &'g Module,
        g_a: &'g DeviceSlice<f32>,
        g_b: &'g DeviceSlice<f32>,
    ) -> R<GraphBench<'g>> {
        let cubin = env.cubin.clone().ok_or_else(|| env.no_kernels())?;
        let (cfg, len) = (touch_cfg(), TOUCH_N);
        // gpubind.
        env.tc.forget_binding();
        let (g_func, g_exec) = {
            let gpu = env.tc.bind(&env.dev)?;
            let f = module.function("touch")?;
            let graph = gpu.capture(|c| {
                for _ in 0..GRAPH_K {
                    // SAFETY: (float*, const float*, unsigned) matches `touch`; it stays
                    // inside the TOUCH_N elements of both buffers.
                    unsafe {
                        c.launch(&f, cfg)
                            .arg_written(g_a)
                            .arg(g_b)
                            .arg(&TOUCH_N)
                            .launch()?
                    };
                }
                Ok(())
            })?;
            let exec = graph.instantiate()?;
            (f, exec)
        };
        // cudarc.
        let c_ctx = CudaContext::new(env.dev.ordinal())?;
        // SAFETY: everything on this context object runs on its one stream.
        unsafe { c_ctx.disable_event_tracking() };
        let c_stream = c_ctx.new_stream()?;
        let c_module = c_ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin))?;
        let c_func = c_module.load_function("touch")?;
        let mut c_a = c_stream.alloc_zeros::<f32>(TOUCH_N as usize)?;
        let c_b = c_stream.alloc_zeros::<f32>(TOUCH_N as usize)?;
        c_stream.synchronize()?;
        c_stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let captured = (|| -> R<()> {
            for _ in 0..GRAPH_K {
                let mut lb = c_stream.launch_builder(&c_func);
                lb.arg(&mut c_a).arg(&c_b).arg(&len);
                // SAFETY: as for gpubind above.
                unsafe { lb.launch(cudarc_cfg(cfg)) }?;
            }
            Ok(())
        })();
        let ended = c_stream.end_capture(sys::CUgraphInstantiate_flags(0));
        captured?;
        let c_graph = ended?.ok_or("cudarc: end_capture returned no graph")?;
        // raw.
        let r = &env.r;
        r.make_current()?;
        let (mut pa, mut pb, mut pn) = (r.a, r.b, len);
        let mut params: [*mut std::ffi::c_void; 3] = [
            (&mut pa as *mut sys::CUdeviceptr).cast(),
            (&mut pb as *mut sys::CUdeviceptr).cast(),
            (&mut pn as *mut u32).cast(),
        ];
        let (mut r_graph, mut r_exec) = (std::ptr::null_mut(), std::ptr::null_mut());
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: a stream of the current context; ended below.
        ck(
            unsafe { sys::cuStreamBeginCapture_v2(r.stream, mode) },
            "cuStreamBeginCapture_v2",
        )?;
        let captured = (0..GRAPH_K).try_for_each(|_| {
            // SAFETY: as for gpubind above; `params` points at three live values.
            unsafe { raw_launch(r.touch, cfg, r.stream, params.as_mut_ptr()) }
        });
        // SAFETY: ends the capture begun above; writes one handle.
        let ended = ck(
            unsafe { sys::cuStreamEndCapture(r.stream, &mut r_graph) },
            "cuStreamEndCapture",
        );
        captured?;
        ended?;
        // SAFETY: the graph just captured, in the current context; writes one handle.
        let inst = ck(
            unsafe { sys::cuGraphInstantiateWithFlags(&mut r_exec, r_graph, 0) },
            "cuGraphInstantiateWithFlags",
        );
        env.tc.forget_binding();
        let gb = GraphBench {
            g_func,
            g_a,
            g_b,
            g_exec,
            c_graph,
            c_stream,
            c_func,
            c_a,
            c_b,
            _c_module: c_module,
            _c_ctx: c_ctx,
            r_graph,
            r_exec,
        };
        inst?;
        Ok(gb)
    }
}

impl Drop for GraphBench<'_> {
    fn drop(&mut self) {
        // SAFETY: destroys the raw graph and executable graph created in `new` (null if
        // not), once; the rows synchronised their stream after the last launch.
        unsafe {
            if !self.r_exec.is_null() {
                sys::cuGraphExecDestroy(self.r_exec);
            }
            if !self.r_graph.is_null() {
                sys::cuGraphDestroy(self.r_graph);
            }
        }
    }
}

/// [`GRAPH_K`] `touch` kernels per op: launched one by one, or (`graph`) as one graph
/// launch. ns per group of `GRAPH_K` kernels.
fn graph_row(
    env: &mut Env,
    gb: &mut GraphBench<'_>,
    graph: bool,
    imp: Impl,
    n: usize,
) -> R<Option<f64>> {
    let (cfg, len) = (touch_cfg(), TOUCH_N);
    Ok(Some(match imp {
        Impl::Gpubind => {
            env.tc.forget_binding();
            let gpu = env.tc.bind(&env.dev)?;
            let s = gpu.on(&env.g.stream)?;
            let (f, a, b, exec) = (&gb.g_func, gb.g_a, gb.g_b, &gb.g_exec);
            measure(Mode::Wall, n, |step| match step {
                Step::Op if graph => Ok(exec.launch(&s)?),
                Step::Op => {
                    for _ in 0..GRAPH_K {
                        // SAFETY: as in `GraphBench::new`.
                        unsafe { s.launch(f, cfg).arg_written(a).arg(b).arg(&len).launch() }?;
                    }
                    Ok(())
                }
                Step::Sync => Ok(s.synchronize()?),
            })?
        }
        Impl::Cudarc => {
            let s = Arc::clone(&gb.c_stream);
            let ccfg = cudarc_cfg(cfg);
            measure(Mode::Wall, n, |step| match step {
                Step::Op if graph => Ok(gb.c_graph.launch()?),
                Step::Op => {
                    for _ in 0..GRAPH_K {
                        let mut lb = s.launch_builder(&gb.c_func);
                        lb.arg(&mut gb.c_a).arg(&gb.c_b).arg(&len);
                        // SAFETY: as in `GraphBench::new`.
                        unsafe { lb.launch(ccfg) }?;
                    }
                    Ok(())
                }
                Step::Sync => Ok(s.synchronize()?),
            })?
        }
        Impl::Raw => {
            let r = &env.r;
            r.make_current()?;
            let (mut pa, mut pb, mut pn) = (r.a, r.b, len);
            let exec = gb.r_exec;
            measure(Mode::Wall, n, |step| match step {
                Step::Op if graph => ck(
                    // SAFETY: an executable graph and a stream of the current context.
                    unsafe { sys::cuGraphLaunch(exec, r.stream) },
                    "cuGraphLaunch",
                ),
                Step::Op => {
                    let mut params: [*mut std::ffi::c_void; 3] = [
                        (&mut pa as *mut sys::CUdeviceptr).cast(),
                        (&mut pb as *mut sys::CUdeviceptr).cast(),
                        (&mut pn as *mut u32).cast(),
                    ];
                    for _ in 0..GRAPH_K {
                        // SAFETY: as in `GraphBench::new`.
                        unsafe { raw_launch(r.touch, cfg, r.stream, params.as_mut_ptr()) }?;
                    }
                    Ok(())
                }
                Step::Sync => raw_sync(r.stream),
            })?
        }
    }))
}

/// One side of a two-context row in gpubind: a device, a stream of it, a buffer on it.
type GSide<'x> = (&'x Arc<Device>, &'x Stream, &'x mut DeviceSlice<u8>);
/// The same in cudarc: a stream (of some `CudaContext` object) and a buffer.
type CSide<'x> = (&'x Arc<CudaStream>, &'x mut CudaSlice<u8>);
/// The same in the raw driver: a context, a buffer in it, a stream of it.
type RSide = (sys::CUcontext, sys::CUdeviceptr, sys::CUstream);

/// The two sides of a two-context row for each implementation (`g: None`: gpubind
/// cannot do the row).
struct Pair<'x> {
    g: Option<[GSide<'x>; 2]>,
    c: [CSide<'x>; 2],
    r: [RSide; 2],
}

/// One iteration = (switch to side 0, memset there, switch to side 1, memset there); the
/// result is ns per (switch + memset), i.e. per iteration / 2.
fn pair_row(
    tc: &mut ThreadContext,
    mode: Mode,
    imp: Impl,
    n: usize,
    p: Pair<'_>,
) -> R<Option<f64>> {
    let per_iter = match imp {
        Impl::Gpubind => {
            let Some(mut sides) = p.g else {
                return Ok(None);
            };
            tc.forget_binding();
            measure(mode, n, |step| {
                for (dev, stream, buf) in sides.iter_mut() {
                    let gpu = tc.bind(dev)?;
                    let s = gpu.on(stream)?;
                    match step {
                        Step::Op => s.memset_zeros_async(&mut **buf)?,
                        Step::Sync => s.synchronize()?,
                    }
                }
                Ok(())
            })?
        }
        Impl::Cudarc => {
            let mut sides = p.c;
            measure(mode, n, |step| {
                for (s, buf) in sides.iter_mut() {
                    match step {
                        Step::Op => s.memset_zeros(&mut **buf)?,
                        Step::Sync => s.synchronize()?,
                    }
                }
                Ok(())
            })?
        }
        Impl::Raw => measure(mode, n, |step| {
            for (ctx, buf, stream) in p.r {
                set_current(ctx)?;
                match step {
                    // SAFETY: `buf` and `stream` belong to `ctx`, now current.
                    Step::Op => ck(
                        unsafe { sys::cuMemsetD8Async(buf, 0, MEMSET_BYTES, stream) },
                        "cuMemsetD8Async",
                    )?,
                    Step::Sync => raw_sync(stream)?,
                }
            }
            Ok(())
        })?,
    };
    Ok(Some(per_iter / 2.0))
}

/// One buffer written on stream A, then on stream B, alternately: every op hands the
/// buffer to the other stream. gpubind orders it by itself (its tracker records an event
/// on the previous stream and makes the next one wait); cudarc the same with its per-slice
/// events (multi-stream context); raw does `cuEventRecord` + `cuStreamWaitEvent` by hand.
/// ns per (hand-off + memset).
fn handoff_row(env: &mut Env, mode: Mode, imp: Impl, n: usize) -> R<Option<f64>> {
    let per_iter = match imp {
        Impl::Gpubind => {
            let gpu = env.tc.bind(&env.dev)?;
            let (a, b) = (gpu.on(&env.g.stream)?, gpu.on(&env.g.stream2)?);
            let buf = &mut env.g.buf;
            measure(mode, n, |step| match step {
                Step::Op => {
                    a.memset_zeros_async(buf)?;
                    Ok(b.memset_zeros_async(buf)?)
                }
                Step::Sync => {
                    a.synchronize()?;
                    Ok(b.synchronize()?)
                }
            })?
        }
        Impl::Cudarc => {
            let (a, b, buf) = (&env.c.stream, &env.c.stream2, &mut env.c.buf);
            measure(mode, n, |step| match step {
                Step::Op => {
                    a.memset_zeros(buf)?;
                    Ok(b.memset_zeros(buf)?)
                }
                Step::Sync => {
                    a.synchronize()?;
                    Ok(b.synchronize()?)
                }
            })?
        }
        Impl::Raw => {
            let r = &env.r;
            r.make_current()?;
            let mut on_b = false;
            measure(mode, n, |step| match step {
                // SAFETY: current primary context; a live 256-byte allocation; our
                // streams and event.
                Step::Op => unsafe {
                    for (from, to) in [(r.stream2, r.stream), (r.stream, r.stream2)] {
                        if on_b || to == r.stream2 {
                            ck(sys::cuEventRecord(r.event, from), "cuEventRecord")?;
                            ck(sys::cuStreamWaitEvent(to, r.event, 0), "cuStreamWaitEvent")?;
                        }
                        ck(
                            sys::cuMemsetD8Async(r.buf, 0, MEMSET_BYTES, to),
                            "cuMemsetD8Async",
                        )?;
                    }
                    on_b = true;
                    Ok(())
                },
                Step::Sync => {
                    raw_sync(r.stream)?;
                    raw_sync(r.stream2)
                }
            })?
        }
    };
    Ok(Some(per_iter / 2.0))
}

/// The driver call behind gpubind's per-operation binding check, alone (raw column only):
/// what each gpubind operation pays for `cuCtxGetCurrent`.
fn ctx_check_row(env: &mut Env, imp: Impl, n: usize) -> R<Option<f64>> {
    if imp != Impl::Raw {
        return Ok(None);
    }
    env.r.make_current()?;
    let mut sink: sys::CUcontext = std::ptr::null_mut();
    Ok(Some(measure(Mode::Submit, n, |step| match step {
        // SAFETY: writes one handle.
        Step::Op => ck(
            unsafe { sys::cuCtxGetCurrent(&mut sink) },
            "cuCtxGetCurrent",
        ),
        Step::Sync => Ok(()),
    })?))
}

/// One GPU, one context: re-bind before every op. gpubind's re-bind of the bound device
/// checks the current context (`cuCtxGetCurrent`) and sets nothing; cudarc's two `CudaContext` objects wrap the same primary context, so
/// its `bind_to_thread` finds it current; raw calls `cuCtxSetCurrent` before each op.
fn rebind_row(env: &mut Env, imp: Impl, n: usize) -> R<Option<f64>> {
    let (g, c, r, dev) = (&mut env.g, &mut env.c, &env.r, &env.dev);
    let p = Pair {
        g: Some([(dev, &g.stream, &mut g.buf), (dev, &g.stream2, &mut g.buf2)]),
        c: [(&c.stream, &mut c.buf), (&c.other.stream, &mut c.other.buf)],
        r: [(r.ctx, r.buf, r.stream), (r.ctx, r.buf2, r.stream2)],
    };
    pair_row(&mut env.tc, Mode::Wall, imp, n, p)
}

/// A second, non-primary context on the same GPU with a stream and a buffer (raw side).
struct SecondContext {
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    buf: sys::CUdeviceptr,
}

impl SecondContext {
    fn new(dev: sys::CUdevice) -> R<SecondContext> {
        let mut s = SecondContext {
            ctx: std::ptr::null_mut(),
            stream: std::ptr::null_mut(),
            buf: 0,
        };
        // cuCtxCreate_v4 needs a CUDA 12.5 driver (and bindings); the v2 variant, asked
        // for by version as gpubind does it (docs/compat.md), exists on every driver. Asked
        // for as CUDA 11.0's: cuGetProcAddress returns the newest variant at or below the
        // version, and at 12.2 that is cuCtxCreate_v3 (11.4), whose first parameters are
        // execution-affinity ones (v2's arguments then fail with INVALID_DEVICE).
        type CtxCreateV2 = unsafe extern "C" fn(
            *mut sys::CUcontext,
            std::ffi::c_uint,
            sys::CUdevice,
        ) -> sys::CUresult;
        let mut pfn: *mut std::ffi::c_void = std::ptr::null_mut();
        let mut status = sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS;
        // SAFETY: NUL-terminated name; writes one pointer and one status.
        ck(
            unsafe {
                sys::cuGetProcAddress_v2(
                    c"cuCtxCreate".as_ptr(),
                    &mut pfn,
                    11000,
                    sys::CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_DEFAULT as u64,
                    &mut status,
                )
            },
            "cuGetProcAddress_v2(cuCtxCreate)",
        )?;
        if pfn.is_null() {
            return Err(format!("cuCtxCreate_v2 not found ({status:?})").into());
        }
        // SAFETY: the driver's cuCtxCreate for CUDA 11.0 is cuCtxCreate_v2, whose
        // prototype is `CtxCreateV2`; the pointer stays valid while libcuda is loaded.
        let create = unsafe { std::mem::transmute::<*mut std::ffi::c_void, CtxCreateV2>(pfn) };
        // SAFETY: valid device; no flags; the new context becomes current and is
        // destroyed in Drop (which frees everything made in it).
        ck(unsafe { create(&mut s.ctx, 0, dev) }, "cuCtxCreate_v2")?;
        // SAFETY: the new context is current; each call writes one handle/address.
        unsafe {
            ck(
                sys::cuStreamCreate(
                    &mut s.stream,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                ),
                "cuStreamCreate",
            )?;
            ck(
                sys::cuMemAlloc_v2(&mut s.buf, MEMSET_BYTES),
                "cuMemAlloc_v2",
            )?;
        }
        Ok(s)
    }
}

impl Drop for SecondContext {
    fn drop(&mut self) {
        if !self.ctx.is_null() {
            // SAFETY: created in `new`, destroyed once; destroying frees its stream and
            // memory. Callers reset the thread's binding afterwards.
            unsafe { sys::cuCtxDestroy_v2(self.ctx) };
        }
    }
}

/// One GPU, two real contexts: primary and a created one, switched before every op.
/// gpubind binds only primary contexts, so it has no entry here. Submit timing: the GPU
/// time-slices between the two contexts.
fn switch_row(
    env: &mut Env,
    second_c: &mut CudarcExtra,
    second_r: &SecondContext,
    imp: Impl,
    n: usize,
) -> R<Option<f64>> {
    let (c, r) = (&mut env.c, &env.r);
    let p = Pair {
        g: None,
        c: [
            (&c.stream, &mut c.buf),
            (&second_c.stream, &mut second_c.buf),
        ],
        r: [
            (r.ctx, r.buf, r.stream),
            (second_r.ctx, second_r.buf, second_r.stream),
        ],
    };
    pair_row(&mut env.tc, Mode::Submit, imp, n, p)
}

/// Resources on a second GPU for the A/B alternation.
struct SecondGpu {
    dev: Arc<Device>,
    g_stream: Stream,
    g_buf: DeviceSlice<u8>,
    c_stream: Arc<CudaStream>,
    c_buf: CudaSlice<u8>,
    r: RawSide,
}

fn second_gpu(env: &mut Env, dev: Arc<Device>) -> R<SecondGpu> {
    env.tc.forget_binding();
    let (g_stream, g_buf) = {
        let gpu = env.tc.bind(&dev)?;
        (gpu.new_stream()?, gpu.alloc_zeros::<u8>(MEMSET_BYTES)?)
    };
    let ctx = CudaContext::new(dev.ordinal())?;
    let c_stream = ctx.new_stream()?;
    let c_buf = c_stream.alloc_zeros::<u8>(MEMSET_BYTES)?;
    c_stream.synchronize()?;
    let r = RawSide::new(&dev, None)?;
    env.tc.forget_binding();
    Ok(SecondGpu {
        dev,
        g_stream,
        g_buf,
        c_stream,
        c_buf,
        r,
    })
}

/// Two GPUs on one thread: bind A, memset on A, bind B, memset on B, ...
fn alternate_row(env: &mut Env, two: &mut SecondGpu, imp: Impl, n: usize) -> R<Option<f64>> {
    let (g, c, r) = (&mut env.g, &mut env.c, &env.r);
    let p = Pair {
        g: Some([
            (&env.dev, &g.stream, &mut g.buf),
            (&two.dev, &two.g_stream, &mut two.g_buf),
        ]),
        c: [(&c.stream, &mut c.buf), (&two.c_stream, &mut two.c_buf)],
        r: [
            (r.ctx, r.buf, r.stream),
            (two.r.ctx, two.r.buf, two.r.stream),
        ],
    };
    pair_row(&mut env.tc, Mode::Wall, imp, n, p)
}

// ---------------------------------------------------------------------------------------
// GPU memory footprint, measured from a child process
// ---------------------------------------------------------------------------------------

/// What the parent saw while a child went through its two phases.
struct Footprint {
    /// Bytes of device memory the child used after enumeration + attribute reads.
    after_listing: i64,
    /// Whether the child saw device 0's primary context active at that point.
    active_after_listing: bool,
    /// Bytes used after its first bind (or context creation).
    after_bind: i64,
}

fn footprint(gpu: &gpubind::BoundDevice<'_>, kind: &str) -> R<Footprint> {
    let free = || -> R<i64> { Ok(gpu.memory_info()?.0 as i64) };
    let before = free()?; // before the child exists
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args([CHILD_ARG, kind])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut to_child = child.stdin.take().ok_or("no child stdin")?;
    let mut from_child = BufReader::new(child.stdout.take().ok_or("no child stdout")?);
    let mut ready = || -> R<bool> {
        let mut line = String::new();
        from_child.read_line(&mut line)?;
        match line.trim() {
            "READY 0" => Ok(false),
            "READY 1" => Ok(true),
            other => {
                Err(format!("footprint child ({kind}) said {other:?} (see its stderr)").into())
            }
        }
    };
    let outcome = (|| -> R<Footprint> {
        let active_after_listing = ready()?;
        let after_listing = before - free()?;
        to_child.write_all(b"next\n")?;
        to_child.flush()?;
        ready()?;
        let after_bind = before - free()?;
        Ok(Footprint {
            after_listing,
            active_after_listing,
            after_bind,
        })
    })();
    let _ = to_child.write_all(b"exit\n");
    drop(to_child);
    let status = child.wait()?;
    let fp = outcome?;
    if !status.success() {
        return Err(format!("footprint child ({kind}) exited with {status}").into());
    }
    Ok(fp)
}

/// The child side: list devices and read attributes the way `kind` does, report, wait;
/// then bind (create/retain a context), report, wait.
fn footprint_child(kind: &str) -> R<()> {
    let report = |active: bool| -> R<()> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "READY {}", active as u8)?;
        out.flush()?;
        Ok(())
    };
    let wait = || -> R<()> {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        Ok(())
    };
    let primary_active = |dev: sys::CUdevice| -> R<bool> {
        let (mut flags, mut active) = (0u32, 0i32);
        // SAFETY: valid device handle after cuInit; writes two ints.
        ck(
            unsafe { sys::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) },
            "cuDevicePrimaryCtxGetState",
        )?;
        Ok(active != 0)
    };
    // cudarc's and the driver's attribute values (gpubind's own: DeviceAttribute).
    let sm = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
    let clock = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE;
    match kind {
        "gpubind" => {
            let devs = Device::all()?;
            for d in &devs {
                let _ = (
                    d.name(),
                    d.uuid(),
                    d.compute_capability()?,
                    d.total_memory()?,
                );
                let _ = (
                    d.multiprocessor_count()?,
                    d.attribute(DeviceAttribute::ClockRate)?,
                );
            }
            let d0 = devs.first().ok_or("no device")?;
            let mut active = false;
            for d in &devs {
                active |= d.is_primary_context_active()?;
            }
            report(active)?;
            wait()?;
            let mut tc = ThreadContext::acquire()?;
            let gpu = tc.bind(d0)?;
            gpu.synchronize()?;
            report(d0.is_primary_context_active()?)?;
            wait()?;
        }
        "cudarc" => {
            // cudarc's safe API reads device properties through a CudaContext, which
            // retains (creates) the primary context.
            let ctx = CudaContext::new(0)?;
            let _ = (
                ctx.name()?,
                ctx.uuid()?,
                ctx.compute_capability()?,
                ctx.total_mem()?,
            );
            let _ = (ctx.attribute(sm)?, ctx.attribute(clock)?);
            report(primary_active(ctx.cu_device())?)?;
            wait()?;
            ctx.default_stream().synchronize()?;
            report(primary_active(ctx.cu_device())?)?;
            wait()?;
        }
        "raw" => {
            // SAFETY: the driver library is present (the parent checked); no context.
            ck(unsafe { sys::cuInit(0) }, "cuInit")?;
            let mut dev: sys::CUdevice = 0;
            let (mut v, mut bytes) = (0i32, 0usize);
            let mut name = [0 as std::ffi::c_char; 256];
            // SAFETY: after cuInit; each call writes into the local it is given.
            unsafe {
                ck(sys::cuDeviceGet(&mut dev, 0), "cuDeviceGet")?;
                ck(
                    sys::cuDeviceGetName(name.as_mut_ptr(), 256, dev),
                    "cuDeviceGetName",
                )?;
                ck(
                    sys::cuDeviceTotalMem_v2(&mut bytes, dev),
                    "cuDeviceTotalMem_v2",
                )?;
                ck(
                    sys::cuDeviceGetAttribute(&mut v, sm, dev),
                    "cuDeviceGetAttribute",
                )?;
                ck(
                    sys::cuDeviceGetAttribute(&mut v, clock, dev),
                    "cuDeviceGetAttribute",
                )?;
            }
            report(primary_active(dev)?)?;
            wait()?;
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: valid device; writes one handle; the process exits holding it.
            ck(
                unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
                "cuDevicePrimaryCtxRetain",
            )?;
            set_current(ctx)?;
            // SAFETY: a current context exists.
            ck(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")?;
            report(primary_active(dev)?)?;
            wait()?;
        }
        other => return Err(format!("unknown footprint kind {other:?}").into()),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
enum Goal {
    /// gpubind/raw <= 1.03 and gpubind/cudarc <= 0.80 (single-stream work).
    PerOp,
    /// gpubind/raw <= 1.05: a buffer handed from one stream to another (raw: event
    /// record + wait by hand).
    Handoff,
    /// gpubind/raw <= 1.05 and gpubind/cudarc <= 1.00: a stream-ordered temporary per op
    /// (raw: `cuMemAllocAsync` / `cuMemFreeAsync` by hand).
    Temporaries,
    /// gpubind uses (about) no device memory.
    ZeroMemory,
    /// gpubind leaves the primary context inactive.
    Inactive,
    /// Informational.
    Info,
}

enum Cell {
    Ns(f64),
    MiB(f64),
    Flag(bool),
    Text(String),
}

impl Cell {
    fn show(&self) -> String {
        match self {
            Cell::Ns(v) => format!("{v:.0} ns"),
            Cell::MiB(v) => format!("{v:.1} MiB"),
            Cell::Flag(b) => (if *b { "yes" } else { "no" }).to_owned(),
            Cell::Text(t) => t.clone(),
        }
    }
    fn ns(&self) -> Option<f64> {
        match self {
            Cell::Ns(v) => Some(*v),
            _ => None,
        }
    }
}

struct Row {
    label: String,
    cells: [Cell; 3],
    goal: Goal,
    /// gpubind/raw paired per round, where measured; the goals are judged by its median
    /// (drift between rounds cancels), else by the ratio of the medians.
    paired: Option<Paired>,
}

impl Row {
    fn ratio(&self, other: Impl) -> Option<f64> {
        let g = self.cells[0].ns()?;
        let o = self.cells[other as usize].ns()?;
        (o > 0.0).then(|| g / o)
    }

    fn goal_text(&self) -> String {
        let r_raw = self.paired.map(|p| p.median).or(self.ratio(Impl::Raw));
        let r_cu = self.ratio(Impl::Cudarc);
        let mark = |ok: Option<bool>| match ok {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "n/a",
        };
        match self.goal {
            Goal::PerOp => format!(
                "/raw <= 1.03: {}; /cudarc <= 0.80: {}",
                mark(r_raw.map(|r| r <= 1.03)),
                mark(r_cu.map(|r| r <= 0.80))
            ),
            Goal::Handoff => format!("/raw <= 1.05: {}", mark(r_raw.map(|r| r <= 1.05))),
            Goal::Temporaries => format!(
                "/raw <= 1.05: {}; /cudarc <= 1.00: {}",
                mark(r_raw.map(|r| r <= 1.05)),
                mark(r_cu.map(|r| r <= 1.00))
            ),
            Goal::ZeroMemory => {
                let ok = match self.cells[0] {
                    Cell::MiB(v) => Some(v < 1.0),
                    _ => None,
                };
                format!("gpubind 0 MiB: {}", mark(ok))
            }
            Goal::Inactive => {
                let ok = match self.cells[0] {
                    Cell::Flag(b) => Some(!b),
                    _ => None,
                };
                format!("gpubind no: {}", mark(ok))
            }
            Goal::Info => "info".to_owned(),
        }
    }

    fn columns(&self) -> Vec<String> {
        let ratio = |r: Option<f64>| r.map_or("—".to_owned(), |r| format!("{r:.2}"));
        vec![
            self.label.clone(),
            self.cells[0].show(),
            self.cells[1].show(),
            self.cells[2].show(),
            ratio(self.ratio(Impl::Raw)),
            self.paired.map_or("—".to_owned(), |p| {
                format!("{:.3} ({:.2}–{:.2})", p.median, p.min, p.max)
            }),
            ratio(self.ratio(Impl::Cudarc)),
            self.goal_text(),
        ]
    }
}

const HEADER: [&str; 8] = [
    "measurement",
    "gpubind",
    "cudarc 0.19",
    "raw driver",
    "gpubind/raw",
    "paired /raw (min–max)",
    "gpubind/cudarc",
    "goal",
];

fn render(rows: &[Row], markdown: bool) -> String {
    let body: Vec<Vec<String>> = rows.iter().map(Row::columns).collect();
    let mut out = String::new();
    if markdown {
        out += &format!("| {} |\n", HEADER.join(" | "));
        out += &format!("|{}\n", "---|".repeat(HEADER.len()));
        for r in &body {
            out += &format!("| {} |\n", r.join(" | "));
        }
        return out;
    }
    let mut w: Vec<usize> = HEADER.iter().map(|h| h.chars().count()).collect();
    for r in &body {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| -> String {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let pad = w[i] - c.chars().count();
                if i == 0 || i == cells.len() - 1 {
                    format!("{c}{}", " ".repeat(pad))
                } else {
                    format!("{}{c}", " ".repeat(pad))
                }
            })
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    out += &line(HEADER.iter().map(|s| s.to_string()).collect());
    out += &format!(
        "{}\n",
        "-".repeat(w.iter().sum::<usize>() + 2 * (w.len() - 1))
    );
    for r in body {
        out += &line(r);
    }
    out
}

fn ns_cells(v: [Option<f64>; 3]) -> [Cell; 3] {
    v.map(|x| x.map_or(Cell::Text("n/a".into()), Cell::Ns))
}

fn failed_cells(e: &dyn std::error::Error) -> [Cell; 3] {
    let short: String = e
        .to_string()
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(60)
        .collect();
    [
        Cell::Text(format!("failed: {short}")),
        Cell::Text("—".into()),
        Cell::Text("—".into()),
    ]
}

// ---------------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------------

fn driver_version() -> R<String> {
    let mut v = 0i32;
    // SAFETY: writes one int; needs no context.
    ck(
        unsafe { sys::cuDriverGetVersion(&mut v) },
        "cuDriverGetVersion",
    )?;
    Ok(format!("{}.{} ({v})", v / 1000, (v % 1000) / 10))
}

fn machine(devs: &[Arc<Device>], opts: &Opts) -> R<Vec<String>> {
    let mut lines = vec![format!(
        "CUDA driver API {} | {} device(s) | gpubind {} | cudarc 0.19 | iters {} x {} rounds (median)",
        driver_version()?,
        devs.len(),
        env!("CARGO_PKG_VERSION"),
        opts.iters,
        opts.rounds
    )];
    for d in devs {
        let (major, minor) = d.compute_capability()?;
        lines.push(format!(
            "device {}: {} | CC {major}.{minor} | {} SMs | {:.1} GiB | {}",
            d.ordinal(),
            d.name(),
            d.multiprocessor_count()?,
            d.total_memory()? as f64 / (1u64 << 30) as f64,
            d.uuid()
        ));
    }
    Ok(lines)
}

fn progress(what: &str) {
    eprintln!("gpubench: {what} ...");
}

/// Runs everything and prints the table; `Ok(false)` if some row failed.
fn run(opts: &Opts) -> R<bool> {
    let devs = Device::all()?;
    if devs.is_empty() {
        return Err("no CUDA device found: the driver reports 0 devices".into());
    }
    let header = machine(&devs, opts)?;
    let dev = Arc::clone(&devs[0]);
    let mut tc = ThreadContext::acquire()?;
    let mut rows: Vec<Row> = Vec::new();
    let mut errors: Vec<String> = Vec::new();

    // Footprint first, before this process allocates anything else.
    let mut mem_rows = Vec::new();
    {
        let gpu = tc.bind(&dev)?;
        let mut fps = Vec::new();
        for kind in ["gpubind", "cudarc", "raw"] {
            progress(&format!("memory footprint ({kind} child)"));
            fps.push(footprint(&gpu, kind));
        }
        let mib = |b: i64| Cell::MiB(b as f64 / (1u64 << 20) as f64);
        let cell = |f: &R<Footprint>, pick: &dyn Fn(&Footprint) -> Cell| match f {
            Ok(fp) => pick(fp),
            Err(e) => Cell::Text(format!("failed: {e}")),
        };
        for f in fps.iter().filter_map(|f| f.as_ref().err()) {
            errors.push(format!("memory footprint: {f}"));
        }
        let pick3 = |pick: &dyn Fn(&Footprint) -> Cell| -> [Cell; 3] {
            [
                cell(&fps[0], pick),
                cell(&fps[1], pick),
                cell(&fps[2], pick),
            ]
        };
        mem_rows.push(Row {
            label: "GPU memory after listing + attributes (child)".into(),
            cells: pick3(&|fp| mib(fp.after_listing)),
            goal: Goal::ZeroMemory,
            paired: None,
        });
        mem_rows.push(Row {
            label: "primary context active after listing (child)".into(),
            cells: pick3(&|fp| Cell::Flag(fp.active_after_listing)),
            goal: Goal::Inactive,
            paired: None,
        });
        mem_rows.push(Row {
            label: "GPU memory after first bind (child)".into(),
            cells: pick3(&|fp| mib(fp.after_bind)),
            goal: Goal::Info,
            paired: None,
        });
    }

    progress("setting up streams, buffers and kernels");
    let mut env = setup(tc, dev)?;
    let (n, rounds) = (opts.iters, opts.rounds);
    let mut push = |rows: &mut Vec<Row>, label: &str, goal: Goal, res: R<[Option<f64>; 3]>| {
        let cells = match res {
            Ok(v) => ns_cells(v),
            Err(e) => {
                errors.push(format!("{label}: {e}"));
                failed_cells(e.as_ref())
            }
        };
        rows.push(Row {
            label: label.to_owned(),
            cells,
            goal,
            paired: LAST_PAIRED.with(|p| p.take()),
        });
    };

    for (label, mode) in [
        ("memset 256 B async, stream (wall)", Mode::Wall),
        ("memset 256 B async, stream (submit)", Mode::Submit),
    ] {
        progress(label);
        let res = bench_row(rounds, n, |imp, k| memset_row(&mut env, mode, imp, k));
        push(&mut rows, label, Goal::PerOp, res);
    }
    let label = "htod 4 B, landed per op (wall)";
    progress(label);
    let res = bench_row(rounds, n, |imp, k| htod_row(&mut env, imp, k));
    push(&mut rows, label, Goal::PerOp, res);
    let label = "htod 4 B async, stream (wall)";
    progress(label);
    let res = bench_row(rounds, n, |imp, k| htod_async_row(&mut env, imp, k));
    push(&mut rows, label, Goal::PerOp, res);
    for (label, mode) in [
        ("empty kernel launch (wall)", Mode::Wall),
        ("empty kernel launch (submit)", Mode::Submit),
    ] {
        progress(label);
        let res = bench_row(rounds, n, |imp, k| empty_launch_row(&mut env, mode, imp, k));
        push(&mut rows, label, Goal::PerOp, res);
    }
    let label = "launch, 3 args: 2 buffers + u32 (submit)";
    progress(label);
    let res = bench_row(rounds, n, |imp, k| {
        args_launch_row(&mut env, Mode::Submit, imp, k)
    });
    push(&mut rows, label, Goal::PerOp, res);
    let label = "launch, 3 args: 2 read buffers + u32 (submit)";
    progress(label);
    let res = bench_row(rounds, n, |imp, k| {
        reads_launch_row(&mut env, Mode::Submit, imp, k)
    });
    push(&mut rows, label, Goal::PerOp, res);

    // Graphs: GRAPH_K kernels one by one, then the same as one graph launch. gpubind's
    // graph borrows its own module and buffers (not `env`'s, which the rows borrow
    // mutably).
    let (g_module, g_a, g_b) = {
        env.tc.forget_binding();
        let gpu = env.tc.bind(&env.dev)?;
        let m = env
            .cubin
            .as_deref()
            .map(|c| gpu.load_cubin(c))
            .transpose()?;
        let a = gpu.alloc_zeros::<f32>(TOUCH_N as usize)?;
        let b = gpu.alloc_zeros::<f32>(TOUCH_N as usize)?;
        (m, a, b)
    };
    let mut graphs = match &g_module {
        Some(m) => GraphBench::new(&mut env, m, &g_a, &g_b),
        None => Err(env.no_kernels()),
    };
    for (label, graph) in [
        (
            "16 kernels (3 args), launched one by one, per 16 (wall)",
            false,
        ),
        ("the same 16 kernels as one graph launch (wall)", true),
    ] {
        progress(label);
        let res = match &mut graphs {
            Ok(gb) => bench_row(rounds, (n / GRAPH_K).max(100), |imp, k| {
                graph_row(&mut env, gb, graph, imp, k)
            }),
            Err(e) => Err(e.to_string().into()),
        };
        push(&mut rows, label, Goal::Info, res);
    }
    drop(graphs);

    for (label, mode) in [
        ("hand-off A->B + memset 256 B, per op (wall)", Mode::Wall),
        (
            "hand-off A->B + memset 256 B, per op (submit)",
            Mode::Submit,
        ),
    ] {
        progress(label);
        let res = bench_row(rounds, n / 2, |imp, k| handoff_row(&mut env, mode, imp, k));
        push(&mut rows, label, Goal::Handoff, res);
    }

    // Temporaries: one pool (the device's default) serves all three; it keeps what they
    // free (release threshold u64::MAX) so that no row pays for remapping after the
    // untimed synchronisations, and gets its setting back after.
    let pool = env.dev.memory_pool();
    let kept = match &pool {
        Ok(p) => p.release_threshold().ok().inspect(|_| {
            let _ = p.set_release_threshold(u64::MAX);
        }),
        Err(_) => None,
    };
    for (label, bytes) in [
        ("temporary 4 KiB: alloc + launch + drop (submit)", 4 << 10),
        ("temporary 4 MiB: alloc + launch + drop (submit)", 4 << 20),
    ] {
        progress(label);
        let res = match &pool {
            Ok(_) => bench_row(rounds, n / 4, |imp, k| {
                temporaries_row(&mut env, Mode::Submit, bytes, imp, k)
            }),
            Err(e) => Err(e.to_string().into()),
        };
        push(&mut rows, label, Goal::Temporaries, res);
    }
    if let (Ok(p), Some(t)) = (&pool, kept) {
        let _ = p.set_release_threshold(t);
    }

    let label = "cuCtxGetCurrent alone (gpubind's per-op binding check)";
    progress(label);
    let res = bench_row(rounds, n, |imp, k| ctx_check_row(&mut env, imp, k));
    push(&mut rows, label, Goal::Info, res);

    let label = "1 GPU: re-bind same ctx + memset, per op (wall)";
    progress(label);
    let res = bench_row(rounds, n / 2, |imp, k| rebind_row(&mut env, imp, k));
    push(&mut rows, label, Goal::Info, res);

    // Two real contexts on one GPU: fewer iterations (the GPU time-slices between them).
    let label = "1 GPU: switch primary <-> created ctx + memset, per op (submit)";
    progress(label);
    let res = (|| -> R<[Option<f64>; 3]> {
        let mut second_c = CudarcExtra::new(CudaContext::new_non_primary(env.dev.ordinal(), 0)?)?;
        let second_r = SecondContext::new(env.r.dev)?;
        let out = bench_row(rounds, (n / 20).max(100), |imp, k| {
            switch_row(&mut env, &mut second_c, &second_r, imp, k)
        });
        drop(second_r);
        drop(second_c);
        env.r.make_current()?;
        env.tc.forget_binding();
        out
    })();
    push(&mut rows, label, Goal::Info, res);

    let label = "2 GPUs: alternate GPU0/GPU1 + memset, per op (wall)";
    if devs.len() >= 2 {
        progress(label);
        let res = second_gpu(&mut env, Arc::clone(&devs[1])).and_then(|mut two| {
            bench_row(rounds, n / 2, |imp, k| {
                alternate_row(&mut env, &mut two, imp, k)
            })
        });
        push(&mut rows, label, Goal::PerOp, res);
    } else {
        rows.push(Row {
            label: label.into(),
            cells: [
                Cell::Text("skipped: 1 GPU".into()),
                Cell::Text("—".into()),
                Cell::Text("—".into()),
            ],
            goal: Goal::Info,
            paired: None,
        });
    }
    rows.extend(mem_rows);
    rows.push(Row {
        label: "training samples/s".into(),
        cells: [
            Cell::Text("see examples/train_mlp.rs".into()),
            Cell::Text("—".into()),
            Cell::Text("—".into()),
        ],
        goal: Goal::Info,
        paired: None,
    });

    let md = opts.markdown;
    let mut out = String::new();
    for l in &header {
        out += &if md {
            format!("- {l}\n")
        } else {
            format!("{l}\n")
        };
    }
    out += "\n";
    out += &render(&rows, md);
    out += "\n";
    for (i, note) in NOTES.iter().enumerate() {
        out += &if md {
            format!("{}. {note}\n", i + 1)
        } else {
            format!("[{}] {note}\n", i + 1)
        };
    }
    if !errors.is_empty() {
        out += "\nerrors:\n";
        for e in &errors {
            out += &format!("- {e}\n");
        }
    }
    print!("{out}");
    Ok(errors.is_empty())
}

const NOTES: [&str; 10] = [
    "wall: Instant around the whole loop plus the final synchronize (throughput; a queue that fills up makes this GPU-bound). submit: only the time inside the enqueueing calls, in batches of 256 ops with an untimed synchronize between batches (host cost per op).",
    "gpubind: one bind, then BoundStream / BoundDevice methods (ThreadContext::bind is outside the loop except in the re-bind and alternation rows); work on the legacy stream checks the current context (cuCtxGetCurrent; work on gpubind's streams needs no check), and every op claims its buffers (a buffer held by &mut: no lock; otherwise an uncontended lock; a launch on the stream that already orders every buffer it passes locks only the stream's gate; a hand-off records an event on the previous stream and makes the next one wait). cudarc: CudaStream methods, which call bind_to_thread (cuCtxGetCurrent, and cuCtxSetCurrent when another context is current) on every op; its streams come from new_stream, so its default event tracking (cuStreamWaitEvent/cuEventRecord per buffer use) is on. raw: the bare cudarc::driver::sys call with the context already current.",
    "htod 4 B, landed per op: each op is an upload that has reached device memory when it returns. gpubind htod_copy = cuMemcpyHtoD_v2 + a wait for the legacy stream (a pageable cuMemcpyHtoD returns once the data is staged, before the DMA lands); raw = the same two calls; cudarc 0.19 = memcpy_htod + synchronize on the default stream of a single-stream context. htod 4 B async: gpubind BoundStream::htod_async, cudarc memcpy_htod on its stream, raw cuMemcpyHtoDAsync_v2, one synchronize at the end.",
    "kernels are NVRTC-compiled once to a cubin for this GPU and loaded by each implementation; launches use 1 block (1 thread for `empty`, 32 for `touch(float*, const float*, unsigned)`).",
    "re-bind row, 1 GPU: gpubind binds the same device before each op (one cuCtxGetCurrent, nothing set); cudarc alternates two CudaContext objects of the same ordinal, which wrap the same primary context (bind_to_thread finds it current); raw calls cuCtxSetCurrent(primary) before each op.",
    "switch row, 1 GPU: a real context switch before each op between the primary context and a second context (cudarc CudaContext::new_non_primary, raw cuCtxCreate_v2). gpubind only binds primary contexts, so it has no entry; on one GPU it never needs to switch. Fewer iterations (iters/20), submit timing.",
    "2-GPU row: bind A, memset on A, bind B, memset on B, ... for all three (raw: cuCtxSetCurrent + cuMemsetD8Async). Per op = per (switch + memset).",
    "graph rows: 16 launches of `touch` (as in the 3-arg row), one by one or captured once into a graph and launched as one (cuGraphLaunch), per group of 16. gpubind: BoundDevice::capture + GraphExec::launch (which claims the graph's 2 buffers once per graph launch); cudarc 0.19: CudaStream::begin_capture / end_capture + CudaGraph::launch on a context object with event tracking disabled (its capture cannot wait on events recorded outside it; the one-by-one cudarc row uses that stream too); raw: cuStreamBeginCapture_v2 / cuStreamEndCapture / cuGraphInstantiateWithFlags / cuGraphLaunch.",
    "memory rows: a child process (gpubench re-executed) lists the devices and reads attributes (gpubind: Device::all + attributes; cudarc: CudaContext::new(0) + attributes, as its safe API needs a context; raw: cuInit + cuDeviceGet*), waits, then binds (gpubind ThreadContext::bind; raw cuDevicePrimaryCtxRetain + cuCtxSetCurrent). The parent reads device-wide free memory with cuMemGetInfo before the child starts and at each phase; used = before - now.",
    "temporaries: per op a zeroed temporary allocated on the stream from the device's default memory pool (4 KiB or 4 MiB), one `touch` launch writing it, and its drop. gpubind BoundStream::alloc_zeros (cuMemAllocFromPoolAsync + cuMemsetD8Async) and the slice's drop (cuMemFreeAsync on the stream of its last use, no host wait); cudarc CudaStream::alloc_zeros + drop (cuMemAllocAsync, cuMemsetD8Async, cuMemFreeAsync, and its event tracking); raw cuMemAllocAsync + cuMemsetD8Async + cuLaunchKernel + cuMemFreeAsync. The pool's release threshold is raised to u64::MAX for these rows (restored after), so the untimed synchronisations between batches do not unmap it.",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(vec![5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }

    #[test]
    fn options_parse_and_reject() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = parse_args(&args(&[])).unwrap();
        assert_eq!((o.iters, o.rounds, o.markdown), (100_000, 5, false));
        let o = parse_args(&args(&["--quick", "--markdown", "--rounds", "3"])).unwrap();
        assert_eq!((o.iters, o.rounds, o.markdown), (10_000, 3, true));
        assert_eq!(parse_args(&args(&["--iters", "7"])).unwrap().iters, 7);
        for bad in [
            &["--iters"][..],
            &["--iters", "0"],
            &["--iters", "x"],
            &["--what"],
        ] {
            assert!(parse_args(&args(bad)).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn measure_runs_each_op_once_and_syncs_per_batch() {
        for (mode, iters, syncs) in [
            (Mode::Wall, 1000, 2),
            (Mode::Submit, 1000, 1 + 1000usize.div_ceil(SUBMIT_BATCH)),
            (Mode::Submit, 256, 2),
        ] {
            let (mut ops, mut sync) = (0usize, 0usize);
            let ns = measure(mode, iters, |step| {
                match step {
                    Step::Op => ops += 1,
                    Step::Sync => sync += 1,
                }
                Ok(())
            })
            .unwrap();
            assert_eq!((ops, sync), (iters, syncs));
            assert!(ns.is_finite() && ns >= 0.0);
        }
        let err = measure(Mode::Wall, 10, |step| match step {
            Step::Op => Err("boom".into()),
            Step::Sync => Ok(()),
        });
        assert_eq!(err.unwrap_err().to_string(), "boom");
    }

    #[test]
    fn bench_row_interleaves_slices_and_takes_medians() {
        let mut calls = Vec::new();
        let res = bench_row(3, 2005, |imp, n| {
            calls.push((imp, n));
            // gpubind is 10 ns in round 0, 11 in round 1, 12 in round 2 (after 3 warm-ups).
            let round = calls.len().saturating_sub(4) / (3 * SLICES);
            Ok(match imp {
                Impl::Gpubind => Some(10.0 + round as f64),
                Impl::Cudarc => Some(20.0),
                Impl::Raw => None,
            })
        })
        .unwrap();
        // 3 warm-ups of iters/10, then 3 rounds of SLICES slices of 3 calls.
        assert_eq!(calls.len(), 3 + 3 * SLICES * 3);
        assert!(calls[..3].iter().all(|&(_, n)| n == 200));
        // The order rotates every slice.
        use Impl::*;
        let order: Vec<Impl> = calls[3..12].iter().map(|&(i, _)| i).collect();
        assert_eq!(
            order,
            [
                Gpubind, Cudarc, Raw, Cudarc, Raw, Gpubind, Raw, Gpubind, Cudarc
            ]
        );
        // Each round's slices add up to its iterations, for every implementation.
        for round in calls[3..].chunks(3 * SLICES) {
            for imp in IMPLS {
                let k: usize = round.iter().filter(|c| c.0 == imp).map(|c| c.1).sum();
                assert_eq!(k, 2005, "{imp:?}");
            }
        }
        assert_eq!(res, [Some(11.0), Some(20.0), None]);
    }

    #[test]
    fn bench_row_pairs_gpubind_with_raw_within_slices() {
        // The machine drifts from slice to slice (raw 100, 200, ... ns); gpubind is always
        // 1.1x the raw figure of its own slice: the paired ratio is 1.1 in every round,
        // though the ratio of any gpubind slice to another slice's raw is not.
        let mut calls = 0usize;
        let res = bench_row(3, 1000, |imp, _| {
            calls += 1;
            if calls <= 3 {
                return Ok(Some(1.0)); // warm-up
            }
            let base = 100.0 * (1 + (calls - 4) / 3) as f64;
            Ok(Some(match imp {
                Impl::Raw => base,
                Impl::Gpubind => 1.1 * base,
                Impl::Cudarc => 1.0,
            }))
        })
        .unwrap();
        assert!(res[0].is_some() && res[2].is_some());
        let p = LAST_PAIRED.with(|p| p.take()).expect("paired stats");
        assert!((p.median - 1.1).abs() < 1e-9, "{p:?}");
        assert!(
            (p.min - 1.1).abs() < 1e-9 && (p.max - 1.1).abs() < 1e-9,
            "{p:?}"
        );
    }

    #[test]
    fn bench_row_drops_an_implementation_that_fails_a_slice() {
        // An implementation that cannot run one slice has no figure for that round.
        let mut calls = 0usize;
        let res = bench_row(1, 1000, |imp, _| {
            calls += 1;
            Ok(match imp {
                Impl::Cudarc if calls == 7 => None, // slice 1 starts with cudarc
                _ => Some(5.0),
            })
        })
        .unwrap();
        assert_eq!(res, [Some(5.0), None, Some(5.0)]);
    }

    #[test]
    fn rows_compute_ratios_and_goals() {
        let row = Row {
            label: "x".into(),
            cells: [Cell::Ns(100.0), Cell::Ns(200.0), Cell::Ns(98.0)],
            goal: Goal::PerOp,
            paired: None,
        };
        let cols = row.columns();
        assert_eq!(cols[1], "100 ns");
        assert_eq!(cols[4], "1.02"); // 100/98
        assert_eq!(cols[5], "—"); // no paired ratio measured
        assert_eq!(cols[6], "0.50");
        assert_eq!(cols[7], "/raw <= 1.03: met; /cudarc <= 0.80: met");
        // A paired ratio, where measured, is shown and judges the goal: here the ratio
        // of the medians (1.02) would meet it, the paired median (1.04) does not.
        let drifting = Row {
            paired: Some(Paired {
                median: 1.04,
                min: 0.97,
                max: 1.12,
            }),
            ..row
        };
        let cols = drifting.columns();
        assert_eq!(cols[5], "1.040 (0.97–1.12)");
        assert_eq!(cols[7], "/raw <= 1.03: MISSED; /cudarc <= 0.80: met");
        let slow = Row {
            label: "y".into(),
            cells: [Cell::Ns(120.0), Cell::Ns(130.0), Cell::Ns(100.0)],
            goal: Goal::PerOp,
            paired: None,
        };
        assert_eq!(
            slow.columns()[7],
            "/raw <= 1.03: MISSED; /cudarc <= 0.80: MISSED"
        );
        let na = Row {
            label: "z".into(),
            cells: [Cell::Text("n/a".into()), Cell::Ns(1.0), Cell::Ns(1.0)],
            goal: Goal::Info,
            paired: None,
        };
        assert_eq!(na.columns()[4..7], ["—", "—", "—"]);
        let mem = Row {
            label: "m".into(),
            cells: [Cell::MiB(0.0), Cell::MiB(500.0), Cell::MiB(0.0)],
            goal: Goal::ZeroMemory,
            paired: None,
        };
        assert_eq!(mem.columns()[7], "gpubind 0 MiB: met");
        let active = Row {
            label: "a".into(),
            cells: [Cell::Flag(true), Cell::Flag(true), Cell::Flag(false)],
            goal: Goal::Inactive,
            paired: None,
        };
        assert_eq!(active.columns()[7], "gpubind no: MISSED");
    }

    #[test]
    fn tables_render_as_text_and_markdown() {
        let rows = [
            Row {
                label: "memset".into(),
                cells: [Cell::Ns(1500.0), Cell::Ns(2500.0), Cell::Ns(1480.0)],
                goal: Goal::PerOp,
                paired: None,
            },
            Row {
                label: "memory".into(),
                cells: [Cell::MiB(0.0), Cell::MiB(512.0), Cell::MiB(0.0)],
                goal: Goal::ZeroMemory,
                paired: None,
            },
        ];
        let md = render(&rows, true);
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[1].starts_with("|---|"));
        for l in &lines {
            assert_eq!(l.matches('|').count(), HEADER.len() + 1, "{l}");
        }
        assert!(lines[2].contains("| 1500 ns | 2500 ns | 1480 ns | 1.01 | — | 0.60 |"));
        let text = render(&rows, false);
        let tl: Vec<&str> = text.lines().collect();
        assert_eq!(tl.len(), 4);
        assert!(tl[0].starts_with("measurement"));
        assert!(tl[3].contains("512.0 MiB"));
        // Right-aligned number columns end at the same place.
        let end = |l: &str, pat: &str| l.find(pat).map(|i| i + pat.len());
        assert_eq!(end(tl[2], "1500 ns"), end(tl[3], "0.0 MiB"));
    }
}
