//! The multi-process rendezvous (`LaunchEnv::exchange_id_with`) between real processes
//! on loopback, without a GPU: every rank gets the same id, and every bad input (a
//! duplicate rank, a wrong world size, a rank that never comes, garbage, a wrong
//! protocol version, a rank that dies or is killed part-way) is a typed error on every
//! process, well within the timeout.
//!
//! The ranks are this test binary re-run as `<exe> child_entry --exact --nocapture`
//! with the launcher's variables (`RANK`, `WORLD_SIZE`, …) and `GPUBIND_RDZV_TEST_ROLE`
//! set; each prints one `RDZV-RESULT` line. `child_entry` does nothing in a normal run.
//! Frames the tests forge are encoded here from the wire format documented in
//! docs/collective.md ("Deployment"), independently of the library's encoder.

#![cfg(feature = "collective")]

mod ranks;

use gpubind::Error;
use gpubind::collective::{LaunchEnv, NcclUniqueId};
use ranks::{Ranks, free_port, hang_limit, print_took, within_timeouts};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Child;
use std::time::{Duration, Instant};

const ROLE: &str = "GPUBIND_RDZV_TEST_ROLE";
const RESULT: &str = "RDZV-RESULT ";
const RANKS: Ranks = Ranks {
    role_var: ROLE,
    result_prefix: RESULT,
};

/// The id rank 0 hands out in these tests.
fn test_id() -> NcclUniqueId {
    let bytes: Vec<u8> = (0..128u32).map(|i| (i * 7 + 3) as u8).collect();
    NcclUniqueId::from_bytes(&bytes).unwrap()
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A frame as docs/collective.md specifies it.
fn forge(version: u16, kind: u8, world: u32, rank: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = b"GBRZ".to_vec();
    v.extend_from_slice(&version.to_le_bytes());
    v.push(kind);
    v.push(0);
    v.extend_from_slice(&world.to_le_bytes());
    v.extend_from_slice(&rank.to_le_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(payload);
    let sum = fnv1a64(&v);
    v.extend_from_slice(&sum.to_le_bytes());
    v
}

fn connect_retrying(port: u16) -> TcpStream {
    let start = Instant::now();
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return s,
            Err(e) if start.elapsed() < Duration::from_secs(10) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("cannot reach rank 0: {e}"),
        }
    }
}

/// Entry point of the child processes (a no-op unless `GPUBIND_RDZV_TEST_ROLE` is set).
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let port = || -> u16 { std::env::var("GPUBIND_RDZV_PORT").unwrap().parse().unwrap() };
    let var = |k: &str| -> u32 { std::env::var(k).unwrap().parse().unwrap() };
    match role.as_str() {
        // A real rank: the library's rendezvous.
        "rank" => {
            let t = Instant::now();
            let out = LaunchEnv::from_env().and_then(|env| env.exchange_id_with(|| Ok(test_id())));
            print_took(t.elapsed());
            match out {
                Ok(id) => println!("{RESULT}ok {id}"),
                Err(e) => println!("{RESULT}err {e:?}"),
            }
        }
        // Writes bytes that are not a frame, after a pause (so the real ranks have
        // checked in), then prints what rank 0 answered.
        "garbage" => {
            std::thread::sleep(Duration::from_millis(1500));
            let mut s = connect_retrying(port());
            s.write_all(b"GET / HTTP/1.1\r\nHost: rank0\r\n\r\n")
                .unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut answer = Vec::new();
            let _ = s.read_to_end(&mut answer);
            println!(
                "{RESULT}answer {}",
                String::from_utf8_lossy(&answer[..4.min(answer.len())])
            );
        }
        // A well-formed hello of another protocol version (this build speaks 2).
        "version3" => {
            let mut s = connect_retrying(port());
            s.write_all(&forge(3, 1, var("WORLD_SIZE"), var("RANK"), &[]))
                .unwrap();
            let mut answer = Vec::new();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let _ = s.read_to_end(&mut answer);
            println!(
                "{RESULT}answer {}",
                String::from_utf8_lossy(&answer[..4.min(answer.len())])
            );
        }
        // Checks in with a valid hello, then exits at once (dies mid-handshake).
        "hello_then_exit" => {
            let mut s = connect_retrying(port());
            s.write_all(&forge(2, 1, var("WORLD_SIZE"), var("RANK"), &[]))
                .unwrap();
            println!("{RESULT}exiting");
            std::process::exit(0);
        }
        // Checks in with a valid hello, says so, then waits to be killed.
        "hello_then_sleep" => {
            let mut s = connect_retrying(port());
            s.write_all(&forge(2, 1, var("WORLD_SIZE"), var("RANK"), &[]))
                .unwrap();
            println!("{RESULT}checked in");
            std::io::stdout().flush().unwrap();
            std::thread::sleep(Duration::from_secs(120));
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn four_processes_get_rank_zeros_id() {
    let port = free_port();
    let children: Vec<Child> = (0..4)
        .map(|r| RANKS.spawn("rank", r, 4, port, 20.0))
        .collect();
    let expected = format!("ok {}", test_id());
    for (r, got) in RANKS
        .results(children, hang_limit(20.0, 1))
        .iter()
        .enumerate()
    {
        assert_eq!(got, &expected, "rank {r}");
    }
}

#[test]
fn duplicate_rank_fails_every_process() {
    let port = free_port();
    let children = vec![
        RANKS.spawn("rank", 0, 3, port, 3.0),
        RANKS.spawn("rank", 1, 3, port, 3.0),
        RANKS.spawn("rank", 1, 3, port, 3.0),
    ];
    for (i, got) in RANKS
        .results(children, hang_limit(3.0, 2))
        .iter()
        .enumerate()
    {
        assert!(
            got.starts_with("err Rendezvous") && got.contains("rank 1 checked in twice"),
            "process {i}: {got}"
        );
    }
}

#[test]
fn different_world_sizes_fail_every_process() {
    let port = free_port();
    let children = vec![
        RANKS.spawn("rank", 0, 2, port, 3.0),
        RANKS.spawn("rank", 1, 3, port, 3.0),
    ];
    for (i, got) in RANKS
        .results(children, hang_limit(3.0, 2))
        .iter()
        .enumerate()
    {
        assert!(
            got.starts_with("err Rendezvous") && got.contains("world size of 3, rank 0 with 2"),
            "process {i}: {got}"
        );
    }
}

#[test]
fn rank_that_never_comes_is_named_on_every_process() {
    let port = free_port();
    const TIMEOUT_S: f64 = 1.0;
    let children = vec![
        RANKS.spawn("rank", 0, 3, port, TIMEOUT_S),
        RANKS.spawn("rank", 1, 3, port, TIMEOUT_S),
    ];
    let got = RANKS.results_timed(children, hang_limit(TIMEOUT_S, 2));
    println!("{got:?} (time in each rank; timeout {TIMEOUT_S} s)");
    for (i, (got, _)) in got.iter().enumerate() {
        assert!(
            got.starts_with("err PeerTimeout") && got.contains("ranks: [2]"),
            "process {i}: {got}"
        );
    }
    // One timeout (rank 1 may wait for rank 0's verdict: at most one more), measured in
    // the ranks.
    let limit = within_timeouts(TIMEOUT_S, 2);
    for (i, (_, took)) in got.iter().enumerate() {
        assert!(*took < limit, "rank {i} took {took:?} (limit {limit:?})");
    }
}

#[test]
fn rank_zero_that_never_comes_is_a_timeout_naming_it() {
    let port = free_port();
    const TIMEOUT_S: f64 = 1.0;
    let (got, took) = RANKS.result_timed(
        RANKS.spawn("rank", 1, 2, port, TIMEOUT_S),
        hang_limit(TIMEOUT_S, 1),
    );
    println!("timed out after {took:?} in the rank (timeout {TIMEOUT_S} s)");
    assert!(
        got.starts_with("err PeerTimeout") && got.contains("ranks: [0]"),
        "{got}"
    );
    // One timeout (connecting: no verdict to wait for).
    let limit = within_timeouts(TIMEOUT_S, 1);
    assert!(took < limit, "{took:?} (limit {limit:?})");
}

#[test]
fn garbage_on_the_port_fails_rank_zero_and_is_answered() {
    let port = free_port();
    let children = vec![
        RANKS.spawn("rank", 0, 3, port, 4.0),
        RANKS.spawn("rank", 1, 3, port, 4.0),
        RANKS.spawn("garbage", 2, 3, port, 4.0),
    ];
    let got = RANKS.results(children, hang_limit(4.0, 2));
    assert!(
        got[0].starts_with("err Rendezvous") && got[0].contains("not a gpubind rendezvous hello"),
        "rank 0: {}",
        got[0]
    );
    // Rank 1 checked in long before the garbage came (1.5 s later): it gets rank 0's
    // error.
    assert_eq!(got[1], got[0], "rank 1");
    // The stranger is told too, in a frame.
    assert_eq!(got[2], "answer GBRZ");
}

#[test]
fn another_protocol_version_fails_every_process() {
    let port = free_port();
    let children = vec![
        RANKS.spawn("rank", 0, 2, port, 3.0),
        RANKS.spawn("version3", 1, 2, port, 3.0),
    ];
    let got = RANKS.results(children, hang_limit(3.0, 2));
    assert!(
        got[0].starts_with("err Rendezvous") && got[0].contains("protocol version 3"),
        "{}",
        got[0]
    );
    assert_eq!(got[1], "answer GBRZ");
}

/// Rank 2 says hello, then exits mid-handshake: rank 0 names it, and so does rank 1
/// (or, if it came after rank 0 gave up, names rank 0).
#[test]
fn rank_dying_mid_handshake_is_named_on_every_process() {
    let port = free_port();
    let children = vec![
        RANKS.spawn("rank", 0, 3, port, 3.0),
        RANKS.spawn("rank", 1, 3, port, 3.0),
        RANKS.spawn("hello_then_exit", 2, 3, port, 3.0),
    ];
    let got = RANKS.results(children, hang_limit(3.0, 2));
    assert!(
        got[0].starts_with("err PeerFailed { rank: 2"),
        "rank 0: {}",
        got[0]
    );
    // Rank 1 learns it from rank 0, unless rank 0 had already given up on the dead rank
    // (and closed its listener) before rank 1 reached it: then rank 1 names rank 0.
    let names_zero = got[1].starts_with("err PeerFailed { rank: 0")
        || (got[1].starts_with("err PeerTimeout") && got[1].contains("ranks: [0]"));
    assert!(
        got[1].starts_with("err PeerFailed { rank: 2") || names_zero,
        "rank 1: {}",
        got[1]
    );
    assert_eq!(got[2], "exiting");
}

/// Rank 1 checks in, then is killed while rank 0 still waits for rank 2 (which never
/// comes): rank 0 names rank 1 as dead as soon as its connection hangs up, long before
/// its 20 s timeout (bound: a quarter of it).
#[test]
fn rank_killed_while_rank_zero_waits_for_others_is_named_at_once() {
    use std::io::{BufRead, BufReader};
    const TIMEOUT_S: f64 = 20.0;
    let port = free_port();
    let r0 = RANKS.spawn("rank", 0, 3, port, TIMEOUT_S);
    let mut r1 = RANKS.spawn("hello_then_sleep", 1, 3, port, TIMEOUT_S);
    let mut lines = BufReader::new(r1.stdout.take().unwrap()).lines();
    loop {
        let l = lines.next().expect("rank 1 ended early").unwrap();
        if l.contains("checked in") {
            break;
        }
    }
    // Let rank 0 read the hello.
    std::thread::sleep(Duration::from_millis(300));
    let killed = Instant::now();
    r1.kill().unwrap();
    r1.wait().unwrap();
    let got = RANKS.result(r0, hang_limit(TIMEOUT_S, 1));
    let took = killed.elapsed();
    println!("rank 0 ended {took:?} after the kill (timeout {TIMEOUT_S} s): {got}");
    assert!(got.starts_with("err PeerFailed { rank: 1"), "{got}");
    assert!(took < Duration::from_secs_f64(TIMEOUT_S / 4.0), "{took:?}");
}

/// Rank 1 is killed (after or before its hello), then rank 2 starts: rank 0 names
/// rank 1; rank 2 either learns the same from rank 0 or, when rank 0 had already given
/// up on the dead rank before rank 2 reached it, fails naming rank 0.
#[test]
fn killed_rank_is_named_on_every_other_process() {
    const TIMEOUT_S: f64 = 3.0;
    let port = free_port();
    let r0 = RANKS.spawn("rank", 0, 3, port, TIMEOUT_S);
    let mut r1 = RANKS.spawn("rank", 1, 3, port, TIMEOUT_S);
    std::thread::sleep(Duration::from_millis(500));
    r1.kill().unwrap();
    r1.wait().unwrap();
    let r2 = RANKS.spawn("rank", 2, 3, port, TIMEOUT_S);
    let timed = RANKS.results_timed(vec![r0, r2], hang_limit(TIMEOUT_S, 1));
    println!("ranks 0 and 2 (time in each rank; timeout {TIMEOUT_S} s): {timed:?}");
    let got: Vec<&String> = timed.iter().map(|(g, _)| g).collect();
    // Killed after its hello: PeerFailed; killed before it: it never came.
    let names_1 = |g: &str| {
        g.starts_with("err PeerFailed { rank: 1")
            || (g.starts_with("err PeerTimeout") && g.contains("ranks: [1]"))
    };
    let names_0 = |g: &str| {
        g.starts_with("err PeerFailed { rank: 0")
            || (g.starts_with("err PeerTimeout") && g.contains("ranks: [0]"))
    };
    assert!(names_1(got[0]), "rank 0: {}", got[0]);
    assert!(names_1(got[1]) || names_0(got[1]), "rank 2: {}", got[1]);
    // At most one timeout each, measured in the ranks.
    let limit = within_timeouts(TIMEOUT_S, 1);
    for (g, took) in &timed {
        assert!(*took < limit, "{g}: took {took:?} (limit {limit:?})");
    }
}

/// A fake rank 0 in this process: accepts one connection, reads the hello, then runs
/// `answer` on the stream.
fn fake_rank0(
    answer: impl FnOnce(TcpStream) + Send + 'static,
) -> (u16, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut hello = [0u8; 28];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..4], b"GBRZ");
        answer(s);
    });
    (port, h)
}

#[test]
fn rank_zero_closing_mid_handshake_is_peer_failed() {
    let (port, h) = fake_rank0(drop);
    let got = RANKS.result(RANKS.spawn("rank", 1, 2, port, 3.0), hang_limit(3.0, 1));
    assert!(got.starts_with("err PeerFailed { rank: 0"), "{got}");
    h.join().unwrap();
}

#[test]
fn rank_zero_answering_garbage_is_a_rendezvous_error() {
    let (port, h) = fake_rank0(|mut s| {
        s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").unwrap();
    });
    let got = RANKS.result(RANKS.spawn("rank", 1, 2, port, 3.0), hang_limit(3.0, 1));
    assert!(
        got.starts_with("err Rendezvous") && got.contains("not a gpubind rendezvous frame"),
        "{got}"
    );
    h.join().unwrap();
}

#[test]
fn rank_zero_of_another_version_is_a_rendezvous_error() {
    let (port, h) = fake_rank0(|mut s| {
        s.write_all(&forge(9, 2, 2, 1, &[0; 128])).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    });
    let got = RANKS.result(RANKS.spawn("rank", 1, 2, port, 3.0), hang_limit(3.0, 1));
    assert!(
        got.starts_with("err Rendezvous") && got.contains("protocol version 9"),
        "{got}"
    );
    h.join().unwrap();
}

#[test]
fn a_port_in_use_is_a_rendezvous_error_naming_the_variable() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let env = LaunchEnv::from_vars(|k| match k {
        "RANK" => Some("0".into()),
        "WORLD_SIZE" => Some("2".into()),
        "LOCAL_RANK" => Some("0".into()),
        "MASTER_ADDR" => Some("127.0.0.1".into()),
        "GPUBIND_RDZV_PORT" => Some(port.to_string()),
        _ => None,
    })
    .unwrap();
    let e = env.exchange_id_with(|| Ok(test_id())).unwrap_err();
    assert!(
        matches!(&e, Error::Rendezvous { reason } if reason.contains("GPUBIND_RDZV_PORT")),
        "{e:?}"
    );
}
