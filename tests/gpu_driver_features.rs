//! GPU tests of the driver features of issue 14 item 2 (memset with a value, stream
//! priorities, event flags, function attributes, occupancy, peer access). Without a
//! driver: one SKIPPED line.
//!
//! Run: `cargo test --test gpu_driver_features` (on a GPU machine, or the built binary).

// Buffers a kernel writes are passed as `&mut` to document intent (gpubind's convention).
#![allow(clippy::unnecessary_mut_passed)]

#[macro_use]
mod common;

use common::{Ctx, dev0, run_suite};
use gpubind::{Device, Error, EventFlags, LaunchConfig, ThreadContext};
use std::sync::Arc;

type R = Result<(), String>;

const KERNELS: &str = concat!(
    common::slow_fill_cuda!(),
    r#"
// 1 KiB of static shared memory plus `blockDim.x` floats of dynamic shared memory (and
// whatever more the launch gives, untouched).
extern "C" __global__ void uses_shared(float* out, unsigned n) {
    extern __shared__ float dyn[];
    __shared__ float fixed[256];
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    fixed[threadIdx.x % 256] = 1.0f;
    dyn[threadIdx.x] = (float)i;
    __syncthreads();
    if (i < n) out[i] = dyn[threadIdx.x] + fixed[threadIdx.x % 256];
}
// Writes `value` through a raw address (a peer's buffer).
extern "C" __global__ void write_through(unsigned* p, unsigned n, unsigned value) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = value;
}
extern "C" __global__ void __launch_bounds__(128) bounded(unsigned* out) {
    out[blockIdx.x * blockDim.x + threadIdx.x] = threadIdx.x;
}
"#
);

/// `memset` fills exactly the sub-view, with the value of each width, and leaves the
/// rest of the buffer alone.
fn memset_fills_a_sub_view_exactly() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;

    let mut b16 = gpu.alloc_zeros::<u16>(16).ctx("alloc u16")?;
    gpu.memset(&mut b16.slice_mut(3..11).ctx("view")?, 0xABCD)
        .ctx("memset u16")?;
    let got = gpu.dtoh(&b16).ctx("dtoh u16")?;
    let want: Vec<u16> = (0..16)
        .map(|i| if (3..11).contains(&i) { 0xABCD } else { 0 })
        .collect();
    ensure!(got == want, "u16: {got:x?} != {want:x?}");

    let mut b8 = gpu.clone_htod(&[1u8; 7]).ctx("htod u8")?;
    gpu.memset(&mut b8.slice_mut(1..).ctx("view")?, 0xEEu8)
        .ctx("memset u8")?;
    ensure!(
        gpu.dtoh(&b8).ctx("dtoh u8")? == [1, 0xEE, 0xEE, 0xEE, 0xEE, 0xEE, 0xEE],
        "u8 fill"
    );

    let mut b32 = gpu.alloc_zeros::<u32>(5).ctx("alloc u32")?;
    gpu.memset(&mut b32.slice_mut(..4).ctx("view")?, 0xDEAD_BEEFu32)
        .ctx("memset u32")?;
    ensure!(
        gpu.dtoh(&b32).ctx("dtoh u32")? == [0xDEAD_BEEF, 0xDEAD_BEEF, 0xDEAD_BEEF, 0xDEAD_BEEF, 0],
        "u32 fill"
    );

    let mut f = gpu.alloc_zeros::<f32>(1000).ctx("alloc f32")?;
    gpu.memset(&mut f, -2.5f32).ctx("memset f32")?;
    ensure!(
        gpu.dtoh(&f).ctx("dtoh f32")?.iter().all(|&x| x == -2.5),
        "f32 fill"
    );

    let mut h = gpu.alloc_zeros::<half::bf16>(9).ctx("alloc bf16")?;
    let v = half::bf16::from_f32(0.75);
    gpu.memset(&mut h, v).ctx("memset bf16")?;
    ensure!(gpu.dtoh(&h).ctx("dtoh bf16")? == [v; 9], "bf16 fill");

    // Empty views are a no-op, not a driver error.
    gpu.memset(&mut b16.slice_mut(5..5).ctx("empty view")?, 1u16)
        .ctx("memset empty")?;
    let s = gpu.new_stream().ctx("stream")?;
    gpu.on(&s)
        .ctx("on")?
        .memset_async(&mut b16.slice_mut(16..).ctx("empty view")?, 1u16)
        .ctx("memset_async empty")?;
    ensure!(gpu.dtoh(&b16).ctx("dtoh")? == want, "empty memsets wrote");
    Ok(())
}

/// `memset_async` on one stream is ordered after a slow kernel writing the same buffer
/// on another stream (the claim), and only touches its view.
fn memset_async_is_ordered_after_other_streams() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(KERNELS, "kernels.cu").ctx("compile")?;
    let slow_fill = module.function("slow_fill").ctx("function")?;
    let (s1, s2) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    let n = 1u32 << 16;
    let mut buf = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc")?;
    let (value, cycles) = (7u32, 20_000_000i64); // ~10 ms
    let a = gpu.on(&s1).ctx("on s1")?;
    // SAFETY: (unsigned*, unsigned, unsigned, long long) matches; bounds checked.
    unsafe {
        a.launch(&slow_fill, LaunchConfig::for_num_elems(n))
            .arg(&mut buf)
            .arg(&n)
            .arg(&value)
            .arg(&cycles)
            .launch()
    }
    .ctx("launch")?;
    let done = gpu.new_event(false).ctx("event")?;
    a.record(&done).ctx("record")?;
    ensure!(
        !done.is_complete().ctx("query")?,
        "the slow kernel finished before the memsets were enqueued: nothing to order"
    );
    let b = gpu.on(&s2).ctx("on s2")?;
    b.memset_async(&mut buf.slice_mut(100..200).ctx("view")?, 0x1234_5678u32)
        .ctx("memset_async")?;
    b.memset_async(&mut buf.slice_mut(300..301).ctx("view")?, 9u32)
        .ctx("memset_async")?;
    b.synchronize().ctx("sync s2")?;
    let got = gpu.dtoh(&buf).ctx("dtoh")?;
    for (i, &x) in got.iter().enumerate() {
        let want = match i {
            100..200 => 0x1234_5678,
            300 => 9,
            _ => value,
        };
        ensure!(
            x == want,
            "element {i}: {x:#x}, want {want:#x} (memset not ordered after the kernel?)"
        );
    }
    Ok(())
}

/// A misaligned address (only memory adopted from raw pointers can have one) is a typed
/// error before the driver is called.
fn memset_of_a_misaligned_address_is_typed() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let (base, len) = gpu
        .alloc_zeros::<u8>(16)
        .ctx("alloc")?
        .into_raw()
        .ctx("into_raw")?;
    // SAFETY: 7 u16 (14 bytes) from base + 1 lie inside the 16-byte allocation; the
    // slice is never dropped (into_raw below), so nothing frees the inner address.
    let mut odd = unsafe { gpubind::DeviceSlice::<u16>::from_raw(Arc::clone(&dev), base + 1, 7) };
    let e = gpu.memset(&mut odd, 0xABCDu16).err();
    let s = gpu.new_stream().ctx("stream")?;
    let e_async = gpu.on(&s).ctx("on")?.memset_async(&mut odd, 1u16).err();
    odd.into_raw().ctx("into_raw odd")?;
    // SAFETY: `base` is the 16-byte allocation given up above; this slice frees it.
    let whole = unsafe { gpubind::DeviceSlice::<u8>::from_raw(Arc::clone(&dev), base, len) };
    ensure!(
        gpu.dtoh(&whole).ctx("dtoh")? == [0u8; 16],
        "a refused memset wrote"
    );
    for (what, e) in [("memset", e), ("memset_async", e_async)] {
        ensure!(
            matches!(&e, Some(Error::InvalidArgument(m)) if m.contains("aligned")),
            "{what}: {e:?}"
        );
    }
    Ok(())
}

/// A buffer of another device is refused with a typed error (needs 2 GPUs).
fn memset_of_another_device_is_typed() -> R {
    if Device::count().ctx("count")? < 2 {
        return Err(common::skip("needs 2 GPUs"));
    }
    let (d0, d1) = (dev0()?, Device::get(1).ctx("Device::get(1)")?);
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let mut other = ctx
        .bind(&d1)
        .ctx("bind 1")?
        .alloc_zeros::<u16>(4)
        .ctx("alloc")?;
    let gpu = ctx.bind(&d0).ctx("bind 0")?;
    let e = gpu.memset(&mut other, 1u16).err();
    ensure!(
        matches!(e, Some(Error::WrongDevice { .. })),
        "memset: {e:?}"
    );
    let s = gpu.new_stream().ctx("stream")?;
    let e = gpu.on(&s).ctx("on")?.memset_async(&mut other, 1u16).err();
    ensure!(
        matches!(e, Some(Error::WrongDevice { .. })),
        "memset_async: {e:?}"
    );
    Ok(())
}

/// The priority range is sane, a stream reports the priority it was created with, and
/// one outside the range is a typed error naming the range.
fn stream_priorities_round_trip() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let range = gpu.stream_priority_range().ctx("range")?;
    println!("    priority range {range:?}");
    ensure!(
        range.greatest <= range.least && range.least == 0,
        "range {range:?}"
    );
    ensure!(
        gpu.new_stream()
            .ctx("new_stream")?
            .priority()
            .ctx("priority")?
            == 0,
        "a plain stream is not of priority 0"
    );
    for p in range.greatest..=range.least {
        let s = gpu
            .new_stream_with_priority(p)
            .ctx("new_stream_with_priority")?;
        let got = s.priority().ctx("priority")?;
        ensure!(got == p, "asked for priority {p}, the stream reports {got}");
        // The stream works and stays non-blocking like new_stream's.
        let mut buf = gpu.alloc_zeros::<u32>(64).ctx("alloc")?;
        let b = gpu.on(&s).ctx("on")?;
        b.memset_async(&mut buf, p as u32).ctx("memset_async")?;
        b.synchronize().ctx("sync")?;
        ensure!(
            gpu.dtoh(&buf).ctx("dtoh")? == [p as u32; 64],
            "work on priority {p}"
        );
    }
    for bad in [range.greatest - 1, range.least + 1, i32::MIN, i32::MAX] {
        let e = gpu.new_stream_with_priority(bad).err();
        ensure!(
            e == Some(Error::StreamPriority {
                device: 0,
                requested: bad,
                greatest: range.greatest,
                least: range.least,
            }),
            "priority {bad}: {e:?}"
        );
    }
    // `priority` needs no binding: ask with the token dropped.
    let s = gpu
        .new_stream_with_priority(range.greatest)
        .ctx("new_stream_with_priority")?;
    drop(ctx);
    ensure!(
        s.priority().ctx("priority unbound")? == range.greatest,
        "priority without a binding"
    );
    Ok(())
}

/// Every combination of event flags creates an event that orders and waits; the flags
/// read back; only timing events measure time, the others are a typed driver error.
fn event_flags_create_working_events() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(KERNELS, "kernels.cu").ctx("compile")?;
    let slow_fill = module.function("slow_fill").ctx("function")?;
    let s = gpu.new_stream().ctx("stream")?;
    let n = 1024u32;
    let mut buf = gpu.alloc_zeros::<u32>(n as usize).ctx("alloc")?;
    let plain = gpu.new_event(true).ctx("new_event")?;
    ensure!(plain.flags() == EventFlags::new(), "new_event(true) flags");
    ensure!(
        gpu.new_event(false).ctx("new_event")?.flags() == EventFlags::new().timing(false),
        "new_event(false) flags"
    );
    for timing in [true, false] {
        for blocking in [true, false] {
            let flags = EventFlags::new().timing(timing).blocking_sync(blocking);
            let (start, end) = (
                gpu.new_event_with(flags).ctx("new_event_with")?,
                gpu.new_event_with(flags).ctx("new_event_with")?,
            );
            ensure!(end.flags() == flags, "flags read back {:?}", end.flags());
            let b = gpu.on(&s).ctx("on")?;
            b.record(&start).ctx("record")?;
            let (value, cycles) = (u32::from(timing) * 2 + u32::from(blocking), 20_000_000i64);
            // SAFETY: (unsigned*, unsigned, unsigned, long long) matches; bounds checked.
            unsafe {
                b.launch(&slow_fill, LaunchConfig::for_num_elems(n))
                    .arg(&mut buf)
                    .arg(&n)
                    .arg(&value)
                    .arg(&cycles)
                    .launch()
            }
            .ctx("launch")?;
            b.record(&end).ctx("record")?;
            ensure!(
                !end.is_complete().ctx("query")?,
                "{flags:?}: the slow kernel finished before the check"
            );
            end.synchronize().ctx("event synchronize")?;
            ensure!(
                end.is_complete().ctx("query")?,
                "{flags:?}: synchronize returned before the event completed"
            );
            match start.elapsed_ms(&end) {
                Ok(ms) if timing => {
                    // ~10 ms of spinning at ~2 GHz; at least 1 ms at any clock.
                    let spun = ms >= 1.0;
                    ensure!(spun, "{flags:?}: elapsed {ms} ms");
                }
                Err(Error::Driver { code, .. })
                    if !timing && code == gpubind::DriverErrorCode::INVALID_HANDLE => {}
                other => return Err(format!("{flags:?}: elapsed_ms gave {other:?}")),
            }
            ensure!(
                gpu.dtoh(&buf).ctx("dtoh")? == vec![value; n as usize],
                "{flags:?}: kernel result"
            );
        }
    }
    Ok(())
}

fn cc_version(dev: &Device) -> Result<u32, String> {
    let (major, minor) = dev.compute_capability().ctx("compute_capability")?;
    Ok(major * 10 + minor)
}

/// Attributes are plausible, match the kernels' source (static shared memory, launch
/// bounds) and the architectures: the device's binary, the PTX target asked for.
fn function_attributes_match_the_kernels() -> R {
    let dev = dev0()?;
    let cc = cc_version(&dev)?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(KERNELS, "kernels.cu").ctx("compile")?;
    let slow = module
        .function("slow_fill")
        .ctx("function")?
        .attributes()
        .ctx("attributes")?;
    println!("    slow_fill: {slow:?}");
    ensure!(slow.registers_per_thread > 0, "registers {slow:?}");
    ensure!(
        slow.max_threads_per_block > 0 && slow.max_threads_per_block <= 1024,
        "max threads {slow:?}"
    );
    ensure!(slow.static_shared_bytes == 0, "static shared {slow:?}");
    ensure!(
        slow.binary_version == cc,
        "binary version {} on sm_{cc}",
        slow.binary_version
    );
    ensure!(
        slow.ptx_version > 0 && slow.ptx_version <= cc,
        "ptx version {} on sm_{cc}",
        slow.ptx_version
    );
    let shared = module
        .function("uses_shared")
        .ctx("function")?
        .attributes()
        .ctx("attributes")?;
    ensure!(
        shared.static_shared_bytes == 1024,
        "uses_shared has 256 floats of static shared memory: {shared:?}"
    );
    let bounded = module
        .function("bounded")
        .ctx("function")?
        .attributes()
        .ctx("attributes")?;
    ensure!(
        bounded.max_threads_per_block > 0 && bounded.max_threads_per_block <= 128,
        "__launch_bounds__(128): {bounded:?}"
    );

    // PTX for an older virtual architecture, JIT-compiled: the PTX version is the one
    // asked for, the binary the device's.
    let older = if cc > 75 { 75 } else { cc };
    let ptx = gpubind::compile(
        KERNELS,
        "kernels.cu",
        &[format!("--gpu-architecture=compute_{older}")],
        gpubind::Output::Ptx,
    )
    .ctx("compile PTX")?;
    let ptx = String::from_utf8(ptx).map_err(|e| e.to_string())?;
    let jit = gpu.load_ptx(&ptx).ctx("load_ptx")?;
    let a = jit
        .function("slow_fill")
        .ctx("function")?
        .attributes()
        .ctx("attributes")?;
    ensure!(
        a.ptx_version == older && a.binary_version == cc,
        "compute_{older} PTX on sm_{cc}: {a:?}"
    );
    // Attributes need no binding.
    let f = module.function("slow_fill").ctx("function")?;
    drop(ctx);
    ensure!(
        f.attributes().ctx("attributes unbound")? == slow,
        "attributes without a binding differ"
    );
    Ok(())
}

/// A launch over 48 KiB of shared memory is refused until the kernel opts in with
/// `set_max_dynamic_shared_memory`, then runs; over the device's ceiling is refused.
fn dynamic_shared_memory_opt_in_is_seen_by_launches() -> R {
    use gpubind::DeviceAttribute as A;
    let dev = dev0()?;
    let optin = dev
        .attribute(A::MaxSharedMemoryPerBlockOptin)
        .ctx("attribute")? as u32;
    let default = dev.attribute(A::MaxSharedMemoryPerBlock).ctx("attribute")? as u32;
    if optin <= default {
        return Err(common::skip("the device has no shared memory opt-in"));
    }
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(KERNELS, "kernels.cu").ctx("compile")?;
    let f = module.function("uses_shared").ctx("function")?;
    let want = default + 16 * 1024; // 64 KiB of dynamic on a 48 KiB default
    let n = 256u32;
    let cfg = LaunchConfig {
        shared_mem_bytes: want,
        ..LaunchConfig::for_num_elems(n)
    };
    let mut out = gpu.alloc_zeros::<f32>(n as usize).ctx("alloc")?;
    let s = gpu.default_stream();
    // SAFETY: (float*, unsigned) matches; one block of 256 covers n.
    let before = unsafe { s.launch(&f, cfg).arg(&mut out).arg(&n).launch() }.err();
    ensure!(
        matches!(&before, Some(Error::LaunchLimit { what, .. }) if what.contains("MAX_DYNAMIC_SHARED")),
        "before the opt-in: {before:?}"
    );
    f.set_max_dynamic_shared_memory(want)
        .ctx("set_max_dynamic_shared_memory")?;
    let attrs = f.attributes().ctx("attributes")?;
    ensure!(
        attrs.max_dynamic_shared_bytes == want,
        "attribute after the opt-in: {attrs:?}"
    );
    // The attribute is the kernel's: a new lookup sees it too.
    let again = module.function("uses_shared").ctx("function")?;
    // SAFETY: as above.
    unsafe { s.launch(&again, cfg).arg(&mut out).arg(&n).launch() }.ctx("launch after opt-in")?;
    let got = gpu.dtoh(&out).ctx("dtoh")?;
    ensure!(
        got.iter().enumerate().all(|(i, &x)| x == i as f32 + 1.0),
        "kernel result"
    );
    let ceiling = optin - attrs.static_shared_bytes;
    let e = f.set_max_dynamic_shared_memory(ceiling + 1).err();
    ensure!(
        matches!(&e, Some(Error::LaunchLimit { requested, limit, .. })
            if *requested == u64::from(ceiling) + 1 && *limit == u64::from(ceiling)),
        "over the ceiling: {e:?}"
    );
    f.set_max_dynamic_shared_memory(ceiling)
        .ctx("set to the ceiling")?;
    ensure!(
        f.attributes().ctx("attributes")?.max_dynamic_shared_bytes == ceiling,
        "the ceiling itself is allowed"
    );
    Ok(())
}

/// The occupancy calculator: positive, consistent between its two queries and with the
/// device's thread limit; more shared memory never raises it; bad block sizes typed.
fn occupancy_queries_are_consistent() -> R {
    use gpubind::DeviceAttribute as A;
    let dev = dev0()?;
    let sms = dev.multiprocessor_count().ctx("sms")?;
    let per_sm = dev
        .attribute(A::MaxThreadsPerMultiprocessor)
        .ctx("attribute")? as u32;
    let optin = dev
        .attribute(A::MaxSharedMemoryPerBlockOptin)
        .ctx("attribute")? as u32;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let module = gpu.compile_and_load(KERNELS, "kernels.cu").ctx("compile")?;
    let f = module.function("slow_fill").ctx("function")?;
    let max_threads = f.attributes().ctx("attributes")?.max_threads_per_block;
    let best = f
        .max_potential_block_size(0)
        .ctx("max_potential_block_size")?;
    println!("    slow_fill: {best:?} on {sms} SMs");
    ensure!(
        best.block_size > 0 && best.block_size <= max_threads && best.block_size % 32 == 0,
        "block size {best:?} (kernel max {max_threads})"
    );
    let active = f
        .max_active_blocks_per_sm(best.block_size, 0)
        .ctx("max_active_blocks_per_sm")?;
    ensure!(active > 0, "no block of the best size fits");
    ensure!(
        active * best.block_size <= per_sm,
        "{active} blocks of {} exceed {per_sm} threads per SM",
        best.block_size
    );
    ensure!(
        best.min_grid_size == active * sms,
        "min grid {} != {active} blocks per SM x {sms} SMs",
        best.min_grid_size
    );
    for bs in [32u32, 64, 128, 256, 512, max_threads] {
        let n = f.max_active_blocks_per_sm(bs, 0).ctx("occupancy")?;
        ensure!(
            n > 0 && n * bs <= per_sm,
            "{n} blocks of {bs} on an SM of {per_sm} threads"
        );
        ensure!(
            n * bs <= active * best.block_size,
            "{bs} threads give more occupancy ({n} blocks) than the best size"
        );
    }
    // Shared memory only lowers occupancy: a block with nearly all of it fits once.
    let g = module.function("uses_shared").ctx("function")?;
    let ceiling = optin - g.attributes().ctx("attributes")?.static_shared_bytes;
    g.set_max_dynamic_shared_memory(ceiling).ctx("opt in")?;
    let few = g
        .max_active_blocks_per_sm(128, ceiling as usize)
        .ctx("occupancy")?;
    let many = g.max_active_blocks_per_sm(128, 0).ctx("occupancy")?;
    ensure!(
        few == 1 && many > few,
        "128 threads with {ceiling} B shared: {few} blocks, without: {many}"
    );
    let gb = g
        .max_potential_block_size(ceiling as usize)
        .ctx("potential")?;
    ensure!(
        gb.block_size > 0 && gb.min_grid_size == sms,
        "one block per SM with all the shared memory: {gb:?}"
    );
    // Bad block sizes.
    let e = f.max_active_blocks_per_sm(0, 0).err();
    ensure!(
        matches!(e, Some(Error::InvalidArgument(_))),
        "block of 0: {e:?}"
    );
    let e = f.max_active_blocks_per_sm(max_threads + 1, 0).err();
    ensure!(
        matches!(e, Some(Error::LaunchLimit { .. })),
        "block over the kernel's limit: {e:?}"
    );
    Ok(())
}

/// Peer access: to the bound device itself is a typed error (runs on one GPU); between
/// two GPUs with a peer path, enabling it (twice: idempotent) lets a kernel on device 0
/// write device 1's memory; without a path, a typed error.
fn peer_access_enables_direct_writes() -> R {
    let d0 = dev0()?;
    ensure!(
        d0.can_access_peer(&d0).ctx("can_access_peer self")?,
        "a device reaches its own memory"
    );
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    {
        let gpu = ctx.bind(&d0).ctx("bind")?;
        let e = gpu.enable_peer_access(&d0).err();
        ensure!(
            matches!(&e, Some(Error::InvalidArgument(m)) if m.contains("itself")),
            "peer access to itself: {e:?}"
        );
    }
    if Device::count().ctx("count")? < 2 {
        return Err(common::skip("needs 2 GPUs for the peer part"));
    }
    let d1 = Device::get(1).ctx("Device::get(1)")?;
    let n = 4096u32;
    let remote = ctx
        .bind(&d1)
        .ctx("bind 1")?
        .alloc_zeros::<u32>(n as usize)
        .ctx("alloc on 1")?;
    let gpu = ctx.bind(&d0).ctx("bind 0")?;
    if !d0.can_access_peer(&d1).ctx("can_access_peer")? {
        let e = gpu.enable_peer_access(&d1).err();
        ensure!(
            e == Some(Error::NoPeerAccess { device: 0, peer: 1 }),
            "no peer path: {e:?}"
        );
        return Err(common::skip("devices 0 and 1 have no peer path"));
    }
    gpu.enable_peer_access(&d1).ctx("enable_peer_access")?;
    gpu.enable_peer_access(&d1)
        .ctx("enable_peer_access again")?;
    let module = gpu.compile_and_load(KERNELS, "kernels.cu").ctx("compile")?;
    let f = module.function("write_through").ctx("function")?;
    // SAFETY: the address is only written by the kernel below, which is synchronised
    // before the buffer is used again through gpubind.
    let addr: u64 = unsafe { remote.raw_ptr() };
    let value = 0x5EE5_0001u32;
    let s = gpu.new_stream().ctx("stream")?;
    let b = gpu.on(&s).ctx("on")?;
    // SAFETY: (unsigned*, unsigned, unsigned) matches (the address passed by value as a
    // 64-bit pointer); n elements of device 1's buffer, reachable after the enable.
    unsafe {
        b.launch(&f, LaunchConfig::for_num_elems(n))
            .arg(&addr)
            .arg(&n)
            .arg(&value)
            .launch()
    }
    .ctx("launch")?;
    b.synchronize().ctx("sync")?;
    drop(gpu);
    let gpu1 = ctx.bind(&d1).ctx("bind 1 again")?;
    ensure!(
        gpu1.dtoh(&remote).ctx("dtoh on 1")? == vec![value; n as usize],
        "device 0's kernel did not write device 1's buffer"
    );
    Ok(())
}

fn main() {
    run_suite(
        "gpu_driver_features",
        &[
            (
                "memset_fills_a_sub_view_exactly",
                memset_fills_a_sub_view_exactly,
            ),
            (
                "memset_async_is_ordered_after_other_streams",
                memset_async_is_ordered_after_other_streams,
            ),
            (
                "memset_of_a_misaligned_address_is_typed",
                memset_of_a_misaligned_address_is_typed,
            ),
            (
                "memset_of_another_device_is_typed",
                memset_of_another_device_is_typed,
            ),
            ("stream_priorities_round_trip", stream_priorities_round_trip),
            (
                "event_flags_create_working_events",
                event_flags_create_working_events,
            ),
            (
                "function_attributes_match_the_kernels",
                function_attributes_match_the_kernels,
            ),
            (
                "dynamic_shared_memory_opt_in_is_seen_by_launches",
                dynamic_shared_memory_opt_in_is_seen_by_launches,
            ),
            (
                "occupancy_queries_are_consistent",
                occupancy_queries_are_consistent,
            ),
            (
                "peer_access_enables_direct_writes",
                peer_access_enables_direct_writes,
            ),
        ],
    )
}
