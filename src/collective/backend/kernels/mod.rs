//! gpubind's own collectives for ranks of one process: NVRTC-compiled reduce and copy
//! kernels (`nvrtc`, shared with the process ranks of `procs`), the engine that enqueues
//! a collective over the ranks' lanes (`engine`), the `Communicator` backend built on it
//! (`group`), and the `RankComm` backend (`rank`) whose threads wait for each other in
//! an in-process meeting (`meeting`).

pub(crate) mod engine;
mod group;
mod meeting;
pub(crate) mod nvrtc;
mod rank;

pub(crate) use rank::KernelsRank;
