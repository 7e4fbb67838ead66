// A BoundDevice borrows its token; it cannot be returned past the token's scope.
// Fix: take `&mut ThreadContext` as a parameter and bind where the work is done.
use gpubind::{BoundDevice, Device, ThreadContext};
use std::sync::Arc;

fn bind_here(dev: &Arc<Device>) -> BoundDevice<'static> {
    let mut ctx = ThreadContext::acquire().unwrap();
    ctx.bind(dev).unwrap()
}

fn main() {
    let dev = Device::get(0).unwrap();
    let _gpu = bind_here(&dev);
}
