//! `SCM_RIGHTS` transport between real processes, without a GPU.
//!
//! The child is this test binary re-run as `<exe> child_entry --exact` with
//! `GPUBIND_IPC_TEST_ROLE` and `GPUBIND_IPC_TEST_SOCKET` set; `child_entry` does nothing
//! in a normal run.

use gpubind::Error;
use gpubind::ipc::{self, PoolHandle};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROLE: &str = "GPUBIND_IPC_TEST_ROLE";
const SOCKET: &str = "GPUBIND_IPC_TEST_SOCKET";

/// Entry point of the child processes (a no-op unless `GPUBIND_IPC_TEST_ROLE` is set).
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let conn = UnixStream::connect(std::env::var(SOCKET).unwrap()).unwrap();
    match role.as_str() {
        // Reads every pool handle's descriptor (a pipe) and echoes what it read,
        // together with the buffer handles' element counts.
        "echo" => {
            let (pools, buffers) = ipc::recv_handles(&conn).unwrap();
            let mut reply = String::new();
            for mut p in pools {
                let mut text = String::new();
                std::fs::File::from(p.take_fd().unwrap())
                    .read_to_string(&mut text)
                    .unwrap();
                reply += &format!("{}={text};", p.pool_id());
            }
            for b in &buffers {
                reply += &format!("len={};", b.len());
            }
            ipc::send_message(&conn, reply.as_bytes(), &[]).unwrap();
        }
        // Starts a message, then hangs until killed.
        "hang" => {
            let mut c = &conn;
            c.write_all(b"GBIM\x64\x00\x00\x00\x00\x00\x00\x00partial")
                .unwrap();
            std::thread::sleep(Duration::from_secs(60));
        }
        other => panic!("unknown role {other}"),
    }
}

fn spawn(role: &str) -> (Child, UnixStream) {
    let path = std::env::temp_dir().join(format!(
        "gpubind-ipc-process-{}-{role}.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["child_entry", "--exact", "--test-threads=1"])
        .env(ROLE, role)
        .env(SOCKET, &path)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let conn = loop {
        match listener.accept() {
            Ok((c, _)) => break c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "child never connected"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    let _ = std::fs::remove_file(&path);
    conn.set_nonblocking(false).unwrap();
    (child, conn)
}

fn pipe_with(text: &str) -> OwnedFd {
    let (r, mut w) = std::io::pipe().unwrap();
    w.write_all(text.as_bytes()).unwrap();
    r.into()
}

#[test]
fn descriptors_and_handles_reach_a_child_process() {
    let (mut child, conn) = spawn("echo");
    let pools: Vec<PoolHandle> = ["first pipe", "second pipe"]
        .iter()
        .map(|text| {
            // A handle of a made-up pool around an ordinary pipe: the transport does not
            // care what the descriptor is.
            let json = serde_json::json!({
                "pool_id": format!("{:032x}", text.len()),
                "device_uuid": "00".repeat(16),
                "device_ordinal": 0,
            });
            serde_json::from_value::<PoolHandle>(json)
                .unwrap()
                .with_fd(pipe_with(text))
        })
        .collect();
    let buffers: Vec<gpubind::BufferHandle> = (1..=3)
        .map(|n| {
            serde_json::from_value(serde_json::json!({
                "pool_id": "00".repeat(16), "device_uuid": "00".repeat(16),
                "export_data": "ab".repeat(64), "len": n * 10, "elem_size": 4, "elem_type": "f32",
            }))
            .unwrap()
        })
        .collect();
    ipc::send_handles(&conn, &pools, &buffers).unwrap();
    let reply = ipc::recv_message(&conn).unwrap();
    assert!(child.wait().unwrap().success());
    let expected = format!(
        "{}=first pipe;{}=second pipe;len=10;len=20;len=30;",
        pools[0].pool_id(),
        pools[1].pool_id()
    );
    assert_eq!(String::from_utf8(reply.bytes).unwrap(), expected);
}

#[test]
fn a_child_killed_mid_message_is_peer_gone() {
    let (mut child, conn) = spawn("hang");
    // Let the partial frame arrive, then kill the sender.
    std::thread::sleep(Duration::from_millis(200));
    child.kill().unwrap();
    child.wait().unwrap();
    let start = Instant::now();
    assert_eq!(
        ipc::recv_message_timeout(&conn, Duration::from_secs(20)).unwrap_err(),
        Error::PeerGone
    );
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(
        ipc::send_message(&conn, b"x", &[]).unwrap_err(),
        Error::PeerGone
    );
}
