//! gpubind's own collectives for ranks of one process: NVRTC-compiled reduce and copy
//! kernels (`nvrtc`), the engine that enqueues a collective over the ranks' lanes
//! (`engine`), and the in-process meeting where the threads of a `RankComm` set wait
//! for each other (`meeting`).

pub(crate) mod engine;
pub(crate) mod meeting;
pub(crate) mod nvrtc;
