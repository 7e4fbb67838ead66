//! The public face of the collectives: [`Communicator`] (one thread, every rank),
//! [`RankComm`] (one rank per thread or process), [`Group`], the options
//! ([`CommOptions`], [`Backend`], [`Transport`]), the element types and operators
//! ([`CollectiveType`], [`Op`]), the captured collectives of [`Capture`](crate::Capture),
//! and the validated description of one rank's call (`call`) that every backend runs.

pub(crate) mod call;
mod capture;
pub(crate) mod communicator;
mod group;
pub(crate) mod options;
mod rank_capture;
pub(crate) mod rank_comm;
pub(crate) mod types;

pub use communicator::Communicator;
pub use group::Group;
pub use options::{Backend, CommOptions, DEFAULT_COLLECTIVE_TIMEOUT, Transport};
pub use rank_comm::RankComm;
pub use types::{CollectiveType, Op};
