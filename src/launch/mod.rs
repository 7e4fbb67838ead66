//! Kernel launches: a configuration, a builder that collects the arguments, and the
//! checked driver call.
//!
//! A launch takes three steps, one type each:
//!
//! 1. **Configuration** — [`LaunchConfig`]: grid, block and dynamic shared memory
//!    ([`LaunchConfig::for_num_elems`]: one thread per element).
//! 2. **Builder** — [`BoundStream::launch`](crate::BoundStream::launch) starts a
//!    [`LaunchBuilder`] for one [`Function`](crate::Function) on one stream;
//!    [`arg`](LaunchBuilder::arg) appends the kernel's arguments in order (gpubind
//!    buffers, module globals, plain values).
//! 3. **Launch** — [`LaunchBuilder::launch`] (`unsafe`: the arguments must match what
//!    the kernel declares) checks, before the driver is called, the arguments' devices
//!    ([`Error::WrongDevice`](crate::Error::WrongDevice)), the configuration against the
//!    device's and the kernel's limits ([`Error::LaunchLimit`](crate::Error::LaunchLimit)),
//!    and the argument count and sizes ([`Error::LaunchArgs`](crate::Error::LaunchArgs));
//!    claims the buffer arguments and the module (the kernel runs after their pending
//!    uses on other streams, and their later uses and frees wait for it); then calls
//!    `cuLaunchKernel`.
//!
//! Naming an attribute before the arguments turns the builder into a
//! [`LaunchExBuilder`] (`cuLaunchKernelEx`), whose docs list the attributes' checks.

mod args;
mod attributes;
mod builder;
mod config;

pub use attributes::{ClusterScheduling, LaunchExBuilder};
pub use builder::LaunchBuilder;
pub use config::LaunchConfig;
