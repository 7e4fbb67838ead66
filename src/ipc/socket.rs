//! Framed messages with file descriptors over Unix domain sockets (`SCM_RIGHTS`).
//!
//! One message on the stream is
//!
//! ```text
//! magic b"GBIM" | u32 LE payload length | u32 LE descriptor count | payload bytes
//! ```
//!
//! sent with one `sendmsg` whose ancillary data carries the descriptors (further
//! `sendmsg` calls only if the kernel took part of the bytes). The receiver checks the
//! magic, the bounds ([`MAX_MESSAGE_BYTES`], [`MAX_FDS`]) and that exactly the
//! announced number of descriptors arrived. Every wait is bounded by a timeout
//! (`poll` before each call), so a silent or dead peer gives [`Error::Timeout`] or
//! [`Error::PeerGone`], never a hang. Received descriptors are `OwnedFd`s from the first
//! moment: on any error they are closed, nothing leaks.
//!
//! After an error the stream may be in the middle of a message: drop the connection.

use super::handle::{BufferHandle, PoolHandle};
use super::wire::{self, Kind, corrupt};
use crate::error::{Error, Result};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Largest message payload accepted.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;
/// Most descriptors one message may carry (the kernel's own limit is 253).
pub const MAX_FDS: usize = 64;
/// Timeout of the functions without a `_timeout` suffix.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

const FRAME_MAGIC: [u8; 4] = *b"GBIM";
const FRAME_HEADER: usize = 12;

/// One received message: its bytes and the descriptors that came with it.
#[derive(Debug)]
pub struct Message {
    /// The payload.
    pub bytes: Vec<u8>,
    /// The descriptors, in the order they were sent.
    pub fds: Vec<OwnedFd>,
}

fn errno_error(what: &'static str, e: Errno) -> Error {
    let io = std::io::Error::from(e);
    super::io_error(what, &io)
}

/// Waits until `stream` is readable/writable or the deadline passes.
fn wait(stream: &UnixStream, flags: PollFlags, deadline: Instant, timeout: Duration) -> Result<()> {
    let what = if flags.contains(PollFlags::IN) {
        "an IPC message from the peer"
    } else {
        "the peer to accept an IPC message"
    };
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Timeout {
                what,
                after_ms: timeout.as_millis() as u64,
            });
        }
        let left = deadline - now;
        let ts = Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = [PollFd::new(stream, flags)];
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(0) => continue, // loop re-checks the deadline
            // Readable, writable, hung up or in error: the next call tells which.
            Ok(_) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(errno_error("poll", e)),
        }
    }
}

/// One `recvmsg` into `buf`, collecting descriptors. `Ok(0)` means end of stream.
fn recv_some(
    stream: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    deadline: Instant,
    timeout: Duration,
) -> Result<usize> {
    loop {
        wait(stream, PollFlags::IN, deadline, timeout)?;
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [IoSliceMut::new(buf)];
        match rustix::net::recvmsg(stream, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(msg) => {
                for cmsg in control.drain() {
                    if let RecvAncillaryMessage::ScmRights(received) = cmsg {
                        fds.extend(received);
                    }
                }
                if msg.flags.contains(ReturnFlags::CTRUNC) || fds.len() > MAX_FDS {
                    return Err(corrupt(format!(
                        "the peer sent more file descriptors than the limit of {MAX_FDS}"
                    )));
                }
                return Ok(msg.bytes);
            }
            Err(Errno::INTR) | Err(Errno::AGAIN) => continue,
            Err(Errno::CONNRESET) => return Err(Error::PeerGone),
            Err(e) => return Err(errno_error("recvmsg", e)),
        }
    }
}

/// Fills `buf` completely; end of stream before that is [`Error::PeerGone`].
fn recv_exact(
    stream: &UnixStream,
    mut buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    deadline: Instant,
    timeout: Duration,
) -> Result<()> {
    while !buf.is_empty() {
        let n = recv_some(stream, buf, fds, deadline, timeout)?;
        if n == 0 {
            return Err(Error::PeerGone);
        }
        buf = &mut buf[n..];
    }
    Ok(())
}

/// Sends one framed message carrying `fds`, waiting at most `timeout`.
pub fn send_message_timeout(
    stream: &UnixStream,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
    timeout: Duration,
) -> Result<()> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(Error::InvalidArgument(format!(
            "IPC message of {} bytes exceeds the limit of {MAX_MESSAGE_BYTES}",
            bytes.len()
        )));
    }
    if fds.len() > MAX_FDS {
        return Err(Error::InvalidArgument(format!(
            "{} file descriptors exceed the limit of {MAX_FDS} per message",
            fds.len()
        )));
    }
    let deadline = Instant::now() + timeout;
    let mut frame = Vec::with_capacity(FRAME_HEADER + bytes.len());
    frame.extend_from_slice(&FRAME_MAGIC);
    frame.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    frame.extend_from_slice(&(fds.len() as u32).to_le_bytes());
    frame.extend_from_slice(bytes);
    let mut sent = 0;
    while sent < frame.len() {
        wait(stream, PollFlags::OUT, deadline, timeout)?;
        // Descriptors ride on the first sendmsg only.
        let with_fds = if sent == 0 { fds } else { &[] };
        let mut space =
            vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(with_fds.len()))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !with_fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(with_fds)) {
            return Err(Error::InvalidArgument(
                "file descriptors do not fit the control buffer".into(),
            ));
        }
        let iov = [IoSlice::new(&frame[sent..])];
        match rustix::net::sendmsg(stream, &iov, &mut control, SendFlags::NOSIGNAL) {
            Ok(n) => sent += n,
            Err(Errno::INTR) | Err(Errno::AGAIN) => continue,
            Err(Errno::PIPE) | Err(Errno::CONNRESET) => return Err(Error::PeerGone),
            Err(e) => return Err(errno_error("sendmsg", e)),
        }
    }
    Ok(())
}

/// [`send_message_timeout`] with [`DEFAULT_TIMEOUT`].
pub fn send_message(stream: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
    send_message_timeout(stream, bytes, fds, DEFAULT_TIMEOUT)
}

/// Receives one framed message, waiting at most `timeout` for all of it.
///
/// A peer that closed the socket (exited, crashed, was killed) before or during the
/// message gives [`Error::PeerGone`]; garbage or limits exceeded give
/// [`Error::CorruptHandle`]; silence gives [`Error::Timeout`].
pub fn recv_message_timeout(stream: &UnixStream, timeout: Duration) -> Result<Message> {
    let deadline = Instant::now() + timeout;
    let mut fds = Vec::new();
    let mut header = [0u8; FRAME_HEADER];
    recv_exact(stream, &mut header, &mut fds, deadline, timeout)?;
    if header[0..4] != FRAME_MAGIC {
        return Err(corrupt(format!(
            "bad message magic {:02x?} (expected \"GBIM\")",
            &header[0..4]
        )));
    }
    let len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
    let nfds = u32::from_le_bytes([header[8], header[9], header[10], header[11]]) as usize;
    if len > MAX_MESSAGE_BYTES {
        return Err(corrupt(format!(
            "message announces {len} bytes, more than the limit of {MAX_MESSAGE_BYTES}"
        )));
    }
    if nfds > MAX_FDS {
        return Err(corrupt(format!(
            "message announces {nfds} file descriptors, more than the limit of {MAX_FDS}"
        )));
    }
    let mut bytes = vec![0u8; len];
    recv_exact(stream, &mut bytes, &mut fds, deadline, timeout)?;
    if fds.len() != nfds {
        return Err(corrupt(format!(
            "message announced {nfds} file descriptors but {} arrived",
            fds.len()
        )));
    }
    Ok(Message { bytes, fds })
}

/// [`recv_message_timeout`] with [`DEFAULT_TIMEOUT`].
pub fn recv_message(stream: &UnixStream) -> Result<Message> {
    recv_message_timeout(stream, DEFAULT_TIMEOUT)
}

#[derive(Serialize)]
struct BundleOut<'a> {
    pools: &'a [PoolHandle],
    buffers: &'a [BufferHandle],
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BundleIn {
    pools: Vec<PoolHandle>,
    buffers: Vec<BufferHandle>,
}

/// Sends pool handles (their descriptors by `SCM_RIGHTS`) and buffer handles as one
/// message: a sealed (checksummed) bundle plus one descriptor per pool, in order.
///
/// The handles stay valid here; the peer receives duplicates of the descriptors.
pub fn send_handles(
    stream: &UnixStream,
    pools: &[PoolHandle],
    buffers: &[BufferHandle],
) -> Result<()> {
    let fds = pools
        .iter()
        .enumerate()
        .map(|(i, p)| {
            p.fd().ok_or_else(|| {
                Error::InvalidArgument(format!("pool handle {i} has no file descriptor to send"))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes = wire::seal(Kind::Bundle, &BundleOut { pools, buffers })?;
    send_message(stream, &bytes, &fds)
}

/// [`recv_handles_timeout`] with [`DEFAULT_TIMEOUT`].
pub fn recv_handles(stream: &UnixStream) -> Result<(Vec<PoolHandle>, Vec<BufferHandle>)> {
    recv_handles_timeout(stream, DEFAULT_TIMEOUT)
}

/// Receives what [`send_handles`] sent: pool handles with their descriptors attached and
/// validated buffer handles.
pub fn recv_handles_timeout(
    stream: &UnixStream,
    timeout: Duration,
) -> Result<(Vec<PoolHandle>, Vec<BufferHandle>)> {
    let Message { bytes, fds } = recv_message_timeout(stream, timeout)?;
    let bundle: BundleIn = wire::open(Kind::Bundle, &bytes)?;
    if bundle.pools.len() != fds.len() {
        return Err(corrupt(format!(
            "bundle has {} pool handles but {} file descriptors arrived",
            bundle.pools.len(),
            fds.len()
        )));
    }
    for b in &bundle.buffers {
        b.validate()?;
    }
    let pools = bundle
        .pools
        .into_iter()
        .zip(fds)
        .map(|(p, fd)| p.with_fd(fd))
        .collect();
    Ok((pools, bundle.buffers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Uuid;
    use crate::ipc::handle::{PoolId, tests::sample_buffer};
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    const SHORT: Duration = Duration::from_millis(300);

    fn pipe_with(text: &[u8]) -> std::io::PipeReader {
        let (r, mut w) = std::io::pipe().unwrap();
        w.write_all(text).unwrap();
        r
    }

    fn read_fd(fd: OwnedFd) -> Vec<u8> {
        let mut f = std::fs::File::from(fd);
        let mut out = Vec::new();
        f.read_to_end(&mut out).unwrap();
        out
    }

    #[test]
    fn fds_and_bytes_cross_between_threads() {
        let (a, b) = UnixStream::pair().unwrap();
        let pipes: Vec<_> = (0..3)
            .map(|i| pipe_with(format!("pipe {i}").as_bytes()))
            .collect();
        let t = std::thread::spawn(move || recv_message(&b).unwrap());
        let fds: Vec<_> = pipes.iter().map(|p| p.as_fd()).collect();
        send_message(&a, b"hello", &fds).unwrap();
        drop(pipes); // the receiver holds its own duplicates
        let msg = t.join().unwrap();
        assert_eq!(msg.bytes, b"hello");
        let texts: Vec<_> = msg.fds.into_iter().map(read_fd).collect();
        assert_eq!(
            texts,
            [b"pipe 0".to_vec(), b"pipe 1".to_vec(), b"pipe 2".to_vec()]
        );
    }

    #[test]
    fn large_messages_arrive_whole() {
        let (a, b) = UnixStream::pair().unwrap();
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7) as u8).collect();
        let expect = big.clone();
        let t = std::thread::spawn(move || {
            let p = pipe_with(b"x");
            send_message(&a, &big, &[p.as_fd()]).unwrap();
        });
        let msg = recv_message(&b).unwrap();
        t.join().unwrap();
        assert_eq!(msg.bytes, expect);
        assert_eq!(msg.fds.len(), 1);
    }

    #[test]
    fn closed_peer_is_peer_gone() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        assert_eq!(recv_message(&b).unwrap_err(), Error::PeerGone);
        assert_eq!(send_message(&b, b"x", &[]).unwrap_err(), Error::PeerGone);
    }

    #[test]
    fn peer_dying_mid_message_is_peer_gone() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut header = Vec::new();
        header.extend_from_slice(&FRAME_MAGIC);
        header.extend_from_slice(&100u32.to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes());
        header.extend_from_slice(b"only part");
        a.write_all(&header).unwrap();
        drop(a);
        assert_eq!(recv_message(&b).unwrap_err(), Error::PeerGone);
        // Half a header.
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(b"GB").unwrap();
        drop(a);
        assert_eq!(recv_message(&b).unwrap_err(), Error::PeerGone);
    }

    #[test]
    fn silence_times_out() {
        let (_a, b) = UnixStream::pair().unwrap();
        let t = Instant::now();
        let err = recv_message_timeout(&b, SHORT).unwrap_err();
        assert!(
            matches!(err, Error::Timeout { after_ms: 300, .. }),
            "{err:?}"
        );
        assert!(t.elapsed() >= SHORT && t.elapsed() < SHORT * 10);
    }

    #[test]
    fn garbage_and_oversized_frames_are_rejected() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(b"HTTP/1.1 200 OK\r\n").unwrap();
        assert!(matches!(
            recv_message_timeout(&b, SHORT),
            Err(Error::CorruptHandle { .. })
        ));
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut h = FRAME_MAGIC.to_vec();
        h.extend_from_slice(&(MAX_MESSAGE_BYTES as u32 + 1).to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        a.write_all(&h).unwrap();
        assert!(matches!(
            recv_message_timeout(&b, SHORT),
            Err(Error::CorruptHandle { .. })
        ));
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut h = FRAME_MAGIC.to_vec();
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&(MAX_FDS as u32 + 1).to_le_bytes());
        a.write_all(&h).unwrap();
        assert!(matches!(
            recv_message_timeout(&b, SHORT),
            Err(Error::CorruptHandle { .. })
        ));
    }

    #[test]
    fn missing_fds_are_detected() {
        // Announce two descriptors, send one.
        let (a, b) = UnixStream::pair().unwrap();
        let mut frame = FRAME_MAGIC.to_vec();
        frame.extend_from_slice(&1u32.to_le_bytes());
        frame.extend_from_slice(&2u32.to_le_bytes());
        frame.push(b'!');
        let p = pipe_with(b"x");
        let fds = [p.as_fd()];
        let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
        rustix::net::sendmsg(
            &a,
            &[IoSlice::new(&frame)],
            &mut control,
            SendFlags::NOSIGNAL,
        )
        .unwrap();
        let err = recv_message_timeout(&b, SHORT).unwrap_err();
        assert!(
            matches!(&err, Error::CorruptHandle { reason } if reason.contains("2 file descriptors")),
            "{err:?}"
        );
    }

    #[test]
    fn limits_are_enforced_on_send() {
        let (a, _b) = UnixStream::pair().unwrap();
        let big = vec![0u8; MAX_MESSAGE_BYTES + 1];
        assert!(matches!(
            send_message(&a, &big, &[]),
            Err(Error::InvalidArgument(_))
        ));
        let p = pipe_with(b"");
        let fds = vec![p.as_fd(); MAX_FDS + 1];
        assert!(matches!(
            send_message(&a, b"", &fds),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn handles_travel_with_their_fds() {
        let (a, b) = UnixStream::pair().unwrap();
        let pools: Vec<_> = (0..2u8)
            .map(|i| {
                let fd: OwnedFd = pipe_with(&[b'a' + i]).into();
                PoolHandle::new(PoolId::fresh().unwrap(), Uuid([i; 16]), i as usize, fd)
            })
            .collect();
        let buffers: Vec<_> = (0..32).map(|i| sample_buffer(i + 1, i as u8)).collect();
        send_handles(&a, &pools, &buffers).unwrap();
        let (got_pools, got_buffers) = recv_handles(&b).unwrap();
        assert_eq!(got_buffers, buffers);
        assert_eq!(got_pools.len(), 2);
        for (i, (mut got, sent)) in got_pools.into_iter().zip(&pools).enumerate() {
            assert_eq!(got.pool_id(), sent.pool_id());
            assert_eq!(got.device_uuid(), sent.device_uuid());
            assert_eq!(read_fd(got.take_fd().unwrap()), [b'a' + i as u8]);
        }
    }

    #[test]
    fn handle_bundle_errors() {
        // A pool handle without a descriptor cannot be sent.
        let (a, b) = UnixStream::pair().unwrap();
        let fd: OwnedFd = pipe_with(b"").into();
        let mut h = PoolHandle::new(PoolId::fresh().unwrap(), Uuid([0; 16]), 0, fd);
        drop(h.take_fd());
        assert!(matches!(
            send_handles(&a, &[h], &[]),
            Err(Error::InvalidArgument(_))
        ));
        // A plain message that is not a bundle.
        send_message(&a, b"not a bundle", &[]).unwrap();
        assert!(matches!(
            recv_handles_timeout(&b, SHORT),
            Err(Error::CorruptHandle { .. })
        ));
        // A bundle whose checksum was damaged in flight.
        let mut bytes = wire::seal(
            Kind::Bundle,
            &BundleOut {
                pools: &[],
                buffers: &[sample_buffer(3, 3)],
            },
        )
        .unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x20;
        send_message(&a, &bytes, &[]).unwrap();
        assert!(matches!(
            recv_handles_timeout(&b, SHORT),
            Err(Error::CorruptHandle { .. })
        ));
        // A bundle with a descriptor too many: rejected, and the descriptor is closed.
        let bytes = wire::seal(
            Kind::Bundle,
            &BundleOut {
                pools: &[],
                buffers: &[],
            },
        )
        .unwrap();
        let extra = pipe_with(b"");
        send_message(&a, &bytes, &[extra.as_fd()]).unwrap();
        assert!(matches!(
            recv_handles_timeout(&b, SHORT),
            Err(Error::CorruptHandle { .. })
        ));
    }

    #[test]
    fn fds_outlive_the_sender() {
        // The sender closes its pipe and its socket before the message is read: the
        // descriptor in flight stays usable, and the closed socket reads as PeerGone.
        let (a, b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            let p = pipe_with(b"survives");
            send_message(&a, b"", &[p.as_fd()]).unwrap();
            // Sender's pipe end and socket close here.
        });
        t.join().unwrap();
        let msg = recv_message(&b).unwrap();
        assert_eq!(read_fd(msg.fds.into_iter().next().unwrap()), b"survives");
        assert_eq!(recv_message(&b).unwrap_err(), Error::PeerGone);
    }
}
