mod common;
fn main() {
    common::run_suite("gpu_collective", &[]);
}
