//! Children that talk to their parent over a Unix socket: the parent listens on a fresh
//! socket, re-executes this binary with `GPUBIND_CHILD=<role>` and
//! `GPUBIND_IPC_SOCKET=<path>` ([`spawn_connected`]) and waits for its end
//! ([`expect_success`]); the child runs its role ([`exit_if_child`]) on the connection it
//! opens ([`connect_to_parent`]), exiting 0 on success and printing why it failed on
//! stderr otherwise.

use super::{Ctx, child_role};
use std::io::Read;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// In a child (`GPUBIND_CHILD` set): runs `run` with the role and exits the process, 0
/// if it succeeded, else 1 after printing the failure on stderr. In the parent: returns.
pub fn exit_if_child(run: fn(&str) -> Result<(), String>) {
    if let Some(role) = child_role() {
        let outcome = run(&role);
        if let Err(e) = &outcome {
            eprintln!("child `{role}` failed: {e}");
        }
        std::process::exit(if outcome.is_ok() { 0 } else { 1 });
    }
}

/// The child's side: initialises gpubind and connects to the parent's socket
/// (`GPUBIND_IPC_SOCKET`).
pub fn connect_to_parent() -> Result<UnixStream, String> {
    gpubind::init().ctx("init")?;
    let path = std::env::var("GPUBIND_IPC_SOCKET").ctx("GPUBIND_IPC_SOCKET")?;
    UnixStream::connect(&path).ctx("connect to parent")
}

/// A socket path of its own for every child this process spawns.
fn socket_path(suite: &str, role: &str) -> std::path::PathBuf {
    static SPAWNED: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "gpubind-{suite}-{}-{}-{role}.sock",
        std::process::id(),
        SPAWNED.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Spawns this binary as child `role` with the variables `env` (stderr piped, for
/// [`expect_success`] and [`stderr_of`]) on a socket of its own named after `suite`,
/// and accepts its connection: an error, with the child's stderr, if it exits first;
/// an error if it has not connected within `wait` (then it is killed).
pub fn spawn_connected(
    suite: &str,
    role: &str,
    env: &[(&str, String)],
    wait: Duration,
) -> Result<(Child, UnixStream), String> {
    let path = socket_path(suite, role);
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).ctx("bind test socket")?;
    listener.set_nonblocking(true).ctx("nonblocking listener")?;
    let mut cmd = Command::new(std::env::current_exe().ctx("current_exe")?);
    cmd.env("GPUBIND_CHILD", role)
        .env("GPUBIND_IPC_SOCKET", &path)
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut proc = cmd.spawn().ctx("spawn child")?;
    let start = Instant::now();
    let conn = loop {
        match listener.accept() {
            Ok((conn, _)) => break conn,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Some(status) = proc.try_wait().ctx("try_wait")? {
                    let _ = std::fs::remove_file(&path);
                    return Err(format!(
                        "child `{role}` exited ({status}) before connecting: {}",
                        stderr_of(&mut proc)
                    ));
                }
                if start.elapsed() > wait {
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

/// What the child wrote on stderr (once: the pipe is taken), trimmed.
pub fn stderr_of(proc: &mut Child) -> String {
    let mut s = String::new();
    if let Some(mut e) = proc.stderr.take() {
        let _ = e.read_to_string(&mut s);
    }
    s.trim().to_owned()
}

/// Waits for the child (at most `wait`, then kills it); its stderr as the error if it
/// failed.
pub fn expect_success(mut proc: Child, wait: Duration) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if let Some(status) = proc.try_wait().ctx("try_wait")? {
            if status.success() {
                return Ok(());
            }
            return Err(format!("child failed ({status}): {}", stderr_of(&mut proc)));
        }
        if start.elapsed() > wait {
            let _ = proc.kill();
            let _ = proc.wait();
            return Err("child did not finish".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
