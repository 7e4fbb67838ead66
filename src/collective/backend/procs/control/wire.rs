//! The control channel's messages: encoding and decoding (layout in the parent
//! module's docs), the per-call [`Header`], and the socket names.

use crate::error::{Error, Result};

pub(super) const MAGIC: &[u8; 4] = b"GBPC";
/// The control channel's protocol version.
/// Version 2: a done notice carries the sequence number of the step read (version 1
/// sent the next one, and it was not checked). Version 3: a call header may carry the
/// identities of the call's buffers that other processes can map ([`Region`]).
pub(crate) const VERSION: u16 = 3;

pub(super) const HELLO: u8 = 1;
pub(super) const WELCOME: u8 = 2;
pub(super) const REJECT: u8 = 3;
pub(super) const CALL: u8 = 4;
pub(super) const ABORT: u8 = 5;
pub(super) const DONE: u8 = 6;
pub(super) const BYE: u8 = 7;

/// Abort codes: what kind of error the failed rank saw.
pub(super) const CODE_FAILED: u8 = 1;
pub(super) const CODE_MISMATCH: u8 = 2;
pub(super) const CODE_TIMEOUT: u8 = 3;
pub(super) const CODE_BAD_SETUP: u8 = 4;

/// Longest reason carried in a reject or abort.
pub(super) const MAX_REASON: usize = 2048;

/// One rank's description of a call, exchanged before anything is enqueued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// The sender's count of calls so far (diagnostics; equal on every rank of a
    /// collective in a program without p2p).
    pub(crate) seq: u64,
    /// 1 all_reduce, 2 reduce, 3 broadcast, 4 all_gather, 5 reduce_scatter, 6 send,
    /// 7 recv, 8 barrier, 9.. test.
    pub(crate) kind: u8,
    /// Reduction operator (0 sum, 1 prod, 2 min, 3 max, 4 avg; 0 where none).
    pub(crate) op: u8,
    /// Element type index ([`CollectiveType`](crate::collective::CollectiveType)'s order; 0xff for none).
    pub(crate) dtype: u8,
    /// Root (reduce, broadcast) or peer (send, recv); 0 where none.
    pub(crate) arg: u32,
    /// Elements (NCCL's count: per rank).
    pub(crate) count: u64,
}

pub(crate) use crate::collective::api::call::{KIND_RECV, KIND_SEND};
pub(crate) const KIND_BARRIER: u8 = 8;

pub(super) fn kind_name(k: u8) -> &'static str {
    match k {
        1 => "all_reduce",
        2 => "reduce",
        3 => "broadcast",
        4 => "all_gather",
        5 => "reduce_scatter",
        6 => "send",
        7 => "recv",
        8 => "barrier",
        _ => "a test call",
    }
}

pub(super) fn dtype_name(d: u8) -> &'static str {
    crate::collective::api::types::DTYPES
        .get(usize::from(d))
        .map_or("no data", |t| t.0)
}

impl Header {
    pub(super) fn describe(&self) -> String {
        let op = ["Sum", "Prod", "Min", "Max", "Avg"]
            .get(usize::from(self.op))
            .copied()
            .unwrap_or("?");
        let what = match self.kind {
            1 | 5 => format!("{}({op})", kind_name(self.kind)),
            2 => format!("reduce({op}, root {})", self.arg),
            3 => format!("broadcast(root {})", self.arg),
            6 => format!("send(to {})", self.arg),
            7 => format!("recv(from {})", self.arg),
            k => kind_name(k).to_owned(),
        };
        format!(
            "{what} of {} {} (call #{})",
            self.count,
            dtype_name(self.dtype),
            self.seq
        )
    }

    pub(super) fn same_call(&self, other: &Header) -> bool {
        (self.kind, self.op, self.dtype, self.arg, self.count)
            == (other.kind, other.op, other.dtype, other.arg, other.count)
    }
}

use crate::collective::callcheck::region;
pub(crate) use crate::collective::callcheck::region::Region;

/// A decoded control message.
#[derive(Debug)]
pub(super) enum Msg {
    Hello {
        world: u32,
        rank: u32,
        key: u64,
        staging: u64,
    },
    Welcome,
    Reject(Error),
    Call(Header, Vec<Region>),
    Abort(Error),
    /// The sequence number of the step whose reads are done.
    Done(u64),
    Bye,
}

pub(super) fn garbage(why: impl std::fmt::Display) -> Error {
    Error::Rendezvous {
        reason: format!("the control channel got a message that is not gpubind's: {why}"),
    }
}

pub(super) fn encode(ty: u8, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(7 + body.len());
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&VERSION.to_le_bytes());
    v.push(ty);
    v.extend_from_slice(body);
    v
}

/// `(failed rank, code, reason)` for an error to hand to the other ranks.
pub(super) fn error_parts(own_rank: usize, e: &Error) -> (usize, u8, String) {
    match e {
        Error::PeerFailed { rank, reason } => (*rank, CODE_FAILED, reason.clone()),
        Error::PeerTimeout { .. } => (own_rank, CODE_TIMEOUT, e.to_string()),
        Error::InvalidArgument(m)
            if m.starts_with("collective mismatch") || m.starts_with("collective aliasing") =>
        {
            (own_rank, CODE_MISMATCH, m.clone())
        }
        Error::Rendezvous { reason } => (own_rank, CODE_BAD_SETUP, reason.clone()),
        other => (own_rank, CODE_FAILED, other.to_string()),
    }
}

pub(super) fn encode_error(ty: u8, own_rank: usize, e: &Error) -> Vec<u8> {
    let (rank, code, mut reason) = error_parts(own_rank, e);
    if reason.len() > MAX_REASON {
        let mut cut = MAX_REASON;
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        reason.truncate(cut);
    }
    let mut body = (rank as u32).to_le_bytes().to_vec();
    body.push(code);
    body.extend_from_slice(reason.as_bytes());
    encode(ty, &body)
}

pub(super) fn decode_error(from: usize, body: &[u8]) -> Result<Error> {
    if body.len() < 5 {
        return Err(garbage("a short abort"));
    }
    let rank = u32::from_le_bytes(body[0..4].try_into().unwrap_or_default()) as usize;
    let reason = String::from_utf8_lossy(&body[5..]).into_owned();
    Ok(match body[4] {
        CODE_MISMATCH => Error::InvalidArgument(reason),
        CODE_BAD_SETUP => Error::Rendezvous { reason },
        CODE_TIMEOUT => Error::PeerFailed {
            rank,
            reason: format!("it timed out: {reason}"),
        },
        _ if rank == from => Error::PeerFailed { rank, reason },
        _ => Error::PeerFailed {
            rank,
            reason: format!("{reason} (reported by rank {from})"),
        },
    })
}

pub(super) fn u32_at(b: &[u8], at: usize) -> Result<u32> {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| garbage("a short message"))
}

pub(super) fn u64_at(b: &[u8], at: usize) -> Result<u64> {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| garbage("a short message"))
}

pub(super) fn decode(from: usize, bytes: &[u8]) -> Result<Msg> {
    if bytes.len() < 7 || &bytes[0..4] != MAGIC {
        return Err(garbage(format_args!(
            "bad magic {:02x?} (expected \"GBPC\")",
            &bytes[..bytes.len().min(4)]
        )));
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != VERSION {
        return Err(Error::Rendezvous {
            reason: format!(
                "a peer speaks control protocol version {version}, this process {VERSION} (mixed gpubind versions in one job)"
            ),
        });
    }
    let b = &bytes[7..];
    let exact = |n: usize| {
        if b.len() == n {
            Ok(())
        } else {
            Err(garbage(format_args!(
                "message type {} of {} bytes",
                bytes[6],
                b.len()
            )))
        }
    };
    Ok(match bytes[6] {
        HELLO => {
            exact(24)?;
            Msg::Hello {
                world: u32_at(b, 0)?,
                rank: u32_at(b, 4)?,
                key: u64_at(b, 8)?,
                staging: u64_at(b, 16)?,
            }
        }
        WELCOME => {
            exact(0)?;
            Msg::Welcome
        }
        REJECT => Msg::Reject(decode_error(from, b)?),
        CALL => {
            if b.len() < 24 {
                exact(24)?;
            }
            Msg::Call(
                Header {
                    seq: u64_at(b, 0)?,
                    kind: b[8],
                    op: b[9],
                    dtype: b[10],
                    arg: u32_at(b, 12)?,
                    count: u64_at(b, 16)?,
                },
                decode_regions(&b[24..])?,
            )
        }
        ABORT => Msg::Abort(decode_error(from, b)?),
        DONE => {
            exact(8)?;
            Msg::Done(u64_at(b, 0)?)
        }
        BYE => {
            exact(0)?;
            Msg::Bye
        }
        t => return Err(garbage(format_args!("unknown message type {t}"))),
    })
}

pub(super) fn encode_call(h: &Header, regions: &[Region]) -> Vec<u8> {
    let mut body = h.seq.to_le_bytes().to_vec();
    body.extend_from_slice(&[h.kind, h.op, h.dtype, 0]);
    body.extend_from_slice(&h.arg.to_le_bytes());
    body.extend_from_slice(&h.count.to_le_bytes());
    region::encode_into(regions, &mut body);
    encode(CALL, &body)
}

/// The regions after a call header's 24 bytes (at most two: send and receive).
fn decode_regions(b: &[u8]) -> Result<Vec<Region>> {
    region::decode_all(b).ok_or_else(|| {
        garbage(format_args!(
            "a call header with {} bytes of buffer identities",
            b.len()
        ))
    })
}
/// FNV-1a 64 of the job key (names the sockets; checked in the hello).
pub(super) fn key_hash(key: &str) -> u64 {
    crate::fnv::fnv1a64(key.as_bytes())
}

/// The abstract socket name of `rank` in the job `key`.
pub(crate) fn socket_name(key: &str, rank: usize) -> String {
    // The effective uid keeps two users' jobs with the same key (the default torchrun
    // port) apart: abstract names are host-wide.
    let uid = rustix::process::geteuid().as_raw();
    format!("gpubind-pc-{uid}-{:016x}-{rank}", key_hash(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call() -> Header {
        Header {
            seq: 7,
            kind: 1,
            op: 4,
            dtype: 3,
            arg: 2,
            count: 1 << 40,
        }
    }

    #[test]
    fn a_third_region_is_refused() {
        let r = |lo: u64| Region {
            role: 1,
            key: [1; 81],
            lo,
            hi: lo + 1,
        };
        let three = encode_call(&call(), &[r(0), r(1), r(2)]);
        assert!(matches!(decode(0, &three), Err(Error::Rendezvous { .. })));
    }

    #[test]
    fn messages_round_trip() {
        match decode(1, &encode_call(&call(), &[])).unwrap() {
            Msg::Call(h, r) => assert!(h == call() && r.is_empty()),
            other => panic!("{other:?}"),
        }
        let regions = [
            Region {
                role: 0,
                key: [3; 81],
                lo: 8,
                hi: 4104,
            },
            Region {
                role: 1,
                key: std::array::from_fn(|i| i as u8),
                lo: 0,
                hi: u64::MAX,
            },
        ];
        match decode(1, &encode_call(&call(), &regions)).unwrap() {
            Msg::Call(h, r) => assert!(h == call() && r == regions),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decode(1, &encode(DONE, &9u64.to_le_bytes())).unwrap(),
            Msg::Done(9)
        ));
        assert!(matches!(decode(1, &encode(BYE, &[])).unwrap(), Msg::Bye));
        let e = Error::PeerFailed {
            rank: 3,
            reason: "gone".into(),
        };
        // A failure another rank saw keeps the rank that failed.
        match decode(1, &encode_error(ABORT, 1, &e)).unwrap() {
            Msg::Abort(Error::PeerFailed { rank: 3, reason }) => assert!(reason.contains("gone")),
            other => panic!("{other:?}"),
        }
        let m = Error::InvalidArgument("collective mismatch: rank 0 called x".into());
        match decode(2, &encode_error(ABORT, 2, &m)).unwrap() {
            Msg::Abort(got) => assert_eq!(got, m),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn garbage_truncation_and_other_versions_are_typed() {
        let good = encode_call(&call(), &[]);
        for cut in 0..good.len() {
            assert!(
                matches!(decode(0, &good[..cut]), Err(Error::Rendezvous { .. })),
                "cut {cut}"
            );
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(matches!(decode(0, &longer), Err(Error::Rendezvous { .. })));
        let mut v2 = good.clone();
        v2[4] = 2;
        match decode(0, &v2) {
            Err(Error::Rendezvous { reason }) => assert!(reason.contains("version 2")),
            other => panic!("{other:?}"),
        }
        let mut unknown = good;
        unknown[6] = 99;
        assert!(matches!(decode(0, &unknown), Err(Error::Rendezvous { .. })));
        assert!(matches!(
            decode(0, b"GET / HTTP/1.1"),
            Err(Error::Rendezvous { .. })
        ));
    }

    #[test]
    fn headers_describe_the_call_and_compare_without_the_sequence() {
        let a = call();
        let b = Header { seq: 8, ..a };
        assert!(a.same_call(&b));
        assert!(!a.same_call(&Header { count: 1, ..a }));
        assert_eq!(
            a.describe(),
            "all_reduce(Avg) of 1099511627776 bf16 (call #7)"
        );
        let s = Header {
            kind: KIND_SEND,
            ..a
        };
        assert!(s.describe().starts_with("send(to 2)"));
    }

    #[test]
    fn long_reasons_are_cut_on_a_char_boundary() {
        let e = Error::InvalidArgument(format!("collective mismatch: {}", "é".repeat(3000)));
        let bytes = encode_error(ABORT, 0, &e);
        assert!(bytes.len() < MAX_REASON + 64);
        assert!(matches!(
            decode(0, &bytes),
            Ok(Msg::Abort(Error::InvalidArgument(_)))
        ));
    }
}
