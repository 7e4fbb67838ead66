// 1 thread per GPU: each scoped thread acquires its own token. Devices and slices are
// Send + Sync, so they can be shared with and returned from the threads.
use gpubind::{Device, DeviceSlice, Error, ThreadContext};

fn run() -> gpubind::Result<()> {
    let devices = Device::all()?;
    let slices: Vec<DeviceSlice<f32>> = std::thread::scope(|s| {
        let handles: Vec<_> = devices
            .iter()
            .map(|dev| {
                s.spawn(move || -> gpubind::Result<DeviceSlice<f32>> {
                    let mut ctx = ThreadContext::acquire()?;
                    let gpu = ctx.bind(dev)?;
                    gpu.alloc_zeros::<f32>(1024)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect::<gpubind::Result<_>>()
    })?;
    drop(slices); // dropped on the main thread, no binding needed
    Ok(())
}

fn main() {
    match run() {
        Err(Error::NoDriver) => println!("SKIPPED: no CUDA driver; compiled, nothing run"),
        other => other.unwrap(),
    }
}
