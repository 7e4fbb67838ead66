// Sharing a token through Arc would let two threads bind through one token.
use gpubind::ThreadContext;
use std::sync::Arc;

fn main() {
    let ctx = Arc::new(ThreadContext::acquire().unwrap());
    let other = Arc::clone(&ctx);
    std::thread::spawn(move || drop(other));
}
