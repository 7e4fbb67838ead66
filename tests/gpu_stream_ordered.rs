//! GPU tests of stream-ordered memory: `BoundStream::alloc` / `alloc_zeros` from the
//! device's default pool, drops that free in stream order without a host wait
//! (docs/safety.md, "Drops"), `DevicePool`'s settings, and the fallback of devices
//! without memory pools (`cuMemAlloc`, waiting drops), reached through the `test-seams`
//! switch `Device::hide_memory_pool_for_test`. Without a driver: one SKIPPED line.

#[macro_use]
mod common;

use common::{Ctx, dev0, run_suite};
use gpubind::{
    BoundDevice, BoundStream, DeviceSlice, Error, Function, LaunchConfig, Module, PoolSetting,
    ThreadContext,
};
use std::time::{Duration, Instant};

type R = Result<(), String>;

const KERNELS: &str = r#"
// Spins for `cycles` clock ticks, touching nothing: keeps a stream busy.
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
// acc[i] += tmp[i].
extern "C" __global__ void add_into(unsigned* acc, const unsigned* tmp, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) acc[i] += tmp[i];
}
// Spins, then copies src to dst: a reader that reads late.
extern "C" __global__ void slow_copy(unsigned* dst, const unsigned* src, unsigned n, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}
"#;

/// About 100 ms at the H200's ~1.8 GHz (measured by each test that relies on it).
const SPIN: i64 = 180_000_000;
const N: u32 = 1024;

fn kernels(gpu: &BoundDevice<'_>) -> Result<Module, String> {
    gpu.compile_and_load(KERNELS, "stream_ordered.cu")
        .ctx("compile")
}

fn spin(s: &BoundStream<'_>, f: &Function<'_>, cycles: i64) -> R {
    // SAFETY: (long long) matches; the kernel touches no memory.
    unsafe {
        s.launch(f, LaunchConfig::for_num_elems(1))
            .arg(&cycles)
            .launch()
    }
    .ctx("launch spin")
}

/// How long `spin(SPIN)` runs here, measured with a host wait.
fn spin_time(s: &BoundStream<'_>, f: &Function<'_>) -> Result<Duration, String> {
    s.synchronize().ctx("sync before timing")?;
    let t = Instant::now();
    spin(s, f, SPIN)?;
    s.synchronize().ctx("sync after spin")?;
    Ok(t.elapsed())
}

fn all_eq(v: &[u32], want: u32, what: &str) -> R {
    let bad = v.iter().filter(|&&x| x != want).count();
    ensure!(
        bad == 0,
        "{what}: {bad} of {} elements are not {want} (first: {:?})",
        v.len(),
        v.first()
    );
    Ok(())
}

/// Iterations of the loop test that are timed against the spin: few enough that their
/// work (a few stream operations each) cannot fill the stream's launch queue, which would
/// block the host behind the spin for a reason that is not gpubind's.
const TIMED: u32 = 100;

/// 1000 × (allocate a temporary on the stream, fill it, add it into an accumulator with a
/// kernel, drop it) behind a spinning kernel: the first [`TIMED`] iterations return while
/// the spin still runs (no host wait anywhere in them), and the accumulator holds the sum.
fn loop_of_temporaries_never_waits_on_the_host() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let m = kernels(&gpu)?;
    let (spin_f, add) = (
        m.function("spin").ctx("spin")?,
        m.function("add_into").ctx("add_into")?,
    );
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let spin_took = spin_time(&s, &spin_f)?;
    let mut acc = s.alloc_zeros::<u32>(N as usize).ctx("alloc acc")?;
    let after_spin = gpu.new_event(false).ctx("event")?;
    spin(&s, &spin_f, SPIN)?;
    s.record(&after_spin).ctx("record")?;
    let t = Instant::now();
    let mut timed = None;
    for i in 0..1000u32 {
        // SAFETY: every element is written by the memset below before the kernel reads it.
        let mut tmp: DeviceSlice<u32> = unsafe { s.alloc(N as usize) }.ctx("alloc tmp")?;
        s.memset_async(&mut tmp, i).ctx("memset")?;
        // SAFETY: (unsigned*, const unsigned*, unsigned) matches; both hold N elements.
        unsafe {
            s.launch(&add, LaunchConfig::for_num_elems(N))
                .arg(&mut acc)
                .arg(&tmp)
                .arg(&N)
                .launch()
        }
        .ctx("launch add_into")?;
        drop(tmp);
        if i + 1 == TIMED {
            let still = !after_spin.is_complete().ctx("query")?;
            timed = Some((t.elapsed(), still));
        }
    }
    let all = t.elapsed();
    let (looped, still_spinning) = timed.ok_or("the loop ended early")?;
    println!(
        "    spin alone {spin_took:?}; {TIMED} allocate/launch/drop submitted in {looped:?} \
         (all 1000 in {all:?}); spin still running after the {TIMED}: {still_spinning}"
    );
    ensure!(
        still_spinning && looped < spin_took / 2,
        "{TIMED} iterations took {looped:?} against a spin of {spin_took:?} and the spin \
         had ended: something in them waited on the host"
    );
    all_eq(
        &gpu.dtoh(&acc).ctx("dtoh")?,
        999 * 1000 / 2,
        "accumulated sum",
    )
}

/// The allocation is a write on its stream: a first use on another stream waits for it
/// (here the allocation and its zeroing queue behind a spin; a fill on stream B must land
/// after them, not be zeroed over).
fn first_use_on_another_stream_waits_for_the_allocation() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let m = kernels(&gpu)?;
    let spin_f = m.function("spin").ctx("spin")?;
    let (sa, sb) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    let (a, b) = (gpu.on(&sa).ctx("on")?, gpu.on(&sb).ctx("on")?);
    spin(&a, &spin_f, SPIN / 4)?;
    let mut buf = a.alloc_zeros::<u32>(N as usize).ctx("alloc")?;
    b.memset_async(&mut buf, 7).ctx("memset on b")?;
    all_eq(&gpu.dtoh(&buf).ctx("dtoh")?, 7, "fill on another stream")
}

/// A buffer last used on streams A (a write) and B (a slow read): its drop frees on A,
/// which first waits for B. A reallocation on A at the same address, written at once,
/// must not be seen by B's late read.
fn free_waits_for_every_stream_of_its_uses() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let m = kernels(&gpu)?;
    let slow_copy = m.function("slow_copy").ctx("slow_copy")?;
    let (sa, sb) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    let (a, b) = (gpu.on(&sa).ctx("on")?, gpu.on(&sb).ctx("on")?);
    let mut seen = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc seen")?;
    let mut old = a.alloc_zeros::<u32>(N as usize).ctx("alloc old")?;
    // SAFETY: reading the address only, to compare.
    let old_addr = unsafe { old.raw_ptr() };
    a.memset_async(&mut old, 1).ctx("memset 1")?;
    // SAFETY: (unsigned*, const unsigned*, unsigned, long long) matches; N elements each.
    unsafe {
        b.launch(&slow_copy, LaunchConfig::for_num_elems(N))
            .arg(&mut seen)
            .arg(&old)
            .arg(&N)
            .arg(&SPIN)
            .launch()
    }
    .ctx("launch slow_copy")?;
    let t = Instant::now();
    drop(old);
    let dropped = t.elapsed();
    let mut fresh = a.alloc_zeros::<u32>(N as usize).ctx("alloc fresh")?;
    // SAFETY: reading the address only, to compare.
    let same = unsafe { fresh.raw_ptr() } == old_addr;
    a.memset_async(&mut fresh, 2).ctx("memset 2")?;
    println!("    drop took {dropped:?}; reallocated at the freed address: {same}");
    ensure!(
        same,
        "the pool did not hand the freed address back on the freeing stream; the test \
         cannot check the reuse"
    );
    ensure!(
        dropped < Duration::from_millis(20),
        "the drop took {dropped:?}: it waited on the host"
    );
    all_eq(&gpu.dtoh(&seen).ctx("dtoh seen")?, 1, "B's late read")?;
    all_eq(
        &gpu.dtoh(&fresh).ctx("dtoh fresh")?,
        2,
        "the new allocation",
    )
}

/// The stream of the last use is dropped before the buffer: the free still goes on it
/// (the buffer's tracker keeps it alive), without a host wait, and the memory returns.
fn drop_after_the_last_use_stream_was_dropped() -> R {
    let dev = dev0()?;
    let pool = dev.memory_pool().ctx("memory_pool")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let m = kernels(&gpu)?;
    let spin_f = m.function("spin").ctx("spin")?;
    gpu.synchronize().ctx("sync")?;
    let before = pool.used_bytes().ctx("used")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let buf = {
        let s = gpu.on(&stream).ctx("on")?;
        let mut buf = s.alloc_zeros::<u32>(1 << 20).ctx("alloc")?;
        s.memset_async(&mut buf, 3).ctx("memset")?;
        spin(&s, &spin_f, SPIN / 4)?;
        buf
    };
    drop(stream);
    let t = Instant::now();
    drop(buf);
    let dropped = t.elapsed();
    gpu.synchronize().ctx("sync")?;
    let after = pool.used_bytes().ctx("used")?;
    println!("    drop took {dropped:?}; pool used bytes {before} -> {after}");
    ensure!(
        dropped < Duration::from_millis(20),
        "the drop took {dropped:?}: it waited on the host"
    );
    ensure!(
        after <= before,
        "the memory did not go back: {before} -> {after}"
    );
    Ok(())
}

/// A drop on another thread, while the last use still runs: no host wait there either,
/// and the memory goes back to the pool once the stream gets there (the used bytes in
/// between are printed: whether the pool counts a free at its enqueue or when the stream
/// reaches it is the driver's business).
fn drop_on_another_thread() -> R {
    let dev = dev0()?;
    let pool = dev.memory_pool().ctx("memory_pool")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let m = kernels(&gpu)?;
    let spin_f = m.function("spin").ctx("spin")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    s.synchronize().ctx("sync")?;
    let before = pool.used_bytes().ctx("used")?;
    let buf = s.alloc_zeros::<u32>(1 << 20).ctx("alloc")?;
    spin(&s, &spin_f, SPIN / 4)?;
    let dropped = std::thread::spawn(move || {
        let t = Instant::now();
        drop(buf);
        t.elapsed()
    })
    .join()
    .map_err(|_| "the dropping thread panicked".to_string())?;
    let during = pool.used_bytes().ctx("used")?;
    s.synchronize().ctx("sync")?;
    let after = pool.used_bytes().ctx("used")?;
    println!("    drop took {dropped:?}; used bytes {before} -> {during} -> {after}");
    ensure!(
        dropped < Duration::from_millis(20),
        "the drop took {dropped:?}: it waited on the host"
    );
    ensure!(
        after <= before,
        "the memory did not go back: {before} -> {after}"
    );
    Ok(())
}

/// The legacy default stream: an allocation there, a fill on another stream (which waits
/// for it), a host read (which forgets every pending use), then two drops: one with
/// nothing pending (freed on the legacy stream), one last used on another stream. Both
/// go back to the pool.
fn legacy_stream_and_idle_drops() -> R {
    let dev = dev0()?;
    let pool = dev.memory_pool().ctx("memory_pool")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let b = gpu.on(&stream).ctx("on")?;
    gpu.synchronize().ctx("sync")?;
    let before = pool.used_bytes().ctx("used")?;
    let legacy = gpu.default_stream();
    let mut idle = legacy
        .alloc_zeros::<u32>(N as usize)
        .ctx("alloc on legacy")?;
    let mut busy = legacy
        .alloc_zeros::<u32>(N as usize)
        .ctx("alloc on legacy")?;
    b.memset_async(&mut idle, 5).ctx("memset on b")?;
    all_eq(
        &gpu.dtoh(&idle).ctx("dtoh")?,
        5,
        "fill after a legacy allocation",
    )?;
    b.memset_async(&mut busy, 6).ctx("memset on b")?;
    drop(idle);
    drop(busy);
    gpu.synchronize().ctx("sync")?;
    let after = pool.used_bytes().ctx("used")?;
    println!("    pool used bytes {before} -> {after}");
    ensure!(
        after <= before,
        "the memory did not go back: {before} -> {after}"
    );
    Ok(())
}

/// Used bytes go up by an allocation and back down after its free; the release threshold
/// round-trips; trimming works.
fn pool_usage_and_settings() -> R {
    let dev = dev0()?;
    let pool = dev.memory_pool().ctx("memory_pool")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    gpu.synchronize().ctx("sync")?;
    let old_threshold = pool.release_threshold().ctx("threshold")?;
    pool.set_release_threshold(96 << 20).ctx("set threshold")?;
    let read = pool.release_threshold().ctx("threshold")?;
    ensure!(read == 96 << 20, "release threshold read back as {read}");
    let before = pool.used_bytes().ctx("used")?;
    let buf = s.alloc_zeros::<u8>(64 << 20).ctx("alloc")?;
    s.synchronize().ctx("sync")?;
    let during = pool.used_bytes().ctx("used")?;
    let reserved = pool.reserved_bytes().ctx("reserved")?;
    drop(buf);
    s.synchronize().ctx("sync")?;
    let after = pool.used_bytes().ctx("used")?;
    println!("    used {before} -> {during} -> {after}; reserved {reserved}");
    ensure!(
        during >= before + (64 << 20),
        "64 MiB in use should show: {before} -> {during}"
    );
    ensure!(reserved >= during, "reserved {reserved} < used {during}");
    ensure!(
        after <= before,
        "the memory did not go back: {before} -> {after}"
    );
    pool.trim_to(0).ctx("trim_to")?;
    let trimmed = pool.reserved_bytes().ctx("reserved")?;
    println!("    reserved after trim_to(0): {trimmed}");
    ensure!(trimmed <= reserved, "trim_to grew the reserve");
    pool.set(PoolSetting::ReuseAllowOpportunistic, 1)
        .ctx("set reuse")?;
    let reuse = pool.get(PoolSetting::ReuseAllowOpportunistic).ctx("get")?;
    ensure!(reuse == 1, "reuse switch read back as {reuse}");
    pool.set_release_threshold(old_threshold)
        .ctx("restore threshold")
}

/// `Device::memory_usage` counts a stream-ordered slice from its allocation to its drop,
/// as it does a `cuMemAlloc` one.
fn pooled_slices_count_in_memory_usage() -> R {
    let dev = dev0()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let base = dev.memory_usage().in_use;
    let buf = s.alloc_zeros::<u32>(1 << 18).ctx("alloc")?;
    let during = dev.memory_usage().in_use;
    drop(buf);
    let after = dev.memory_usage().in_use;
    println!("    memory_usage in_use {base} -> {during} -> {after}");
    ensure!(
        during == base + (1 << 20),
        "1 MiB allocated: {base} -> {during}"
    );
    ensure!(after == base, "dropped: {base} -> {after}");
    Ok(())
}

/// A value the device refuses is `Error::PoolSetting` naming the setting.
fn refused_setting_is_a_typed_error() -> R {
    let dev = dev0()?;
    let pool = dev.memory_pool().ctx("memory_pool")?;
    match pool.set(PoolSetting::UsedHigh, 5) {
        Err(Error::PoolSetting {
            setting: "CU_MEMPOOL_ATTR_USED_MEM_HIGH",
            value: 5,
            code: Some(_),
            ..
        }) => {}
        other => return Err(format!("a non-zero peak reset: {other:?}")),
    }
    match pool.set(PoolSetting::ReuseAllowOpportunistic, 2) {
        Err(e @ Error::PoolSetting { code: None, .. }) => {
            println!("    {e}");
        }
        other => return Err(format!("a switch set to 2: {other:?}")),
    }
    // A reset to 0 is allowed.
    pool.set(PoolSetting::UsedHigh, 0).ctx("reset the peak")
}

/// Hides device 0's memory pool (the `test-seams` switch) until dropped, also when the
/// test fails, so the other tests of the suite see the pool again.
struct PoolHidden(std::sync::Arc<gpubind::Device>);

impl PoolHidden {
    fn new(dev: &std::sync::Arc<gpubind::Device>) -> Self {
        dev.hide_memory_pool_for_test(true);
        PoolHidden(dev.clone())
    }
}

impl Drop for PoolHidden {
    fn drop(&mut self) {
        self.0.hide_memory_pool_for_test(false);
    }
}

/// The fallback of devices without memory pools: `memory_pool()` says the device lacks
/// one, and a loop of temporaries (allocate, fill or zero, add into an accumulator with a
/// kernel, drop) gives the exact sum through `cuMemAlloc` and waiting drops.
fn fallback_temporaries_loop_is_exact() -> R {
    let dev = dev0()?;
    let _hidden = PoolHidden::new(&dev);
    match dev.memory_pool() {
        Err(Error::DeviceLacks { .. }) => {}
        other => return Err(format!("memory_pool() with the pool hidden: {other:?}")),
    }
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let m = kernels(&gpu)?;
    let add = m.function("add_into").ctx("add_into")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let mut acc = s.alloc_zeros::<u32>(N as usize).ctx("alloc acc")?;
    let t = Instant::now();
    for i in 0..200u32 {
        let tmp = if i % 2 == 0 {
            // SAFETY: every element is written by the memset below before the kernel.
            let mut tmp: DeviceSlice<u32> = unsafe { s.alloc(N as usize) }.ctx("alloc tmp")?;
            s.memset_async(&mut tmp, i).ctx("memset")?;
            tmp
        } else {
            // Zeroed: adds nothing, unless the zeroing is lost.
            s.alloc_zeros::<u32>(N as usize).ctx("alloc_zeros tmp")?
        };
        // SAFETY: (unsigned*, const unsigned*, unsigned) matches; both hold N elements.
        unsafe {
            s.launch(&add, LaunchConfig::for_num_elems(N))
                .arg(&mut acc)
                .arg(&tmp)
                .arg(&N)
                .launch()
        }
        .ctx("launch add_into")?;
        drop(tmp);
    }
    println!(
        "    200 allocate/launch/drop through cuMemAlloc in {:?}",
        t.elapsed()
    );
    // 0 + 2 + 4 + … + 198.
    all_eq(&gpu.dtoh(&acc).ctx("dtoh")?, 99 * 100, "accumulated sum")
}

/// Allocates fallback buffers of `N` elements on `s` until one lands at `addr` (keeping
/// the others alive meanwhile); `None` if none of 16 does.
fn realloc_at(s: &BoundStream<'_>, addr: u64) -> Result<Option<DeviceSlice<u32>>, String> {
    let mut kept = Vec::new();
    for _ in 0..16 {
        let fresh = s.alloc_zeros::<u32>(N as usize).ctx("alloc fresh")?;
        // SAFETY: reading the address only, to compare.
        if unsafe { fresh.raw_ptr() } == addr {
            return Ok(Some(fresh));
        }
        kept.push(fresh);
    }
    Ok(None)
}

/// The misuses of a temporary through the fallback: dropped while a slow kernel on
/// another stream still writes it, and while a slow kernel still reads it. Each drop
/// must wait for the kernel before `cuMemFree`; a reallocation at the freed address,
/// filled at once, must neither be overwritten by the late writer nor be seen by the
/// late reader.
fn fallback_drop_while_a_kernel_uses_the_buffer() -> R {
    let dev = dev0()?;
    let _hidden = PoolHidden::new(&dev);
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let m = kernels(&gpu)?;
    let (spin_f, slow_copy) = (
        m.function("spin").ctx("spin")?,
        m.function("slow_copy").ctx("slow_copy")?,
    );
    let (sa, sb) = (
        gpu.new_stream().ctx("stream")?,
        gpu.new_stream().ctx("stream")?,
    );
    let (a, b) = (gpu.on(&sa).ctx("on")?, gpu.on(&sb).ctx("on")?);
    let spin_took = spin_time(&b, &spin_f)?;
    let mut ones = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc ones")?;
    a.memset_async(&mut ones, 1).ctx("memset ones")?;
    let mut seen = gpu.alloc_zeros::<u32>(N as usize).ctx("alloc seen")?;

    // A late writer: slow_copy(old <- ones) on B, then the drop.
    let mut old = a.alloc_zeros::<u32>(N as usize).ctx("alloc old")?;
    // SAFETY: reading the address only, to compare.
    let old_addr = unsafe { old.raw_ptr() };
    // SAFETY: (unsigned*, const unsigned*, unsigned, long long) matches; N elements each.
    unsafe {
        b.launch(&slow_copy, LaunchConfig::for_num_elems(N))
            .arg(&mut old)
            .arg(&ones)
            .arg(&N)
            .arg(&SPIN)
            .launch()
    }
    .ctx("launch slow_copy (writer)")?;
    let t = Instant::now();
    drop(old);
    let dropped_writer = t.elapsed();
    let mut fresh = realloc_at(&a, old_addr)?.ok_or(
        "cuMemAlloc did not hand the freed address back in 16 allocations; the test cannot \
         check the reuse",
    )?;
    a.memset_async(&mut fresh, 2).ctx("memset 2")?;
    // A write the drop did not wait for would land by the end of B's work.
    b.synchronize().ctx("sync b")?;
    all_eq(
        &gpu.dtoh(&fresh).ctx("dtoh fresh")?,
        2,
        "reallocation after a late writer",
    )?;
    drop(fresh);

    // A late reader: slow_copy(seen <- old) on B reads `old` (all 3) late; then the drop.
    let mut old = a.alloc_zeros::<u32>(N as usize).ctx("alloc old")?;
    // SAFETY: reading the address only, to compare.
    let old_addr = unsafe { old.raw_ptr() };
    a.memset_async(&mut old, 3).ctx("memset 3")?;
    // SAFETY: as above.
    unsafe {
        b.launch(&slow_copy, LaunchConfig::for_num_elems(N))
            .arg(&mut seen)
            .arg(&old)
            .arg(&N)
            .arg(&SPIN)
            .launch()
    }
    .ctx("launch slow_copy (reader)")?;
    let t = Instant::now();
    drop(old);
    let dropped_reader = t.elapsed();
    let mut fresh = realloc_at(&a, old_addr)?.ok_or(
        "cuMemAlloc did not hand the freed address back in 16 allocations; the test cannot \
         check the reuse",
    )?;
    a.memset_async(&mut fresh, 4).ctx("memset 4")?;
    println!(
        "    spin {spin_took:?}; drops waited {dropped_writer:?} (late writer) and \
         {dropped_reader:?} (late reader); both reallocated at the freed address"
    );
    all_eq(&gpu.dtoh(&seen).ctx("dtoh seen")?, 3, "the late read")?;
    all_eq(
        &gpu.dtoh(&fresh).ctx("dtoh fresh")?,
        4,
        "reallocation after a late reader",
    )
}

fn main() {
    run_suite(
        "gpu_stream_ordered",
        &[
            (
                "loop_of_temporaries_never_waits_on_the_host",
                loop_of_temporaries_never_waits_on_the_host,
            ),
            (
                "first_use_on_another_stream_waits_for_the_allocation",
                first_use_on_another_stream_waits_for_the_allocation,
            ),
            (
                "free_waits_for_every_stream_of_its_uses",
                free_waits_for_every_stream_of_its_uses,
            ),
            (
                "drop_after_the_last_use_stream_was_dropped",
                drop_after_the_last_use_stream_was_dropped,
            ),
            ("drop_on_another_thread", drop_on_another_thread),
            ("legacy_stream_and_idle_drops", legacy_stream_and_idle_drops),
            ("pool_usage_and_settings", pool_usage_and_settings),
            (
                "refused_setting_is_a_typed_error",
                refused_setting_is_a_typed_error,
            ),
            (
                "pooled_slices_count_in_memory_usage",
                pooled_slices_count_in_memory_usage,
            ),
            (
                "fallback_temporaries_loop_is_exact",
                fallback_temporaries_loop_is_exact,
            ),
            (
                "fallback_drop_while_a_kernel_uses_the_buffer",
                fallback_drop_while_a_kernel_uses_the_buffer,
            ),
        ],
    )
}
