//! GPU tests of interprocess events (`gpubind::ipc::EventHandle`) with child processes
//! on one GPU.
//!
//! Children are re-executions of this binary with `GPUBIND_CHILD=<role>` and
//! `GPUBIND_IPC_SOCKET=<path>` (a Unix socket the parent listens on); a child exits 0 on
//! success and prints the reason for a failure on stderr.
//!
//! Run: `cargo test --features ipc --test gpu_ipc_events` (one SKIPPED line without a
//! GPU).

mod common;

use common::{Ctx, SPIN, socket_child};
use gpubind::ipc::{self, EventHandle, ImportedPool, MemoryPool, PoolConfig};
use gpubind::{Device, DeviceSlice, Error, EventFlags, LaunchConfig, ThreadContext};
use std::os::unix::net::UnixStream;
use std::time::Duration;

type R<T = ()> = Result<T, String>;

const CHILD_WAIT: Duration = Duration::from_secs(120);

fn main() {
    socket_child::exit_if_child(run_child);
    common::run_suite(
        "gpu_ipc_events",
        &[
            (
                "child_stream_waits_for_the_parents_event",
                child_waits_for_parent,
            ),
            (
                "own_timing_corrupt_and_forged_handles_are_typed",
                local_errors,
            ),
        ],
    )
}

fn run_child(role: &str) -> R {
    let conn = socket_child::connect_to_parent()?;
    match role {
        "waiter" => child_waiter(&conn),
        other => Err(format!("unknown child role {other}")),
    }
}

/// Imports the parent's flag buffer and event; its own stream waits on the event, then
/// copies the flag: it must see the parent kernel's write (7), which lands about a
/// second after the handles were sent.
fn child_waiter(conn: &UnixStream) -> R {
    let (mut pools, buffers) = ipc::recv_handles(conn).ctx("recv_handles")?;
    let m = ipc::recv_message(conn).ctx("recv event handle")?;
    let handle = EventHandle::from_bytes(&m.bytes).ctx("event from_bytes")?;
    ensure!(
        pools.len() == 1 && buffers.len() == 1,
        "expected 1 pool + 1 buffer"
    );
    let pool = ImportedPool::import(pools.remove(0)).ctx("import pool")?;
    let flag = pool
        .import_buffer::<u32>(&buffers[0])
        .ctx("import buffer")?;
    let event = handle.open().ctx("open event")?;
    ensure!(event.flags().has_interprocess(), "opened event flags");
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let gpu = ctx.bind(flag.device()).ctx("bind")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let mut copy: DeviceSlice<u32> = gpu.alloc_zeros(1).ctx("alloc")?;
    s.wait(&event).ctx("wait on the parent's event")?;
    s.dtod_async(&flag, &mut copy).ctx("dtod")?;
    s.synchronize().ctx("sync")?;
    let got = gpu.dtoh(&copy).ctx("dtoh")?;
    ensure!(
        got == [7],
        "the child read {got:?} before the parent's write"
    );
    ensure!(
        event.is_complete().ctx("query")?,
        "event not complete after the wait"
    );
    drop((event, flag, pool));
    ipc::send_message(conn, b"done", &[]).ctx("send done")
}

fn child_waits_for_parent() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("device 0")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let pool = MemoryPool::new(&gpu, PoolConfig::default().ipc(true)).ctx("pool")?;
    let stream = gpu.new_stream().ctx("stream")?;
    let s = gpu.on(&stream).ctx("on")?;
    let flag = pool.alloc_zeros::<u32>(&s, 1).ctx("alloc")?;
    let module = gpu.compile_and_load(SPIN, "spin.cu").ctx("compile")?;
    let f = module.function("spin_then_write").ctx("function")?;
    let event = gpu
        .new_event_with(EventFlags::new().interprocess(true))
        .ctx("interprocess event")?;
    let (child, conn) = socket_child::spawn_connected("ipc-events", "waiter", &[], CHILD_WAIT)?;
    let ns: u64 = 1_500_000_000;
    // SAFETY: (unsigned*, unsigned long long) as the kernel declares; it writes one u32
    // into `flag`, which holds one.
    unsafe {
        s.launch(&f, LaunchConfig::for_num_elems(1))
            .arg_written(&flag)
            .arg(&ns)
            .launch()
    }
    .ctx("launch spin")?;
    s.record(&event).ctx("record")?;
    ipc::send_handles(
        &conn,
        &[pool.export().ctx("export pool")?],
        &[flag.export().ctx("export buffer")?],
    )
    .ctx("send_handles")?;
    let bytes = EventHandle::export(&event)
        .ctx("export event")?
        .to_bytes()
        .ctx("to_bytes")?;
    ipc::send_message(&conn, &bytes, &[]).ctx("send event")?;
    let m = ipc::recv_message_timeout(&conn, CHILD_WAIT).ctx("child's done")?;
    ensure!(m.bytes == b"done", "child answered {:?}", m.bytes);
    socket_child::expect_success(child, CHILD_WAIT)?;
    // The child dropped its opened event before answering: `event` may go now.
    drop(event);
    Ok(())
}

fn local_errors() -> R {
    let mut ctx = ThreadContext::acquire().ctx("acquire")?;
    let dev = Device::get(0).ctx("device 0")?;
    let gpu = ctx.bind(&dev).ctx("bind")?;
    let timing = gpu.new_event(true).ctx("event")?;
    ensure!(
        matches!(EventHandle::export(&timing), Err(Error::InvalidArgument(_))),
        "exporting an event without the interprocess flag must be InvalidArgument"
    );
    ensure!(
        gpu.new_event_with(EventFlags::new().interprocess(true).timing(true))
            .is_err(),
        "an interprocess event with timing must be refused"
    );
    let event = gpu
        .new_event_with(EventFlags::new().interprocess(true))
        .ctx("interprocess event")?;
    let h = EventHandle::export(&event).ctx("export")?;
    ensure!(
        matches!(h.open(), Err(Error::SameProcessImport { .. })),
        "opening an own event must be SameProcessImport"
    );
    let mut bytes = h.to_bytes().ctx("to_bytes")?;
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x20;
    ensure!(
        matches!(
            EventHandle::from_bytes(&bytes),
            Err(Error::CorruptHandle { .. })
        ),
        "flipped bytes must be CorruptHandle"
    );
    // A forged handle (the right device, bytes no exporter made): a typed driver error,
    // never a panic or an event.
    let mut v = serde_json::to_value(&h).ctx("to_value")?;
    v["data"] = serde_json::Value::String("5a".repeat(64));
    let forged: EventHandle = serde_json::from_value(v).ctx("from_value")?;
    match forged.open() {
        Err(Error::Driver { .. }) => Ok(()),
        other => Err(format!("a forged event handle opened as {other:?}")),
    }
}
