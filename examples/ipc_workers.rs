//! A parent process shares one IPC memory pool with N worker processes.
//!
//! The parent allocates `N * CHUNK` `u32`s from an IPC pool on GPU 0, sets element `i`
//! to `i`, and starts N workers (itself, re-executed with `--worker <socket>`). Each
//! worker receives the pool and buffer handles over its Unix socket, imports them, adds
//! its rank (1..=N) to its own chunk with a tiny NVRTC kernel (or, without NVRTC, with a
//! host round trip), drops its imports and answers `done`. The parent then checks every
//! element.
//!
//! ```text
//! cargo run --example ipc_workers            # 4 workers
//! cargo run --example ipc_workers -- 8       # 8 workers
//! ```
//!
//! Without a GPU it prints one line saying so and exits with status 2.

use gpubind::ipc::{self, ImportedPool, MemoryPool, PoolConfig};
use gpubind::{Device, LaunchConfig, ThreadContext};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

const CHUNK: usize = 1 << 18;
const ADD_RANK: &str = r#"
extern "C" __global__ void add_rank(unsigned* x, unsigned n, unsigned rank) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += rank;
}"#;

type Res<T = ()> = Result<T, String>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--worker") {
        let Some(path) = args.get(2) else {
            eprintln!("ipc_workers: --worker needs a socket path");
            return ExitCode::from(2);
        };
        return match worker(path) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("worker: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(why) = no_gpu() {
        eprintln!("ipc_workers: needs a CUDA GPU, but {why}");
        return ExitCode::from(2);
    }
    let workers = match args.get(1).map(|s| s.parse::<usize>()) {
        None => 4,
        Some(Ok(n)) if (1..=64).contains(&n) => n,
        Some(_) => {
            eprintln!("usage: ipc_workers [WORKERS (1..=64)]");
            return ExitCode::from(2);
        }
    };
    match parent(workers) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ipc_workers: {e}");
            ExitCode::FAILURE
        }
    }
}

fn no_gpu() -> Option<String> {
    if !gpubind::driver_available() {
        return Some("no CUDA driver was found (libcuda not loadable)".into());
    }
    match Device::count() {
        Ok(0) => Some("the driver reports no device".into()),
        Ok(_) => None,
        Err(e) => Some(format!("CUDA init failed: {e}")),
    }
}

fn e<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |err| format!("{what}: {err}")
}

struct Worker {
    rank: usize,
    proc: std::process::Child,
    conn: UnixStream,
}

/// Starts one worker process and accepts its connection (bounded wait).
fn spawn_worker(rank: usize) -> Res<Worker> {
    let path = std::env::temp_dir().join(format!(
        "gpubind-ipc-workers-{}-{rank}.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).map_err(e("bind socket"))?;
    listener
        .set_nonblocking(true)
        .map_err(e("set_nonblocking"))?;
    let exe = std::env::current_exe().map_err(e("current_exe"))?;
    let mut proc = Command::new(exe)
        .arg("--worker")
        .arg(&path)
        .spawn()
        .map_err(e("spawn worker"))?;
    let start = Instant::now();
    let conn = loop {
        match listener.accept() {
            Ok((conn, _)) => break conn,
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                let exited = proc.try_wait().map_err(e("try_wait"))?;
                if exited.is_some() || start.elapsed() > Duration::from_secs(60) {
                    let _ = proc.kill();
                    let _ = proc.wait();
                    let _ = std::fs::remove_file(&path);
                    return Err(format!("worker {rank} did not connect"));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(err) => return Err(format!("accept: {err}")),
        }
    };
    let _ = std::fs::remove_file(&path);
    conn.set_nonblocking(false).map_err(e("set_nonblocking"))?;
    Ok(Worker { rank, proc, conn })
}

fn parent(workers: usize) -> Res {
    let mut ctx = ThreadContext::acquire().map_err(e("acquire"))?;
    let dev = Device::get(0).map_err(e("device 0"))?;
    let gpu = ctx.bind(&dev).map_err(e("bind"))?;
    let pool = MemoryPool::new(&gpu, PoolConfig::default().ipc(true)).map_err(e("pool"))?;
    let stream = gpu.new_stream().map_err(e("stream"))?;
    let n = workers * CHUNK;
    let mut buf = pool
        .alloc_zeros::<u32>(&gpu.on(&stream).map_err(e("on"))?, n)
        .map_err(e("alloc"))?;
    let init: Vec<u32> = (0..n as u32).collect();
    gpu.htod_copy(&init, &mut buf).map_err(e("htod"))?;
    let pool_handle = pool.export().map_err(e("export pool"))?;
    let buf_handle = buf.export().map_err(e("export buffer"))?;
    println!(
        "parent: {} ({}), pool {}, {n} u32 in {workers} chunks",
        dev.name(),
        dev.uuid(),
        pool.id()
    );

    let start = Instant::now();
    let mut running = Vec::new();
    for rank in 1..=workers {
        let w = spawn_worker(rank)?;
        ipc::send_handles(
            &w.conn,
            std::slice::from_ref(&pool_handle),
            std::slice::from_ref(&buf_handle),
        )
        .map_err(e("send_handles"))?;
        let job =
            serde_json::json!({"rank": rank, "start": (rank - 1) * CHUNK, "end": rank * CHUNK});
        ipc::send_message(&w.conn, job.to_string().as_bytes(), &[]).map_err(e("send job"))?;
        running.push(w);
    }
    println!(
        "\n{:>6}  {:>18}  {:>8}  {:>10}",
        "worker", "chunk", "mode", "done after"
    );
    for mut w in running {
        let reply = ipc::recv_message_timeout(&w.conn, Duration::from_secs(120))
            .map_err(|err| format!("worker {}: {err}", w.rank))?;
        let status = w.proc.wait().map_err(e("wait"))?;
        let reply = String::from_utf8_lossy(&reply.bytes).into_owned();
        let Some(mode) = reply.strip_prefix("done:") else {
            return Err(format!("worker {} answered {reply:?}", w.rank));
        };
        if !status.success() {
            return Err(format!("worker {} exited with {status}", w.rank));
        }
        let range = format!("{}..{}", (w.rank - 1) * CHUNK, w.rank * CHUNK);
        println!(
            "{:>6}  {range:>18}  {mode:>8}  {:>8.1} ms",
            w.rank,
            start.elapsed().as_secs_f64() * 1e3
        );
    }

    let got = gpu.dtoh(&buf).map_err(e("dtoh"))?;
    for (i, &v) in got.iter().enumerate() {
        let want = i as u32 + (i / CHUNK + 1) as u32;
        if v != want {
            return Err(format!("element {i} is {v}, expected {want}"));
        }
    }
    println!("\nall {n} elements verified: element i == i + rank of its chunk");
    Ok(())
}

fn field(job: &serde_json::Value, key: &str) -> Res<usize> {
    job[key]
        .as_u64()
        .map(|v| v as usize)
        .ok_or_else(|| format!("job lacks `{key}`: {job}"))
}

fn worker(path: &str) -> Res {
    gpubind::init().map_err(e("init"))?;
    let conn = UnixStream::connect(path).map_err(e("connect"))?;
    let (mut pools, buffers) = ipc::recv_handles(&conn).map_err(e("recv_handles"))?;
    let job = ipc::recv_message(&conn).map_err(e("recv job"))?;
    let job: serde_json::Value = serde_json::from_slice(&job.bytes).map_err(e("parse job"))?;
    let (rank, start, end) = (
        field(&job, "rank")?,
        field(&job, "start")?,
        field(&job, "end")?,
    );
    if pools.len() != 1 || buffers.len() != 1 {
        return Err("expected one pool and one buffer".into());
    }
    // Importing needs no binding; the pool maps on the device with the handle's UUID.
    let pool = ImportedPool::import(pools.remove(0)).map_err(e("import pool"))?;
    let mut buf = pool
        .import_buffer::<u32>(&buffers[0])
        .map_err(e("import buffer"))?;
    let mut ctx = ThreadContext::acquire().map_err(e("acquire"))?;
    let gpu = ctx.bind(pool.device()).map_err(e("bind"))?;
    let mut chunk = buf.slice_mut(start..end).map_err(e("chunk"))?;
    let (len, rank32) = ((end - start) as u32, rank as u32);
    let mode = if gpubind::nvrtc_available() {
        let module = gpu
            .compile_and_load(ADD_RANK, "add_rank.cu")
            .map_err(e("compile"))?;
        let add_rank = module.function("add_rank").map_err(e("function"))?;
        let s = gpu.default_stream();
        // SAFETY: (unsigned*, unsigned, unsigned) matches the kernel, which touches only
        // the `len` elements of the chunk it is given.
        unsafe {
            s.launch(&add_rank, LaunchConfig::for_num_elems(len))
                .arg(&mut chunk)
                .arg(&len)
                .arg(&rank32)
                .launch()
        }
        .map_err(e("launch"))?;
        "kernel"
    } else {
        let mut host = gpu.dtoh(&chunk).map_err(e("dtoh"))?;
        host.iter_mut().for_each(|x| *x += rank32);
        gpu.htod_copy(&host, &mut chunk).map_err(e("htod"))?;
        "htod"
    };
    gpu.synchronize().map_err(e("synchronize"))?;
    // Drop the imports *before* answering: the exporter frees only after every importer.
    drop(buf);
    drop(pool);
    ipc::send_message(&conn, format!("done:{mode}").as_bytes(), &[]).map_err(e("send done"))
}
