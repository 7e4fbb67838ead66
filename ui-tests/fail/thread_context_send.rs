// A ThreadContext describes the thread that acquired it; it cannot move to another.
// Fix: call ThreadContext::acquire() inside the spawned thread.
use gpubind::ThreadContext;

fn main() {
    let ctx = ThreadContext::acquire().unwrap();
    std::thread::spawn(move || {
        let _ctx = ctx;
    });
}
