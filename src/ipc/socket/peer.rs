//! Whom a socket talks to: the peer's credentials (`SO_PEERCRED`) and the
//! [`PeerPolicy`] they are checked against.

use crate::error::{Error, Result};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

/// Which peer processes a socket may exchange messages with, judged by the peer's
/// credentials as the kernel recorded them when the connection was made (`SO_PEERCRED`:
/// the effective uid at `connect` / `socketpair` time).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum PeerPolicy {
    /// The peer's effective uid must be this process's effective uid (the default).
    #[default]
    SameUid,
    /// Any peer: no uid check. Use only where the socket's reachability is already
    /// restricted (e.g. a `socketpair` shared with your own child).
    AnyUid,
    /// The peer's effective uid must be one of these (this process's own uid is not
    /// implied: list it if it is allowed).
    Uids(Vec<u32>),
}

impl PeerPolicy {
    /// Whether a peer running as `peer_uid` is allowed, this process running as `own_uid`.
    pub fn allows(&self, own_uid: u32, peer_uid: u32) -> bool {
        match self {
            PeerPolicy::SameUid => peer_uid == own_uid,
            PeerPolicy::AnyUid => true,
            PeerPolicy::Uids(uids) => uids.contains(&peer_uid),
        }
    }

    fn describe(&self, own_uid: u32) -> String {
        match self {
            PeerPolicy::SameUid => format!("only this process's own uid {own_uid}"),
            PeerPolicy::AnyUid => "any uid".into(),
            PeerPolicy::Uids(uids) => format!("only the uids {uids:?}"),
        }
    }
}

/// The credentials of the process at the other end of a Unix socket (`SO_PEERCRED`), as
/// they were when it connected (or created the socket pair).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCredentials {
    /// The peer's process id (0 when the peer is in a pid namespace this process
    /// cannot see).
    pub pid: i32,
    /// The peer's effective user id.
    pub uid: u32,
    /// The peer's effective group id.
    pub gid: u32,
}

/// `SO_PEERCRED` of `stream`: who is at the other end.
pub fn peer_credentials(stream: &UnixStream) -> Result<PeerCredentials> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let size = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    let mut len = size;
    // SAFETY: `stream` keeps the descriptor open for the call; SO_PEERCRED writes at most
    // `len` bytes (one `struct ucred`) into `cred`, which lives on our stack, and stores
    // the length written in `len`. (Read through libc, not rustix, whose `UCred` holds a
    // non-zero pid type: the kernel reports pid 0 for a peer outside our pid namespace.)
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(crate::ipc::io_error("getsockopt(SO_PEERCRED)", &e));
    }
    if len != size {
        return Err(crate::ipc::io_error(
            "getsockopt(SO_PEERCRED)",
            &std::io::Error::other(format!("returned {len} bytes, expected {size}")),
        ));
    }
    Ok(PeerCredentials {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// [`Error::PeerNotAllowed`] unless `policy` allows `peer` for a process running as
/// `own_uid`.
fn judge_peer(policy: &PeerPolicy, own_uid: u32, peer: PeerCredentials) -> Result<()> {
    if policy.allows(own_uid, peer.uid) {
        return Ok(());
    }
    Err(Error::PeerNotAllowed {
        peer_pid: peer.pid,
        peer_uid: peer.uid,
        own_uid,
        allowed: policy.describe(own_uid),
    })
}

/// Reads the peer's credentials of `stream` and checks them against `policy`
/// ([`Error::PeerNotAllowed`] on a mismatch); returns them. [`PeerPolicy::AnyUid`]
/// accepts whatever they are.
pub fn check_peer(stream: &UnixStream, policy: &PeerPolicy) -> Result<PeerCredentials> {
    let peer = peer_credentials(stream)?;
    if *policy != PeerPolicy::AnyUid {
        judge_peer(policy, rustix::process::geteuid().as_raw(), peer)?;
    }
    Ok(peer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipc::socket::tests::SHORT;
    use crate::ipc::socket::{
        DEFAULT_TIMEOUT, TransportOptions, recv_message_timeout, recv_message_with,
        send_message_with,
    };

    #[test]
    fn peer_policy_judges_uids() {
        let peer = |uid| PeerCredentials {
            pid: 4242,
            uid,
            gid: uid,
        };
        assert_eq!(judge_peer(&PeerPolicy::SameUid, 1000, peer(1000)), Ok(()));
        let err = judge_peer(&PeerPolicy::SameUid, 1000, peer(1001)).unwrap_err();
        assert_eq!(
            err,
            Error::PeerNotAllowed {
                peer_pid: 4242,
                peer_uid: 1001,
                own_uid: 1000,
                allowed: "only this process's own uid 1000".into(),
            }
        );
        let text = err.to_string();
        assert!(
            text.contains("uid 1001") && text.contains("uid 1000") && text.contains("4242"),
            "{text}"
        );
        assert_eq!(judge_peer(&PeerPolicy::AnyUid, 1000, peer(0)), Ok(()));
        let some = PeerPolicy::Uids(vec![0, 1002]);
        assert_eq!(judge_peer(&some, 1000, peer(1002)), Ok(()));
        assert_eq!(judge_peer(&some, 1000, peer(0)), Ok(()));
        // The own uid is not implied by a list.
        let err = judge_peer(&some, 1000, peer(1000)).unwrap_err();
        assert!(err.to_string().contains("[0, 1002]"), "{err}");
        assert_eq!(PeerPolicy::default(), PeerPolicy::SameUid);
        let opts = TransportOptions::default();
        assert_eq!(opts.get_timeout(), DEFAULT_TIMEOUT);
        assert_eq!(opts.get_peer(), &PeerPolicy::SameUid);
    }

    #[test]
    fn socketpair_peer_is_this_process() {
        let (a, b) = UnixStream::pair().unwrap();
        let cred = peer_credentials(&a).unwrap();
        assert_eq!(cred.pid as u32, std::process::id());
        assert_eq!(cred.uid, rustix::process::geteuid().as_raw());
        assert_eq!(cred.gid, rustix::process::getegid().as_raw());
        assert_eq!(check_peer(&a, &PeerPolicy::SameUid), Ok(cred));
        // A list without our uid refuses, before anything is sent: nothing arrives.
        let own = cred.uid;
        let other = PeerPolicy::Uids(vec![own.wrapping_add(1)]);
        let opts = TransportOptions::default().peer(other).timeout(SHORT);
        let err = send_message_with(&a, b"x", &[], &opts).unwrap_err();
        assert!(
            matches!(err, Error::PeerNotAllowed { own_uid, peer_uid, .. } if own_uid == own && peer_uid == own),
            "{err:?}"
        );
        assert!(matches!(
            recv_message_with(&b, &opts),
            Err(Error::PeerNotAllowed { .. })
        ));
        assert!(matches!(
            recv_message_timeout(&b, SHORT),
            Err(Error::Timeout { .. })
        ));
    }
}
