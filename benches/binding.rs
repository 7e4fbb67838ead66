//! CPU-side costs of gpubind, through the public API only (criterion).
//!
//! What needs no GPU: taking and returning the per-thread token, the cached outcome of
//! `init` (which every `Device::count`/`get` starts with), `LaunchConfig::for_num_elems`
//! and `Uuid` formatting. With a GPU, also the whole `bind` fast path — the lazily
//! retained context's uncontended lock plus the `cuCtxGetCurrent` check that replaced
//! the token's cache (no `cuCtxSetCurrent`: the context is already current). Without a
//! GPU that bench prints why it was skipped. The other GPU-side costs (memsets, copies,
//! launches) are in `gpubench` (`examples/gpubench.rs`, see docs/performance.md).
//!
//! `cargo bench --bench binding` (a few seconds; add `-- --quick` for a faster pass).

use criterion::{Criterion, criterion_group, criterion_main};
use gpubind::{Device, Error, LaunchConfig, ThreadContext, Uuid};
use std::hint::black_box;
use std::time::Duration;

fn token(c: &mut Criterion) {
    c.bench_function("ThreadContext::acquire + drop", |b| {
        b.iter(|| drop(black_box(ThreadContext::acquire().unwrap())))
    });
    let held = ThreadContext::acquire().unwrap();
    c.bench_function("ThreadContext::acquire while held (error)", |b| {
        b.iter(|| {
            let e = black_box(ThreadContext::acquire()).unwrap_err();
            assert_eq!(e, Error::ThreadContextTaken);
        })
    });
    drop(held);
}

fn init(c: &mut Criterion) {
    let first = gpubind::init();
    c.bench_function("gpubind::init, after the first call", |b| {
        b.iter(|| assert_eq!(black_box(gpubind::init()), first))
    });
}

fn bind(c: &mut Criterion) {
    let dev = match Device::get(0) {
        Ok(dev) => dev,
        Err(e) => {
            println!("ThreadContext::bind, same device again: skipped (no GPU: {e})");
            return;
        }
    };
    let mut ctx = ThreadContext::acquire().unwrap();
    // The first bind retains the primary context and makes it current.
    drop(ctx.bind(&dev).unwrap());
    c.bench_function(
        "ThreadContext::bind, same device again (lock + cuCtxGetCurrent)",
        |b| b.iter(|| drop(black_box(ctx.bind(black_box(&dev)).unwrap()))),
    );
}

fn launch_config(c: &mut Criterion) {
    let mut n = 0u32;
    c.bench_function("LaunchConfig::for_num_elems", |b| {
        b.iter(|| {
            n = n.wrapping_add(977);
            black_box(LaunchConfig::for_num_elems(black_box(n)))
        })
    });
}

fn uuid(c: &mut Criterion) {
    let u = Uuid(*b"\x01\x23\x45\x67\x89\xab\xcd\xef\x01\x23\x45\x67\x89\xab\xcd\xef");
    assert_eq!(u.to_string(), "GPU-01234567-89ab-cdef-0123-456789abcdef");
    c.bench_function("Uuid to_string", |b| b.iter(|| black_box(&u).to_string()));
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30);
    targets = token, init, bind, launch_config, uuid
}
criterion_main!(benches);
