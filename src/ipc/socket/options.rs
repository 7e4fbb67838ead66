//! How a send or receive waits and whom it talks to: [`TransportOptions`], and the
//! [`Deadline`] a whole message runs against.

use super::peer::PeerPolicy;
use crate::error::{Error, Result};
use std::time::{Duration, Instant};

/// Timeout of the functions without a `_timeout` suffix.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest single `poll`: the loop re-checks the deadline after each, so this only keeps
/// the timespec handed to the kernel small.
const MAX_POLL_SLICE: Duration = Duration::from_secs(3600);

/// How a send or receive waits and whom it talks to: a timeout for the whole message
/// and a [`PeerPolicy`].
///
/// ```
/// use gpubind::ipc::{PeerPolicy, TransportOptions};
/// use std::time::Duration;
/// let patient = TransportOptions::default().timeout(Duration::MAX); // no timeout
/// let shared = TransportOptions::default().peer(PeerPolicy::Uids(vec![1000, 1001]));
/// # let _ = (patient, shared);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportOptions {
    timeout: Duration,
    peer: PeerPolicy,
}

impl Default for TransportOptions {
    /// [`DEFAULT_TIMEOUT`] and [`PeerPolicy::SameUid`].
    fn default() -> Self {
        TransportOptions {
            timeout: DEFAULT_TIMEOUT,
            peer: PeerPolicy::SameUid,
        }
    }
}

impl TransportOptions {
    /// The longest a whole message may take to send or arrive. [`Duration::MAX`] (or
    /// any duration whose deadline overflows [`Instant`]) waits without limit.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Which peers are accepted (checked before anything is sent or received).
    pub fn peer(mut self, policy: PeerPolicy) -> Self {
        self.peer = policy;
        self
    }

    /// The timeout set.
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }

    /// The peer policy set.
    pub fn get_peer(&self) -> &PeerPolicy {
        &self.peer
    }
}

/// When a wait must end: `now + timeout`, or never where that does not fit in an
/// [`Instant`] (e.g. [`Duration::MAX`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline {
    at: Option<Instant>,
    timeout: Duration,
}

impl Deadline {
    /// The deadline `timeout` from now; none (wait forever) if it overflows.
    pub(crate) fn after(timeout: Duration) -> Deadline {
        Deadline {
            at: Instant::now().checked_add(timeout),
            timeout,
        }
    }

    /// Time left, capped at [`MAX_POLL_SLICE`]; `Ok(None)` when there is no deadline,
    /// [`Error::Timeout`] naming `what` once it has passed.
    pub(super) fn poll_slice(&self, what: &'static str) -> Result<Option<Duration>> {
        let Some(at) = self.at else {
            return Ok(None);
        };
        let now = Instant::now();
        if now >= at {
            return Err(Error::Timeout {
                what,
                after_ms: u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX),
            });
        }
        Ok(Some((at - now).min(MAX_POLL_SLICE)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflowing_timeouts_mean_no_deadline() {
        // `Instant::now() + Duration::MAX` panics; these must not.
        for t in [
            Duration::MAX,
            Duration::from_secs(u64::MAX),
            Duration::new(u64::MAX, 5),
        ] {
            let d = Deadline::after(t);
            assert!(d.at.is_none(), "{t:?} should mean no deadline");
            assert_eq!(d.poll_slice("x").unwrap(), None);
        }
        // A deadline that fits is kept.
        let d = Deadline::after(Duration::from_secs(1));
        assert!(d.at.is_some());
        assert!(d.poll_slice("x").unwrap().unwrap() <= Duration::from_secs(1));
    }
}
