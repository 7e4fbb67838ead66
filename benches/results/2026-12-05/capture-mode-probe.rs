//! The program behind capture-mode-probe.txt (run once as a temporary example): which driver calls invalidate a capture of another stream, in each capture mode, with and without the calling thread relaxed.
use cudarc::driver::sys::{self, CUresult, CUstreamCaptureMode as M};
use cudarc::driver::CudaContext;

fn ok(r: CUresult, what: &str) -> CUresult {
    if r != CUresult::CUDA_SUCCESS {
        println!("    {what}: {r:?}");
    }
    r
}

unsafe fn status(s: sys::CUstream) -> sys::CUstreamCaptureStatus {
    let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    unsafe { sys::cuStreamIsCapturing(s, &mut st) };
    st
}

fn relaxed<R>(f: impl FnOnce() -> R) -> R {
    let mut m = M::CU_STREAM_CAPTURE_MODE_RELAXED;
    unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut m) };
    let r = f();
    unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut m) };
    r
}

fn main() {
    let ctx = CudaContext::new(0).unwrap();
    let cs = ctx.new_stream().unwrap();
    let other = ctx.new_stream().unwrap();
    let c = cs.cu_stream();
    let o = other.cu_stream();
    unsafe {
        let mut pool = std::ptr::null_mut();
        sys::cuDeviceGetDefaultMemPool(&mut pool, 0);
        let mut ev = std::ptr::null_mut();
        sys::cuEventCreate(&mut ev, 2); // disable timing
        let mut dptr: sys::CUdeviceptr = 0;
        sys::cuMemAlloc_v2(&mut dptr, 64);
        type Step = (&'static str, Box<dyn Fn(sys::CUdeviceptr) -> CUresult>);
        let steps: Vec<Step> = vec![
            ("nothing", Box::new(|_| CUresult::CUDA_SUCCESS)),
            ("memset on cs", Box::new(move |_| sys::cuMemsetD8Async(dptr, 0, 64, c))),
            ("free_async legacy", Box::new(|p| sys::cuMemFreeAsync(p, std::ptr::null_mut()))),
            ("free_async legacy relaxed", Box::new(|p| relaxed(|| sys::cuMemFreeAsync(p, std::ptr::null_mut())))),
            ("free_async other", Box::new(move |p| sys::cuMemFreeAsync(p, o))),
            ("free_async other relaxed", Box::new(move |p| relaxed(|| sys::cuMemFreeAsync(p, o)))),
            ("event query", Box::new(move |_| sys::cuEventQuery(ev))),
            ("event query relaxed", Box::new(move |_| relaxed(|| sys::cuEventQuery(ev)))),
            ("event sync relaxed", Box::new(move |_| relaxed(|| sys::cuEventSynchronize(ev)))),
            ("stream sync other", Box::new(move |_| sys::cuStreamSynchronize(o))),
            ("stream sync other relaxed", Box::new(move |_| relaxed(|| sys::cuStreamSynchronize(o)))),
            ("stream query other relaxed", Box::new(move |_| relaxed(|| sys::cuStreamQuery(o)))),
            ("cs waits pre-capture event", Box::new(move |_| sys::cuStreamWaitEvent(c, ev, 0))),
            ("cs waits pre-capture event EXTERNAL", Box::new(move |_| sys::cuStreamWaitEvent(c, ev, 1))),
            ("other waits pre-capture event", Box::new(move |_| sys::cuStreamWaitEvent(o, ev, 0))),
            ("legacy memset relaxed", Box::new(move |_| relaxed(|| sys::cuMemsetD8Async(dptr, 0, 64, std::ptr::null_mut())))),
            ("ctx push/pop", Box::new(|_| { let mut cur = std::ptr::null_mut(); sys::cuCtxGetCurrent(&mut cur); sys::cuCtxPushCurrent_v2(cur); sys::cuCtxPopCurrent_v2(&mut cur) })),
        ];
        for mode in [M::CU_STREAM_CAPTURE_MODE_GLOBAL, M::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL] {
            for (name, f) in &steps {
                let mut p: sys::CUdeviceptr = 0;
                ok(sys::cuMemAllocFromPoolAsync(&mut p, 1 << 20, pool, c), "alloc");
                ok(sys::cuMemsetD8Async(p, 1, 1 << 20, c), "memset");
                ok(sys::cuEventRecord(ev, c), "record");
                ok(sys::cuStreamSynchronize(c), "sync");
                ok(sys::cuStreamBeginCapture_v2(c, mode), "begin");
                let r = f(p);
                let st = status(c);
                let mut g = std::ptr::null_mut();
                let e = sys::cuStreamEndCapture(c, &mut g);
                if !g.is_null() {
                    sys::cuGraphDestroy(g);
                }
                println!("{mode:?} {name}: {r:?}; capture {st:?}; end {e:?}");
                if !name.starts_with("free_async") {
                    sys::cuMemFreeAsync(p, c);
                }
                sys::cuCtxSynchronize();
            }
        }
        // Another thread captures in GLOBAL mode while this one syncs a stream.
        let cu = c as usize;
        let (tx, rx) = std::sync::mpsc::channel();
        let (tx2, rx2) = std::sync::mpsc::channel::<()>();
        let ctx2 = ctx.clone();
        let h = std::thread::spawn(move || {
            ctx2.bind_to_thread().unwrap();
            let c = cu as sys::CUstream;
            sys::cuStreamBeginCapture_v2(c, M::CU_STREAM_CAPTURE_MODE_GLOBAL);
            tx.send(()).unwrap();
            rx2.recv().unwrap();
            let st = status(c);
            let mut g = std::ptr::null_mut();
            let e = sys::cuStreamEndCapture(c, &mut g);
            println!("other thread's GLOBAL capture: {st:?}; end {e:?}");
        });
        rx.recv().unwrap();
        let r1 = sys::cuStreamSynchronize(o);
        let r2 = relaxed(|| sys::cuStreamSynchronize(o));
        println!("this thread, another's GLOBAL capture: stream sync {r1:?}, relaxed {r2:?}");
        tx2.send(()).unwrap();
        h.join().unwrap();
    }
}
