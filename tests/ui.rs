//! Compile-fail cases (ui-tests/fail, each with the compiler's .stderr) and the intended
//! patterns that must compile and run (ui-tests/pass). Regenerate the .stderr files after a
//! deliberate change with `TRYBUILD=overwrite cargo test --test ui`, then review the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui-tests/fail/*.rs");
    t.pass("ui-tests/pass/*.rs");
}
