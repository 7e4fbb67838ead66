//! Kernel launches: the configuration ([`LaunchConfig`]), the argument builder
//! ([`LaunchBuilder`], `cuLaunchKernel`) and launches with attributes
//! ([`LaunchExBuilder`], `cuLaunchKernelEx`: cooperative launches, clusters, priorities).

mod attributes;
mod builder;
mod config;

pub use attributes::{ClusterScheduling, LaunchExBuilder};
pub(crate) use builder::DriverLaunch;
pub use builder::LaunchBuilder;
pub use config::LaunchConfig;
