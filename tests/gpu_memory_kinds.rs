//! GPU tests of the memory kinds (pinned, registered, managed, device), the copies between
//! every pair of them, and DLPack export/import on a real device (feature `dlpack`; the
//! pool-slice copies need feature `ipc`).
//!
//! Run: `cargo test --test gpu_memory_kinds` (prints one SKIPPED line without a GPU).

// Buffers a kernel writes are passed as `&mut`, as gpubind's launch docs recommend.
#![allow(clippy::unnecessary_mut_passed)]

mod common;

use common::Ctx;
#[cfg(feature = "dlpack")]
use gpubind::dlpack::{
    self, DLDataType, DLDevice, DLDeviceType, DLManagedTensorVersioned, DLPackVersion, DLTensor,
};
use gpubind::{
    Advice, BoundDevice, CopyDest, CopySource, Device, DeviceSlice, Error, LaunchConfig, Location,
    ManagedSlice, MemoryKind, PinnedHostBuffer, PinnedOptions, RegisterOptions, RegisteredHost,
    ThreadContext,
};
use rand::Rng;
// The DLPack tests' (feature `dlpack`).
#[cfg(feature = "dlpack")]
use std::collections::HashMap;
#[cfg(feature = "dlpack")]
use std::ffi::c_void;
#[cfg(feature = "dlpack")]
use std::sync::Mutex;
#[cfg(feature = "dlpack")]
use std::sync::atomic::{AtomicUsize, Ordering};

type TestResult = Result<(), String>;

const SIZES: [usize; 4] = [1, 1000, 65_537, (1 << 20) + 3];

fn random_u32(n: usize) -> Vec<u32> {
    let mut rng = rand::rng();
    (0..n).map(|_| rng.random()).collect()
}

fn random_f32(n: usize) -> Vec<f32> {
    let mut rng = rand::rng();
    (0..n).map(|_| rng.random_range(-100.0f32..100.0)).collect()
}

/// The pattern both the kernel and the host (and child processes) compute.
fn pattern(i: u32, seed: u32) -> u32 {
    let mut x = i.wrapping_mul(2_654_435_761) ^ seed;
    x ^= x >> 13;
    x = x.wrapping_mul(0x5bd1_e995);
    x ^= x >> 15;
    x
}

const KERNELS: &str = r#"
extern "C" __global__ void affine(float* x, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * 2.0f + 1.0f;
}
extern "C" __global__ void add_one(const float* in, float* out, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] + 1.0f;
}
extern "C" __global__ void fill_pattern(unsigned* p, unsigned n, unsigned seed) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned x = (i * 2654435761u) ^ seed;
        x ^= x >> 13;
        x *= 0x5bd1e995u;
        x ^= x >> 15;
        p[i] = x;
    }
}
extern "C" __global__ void copy_u32(const unsigned* in, unsigned* out, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}
"#;

fn first_mismatch<T: PartialEq + std::fmt::Debug>(got: &[T], want: &[T]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("length {} != {}", got.len(), want.len()));
    }
    got.iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .map(|i| format!("element {i}: got {:?}, want {:?}", got[i], want[i]))
}

mod managed_surface;
mod pinned_in_capture;

macro_rules! check_eq {
    ($got:expr, $want:expr, $($what:tt)+) => {
        if let Some(m) = first_mismatch(&$got[..], &$want[..]) {
            return Err(format!("{}: {m}", format!($($what)+)));
        }
    };
}

/// One buffer of each kind, behind one type, for the every-pair tests.
enum Buf {
    Pageable(Vec<u32>),
    Pinned(PinnedHostBuffer<u32>),
    Registered(RegisteredHost<'static, u32>),
    Device(DeviceSlice<u32>),
    Managed(ManagedSlice<u32>),
}

const KINDS: [MemoryKind; 5] = [
    MemoryKind::Pageable,
    MemoryKind::Pinned,
    MemoryKind::Registered,
    MemoryKind::Device,
    MemoryKind::Managed,
];

impl Buf {
    fn zeroed(gpu: &BoundDevice<'_>, kind: MemoryKind, n: usize) -> gpubind::Result<Buf> {
        Ok(match kind {
            MemoryKind::Pageable => Buf::Pageable(vec![0; n]),
            MemoryKind::Pinned => Buf::Pinned(gpu.alloc_pinned(n, PinnedOptions::default())?),
            MemoryKind::Registered => {
                Buf::Registered(gpu.register_vec(vec![0; n], RegisterOptions::default())?)
            }
            MemoryKind::Device => Buf::Device(gpu.alloc_zeros(n)?),
            MemoryKind::Managed => Buf::Managed(gpu.alloc_managed(n)?),
        })
    }

    /// Writes `data` by the kind's own path (not the generic copy under test).
    fn fill(&mut self, gpu: &BoundDevice<'_>, data: &[u32]) -> gpubind::Result<()> {
        match self {
            Buf::Pageable(v) => v.copy_from_slice(data),
            Buf::Pinned(p) => p.copy_from_slice(data),
            Buf::Registered(r) => r.copy_from_slice(data),
            Buf::Device(d) => gpu.htod_copy(data, d)?,
            Buf::Managed(m) => m.as_mut_slice()?.copy_from_slice(data),
        }
        Ok(())
    }

    /// Reads the contents by the kind's own path.
    fn read(&self, gpu: &BoundDevice<'_>) -> gpubind::Result<Vec<u32>> {
        Ok(match self {
            Buf::Pageable(v) => v.clone(),
            Buf::Pinned(p) => p.to_vec(),
            Buf::Registered(r) => r.to_vec(),
            Buf::Device(d) => gpu.dtoh(d)?,
            Buf::Managed(m) => m.as_slice()?.to_vec(),
        })
    }

    fn src(&self) -> &dyn CopySource<u32> {
        match self {
            Buf::Pageable(v) => v,
            Buf::Pinned(p) => p,
            Buf::Registered(r) => r,
            Buf::Device(d) => d,
            Buf::Managed(m) => m,
        }
    }

    fn dst(&mut self) -> &mut dyn CopyDest<u32> {
        match self {
            Buf::Pageable(v) => v,
            Buf::Pinned(p) => p,
            Buf::Registered(r) => r,
            Buf::Device(d) => d,
            Buf::Managed(m) => m,
        }
    }
}

fn with_gpu(f: impl FnOnce(&BoundDevice<'_>) -> TestResult) -> TestResult {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("Device::get(0)")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    f(&gpu)
}

fn kinds_round_trip() -> TestResult {
    with_gpu(|gpu| {
        for &n in &SIZES {
            let data = random_u32(n);
            // Pinned, in every flag combination: host view, device round trip.
            for opts in [
                PinnedOptions::default(),
                PinnedOptions {
                    portable: true,
                    write_combined: false,
                },
                PinnedOptions {
                    portable: false,
                    write_combined: true,
                },
            ] {
                let p = gpu
                    .pinned_from_slice(&data, opts)
                    .ctx("pinned_from_slice")?;
                check_eq!(p, data, "pinned host view n={n} {opts:?}");
                let d = gpu.clone_htod(&p).ctx("clone_htod(pinned)")?;
                let mut back = gpu.alloc_pinned::<u32>(n, opts).ctx("alloc_pinned")?;
                ensure!(back.iter().all(|&x| x == 0), "alloc_pinned not zeroed");
                gpu.dtoh_into(&d, &mut back).ctx("dtoh_into(pinned)")?;
                check_eq!(back, data, "pinned->device->pinned n={n} {opts:?}");
            }
            // Registered (borrowed Vec): device round trip, then the Vec is free again.
            let mut mine = data.clone();
            let d = {
                let reg = gpu
                    .register_host(&mut mine, RegisterOptions::default())
                    .ctx("register_host")?;
                check_eq!(reg, data, "registered host view n={n}");
                gpu.clone_htod(&reg).ctx("clone_htod(registered)")?
            };
            let mut out = vec![0u32; n];
            {
                let mut reg = gpu
                    .register_host(&mut out, RegisterOptions { portable: true })
                    .ctx("register_host(portable)")?;
                gpu.dtoh_into(&d, &mut reg).ctx("dtoh_into(registered)")?;
            }
            check_eq!(out, data, "registered->device->registered n={n}");
            let owned = gpu
                .register_vec(data.clone(), RegisterOptions::default())
                .ctx("register_vec")?;
            let v = owned
                .into_vec()
                .ctx("into_vec")?
                .ok_or("into_vec gave no Vec")?;
            check_eq!(v, data, "register_vec/into_vec n={n}");
            // Managed: written by the host, read through the device path, and back.
            let mut m = gpu.alloc_managed::<u32>(n).ctx("alloc_managed")?;
            ensure!(
                m.as_slice().ctx("as_slice")?.iter().all(|&x| x == 0),
                "alloc_managed not zeroed"
            );
            m.as_mut_slice().ctx("as_mut_slice")?.copy_from_slice(&data);
            check_eq!(
                gpu.dtoh(&m).ctx("dtoh(managed)")?,
                data,
                "managed host->device n={n}"
            );
            let data2 = random_u32(n);
            gpu.htod_copy(&data2, &mut m).ctx("htod(managed)")?;
            check_eq!(
                m.as_slice().ctx("as_slice")?,
                data2,
                "managed device->host n={n}"
            );
            // Device.
            let d = gpu.clone_htod(&data).ctx("clone_htod")?;
            check_eq!(gpu.dtoh(&d).ctx("dtoh")?, data, "device n={n}");
        }
        Ok(())
    })
}

fn copies_between_every_pair() -> TestResult {
    with_gpu(|gpu| {
        let stream = gpu.new_stream().ctx("new_stream")?;
        let s = gpu.on(&stream).ctx("on")?;
        for &n in &[1usize, 4099, (1 << 18) + 5] {
            for &from in &KINDS {
                for &to in &KINDS {
                    for asynchronous in [false, true] {
                        let data = random_u32(n);
                        let mut src = Buf::zeroed(gpu, from, n).ctx("alloc src")?;
                        src.fill(gpu, &data).ctx("fill")?;
                        let mut dst = Buf::zeroed(gpu, to, n).ctx("alloc dst")?;
                        if asynchronous {
                            s.copy_scope(|scope| scope.copy(src.src(), dst.dst()))
                                .ctx("scoped copy")?;
                        } else {
                            gpu.copy(src.src(), dst.dst()).ctx("copy")?;
                        }
                        let got = dst.read(gpu).ctx("read")?;
                        check_eq!(got, data, "{from:?} -> {to:?}, n={n}, async={asynchronous}");
                        // The source is untouched.
                        check_eq!(src.read(gpu).ctx("read src")?, data, "source changed");
                    }
                }
            }
        }
        // Pool slices (stream-ordered pool memory) are device memory for copies too.
        #[cfg(feature = "ipc")]
        {
            let pool = gpubind::ipc::MemoryPool::new(gpu, gpubind::ipc::PoolConfig::default())
                .ctx("pool")?;
            let data = random_u32(10_000);
            let pinned = gpu
                .pinned_from_slice(&data, PinnedOptions::default())
                .ctx("pin")?;
            let mut ps = pool
                .alloc_zeros::<u32>(&gpu.default_stream(), data.len())
                .ctx("pool alloc")?;
            s.copy_scope(|scope| scope.copy_to_device(&pinned, &mut ps))
                .ctx("pinned -> pool slice")?;
            let mut m = gpu.alloc_managed::<u32>(data.len()).ctx("managed")?;
            gpu.copy(&ps, &mut m).ctx("pool slice -> managed")?;
            check_eq!(
                m.as_slice().ctx("as_slice")?,
                data,
                "pinned -> pool slice -> managed"
            );
            drop(ps);
            drop(pool);
        }
        // Views and mismatched lengths.
        let data = random_u32(64);
        let d = gpu.clone_htod(&data).ctx("clone_htod")?;
        let mut pinned = gpu
            .alloc_pinned::<u32>(16, PinnedOptions::default())
            .ctx("pin")?;
        gpu.copy(&d.slice(8..24).ctx("slice")?, &mut pinned)
            .ctx("view -> pinned")?;
        check_eq!(pinned, data[8..24], "view copy");
        match gpu.copy(&d, &mut pinned) {
            Err(Error::SizeMismatch {
                expected: 16,
                found: 64,
                ..
            }) => {}
            other => return Err(format!("length mismatch gave {other:?}")),
        }
        Ok(())
    })
}

fn managed_touched_by_host_and_kernel() -> TestResult {
    with_gpu(|gpu| {
        let dev = gpu.device().clone();
        let module = gpu.compile_and_load(KERNELS, "kinds.cu").ctx("compile")?;
        let affine = module.function("affine").ctx("function")?;
        for &n in &SIZES {
            let x = random_f32(n);
            let mut m = gpu.alloc_managed::<f32>(n).ctx("alloc_managed")?;
            m.as_mut_slice().ctx("as_mut_slice")?.copy_from_slice(&x);
            gpu.advise(&m, Advice::SetPreferredLocation(Location::Device(&dev)))
                .ctx("advise preferred device")?;
            gpu.advise(&m, Advice::SetAccessedBy(Location::Device(&dev)))
                .ctx("advise accessed by device")?;
            let s = gpu.default_stream();
            s.prefetch(&m, Location::Device(&dev))
                .ctx("prefetch to device")?;
            let nn = n as u32;
            // SAFETY: (float*, unsigned) matches; the kernel stays below n.
            unsafe {
                s.launch(&affine, LaunchConfig::for_num_elems(nn))
                    .arg(&mut m)
                    .arg(&nn)
                    .launch()
                    .ctx("launch affine")?;
            }
            s.prefetch(&m, Location::Host).ctx("prefetch to host")?;
            s.synchronize().ctx("sync")?;
            let want: Vec<f32> = x.iter().map(|v| v * 2.0 + 1.0).collect();
            check_eq!(
                m.as_slice().ctx("as_slice")?,
                want,
                "kernel on managed n={n}"
            );
            // Host writes again, kernel again (read-mostly advice must not change results).
            gpu.advise(&m, Advice::UnsetPreferredLocation)
                .ctx("unset preferred")?;
            gpu.advise(&m, Advice::SetReadMostly).ctx("read mostly")?;
            m.as_mut_slice().ctx("as_mut_slice")?.copy_from_slice(&x);
            // SAFETY: as above.
            unsafe {
                s.launch(&affine, LaunchConfig::for_num_elems(nn))
                    .arg(&mut m)
                    .arg(&nn)
                    .launch()
                    .ctx("launch affine 2")?;
            }
            s.synchronize().ctx("sync")?;
            check_eq!(m.as_slice().ctx("as_slice")?, want, "second pass n={n}");
            gpu.advise(&m, Advice::UnsetReadMostly)
                .ctx("unset read mostly")?;
            gpu.advise(&m, Advice::UnsetAccessedBy(Location::Device(&dev)))
                .ctx("unset accessed")?;
        }
        Ok(())
    })
}

fn host_memory_read_and_written_by_kernels() -> TestResult {
    with_gpu(|gpu| {
        let module = gpu.compile_and_load(KERNELS, "kinds.cu").ctx("compile")?;
        let add_one = module.function("add_one").ctx("add_one")?;
        let fill = module.function("fill_pattern").ctx("fill_pattern")?;
        for &n in &SIZES {
            let nn = n as u32;
            let cfg = LaunchConfig::for_num_elems(nn);
            let s = gpu.default_stream();
            // Registered memory read by a kernel (zero-copy through its mapped address).
            let x = random_f32(n);
            let mut host = x.clone();
            let reg = gpu
                .register_host(&mut host, RegisterOptions::default())
                .ctx("register")?;
            let mut out = gpu.alloc_zeros::<f32>(n).ctx("alloc")?;
            // SAFETY: (const float*, float*, unsigned) matches; in bounds.
            unsafe {
                s.launch(&add_one, cfg)
                    .arg(&reg)
                    .arg(&mut out)
                    .arg(&nn)
                    .launch()
                    .ctx("launch add_one(registered)")?;
            }
            s.synchronize().ctx("sync")?;
            let want: Vec<f32> = x.iter().map(|v| v + 1.0).collect();
            check_eq!(
                gpu.dtoh(&out).ctx("dtoh")?,
                want,
                "kernel read registered n={n}"
            );
            drop(reg);
            // Pinned (portable) memory written by a kernel, read by the host.
            let seed: u32 = rand::rng().random();
            let mut pinned = gpu
                .alloc_pinned::<u32>(
                    n,
                    PinnedOptions {
                        portable: true,
                        write_combined: false,
                    },
                )
                .ctx("alloc_pinned")?;
            // SAFETY: (unsigned*, unsigned, unsigned) matches; in bounds.
            unsafe {
                s.launch(&fill, cfg)
                    .arg(&mut pinned)
                    .arg(&nn)
                    .arg(&seed)
                    .launch()
                    .ctx("launch fill(pinned)")?;
            }
            s.synchronize().ctx("sync")?;
            let want: Vec<u32> = (0..nn).map(|i| pattern(i, seed)).collect();
            check_eq!(pinned, want, "kernel wrote pinned n={n}");
        }
        Ok(())
    })
}

/// A `MAP_SHARED` mapping of a file, unmapped on drop.
struct SharedMap {
    ptr: *mut u32,
    len: usize,
}

impl SharedMap {
    fn new(file: &std::fs::File, len: usize) -> Result<SharedMap, String> {
        use std::os::fd::AsRawFd;
        let bytes = len * 4;
        // SAFETY: maps `bytes` of an open, large-enough file; checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("mmap failed: {}", std::io::Error::last_os_error()));
        }
        Ok(SharedMap { ptr: p.cast(), len })
    }

    fn as_mut_slice(&mut self) -> &mut [u32] {
        // SAFETY: `len` u32s mapped read/write, page-aligned, alive until drop; the
        // exclusive borrow keeps this process's other accesses out.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`.
        unsafe { libc::munmap(self.ptr.cast(), self.len * 4) };
    }
}

fn shm_path() -> std::path::PathBuf {
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("gpubind-shm-{}", std::process::id()))
}

/// Child roles: write the pattern into the shared file, or check it is there.
fn shm_child(role: &str) -> ! {
    let path = std::env::var("GPUBIND_SHM_PATH").expect("GPUBIND_SHM_PATH");
    let seed: u32 = std::env::var("GPUBIND_SHM_SEED").unwrap().parse().unwrap();
    let n: u32 = std::env::var("GPUBIND_SHM_LEN").unwrap().parse().unwrap();
    let want: Vec<u8> = (0..n)
        .flat_map(|i| pattern(i, seed).to_ne_bytes())
        .collect();
    let code = match role {
        // Write in place: truncating a file that another process has mapped (and
        // page-locked) would pull its pages away.
        "shm_writer" => match std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, &want))
        {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("child write failed: {e}");
                1
            }
        },
        "shm_checker" => match std::fs::read(&path) {
            Ok(got) if got == want => 0,
            Ok(got) => {
                let i = got.iter().zip(&want).position(|(a, b)| a != b);
                eprintln!(
                    "child saw different bytes (first at byte {i:?}, {} bytes)",
                    got.len()
                );
                1
            }
            Err(e) => {
                eprintln!("child read failed: {e}");
                1
            }
        },
        _ => 2,
    };
    std::process::exit(code)
}

fn run_child(role: &str, path: &std::path::Path, seed: u32, n: usize) -> TestResult {
    let status = std::process::Command::new(std::env::current_exe().ctx("current_exe")?)
        .env("GPUBIND_CHILD", role)
        .env("GPUBIND_SHM_PATH", path)
        .env("GPUBIND_SHM_SEED", seed.to_string())
        .env("GPUBIND_SHM_LEN", n.to_string())
        .status()
        .ctx("spawn child")?;
    ensure!(status.success(), "child {role} failed: {status}");
    Ok(())
}

fn registered_shared_mapping_between_processes() -> TestResult {
    let path = shm_path();
    let n = (1 << 20) + 1000; // 4 MiB + 4000 bytes: the last page is partly used
    let result = (|| {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .ctx("create shared file")?;
        file.set_len((n * 4) as u64).ctx("set_len")?;
        let mut map = SharedMap::new(&file, n)?;
        with_gpu(|gpu| {
            let module = gpu.compile_and_load(KERNELS, "kinds.cu").ctx("compile")?;
            let copy = module.function("copy_u32").ctx("copy_u32")?;
            let fill = module.function("fill_pattern").ctx("fill_pattern")?;
            let reg = gpu
                .register_host(map.as_mut_slice(), RegisterOptions { portable: true })
                .ctx("cuMemHostRegister on a MAP_SHARED mapping")?;
            let mut reg = reg;
            let nn = n as u32;
            let cfg = LaunchConfig::for_num_elems(nn);
            let s = gpu.default_stream();
            // Another process writes the file; a kernel reads our registered mapping of it.
            let seed1: u32 = rand::rng().random();
            run_child("shm_writer", &path, seed1, n)?;
            let want1: Vec<u32> = (0..nn).map(|i| pattern(i, seed1)).collect();
            let mut out = gpu.alloc_zeros::<u32>(n).ctx("alloc")?;
            // SAFETY: (const unsigned*, unsigned*, unsigned) matches; in bounds.
            unsafe {
                s.launch(&copy, cfg)
                    .arg(&reg)
                    .arg(&mut out)
                    .arg(&nn)
                    .launch()
                    .ctx("launch copy(registered shm)")?;
            }
            s.synchronize().ctx("sync")?;
            check_eq!(
                gpu.dtoh(&out).ctx("dtoh")?,
                want1,
                "kernel read of the child's writes"
            );
            let mut via_copy = vec![0u32; n];
            gpu.copy(&reg, &mut via_copy)
                .ctx("copy registered shm -> host")?;
            check_eq!(via_copy, want1, "driver copy of the shared mapping");
            // A kernel writes the registered mapping; another process reads the file.
            let seed2 = seed1 ^ 0x9e37_79b9;
            // SAFETY: (unsigned*, unsigned, unsigned) matches; in bounds.
            unsafe {
                s.launch(&fill, cfg)
                    .arg(&mut reg)
                    .arg(&nn)
                    .arg(&seed2)
                    .launch()
                    .ctx("launch fill(registered shm)")?;
            }
            s.synchronize().ctx("sync")?;
            run_child("shm_checker", &path, seed2, n)?;
            // And an async copy from device into it, read by the other process.
            let seed3 = seed2.wrapping_add(12345);
            let want3: Vec<u32> = (0..nn).map(|i| pattern(i, seed3)).collect();
            let d = gpu.clone_htod(&want3).ctx("clone_htod")?;
            let stream = gpu.new_stream().ctx("stream")?;
            gpu.on(&stream)
                .ctx("on")?
                .copy_scope(|sc| sc.copy(&d, &mut reg))
                .ctx("async copy into shm")?;
            run_child("shm_checker", &path, seed3, n)?;
            drop(reg); // unregistered before unmapping
            Ok(())
        })
    })();
    let _ = std::fs::remove_file(&path);
    result
}

fn async_pinned_copies_on_stream() -> TestResult {
    with_gpu(|gpu| {
        let n = 64 << 20; // 256 MiB of u32: long enough to still run after the enqueue
        let data = random_u32(n);
        let src = gpu
            .pinned_from_slice(&data, PinnedOptions::default())
            .ctx("pin")?;
        let mut dev = gpu.alloc_zeros::<u32>(n).ctx("alloc")?;
        let mut back = gpu
            .alloc_pinned::<u32>(n, PinnedOptions::default())
            .ctx("pin")?;
        let stream = gpu.new_stream().ctx("stream")?;
        let s = gpu.on(&stream).ctx("on")?;
        let done = gpu.new_event(false).ctx("event")?;
        let still_running = s
            .copy_scope(|scope| {
                scope.copy(&src, &mut dev)?;
                scope.stream().record(&done)?;
                // Enqueued, not finished: the call returned before the DMA did.
                Ok(!done.is_complete()?)
            })
            .ctx("copy scope")?;
        ensure!(
            done.is_complete().ctx("query")?,
            "scope returned before the copy finished"
        );
        // `dev` was borrowed by the first scope until it ended; read it back in a second.
        s.copy_scope(|scope| scope.copy(&dev, &mut back))
            .ctx("copy scope back")?;
        ensure!(
            still_running,
            "a 256 MiB pinned copy had already finished when the enqueue returned: not async"
        );
        check_eq!(back, data, "pinned -> device -> pinned on a stream");
        // A whole pipeline in one scope: upload, kernel, download, one synchronisation.
        let module = gpu.compile_and_load(KERNELS, "kinds.cu").ctx("compile")?;
        let copy_k = module.function("copy_u32").ctx("copy_u32")?;
        let mut dev2 = gpu.alloc_zeros::<u32>(n).ctx("alloc")?;
        let mut back2 = gpu
            .alloc_pinned::<u32>(n, PinnedOptions::default())
            .ctx("pin")?;
        let nn = n as u32;
        let data3 = random_u32(n);
        let src3 = gpu
            .pinned_from_slice(&data3, PinnedOptions::default())
            .ctx("pin")?;
        let pending = s
            .copy_scope(|scope| {
                scope.copy_to_device(&src3, &mut dev)?;
                // SAFETY: (const unsigned*, unsigned*, unsigned) matches; in bounds.
                unsafe {
                    scope
                        .stream()
                        .launch(&copy_k, LaunchConfig::for_num_elems(nn))
                        .arg(&dev)
                        .arg(&mut dev2)
                        .arg(&nn)
                        .launch()?;
                }
                scope.copy_from_device(&dev2, &mut back2)?;
                scope.stream().record(&done)?;
                Ok(!done.is_complete()?)
            })
            .ctx("pipeline scope")?;
        ensure!(
            pending,
            "the pipeline had finished when its enqueue returned: not async"
        );
        check_eq!(back2, data3, "upload -> kernel -> download in one scope");
        // The unsafe form, synchronised by hand; and a scope whose closure fails still syncs.
        let data2 = random_u32(n);
        let mut src2 = gpu
            .alloc_pinned::<u32>(n, PinnedOptions::default())
            .ctx("pin")?;
        src2.copy_from_slice(&data2);
        // SAFETY: `src2` and `dev` stay alive and untouched until the synchronize below.
        unsafe { s.copy_async(&src2, &mut dev).ctx("copy_async")? };
        s.synchronize().ctx("sync")?;
        let failed = s.copy_scope(|scope| -> gpubind::Result<()> {
            scope.copy(&dev, &mut back)?;
            Err(Error::InvalidArgument("stop".into()))
        });
        ensure!(
            matches!(failed, Err(Error::InvalidArgument(_))),
            "closure error not passed on: {failed:?}"
        );
        check_eq!(back, data2, "a failing scope still completed its copies");
        Ok(())
    })
}

// ---- DLPack on the device -------------------------------------------------------------

#[cfg(feature = "dlpack")]
type Deleter = unsafe extern "C" fn(*mut DLManagedTensorVersioned);
#[cfg(feature = "dlpack")]
static REAL_DELETERS: Mutex<Option<HashMap<usize, Deleter>>> = Mutex::new(None);
#[cfg(feature = "dlpack")]
static DELETER_CALLS: AtomicUsize = AtomicUsize::new(0);

#[cfg(feature = "dlpack")]
/// Stands in for an exported tensor's deleter: counts, then calls the real one.
unsafe extern "C" fn counting_deleter(p: *mut DLManagedTensorVersioned) {
    DELETER_CALLS.fetch_add(1, Ordering::SeqCst);
    let real = REAL_DELETERS
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .remove(&(p as usize));
    match real {
        // SAFETY: the real deleter of this tensor, called once.
        Some(d) => unsafe { d(p) },
        None => eprintln!("counting_deleter: {p:p} deleted twice or unknown"),
    }
}

#[cfg(feature = "dlpack")]
/// Exports `buf` and swaps its deleter for the counting one.
fn export_counted<B: gpubind::dlpack::DlpackExport>(
    buf: B,
    shape: &[i64],
) -> Result<*mut DLManagedTensorVersioned, String> {
    let raw = dlpack::export(buf, shape).ctx("export")?.into_raw();
    // SAFETY: `raw` is live and ours.
    let real = unsafe { (*raw).deleter.take() }.ok_or("exported tensor has no deleter")?;
    REAL_DELETERS
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .insert(raw as usize, real);
    // SAFETY: as above.
    unsafe { (*raw).deleter = Some(counting_deleter) };
    Ok(raw)
}

#[cfg(feature = "dlpack")]
fn dlpack_round_trip_every_kind() -> TestResult {
    with_gpu(|gpu| {
        let ordinal = gpu.ordinal() as i32;
        let (rows, cols) = (37usize, 129usize);
        let n = rows * cols;
        let shape = [rows as i64, cols as i64];
        for &kind in &KINDS {
            let data = random_u32(n);
            let mut buf = Buf::zeroed(gpu, kind, n).ctx("alloc")?;
            buf.fill(gpu, &data).ctx("fill")?;
            let before = DELETER_CALLS.load(Ordering::SeqCst);
            let raw = match buf {
                Buf::Pageable(v) => export_counted(v, &shape)?,
                Buf::Pinned(p) => export_counted(p, &shape)?,
                Buf::Registered(r) => export_counted(r, &shape)?,
                Buf::Device(d) => export_counted(d, &shape)?,
                Buf::Managed(m) => export_counted(m, &shape)?,
            };
            // SAFETY: live and ours.
            let t = unsafe { &(*raw).dl_tensor };
            let want_dev = match kind {
                MemoryKind::Pageable => (DLDeviceType::CPU, 0),
                MemoryKind::Pinned | MemoryKind::Registered => (DLDeviceType::CUDA_HOST, 0),
                MemoryKind::Device => (DLDeviceType::CUDA, ordinal),
                MemoryKind::Managed => (DLDeviceType::CUDA_MANAGED, 0),
            };
            ensure!(
                (t.device.device_type, t.device.device_id) == want_dev,
                "{kind:?} exported as {:?}, want {want_dev:?}",
                t.device
            );
            // SAFETY: handed over to the importer.
            let imported = unsafe { gpu.import_dlpack::<u32, _>(raw) }.ctx("import")?;
            ensure!(imported.shape() == shape, "shape {:?}", imported.shape());
            let mut host = vec![0u32; n];
            gpu.copy(&imported, &mut host)
                .ctx("copy imported -> host")?;
            check_eq!(host, data, "{kind:?} export -> import");
            // Copy into the imported tensor and back out through a device slice.
            let data2 = random_u32(n);
            let mut imported = imported;
            gpu.copy(&data2, &mut imported)
                .ctx("copy host -> imported")?;
            let d = gpu.alloc_zeros::<u32>(n).ctx("alloc")?;
            let mut d = d;
            gpu.copy(&imported, &mut d).ctx("imported -> device")?;
            check_eq!(
                gpu.dtoh(&d).ctx("dtoh")?,
                data2,
                "{kind:?} write through import"
            );
            ensure!(
                DELETER_CALLS.load(Ordering::SeqCst) == before,
                "deleter ran while the tensor was imported"
            );
            drop(imported);
            let calls = DELETER_CALLS.load(Ordering::SeqCst) - before;
            ensure!(calls == 1, "{kind:?}: deleter ran {calls} times, want 1");
        }
        // The deleter really frees: device memory comes back.
        let big = 256usize << 20;
        let (free0, _) = gpu.memory_info().ctx("mem info")?;
        let raw = export_counted(gpu.alloc_zeros::<u8>(big).ctx("alloc")?, &[big as i64])?;
        let (free1, _) = gpu.memory_info().ctx("mem info")?;
        // SAFETY: handed over.
        drop(unsafe { gpu.import_dlpack::<u8, _>(raw) }.ctx("import")?);
        let (free2, _) = gpu.memory_info().ctx("mem info")?;
        ensure!(
            free0 >= free1 + big / 2 && free2 >= free1 + big / 2,
            "exported 256 MiB not freed by the deleter: free {free0} -> {free1} -> {free2}"
        );
        Ok(())
    })
}

#[cfg(feature = "dlpack")]
/// A tensor over `d`'s memory that `d` keeps owning; its deleter only counts.
fn borrowed_tensor(
    d: &DeviceSlice<f32>,
    device: DLDevice,
    dtype: DLDataType,
    shape: &'static mut [i64],
    strides: Option<&'static mut [i64]>,
) -> *mut DLManagedTensorVersioned {
    unsafe extern "C" fn count_only(p: *mut DLManagedTensorVersioned) {
        BORROWED_CALLS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: boxed by `borrowed_tensor`, freed once here.
        drop(unsafe { Box::from_raw(p) });
    }
    let ndim = shape.len() as i32;
    Box::into_raw(Box::new(DLManagedTensorVersioned {
        version: DLPackVersion { major: 1, minor: 0 },
        manager_ctx: std::ptr::null_mut(),
        deleter: Some(count_only),
        flags: 0,
        dl_tensor: DLTensor {
            // SAFETY: only the address is taken; `d` outlives the tensor in the test.
            data: unsafe { d.raw_ptr() } as *mut c_void,
            device,
            ndim,
            dtype,
            shape: shape.as_mut_ptr(),
            strides: strides.map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
            byte_offset: 0,
        },
    }))
}
#[cfg(feature = "dlpack")]
static BORROWED_CALLS: AtomicUsize = AtomicUsize::new(0);

#[cfg(feature = "dlpack")]
fn dlpack_bad_imports_are_typed_errors() -> TestResult {
    with_gpu(|gpu| {
        let ordinal = gpu.ordinal() as i32;
        let d = gpu.clone_htod(&random_f32(12)).ctx("clone_htod")?;
        let f32_t = DLDataType {
            code: 2,
            bits: 32,
            lanes: 1,
        };
        let cuda = |id| DLDevice {
            device_type: DLDeviceType::CUDA,
            device_id: id,
        };
        let leak = |v: Vec<i64>| -> &'static mut [i64] { Vec::leak(v) };
        let cases: Vec<(*mut DLManagedTensorVersioned, &str)> = vec![
            (
                borrowed_tensor(&d, cuda(ordinal + 1), f32_t, leak(vec![12]), None),
                "device",
            ),
            (
                borrowed_tensor(
                    &d,
                    DLDevice {
                        device_type: DLDeviceType::ROCM,
                        device_id: ordinal,
                    },
                    f32_t,
                    leak(vec![12]),
                    None,
                ),
                "device",
            ),
            (
                borrowed_tensor(
                    &d,
                    cuda(ordinal),
                    DLDataType {
                        code: 2,
                        bits: 16,
                        lanes: 1,
                    },
                    leak(vec![12]),
                    None,
                ),
                "dtype",
            ),
            (
                borrowed_tensor(
                    &d,
                    cuda(ordinal),
                    f32_t,
                    leak(vec![3, 4]),
                    Some(leak(vec![1, 3])),
                ),
                "layout",
            ),
        ];
        for (i, (p, what)) in cases.into_iter().enumerate() {
            let before = BORROWED_CALLS.load(Ordering::SeqCst);
            // SAFETY: `p` is live and ours; `d` outlives it.
            match unsafe { gpu.import_dlpack::<f32, _>(p) } {
                Err(Error::DlpackMismatch { what: w, .. }) if w == what => {}
                other => return Err(format!("case {i} ({what}): got {other:?}")),
            }
            let calls = BORROWED_CALLS.load(Ordering::SeqCst) - before;
            ensure!(
                calls == 1,
                "case {i}: deleter ran {calls} times on a failed import"
            );
        }
        // The same tensor described correctly imports fine.
        let p = borrowed_tensor(
            &d,
            cuda(ordinal),
            f32_t,
            leak(vec![3, 4]),
            Some(leak(vec![4, 1])),
        );
        // SAFETY: as above.
        let t = unsafe { gpu.import_dlpack::<f32, _>(p) }.ctx("good import")?;
        ensure!(t.kind() == MemoryKind::Device, "kind {:?}", t.kind());
        let mut host = vec![0f32; 12];
        gpu.copy(&t, &mut host).ctx("copy")?;
        check_eq!(
            host,
            gpu.dtoh(&d).ctx("dtoh")?,
            "imported view of a device slice"
        );
        // Exported f32, imported as u32: dtype error, and the buffer is still freed once.
        let before = DELETER_CALLS.load(Ordering::SeqCst);
        let raw = export_counted(gpu.clone_htod(&[1.0f32, 2.0]).ctx("clone")?, &[2])?;
        // SAFETY: handed over.
        match unsafe { gpu.import_dlpack::<u32, _>(raw) } {
            Err(Error::DlpackMismatch { what: "dtype", .. }) => {}
            other => return Err(format!("f32 as u32: {other:?}")),
        }
        ensure!(
            DELETER_CALLS.load(Ordering::SeqCst) == before + 1,
            "deleter not called once after a failed import"
        );
        Ok(())
    })
}

fn managed_over_allocation_is_refused() -> TestResult {
    with_gpu(|gpu| {
        let (free, total) = gpu.memory_info().ctx("memory_info")?;
        let ask = free + (1 << 30);
        match gpu.alloc_managed::<u8>(ask) {
            Err(Error::ManagedTooLarge {
                requested,
                free: f,
                device,
            }) => {
                ensure!(requested == ask, "requested {requested} != {ask}");
                ensure!(
                    f <= total && device == gpu.ordinal(),
                    "free {f}, device {device}"
                );
                let msg = Error::ManagedTooLarge {
                    requested,
                    free: f,
                    device,
                }
                .to_string();
                ensure!(msg.contains("refused"), "message: {msg}");
            }
            other => return Err(format!("over-allocation gave {other:?}")),
        }
        // Elements, not bytes: u64 counts 8 bytes each (1 GiB over, whatever `free` does).
        match gpu.alloc_managed::<u64>(free / 8 + (1 << 27)) {
            Err(Error::ManagedTooLarge { .. }) => {}
            other => return Err(format!("u64 over-allocation gave {other:?}")),
        }
        // A small one still works afterwards.
        let m = gpu.alloc_managed::<u8>(4096).ctx("small managed")?;
        ensure!(
            m.as_slice().ctx("as_slice")?.iter().all(|&b| b == 0),
            "not zeroed"
        );
        Ok(())
    })
}

/// Memory of one device used under a binding of another (needs 2 GPUs).
fn other_device_memory_is_copied_or_refused() -> TestResult {
    let devices = Device::all().ctx("Device::all")?;
    if devices.len() < 2 {
        return Err(common::skip(&format!(
            "needs 2 GPUs, {} visible",
            devices.len()
        )));
    }
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let data = random_u32(1000);
    let (pinned1, portable1, managed1, dev1) = {
        let g1 = ctx.bind(&devices[1]).ctx("bind 1")?;
        let p = g1
            .pinned_from_slice(&data, PinnedOptions::default())
            .ctx("pinned")?;
        let pp = g1
            .pinned_from_slice(
                &data,
                PinnedOptions {
                    portable: true,
                    write_combined: false,
                },
            )
            .ctx("portable")?;
        let mut m = g1.alloc_managed::<u32>(1000).ctx("managed")?;
        m.as_mut_slice().ctx("as_mut_slice")?.copy_from_slice(&data);
        let d = g1.clone_htod(&data).ctx("clone_htod")?;
        (p, pp, m, d)
    };
    #[cfg(feature = "dlpack")]
    let exported1 = {
        let g1 = ctx.bind(&devices[1]).ctx("bind 1")?;
        export_counted(g1.clone_htod(&data).ctx("clone_htod")?, &[1000])?
    };
    let g0 = ctx.bind(&devices[0]).ctx("bind 0")?;
    let mut out = g0.alloc_zeros::<u32>(1000).ctx("alloc")?;
    let wrong = |r: gpubind::Result<()>, what: &str| -> TestResult {
        match r {
            Err(Error::WrongDevice {
                bound: 0, found: 1, ..
            }) => Ok(()),
            other => Err(format!("{what}: expected WrongDevice, got {other:?}")),
        }
    };
    wrong(g0.copy(&managed1, &mut out), "managed of device 1")?;
    // Device memory of device 1 is copied peer-to-peer, non-portable pinned memory of
    // device 1 as pageable memory: both work under device 0.
    g0.copy(&pinned1, &mut out)
        .ctx("non-portable pinned of device 1")?;
    check_eq!(g0.dtoh(&out).ctx("dtoh")?, data, "pinned of device 1");
    g0.memset_zeros(&mut out).ctx("memset")?;
    g0.copy(&dev1, &mut out).ctx("device slice of device 1")?;
    check_eq!(g0.dtoh(&out).ctx("dtoh")?, data, "device slice of device 1");
    g0.memset_zeros(&mut out).ctx("memset")?;
    let s = g0.default_stream();
    s.copy_scope(|sc| sc.copy(&dev1, &mut out))
        .ctx("scoped copy from device 1")?;
    check_eq!(
        g0.dtoh(&out).ctx("dtoh")?,
        data,
        "scoped copy from device 1"
    );
    // Portable pinned memory works under any binding.
    g0.copy(&portable1, &mut out)
        .ctx("portable pinned under device 0")?;
    check_eq!(g0.dtoh(&out).ctx("dtoh")?, data, "portable pinned copy");
    // A kDLCUDA tensor of device 1 is refused under device 0, and freed once.
    #[cfg(feature = "dlpack")]
    {
        let before = DELETER_CALLS.load(Ordering::SeqCst);
        // SAFETY: handed over.
        match unsafe { g0.import_dlpack::<u32, _>(exported1) } {
            Err(Error::DlpackMismatch { what: "device", .. }) => {}
            other => return Err(format!("device-1 tensor under device 0: {other:?}")),
        }
        ensure!(
            DELETER_CALLS.load(Ordering::SeqCst) == before + 1,
            "deleter not called once"
        );
    }
    Ok(())
}

/// `Device::memory_usage` counts device, pool and managed slices from allocation to drop
/// (and `into_raw`/`from_raw`), and keeps the peak until reset.
fn memory_usage_counts_allocations_and_peak() -> Result<(), String> {
    let dev = Device::get(0).ctx("device 0")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    dev.reset_peak_memory_usage();
    let base = dev.memory_usage();
    ensure!(base.peak == base.in_use, "reset peak: {base:?}");
    let (d_bytes, m_bytes) = (4u64 << 20, 1u64 << 20);
    let d = gpu.alloc_zeros::<f32>(1 << 20).ctx("alloc")?;
    let m = gpu.alloc_managed::<u8>(1 << 20).ctx("alloc_managed")?;
    let u = dev.memory_usage();
    ensure!(
        u.in_use == base.in_use + d_bytes + m_bytes,
        "both held: {u:?} from {base:?}"
    );
    drop(d);
    let u = dev.memory_usage();
    ensure!(
        u.in_use == base.in_use + m_bytes,
        "device slice dropped: {u:?}"
    );
    ensure!(
        u.peak == base.in_use + d_bytes + m_bytes,
        "peak kept: {u:?}"
    );
    drop(m);
    ensure!(dev.memory_usage().in_use == base.in_use, "all dropped");
    // Stream-ordered (pool) memory: counted from allocation to its drop, as the others.
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let p = s.alloc_zeros::<u32>(1 << 18).ctx("stream alloc")?;
    let u = dev.memory_usage();
    ensure!(
        u.in_use == base.in_use + (1 << 20),
        "pool slice held: {u:?} from {base:?}"
    );
    drop(p);
    let u = dev.memory_usage();
    ensure!(
        u.in_use == base.in_use,
        "pool slice dropped: {u:?} from {base:?}"
    );
    // Handed out and taken back: uncounted, then counted again.
    let d = gpu.alloc_zeros::<u32>(1000).ctx("alloc")?;
    let (ptr, len) = d.into_raw().ctx("into_raw")?;
    ensure!(
        dev.memory_usage().in_use == base.in_use,
        "into_raw uncounts"
    );
    // SAFETY: the cuMemAlloc allocation `into_raw` gave up, of `len` u32, owned by no one.
    let d = unsafe { DeviceSlice::<u32>::from_raw(dev.clone(), ptr, len) };
    ensure!(
        dev.memory_usage().in_use == base.in_use + 4000,
        "from_raw counts"
    );
    drop(d);
    dev.reset_peak_memory_usage();
    let u = dev.memory_usage();
    ensure!(
        u.in_use == base.in_use && u.peak == u.in_use,
        "after reset: {u:?}"
    );
    Ok(())
}

fn main() {
    if let Some(role) = common::child_role() {
        if role == pinned_in_capture::ROLE {
            pinned_in_capture::child();
        }
        shm_child(&role);
    }
    common::run_suite(
        "gpu_memory_kinds",
        &[
            ("kinds_round_trip", kinds_round_trip),
            (
                "memory_usage_counts_allocations_and_peak",
                memory_usage_counts_allocations_and_peak,
            ),
            ("copies_between_every_pair", copies_between_every_pair),
            (
                "managed_touched_by_host_and_kernel",
                managed_touched_by_host_and_kernel,
            ),
            (
                "host_memory_read_and_written_by_kernels",
                host_memory_read_and_written_by_kernels,
            ),
            (
                "registered_shared_mapping_between_processes",
                registered_shared_mapping_between_processes,
            ),
            (
                "async_pinned_copies_on_stream",
                async_pinned_copies_on_stream,
            ),
            #[cfg(feature = "dlpack")]
            ("dlpack_round_trip_every_kind", dlpack_round_trip_every_kind),
            #[cfg(feature = "dlpack")]
            (
                "dlpack_bad_imports_are_typed_errors",
                dlpack_bad_imports_are_typed_errors,
            ),
            (
                "managed_over_allocation_is_refused",
                managed_over_allocation_is_refused,
            ),
            (
                "other_device_memory_is_copied_or_refused",
                other_device_memory_is_copied_or_refused,
            ),
            (
                "managed_views_as_kernel_args_and_copies",
                managed_surface::managed_views_as_kernel_args_and_copies,
            ),
            (
                "managed_split_halves_written_by_two_streams",
                managed_surface::managed_split_halves_written_by_two_streams,
            ),
            (
                "managed_host_attach_then_host_access",
                managed_surface::managed_host_attach_then_host_access,
            ),
            (
                "managed_single_stream_attach",
                managed_surface::managed_single_stream_attach,
            ),
            (
                "pinned_read_inside_a_capture_waits",
                pinned_in_capture::pinned_read_inside_a_capture_waits,
            ),
            (
                "managed_shared_views_are_never_written",
                managed_surface::managed_shared_views_are_never_written,
            ),
            (
                "managed_attach_errors_are_typed",
                managed_surface::managed_attach_errors_are_typed,
            ),
            (
                "transmute_views_reinterpret_and_refuse",
                managed_surface::transmute_views_reinterpret_and_refuse,
            ),
            (
                "try_clone_is_ordered_and_independent",
                managed_surface::try_clone_is_ordered_and_independent,
            ),
        ],
    )
}
