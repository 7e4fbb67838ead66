//! Quickstart: list devices, bind one, compile a kernel with NVRTC, run it, check it.
//!
//! `cargo run --example quickstart` — on a machine without a GPU it exits with status 1
//! and one line saying no CUDA driver was found.

use gpubind::{Device, LaunchConfig, ThreadContext};

const KERNEL: &str = r#"
extern "C" __global__ void saxpy(float a, const float* x, float* y, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}"#;

fn main() {
    if let Err(e) = run() {
        eprintln!("quickstart: {e}");
        std::process::exit(1);
    }
}

fn run() -> gpubind::Result<()> {
    // Listing devices and reading attributes creates no CUDA context.
    let devices = Device::all()?;
    for dev in &devices {
        let (major, minor) = dev.compute_capability()?;
        println!(
            "device {}: {} (sm_{major}{minor}, {} MiB, {})",
            dev.ordinal(),
            dev.name(),
            dev.total_memory()? >> 20,
            dev.uuid()
        );
    }

    // One token per thread; binding borrows it, so only one device is bound at a time.
    let mut ctx = ThreadContext::acquire()?;
    for dev in &devices {
        let gpu = ctx.bind(dev)?;
        let module = gpu.compile_and_load(KERNEL, "saxpy.cu")?;
        let saxpy = module.function("saxpy")?;

        let n: u32 = 1 << 20;
        let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let y: Vec<f32> = (0..n).map(|i| (n - i) as f32).collect();
        let dx = gpu.clone_htod(&x)?;
        let mut dy = gpu.clone_htod(&y)?;
        let a = 2.0f32;
        // SAFETY: the arguments match `saxpy(float, const float*, float*, unsigned)` and
        // the kernel checks `i < n`; it writes only `dy`, passed by `&mut` (`&dx` is
        // claimed as a read).
        unsafe {
            gpu.default_stream()
                .launch(&saxpy, LaunchConfig::for_num_elems(n))
                .arg(&a)
                .arg(&dx)
                .arg(&mut dy)
                .arg(&n)
                .launch()?;
        }
        let out = gpu.dtoh(&dy)?;
        let wrong = (0..n as usize)
            .filter(|&i| out[i] != a * x[i] + y[i])
            .count();
        if wrong > 0 {
            return Err(gpubind::Error::InvalidArgument(format!(
                "device {}: {wrong} of {n} results wrong",
                dev.ordinal()
            )));
        }
        println!(
            "device {}: saxpy over {n} elements matches the CPU",
            dev.ordinal()
        );
    }
    Ok(())
}
