//! Teardown: how resources are released in their own context.

pub(crate) mod drop_wait;
pub(crate) mod faults;
pub(crate) mod release;
