//! How a communicator is made: the backend ([`Backend`]), the own kernels' transport
//! ([`Transport`]) and the timeout, together [`CommOptions`].

#[cfg(doc)]
use crate::error::Error;

/// Which implementation runs the collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// gpubind's own NVRTC kernels (any ranks, including several on one GPU).
    Kernels,
    /// NCCL (`libnccl.so.2`), one distinct device per rank. Needs the `nccl` feature
    /// (default): without it, creating a communicator with it is
    /// [`Error::FeatureDisabled`].
    Nccl,
}

/// How the own-kernel backend moves data between devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Direct where every pair of devices has peer access, else host-staged.
    Auto,
    /// Kernels read and write peers' memory directly (error if some pair lacks peer
    /// access). Ranks of one device always work this way.
    Direct,
    /// Through mapped pinned host memory (`cuMemHostAlloc`), even on one device (slow;
    /// for machines without peer access, and for testing that path).
    HostStaged,
}

/// Options for creating communicators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommOptions {
    /// The backend.
    pub backend: Backend,
    /// The own-kernel backend's transport (ignored by NCCL).
    pub transport: Transport,
    /// How long a [`RankComm`](crate::collective::RankComm) of the own-kernel backend waits for the other ranks to
    /// join a call ([`DEFAULT_COLLECTIVE_TIMEOUT`] unless set): past it the call returns
    /// [`Error::PeerTimeout`] naming the ranks that did not come, and the communicator
    /// is unusable (every later call returns that error). `Duration::MAX` waits for ever.
    ///
    /// A [`RankComm`](crate::collective::RankComm) of the NCCL backend ([`Communicator::init_all`](crate::collective::Communicator::init_all) with NCCL) waits
    /// at most this long for NCCL's initialisation at its first call (non-blocking
    /// `ncclCommInitRankConfig`, polled; past it the communicator is aborted and the call
    /// returns [`Error::PeerTimeout`]) and for NCCL to enqueue each call, and its
    /// watchdog aborts it when a call stays unfinished on the GPU longer than this
    /// ([`RankComm::check`](crate::collective::RankComm::check)). (With an NCCL older than 2.14 the initialisation is the
    /// blocking `ncclCommInitRank`, and nothing is watched.)
    pub timeout: std::time::Duration,
}

/// The default [`CommOptions::timeout`]: 300 s.
pub const DEFAULT_COLLECTIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

impl CommOptions {
    /// Own kernels, [`Transport::Auto`].
    pub fn kernels() -> Self {
        CommOptions {
            backend: Backend::Kernels,
            transport: Transport::Auto,
            timeout: DEFAULT_COLLECTIVE_TIMEOUT,
        }
    }

    /// NCCL (see [`Backend::Nccl`] for the `nccl` feature).
    pub fn nccl() -> Self {
        CommOptions {
            backend: Backend::Nccl,
            transport: Transport::Auto,
            timeout: DEFAULT_COLLECTIVE_TIMEOUT,
        }
    }

    /// The same options with another transport.
    pub fn with_transport(self, transport: Transport) -> Self {
        CommOptions { transport, ..self }
    }

    /// The same options with another [`timeout`](Self::timeout).
    pub fn with_timeout(self, timeout: std::time::Duration) -> Self {
        CommOptions { timeout, ..self }
    }
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions::kernels()
    }
}
