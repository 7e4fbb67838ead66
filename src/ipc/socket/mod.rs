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
//! (`poll` before each call, and every `sendmsg` / `recvmsg` is non-blocking), so a
//! silent, dead or no longer reading peer gives [`Error::Timeout`] or
//! [`Error::PeerGone`], never a hang; [`Duration::MAX`] (or any timeout whose deadline
//! does not fit in an [`Instant`]) means no timeout. Received descriptors are `OwnedFd`s
//! from the first moment: on any error they are closed, nothing leaks.
//!
//! Before anything is sent or received, the peer's credentials (`SO_PEERCRED`) are
//! checked against a [`PeerPolicy`] (by default: the same effective uid as this
//! process), so descriptors never go to, nor are taken from, a process of another user
//! unless the caller allowed it.
//!
//! After an error the stream may be in the middle of a message: drop the connection.

mod bundle;
mod options;
mod peer;

pub use bundle::{
    recv_handles, recv_handles_timeout, recv_handles_with, send_handles, send_handles_with,
};
use options::Deadline;
pub use options::{DEFAULT_TIMEOUT, TransportOptions};
pub use peer::{PeerCredentials, PeerPolicy, check_peer, peer_credentials};

use super::wire::corrupt;
use crate::error::{Error, Result};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Largest message payload accepted.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;
/// Most descriptors one message may carry (the kernel's own limit is 253).
pub const MAX_FDS: usize = 64;

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
fn wait(stream: &UnixStream, flags: PollFlags, deadline: &Deadline) -> Result<()> {
    let what = if flags.contains(PollFlags::IN) {
        "an IPC message from the peer"
    } else {
        "the peer to read an IPC message (it stopped reading and the socket buffer is full)"
    };
    loop {
        // Past the deadline, one last look without waiting: what has already arrived
        // (or room that is already there) is taken even with a zero timeout.
        let (ts, late) = match deadline.poll_slice(what) {
            Ok(left) => (
                left.map(|left| Timespec {
                    tv_sec: left.as_secs() as i64, // at most MAX_POLL_SLICE
                    tv_nsec: i64::from(left.subsec_nanos()),
                }),
                None,
            ),
            Err(timeout) => (
                Some(Timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                }),
                Some(timeout),
            ),
        };
        let mut fds = [PollFd::new(stream, flags)];
        match rustix::event::poll(&mut fds, ts.as_ref()) {
            Ok(0) => match late {
                Some(timeout) => return Err(timeout),
                None => continue, // loop re-checks the deadline
            },
            // Readable, writable, hung up or in error: the next call tells which.
            Ok(_) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(errno_error("poll", e)),
        }
    }
}

/// The error for a `recvmsg` whose control data the kernel truncated (`MSG_CTRUNC`)
/// after `received` descriptors of this call arrived. The control buffer holds
/// [`MAX_FDS`] descriptors, so a truncation with fewer in it means the kernel could not
/// install the rest in this process: it ran out of descriptors (`EMFILE` against
/// `RLIMIT_NOFILE`, or `ENFILE`), and the kernel closed the ones it could not install.
fn truncated_control(received: usize) -> Error {
    if received < MAX_FDS {
        Error::FdLimit {
            received,
            soft_limit: rustix::process::getrlimit(rustix::process::Resource::Nofile).current,
        }
    } else {
        corrupt(format!(
            "the peer sent more file descriptors than the limit of {MAX_FDS}"
        ))
    }
}

/// One `recvmsg` into `buf`, collecting descriptors. `Ok(0)` means end of stream.
fn recv_some(
    stream: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    deadline: &Deadline,
) -> Result<usize> {
    loop {
        wait(stream, PollFlags::IN, deadline)?;
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [IoSliceMut::new(buf)];
        // Non-blocking: another reader may have taken what `poll` saw.
        let flags = RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT;
        match rustix::net::recvmsg(stream, &mut iov, &mut control, flags) {
            Ok(msg) => {
                let before = fds.len();
                for cmsg in control.drain() {
                    if let RecvAncillaryMessage::ScmRights(received) = cmsg {
                        fds.extend(received);
                    }
                }
                if msg.flags.contains(ReturnFlags::CTRUNC) {
                    return Err(truncated_control(fds.len() - before));
                }
                if fds.len() > MAX_FDS {
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
    deadline: &Deadline,
) -> Result<()> {
    while !buf.is_empty() {
        let n = recv_some(stream, buf, fds, deadline)?;
        if n == 0 {
            return Err(Error::PeerGone);
        }
        buf = &mut buf[n..];
    }
    Ok(())
}

/// Sends one framed message carrying `fds`, waiting at most `timeout` (the peer must be
/// allowed by [`PeerPolicy::SameUid`]).
pub fn send_message_timeout(
    stream: &UnixStream,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
    timeout: Duration,
) -> Result<()> {
    send_message_with(
        stream,
        bytes,
        fds,
        &TransportOptions::default().timeout(timeout),
    )
}

/// Sends one framed message carrying `fds`: checks the peer against `options`' policy,
/// then sends, waiting at most `options`' timeout for the peer to take all of it (a peer
/// that stopped reading gives [`Error::Timeout`] once the socket buffer is full).
pub fn send_message_with(
    stream: &UnixStream,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
    options: &TransportOptions,
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
    let deadline = Deadline::after(options.get_timeout());
    check_peer(stream, options.get_peer())?;
    let mut frame = Vec::with_capacity(FRAME_HEADER + bytes.len());
    frame.extend_from_slice(&FRAME_MAGIC);
    frame.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    frame.extend_from_slice(&(fds.len() as u32).to_le_bytes());
    frame.extend_from_slice(bytes);
    let mut sent = 0;
    while sent < frame.len() {
        wait(stream, PollFlags::OUT, &deadline)?;
        // Descriptors ride on the first sendmsg that takes any bytes.
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
        // Non-blocking: a blocking sendmsg of more than the socket buffer holds would
        // wait, without bound, for a peer that may never read again. This way it takes
        // what fits and the loop waits (bounded) for room for the rest.
        let flags = SendFlags::NOSIGNAL | SendFlags::DONTWAIT;
        match rustix::net::sendmsg(stream, &iov, &mut control, flags) {
            Ok(n) => sent += n,
            Err(Errno::INTR) | Err(Errno::AGAIN) => continue,
            Err(Errno::PIPE) | Err(Errno::CONNRESET) => return Err(Error::PeerGone),
            Err(e) => return Err(errno_error("sendmsg", e)),
        }
    }
    Ok(())
}

/// [`send_message_with`] with the default [`TransportOptions`] ([`DEFAULT_TIMEOUT`],
/// [`PeerPolicy::SameUid`]).
pub fn send_message(stream: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
    send_message_with(stream, bytes, fds, &TransportOptions::default())
}

/// Receives one framed message, waiting at most `timeout` for all of it (the peer must
/// be allowed by [`PeerPolicy::SameUid`]).
pub fn recv_message_timeout(stream: &UnixStream, timeout: Duration) -> Result<Message> {
    recv_message_with(stream, &TransportOptions::default().timeout(timeout))
}

/// Receives one framed message: checks the peer against `options`' policy, then waits
/// at most `options`' timeout for all of the message.
///
/// A peer that closed the socket (exited, crashed, was killed) before or during the
/// message gives [`Error::PeerGone`]; garbage or limits exceeded give
/// [`Error::CorruptHandle`]; silence gives [`Error::Timeout`]; descriptors this process
/// had no room for (`EMFILE`) give [`Error::FdLimit`]; a peer of another user (by
/// default) gives [`Error::PeerNotAllowed`].
pub fn recv_message_with(stream: &UnixStream, options: &TransportOptions) -> Result<Message> {
    let deadline = Deadline::after(options.get_timeout());
    check_peer(stream, options.get_peer())?;
    let mut fds = Vec::new();
    let mut header = [0u8; FRAME_HEADER];
    recv_exact(stream, &mut header, &mut fds, &deadline)?;
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
    recv_exact(stream, &mut bytes, &mut fds, &deadline)?;
    if fds.len() != nfds {
        return Err(corrupt(format!(
            "message announced {nfds} file descriptors but {} arrived",
            fds.len()
        )));
    }
    Ok(Message { bytes, fds })
}

/// [`recv_message_with`] with the default [`TransportOptions`] ([`DEFAULT_TIMEOUT`],
/// [`PeerPolicy::SameUid`]).
pub fn recv_message(stream: &UnixStream) -> Result<Message> {
    recv_message_with(stream, &TransportOptions::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipc::handle::tests::sample_buffer;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::time::Instant;

    pub(super) const SHORT: Duration = Duration::from_millis(300);

    pub(super) fn pipe_with(text: &[u8]) -> std::io::PipeReader {
        let (r, mut w) = std::io::pipe().unwrap();
        w.write_all(text).unwrap();
        r
    }

    pub(super) fn read_fd(fd: OwnedFd) -> Vec<u8> {
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
    fn a_zero_timeout_takes_what_has_arrived() {
        let (a, b) = UnixStream::pair().unwrap();
        let t = Instant::now();
        assert!(matches!(
            recv_message_timeout(&b, Duration::ZERO),
            Err(Error::Timeout { after_ms: 0, .. })
        ));
        send_message_timeout(&a, b"here", &[], Duration::ZERO).unwrap();
        let got = recv_message_timeout(&b, Duration::ZERO).unwrap();
        assert_eq!(got.bytes, b"here");
        println!("two zero-timeout receives took {:?}", t.elapsed());
        assert!(t.elapsed() < SHORT, "{:?}", t.elapsed());
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

    /// Runs `f` on a thread and fails (instead of hanging the suite) if it takes longer
    /// than `limit`.
    fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(limit)
            .expect("the call blocked past its timeout")
    }

    #[test]
    fn send_to_a_peer_that_stopped_reading_times_out() {
        // 3 MB is far more than a Unix socket buffer (~208 KiB): before non-blocking
        // sendmsg this blocked forever inside the kernel.
        let (a, b) = UnixStream::pair().unwrap();
        let big = vec![7u8; 3_000_000];
        let (err, elapsed) = within(Duration::from_secs(20), move || {
            let t = Instant::now();
            let err = send_message_timeout(&a, &big, &[], SHORT).unwrap_err();
            (err, t.elapsed())
        });
        assert!(
            matches!(err, Error::Timeout { what, after_ms: 300 } if what.contains("stopped reading")),
            "{err:?}"
        );
        assert!(err.to_string().contains("timed out after 300 ms"), "{err}");
        assert!(elapsed >= SHORT && elapsed < SHORT * 10, "{elapsed:?}");
        drop(b);
    }

    #[test]
    fn slow_reader_gets_a_large_message_within_the_timeout() {
        // The reader starts late and reads in small steps: the sender waits for room
        // (bounded) instead of failing, and the message arrives whole, descriptor included.
        let (a, b) = UnixStream::pair().unwrap();
        let big: Vec<u8> = (0..1_000_000u32).map(|i| (i * 13) as u8).collect();
        let expect = big.clone();
        let sender = std::thread::spawn(move || {
            let p = pipe_with(b"slow");
            send_message_timeout(&a, &big, &[p.as_fd()], Duration::from_secs(20))
        });
        std::thread::sleep(Duration::from_millis(200));
        let msg = recv_message(&b).unwrap();
        sender.join().unwrap().unwrap();
        assert_eq!(msg.bytes, expect);
        assert_eq!(read_fd(msg.fds.into_iter().next().unwrap()), b"slow");
    }

    #[test]
    fn duration_max_means_no_timeout() {
        // Whole sends and receives with no timeout; the message arrives late.
        let (a, b) = UnixStream::pair().unwrap();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            let p = pipe_with(b"late");
            send_message_timeout(&a, b"late", &[p.as_fd()], Duration::MAX).unwrap();
            let opts = TransportOptions::default().timeout(Duration::MAX);
            send_handles_with(&a, &[], &[sample_buffer(2, 2)], &opts).unwrap();
            a
        });
        let msg = within(Duration::from_secs(20), move || {
            let msg = recv_message_timeout(&b, Duration::MAX).unwrap();
            let (pools, bufs) = recv_handles_timeout(&b, Duration::MAX).unwrap();
            assert!(pools.is_empty());
            assert_eq!(bufs, [sample_buffer(2, 2)]);
            msg
        });
        drop(t.join().unwrap());
        assert_eq!(msg.bytes, b"late");
        assert_eq!(read_fd(msg.fds.into_iter().next().unwrap()), b"late");
    }

    #[test]
    fn too_many_fds_from_the_peer_is_not_fd_exhaustion() {
        // A peer that sends more descriptors than the control buffer holds: the kernel
        // truncates with MAX_FDS of them in the buffer. That is the peer's doing
        // (CorruptHandle), not this process running out of descriptors (FdLimit).
        let (a, b) = UnixStream::pair().unwrap();
        let mut frame = FRAME_MAGIC.to_vec();
        frame.extend_from_slice(&1u32.to_le_bytes());
        frame.extend_from_slice(&(MAX_FDS as u32 + 1).to_le_bytes());
        frame.push(b'!');
        let p = pipe_with(b"x");
        let fds = vec![p.as_fd(); MAX_FDS + 1];
        let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS + 1))];
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
            matches!(&err, Error::CorruptHandle { reason } if reason.contains("more file descriptors than the limit")),
            "{err:?}"
        );
    }

    #[test]
    fn control_truncation_is_classified() {
        // Fewer descriptors than the buffer holds, yet truncated: the kernel could not
        // install them here (EMFILE / ENFILE).
        for received in [0, 1, MAX_FDS - 1] {
            let err = truncated_control(received);
            assert!(
                matches!(err, Error::FdLimit { received: r, .. } if r == received),
                "{err:?}"
            );
            let text = err.to_string();
            assert!(
                text.contains("receiving process ran out of file descriptors"),
                "{text}"
            );
            assert!(
                text.contains("EMFILE") && text.contains("RLIMIT_NOFILE"),
                "{text}"
            );
        }
        assert!(matches!(
            truncated_control(MAX_FDS),
            Error::CorruptHandle { .. }
        ));
        let limited = Error::FdLimit {
            received: 0,
            soft_limit: Some(64),
        };
        assert!(limited.to_string().contains("soft limit 64"), "{limited}");
        let unlimited = Error::FdLimit {
            received: 0,
            soft_limit: None,
        };
        assert!(unlimited.to_string().contains("soft limit unlimited"));
    }
}
