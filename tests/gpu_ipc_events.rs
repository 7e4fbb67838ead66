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

use common::{Ctx, SPIN, child_role};
use gpubind::ipc::{self, EventHandle, ImportedPool, MemoryPool, PoolConfig};
use gpubind::{Device, DeviceSlice, Error, EventFlags, LaunchConfig, ThreadContext};
use std::io::Read;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

type R<T = ()> = Result<T, String>;

const CHILD_WAIT: Duration = Duration::from_secs(120);

fn main() {
    if let Some(role) = child_role() {
        let outcome = run_child(&role);
        if let Err(e) = &outcome {
            eprintln!("child `{role}` failed: {e}");
        }
        std::process::exit(if outcome.is_ok() { 0 } else { 1 });
    }
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

/// Spawns this binary as child `role` and accepts its connection (bounded wait).
fn spawn_child(role: &str) -> R<(std::process::Child, UnixStream)> {
    let path = std::env::temp_dir().join(format!(
        "gpubind-ipc-events-{}-{role}.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).ctx("bind test socket")?;
    listener.set_nonblocking(true).ctx("nonblocking listener")?;
    let mut proc = Command::new(std::env::current_exe().ctx("current_exe")?)
        .env("GPUBIND_CHILD", role)
        .env("GPUBIND_IPC_SOCKET", &path)
        .stderr(Stdio::piped())
        .spawn()
        .ctx("spawn child")?;
    let start = Instant::now();
    let conn = loop {
        match listener.accept() {
            Ok((conn, _)) => break conn,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if proc.try_wait().ctx("try_wait")?.is_some() || start.elapsed() > CHILD_WAIT {
                    let _ = proc.kill();
                    let _ = proc.wait();
                    let _ = std::fs::remove_file(&path);
                    return Err(format!("child `{role}` never connected"));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    };
    let _ = std::fs::remove_file(&path);
    conn.set_nonblocking(false).ctx("blocking conn")?;
    Ok((proc, conn))
}

/// Waits for the child (bounded); its stderr as the error if it failed.
fn expect_success(mut proc: std::process::Child) -> R {
    let start = Instant::now();
    loop {
        if let Some(status) = proc.try_wait().ctx("try_wait")? {
            if status.success() {
                return Ok(());
            }
            let mut err = String::new();
            if let Some(mut e) = proc.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return Err(format!("child failed ({status}): {err}"));
        }
        if start.elapsed() > CHILD_WAIT {
            let _ = proc.kill();
            let _ = proc.wait();
            return Err("child did not finish".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn run_child(role: &str) -> R {
    gpubind::init().ctx("init")?;
    let path = std::env::var("GPUBIND_IPC_SOCKET").ctx("GPUBIND_IPC_SOCKET")?;
    let conn = UnixStream::connect(&path).ctx("connect to parent")?;
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
    let (child, conn) = spawn_child("waiter")?;
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
    expect_success(child)?;
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
