//! `SCM_RIGHTS` transport between real processes, without a GPU.
//!
//! The child is this test binary re-run as `<exe> child_entry --exact` with
//! `GPUBIND_IPC_TEST_ROLE` and `GPUBIND_IPC_TEST_SOCKET` set; `child_entry` does nothing
//! in a normal run.

use gpubind::Error;
use gpubind::ipc::{self, PoolHandle};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
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
        // Takes one message (the descriptors of an exporter), then hangs until killed
        // without replying.
        "silent_importer" => {
            let _got = ipc::recv_message(&conn).unwrap();
            std::thread::sleep(Duration::from_secs(60));
        }
        // Runs out of descriptors on purpose (RLIMIT_NOFILE lowered, the free slots
        // filled), then receives a message carrying descriptors and reports the outcome.
        "fdlimit" => {
            let limit = libc::rlimit {
                rlim_cur: 64,
                rlim_max: 64,
            };
            // SAFETY: setrlimit reads one rlimit struct that lives on our stack; this
            // child process only lowers its own limit.
            assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
            let mut filler = Vec::new();
            loop {
                match std::fs::File::open("/dev/null") {
                    Ok(f) => filler.push(f),
                    Err(e) if e.raw_os_error() == Some(libc::EMFILE) => break,
                    Err(e) => panic!("open: {e}"),
                }
            }
            let outcome = ipc::recv_message(&conn);
            drop(filler);
            let reply = match outcome {
                Ok(m) => format!("ok: {} descriptors", m.fds.len()),
                Err(e) => format!("{e:?}\n{e}"),
            };
            ipc::send_message(&conn, reply.as_bytes(), &[]).unwrap();
        }
        // Runs as another uid (the parent set it): the default policy must refuse the
        // parent in both directions; then it reports with the policy widened.
        "other_uid" => {
            let recv = ipc::recv_message_timeout(&conn, Duration::from_secs(5));
            let send = ipc::send_message(&conn, b"should not arrive", &[]);
            let any = ipc::TransportOptions::default().peer(ipc::PeerPolicy::AnyUid);
            let reply = format!("recv: {:?}\nsend: {:?}", recv.map(|m| m.bytes), send);
            ipc::send_message_with(&conn, reply.as_bytes(), &[], &any).unwrap();
        }
        other => panic!("unknown role {other}"),
    }
}

fn spawn(role: &str) -> (Child, UnixStream) {
    spawn_with(role, |_| {})
}

/// Starts the child for `role` (after `adjust` set up its command) and accepts its
/// connection.
fn spawn_with(role: &str, adjust: impl FnOnce(&mut Command)) -> (Child, UnixStream) {
    let path = std::env::temp_dir().join(format!(
        "gpubind-ipc-process-{}-{role}.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    // Anyone may connect: the peer check, not the file mode, is under test.
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["child_entry", "--exact", "--test-threads=1"])
        .env(ROLE, role)
        .env(SOCKET, &path)
        .stdout(Stdio::null());
    adjust(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let start = Instant::now();
    let conn = loop {
        match listener.accept() {
            Ok((c, _)) => break c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Some(status) = child.try_wait().unwrap() {
                    panic!("child exited with {status} before connecting");
                }
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
    let buffers: Vec<gpubind::ipc::BufferHandle> = (1..=3)
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
    let timeout = Duration::from_secs(20);
    let start = Instant::now();
    assert_eq!(
        ipc::recv_message_timeout(&conn, timeout).unwrap_err(),
        Error::PeerGone
    );
    let took = start.elapsed();
    println!("PeerGone after {took:?} (timeout {timeout:?})");
    assert!(took < timeout / 4, "{took:?}");
    assert_eq!(
        ipc::send_message(&conn, b"x", &[]).unwrap_err(),
        Error::PeerGone
    );
}

/// The exporter's side of a conversation whose importer is SIGKILLed while the
/// exporter waits for its reply: the wait ends with `PeerGone` as soon as the socket
/// hangs up, far inside the 20 s timeout it was given (bound: a quarter of it).
#[test]
fn an_importer_killed_while_the_exporter_waits_is_peer_gone_at_once() {
    let timeout = Duration::from_secs(20);
    let (mut child, conn) = spawn("silent_importer");
    let shared = pipe_with("exported");
    ipc::send_message_timeout(&conn, b"handles", &[shared.as_fd()], timeout).unwrap();
    let pid = child.id();
    let killer = std::thread::spawn(move || {
        // Kill only once the exporter is inside its wait.
        std::thread::sleep(Duration::from_millis(300));
        let killed = Instant::now();
        child.kill().unwrap();
        child.wait().unwrap();
        killed
    });
    let waited = Instant::now();
    let err = ipc::recv_message_timeout(&conn, timeout).unwrap_err();
    let ended = Instant::now();
    let killed = killer.join().unwrap();
    let after_kill = ended.saturating_duration_since(killed);
    println!(
        "importer {pid} killed: the exporter's wait ended {after_kill:?} after the kill \
         ({:?} in all, timeout {timeout:?}) with {err:?}",
        ended - waited
    );
    assert_eq!(err, Error::PeerGone);
    assert!(after_kill < timeout / 4, "{after_kill:?}");
    // Sending to the dead importer is the same error, at once.
    let t = Instant::now();
    assert_eq!(
        ipc::send_message_timeout(&conn, b"more", &[shared.as_fd()], timeout).unwrap_err(),
        Error::PeerGone
    );
    assert!(t.elapsed() < timeout / 4, "{:?}", t.elapsed());
}

#[test]
fn a_child_out_of_descriptors_reports_fd_limit() {
    let (mut child, conn) = spawn("fdlimit");
    let (a, b) = (pipe_with("one"), pipe_with("two"));
    {
        use std::os::fd::AsFd;
        ipc::send_message(&conn, b"two descriptors", &[a.as_fd(), b.as_fd()]).unwrap();
    }
    let reply = ipc::recv_message_timeout(&conn, Duration::from_secs(30)).unwrap();
    assert!(child.wait().unwrap().success());
    let reply = String::from_utf8(reply.bytes).unwrap();
    // Typed (the Debug form names the variant), with the limit the child set, and a
    // message that puts the blame on the receiving process, not on the sender.
    assert!(
        reply.starts_with("FdLimit { received: 0, soft_limit: Some(64) }"),
        "{reply}"
    );
    assert!(
        reply.contains("the receiving process ran out of file descriptors"),
        "{reply}"
    );
    assert!(
        !reply.contains("more file descriptors than the limit"),
        "{reply}"
    );
}

#[test]
fn a_peer_of_another_uid_is_refused_both_ways() {
    // SAFETY: geteuid has no preconditions.
    let own = unsafe { libc::geteuid() };
    if own != 0 {
        println!(
            "SKIPPED a_peer_of_another_uid_is_refused_both_ways: needs root to start a child as another uid (running as uid {own})"
        );
        return;
    }
    let other: u32 = 65534; // nobody
    let (mut child, conn) = spawn_with("other_uid", |cmd| {
        use std::os::unix::process::CommandExt;
        cmd.uid(other).gid(other);
    });
    let cred = ipc::peer_credentials(&conn).unwrap();
    assert_eq!(cred.uid, other);
    assert_eq!(cred.pid as u32, child.id());
    // Default policy: refused before a byte is read or written, naming both uids.
    let err = ipc::recv_message(&conn).unwrap_err();
    assert!(
        matches!(&err, Error::PeerNotAllowed { peer_uid, own_uid: 0, .. } if *peer_uid == other),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("uid 65534") && text.contains("uid 0"),
        "{text}"
    );
    assert!(matches!(
        ipc::send_message(&conn, b"x", &[]),
        Err(Error::PeerNotAllowed { .. })
    ));
    // Allowed by a list naming it: the child's report arrives.
    let allow = ipc::TransportOptions::default()
        .peer(ipc::PeerPolicy::Uids(vec![other]))
        .timeout(Duration::from_secs(30));
    let reply = ipc::recv_message_with(&conn, &allow).unwrap();
    assert!(child.wait().unwrap().success());
    let reply = String::from_utf8(reply.bytes).unwrap();
    // The child refused us the same way (its recv and send both failed on the check;
    // our refused send put nothing on the wire).
    assert!(
        reply.contains("recv: Err(PeerNotAllowed { peer_pid: ")
            && reply.contains("peer_uid: 0, own_uid: 65534"),
        "{reply}"
    );
    assert!(reply.contains("send: Err(PeerNotAllowed"), "{reply}");
}
