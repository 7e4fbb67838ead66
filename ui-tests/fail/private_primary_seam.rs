// The retain/release seam is crate-private: safe code must not be able to build a
// `LazyPrimary<CudaPrimary>` (whose drop releases a retain it never took) or call
// `CudaPrimary::release` on a primary context that live slices depend on.
// Fix: there is none to write; bind through `ThreadContext`, and let the last
// `Arc<Device>` release the primary context.
use gpubind::device::LazyPrimary;
use gpubind::driver::{CudaPrimary, PrimaryCtxOps, RawContext};

fn main() {
    let lazy = LazyPrimary::new(CudaPrimary, 0);
    drop(lazy);
    CudaPrimary.release(0);
    let _ = RawContext(std::ptr::null_mut());
}
