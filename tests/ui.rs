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
        // The compiler's messages for the first two list the types implementing
        // `DeviceMemoryMut` or `DeviceOnlyMemory`, four of which (`PoolSlice`,
        // `ImportedSlice`, `LegacySlice`, `LentImport`) the `ipc` feature adds: their
        // .stderr are the full build's. The third uses the `ipc` feature's types; the
        // fourth's message lists `WritableArg` types, some of them the `ipc` feature's.
        const FULL_BUILD_ONLY: &[&str] = &[
            "write_through_shared_view.rs",
            "capture_memset_managed.rs",
            "write_shared_for_reading.rs",
            "write_shared_managed_view.rs",
        ];
        let mut cases: Vec<_> = std::fs::read_dir("ui-tests/fail")
            .expect("ui-tests/fail")
            .map(|e| e.expect("ui-tests/fail entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .collect();
        cases.sort();
        let before = cases.len();
        cases.retain(|p| !FULL_BUILD_ONLY.iter().any(|f| p.ends_with(f)));
        assert_eq!(
            before,
            cases.len() + FULL_BUILD_ONLY.len(),
            "{FULL_BUILD_ONLY:?} not all found"
        );
        for case in &cases {
            t.compile_fail(case);
        }
        use std::io::Write;
        for f in FULL_BUILD_ONLY {
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED ui-tests/fail/{f}: it or its expected message names the `ipc` feature's types (checked with that feature)"
            );
        }
    }
    t.pass("ui-tests/pass/*.rs");
}
