// 1 thread : N GPUs. Bind each device in turn; resources outlive the binds and are used
// again under the next binding of their device.
use gpubind::{Device, Error, ThreadContext};

fn run() -> gpubind::Result<()> {
    let mut ctx = ThreadContext::acquire()?;
    let devices = Device::all()?;
    let mut buffers = Vec::new();
    for dev in &devices {
        let gpu = ctx.bind(dev)?;
        buffers.push(gpu.clone_htod(&[dev.ordinal() as u32; 16])?);
    }
    for (dev, buf) in devices.iter().zip(&buffers) {
        let gpu = ctx.bind(dev)?;
        assert_eq!(gpu.dtoh(buf)?, vec![dev.ordinal() as u32; 16]);
    }
    Ok(())
}

fn main() {
    match run() {
        Err(Error::NoDriver) => println!("SKIPPED: no CUDA driver; compiled, nothing run"),
        other => other.unwrap(),
    }
}
