//! GPU tests of `gpubind::ipc`: pools and buffers shared with child processes.
//!
//! Children are re-executions of this binary with `GPUBIND_CHILD=<role>` and
//! `GPUBIND_IPC_SOCKET=<path>` (a Unix socket the parent listens on). Every child answers
//! `done` only after it dropped its imports, and exits 0 on success; on failure it
//! prints the reason on stderr, which the parent reports.
//!
//! Run: `cargo test --test gpu_ipc` (one SKIPPED line without a GPU).

mod common;

use common::Ctx;
use common::socket_child::{self, stderr_of};
use gpubind::cudarc::driver::sys;
use gpubind::ipc::{self, ImportedPool, MemoryPool, PoolConfig, PoolSlice};
use gpubind::ipc::{BufferHandle, LegacyIpcHandle, PoolHandle};
use gpubind::{BoundDevice, BoundStream, Device, DeviceMemory, Error, LaunchConfig, ThreadContext};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

type R<T = ()> = Result<T, String>;

const CHILD_WAIT: Duration = Duration::from_secs(120);
const REWRITE: u64 = 0x9e37_79b9_7f4a_7c15;

fn main() {
    socket_child::exit_if_child(run_child);
    common::run_suite(
        "gpu_ipc",
        &[
            ("pool_roundtrip_child_verifies_and_writes", pool_roundtrip),
            ("many_buffers_from_one_pool", many_buffers),
            ("worker_pool_of_four_children", worker_pool),
            ("killed_child_leaves_parent_usable", killed_child),
            ("legacy_handle_roundtrip", legacy_roundtrip),
            ("corrupt_and_stale_handles_fail_cleanly", corrupt_handles),
            ("non_ipc_pool_unknown_device_missing_fd", local_errors),
            ("pool_attributes", pool_attributes),
            (
                "every_allocation_size_exports",
                every_allocation_size_exports,
            ),
            (
                "pool_slices_work_with_core_copies_and_kernels",
                core_interop,
            ),
            ("multi_device_buffers_both_orders", multi_device),
            ("importer_closes_after_exporter_died", exporter_dies_first),
            ("same_process_import_is_refused", same_process_import),
            (
                "double_import_refused_until_dropped_and_inflated_length",
                double_import,
            ),
        ],
    )
}

// ---------------------------------------------------------------- helpers

/// Deterministic pseudo-random data: parent and child derive the same from a seed.
fn pattern(seed: u64, len: usize) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random()).collect()
}

/// A parent-side handle on one child process and its connection.
struct ChildProc {
    role: String,
    proc: std::process::Child,
    conn: UnixStream,
}

/// Spawns this binary as child `role` (with the variables `env`) and accepts its
/// connection (bounded wait).
fn spawn_child(role: &str, env: &[(&str, String)]) -> R<ChildProc> {
    let (proc, conn) = socket_child::spawn_connected("ipc", role, env, CHILD_WAIT)?;
    Ok(ChildProc {
        role: role.to_owned(),
        proc,
        conn,
    })
}

impl ChildProc {
    /// Waits for the child's `done`, then for a zero exit status.
    fn expect_done(mut self) -> R {
        let reply = ipc::recv_message_timeout(&self.conn, CHILD_WAIT);
        let status = self.wait()?;
        let err = stderr_of(&mut self.proc);
        match reply {
            Ok(m) if m.bytes == b"done" && status.success() => Ok(()),
            Ok(m) => Err(format!(
                "child `{}` answered {:?} and exited {status}: {err}",
                self.role,
                String::from_utf8_lossy(&m.bytes)
            )),
            Err(e) => Err(format!(
                "child `{}`: no answer ({e}); exited {status}: {err}",
                self.role
            )),
        }
    }

    fn wait(&mut self) -> R<std::process::ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(s) = self.proc.try_wait().ctx("try_wait")? {
                return Ok(s);
            }
            if start.elapsed() > CHILD_WAIT {
                let _ = self.proc.kill();
                return self.proc.wait().ctx("wait after kill");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn send_json(conn: &UnixStream, v: &Value) -> R {
    ipc::send_message(conn, v.to_string().as_bytes(), &[]).ctx("send control message")
}

fn recv_json(conn: &UnixStream) -> R<Value> {
    let m = ipc::recv_message(conn).ctx("receive control message")?;
    serde_json::from_slice(&m.bytes).ctx("parse control message")
}

fn done(conn: &UnixStream) -> R {
    ipc::send_message(conn, b"done", &[]).ctx("send done")
}

/// The thread's current context (null if none), straight from the driver.
fn current_context() -> R<sys::CUcontext> {
    let mut c: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one handle; needs no context.
    let r = unsafe { sys::cuCtxGetCurrent(&mut c) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuCtxGetCurrent: {r:?}"));
    }
    Ok(c)
}

fn u64_of(v: &Value, key: &str) -> R<u64> {
    v[key]
        .as_u64()
        .ok_or_else(|| format!("control message lacks `{key}`: {v}"))
}

/// Re-serializes a handle through serde_json with one field changed (the serde form
/// has no checksum, so this reaches the import checks and the driver).
fn tamper<T: serde::Serialize + serde::de::DeserializeOwned>(
    h: &T,
    key: &str,
    value: Value,
) -> R<T> {
    let mut v = serde_json::to_value(h).ctx("to_value")?;
    v[key] = value;
    serde_json::from_value(v).ctx("from_value")
}

fn flipped_hex(h: &BufferHandle) -> String {
    h.export_data()
        .iter()
        .map(|b| format!("{:02x}", b ^ 0xff))
        .collect()
}

// ---------------------------------------------------------------- children

fn run_child(role: &str) -> R {
    let conn = socket_child::connect_to_parent()?;
    match role {
        "roundtrip" => child_roundtrip(&conn),
        "many" => child_many(&conn),
        "worker" => child_worker(&conn),
        "hang" => child_hang(&conn),
        "legacy" => child_legacy(&conn),
        "corrupt" => child_corrupt(&conn),
        "multi" => child_multi(&conn),
        "exporter" => child_exporter(&conn),
        "late" => child_late_importer(&conn),
        "selfimport" => child_self_import(&conn),
        "double" => child_double(&conn),
        other => Err(format!("unknown child role {other}")),
    }
}

/// Imports one pool + one u32 buffer, checks `pattern(seed)`, writes `pattern(seed ^
/// REWRITE)`. Imports run with no current context and leave none behind.
fn child_roundtrip(conn: &UnixStream) -> R {
    let (mut pools, buffers) = ipc::recv_handles(conn).ctx("recv_handles")?;
    let seed = u64_of(&recv_json(conn)?, "seed")?;
    ensure!(
        pools.len() == 1 && buffers.len() == 1,
        "expected 1 pool + 1 buffer"
    );
    ensure!(
        current_context()?.is_null(),
        "a context was current before import"
    );
    let pool = ImportedPool::import(pools.remove(0)).ctx("import pool")?;
    let mut buf = pool
        .import_buffer::<u32>(&buffers[0])
        .ctx("import buffer")?;
    ensure!(
        current_context()?.is_null(),
        "import left a context current on the thread"
    );
    ensure!(
        matches!(
            pool.import_buffer::<f32>(&buffers[0]),
            Err(Error::TypeMismatch { .. })
        ),
        "importing u32 data as f32 must be a TypeMismatch"
    );
    ensure!(buf.pool_id() == pool.id(), "pool id of imported slice");
    drop(pool); // the slice keeps the imported pool alive
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(buf.device()).ctx("bind")?;
    let got = gpu.dtoh(&buf).ctx("dtoh imported")?;
    ensure!(got == pattern(seed, buf.len()), "child read wrong data");
    gpu.htod_copy(&pattern(seed ^ REWRITE, buf.len()), &mut buf)
        .ctx("htod imported")?;
    gpu.synchronize().ctx("sync")?;
    // SAFETY: only compared and asked about below, after the slice is gone.
    let addr = unsafe { buf.raw_ptr() };
    ensure!(
        mapped(addr),
        "the imported buffer is not mapped while alive"
    );
    drop(buf);
    // The drop unmapped it in this process (cuMemFree), whatever the exporter does.
    ensure!(
        !mapped(addr),
        "the imported buffer is still mapped after its drop"
    );
    done(conn)
}

/// Whether `addr` lies in an allocation mapped in the current context
/// (`cuMemGetAddressRange` succeeds).
fn mapped(addr: sys::CUdeviceptr) -> bool {
    let (mut base, mut size) = (0, 0);
    // SAFETY: writes one address and one size; any address may be asked about.
    (unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, addr) })
        == sys::CUresult::CUDA_SUCCESS
}

fn child_many(conn: &UnixStream) -> R {
    let (mut pools, buffers) = ipc::recv_handles(conn).ctx("recv_handles")?;
    let seed = u64_of(&recv_json(conn)?, "seed")?;
    ensure!(pools.len() == 1, "expected one pool");
    let dup = pools[0].try_clone().ctx("dup pool handle")?;
    let pool = ImportedPool::import(pools.remove(0)).ctx("import pool")?;
    // Importing the same pool again gives the same pool, imported once.
    let again = ImportedPool::import(dup).ctx("import pool again")?;
    ensure!(again.same_pool(&pool), "a second import made a second pool");
    let mut slices = Vec::new();
    for (i, h) in buffers.iter().enumerate() {
        let from = if i % 2 == 0 { &pool } else { &again };
        slices.push(
            from.import_buffer::<u32>(h)
                .ctx(&format!("import buffer {i}"))?,
        );
    }
    drop(again);
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(pool.device()).ctx("bind")?;
    for (i, s) in slices.iter_mut().enumerate() {
        let s_seed = seed + i as u64;
        ensure!(
            gpu.dtoh(&*s).ctx("dtoh")? == pattern(s_seed, s.len()),
            "buffer {i} has wrong data"
        );
        gpu.htod_copy(&pattern(s_seed ^ REWRITE, s.len()), s)
            .ctx("htod")?;
    }
    gpu.synchronize().ctx("sync")?;
    drop(slices);
    done(conn)
}

/// Checks and rewrites its own chunk `start..end` of the one shared buffer.
fn child_worker(conn: &UnixStream) -> R {
    let (mut pools, buffers) = ipc::recv_handles(conn).ctx("recv_handles")?;
    let job = recv_json(conn)?;
    let (seed, rank) = (u64_of(&job, "seed")?, u64_of(&job, "rank")? as u32);
    let (start, end) = (
        u64_of(&job, "start")? as usize,
        u64_of(&job, "end")? as usize,
    );
    let pool = ImportedPool::import(pools.remove(0)).ctx("import pool")?;
    let mut buf = pool
        .import_buffer::<u32>(&buffers[0])
        .ctx("import buffer")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(pool.device()).ctx("bind")?;
    let all = pattern(seed, buf.len());
    let mut chunk = buf.slice_mut(start..end).ctx("chunk")?;
    ensure!(
        gpu.dtoh(&chunk).ctx("dtoh chunk")? == all[start..end],
        "worker {rank}: wrong initial chunk"
    );
    let new: Vec<u32> = all[start..end]
        .iter()
        .map(|x| x.wrapping_add(rank))
        .collect();
    gpu.htod_copy(&new, &mut chunk).ctx("htod chunk")?;
    gpu.synchronize().ctx("sync")?;
    drop(buf);
    done(conn)
}

/// Imports, reports `imported`, then waits to be killed.
fn child_hang(conn: &UnixStream) -> R {
    let (mut pools, buffers) = ipc::recv_handles(conn).ctx("recv_handles")?;
    let pool = ImportedPool::import(pools.remove(0)).ctx("import pool")?;
    let buf = pool
        .import_buffer::<u32>(&buffers[0])
        .ctx("import buffer")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(pool.device()).ctx("bind")?;
    gpu.dtoh(&buf).ctx("dtoh")?;
    ipc::send_message(conn, b"imported", &[]).ctx("send imported")?;
    std::thread::sleep(CHILD_WAIT);
    Err("was not killed".into())
}

fn child_legacy(conn: &UnixStream) -> R {
    let good = LegacyIpcHandle::from_bytes(&ipc::recv_message(conn).ctx("recv good")?.bytes)
        .ctx("parse good handle")?;
    let bad = LegacyIpcHandle::from_bytes(&ipc::recv_message(conn).ctx("recv bad")?.bytes)
        .ctx("parse bad handle")?;
    let seed = u64_of(&recv_json(conn)?, "seed")?;
    ensure!(
        bad.open::<u32>().is_err(),
        "a legacy handle with flipped bytes opened"
    );
    ensure!(
        matches!(good.open::<i16>(), Err(Error::TypeMismatch { .. })),
        "legacy open with the wrong type must be a TypeMismatch"
    );
    ensure!(
        current_context()?.is_null(),
        "legacy open left a context current"
    );
    let mut buf = good.open::<u32>().ctx("open legacy handle")?;
    // The driver would hand back the same (reference-counted) mapping: a second live
    // LegacySlice of it would alias the first.
    match good.open::<u32>() {
        Err(Error::AlreadyImported { .. }) => {}
        other => {
            return Err(format!(
                "second open of a live legacy handle: expected AlreadyImported, got {other:?}"
            ));
        }
    }
    // Memory opened from another process is not ours to export again.
    match LegacyIpcHandle::export(&*buf) {
        Err(Error::NotLegacyExportable { .. }) => {}
        other => {
            return Err(format!(
                "legacy export of a LegacySlice: expected NotLegacyExportable, got {other:?}"
            ));
        }
    }
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(buf.device()).ctx("bind")?;
    ensure!(
        gpu.dtoh(&buf).ctx("dtoh")? == pattern(seed, buf.len()),
        "legacy child read wrong data"
    );
    gpu.htod_copy(&pattern(seed ^ REWRITE, buf.len()), &mut buf)
        .ctx("htod")?;
    gpu.synchronize().ctx("sync")?;
    drop(buf);
    // Once the first slice is gone, the handle opens again.
    let again = good
        .open::<u32>()
        .ctx("open again after the first slice dropped")?;
    ensure!(
        gpu.dtoh(&again).ctx("dtoh again")? == pattern(seed ^ REWRITE, again.len()),
        "reopened legacy slice reads wrong data"
    );
    drop(again);
    done(conn)
}

/// Gets pools [good, stale] and buffers [good, flipped, inflated, stale]; every bad one
/// must fail with a typed error, and the good one must still work afterwards.
fn child_corrupt(conn: &UnixStream) -> R {
    let (pools, buffers) = ipc::recv_handles(conn).ctx("recv_handles")?;
    let seed = u64_of(&recv_json(conn)?, "seed")?;
    ensure!(
        pools.len() == 2 && buffers.len() == 4,
        "expected 2 pools + 4 buffers"
    );
    let mut pools = pools.into_iter();
    let good_pool = ImportedPool::import(pools.next().unwrap()).ctx("import good pool")?;
    let [good, flipped, inflated, stale] = &buffers[..] else {
        return Err("expected 4 buffer handles".into());
    };
    match good_pool.import_buffer::<u32>(flipped) {
        Err(Error::Driver { .. }) | Err(Error::CorruptHandle { .. }) => {}
        other => {
            return Err(format!(
                "flipped export data: expected an error, got {other:?}"
            ));
        }
    }
    match good_pool.import_buffer::<u32>(inflated) {
        Err(Error::CorruptHandle { .. }) => {}
        other => {
            return Err(format!(
                "inflated length: expected CorruptHandle, got {other:?}"
            ));
        }
    }
    match good_pool.import_buffer::<u32>(stale) {
        Err(Error::InvalidArgument(_)) => {}
        other => {
            return Err(format!(
                "buffer of another pool: expected InvalidArgument, got {other:?}"
            ));
        }
    }
    // The destroyed pool. The descriptor that travelled keeps the driver's pool object
    // alive, and the driver (580, H200) then maps even a freed allocation of it: gpubind
    // cannot tell such a handle from a live one (docs/ipc.md, "Limits"). What must hold:
    // whatever the driver answers is a typed result, and dropping it is clean.
    match ImportedPool::import(pools.next().unwrap()) {
        Err(e) => eprintln!("child: destroyed pool refused: {e}"),
        Ok(stale_pool) => match stale_pool.import_buffer::<u32>(stale) {
            Err(e) => eprintln!("child: freed buffer refused: {e}"),
            Ok(s) => {
                eprintln!("child: the driver mapped a freed buffer of a destroyed pool ({s:?})");
                drop(s);
            }
        },
    }
    let buf = good_pool
        .import_buffer::<u32>(good)
        .ctx("good import after failures")?;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(buf.device()).ctx("bind")?;
    ensure!(
        gpu.dtoh(&buf).ctx("dtoh")? == pattern(seed, buf.len()),
        "good buffer has wrong data after failed imports"
    );
    drop(buf);
    done(conn)
}

/// Receives pools/buffers of several devices (in the order sent); each must map on the
/// device with its UUID. Checks `pattern(seed + i)`, writes `pattern((seed + i) ^ REWRITE)`.
fn child_multi(conn: &UnixStream) -> R {
    let (pools, buffers) = ipc::recv_handles(conn).ctx("recv_handles")?;
    let job = recv_json(conn)?;
    let seeds: Vec<u64> = job["seeds"]
        .as_array()
        .ok_or("no seeds")?
        .iter()
        .map(|v| v.as_u64().unwrap_or(0))
        .collect();
    ensure!(
        pools.len() == buffers.len() && seeds.len() == buffers.len(),
        "mismatched counts"
    );
    let mut imported = Vec::new();
    for (p, b) in pools.into_iter().zip(&buffers) {
        let uuid = p.device_uuid();
        let pool = ImportedPool::import(p).ctx("import pool")?;
        ensure!(
            pool.device().uuid() == uuid,
            "pool for {uuid} mapped on {}",
            pool.device().uuid()
        );
        imported.push(pool.import_buffer::<u32>(b).ctx("import buffer")?);
    }
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    for (i, buf) in imported.iter_mut().enumerate() {
        let gpu = ctx.bind(buf.device()).ctx("bind")?;
        ensure!(
            gpu.dtoh(&*buf).ctx("dtoh")? == pattern(seeds[i], buf.len()),
            "buffer {i} (device {}) has wrong data",
            buf.device().uuid()
        );
        gpu.htod_copy(&pattern(seeds[i] ^ REWRITE, buf.len()), buf)
            .ctx("htod")?;
        gpu.synchronize().ctx("sync")?;
    }
    // A buffer used under another device's binding is a WrongDevice error.
    if imported.len() >= 2 && imported[0].device().uuid() != imported[1].device().uuid() {
        let gpu = ctx.bind(imported[1].device()).ctx("bind")?;
        ensure!(
            matches!(gpu.dtoh(&imported[0]), Err(Error::WrongDevice { .. })),
            "reading device A's buffer under device B must be WrongDevice"
        );
    }
    drop(imported);
    done(conn)
}

/// An exporting child: allocates `pattern(seed)` from an IPC pool, sends the handles to
/// the parent, and on `exit` leaves at once, without dropping anything (as if it died).
fn child_exporter(conn: &UnixStream) -> R {
    let job = recv_json(conn)?;
    let (seed, n) = (u64_of(&job, "seed")?, u64_of(&job, "n")? as usize);
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("device 0")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let pool = MemoryPool::new(&gpu, PoolConfig::default().ipc(true)).ctx("pool")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let mut buf = pool
        .alloc_zeros::<u32>(&gpu.on(&stream).ctx("on")?, n)
        .ctx("alloc")?;
    gpu.htod_copy(&pattern(seed, n), &mut buf).ctx("htod")?;
    ipc::send_handles(
        conn,
        &[pool.export().ctx("export pool")?],
        &[buf.export().ctx("export buffer")?],
    )
    .ctx("send_handles")?;
    let m = ipc::recv_message_timeout(conn, CHILD_WAIT).ctx("wait for exit")?;
    ensure!(m.bytes == b"exit", "exporter got {:?}", m.bytes);
    std::process::exit(0); // no destructors: the pool and buffer are never freed here
}

/// Imports what the (other) exporting child made, checks it, then, after the exporter
/// is gone, drops its imports: that must neither crash nor hang.
fn child_late_importer(conn: &UnixStream) -> R {
    let (mut pools, buffers) = ipc::recv_handles(conn).ctx("recv_handles")?;
    let seed = u64_of(&recv_json(conn)?, "seed")?;
    let pool = ImportedPool::import(pools.remove(0)).ctx("import pool")?;
    let buf = pool
        .import_buffer::<u32>(&buffers[0])
        .ctx("import buffer")?;
    {
        let mut ctx = ThreadContext::acquire().ctx("acquire")?;
        let gpu = ctx.bind(pool.device()).ctx("bind")?;
        ensure!(
            gpu.dtoh(&buf).ctx("dtoh")? == pattern(seed, buf.len()),
            "data relayed through the parent is wrong"
        );
    }
    ipc::send_message(conn, b"imported", &[]).ctx("send imported")?;
    let m = ipc::recv_message_timeout(conn, CHILD_WAIT).ctx("wait for go")?;
    ensure!(m.bytes == b"go", "importer got {:?}", m.bytes);
    drop(pool);
    drop(buf);
    done(conn)
}

/// Same-process imports, all in this child (so that a driver that misbehaves takes down
/// only the child): importing its own pool (by its handle, and by a handle whose id was
/// rewritten) and opening its own legacy handle must never give a second owner of its
/// memory; legacy export of a pool slice is refused.
fn child_self_import(conn: &UnixStream) -> R {
    let seed: u64 = rand::random();
    let n = 10_000;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("device 0")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let pool = MemoryPool::new(&gpu, PoolConfig::default().ipc(true)).ctx("pool")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let mut buf = pool.alloc_zeros::<u32>(&s, n).ctx("alloc")?;
    gpu.htod_copy(&pattern(seed, n), &mut buf).ctx("htod")?;
    let bh = buf.export().ctx("export buffer")?;

    // 1. The pool's own handle.
    match ImportedPool::import(pool.export().ctx("export pool")?) {
        Err(Error::SameProcessImport { .. }) => {}
        Err(e) => {
            return Err(format!(
                "own pool import: expected SameProcessImport, got {e}"
            ));
        }
        Ok(p) => {
            // Do not drop it: it may be our own pool a second time.
            std::mem::forget(p);
            return Err("own pool import succeeded".into());
        }
    }
    // Also through a second clone of the pool and after more allocations.
    let clone = pool.clone();
    let other = pool.alloc_zeros::<u8>(&s, 123).ctx("alloc 2")?;
    ensure!(
        matches!(
            ImportedPool::import(clone.export().ctx("export clone")?),
            Err(Error::SameProcessImport { .. })
        ),
        "own pool import through a clone was not SameProcessImport"
    );
    drop(other);

    // 2. The pool's descriptor with a rewritten id (plain serde data). Whatever the
    //    driver does with our own descriptor, no second owner of `buf` may come out.
    let forged_id = json!("11".repeat(16));
    let mut honest = pool.export().ctx("export pool")?;
    let fd = honest
        .take_fd()
        .ok_or("exported pool handle has no descriptor")?;
    let forged_pool: PoolHandle = tamper(&honest, "pool_id", forged_id.clone())?;
    let forged_pool = forged_pool.with_fd(fd);
    let forged_buf: BufferHandle = tamper(&bh, "pool_id", forged_id)?;
    match ImportedPool::import(forged_pool) {
        Err(e) => eprintln!("child: forged-id import of our own pool refused: {e}"),
        Ok(p) => match p.import_buffer::<u32>(&forged_buf) {
            Err(e) => eprintln!("child: forged-id buffer import refused: {e}"),
            Ok(alias) if alias.device_ptr() == buf.device_ptr() => {
                std::mem::forget(alias); // dropping it would free `buf`'s memory
                return Err(format!(
                    "a forged-id import of our own buffer aliases it at {:#x}",
                    buf.device_ptr()
                ));
            }
            Ok(distinct) => {
                eprintln!(
                    "child: forged-id import gave a distinct mapping ({:#x} vs {:#x})",
                    distinct.device_ptr(),
                    buf.device_ptr()
                );
                drop(distinct);
            }
        },
    }

    // 3. Legacy: our own handle is refused before the driver is asked.
    let plain = gpu.clone_htod(&pattern(seed, n)).ctx("clone_htod")?;
    let lh = LegacyIpcHandle::export(&plain).ctx("legacy export of a plain slice")?;
    match lh.open::<u32>() {
        Err(Error::SameProcessImport { .. }) => {}
        Err(e) => {
            return Err(format!(
                "own legacy open: expected SameProcessImport, got {e}"
            ));
        }
        Ok(l) => {
            std::mem::forget(l);
            return Err("own legacy handle opened in the exporting process".into());
        }
    }
    // Through its sealed bytes too (a copy is the same handle).
    let copy = LegacyIpcHandle::from_bytes(&lh.to_bytes().ctx("bytes")?).ctx("from_bytes")?;
    ensure!(
        matches!(copy.open::<u32>(), Err(Error::SameProcessImport { .. })),
        "own legacy handle (from bytes) was not SameProcessImport"
    );

    // 4. Legacy export of pool memory (reached through PoolSlice's deref) is refused.
    match LegacyIpcHandle::export(&*buf) {
        Err(Error::NotLegacyExportable { .. }) => {}
        other => {
            return Err(format!(
                "legacy export of a pool slice: expected NotLegacyExportable, got {other:?}"
            ));
        }
    }

    // Everything of ours is intact.
    ensure!(
        gpu.dtoh(&buf).ctx("dtoh")? == pattern(seed, n),
        "own pool buffer changed"
    );
    ensure!(
        gpu.dtoh(&plain).ctx("dtoh")? == pattern(seed, n),
        "own plain buffer changed"
    );
    drop(buf);
    drop(pool);
    drop(clone);
    done(conn)
}

/// `cuMemGetAddressRange` of `ptr`: bytes from `ptr` to the end of its allocation, as
/// the driver reports it. Needs a context of the allocation's device current.
fn mapped_bytes_from(ptr: sys::CUdeviceptr) -> R<u64> {
    let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
    // SAFETY: writes one address and one size_t into our locals; the driver validates
    // `ptr`.
    let r = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuMemGetAddressRange_v2: {r:?}"));
    }
    Ok(base + size as u64 - ptr)
}

/// A process that has an IPC pool of its own imports one buffer: a second live import
/// of it (same pool value, the pool imported again, or a rewritten length) is
/// `AlreadyImported`; after the first slice drops it imports again; an imported slice
/// cannot be exported as a legacy handle; a length one element beyond what the driver
/// maps is `CorruptHandle`. Answers `{ "mapped": bytes }`, then `done`.
fn child_double(conn: &UnixStream) -> R {
    let (mut pools, buffers) = ipc::recv_handles(conn).ctx("recv_handles")?;
    let seed = u64_of(&recv_json(conn)?, "seed")?;
    ensure!(
        pools.len() == 1 && buffers.len() == 1,
        "expected 1 pool + 1 buffer"
    );
    let handle = &buffers[0];
    let n = handle.len();
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    // An IPC pool of our own, alive during the imports (the import path then also asks
    // the driver which pool each imported buffer belongs to).
    let dev0 = Device::get(0).ctx("device 0")?;
    let (own_pool, own_buf) = {
        let gpu = ctx.bind(&dev0).ctx("bind device 0")?;
        let p = MemoryPool::new(&gpu, PoolConfig::default().ipc(true)).ctx("own pool")?;
        let stream = gpu.new_stream().ctx("stream")?;
        let b = p
            .alloc_zeros::<u32>(&gpu.on(&stream).ctx("on")?, 1000)
            .ctx("own alloc")?;
        (p, b)
    };
    let dup = pools[0].try_clone().ctx("dup pool handle")?;
    let pool = ImportedPool::import(pools.remove(0)).ctx("import pool")?;
    let first = pool.import_buffer::<u32>(handle).ctx("first import")?;
    let expect_already = |what: &str, r: Result<gpubind::ipc::ImportedSlice<u32>, Error>| match r {
        Err(Error::AlreadyImported { .. }) => Ok(()),
        other => Err(format!("{what}: expected AlreadyImported, got {other:?}")),
    };
    expect_already("same handle again", pool.import_buffer::<u32>(handle))?;
    let again = ImportedPool::import(dup).ctx("import pool again")?;
    ensure!(again.same_pool(&pool), "a second import made a second pool");
    expect_already(
        "through the pool imported again",
        again.import_buffer::<u32>(handle),
    )?;
    let shorter: BufferHandle = tamper(handle, "len", json!(n as u64 - 1))?;
    expect_already(
        "the same export data with a shorter length",
        pool.import_buffer::<u32>(&shorter),
    )?;

    let gpu = ctx.bind(pool.device()).ctx("bind")?;
    ensure!(
        gpu.dtoh(&first).ctx("dtoh first")? == pattern(seed, n),
        "first import reads wrong data"
    );
    let mapped = mapped_bytes_from(first.device_ptr())?;
    ensure!(
        mapped >= (n * 4) as u64,
        "the driver maps {mapped} bytes for a buffer of {} bytes",
        n * 4
    );
    match LegacyIpcHandle::export(&*first) {
        Err(Error::NotLegacyExportable { .. }) => {}
        other => {
            return Err(format!(
                "legacy export of an ImportedSlice: expected NotLegacyExportable, got {other:?}"
            ));
        }
    }
    drop(first);
    let second = pool
        .import_buffer::<u32>(handle)
        .ctx("import again after the first slice dropped")?;
    ensure!(
        gpu.dtoh(&second).ctx("dtoh second")? == pattern(seed, n),
        "second import reads wrong data"
    );
    drop(second);

    // One element beyond what the driver maps (not just beyond the exporter's length:
    // the pool may round allocations up).
    let over = mapped / 4 + 1;
    let inflated: BufferHandle = tamper(handle, "len", json!(over))?;
    match pool.import_buffer::<u32>(&inflated) {
        Err(Error::CorruptHandle { .. }) => {}
        Ok(s) => {
            return Err(format!(
                "a length of {over} u32 ({} bytes, {mapped} mapped) was accepted: {s:?}",
                over * 4
            ));
        }
        Err(e) => {
            return Err(format!(
                "inflated by one element: expected CorruptHandle, got {e}"
            ));
        }
    }
    // The refused import left nothing behind: the good handle imports again.
    let third = pool
        .import_buffer::<u32>(handle)
        .ctx("import after the refused one")?;
    drop(third);
    drop(again);
    drop(pool);
    drop(own_buf);
    drop(own_pool);
    send_json(conn, &json!({ "mapped": mapped }))?;
    done(conn)
}

// ---------------------------------------------------------------- parent tests

/// Device 0 bound, an IPC pool on it and a stream: what most parent tests start with.
fn with_ipc_pool(f: impl FnOnce(&BoundDevice<'_>, &MemoryPool, &BoundStream<'_>) -> R) -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("device 0")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let pool = MemoryPool::new(&gpu, PoolConfig::default().ipc(true)).ctx("pool")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    f(&gpu, &pool, &s)
}

/// `n` elements of `pattern(seed)` allocated from `pool`.
fn filled(
    gpu: &BoundDevice<'_>,
    pool: &MemoryPool,
    s: &BoundStream<'_>,
    seed: u64,
    n: usize,
) -> R<PoolSlice<u32>> {
    let mut buf = pool.alloc_zeros::<u32>(s, n).ctx("alloc")?;
    ensure!(
        gpu.dtoh(&buf).ctx("dtoh")?.iter().all(|&x| x == 0),
        "alloc_zeros did not zero"
    );
    gpu.htod_copy(&pattern(seed, n), &mut buf).ctx("htod")?;
    Ok(buf)
}

/// Hands `pool` and `buf` (holding `pattern(seed)`) to a new `roundtrip` child and
/// checks that the parent sees the child's rewrite.
fn roundtrip_via_child(
    gpu: &BoundDevice<'_>,
    pool: &MemoryPool,
    buf: &PoolSlice<u32>,
    seed: u64,
) -> R {
    let child = spawn_child("roundtrip", &[])?;
    ipc::send_handles(
        &child.conn,
        &[pool.export().ctx("export pool")?],
        &[buf.export().ctx("export buffer")?],
    )
    .ctx("send_handles")?;
    send_json(&child.conn, &json!({ "seed": seed }))?;
    child.expect_done()?;
    ensure!(
        gpu.dtoh(buf).ctx("dtoh after child")? == pattern(seed ^ REWRITE, buf.len()),
        "parent does not see the child's writes"
    );
    Ok(())
}

fn pool_roundtrip() -> R {
    with_ipc_pool(|gpu, pool, s| {
        let seed: u64 = rand::random();
        let n = (1 << 20) + rand::rng().random_range(1..4096);
        let buf = filled(gpu, pool, s, seed, n)?;
        roundtrip_via_child(gpu, pool, &buf, seed)
    })
}

fn many_buffers() -> R {
    with_ipc_pool(|gpu, pool, s| {
        let seed: u64 = rand::random::<u64>() >> 8;
        let mut rng = rand::rng();
        let mut bufs = Vec::new();
        let mut total = 0u64;
        for i in 0..32u64 {
            let n = rng.random_range(1..70_000);
            bufs.push(filled(gpu, pool, s, seed + i, n)?);
            total += (n * 4) as u64;
        }
        let usage = pool.usage().ctx("usage")?;
        ensure!(
            usage.used_current >= total && usage.reserved_current >= usage.used_current,
            "usage {usage:?} does not cover {total} bytes in use"
        );
        let handles: Vec<BufferHandle> = bufs
            .iter()
            .map(|b| b.export())
            .collect::<Result<_, _>>()
            .ctx("export")?;
        let child = spawn_child("many", &[])?;
        ipc::send_handles(&child.conn, &[pool.export().ctx("export pool")?], &handles)
            .ctx("send_handles")?;
        send_json(&child.conn, &json!({ "seed": seed }))?;
        child.expect_done()?;
        for (i, b) in bufs.iter().enumerate() {
            ensure!(
                gpu.dtoh(b).ctx("dtoh")? == pattern((seed + i as u64) ^ REWRITE, b.len()),
                "buffer {i} lacks the child's writes"
            );
        }
        Ok(())
    })
}

fn worker_pool() -> R {
    const WORKERS: usize = 4;
    with_ipc_pool(|gpu, pool, s| {
        let seed: u64 = rand::random();
        let chunk = 100_000 + rand::rng().random_range(0..1000);
        let n = chunk * WORKERS;
        let buf = filled(gpu, pool, s, seed, n)?;
        let data = pattern(seed, n);
        // One pool handle for all: each child receives its own duplicate of the descriptor.
        let pool_handle = pool.export().ctx("export pool")?;
        let buf_handle = buf.export().ctx("export buffer")?;
        let children = (0..WORKERS)
            .map(|_| spawn_child("worker", &[]))
            .collect::<R<Vec<_>>>()?;
        for (rank, c) in children.iter().enumerate() {
            ipc::send_handles(
                &c.conn,
                std::slice::from_ref(&pool_handle),
                std::slice::from_ref(&buf_handle),
            )
            .ctx("send_handles")?;
            send_json(
                &c.conn,
                &json!({"seed": seed, "rank": rank + 1, "start": rank * chunk, "end": (rank + 1) * chunk}),
            )?;
        }
        for c in children {
            c.expect_done()?;
        }
        let got = gpu.dtoh(&buf).ctx("dtoh")?;
        for (i, (&g, &d)) in got.iter().zip(&data).enumerate() {
            let rank = (i / chunk + 1) as u32;
            ensure!(
                g == d.wrapping_add(rank),
                "element {i}: {g} != {d} + {rank}"
            );
        }
        Ok(())
    })
}

fn killed_child() -> R {
    with_ipc_pool(|gpu, pool, s| {
        let seed: u64 = rand::random();
        let n = 50_000;
        let buf = filled(gpu, pool, s, seed, n)?;
        let mut child = spawn_child("hang", &[])?;
        ipc::send_handles(
            &child.conn,
            &[pool.export().ctx("export pool")?],
            &[buf.export().ctx("export buffer")?],
        )
        .ctx("send_handles")?;
        let m = ipc::recv_message_timeout(&child.conn, CHILD_WAIT).ctx("wait for `imported`")?;
        ensure!(m.bytes == b"imported", "child said {:?}", m.bytes);
        child.proc.kill().ctx("SIGKILL child")?;
        let status = child.wait()?;
        ensure!(!status.success(), "killed child exited successfully");
        let t = Instant::now();
        let err = ipc::recv_message_timeout(&child.conn, Duration::from_secs(20));
        ensure!(
            matches!(err, Err(Error::PeerGone)),
            "recv from a killed peer gave {err:?}"
        );
        ensure!(
            t.elapsed() < Duration::from_secs(5),
            "recv took {:?}",
            t.elapsed()
        );
        let err = ipc::send_message(&child.conn, b"anyone?", &[]);
        ensure!(
            matches!(err, Err(Error::PeerGone)),
            "send to a killed peer gave {err:?}"
        );
        // The parent's pool and buffer are intact and usable.
        ensure!(
            gpu.dtoh(&buf).ctx("dtoh")? == pattern(seed, n),
            "buffer damaged"
        );
        let mut more = pool.alloc_zeros::<u32>(s, n).ctx("alloc after kill")?;
        gpu.dtod(&buf, &mut more).ctx("dtod")?;
        ensure!(
            gpu.dtoh(&more).ctx("dtoh")? == pattern(seed, n),
            "copy wrong"
        );
        // And a new child can still import the same pool.
        gpu.htod_copy(&pattern(seed, n), &mut more).ctx("htod")?;
        roundtrip_via_child(gpu, pool, &more, seed)?;
        Ok(())
    })
}

fn legacy_roundtrip() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("device 0")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let seed: u64 = rand::random();
    let n = 300_000 + rand::rng().random_range(0..1000);
    let slice = gpu.clone_htod(&pattern(seed, n)).ctx("clone_htod")?;
    let good = LegacyIpcHandle::export(&slice).ctx("export legacy")?;
    let flipped: String = good
        .data()
        .iter()
        .map(|b| format!("{:02x}", b ^ 0xff))
        .collect();
    let bad = tamper(&good, "data", json!(flipped))?;
    ensure!(
        LegacyIpcHandle::from_bytes(&good.to_bytes().ctx("to_bytes")?).ctx("from_bytes")? == good,
        "legacy bytes round trip"
    );
    let empty = gpu.alloc_zeros::<u32>(0).ctx("empty")?;
    ensure!(
        matches!(
            LegacyIpcHandle::export(&empty),
            Err(Error::InvalidArgument(_))
        ),
        "exporting an empty slice must fail"
    );
    // The exporting process cannot open its own handle (refused before the driver).
    ensure!(
        matches!(good.open::<u32>(), Err(Error::SameProcessImport { .. })),
        "opening our own legacy handle must be SameProcessImport"
    );
    // Pool memory reaches `export` through PoolSlice's deref: refused, not exported as
    // a handle of some other allocation.
    {
        let pool = MemoryPool::new(&gpu, PoolConfig::default()).ctx("pool")?;
        let stream = gpu.new_stream().ctx("stream")?;
        let ps = pool
            .alloc_zeros::<u32>(&gpu.on(&stream).ctx("on")?, 4096)
            .ctx("pool alloc")?;
        match LegacyIpcHandle::export(&*ps) {
            Err(Error::NotLegacyExportable { .. }) => {}
            other => {
                return Err(format!(
                    "legacy export of a pool slice: expected NotLegacyExportable, got {other:?}"
                ));
            }
        }
    }
    let child = spawn_child("legacy", &[])?;
    ipc::send_message(&child.conn, &good.to_bytes().ctx("bytes")?, &[]).ctx("send")?;
    ipc::send_message(&child.conn, &bad.to_bytes().ctx("bytes")?, &[]).ctx("send")?;
    send_json(&child.conn, &json!({ "seed": seed }))?;
    child.expect_done()?;
    ensure!(
        gpu.dtoh(&slice).ctx("dtoh")? == pattern(seed ^ REWRITE, n),
        "legacy child's writes missing"
    );
    Ok(())
}

fn corrupt_handles() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("device 0")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let seed: u64 = rand::random();
    let n = 10_000;
    let pool = MemoryPool::new(&gpu, PoolConfig::default().ipc(true)).ctx("pool")?;
    let mut buf = pool.alloc_zeros::<u32>(&s, n).ctx("alloc")?;
    gpu.htod_copy(&pattern(seed, n), &mut buf).ctx("htod")?;
    let good = buf.export().ctx("export")?;
    let flipped = tamper(&good, "export_data", json!(flipped_hex(&good)))?;
    let inflated = tamper(&good, "len", json!(1u64 << 38))?; // 1 TiB of u32: more than any GPU
    // A pool and buffer destroyed before their handles are used.
    let (stale_pool, stale_buf) = {
        let p2 = MemoryPool::new(&gpu, PoolConfig::default().ipc(true)).ctx("pool 2")?;
        let b2 = p2.alloc_zeros::<u32>(&s, n).ctx("alloc 2")?;
        let handles = (p2.export().ctx("export 2")?, b2.export().ctx("export b2")?);
        drop(b2);
        drop(p2);
        handles
    };
    // The sealed bytes catch flips before anything reaches the driver.
    let mut bytes = good.to_bytes().ctx("to_bytes")?;
    let i = rand::rng().random_range(0..bytes.len());
    bytes[i] ^= 0x10;
    ensure!(
        matches!(
            BufferHandle::from_bytes(&bytes),
            Err(Error::CorruptHandle { .. })
        ),
        "flipped byte {i} of a sealed handle was accepted"
    );
    let child = spawn_child("corrupt", &[])?;
    ipc::send_handles(
        &child.conn,
        &[pool.export().ctx("export pool")?, stale_pool],
        &[good, flipped, inflated, stale_buf],
    )
    .ctx("send_handles")?;
    send_json(&child.conn, &json!({ "seed": seed }))?;
    child.expect_done()?;
    ensure!(
        gpu.dtoh(&buf).ctx("dtoh")? == pattern(seed, n),
        "buffer changed"
    );
    Ok(())
}

fn local_errors() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("device 0")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let plain = MemoryPool::new(&gpu, PoolConfig::default()).ctx("plain pool")?;
    ensure!(!plain.is_ipc(), "plain pool reports IPC");
    ensure!(
        matches!(plain.export(), Err(Error::NotIpcPool)),
        "plain pool exported"
    );
    let b = plain.alloc_zeros::<f32>(&s, 16).ctx("alloc")?;
    ensure!(
        matches!(b.export(), Err(Error::NotIpcPool)),
        "plain buffer exported"
    );
    let ipc_pool = MemoryPool::new(&gpu, PoolConfig::default().ipc(true)).ctx("ipc pool")?;
    let empty = ipc_pool.alloc_zeros::<f32>(&s, 0).ctx("empty alloc")?;
    ensure!(empty.is_empty(), "empty");
    ensure!(
        matches!(empty.export(), Err(Error::InvalidArgument(_))),
        "empty buffer exported"
    );
    let handle = ipc_pool.export().ctx("export")?;
    // A device UUID that no visible device has.
    let mut uuid = dev.uuid().0;
    uuid[0] ^= 0xff;
    uuid[15] ^= 0xff;
    let foreign: PoolHandle = tamper(
        &handle,
        "device_uuid",
        json!(uuid.iter().map(|b| format!("{b:02x}")).collect::<String>()),
    )?;
    match ImportedPool::import(foreign) {
        Err(Error::UnknownDevice { uuid: u }) if u.0 == uuid => {}
        other => {
            return Err(format!(
                "foreign UUID: expected UnknownDevice, got {other:?}"
            ));
        }
    }
    // A handle read back from bytes has no descriptor.
    let no_fd = PoolHandle::from_bytes(&handle.to_bytes().ctx("bytes")?).ctx("from_bytes")?;
    ensure!(
        matches!(
            ImportedPool::import(no_fd),
            Err(Error::CorruptHandle { .. })
        ),
        "a pool handle without its descriptor must be CorruptHandle"
    );
    ensure!(
        current_context()? == bound_context(&gpu),
        "binding disturbed"
    );
    Ok(())
}

/// The bound device's raw context, to compare with the thread's current one.
fn bound_context(gpu: &gpubind::BoundDevice<'_>) -> sys::CUcontext {
    // SAFETY: only compared, never used.
    unsafe { gpu.raw_context() }
}

/// Every allocation size of an IPC pool can be exported (the pool rounds allocations up
/// to the driver's granularity). Also prints, for the record, which *raw* sizes the driver
/// itself agrees to export.
fn every_allocation_size_exports() -> R {
    with_ipc_pool(|gpu, pool, s| {
        let mut raw_report = Vec::new();
        for bytes in [
            4usize,
            4096,
            40_000,
            1 << 20,
            (2 << 20) - 4,
            2 << 20,
            (2 << 20) + 4,
        ] {
            let mut p: sys::CUdeviceptr = 0;
            // SAFETY: a raw allocation from the pool on the bound stream, waited for,
            // exported and freed below; nothing else uses it.
            let exported = unsafe {
                sys::cuMemAllocFromPoolAsync(&mut p, bytes, pool.raw(), s.raw());
                sys::cuStreamSynchronize(s.raw());
                let mut data = sys::CUmemPoolPtrExportData { reserved: [0; 64] };
                let r = sys::cuMemPoolExportPointer(&mut data, p);
                sys::cuMemFreeAsync(p, s.raw());
                sys::cuStreamSynchronize(s.raw());
                r
            };
            raw_report.push(format!("{bytes} B: {exported:?}"));
        }
        println!(
            "    raw cuMemPoolExportPointer by size: {}",
            raw_report.join(", ")
        );
        for n in [1usize, 1000, 10_000, 100_000, 1 << 20, (1 << 20) + 7] {
            let buf = filled(gpu, pool, s, n as u64, n)?;
            buf.export().ctx(&format!("export of {n} u32"))?;
        }
        Ok(())
    })
}

fn pool_attributes() -> R {
    const MB: u64 = 1 << 20;
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("device 0")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let pool =
        MemoryPool::new(&gpu, PoolConfig::default().release_threshold(3 * MB)).ctx("pool")?;
    ensure!(
        pool.release_threshold().ctx("get")? == 3 * MB,
        "threshold from config"
    );
    pool.set_release_threshold(u64::MAX).ctx("set")?;
    ensure!(
        pool.release_threshold().ctx("get")? == u64::MAX,
        "threshold set"
    );
    let before = pool.usage().ctx("usage")?;
    let bytes = 8 * MB as usize;
    let buf = pool.alloc_zeros::<u8>(&s, bytes).ctx("alloc")?;
    let during = pool.usage().ctx("usage")?;
    ensure!(
        during.used_current >= before.used_current + bytes as u64
            && during.reserved_current >= during.used_current
            && during.used_high >= during.used_current
            && during.reserved_high >= during.reserved_current,
        "usage while allocated: {during:?}"
    );
    drop(buf);
    let after = pool.usage().ctx("usage")?;
    ensure!(
        after.used_current < during.used_current,
        "free not seen: {after:?}"
    );
    ensure!(
        after.used_high >= during.used_current,
        "peak lost: {after:?}"
    );
    pool.reset_peaks().ctx("reset")?;
    let reset = pool.usage().ctx("usage")?;
    ensure!(
        reset.used_high < during.used_current,
        "peak not reset: {reset:?}"
    );
    pool.set_release_threshold(0).ctx("set 0")?;
    pool.trim_to(0).ctx("trim")?;
    let trimmed = pool.usage().ctx("usage")?;
    ensure!(
        trimmed.reserved_current < during.reserved_current,
        "trim released nothing: {trimmed:?}"
    );
    let ipc_pool = MemoryPool::new(&gpu, PoolConfig::default().ipc(true)).ctx("ipc pool")?;
    ipc_pool.usage().ctx("ipc usage")?;
    Ok(())
}

fn core_interop() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("device 0")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let pool = MemoryPool::new(&gpu, PoolConfig::default().ipc(true)).ctx("pool")?;
    let n = 4096 + rand::rng().random_range(0..512usize);
    let data: Vec<f32> = (0..n).map(|_| rand::random::<f32>()).collect();
    let mut a = pool.alloc_zeros::<f32>(&s, n).ctx("alloc a")?;
    gpu.htod_copy(&data, &mut a).ctx("htod")?;
    // Core copies in both directions, views through deref, slice_mut.
    let copy = gpu.clone_dtod(&a).ctx("clone_dtod")?;
    ensure!(gpu.dtoh(&copy).ctx("dtoh")? == data, "clone_dtod");
    let mut b = pool.alloc_zeros::<f32>(&s, n).ctx("alloc b")?;
    gpu.dtod(&copy, &mut b).ctx("dtod")?;
    ensure!(
        gpu.dtoh(&b.slice(10..20).ctx("view")?).ctx("dtoh")? == data[10..20],
        "view"
    );
    gpu.memset_zeros(&mut b.slice_mut(0..10).ctx("view mut")?)
        .ctx("memset")?;
    let got = gpu.dtoh(&b).ctx("dtoh")?;
    ensure!(
        got[..10].iter().all(|&x| x == 0.0) && got[10..] == data[10..],
        "memset view"
    );
    // Stream-ordered allocation and free on the same stream.
    // SAFETY: only used on `s`, and synchronised before the host reads it.
    let mut c = unsafe { pool.alloc_async::<f32>(&s, n) }.ctx("alloc_async")?;
    s.dtod_async(&a, &mut c).ctx("dtod_async")?;
    s.synchronize().ctx("sync")?;
    ensure!(
        gpu.dtoh(&c).ctx("dtoh")? == data,
        "alloc_async + dtod_async"
    );
    // SAFETY: every use of `c` was on `s` and has completed.
    unsafe { c.free_async(&s) }.ctx("free_async")?;
    s.synchronize().ctx("sync")?;
    // A kernel taking a pool slice.
    if gpubind::nvrtc_available() {
        let module = gpu
            .compile_and_load(
                r#"extern "C" __global__ void twice(float* x, unsigned n) {
                       unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
                       if (i < n) x[i] *= 2.0f;
                   }"#,
                "twice.cu",
            )
            .ctx("compile")?;
        let twice = module.function("twice").ctx("function")?;
        let nn = n as u32;
        // SAFETY: (float*, unsigned) matches the kernel, which stays in bounds.
        unsafe {
            s.launch(&twice, LaunchConfig::for_num_elems(nn))
                .arg_written(&a)
                .arg(&nn)
                .launch()
        }
        .ctx("launch")?;
        s.synchronize().ctx("sync")?;
        let doubled: Vec<f32> = data.iter().map(|x| x * 2.0).collect();
        ensure!(
            gpu.dtoh(&a).ctx("dtoh")? == doubled,
            "kernel on a pool slice"
        );
    } else {
        println!("    (NVRTC not found: the kernel launch part of this test did not run)");
    }
    // Slices outlive the pool handle: dropping the MemoryPool first is fine.
    drop(pool);
    ensure!(
        gpu.dtoh(&b).ctx("dtoh after pool drop")?.len() == n,
        "slice outlives pool"
    );
    Ok(())
}

fn multi_device() -> R {
    let devices = Device::all().ctx("devices")?;
    if devices.len() < 2 {
        return Err(common::skip(&format!(
            "needs 2 GPUs, {} visible",
            devices.len()
        )));
    }
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let base: u64 = rand::random::<u64>() >> 8;
    let mut pools = Vec::new();
    let mut bufs = Vec::new();
    for (i, dev) in devices.iter().take(2).enumerate() {
        let gpu = ctx.bind(dev).ctx("bind")?;
        let stream = gpu.new_stream().ctx("stream")?;
        let pool = MemoryPool::new(&gpu, PoolConfig::default().ipc(true)).ctx("pool")?;
        let n = 20_000 + 1000 * i;
        let mut b = pool
            .alloc_zeros::<u32>(&gpu.on(&stream).ctx("on")?, n)
            .ctx("alloc")?;
        gpu.htod_copy(&pattern(base + i as u64, n), &mut b)
            .ctx("htod")?;
        pools.push(pool);
        bufs.push(b);
    }
    // A buffer of device 0 under device 1's binding: WrongDevice, here too.
    {
        let gpu = ctx.bind(&devices[1]).ctx("bind")?;
        ensure!(
            matches!(gpu.dtoh(&bufs[0]), Err(Error::WrongDevice { .. })),
            "cross-device dtoh must be WrongDevice"
        );
    }
    if devices[1]
        .can_access_peer(&devices[0])
        .ctx("can_access_peer")?
    {
        pools[0].grant_access(&devices[1]).ctx("grant_access")?;
    }
    let uuids = format!("{},{}", devices[1].uuid(), devices[0].uuid());
    // Both orders; the second child also numbers the devices the other way round.
    for (round, (order, env)) in [
        (vec![0usize, 1], vec![]),
        (vec![1, 0], vec![("CUDA_VISIBLE_DEVICES", uuids.clone())]),
    ]
    .into_iter()
    .enumerate()
    {
        let seeds: Vec<u64> = order
            .iter()
            .map(|&i| base + i as u64 + 100 * round as u64)
            .collect();
        let child = spawn_child("multi", &env)?;
        let ph = order
            .iter()
            .map(|&i| pools[i].export())
            .collect::<Result<Vec<_>, _>>()
            .ctx("export pools")?;
        let bh = order
            .iter()
            .map(|&i| bufs[i].export())
            .collect::<Result<Vec<_>, _>>()
            .ctx("export buffers")?;
        // Data the child expects this round: seeds[k] for buffer order[k].
        for (k, &i) in order.iter().enumerate() {
            let gpu = ctx.bind(&devices[i]).ctx("bind")?;
            gpu.htod_copy(&pattern(seeds[k], bufs[i].len()), &mut bufs[i])
                .ctx("htod")?;
        }
        ipc::send_handles(&child.conn, &ph, &bh).ctx("send_handles")?;
        send_json(&child.conn, &json!({ "seeds": seeds }))?;
        child.expect_done()?;
        for (k, &i) in order.iter().enumerate() {
            let gpu = ctx.bind(&devices[i]).ctx("bind")?;
            ensure!(
                gpu.dtoh(&bufs[i]).ctx("dtoh")? == pattern(seeds[k] ^ REWRITE, bufs[i].len()),
                "round {round}: device {i}'s buffer lacks the child's writes"
            );
        }
    }
    Ok(())
}

/// A buffer made by one child, relayed by the parent (which never touches the GPU
/// here) to a second child; the exporter then dies without freeing, and the importer
/// closes its imports afterwards.
fn exporter_dies_first() -> R {
    let seed: u64 = rand::random();
    let n = 65_536 + rand::rng().random_range(0..1000u64);
    let exporter = spawn_child("exporter", &[])?;
    send_json(&exporter.conn, &json!({ "seed": seed, "n": n }))?;
    let (pools, buffers) = ipc::recv_handles_timeout(&exporter.conn, CHILD_WAIT)
        .ctx("handles from the exporting child")?;
    let importer = spawn_child("late", &[])?;
    ipc::send_handles(&importer.conn, &pools, &buffers).ctx("relay handles")?;
    drop(pools); // the parent's copies of the descriptors
    send_json(&importer.conn, &json!({ "seed": seed }))?;
    let m = ipc::recv_message_timeout(&importer.conn, CHILD_WAIT).ctx("wait for imported")?;
    ensure!(m.bytes == b"imported", "importer said {:?}", m.bytes);
    ipc::send_message(&exporter.conn, b"exit", &[]).ctx("send exit")?;
    let mut exporter = exporter;
    let status = exporter.wait()?;
    ensure!(
        status.success(),
        "exporter exited {status}: {}",
        stderr_of(&mut exporter.proc)
    );
    ipc::send_message(&importer.conn, b"go", &[]).ctx("send go")?;
    importer.expect_done()
}

/// A process importing its own pool or legacy handle (in a child, see
/// `child_self_import`).
fn same_process_import() -> R {
    spawn_child("selfimport", &[])?.expect_done()
}

/// Double imports and a length one element beyond the mapping (see `child_double`). The
/// buffer is a whole number of 2 MiB pages, so a pool that maps exactly the rounded size
/// makes "one beyond the mapping" one beyond the exporter's length.
fn double_import() -> R {
    with_ipc_pool(|gpu, pool, s| {
        let seed: u64 = rand::random();
        let n = 3 * (2 << 20) / 4;
        let buf = filled(gpu, pool, s, seed, n)?;
        let child = spawn_child("double", &[])?;
        ipc::send_handles(
            &child.conn,
            &[pool.export().ctx("export pool")?],
            &[buf.export().ctx("export buffer")?],
        )
        .ctx("send_handles")?;
        send_json(&child.conn, &json!({ "seed": seed }))?;
        let report = recv_json(&child.conn);
        let mapped = report.as_ref().ok().and_then(|r| r["mapped"].as_u64());
        child.expect_done()?;
        let mapped = mapped.ok_or_else(|| format!("child sent no mapped size: {report:?}"))?;
        println!(
            "    importer maps {mapped} bytes for a buffer of {} bytes{}",
            n * 4,
            if mapped > (n * 4) as u64 {
                " (the length check only bounds slices by what the driver maps)"
            } else {
                ""
            }
        );
        ensure!(
            gpu.dtoh(&buf).ctx("dtoh")? == pattern(seed, n),
            "buffer changed"
        );
        Ok(())
    })
}
