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
    t.compile_fail("ui-tests/fail/*.rs");
    t.pass("ui-tests/pass/*.rs");
}
