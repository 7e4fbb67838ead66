//! The agreement of NCCL ranks across processes on every collective (`CallCheck`, made
//! by `LaunchEnv::exchange_id_checked_with`), between real processes on loopback and
//! without a GPU or NCCL: ranks that agree pass; ranks that disagree on the length or
//! the type all get the same typed error; a rank whose own call fails, exits, stays
//! silent or is rank 0 and dies makes every other rank fail typed, naming it, within the
//! timeout; a job that mixes checking and non-checking ranks is refused at the
//! rendezvous.
//!
//! The ranks are this test binary re-run as `<exe> child_entry --exact --nocapture`
//! with the launcher's variables and `GPUBIND_CHECK_TEST_ROLE` set; each prints one
//! `CHECK-RESULT` line. `child_entry` does nothing in a normal run.

#![cfg(feature = "collective")]

mod ranks;

use gpubind::collective::{LaunchEnv, NcclUniqueId};
use ranks::{Ranks, free_port, hang_limit, print_took, within_timeouts};
use std::process::Child;
use std::time::{Duration, Instant};

const ROLE: &str = "GPUBIND_CHECK_TEST_ROLE";
const RESULT: &str = "CHECK-RESULT ";
const RANKS: Ranks = Ranks {
    role_var: ROLE,
    result_prefix: RESULT,
};

fn test_id() -> NcclUniqueId {
    NcclUniqueId::from_bytes(&[5u8; 128]).unwrap()
}

/// Entry point of the child processes (a no-op unless `GPUBIND_CHECK_TEST_ROLE` is set).
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let env = LaunchEnv::from_env().expect("launcher variables");
    let rank = env.rank;
    if role == "plain" {
        // A rank that does not check calls (exchange_id, as for init_process).
        let out = env.exchange_id_with(|| Ok(test_id()));
        println!("{RESULT}{}", show(out.map(|_| ())));
        return;
    }
    let (id, check) = match env.exchange_id_checked_with(|| Ok(test_id())) {
        Ok(x) => x,
        Err(e) => {
            println!("{RESULT}{}", show(Err(e)));
            return;
        }
    };
    assert_eq!(id, test_id());
    let Some(mut check) = check else {
        println!("{RESULT}no check (world of one)");
        return;
    };
    assert_eq!((check.rank(), check.world_size()), (rank, env.world_size));
    let (kind, mut dtype, mut count) = (9u8, 0u8, 1000u64);
    match (role.as_str(), rank) {
        ("exit", 1) | ("rank0_exits", 0) => {
            println!("{RESULT}exiting");
            std::process::exit(0);
        }
        ("silent", 1) => {
            std::thread::sleep(env.timeout * 3);
            println!("{RESULT}slept");
            return;
        }
        ("local", 1) => {
            // Agrees once, then its next call is one it cannot make.
            let first = check.agree_for_test(kind, dtype, count);
            let e = check.fail_for_test("recv shorter than send");
            println!("{RESULT}{} then {e:?}", show(first));
            return;
        }
        ("alias", _) | ("disjoint", _) => {
            // Ranks 0 and 2 claim bytes of one shared allocation (rank 1 another one):
            // overlapping for "alias", disjoint for "disjoint".
            let step = if role == "alias" { 4000 } else { 4096 };
            let (key, lo) = [(7, 0), (8, 0), (7, step)][rank];
            let t = Instant::now();
            let out = check.agree_shared_for_test(count, key, lo, lo + 4096);
            print_took(t.elapsed());
            println!("{RESULT}{}", show(out));
            return;
        }
        ("length", 2) => count = 999,
        // The same bytes as the others' 1000 f32.
        ("bytes", 1) => (dtype, count) = (1, 500),
        ("dtype", 1) => dtype = 4,
        _ => {}
    }
    let mut out = Ok(());
    let t = Instant::now();
    for _ in 0..3 {
        out = check.agree_for_test(kind, dtype, count);
        if out.is_err() {
            break;
        }
    }
    print_took(t.elapsed());
    // A broken check returns the same error at once.
    if let Err(e) = &out {
        let t = Instant::now();
        let again = check.agree_for_test(kind, dtype, count);
        assert_eq!(again.as_ref().err(), Some(e));
        assert!(
            t.elapsed() < env.timeout / 4,
            "a broken check took {:?} to fail again (timeout {:?})",
            t.elapsed(),
            env.timeout
        );
    }
    println!("{RESULT}{}", show(out));
}

fn show(r: gpubind::Result<()>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => format!("err {e:?}"),
    }
}

/// The timeout of the jobs below that do not time out.
const TIMEOUT_S: f64 = 20.0;

/// Runs `world` ranks as `role` (the roles pick which rank misbehaves), with a timeout
/// of `timeout_s`: each rank's result, and how long its calls took (measured in it).
fn job_timed(role: &str, world: usize, timeout_s: f64) -> Vec<(String, Duration)> {
    let port = free_port();
    let kids: Vec<Child> = (0..world)
        .map(|r| RANKS.spawn(role, r, world, port, timeout_s))
        .collect();
    let got = RANKS.results_timed(kids, hang_limit(timeout_s, 2));
    println!("{role}: {got:?} (time in each rank; timeout {timeout_s} s)");
    got
}

/// [`job_timed`] with [`TIMEOUT_S`], results only.
fn job(role: &str, world: usize) -> Vec<String> {
    job_timed(role, world, TIMEOUT_S)
        .into_iter()
        .map(|(g, _)| g)
        .collect()
}

/// The results of `role`, asserting that every rank that ran its calls ended long
/// before the timeout (a quarter of it): a fault seen at once.
fn job_at_once(role: &str, world: usize) -> Vec<String> {
    let got = job_timed(role, world, TIMEOUT_S);
    let limit = Duration::from_secs_f64(TIMEOUT_S / 4.0);
    for (g, took) in &got {
        if *took != Duration::MAX {
            assert!(*took < limit, "{g}: took {took:?} (limit {limit:?})");
        }
    }
    got.into_iter().map(|(g, _)| g).collect()
}

#[test]
fn agreeing_ranks_pass() {
    let got = job("agree", 4);
    assert!(got.iter().all(|g| g == "ok"), "{got:?}");
}

#[test]
fn a_length_mismatch_is_the_same_typed_error_on_every_rank() {
    let got = job_at_once("length", 3);
    for g in &got {
        assert!(
            g.starts_with(
                "err InvalidArgument(\"collective mismatch: rank 0 called a test call of 1000"
            ) && g.contains("rank 2 called a test call of 999"),
            "{got:?}"
        );
    }
    assert!(got.iter().all(|g| g == &got[0]), "not the same: {got:?}");
}

#[test]
fn an_equal_byte_size_mismatch_is_the_same_typed_error_on_every_rank() {
    let got = job_at_once("bytes", 3);
    for g in &got {
        assert!(
            g.contains("collective mismatch") && g.contains("rank 1 called a test call of 500 f64"),
            "{got:?}"
        );
    }
    assert!(got.iter().all(|g| g == &got[0]), "not the same: {got:?}");
}

#[test]
fn ranks_sharing_memory_by_ipc_are_refused_on_every_rank() {
    let got = job_at_once("alias", 3);
    for g in &got {
        assert!(
            g.starts_with(
                "err InvalidArgument(\"collective aliasing: rank 0's receive buffer and rank 2's receive buffer"
            ),
            "{got:?}"
        );
    }
    assert!(got.iter().all(|g| g == &got[0]), "not the same: {got:?}");
    let got = job("disjoint", 3);
    assert!(got.iter().all(|g| g == "ok"), "{got:?}");
}

#[test]
fn a_dtype_mismatch_is_the_same_typed_error_on_every_rank() {
    let got = job_at_once("dtype", 3);
    for g in &got {
        assert!(
            g.contains("collective mismatch")
                && g.contains("rank 1 called a test call of 1000 i32"),
            "{got:?}"
        );
    }
    assert!(got.iter().all(|g| g == &got[0]), "not the same: {got:?}");
}

#[test]
fn a_rank_whose_call_fails_fails_the_others_naming_it() {
    let got = job_at_once("local", 3);
    assert!(
        got[1].starts_with("ok then InvalidArgument(\"recv shorter than send\")"),
        "{got:?}"
    );
    for g in [&got[0], &got[2]] {
        assert!(
            g.starts_with("err PeerFailed { rank: 1") && g.contains("recv shorter than send"),
            "{got:?}"
        );
    }
}

#[test]
fn a_rank_that_exits_fails_the_others_naming_it() {
    let got = job_at_once("exit", 3);
    assert_eq!(got[1], "exiting");
    for g in [&got[0], &got[2]] {
        assert!(g.starts_with("err PeerFailed { rank: 1"), "{got:?}");
    }
}

#[test]
fn rank_zero_exiting_fails_the_others_naming_it() {
    let got = job_at_once("rank0_exits", 3);
    assert_eq!(got[0], "exiting");
    for g in &got[1..] {
        assert!(g.starts_with("err PeerFailed { rank: 0"), "{got:?}");
    }
}

#[test]
fn a_silent_rank_times_out_naming_it_on_every_rank() {
    const SILENT_TIMEOUT_S: f64 = 1.0;
    let got = job_timed("silent", 3, SILENT_TIMEOUT_S);
    let (got0, got2) = (&got[0].0, &got[2].0);
    for g in [got0, got2] {
        assert!(
            g.starts_with("err PeerTimeout") && g.contains("ranks: [1]"),
            "{got0} / {got2}"
        );
    }
    // One timeout each, measured in the ranks.
    let limit = within_timeouts(SILENT_TIMEOUT_S, 1);
    for (g, took) in [&got[0], &got[2]] {
        assert!(*took < limit, "{g}: took {took:?} (limit {limit:?})");
    }
    assert_eq!(got[1].0, "slept");
}

#[test]
fn mixing_checking_and_plain_ranks_is_refused_at_the_rendezvous() {
    let port = free_port();
    let kids = vec![
        RANKS.spawn("agree", 0, 2, port, 5.0),
        RANKS.spawn("plain", 1, 2, port, 5.0),
    ];
    let got: Vec<String> = kids
        .into_iter()
        .map(|c| RANKS.result(c, hang_limit(5.0, 1)))
        .collect();
    for g in &got {
        assert!(
            g.starts_with("err Rendezvous") && g.contains("GPUBIND_CHECK_CALLS"),
            "{got:?}"
        );
    }
}

#[test]
fn the_variable_turns_the_check_off_and_bad_values_are_typed() {
    let base = [
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "0"),
        ("MASTER_ADDR", "127.0.0.1"),
    ];
    let env_with = |v: Option<&str>| {
        LaunchEnv::from_vars(|k| {
            if k == "GPUBIND_CHECK_CALLS" {
                return v.map(str::to_owned);
            }
            base.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, x)| x.to_string())
        })
    };
    assert!(env_with(None).unwrap().check_calls, "on by default");
    assert!(!env_with(Some("0")).unwrap().check_calls);
    assert!(!env_with(Some("Off")).unwrap().check_calls);
    assert!(env_with(Some("yes")).unwrap().check_calls);
    match env_with(Some("maybe")) {
        Err(gpubind::Error::LaunchEnv { variable, .. }) => {
            assert_eq!(variable, "GPUBIND_CHECK_CALLS")
        }
        other => panic!("{other:?}"),
    }
    assert!(!env_with(None).unwrap().with_call_check(false).check_calls);
}
