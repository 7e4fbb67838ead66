//! CPU-side costs of gpubind that need no GPU (criterion).
//!
//! What a bind costs *besides* the driver call: taking and returning the per-thread
//! token, and the lazily retained primary context's fast path (`LazyPrimary::get` once
//! retained: one uncontended lock), modelled here with a mock of the two driver calls.
//! Plus `LaunchConfig::for_num_elems` and `Uuid` formatting. The GPU-side costs (bind
//! fast path with a real context, memsets, copies, launches) are in `gpubench`
//! (`src/bin/gpubench.rs`, see docs/performance.md).
//!
//! `cargo bench --bench binding` (a few seconds; add `-- --quick` for a faster pass).

use criterion::{Criterion, criterion_group, criterion_main};
use gpubind::device::LazyPrimary;
use gpubind::driver::PrimaryCtxOps;
use gpubind::{Error, LaunchConfig, ThreadContext, Uuid};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Counts retains; never touches a driver.
#[derive(Default)]
struct MockPrimary {
    retains: AtomicUsize,
}

impl PrimaryCtxOps for MockPrimary {
    type Ctx = usize;
    fn retain(&self, _device: i32) -> gpubind::Result<usize> {
        Ok(self.retains.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn release(&self, _device: i32) {}
}

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

fn lazy_primary(c: &mut Criterion) {
    let lazy = LazyPrimary::new(MockPrimary::default(), 0);
    lazy.get().unwrap();
    c.bench_function(
        "LazyPrimary::get, already retained (bind's CPU part)",
        |b| b.iter(|| black_box(lazy.get().unwrap())),
    );
    // The fast path must never retain again.
    assert_eq!(lazy.ops().retains.load(Ordering::Relaxed), 1);
    c.bench_function("LazyPrimary::new + first get + drop", |b| {
        b.iter(|| {
            let l = LazyPrimary::new(MockPrimary::default(), black_box(0));
            black_box(l.get().unwrap());
        })
    });
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
    targets = token, lazy_primary, launch_config, uuid
}
criterion_main!(benches);
