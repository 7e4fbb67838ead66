//! The rendezvous's frames (the wire format in the [module docs](super)): encoding,
//! bounded reads and writes over TCP, and the typed error an abort frame carries.

use crate::error::Error;
use crate::fnv::fnv1a64;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const MAGIC: [u8; 4] = *b"GBRZ";
/// The protocol version this build speaks (2: the hello's flags and the per-collective
/// `call`/`agreed` frames).
pub const PROTOCOL_VERSION: u16 = 2;
const HEADER: usize = 20;
const MAX_PAYLOAD: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::collective) enum Kind {
    Hello = 1,
    Id = 2,
    Ack = 3,
    Go = 4,
    Abort = 5,
    /// A rank's header of its next collective (to rank 0).
    Call = 6,
    /// Rank 0's verdict: every rank called the same collective.
    Agreed = 7,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Hello,
            2 => Kind::Id,
            3 => Kind::Ack,
            4 => Kind::Go,
            5 => Kind::Abort,
            6 => Kind::Call,
            7 => Kind::Agreed,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::collective) struct Frame {
    pub(in crate::collective) kind: Kind,
    pub(in crate::collective) world: u32,
    pub(in crate::collective) rank: u32,
    pub(in crate::collective) payload: Vec<u8>,
}

fn encode(f: &Frame) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER + f.payload.len() + 8);
    v.extend_from_slice(&MAGIC);
    v.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    v.push(f.kind as u8);
    v.push(0);
    v.extend_from_slice(&f.world.to_le_bytes());
    v.extend_from_slice(&f.rank.to_le_bytes());
    v.extend_from_slice(&(f.payload.len() as u32).to_le_bytes());
    v.extend_from_slice(&f.payload);
    let sum = fnv1a64(&v);
    v.extend_from_slice(&sum.to_le_bytes());
    v
}

/// Why a frame could not be read.
#[derive(Debug)]
pub(in crate::collective) enum ReadFail {
    /// The peer closed the connection after `got` bytes of the frame.
    Closed { got: usize },
    /// Nothing complete before the deadline.
    TimedOut,
    /// Bytes that are not a frame of this version.
    Garbage(String),
    /// Another I/O error.
    Io(std::io::Error),
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Checks a frame header (magic, version, kind, length).
fn check_header(h: &[u8; HEADER]) -> std::result::Result<(Kind, u32, u32, usize), String> {
    if h[..4] != MAGIC {
        return Err(format!("bad magic {:02x?} (expected \"GBRZ\")", &h[..4]));
    }
    let version = u16::from_le_bytes([h[4], h[5]]);
    if version != PROTOCOL_VERSION {
        return Err(format!(
            "protocol version {version}, this build of gpubind speaks version {PROTOCOL_VERSION} (all ranks must run the same gpubind)"
        ));
    }
    let kind = Kind::from_u8(h[6]).ok_or_else(|| format!("unknown frame kind {}", h[6]))?;
    let len = le_u32(&h[16..20]) as usize;
    if len > MAX_PAYLOAD {
        return Err(format!(
            "payload of {len} bytes, more than the {MAX_PAYLOAD} allowed"
        ));
    }
    Ok((kind, le_u32(&h[8..12]), le_u32(&h[12..16]), len))
}

/// Decodes one whole frame from `bytes` (which must hold exactly one).
#[cfg(test)]
fn decode(bytes: &[u8]) -> std::result::Result<Frame, String> {
    let header: &[u8; HEADER] = bytes
        .get(..HEADER)
        .and_then(|h| h.try_into().ok())
        .ok_or("truncated header")?;
    let (kind, world, rank, len) = check_header(header)?;
    if bytes.len() != HEADER + len + 8 {
        return Err(format!("{} bytes for a payload of {len}", bytes.len()));
    }
    let body = &bytes[..HEADER + len];
    check_sum(body, &bytes[HEADER + len..])?;
    Ok(Frame {
        kind,
        world,
        rank,
        payload: bytes[HEADER..HEADER + len].to_vec(),
    })
}

fn check_sum(body: &[u8], sum: &[u8]) -> std::result::Result<(), String> {
    let expected = fnv1a64(body);
    let mut s = [0u8; 8];
    s.copy_from_slice(sum);
    let found = u64::from_le_bytes(s);
    if found != expected {
        return Err(format!(
            "checksum mismatch (frame says {found:016x}, contents give {expected:016x})"
        ));
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes before `deadline`; `done` bytes of the frame came
/// before (for [`ReadFail::Closed`]).
fn read_full(
    s: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
    done: usize,
) -> std::result::Result<(), ReadFail> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadFail::TimedOut);
        }
        s.set_read_timeout(Some(left)).map_err(ReadFail::Io)?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(ReadFail::Closed { got: done + got }),
            Ok(n) => got += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(ReadFail::TimedOut);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionReset
                        | ErrorKind::ConnectionAborted
                        | ErrorKind::BrokenPipe
                ) =>
            {
                return Err(ReadFail::Closed { got: done + got });
            }
            Err(e) => return Err(ReadFail::Io(e)),
        }
    }
    Ok(())
}

/// A look at `s` that never blocks: `Some(true)` when the peer closed it (end of
/// stream, reset) with nothing of it left unread, `Some(false)` when bytes wait,
/// `None` when nothing has happened yet.
pub(in crate::collective) fn peek_state(s: &TcpStream) -> Option<bool> {
    let mut b = [0u8; 1];
    if s.set_nonblocking(true).is_err() {
        return None;
    }
    let got = s.peek(&mut b);
    let _ = s.set_nonblocking(false);
    match got {
        Ok(0) => Some(true),
        Ok(_) => Some(false),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => None,
        // Reset, aborted: the peer is gone.
        Err(_) => Some(true),
    }
}

pub(in crate::collective) fn read_frame(
    s: &mut TcpStream,
    deadline: Instant,
) -> std::result::Result<Frame, ReadFail> {
    let mut header = [0u8; HEADER];
    // The magic first: a stranger speaking another protocol is named as such even if it
    // sent fewer bytes than a header.
    read_full(s, &mut header[..4], deadline, 0)?;
    if header[..4] != MAGIC {
        return Err(ReadFail::Garbage(format!(
            "bad magic {:02x?} (expected \"GBRZ\")",
            &header[..4]
        )));
    }
    read_full(s, &mut header[4..], deadline, 4)?;
    let (kind, world, rank, len) = check_header(&header).map_err(ReadFail::Garbage)?;
    let mut rest = vec![0u8; len + 8];
    read_full(s, &mut rest, deadline, HEADER)?;
    let mut body = header.to_vec();
    body.extend_from_slice(&rest[..len]);
    check_sum(&body, &rest[len..]).map_err(ReadFail::Garbage)?;
    rest.truncate(len);
    Ok(Frame {
        kind,
        world,
        rank,
        payload: rest,
    })
}

pub(in crate::collective) fn write_frame(
    s: &mut TcpStream,
    f: &Frame,
    deadline: Instant,
) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    s.set_write_timeout(Some(left.max(Duration::from_millis(1))))?;
    s.write_all(&encode(f))?;
    s.flush()
}

// An error carried by an abort frame: code u8 (1 Rendezvous, 2 PeerFailed, 3
// PeerTimeout, 4 InvalidArgument: a collective mismatch), rank u32, after_ms u64, n u16,
// n ranks u32, then the text (reason or what), UTF-8.
pub(in crate::collective) fn encode_error(e: &Error) -> Vec<u8> {
    let (code, rank, after, ranks, text): (u8, usize, u64, &[usize], String) = match e {
        Error::Rendezvous { reason } => (1, 0, 0, &[], reason.clone()),
        Error::InvalidArgument(text) => (4, 0, 0, &[], text.clone()),
        Error::PeerFailed { rank, reason } => (2, *rank, 0, &[], reason.clone()),
        Error::PeerTimeout {
            what,
            ranks,
            after_ms,
        } => (3, 0, *after_ms, ranks.as_slice(), what.clone()),
        other => (1, 0, 0, &[], format!("rank 0 failed: {other}")),
    };
    let mut v = vec![code];
    v.extend_from_slice(&(rank as u32).to_le_bytes());
    v.extend_from_slice(&after.to_le_bytes());
    let n = ranks.len().min(256);
    v.extend_from_slice(&(n as u16).to_le_bytes());
    for &r in &ranks[..n] {
        v.extend_from_slice(&(r as u32).to_le_bytes());
    }
    let room = MAX_PAYLOAD.saturating_sub(v.len());
    let mut cut = text.len().min(room);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    v.extend_from_slice(&text.as_bytes()[..cut]);
    v
}

pub(in crate::collective) fn decode_error(p: &[u8]) -> Error {
    let undecodable = || Error::Rendezvous {
        reason: "rank 0 aborted the rendezvous with an undecodable reason".into(),
    };
    if p.len() < 15 {
        return undecodable();
    }
    let code = p[0];
    let rank = le_u32(&p[1..5]) as usize;
    let after_ms = u64::from_le_bytes(p[5..13].try_into().unwrap_or([0; 8]));
    let n = u16::from_le_bytes([p[13], p[14]]) as usize;
    let Some(list) = p.get(15..15 + 4 * n) else {
        return undecodable();
    };
    let ranks: Vec<usize> = list.chunks(4).map(|c| le_u32(c) as usize).collect();
    let text = String::from_utf8_lossy(&p[15 + 4 * n..]).into_owned();
    match code {
        1 => Error::Rendezvous { reason: text },
        2 => Error::PeerFailed { rank, reason: text },
        3 => Error::PeerTimeout {
            what: text,
            ranks,
            after_ms,
        },
        4 => Error::InvalidArgument(text),
        _ => undecodable(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::LaunchEnv;

    #[test]
    fn frames_round_trip_and_corruption_is_caught() {
        let f = Frame {
            kind: Kind::Id,
            world: 4,
            rank: 2,
            payload: vec![9; 128],
        };
        let bytes = encode(&f);
        assert_eq!(bytes.len(), HEADER + 128 + 8);
        assert_eq!(decode(&bytes).unwrap(), f);
        // Every single-bit flip anywhere is refused (magic, version, kind, length,
        // payload or checksum).
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                assert!(
                    decode(&b).is_err(),
                    "flip of bit {bit} of byte {i} accepted"
                );
            }
        }
        // Every truncation is refused.
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err());
        }
        let mut wrong_version = bytes.clone();
        wrong_version[4] = 3;
        assert!(decode(&wrong_version).unwrap_err().contains("version 3"));
        let mut wrong_magic = bytes.clone();
        wrong_magic[0] = b'X';
        assert!(decode(&wrong_magic).unwrap_err().contains("magic"));
        let mut huge = bytes.clone();
        huge[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&huge).unwrap_err().contains("more than"));
    }

    #[test]
    fn abort_payload_carries_the_typed_error() {
        let errors = [
            Error::Rendezvous {
                reason: "rank 1 checked in twice".into(),
            },
            Error::PeerFailed {
                rank: 3,
                reason: "gone".into(),
            },
            Error::PeerTimeout {
                what: "ranks".into(),
                ranks: vec![2, 5],
                after_ms: 1500,
            },
            Error::InvalidArgument("collective mismatch: rank 0 called …".into()),
        ];
        for e in errors {
            assert_eq!(decode_error(&encode_error(&e)), e);
        }
        assert!(matches!(
            decode_error(&encode_error(&Error::NoNccl)),
            Error::Rendezvous { reason } if reason.contains("NCCL not found")
        ));
        assert!(matches!(decode_error(&[1, 2]), Error::Rendezvous { .. }));
        let long = Error::Rendezvous {
            reason: "é".repeat(4000),
        };
        assert!(encode_error(&long).len() <= MAX_PAYLOAD);
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_never_panic_the_decoders(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
        ) {
            let _ = decode(&bytes);
            let _ = decode_error(&bytes);
            let _ = LaunchEnv::from_vars(|k| {
                (k == "RANK" || k == "WORLD_SIZE")
                    .then(|| String::from_utf8_lossy(&bytes).into_owned())
            });
        }

        #[test]
        fn a_frame_with_a_valid_header_and_a_random_body_is_refused(
            world in 1u32..100, rank in 0u32..100,
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
        ) {
            let mut bytes = encode(&Frame { kind: Kind::Hello, world, rank, payload: body.clone() });
            // Replace the checksum with body-derived bytes unless they happen to agree.
            let n = bytes.len();
            let fake: [u8; 8] = std::array::from_fn(|i| body.get(i).copied().unwrap_or(0));
            if bytes[n - 8..] != fake {
                bytes[n - 8..].copy_from_slice(&fake);
                proptest::prop_assert!(decode(&bytes).is_err());
            }
        }
    }
}
