// Even a shared reference to the token may not reach another thread: ThreadContext is !Sync.
use gpubind::ThreadContext;

fn main() {
    let ctx = ThreadContext::acquire().unwrap();
    std::thread::scope(|s| {
        s.spawn(|| println!("{:?}", &ctx));
    });
}
