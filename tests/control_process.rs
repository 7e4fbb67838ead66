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
    let mut g = match ProcessGroup::connect(rank, world, key, timeout) {
        Ok(g) => g,
        Err(e) => {
            println!("{RESULT}err {e:?}");
            return;
        }
    };
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
        "bytes" => within_a_second(|| {
            if rank == 1 {
                g.agree_for_test(9, 1, 512)
            } else {
                g.agree_for_test(9, 0, 1024)
            }
        }),
        // Ranks 0 and 2 claim overlapping bytes of one shared allocation (rank 1 another
        // allocation): the aliasing error on every rank, at once.
        "alias" => within_a_second(|| {
            let (key, lo) = [(7, 0), (8, 0), (7, 4000)][rank];
            g.agree_shared_for_test(1000, key, lo, lo + 4096)
        }),
        // The same as "alias" with disjoint ranges: agreed.
        "disjoint" => within_a_second(|| {
            let (key, lo) = [(7, 0), (8, 0), (7, 4096)][rank];
            g.agree_shared_for_test(1000, key, lo, lo + 4096)
        }),
        // The same two calls in another order on rank 2.
        "order" => within_a_second(|| {
            let kinds = if rank == 2 { [10, 9] } else { [9, 10] };
            kinds.iter().try_for_each(|&k| g.agree_for_test(k, 0, 1000))
        }),
        // One barrier, then rank 2 exits; the others' next barrier fails.
        "exit" => g.barrier().and_then(|()| {
            if rank == 2 {
                std::process::exit(0);
            }
            g.barrier()
        }),
        // One barrier, then rank 2 sleeps (the parent kills it); the others wait.
        "killed" => g.barrier().and_then(|()| {
            if rank == 2 {
                println!("{RESULT}sleeping");
                std::io::stdout().flush().unwrap();
                std::thread::sleep(Duration::from_secs(600));
            }
            g.barrier()
        }),
        // Rank 2 stays connected but never calls.
        "silent" => {
            if rank == 2 {
                std::thread::sleep(Duration::from_secs(8));
                Ok(())
            } else {
                g.barrier()
            }
        }
        other => panic!("unknown role {other}"),
    };
    // A failed group fails every later call with the same error, at once.
    if let Err(e) = &out {
        let t = Instant::now();
        assert_eq!(g.barrier().as_ref().err(), Some(e));
        assert!(t.elapsed() < Duration::from_millis(500));
    }
    println!("{RESULT}{}", show(out));
}

/// `f()`, or an error naming how long it took if that was a second or more (a
/// disagreement must be known at once, not at a timeout).
fn within_a_second(f: impl FnOnce() -> Result<(), Error>) -> Result<(), Error> {
    let t = Instant::now();
    let out = f();
    match t.elapsed() {
        d if d < Duration::from_secs(1) => out,
        d => Err(Error::InvalidArgument(format!("took {d:?}: {out:?}"))),
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
fn result(mut child: Child, limit: Duration) -> String {
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
    text.lines()
        .filter_map(|l| l.find(RESULT).map(|i| l[i + RESULT.len()..].to_owned()))
        .next_back()
        .unwrap_or_else(|| format!("no result: {text}"))
}

fn run(role: &str, world: usize, timeout_ms: u64) -> (Vec<String>, Duration) {
    let key = fresh_key(role);
    let t = Instant::now();
    let children: Vec<Child> = (0..world)
        .map(|r| spawn(role, r, world, &key, timeout_ms))
        .collect();
    let out = children
        .into_iter()
        .map(|c| result(c, Duration::from_secs(60)))
        .collect();
    (out, t.elapsed())
}

const LONG_MS: u64 = 30_000;

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
    assert!(took < Duration::from_secs(15), "{took:?}");
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
    assert!(took < Duration::from_secs(15), "{took:?}");
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
    assert!(took < Duration::from_secs(15), "{took:?}");
}

#[test]
fn a_killed_rank_fails_the_others_naming_it() {
    let key = fresh_key("killed");
    let t = Instant::now();
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
    children[2].kill().unwrap();
    let _ = children[2].wait();
    let out: Vec<String> = children
        .drain(..2)
        .map(|c| result(c, Duration::from_secs(60)))
        .collect();
    for o in &out {
        assert!(o.starts_with("err PeerFailed { rank: 2"), "{out:?}");
    }
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
}

#[test]
fn a_silent_rank_times_out_naming_it() {
    let (out, took) = run("silent", 3, 2_000);
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
    assert!(took < Duration::from_secs(20), "{took:?}");
}

#[test]
fn a_wrong_world_size_is_a_rendezvous_error_on_both() {
    let key = fresh_key("world");
    let t = Instant::now();
    let a = spawn("good", 0, 2, &key, 10_000);
    let b = spawn("good", 1, 3, &key, 10_000);
    let out = [
        result(a, Duration::from_secs(60)),
        result(b, Duration::from_secs(60)),
    ];
    for o in &out {
        assert!(
            o.starts_with("err Rendezvous") && o.contains("world size of 3"),
            "{out:?}"
        );
    }
    assert!(t.elapsed() < Duration::from_secs(9), "{:?}", t.elapsed());
}

#[test]
fn a_duplicate_rank_is_a_rendezvous_error() {
    let key = fresh_key("dup");
    let first = spawn("good", 1, 2, &key, 10_000);
    std::thread::sleep(Duration::from_millis(500));
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

/// The abstract socket rank `rank` of job `key` listens on (docs/collective.md).
fn socket_of(key: &str, rank: usize) -> SocketAddr {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let uid = rustix::process::geteuid().as_raw();
    SocketAddr::from_abstract_name(format!("gpubind-pc-{uid}-{h:016x}-{rank}").as_bytes()).unwrap()
}

#[test]
fn garbage_on_a_rank_socket_is_a_typed_error() {
    let key = fresh_key("garbage");
    let t = Instant::now();
    let zero = spawn("good", 0, 2, &key, 10_000);
    let mut s = loop {
        match UnixStream::connect_addr(&socket_of(&key, 0)) {
            Ok(s) => break s,
            Err(_) if t.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("rank 0 never listened: {e}"),
        }
    };
    s.write_all(b"GET / HTTP/1.1\r\nHost: rank0\r\n\r\n")
        .unwrap();
    let out = result(zero, Duration::from_secs(60));
    assert!(
        out.starts_with("err Rendezvous") && out.contains("not gpubind's"),
        "{out}"
    );
    assert!(t.elapsed() < Duration::from_secs(9), "{:?}", t.elapsed());
}
