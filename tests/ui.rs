//! Compile-fail cases (ui-tests/fail, each with the compiler's .stderr) and the intended
//! patterns that must compile and run (ui-tests/pass). Regenerate the .stderr files after a
//! deliberate change with `TRYBUILD=overwrite cargo test --test ui`, then review the diff.

#[test]
fn ui() {
    if !gpubind::driver_available() {
        // Written to the process's stderr directly (libtest captures only the print
        // macros), so the line shows in `cargo test` output even when the test passes.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED ui-tests/pass: no CUDA driver; the pass programs compile and run their no-driver path only"
        );
    }
    let t = trybuild::TestCases::new();
    if cfg!(feature = "ipc") {
        t.compile_fail("ui-tests/fail/*.rs");
    } else {
        // The compiler's message for this case lists the types implementing
        // `DeviceMemoryMut`, three of which (`PoolSlice`, `ImportedSlice`, `LegacySlice`)
        // the `ipc` feature adds: its .stderr is the full build's.
        const FULL_BUILD_ONLY: &str = "write_through_shared_view.rs";
        let mut cases: Vec<_> = std::fs::read_dir("ui-tests/fail")
            .expect("ui-tests/fail")
            .map(|e| e.expect("ui-tests/fail entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .collect();
        cases.sort();
        let before = cases.len();
        cases.retain(|p| !p.ends_with(FULL_BUILD_ONLY));
        assert_eq!(before, cases.len() + 1, "{FULL_BUILD_ONLY} not found");
        for case in &cases {
            t.compile_fail(case);
        }
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED ui-tests/fail/{FULL_BUILD_ONLY}: its expected message lists the `ipc` feature's types (checked with that feature)"
        );
    }
    t.pass("ui-tests/pass/*.rs");
}
