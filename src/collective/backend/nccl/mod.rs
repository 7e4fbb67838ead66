//! The NCCL backend: the library (`library`), one communicator handle (`comm`) watched
//! by the NCCL watchdog (`watchdog`), and the two backends built on them: the ranks of a
//! `Communicator` driven by one thread (`group`), and one rank of a `RankComm` (`rank`)
//! whose collectives a graph can capture (`capture`, through the rank's `gate`).

mod capture;
pub(crate) mod comm;
mod gate;
mod group;
pub(crate) mod library;
mod rank;
pub(crate) mod watchdog;

pub(crate) use group::NcclGroup;
#[cfg(any(test, feature = "test-seams"))]
pub(crate) use group::seam as group_seam;
pub(crate) use library::{api, unique_id_bytes};
pub use library::{nccl_available, nccl_version};
pub(crate) use rank::NcclRank;
