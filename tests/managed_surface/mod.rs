//! GPU tests of managed-memory views and attachments, and of reinterpreting views and
//! `try_clone` of device slices; part of `gpu_memory_kinds`.

use super::{KERNELS, TestResult, first_mismatch, pattern, with_gpu};
use crate::common::Ctx;
use crate::ensure;
use gpubind::{
    BoundDevice, BoundStream, DeviceAttribute, DeviceMemory, DeviceMemoryMut, Error, Function,
    LaunchConfig, ManagedAttach, TransmuteRefusal,
};

fn same<T: PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: &[T]) -> TestResult {
    match first_mismatch(got, want) {
        Some(m) => Err(format!("{what}: {m}")),
        None => Ok(()),
    }
}

/// `fill_pattern(p, n, seed)` on `s` over `dst`.
fn fill(
    s: &BoundStream<'_>,
    f: &Function<'_>,
    dst: &mut (impl DeviceMemoryMut<u32> + gpubind::WritableArg),
    seed: u32,
) -> TestResult {
    let n = dst.len() as u32;
    // SAFETY: (unsigned*, unsigned, unsigned) matches; the kernel stays below n.
    unsafe {
        s.launch(f, LaunchConfig::for_num_elems(n))
            .arg(dst)
            .arg(&n)
            .arg(&seed)
            .launch()
    }
    .ctx("launch fill_pattern")
}

fn patterned(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| pattern(i, seed)).collect()
}

fn concurrent(gpu: &BoundDevice<'_>) -> Result<bool, String> {
    Ok(gpu
        .device()
        .attribute(DeviceAttribute::ConcurrentManagedAccess)
        .ctx("attribute")?
        != 0)
}

/// Managed views are kernel arguments (read and written) and copy endpoints, and their
/// host references see the device's writes.
pub fn managed_views_as_kernel_args_and_copies() -> TestResult {
    with_gpu(|gpu| {
        if !concurrent(gpu)? {
            return Err(crate::common::skip("no concurrent managed access"));
        }
        let module = gpu.compile_and_load(KERNELS, "kinds.cu").ctx("compile")?;
        let affine = module.function("affine").ctx("affine")?;
        let add_one = module.function("add_one").ctx("add_one")?;
        let n = 1024;
        let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let mut m = gpu.alloc_managed::<f32>(n).ctx("alloc_managed")?;
        m.as_mut_slice().ctx("as_mut_slice")?.copy_from_slice(&x);
        let s = gpu.default_stream();
        {
            let mut mid = m.slice_mut(256..768).ctx("slice_mut")?;
            let k = mid.len() as u32;
            // SAFETY: (float*, unsigned) matches; the kernel stays below k.
            unsafe {
                s.launch(&affine, LaunchConfig::for_num_elems(k))
                    .arg(&mut mid)
                    .arg(&k)
                    .launch()
                    .ctx("affine on a view")?;
            }
            let want: Vec<f32> = x[256..768].iter().map(|v| v * 2.0 + 1.0).collect();
            same(
                "view's host read",
                mid.as_slice().ctx("view as_slice")?,
                &want,
            )?;
        }
        let mut want = x.clone();
        want[256..768].iter_mut().for_each(|v| *v = *v * 2.0 + 1.0);
        same(
            "slice after a view's launch",
            m.as_slice().ctx("as_slice")?,
            &want,
        )?;
        // A shared view read by a kernel, into a device buffer; copies both ways.
        let mut out = gpu.alloc_zeros::<f32>(256).ctx("alloc")?;
        {
            let head = m.slice(..256).ctx("slice")?;
            let k = 256u32;
            // SAFETY: (const float*, float*, unsigned) matches; both hold k elements.
            unsafe {
                s.launch(&add_one, LaunchConfig::for_num_elems(k))
                    .arg(&head)
                    .arg(&mut out)
                    .arg(&k)
                    .launch()
                    .ctx("add_one from a view")?;
            }
            let plus: Vec<f32> = x[..256].iter().map(|v| v + 1.0).collect();
            same("kernel read of a view", &gpu.dtoh(&out).ctx("dtoh")?, &plus)?;
            same(
                "dtoh of a view",
                &gpu.dtoh(&head).ctx("dtoh view")?,
                &x[..256],
            )?;
        }
        gpu.copy(&out, &mut m.slice_mut(768..).ctx("tail")?)
            .ctx("copy into a view")?;
        let mut tail = vec![0f32; 256];
        gpu.copy(&m.slice(768..).ctx("tail")?, &mut tail[..])
            .ctx("copy out of a view")?;
        let plus: Vec<f32> = x[..256].iter().map(|v| v + 1.0).collect();
        same("copies through views", &tail, &plus)?;
        same(
            "host view of copied range",
            &m.as_slice().ctx("as_slice")?[768..],
            &plus,
        )?;
        match m.slice(1000..1025) {
            Err(Error::OutOfBounds { len: 1024, .. }) => Ok(()),
            other => Err(format!("out-of-bounds view: {other:?}")),
        }
    })
}

/// The halves of `split_at_mut` written by two streams (ordered by the shared tracker),
/// then read and written by the host.
pub fn managed_split_halves_written_by_two_streams() -> TestResult {
    with_gpu(|gpu| {
        if !concurrent(gpu)? {
            return Err(crate::common::skip("no concurrent managed access"));
        }
        let module = gpu.compile_and_load(KERNELS, "kinds.cu").ctx("compile")?;
        let f = module.function("fill_pattern").ctx("fill_pattern")?;
        let n = 1 << 16;
        let mut m = gpu.alloc_managed::<u32>(n).ctx("alloc_managed")?;
        let (s1, s2) = (
            gpu.new_stream().ctx("stream 1")?,
            gpu.new_stream().ctx("stream 2")?,
        );
        let (s1, s2) = (gpu.on(&s1).ctx("on 1")?, gpu.on(&s2).ctx("on 2")?);
        let mid = n / 2 + 3;
        {
            let (mut head, mut tail) = m.split_at_mut(mid).ctx("split_at_mut")?;
            fill(&s1, &f, &mut head, 1)?;
            fill(&s2, &f, &mut tail, 2)?;
            same("head", head.as_slice().ctx("head")?, &patterned(mid, 1))?;
            same("tail", tail.as_slice().ctx("tail")?, &patterned(n - mid, 2))?;
            fill(&s1, &f, &mut head, 3)?;
            tail.as_mut_slice().ctx("tail mut")?.fill(9);
            same(
                "head again",
                head.as_slice().ctx("head")?,
                &patterned(mid, 3),
            )?;
        }
        let all = m.as_slice().ctx("as_slice")?;
        same("whole head", &all[..mid], &patterned(mid, 3))?;
        ensure!(all[mid..].iter().all(|&v| v == 9), "host-written tail");
        let (a, b) = m.split_at(mid).ctx("split_at")?;
        ensure!(a.len() == mid && b.len() == n - mid, "split_at lengths");
        match m.split_at_mut(n + 1) {
            Err(Error::OutOfBounds { .. }) => Ok(()),
            other => Err(format!("split past the end: {other:?}")),
        }
    })
}

/// Memory allocated attached to the host, and re-attached by a stream, is usable by the
/// host and by kernels, each seeing the other's writes.
pub fn managed_host_attach_then_host_access() -> TestResult {
    with_gpu(|gpu| {
        let n = 4096;
        if !concurrent(gpu)? {
            match gpu.alloc_managed_attached::<u32>(n, ManagedAttach::Host) {
                Err(Error::DeviceLacks { .. }) => {
                    return Err(crate::common::skip(
                        "no concurrent managed access (refusal checked)",
                    ));
                }
                other => return Err(format!("host attach without concurrent access: {other:?}")),
            }
        }
        let module = gpu.compile_and_load(KERNELS, "kinds.cu").ctx("compile")?;
        let f = module.function("fill_pattern").ctx("fill_pattern")?;
        let mut m = gpu
            .alloc_managed_attached::<u32>(n, ManagedAttach::Host)
            .ctx("alloc_managed_attached(Host)")?;
        ensure!(
            m.as_slice().ctx("as_slice")?.iter().all(|&v| v == 0),
            "not zeroed"
        );
        m.as_mut_slice().ctx("as_mut_slice")?.fill(4);
        same(
            "dtoh of host-attached",
            &gpu.dtoh(&m).ctx("dtoh")?,
            &vec![4; n],
        )?;
        let s = gpu.new_stream().ctx("stream")?;
        let s = gpu.on(&s).ctx("on")?;
        fill(&s, &f, &mut m, 7)?;
        same(
            "host read after a kernel",
            m.as_slice().ctx("as_slice")?,
            &patterned(n, 7),
        )?;
        s.attach_managed_global(&mut m).ctx("attach global")?;
        fill(&s, &f, &mut m, 8)?;
        s.attach_managed_to_host(&mut m).ctx("attach to host")?;
        same(
            "after re-attaching",
            m.as_slice().ctx("as_slice")?,
            &patterned(n, 8),
        )?;
        // Managed memory seen as bytes: the host and dtoh agree with the u32 contents.
        let want: Vec<u8> = patterned(n, 8)
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        let bytes = m.transmute::<u8>().ctx("managed transmute")?;
        same(
            "managed as bytes (host)",
            bytes.as_slice().ctx("as_slice")?,
            &want,
        )?;
        same(
            "managed as bytes (dtoh)",
            &gpu.dtoh(&bytes).ctx("dtoh")?,
            &want,
        )?;
        match m.transmute::<[u8; 3]>() {
            Err(Error::Transmute {
                reason: TransmuteRefusal::Length,
                ..
            }) => Ok(()),
            other => Err(format!("managed 4n bytes as [u8; 3]: {other:?}")),
        }
    })
}

/// Memory attached to one stream: that stream's work is waited for by host access;
/// other streams may still use it, ordered by the tracker.
pub fn managed_single_stream_attach() -> TestResult {
    with_gpu(|gpu| {
        if !concurrent(gpu)? {
            return Err(crate::common::skip("no concurrent managed access"));
        }
        let module = gpu.compile_and_load(KERNELS, "kinds.cu").ctx("compile")?;
        let f = module.function("fill_pattern").ctx("fill_pattern")?;
        let n = 1 << 14;
        let mut m = gpu.alloc_managed::<u32>(n).ctx("alloc_managed")?;
        let (own, other) = (
            gpu.new_stream().ctx("stream")?,
            gpu.new_stream().ctx("other")?,
        );
        let (s, o) = (gpu.on(&own).ctx("on")?, gpu.on(&other).ctx("on other")?);
        s.attach_managed(&mut m).ctx("attach_managed")?;
        fill(&s, &f, &mut m, 21)?;
        same(
            "host read after the owning stream",
            m.as_slice().ctx("as_slice")?,
            &patterned(n, 21),
        )?;
        fill(&o, &f, &mut m, 22)?; // another stream: ordered by the tracker
        same(
            "host read after another stream",
            m.as_slice().ctx("as_slice")?,
            &patterned(n, 22),
        )?;
        // Work on the attached stream that does not touch `m` is waited for too (the
        // attached stream's rule), work on another stream is not.
        let slow = gpu
            .compile_and_load(crate::common::slow_fill_cuda!(), "slow.cu")
            .ctx("compile slow_fill")?;
        let slow_fill = slow.function("slow_fill").ctx("slow_fill")?;
        let mut other_buf = gpu.alloc_zeros::<u32>(256).ctx("alloc")?;
        let spin = |st: &BoundStream<'_>, buf: &mut gpubind::DeviceSlice<u32>| {
            let (k, v, cycles) = (256u32, 1u32, 40_000_000i64);
            // SAFETY: (unsigned*, unsigned, unsigned, long long) matches; i < k checked.
            unsafe {
                st.launch(&slow_fill, LaunchConfig::for_num_elems(k))
                    .arg(buf)
                    .arg(&k)
                    .arg(&v)
                    .arg(&cycles)
                    .launch()
            }
            .ctx("launch slow_fill")
        };
        let done = gpu.new_event(false).ctx("event")?;
        spin(&s, &mut other_buf)?;
        s.record(&done).ctx("record")?;
        m.as_slice()
            .ctx("as_slice while the attached stream spins")?;
        ensure!(
            done.is_complete().ctx("is_complete")?,
            "a host reference into stream-attached memory did not wait for the stream"
        );
        m.as_mut_slice().ctx("as_mut_slice")?.fill(5);
        same(
            "dtoh after host write",
            &gpu.dtoh(&m).ctx("dtoh")?,
            &vec![5; n],
        )?;
        s.attach_managed_global(&mut m).ctx("detach")?;
        drop(own); // the slice no longer names it; its drop must not need it
        fill(&o, &f, &mut m, 23)?;
        same(
            "after detaching",
            m.as_slice().ctx("as_slice")?,
            &patterned(n, 23),
        )?;
        Ok(())
    })
}

/// Attachments the driver or device would refuse are typed errors.
pub fn managed_attach_errors_are_typed() -> TestResult {
    with_gpu(|gpu| {
        let mut m = gpu.alloc_managed::<u32>(64).ctx("alloc_managed")?;
        match gpu.default_stream().attach_managed(&mut m) {
            Err(Error::InvalidArgument(msg)) if msg.contains("legacy default stream") => {}
            Err(Error::DeviceLacks { .. }) if !concurrent(gpu)? => {}
            other => return Err(format!("attach to the legacy stream: {other:?}")),
        }
        if !concurrent(gpu)? {
            match gpu
                .new_stream()
                .and_then(|s| gpu.on(&s)?.attach_managed(&mut m))
            {
                Err(Error::DeviceLacks { capability, .. }) => ensure!(
                    capability.contains("CONCURRENT_MANAGED_ACCESS"),
                    "capability {capability}"
                ),
                other => {
                    return Err(format!(
                        "single attach without concurrent access: {other:?}"
                    ));
                }
            }
        }
        // The memory is unchanged and usable after the refusals.
        same("after refusals", &gpu.dtoh(&m).ctx("dtoh")?, &[0; 64])
    })
}

/// A byte buffer seen as f32 and back, data checked; misfits refused.
pub fn transmute_views_reinterpret_and_refuse() -> TestResult {
    with_gpu(|gpu| {
        let module = gpu.compile_and_load(KERNELS, "kinds.cu").ctx("compile")?;
        let affine = module.function("affine").ctx("affine")?;
        let floats: Vec<f32> = (0..64).map(|i| i as f32 * 0.5 - 3.0).collect();
        let bytes: Vec<u8> = floats.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let mut buf = gpu.clone_htod(&bytes).ctx("clone_htod")?;
        same(
            "u8 as f32",
            &gpu.dtoh(&buf.transmute::<f32>().ctx("transmute")?)
                .ctx("dtoh")?,
            &floats,
        )?;
        {
            let mut as_f32 = buf.transmute_mut::<f32>().ctx("transmute_mut")?;
            let k = as_f32.len() as u32;
            // SAFETY: (float*, unsigned) matches; the kernel stays below k.
            unsafe {
                gpu.default_stream()
                    .launch(&affine, LaunchConfig::for_num_elems(k))
                    .arg(&mut as_f32)
                    .arg(&k)
                    .launch()
                    .ctx("affine on a transmuted view")?;
            }
        }
        let want: Vec<u8> = floats
            .iter()
            .flat_map(|v| (v * 2.0 + 1.0).to_ne_bytes())
            .collect();
        same(
            "bytes after the kernel",
            &gpu.dtoh(&buf).ctx("dtoh")?,
            &want,
        )?;
        // A view of a view, and back to bytes.
        let quad = buf.slice(16..48).ctx("slice")?;
        let as_u32 = quad.transmute::<u32>().ctx("view transmute")?;
        let back = as_u32.transmute::<u8>().ctx("back to u8")?;
        same(
            "round trip of a view",
            &gpu.dtoh(&back).ctx("dtoh")?,
            &want[16..48],
        )?;
        let refused = |r: gpubind::Result<usize>, reason, what: &str| match r {
            Err(Error::Transmute { reason: got, .. }) if got == reason => Ok(()),
            other => Err(format!("{what}: {other:?}")),
        };
        refused(
            buf.slice(0..6)
                .and_then(|v| v.transmute::<f32>().map(|v| v.len())),
            TransmuteRefusal::Length,
            "6 bytes as f32",
        )?;
        refused(
            buf.slice(1..9)
                .and_then(|v| v.transmute::<f32>().map(|v| v.len())),
            TransmuteRefusal::Alignment,
            "odd address as f32",
        )?;
        let odd = gpu.alloc_zeros::<u8>(10).ctx("alloc")?;
        refused(
            odd.transmute::<u64>().map(|v| v.len()),
            TransmuteRefusal::Length,
            "10 bytes as u64",
        )?;
        Ok(())
    })
}

/// `try_clone` copies after pending writes, and the clone is independent.
pub fn try_clone_is_ordered_and_independent() -> TestResult {
    with_gpu(|gpu| {
        let module = gpu.compile_and_load(KERNELS, "kinds.cu").ctx("compile")?;
        let f = module.function("fill_pattern").ctx("fill_pattern")?;
        let n = 1 << 18;
        let mut a = gpu.alloc_zeros::<u32>(n).ctx("alloc")?;
        let s = gpu.new_stream().ctx("stream")?;
        let s = gpu.on(&s).ctx("on")?;
        fill(&s, &f, &mut a, 31)?; // pending when the clone starts
        let mut b = a.try_clone(gpu).ctx("try_clone")?;
        same("clone", &gpu.dtoh(&b).ctx("dtoh b")?, &patterned(n, 31))?;
        fill(&s, &f, &mut b, 32)?;
        same(
            "original after writing the clone",
            &gpu.dtoh(&a).ctx("dtoh a")?,
            &patterned(n, 31),
        )?;
        same(
            "clone after its write",
            &gpu.dtoh(&b).ctx("dtoh b")?,
            &patterned(n, 32),
        )?;
        let empty = gpu.alloc_zeros::<u32>(0).ctx("alloc empty")?;
        ensure!(
            empty.try_clone(gpu).ctx("clone empty")?.is_empty(),
            "empty clone"
        );
        Ok(())
    })
}

/// A shared `ManagedView` (from `&ManagedSlice`, while the host holds `as_slice`) is read
/// by a kernel while the host slice is held, and the host slice stays unchanged; passing
/// it as written does not compile (`ManagedView` is no `WritableArg`). Managed memory of a
/// zero-sized element type gives host slices of its length.
pub fn managed_shared_views_are_never_written() -> TestResult {
    with_gpu(|gpu| {
        if !concurrent(gpu)? {
            return Err(crate::common::skip("no concurrent managed access"));
        }
        let module = gpu.compile_and_load(KERNELS, "kinds.cu").ctx("compile")?;
        let n = 4096usize;
        let mut m = gpu.alloc_managed::<u32>(n).ctx("alloc_managed")?;
        m.as_mut_slice().ctx("as_mut_slice")?.fill(5);
        let held: &[u32] = m.as_slice().ctx("as_slice")?;
        let view = m.slice(..).ctx("slice")?;
        let k = n as u32;
        let s = gpu.default_stream();
        let cfg = LaunchConfig::for_num_elems(k);
        // Reads through a shared view stay accepted.
        let mut out = gpu.alloc_zeros::<u32>(n).ctx("alloc")?;
        let copy = module.function("copy_u32").ctx("copy_u32")?;
        // SAFETY: (const unsigned*, unsigned*, unsigned) matches; both hold n elements.
        unsafe {
            s.launch(&copy, cfg)
                .arg(&view)
                .arg(&mut out)
                .arg(&k)
                .launch()
        }
        .ctx("read launch of a shared view")?;
        same(
            "read through a shared view",
            &gpu.dtoh(&out).ctx("dtoh")?,
            &vec![5; n],
        )?;
        ensure!(
            held.iter().all(|&v| v == 5),
            "the held host slice changed under a read launch"
        );
        let mut zst = gpu
            .alloc_managed::<[u32; 0]>(5)
            .ctx("alloc_managed of a zero-sized type")?;
        ensure!(
            zst.as_slice().ctx("zst as_slice")?.len() == 5
                && zst.as_mut_slice().ctx("zst as_mut_slice")?.len() == 5,
            "zero-sized host slices"
        );
        println!("zero-sized managed elements: host slices of length 5");
        Ok(())
    })
}
