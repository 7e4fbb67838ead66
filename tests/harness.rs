//! The GPU suites' harness (`tests/common`) itself: the parts that decide between pass,
//! fail and skip, tested without a GPU.

#[macro_use]
mod common;

use common::{TestFn, filter_error, run_with_timeout, skip};
use std::time::Duration;

fn ok() -> Result<(), String> {
    Ok(())
}
fn fails() -> Result<(), String> {
    Err("boom".into())
}
fn panics() -> Result<(), String> {
    panic!("kaboom")
}
fn hangs() -> Result<(), String> {
    std::thread::sleep(Duration::from_secs(30));
    Ok(())
}
fn skips() -> Result<(), String> {
    Err(skip("needs 2 GPUs, 1 visible"))
}

const TESTS: &[(&str, TestFn)] = &[("alpha_one", ok), ("beta_two", fails)];

#[test]
fn a_filter_that_matches_nothing_is_an_error() {
    let e = filter_error("suite", TESTS, Some("gamma")).expect("no test matches");
    assert!(e.contains("FAILED") && e.contains("gamma"), "{e}");
    assert_eq!(filter_error("suite", TESTS, Some("beta")), None);
    assert_eq!(filter_error("suite", TESTS, None), None);
}

#[test]
fn outcomes_are_reported_not_swallowed() {
    let limit = Duration::from_secs(10);
    assert_eq!(run_with_timeout(ok, limit), Ok(()));
    assert_eq!(run_with_timeout(fails, limit), Err("boom".into()));
    assert_eq!(run_with_timeout(panics, limit), Err("kaboom".into()));
    let s = run_with_timeout(skips, limit).unwrap_err();
    assert!(s.starts_with("skip: "), "{s}");
}

#[test]
fn a_hung_test_times_out() {
    let e = run_with_timeout(hangs, Duration::from_millis(200)).unwrap_err();
    assert!(e.contains("timed out"), "{e}");
}
