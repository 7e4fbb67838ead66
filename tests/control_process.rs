//! The control channel of the own-kernel backend across processes
//! (`gpubind::collective::ProcessGroup`) between real processes on this machine, without
//! a GPU: ranks that agree pass barriers and calls; a mismatch of op, type or length is
//! the same typed error on every rank; a wrong world size, a duplicate rank, garbage on
//! a rank's socket, a rank that exits, is killed or stays silent are typed errors naming
//! the rank, well within the timeout.
//!
//! The ranks are this test binary re-run as `<exe> child_entry --exact --nocapture`
//! with `GPUBIND_CTRL_TEST` set to `role,rank,world,key,timeout_ms`; each prints one
//! `CTRL-RESULT` line. `child_entry` does nothing in a normal run.

#![cfg(all(feature = "collective", feature = "ipc", target_os = "linux"))]

use gpubind::Error;
use gpubind::collective::ProcessGroup;
use std::io::Write;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const VAR: &str = "GPUBIND_CTRL_TEST";
const RESULT: &str = "CTRL-RESULT ";
/// The line on which a child reports how long its last operation took (in ms).
const TOOK: &str = "CTRL-TOOK ";

fn show(r: Result<(), Error>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => format!("err {e:?}"),
    }
}

/// Entry point of the child processes (a no-op unless `GPUBIND_CTRL_TEST` is set).
#[test]
fn child_entry() {
    let Ok(spec) = std::env::var(VAR) else {
        return;
    };
    let f: Vec<&str> = spec.split(',').collect();
    let (role, rank, world, key) = (f[0], f[1].parse().unwrap(), f[2].parse().unwrap(), f[3]);
    let timeout = Duration::from_millis(f[4].parse().unwrap());
    let mut last = Instant::now();
    let mut g = match ProcessGroup::connect(rank, world, key, timeout) {
        Ok(g) => g,
        Err(e) => {
            println!("{TOOK}{}", last.elapsed().as_millis());
            println!("{RESULT}err {e:?}");
            return;
        }
    };
    last = Instant::now();
    let out = match role {
        // Three barriers and one agreed call.
        "good" => (0..3)
            .try_for_each(|_| g.barrier())
            .and_then(|()| g.agree_for_test(9, 0, 1000)),
        // Every rank calls 1000 elements of type 0, except the named one.
        "count" => g.agree_for_test(9, 0, if rank == 2 { 999 } else { 1000 }),
        "dtype" => g.agree_for_test(9, if rank == 1 { 4 } else { 0 }, 1000),
        "kind" => g.agree_for_test(if rank == 0 { 10 } else { 9 }, 0, 1000),
        // Equal byte sizes: rank 1 calls 512 f64 where the others call 1024 f32.
        "bytes" => at_once(timeout, || {
            if rank == 1 {
                g.agree_for_test(9, 1, 512)
            } else {
                g.agree_for_test(9, 0, 1024)
            }
        }),
        // Ranks 0 and 2 claim overlapping bytes of one shared allocation (rank 1 another
        // allocation): the aliasing error on every rank, at once.
        "alias" => at_once(timeout, || {
            let (key, lo) = [(7, 0), (8, 0), (7, 4000)][rank];
            g.agree_shared_for_test(1000, key, lo, lo + 4096)
        }),
        // The same as "alias" with disjoint ranges: agreed.
        "disjoint" => at_once(timeout, || {
            let (key, lo) = [(7, 0), (8, 0), (7, 4096)][rank];
            g.agree_shared_for_test(1000, key, lo, lo + 4096)
        }),
        // The same two calls in another order on rank 2.
        "order" => at_once(timeout, || {
            let kinds = if rank == 2 { [10, 9] } else { [9, 10] };
            kinds.iter().try_for_each(|&k| g.agree_for_test(k, 0, 1000))
        }),
        // One barrier, then rank 2 exits; the others' next barrier fails.
        "exit" => g.barrier().and_then(|()| {
            if rank == 2 {
                std::process::exit(0);
            }
            last = Instant::now();
            g.barrier()
        }),
        // One barrier, then rank 2 sleeps (the parent kills it); the others wait.
        "killed" => g.barrier().and_then(|()| {
            if rank == 2 {
                println!("{RESULT}sleeping");
                std::io::stdout().flush().unwrap();
                std::thread::sleep(Duration::from_secs(600));
            }
            last = Instant::now();
            g.barrier()
        }),
        // Rank 2 stays connected but never calls (for longer than the others may wait).
        "silent" => {
            if rank == 2 {
                std::thread::sleep(timeout * 4);
                Ok(())
            } else {
                g.barrier()
            }
        }
        other => panic!("unknown role {other}"),
    };
    println!("{TOOK}{}", last.elapsed().as_millis());
    // A failed group fails every later call with the same error, at once.
    if let Err(e) = &out {
        let t = Instant::now();
        assert_eq!(g.barrier().as_ref().err(), Some(e));
        assert!(t.elapsed() < timeout / 4, "{:?}", t.elapsed());
    }
    println!("{RESULT}{}", show(out));
}

/// `f()`, or an error naming how long it took if that was a quarter of `timeout` or
/// more (a disagreement must be known at once, not at a timeout).
fn at_once(timeout: Duration, f: impl FnOnce() -> Result<(), Error>) -> Result<(), Error> {
    let t = Instant::now();
    let out = f();
    match t.elapsed() {
        d if d < timeout / 4 => out,
        d => Err(Error::InvalidArgument(format!(
            "took {d:?} (timeout {timeout:?}): {out:?}"
        ))),
    }
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

fn fresh_key(name: &str) -> String {
    format!(
        "ctrl-test-{name}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    )
}

fn spawn(role: &str, rank: usize, world: usize, key: &str, timeout_ms: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["child_entry", "--exact", "--nocapture", "--test-threads=1"])
        .env(VAR, format!("{role},{rank},{world},{key},{timeout_ms}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// The child's result line (after its exit; killed after `limit`).
fn result(child: Child, limit: Duration) -> String {
    result_timed(child, limit).0
}

/// The child's result line and how long its last operation took, as it measured it.
fn result_timed(mut child: Child, limit: Duration) -> (String, Duration) {
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("a child ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let last = |tag: &str| {
        text.lines()
            .filter_map(|l| l.find(tag).map(|i| l[i + tag.len()..].to_owned()))
            .next_back()
    };
    let took = last(TOOK)
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(u64::MAX);
    let line = last(RESULT).unwrap_or_else(|| format!("no result: {text}"));
    (line, Duration::from_millis(took))
}

/// Runs `world` ranks of `role`: each one's result line, and the longest time the last
/// operation of a rank of `timed` took (measured in the rank, so the start-up of the
/// processes, slow on a loaded machine, does not count).
fn run(role: &str, world: usize, timeout_ms: u64) -> (Vec<String>, Duration) {
    run_timing(role, world, timeout_ms, 0..world)
}

fn run_timing(
    role: &str,
    world: usize,
    timeout_ms: u64,
    timed_ranks: std::ops::Range<usize>,
) -> (Vec<String>, Duration) {
    let key = fresh_key(role);
    let children: Vec<Child> = (0..world)
        .map(|r| spawn(role, r, world, &key, timeout_ms))
        .collect();
    let timed: Vec<(String, Duration)> = children
        .into_iter()
        .map(|c| result_timed(c, Duration::from_secs(120)))
        .collect();
    let took = timed[timed_ranks]
        .iter()
        .filter(|(o, _)| !o.starts_with("no result"))
        .map(|&(_, t)| t)
        .max()
        .unwrap_or_default();
    println!("{role}: {timed:?} (timeout {timeout_ms} ms)");
    (timed.into_iter().map(|(o, _)| o).collect(), took)
}

const LONG_MS: u64 = 30_000;
/// What a fault seen without waiting for the timeout may take at most: a quarter of it.
const FAST: Duration = Duration::from_millis(LONG_MS / 4);

#[test]
fn agreeing_ranks_pass() {
    let (out, _) = run("good", 3, LONG_MS);
    assert_eq!(out, vec!["ok"; 3]);
}

fn assert_mismatch_on_all(role: &str, needle: &str) {
    let (out, took) = run(role, 3, LONG_MS);
    // The same error on every rank (the ranks see the same headers), long before the
    // timeout.
    for o in &out {
        assert!(
            o.starts_with("err InvalidArgument(\"collective mismatch") && o.contains(needle),
            "{out:?}"
        );
    }
    assert!(out.iter().all(|o| o == &out[0]), "{out:?}");
    assert!(took < FAST, "{took:?}");
}

#[test]
fn a_length_mismatch_is_the_same_typed_error_on_every_rank() {
    assert_mismatch_on_all("count", "rank 2 called a test call of 999 f32");
}

#[test]
fn a_dtype_mismatch_is_the_same_typed_error_on_every_rank() {
    assert_mismatch_on_all("dtype", "i32");
}

#[test]
fn an_op_mismatch_is_the_same_typed_error_on_every_rank() {
    assert_mismatch_on_all("kind", "rank 0 called");
}

#[test]
fn an_equal_byte_size_mismatch_is_typed_at_once_on_every_rank() {
    assert_mismatch_on_all("bytes", "rank 1 called a test call of 512 f64");
}

#[test]
fn calls_in_another_order_are_typed_at_once_on_every_rank() {
    assert_mismatch_on_all("order", "rank 2 called");
}

#[test]
fn ranks_sharing_memory_by_ipc_are_refused_on_every_rank() {
    let (out, took) = run("alias", 3, LONG_MS);
    for o in &out {
        assert!(
            o.starts_with(
                "err InvalidArgument(\"collective aliasing: rank 0's receive buffer and rank 2's"
            ),
            "{out:?}"
        );
    }
    assert!(out.iter().all(|o| o == &out[0]), "{out:?}");
    assert!(took < FAST, "{took:?}");
}

#[test]
fn ranks_with_disjoint_shared_memory_agree() {
    let (out, _) = run("disjoint", 3, LONG_MS);
    assert_eq!(out, vec!["ok"; 3]);
}

#[test]
fn a_rank_that_exits_fails_the_others_naming_it() {
    let (out, took) = run("exit", 3, LONG_MS);
    assert!(out[2].starts_with("no result"), "{out:?}");
    for o in &out[..2] {
        assert!(o.starts_with("err PeerFailed { rank: 2"), "{out:?}");
    }
    // The hang-up is seen at once, not at the timeout.
    assert!(took < FAST, "{took:?}");
}

#[test]
fn a_killed_rank_fails_the_others_naming_it() {
    let key = fresh_key("killed");
    let mut children: Vec<Child> = (0..3)
        .map(|r| spawn("killed", r, 3, &key, LONG_MS))
        .collect();
    // Wait until rank 2 is past the first barrier, then kill it.
    {
        use std::io::{BufRead, BufReader};
        let mut lines = BufReader::new(children[2].stdout.take().unwrap()).lines();
        loop {
            let l = lines.next().expect("rank 2 ended early").unwrap();
            if l.contains("CTRL-RESULT sleeping") {
                break;
            }
        }
    }
    let t = Instant::now();
    children[2].kill().unwrap();
    let _ = children[2].wait();
    let out: Vec<String> = children
        .drain(..2)
        .map(|c| result(c, Duration::from_secs(120)))
        .collect();
    let took = t.elapsed();
    println!("the others ended {took:?} after the kill (timeout {LONG_MS} ms): {out:?}");
    for o in &out {
        assert!(o.starts_with("err PeerFailed { rank: 2"), "{out:?}");
    }
    // The hang-up is seen at once, not at the timeout.
    assert!(took < FAST, "{took:?}");
}

#[test]
fn a_silent_rank_times_out_naming_it() {
    const TIMEOUT_MS: u64 = 2_000;
    let (out, took) = run_timing("silent", 3, TIMEOUT_MS, 0..2);
    for o in &out[..2] {
        // Either waited for rank 2 itself, or learned of the other's timeout.
        assert!(
            (o.starts_with("err PeerTimeout") && o.contains("ranks: [2"))
                || o.starts_with("err PeerFailed { rank: 0")
                || o.starts_with("err PeerFailed { rank: 1"),
            "{out:?}"
        );
    }
    assert!(
        out[..2].iter().any(|o| o.starts_with("err PeerTimeout")),
        "{out:?}"
    );
    // Rank 2 sleeps four timeouts; the others give up at their timeout, or earlier when
    // told of the other's: at most one timeout each, plus max(2 s, the timeout).
    let timeout = Duration::from_millis(TIMEOUT_MS);
    let limit = timeout + timeout.max(Duration::from_secs(2));
    assert!(took < limit, "{took:?} (limit {limit:?})");
}

#[test]
fn a_wrong_world_size_is_a_rendezvous_error_on_both() {
    let key = fresh_key("world");
    const TIMEOUT_MS: u64 = 10_000;
    let a = spawn("good", 0, 2, &key, TIMEOUT_MS);
    let b = spawn("good", 1, 3, &key, TIMEOUT_MS);
    let (a, took_a) = result_timed(a, Duration::from_secs(120));
    let (b, took_b) = result_timed(b, Duration::from_secs(120));
    let out = [a, b];
    println!("connects failed after {took_a:?} / {took_b:?} (timeout {TIMEOUT_MS} ms): {out:?}");
    for o in &out {
        assert!(
            o.starts_with("err Rendezvous") && o.contains("world size of 3"),
            "{out:?}"
        );
    }
    // Refused, not timed out: each rank's connect ends before its timeout.
    let limit = Duration::from_millis(TIMEOUT_MS * 9 / 10);
    assert!(took_a < limit && took_b < limit, "{took_a:?} / {took_b:?}");
}

#[test]
fn a_duplicate_rank_is_a_rendezvous_error() {
    let key = fresh_key("dup");
    let first = spawn("good", 1, 2, &key, 10_000);
    // The second rank 1 starts only once the first holds rank 1's socket.
    let t = Instant::now();
    while !listening(&key, 1) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the first rank 1 never listened"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let second = spawn("good", 1, 2, &key, 10_000);
    let dup = result(second, Duration::from_secs(60));
    assert!(
        dup.starts_with("err Rendezvous") && dup.contains("rank 1") && dup.contains("taken"),
        "{dup}"
    );
    let zero = spawn("good", 0, 2, &key, 10_000);
    assert_eq!(
        [
            result(zero, Duration::from_secs(60)),
            result(first, Duration::from_secs(60))
        ],
        ["ok", "ok"]
    );
}

/// The name of the abstract socket rank `rank` of job `key` listens on
/// (docs/collective.md).
fn socket_name(key: &str, rank: usize) -> String {
    let h = key_hash(key);
    let uid = rustix::process::geteuid().as_raw();
    format!("gpubind-pc-{uid}-{h:016x}-{rank}")
}

/// The abstract socket rank `rank` of job `key` listens on.
fn socket_of(key: &str, rank: usize) -> SocketAddr {
    SocketAddr::from_abstract_name(socket_name(key, rank).as_bytes()).unwrap()
}

/// Whether some process listens on rank `rank`'s socket of job `key`, seen in
/// `/proc/net/unix` (without connecting to it, which a rank would take for a peer).
fn listening(key: &str, rank: usize) -> bool {
    let name = format!("@{}", socket_name(key, rank));
    std::fs::read_to_string("/proc/net/unix")
        .unwrap()
        .lines()
        .any(|l| l.split_whitespace().last() == Some(name.as_str()))
}

/// The control protocol version this gpubind speaks (the control wire format's
/// `VERSION`): a frame of another version is refused, so the test must track it.
const CONTROL_VERSION: u16 = 3;

/// A gpubind control frame (`GBIM` framing of a `GBPC` message of `ty`).
fn control_message(ty: u8, body: &[u8]) -> Vec<u8> {
    let mut v = b"GBPC".to_vec();
    v.extend_from_slice(&CONTROL_VERSION.to_le_bytes());
    v.push(ty);
    v.extend_from_slice(body);
    v
}

/// Rank 1 (played by this process: a valid hello) connects to rank 0, then its
/// connection closes while rank 0 still waits for rank 2: rank 0 names rank 1 as dead
/// at once, not at its 20 s timeout (bound: a quarter of it).
#[test]
fn a_rank_dying_while_the_others_connect_is_named_at_once() {
    const TIMEOUT_MS: u64 = 20_000;
    let key = fresh_key("dies-connecting");
    let t = Instant::now();
    let zero = spawn("good", 0, 3, &key, TIMEOUT_MS);
    let s = loop {
        match UnixStream::connect_addr(&socket_of(&key, 0)) {
            Ok(s) => break s,
            Err(_) if t.elapsed() < Duration::from_secs(120) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("rank 0 never listened: {e}"),
        }
    };
    let mut hello = 3u32.to_le_bytes().to_vec();
    hello.extend_from_slice(&1u32.to_le_bytes());
    hello.extend_from_slice(&key_hash(&key).to_le_bytes());
    hello.extend_from_slice(&0u64.to_le_bytes());
    gpubind::ipc::send_message(&s, &control_message(1, &hello), &[]).unwrap();
    let welcome = gpubind::ipc::recv_message(&s).unwrap();
    assert_eq!(
        welcome.bytes,
        control_message(2, &[]),
        "rank 0 did not welcome rank 1"
    );
    let died = Instant::now();
    drop(s);
    let (out, took) = result_timed(zero, Duration::from_secs(120));
    let after = died.elapsed();
    println!(
        "rank 0 ended {after:?} after rank 1's connection closed ({took:?} in connect, timeout {TIMEOUT_MS} ms): {out}"
    );
    assert!(out.starts_with("err PeerFailed { rank: 1"), "{out}");
    assert!(after < Duration::from_millis(TIMEOUT_MS / 4), "{after:?}");
}

fn key_hash(key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[test]
fn garbage_on_a_rank_socket_is_a_typed_error() {
    let key = fresh_key("garbage");
    let t = Instant::now();
    const TIMEOUT_MS: u64 = 10_000;
    let zero = spawn("good", 0, 2, &key, TIMEOUT_MS);
    let mut s = loop {
        match UnixStream::connect_addr(&socket_of(&key, 0)) {
            Ok(s) => break s,
            Err(_) if t.elapsed() < Duration::from_secs(120) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("rank 0 never listened: {e}"),
        }
    };
    s.write_all(b"GET / HTTP/1.1\r\nHost: rank0\r\n\r\n")
        .unwrap();
    let (out, took) = result_timed(zero, Duration::from_secs(120));
    println!("rank 0's connect failed after {took:?} (timeout {TIMEOUT_MS} ms): {out}");
    assert!(
        out.starts_with("err Rendezvous") && out.contains("not gpubind's"),
        "{out}"
    );
    // Refused, not timed out.
    assert!(
        took < Duration::from_millis(TIMEOUT_MS * 9 / 10),
        "{took:?}"
    );
}
