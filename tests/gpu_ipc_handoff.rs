//! GPU tests of ordered hand-offs (`PoolSlice::lend` / `PoolSlice::share` /
//! `ipc::recv_handoff`) with child processes on one GPU.
//!
//! Children are re-executions of this binary with `GPUBIND_CHILD=<role>` and
//! `GPUBIND_IPC_SOCKET=<path>` (a Unix socket the parent listens on); a child exits 0 on
//! success and prints the reason for a failure on stderr.
//!
//! Run: `cargo test --features ipc --test gpu_ipc_handoff` (one SKIPPED line without a
//! GPU).

mod common;

use common::{Ctx, socket_child};
use gpubind::ipc::{
    self, GiveBackError, Incoming, JoinError, MemoryPool, PoolConfig, PoolSlice, TransportOptions,
};
use gpubind::{BoundDevice, BoundStream, Device, Error, LaunchConfig, Module, ThreadContext};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

type R<T = ()> = Result<T, String>;

const CHILD_WAIT: Duration = Duration::from_secs(120);
/// Elements in every handed-off buffer.
const N: usize = 4096;
/// GPU time the slow kernels spin before they write: far longer than a hand-off takes
/// to reach the child (which is set up and waiting before the kernel starts), so a read
/// that is not ordered after the kernel sees old data.
const SPIN_NS: u64 = 1_000_000_000;
/// GPU time of the `timed_out_giver` child's write: three times its
/// `GPUBIND_DROP_TIMEOUT` of 1 s.
const GIVER_SPIN_NS: u64 = 3_000_000_000;

/// `spin_fill(p, n, v, ns)`: every thread spins `ns` nanoseconds of GPU time, then
/// writes `v + i` to element `i`; `spin_copy(src, dst, n, ns)` spins, then copies.
const SPIN_FILL: &str = r#"
extern "C" __global__ void spin_fill(unsigned* p, unsigned n, unsigned v, unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    now = start;
    while (now - start < ns) { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); }
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v + i;
}

extern "C" __global__ void spin_copy(const unsigned* src, unsigned* dst, unsigned n, unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    now = start;
    while (now - start < ns) { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); }
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}
"#;

fn main() {
    socket_child::exit_if_child(run_child);
    common::run_suite(
        "gpu_ipc_handoff",
        &[
            ("lend_orders_both_ways_across_processes", || {
                as_parent(lend_orders_both_ways)
            }),
            ("lend_waits_for_pending_reads_on_other_streams", || {
                as_parent(lend_after_reads)
            }),
            ("share_for_reading_reads_on_both_sides", || {
                as_parent(share_for_reading)
            }),
            ("unsafe_views_write_disjoint_halves_of_a_share", || {
                as_parent(share_writing_halves)
            }),
            ("killed_receiver_returns_the_buffer_with_peer_gone", || {
                as_parent(killed_receiver)
            }),
            ("driver_descriptors_are_close_on_exec", || {
                as_parent(driver_descriptors_are_close_on_exec)
            }),
            ("refused_offer_returns_the_buffer", || {
                as_parent(refused_offer)
            }),
            ("join_times_out_then_joins_again", || {
                as_parent(join_times_out)
            }),
            ("dropped_lend_frees_only_after_the_hand_back", || {
                as_parent(dropped_lend)
            }),
            ("timed_out_give_back_keeps_the_import_for_a_retry", || {
                as_parent(timed_out_give_back)
            }),
        ],
    )
}

/// The values `spin_fill(.., v, ..)` writes.
fn filled(v: u32) -> Vec<u32> {
    (0..N as u32).map(|i| v + i).collect()
}

/// Launches `spin_fill` writing `buf` on `s`: returns at once, the write lands
/// [`SPIN_NS`] later.
fn slow_fill(
    s: &BoundStream<'_>,
    module: &Module,
    buf: &mut (impl gpubind::WritableArg + ?Sized),
    v: u32,
) -> R {
    slow_fill_for(s, module, buf, v, SPIN_NS)
}

/// [`slow_fill`] spinning `spin_ns` nanoseconds.
fn slow_fill_for(
    s: &BoundStream<'_>,
    module: &Module,
    buf: &mut (impl gpubind::WritableArg + ?Sized),
    v: u32,
    spin_ns: u64,
) -> R {
    let f = module.function("spin_fill").ctx("function")?;
    let n = N as u32;
    // SAFETY: (unsigned*, unsigned, unsigned, unsigned long long) as the kernel declares;
    // it writes elements below `n` of `buf`, which holds N.
    unsafe {
        s.launch(&f, LaunchConfig::for_num_elems(n))
            .arg(buf)
            .arg(&n)
            .arg(&v)
            .arg(&spin_ns)
            .launch()
    }
    .ctx("launch spin_fill")
}

/// Spawns this binary as child `role`, accepts its connection and waits until it is
/// ready to receive (bounded waits).
fn spawn_child(role: &str) -> R<(std::process::Child, UnixStream)> {
    spawn_child_with(role, &[])
}

/// [`spawn_child`] with the variables `env`.
fn spawn_child_with(role: &str, env: &[(&str, String)]) -> R<(std::process::Child, UnixStream)> {
    let (proc, conn) = socket_child::spawn_connected("ipc-handoff", role, env, CHILD_WAIT)?;
    let m = ipc::recv_message_timeout(&conn, CHILD_WAIT).ctx("the child's ready")?;
    ensure!(m.bytes == b"ready", "child `{role}` said {:?}", m.bytes);
    Ok((proc, conn))
}

/// Waits for the child (bounded); its stderr as the error if it failed.
fn expect_success(proc: std::process::Child) -> R {
    socket_child::expect_success(proc, CHILD_WAIT)
}

fn options(timeout: Duration) -> TransportOptions {
    TransportOptions::default().timeout(timeout)
}

// --- children -----------------------------------------------------------------------

fn run_child(role: &str) -> R {
    let conn = socket_child::connect_to_parent()?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("device 0")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let module = gpu
        .compile_and_load(SPIN_FILL, "handoff.cu")
        .ctx("compile")?;
    let opts = options(CHILD_WAIT);
    // Everything slow (context, compile) is done: the parent starts its kernel now.
    ipc::send_message(&conn, b"ready", &[]).ctx("send ready")?;
    match role {
        "lend_reader" => {
            let Incoming::Lent(mut lent) =
                ipc::recv_handoff::<u32>(&conn, &s, &opts).ctx("recv_handoff")?
            else {
                return Err("expected a lend".into());
            };
            // The parent's kernel writes ~1 s after the offer left: only the ordering
            // makes this read see it.
            let got = gpu.dtoh(&lent).ctx("dtoh")?;
            ensure!(
                got == filled(0xA100),
                "the receiver read {:?}… before the sender's write",
                &got[..4]
            );
            // A slow write of our own, given back at once: the hand-back waits for it.
            slow_fill(&s, &module, &mut lent, 0xB200)?;
            lent.give_back().ctx("give_back")
        }
        "share_reader" => {
            let Incoming::Shared(shared) =
                ipc::recv_handoff::<u32>(&conn, &s, &opts).ctx("recv_handoff")?
            else {
                return Err("expected a share".into());
            };
            for round in 0..5 {
                let got = gpu.dtoh(&shared).ctx("dtoh")?;
                ensure!(
                    got == filled(0xC300),
                    "read {round}: the receiver read {:?}…",
                    &got[..4]
                );
            }
            // Dropped, not given back: the drop hands it back too.
            drop(shared);
            Ok(())
        }
        "dies_holding" => {
            let Incoming::Lent(mut lent) =
                ipc::recv_handoff::<u32>(&conn, &s, &opts).ctx("recv_handoff")?
            else {
                return Err("expected a lend".into());
            };
            gpu.htod_copy(&filled(0xD400), &mut lent).ctx("htod")?;
            ipc::send_message(&conn, b"written", &[]).ctx("send written")?;
            // Held until the parent kills this process.
            std::thread::sleep(CHILD_WAIT);
            drop(lent);
            Err("the parent did not kill this child".into())
        }
        "lend_writer" => {
            let Incoming::Lent(mut lent) =
                ipc::recv_handoff::<u32>(&conn, &s, &opts).ctx("recv_handoff")?
            else {
                return Err("expected a lend".into());
            };
            // At once: only the ordering keeps this after the parent's pending read.
            gpu.htod_copy(&filled(0xE500), &mut lent).ctx("htod")?;
            lent.give_back().ctx("give_back")
        }
        "second_half_writer" => {
            let Incoming::Shared(mut shared) =
                ipc::recv_handoff::<u32>(&conn, &s, &opts).ctx("recv_handoff")?
            else {
                return Err("expected a share".into());
            };
            // SAFETY: the parent writes only the first half while the buffer is shared,
            // and reads the second only after the hand-back.
            let mut half = unsafe { shared.view_mut(N / 2..) }.ctx("view_mut")?;
            gpu.htod_copy(&filled(0xF600)[N / 2..], &mut half)
                .ctx("htod")?;
            shared.give_back().ctx("give_back")
        }
        "wrong_type" => match ipc::recv_handoff::<u64>(&conn, &s, &opts) {
            Err(Error::TypeMismatch { .. }) => Ok(()),
            other => Err(format!("expected TypeMismatch, got {other:?}")),
        },
        "slow_giver" => {
            let Incoming::Lent(lent) =
                ipc::recv_handoff::<u32>(&conn, &s, &opts).ctx("recv_handoff")?
            else {
                return Err("expected a lend".into());
            };
            std::thread::sleep(Duration::from_secs(3));
            lent.give_back().ctx("give_back")
        }
        "timed_out_giver" => {
            let Incoming::Lent(mut lent) =
                ipc::recv_handoff::<u32>(&conn, &s, &opts).ctx("recv_handoff")?
            else {
                return Err("expected a lend".into());
            };
            // A write that outlasts GPUBIND_DROP_TIMEOUT (1 s, set by the parent).
            slow_fill_for(&s, &module, &mut lent, 0x1BAC, GIVER_SPIN_NS)?;
            let start = Instant::now();
            let mut lent = match lent.give_back() {
                Err(GiveBackError::StillHeld(held)) => {
                    ensure!(
                        matches!(held.error, Error::Timeout { .. }),
                        "StillHeld with {:?}",
                        held.error
                    );
                    held.input
                }
                other => return Err(format!("expected StillHeld, got {other:?}")),
            };
            let refused_after = start.elapsed();
            ensure!(
                refused_after >= Duration::from_millis(900)
                    && refused_after < Duration::from_secs(10),
                "the first give_back returned after {refused_after:?} (limit 1 s)"
            );
            // The import is intact: usable, and given back once the write has landed.
            ensure!(lent.len() == N, "len {}", lent.len());
            let deadline = start + CHILD_WAIT;
            let mut tries = 1;
            loop {
                tries += 1;
                match lent.give_back() {
                    Ok(()) => break,
                    Err(GiveBackError::StillHeld(held)) if Instant::now() < deadline => {
                        lent = held.input;
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    Err(e) => return Err(format!("give_back try {tries}: {e:?}")),
                }
            }
            println!(
                "timed-out give_back: StillHeld after {refused_after:?}, handed back on try \
                 {tries} after {:?}",
                start.elapsed()
            );
            Ok(())
        }
        other => Err(format!("unknown child role {other}")),
    }
}

// --- parents ------------------------------------------------------------------------

struct Setup {
    pool: MemoryPool,
    module: Module,
}

fn setup(gpu: &BoundDevice<'_>) -> R<Setup> {
    Ok(Setup {
        pool: MemoryPool::new(gpu, PoolConfig::default().ipc(true)).ctx("pool")?,
        module: gpu
            .compile_and_load(SPIN_FILL, "handoff.cu")
            .ctx("compile")?,
    })
}

/// Runs the parent test `test` on device 0 with an IPC pool and the spin kernels
/// ([`setup`]) and a stream of its own.
fn as_parent(test: fn(&BoundDevice<'_>, &Setup, &BoundStream<'_>) -> R) -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("device 0")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let t = setup(&gpu)?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    test(&gpu, &t, &s)
}

fn lend_orders_both_ways(gpu: &BoundDevice<'_>, t: &Setup, s: &BoundStream<'_>) -> R {
    let mut buf: PoolSlice<u32> = t.pool.alloc_zeros(s, N).ctx("alloc")?;
    let (child, conn) = spawn_child("lend_reader")?;
    slow_fill(s, &t.module, &mut buf, 0xA100)?;
    let start = Instant::now();
    let lent = buf.lend(s, &conn, &options(CHILD_WAIT)).ctx("lend")?;
    let lend_took = start.elapsed();
    // The lend itself does not wait for the kernel.
    ensure!(
        lend_took < Duration::from_nanos(SPIN_NS),
        "lend waited {lend_took:?} on the host"
    );
    let buf = lent.join().ctx("join")?;
    println!(
        "lend returned after {lend_took:?}; hand-back after {:?}",
        start.elapsed()
    );
    let got = gpu.dtoh(&buf).ctx("dtoh")?;
    ensure!(
        got == filled(0xB200),
        "the sender read {:?}… after the hand-back, not the receiver's write",
        &got[..4]
    );
    expect_success(child)
}

fn lend_after_reads(gpu: &BoundDevice<'_>, t: &Setup, s: &BoundStream<'_>) -> R {
    // The parent's stream lends; `r` reads on another.
    let reader = gpu.new_stream().ctx("stream")?;
    let r = gpu.on(&reader).ctx("on")?;
    let mut buf: PoolSlice<u32> = t.pool.alloc_zeros(s, N).ctx("alloc")?;
    gpu.htod_copy(&filled(0x7700), &mut buf).ctx("htod")?;
    let mut copy = gpu.alloc_zeros::<u32>(N).ctx("alloc copy")?;
    let (child, conn) = spawn_child("lend_writer")?;
    // A slow read of `buf` on another stream than the lend's.
    let f = t.module.function("spin_copy").ctx("function")?;
    let n = N as u32;
    // SAFETY: (const unsigned*, unsigned*, unsigned, unsigned long long) as declared; it
    // reads `buf` and writes `copy` below `n`, both of N elements.
    unsafe {
        r.launch(&f, LaunchConfig::for_num_elems(n))
            .arg(&buf)
            .arg(&mut copy)
            .arg(&n)
            .arg(&SPIN_NS)
            .launch()
    }
    .ctx("launch spin_copy")?;
    let lent = buf.lend(s, &conn, &options(CHILD_WAIT)).ctx("lend")?;
    let buf = lent.join().ctx("join")?;
    let read = gpu.dtoh(&copy).ctx("dtoh copy")?;
    ensure!(
        read == filled(0x7700),
        "the pending read saw {:?}…: the receiver wrote before it finished",
        &read[..4]
    );
    let got = gpu.dtoh(&buf).ctx("dtoh")?;
    ensure!(got == filled(0xE500), "after join: {:?}…", &got[..4]);
    expect_success(child)
}

fn share_for_reading(gpu: &BoundDevice<'_>, t: &Setup, s: &BoundStream<'_>) -> R {
    let mut buf: PoolSlice<u32> = t.pool.alloc_zeros(s, N).ctx("alloc")?;
    let (child, conn) = spawn_child("share_reader")?;
    slow_fill(s, &t.module, &mut buf, 0xC300)?;
    let shared = buf.share(s, &conn, &options(CHILD_WAIT)).ctx("share")?;
    // The sender reads while the receiver does.
    for round in 0..5 {
        let got = gpu.dtoh(&shared).ctx("dtoh while shared")?;
        ensure!(
            got == filled(0xC300),
            "read {round} while shared: {:?}…",
            &got[..4]
        );
    }
    let mut buf = shared.join().ctx("join")?;
    // Back: writable again.
    gpu.htod_copy(&filled(1), &mut buf).ctx("htod after join")?;
    ensure!(gpu.dtoh(&buf).ctx("dtoh")? == filled(1), "write after join");
    expect_success(child)
}

fn share_writing_halves(gpu: &BoundDevice<'_>, t: &Setup, s: &BoundStream<'_>) -> R {
    let buf: PoolSlice<u32> = t.pool.alloc_zeros(s, N).ctx("alloc")?;
    let (child, conn) = spawn_child("second_half_writer")?;
    let mut shared = buf.share(s, &conn, &options(CHILD_WAIT)).ctx("share")?;
    {
        // SAFETY: the child writes only the second half while the buffer is shared,
        // and nobody reads the first half until the hand-back.
        let mut half = unsafe { shared.view_mut(..N / 2) }.ctx("view_mut")?;
        gpu.htod_copy(&filled(0xF600)[..N / 2], &mut half)
            .ctx("htod")?;
    }
    let buf = shared.join().ctx("join")?;
    let got = gpu.dtoh(&buf).ctx("dtoh")?;
    ensure!(
        got == filled(0xF600),
        "halves: first {:?}…, second {:?}…",
        &got[..2],
        &got[N / 2..N / 2 + 2]
    );
    expect_success(child)
}

fn killed_receiver(gpu: &BoundDevice<'_>, t: &Setup, s: &BoundStream<'_>) -> R {
    let buf: PoolSlice<u32> = t.pool.alloc_zeros(s, N).ctx("alloc")?;
    let (mut child, conn) = spawn_child("dies_holding")?;
    let timeout = Duration::from_secs(10);
    let lent = buf.lend(s, &conn, &options(timeout)).ctx("lend")?;
    let m = ipc::recv_message_timeout(&conn, CHILD_WAIT).ctx("child's written")?;
    ensure!(m.bytes == b"written", "child said {:?}", m.bytes);
    child.kill().ctx("SIGKILL the child")?;
    let start = Instant::now();
    let back = match lent.join() {
        Err(JoinError::Returned(failed)) => {
            ensure!(
                failed.error == Error::PeerGone,
                "expected PeerGone, got {:?}",
                failed.error
            );
            failed.buffer
        }
        Err(JoinError::StillOut { error, .. }) => {
            return Err(format!("the buffer stayed out: {error}"));
        }
        Ok(_) => return Err("a killed receiver handed back".into()),
    };
    let took = start.elapsed();
    // join waits at most the timeout for the hand-back and the timeout again for the
    // process's end; the kill makes both immediate.
    let bound = timeout * 2 + Duration::from_secs(5);
    println!("killed receiver: buffer back after {took:?} (bound {bound:?})");
    ensure!(took < bound, "join took {took:?}, more than {bound:?}");
    let _ = child.wait();
    let got = gpu.dtoh(&back).ctx("dtoh")?;
    ensure!(
        got == filled(0xD400),
        "the returned buffer holds {:?}…, not the receiver's last completed write",
        &got[..4]
    );
    Ok(())
}

/// The GPU driver's descriptors (`/dev/nvidia*`) of a process with a context, an IPC
/// pool and a kernel are close-on-exec: a program the receiver of a hand-off starts does
/// not inherit them, so when the receiver's process ends (what its pidfd tells the
/// sender) the driver has torn down its contexts and no work of it still runs on the
/// buffer. (A raw `fork` keeps them: `unsafe`, and CUDA does not support it.)
fn driver_descriptors_are_close_on_exec(
    _gpu: &BoundDevice<'_>,
    t: &Setup,
    s: &BoundStream<'_>,
) -> R {
    let buf: PoolSlice<u32> = t.pool.alloc_zeros(s, N).ctx("alloc")?;
    const O_CLOEXEC: u32 = 0o2000000;
    let (mut checked, mut inherited) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir("/proc/self/fd").ctx("/proc/self/fd")? {
        let fd = entry.ctx("fd entry")?.file_name();
        let Ok(target) = std::fs::read_link(format!("/proc/self/fd/{}", fd.to_string_lossy()))
        else {
            continue; // closed meanwhile (read_dir's own descriptor)
        };
        let target = target.to_string_lossy().into_owned();
        if !target.starts_with("/dev/nvidia") {
            continue;
        }
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.to_string_lossy()))
            .ctx("fdinfo")?;
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
            .ok_or_else(|| format!("no flags in the fdinfo of {target}"))?;
        if flags & O_CLOEXEC == 0 {
            inherited.push(target.clone());
        }
        checked.push(target);
    }
    drop(buf);
    println!(
        "driver descriptors: {} checked, {} without close-on-exec {inherited:?}",
        checked.len(),
        inherited.len()
    );
    ensure!(!checked.is_empty(), "no /dev/nvidia* descriptor found");
    ensure!(
        inherited.is_empty(),
        "driver descriptors a spawned program inherits (so a receiver's death would not \
         prove its work stopped): {inherited:?}"
    );
    Ok(())
}

fn refused_offer(gpu: &BoundDevice<'_>, t: &Setup, s: &BoundStream<'_>) -> R {
    let mut buf: PoolSlice<u32> = t.pool.alloc_zeros(s, N).ctx("alloc")?;
    gpu.htod_copy(&filled(5), &mut buf).ctx("htod")?;
    let (child, conn) = spawn_child("wrong_type")?;
    let lent = buf.lend(s, &conn, &options(CHILD_WAIT)).ctx("lend")?;
    let back = match lent.join() {
        Err(JoinError::Returned(failed)) => {
            ensure!(
                matches!(&failed.error, Error::HandoffRefused { reason } if reason.contains("type")),
                "expected HandoffRefused naming the type, got {:?}",
                failed.error
            );
            failed.buffer
        }
        other => return Err(format!("expected a refusal, got {other:?}")),
    };
    ensure!(gpu.dtoh(&back).ctx("dtoh")? == filled(5), "data changed");
    expect_success(child)
}

fn join_times_out(_gpu: &BoundDevice<'_>, t: &Setup, s: &BoundStream<'_>) -> R {
    let buf: PoolSlice<u32> = t.pool.alloc_zeros(s, N).ctx("alloc")?;
    let (child, conn) = spawn_child("slow_giver")?;
    let lent = buf.lend(s, &conn, &options(CHILD_WAIT)).ctx("lend")?;
    let short = Duration::from_millis(300);
    let start = Instant::now();
    let lent = match lent.join_timeout(short) {
        Err(JoinError::StillOut {
            handoff,
            error: Error::Timeout { .. },
        }) => handoff,
        other => return Err(format!("expected StillOut with Timeout, got {other:?}")),
    };
    let took = start.elapsed();
    println!("join_timeout({short:?}) gave StillOut after {took:?}");
    ensure!(
        took >= short && took < short + Duration::from_secs(5),
        "took {took:?}"
    );
    // A second lend on the same connection is refused while this one is out.
    let other: PoolSlice<u32> = t.pool.alloc_zeros(s, N).ctx("alloc")?;
    match other.lend(s, &conn, &options(CHILD_WAIT)) {
        Err(f) if matches!(f.error, Error::InvalidArgument(_)) => {}
        other => return Err(format!("a second lend on one connection: {other:?}")),
    }
    lent.join().ctx("second join")?;
    expect_success(child)
}

fn dropped_lend(_gpu: &BoundDevice<'_>, t: &Setup, s: &BoundStream<'_>) -> R {
    let used = || t.pool.usage().map(|u| u.used_current).ctx("pool usage");
    let before = used()?;
    let buf: PoolSlice<u32> = t.pool.alloc_zeros(s, N).ctx("alloc")?;
    ensure!(used()? > before, "the allocation is not counted");
    // The child holds the buffer 3 s, then gives it back.
    let (child, conn) = spawn_child("slow_giver")?;
    let lent = buf.lend(s, &conn, &options(CHILD_WAIT)).ctx("lend")?;
    let start = Instant::now();
    drop(lent);
    std::thread::sleep(Duration::from_secs(1));
    ensure!(
        used()? > before,
        "the dropped lend freed the buffer while the child held it"
    );
    let deadline = start + Duration::from_secs(30);
    while used()? > before {
        ensure!(
            Instant::now() < deadline,
            "the parked buffer was not freed after the hand-back"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let freed_after = start.elapsed();
    println!("dropped lend: buffer freed {freed_after:?} after the drop (child held it 3 s)");
    ensure!(
        freed_after >= Duration::from_secs(2),
        "freed after {freed_after:?}, before the child's hand-back"
    );
    expect_success(child)
}

fn timed_out_give_back(gpu: &BoundDevice<'_>, t: &Setup, s: &BoundStream<'_>) -> R {
    let buf: PoolSlice<u32> = t.pool.alloc_zeros(s, N).ctx("alloc")?;
    let (child, conn) =
        spawn_child_with("timed_out_giver", &[("GPUBIND_DROP_TIMEOUT", "1".into())])?;
    let start = Instant::now();
    let lent = buf.lend(s, &conn, &options(CHILD_WAIT)).ctx("lend")?;
    let buf = lent.join().ctx("join")?;
    let took = start.elapsed();
    println!("timed-out give_back: the sender's join returned after {took:?}");
    ensure!(
        took >= Duration::from_nanos(GIVER_SPIN_NS) - Duration::from_millis(100),
        "joined after {took:?}, before the receiver's {GIVER_SPIN_NS} ns write ended"
    );
    let got = gpu.dtoh(&buf).ctx("dtoh")?;
    ensure!(
        got == filled(0x1BAC),
        "the sender read {:?}… after the hand-back, not the receiver's write",
        &got[..4]
    );
    expect_success(child)
}
