//! The sender's side: [`PoolSlice::lend`], [`PoolSlice::share`], and the [`Lent`] /
//! [`Shared`] values that hold the buffer while it is out.

use super::{
    ConnSlot, HandoffFailed, Id, JoinError, MessageOut, Mode, OfferOut, decode_hand_back, fresh_id,
};
use crate::access::Access;
use crate::error::{Error, Result};
use crate::ipc::socket::{TransportOptions, check_peer, recv_message_with, send_message_with};
use crate::ipc::wire::{self, Kind};
use crate::ipc::{EventHandle, PoolSlice, io_error};
use crate::memory::{DeviceRepr, DeviceSlice, DeviceViewMut, Tracked};
use crate::stream::{BoundStream, Event, EventFlags};
use rustix::event::{PollFd, PollFlags, Timespec};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// How long a dropped, unjoined hand-off waits per round for its hand-back or its
/// receiver's end before it checks again (the parked thread runs until one comes).
const PARK_ROUND: Duration = Duration::from_secs(5);

/// A buffer out on a hand-off, with what is needed to end it.
struct Outgoing<T: DeviceRepr> {
    buffer: PoolSlice<T>,
    /// Recorded after the sender's last use; the receiver opened it. Kept alive until the
    /// receiver has dropped its opened copy (it does so before it hands back, or by
    /// dying): the driver makes a use of an opened event undefined once the exporter has
    /// destroyed it.
    event: Event,
    conn: UnixStream,
    options: TransportOptions,
    id: Id,
    /// The receiver's process, opened (`pidfd_open`) before the offer was sent.
    peer: OwnedFd,
    _slot: ConnSlot,
}

/// How one attempt to end a hand-off came out.
enum Settled<T: DeviceRepr> {
    /// Handed back; `Some` if it was refused or the receiver died.
    Back(PoolSlice<T>, Option<Error>),
    /// Still out.
    Out(Box<Outgoing<T>>, Error),
}

impl<T: DeviceRepr> Outgoing<T> {
    /// Starts a hand-off of `buffer` over `conn`; the buffer comes back on any error.
    fn start(
        buffer: PoolSlice<T>,
        mode: Mode,
        stream: &BoundStream<'_>,
        conn: &UnixStream,
        options: &TransportOptions,
    ) -> std::result::Result<Box<Outgoing<T>>, Box<HandoffFailed<T>>> {
        match offer(&buffer, mode, stream, conn, options) {
            Ok((event, conn, id, peer, slot)) => Ok(Box::new(Outgoing {
                buffer,
                event,
                conn,
                options: options.clone(),
                id,
                peer,
                _slot: slot,
            })),
            Err(error) => Err(Box::new(HandoffFailed { buffer, error })),
        }
    }

    /// Waits up to `timeout` for the hand-back; on a closed connection, up to `timeout`
    /// more for the receiver's process to end.
    fn settle(self: Box<Self>, timeout: Duration) -> Settled<T> {
        let options = self.options.clone().timeout(timeout);
        let got = recv_message_with(&self.conn, &options)
            .and_then(|m| decode_hand_back(&m.bytes, &m.fds, &self.id));
        match got {
            Ok(None) => Settled::Back(self.finish(), None),
            Ok(Some(reason)) => {
                Settled::Back(self.finish(), Some(Error::HandoffRefused { reason }))
            }
            Err(Error::PeerGone) if process_ended(&self.peer, timeout) => {
                Settled::Back(self.finish(), Some(Error::PeerGone))
            }
            Err(e) => Settled::Out(self, e),
        }
    }

    /// The buffer; the event, the connection and its slot go.
    fn finish(self: Box<Self>) -> PoolSlice<T> {
        let Outgoing { buffer, event, .. } = *self;
        drop(event);
        buffer
    }

    fn join<H>(
        self: Box<Self>,
        timeout: Duration,
        wrap: impl FnOnce(Box<Outgoing<T>>) -> H,
    ) -> std::result::Result<PoolSlice<T>, JoinError<H, T>> {
        match self.settle(timeout) {
            Settled::Back(buffer, None) => Ok(buffer),
            Settled::Back(buffer, Some(error)) => {
                Err(JoinError::Returned(Box::new(HandoffFailed {
                    buffer,
                    error,
                })))
            }
            Settled::Out(out, error) => Err(JoinError::StillOut {
                handoff: wrap(out),
                error,
            }),
        }
    }
}

/// Orders an interprocess event after the buffer's pending uses (all of them for a
/// lend, the last write for a share) and sends the offer. Returns the event, a duplicate
/// of the connection, the hand-off's id, the receiver's pidfd and the connection's slot.
fn offer<T: DeviceRepr>(
    buffer: &PoolSlice<T>,
    mode: Mode,
    stream: &BoundStream<'_>,
    conn: &UnixStream,
    options: &TransportOptions,
) -> Result<(Event, UnixStream, Id, OwnedFd, ConnSlot)> {
    stream
        .bound()
        .expect_device("pool slice", crate::memory::DeviceMemory::device(buffer))?;
    let slot = ConnSlot::take(conn)?;
    let (peer, receiver_pid) = open_peer(conn, options)?;
    let pool = buffer.export_pool()?;
    let handle = buffer.export_unordered()?;
    let event = stream
        .bound()
        .new_event_with(EventFlags::new().timing(false).interprocess(true))?;
    let access = match mode {
        Mode::Lend => Access::Write,
        Mode::ShareRead => Access::Read,
    };
    // The stream waits (on the device) for every pending use that conflicts with the
    // receiver's access; the event then marks the point after them. The buffer is owned
    // here, so no use can begin between the claim and the record.
    drop(stream.claim([Some((Tracked::tracker(&**buffer), access))])?);
    stream.record(&event)?;
    let id = fresh_id()?;
    let out = OfferOut {
        id,
        mode,
        receiver_pid,
        pool: &pool,
        buffer: &handle,
        event: &EventHandle::export(&event)?,
    };
    let bytes = wire::seal(Kind::Handoff, &MessageOut::Offer(out))?;
    let own = conn
        .try_clone()
        .map_err(|e| io_error("dup of the hand-off socket", &e))?;
    let fd = pool.require_fd()?;
    // On an error the peer has no complete offer (a frame is whole only once all of it
    // was sent), so it cannot have imported the buffer: it comes back to the caller.
    send_message_with(conn, &bytes, &[fd], options)?;
    Ok((event, own, id, peer, slot))
}

/// Checks the peer against the policy and opens its process (`pidfd_open`), to tell
/// later when it has ended; returns the pidfd and the pid. Refused with
/// [`Error::InvalidArgument`]: a peer whose pid this process cannot see (another pid
/// namespace), and a connection whose other end this process created (`socketpair`,
/// or a connection to itself, maybe handed to a child since): without the holder's pid
/// a closed connection could not be told apart from a dead process.
fn open_peer(conn: &UnixStream, options: &TransportOptions) -> Result<(OwnedFd, i32)> {
    let cred = check_peer(conn, options.get_peer())?;
    let pid = watchable_peer(cred.pid, rustix::process::getpid())?;
    let fd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
        .map_err(|e| io_error("pidfd_open of the hand-off peer", &std::io::Error::from(e)))?;
    Ok((fd, cred.pid))
}

/// The peer's pid as `SO_PEERCRED` reports it (`peer`), if a hand-off can watch it.
fn watchable_peer(peer: i32, own: rustix::process::Pid) -> Result<rustix::process::Pid> {
    let pid = rustix::process::Pid::from_raw(peer).ok_or_else(|| {
        Error::InvalidArgument(
            "the hand-off peer's pid is not visible here (another pid namespace): a hand-off \
             needs it to tell when the peer's work has ended"
                .into(),
        )
    })?;
    if pid == own {
        return Err(Error::InvalidArgument(
            "the hand-off connection's other end was created by this process (a socketpair, \
             or a connection to itself): the process that holds it now cannot be watched \
             for its end; let the receiving process connect"
                .into(),
        ));
    }
    Ok(pid)
}

/// Whether the process behind `pidfd` has ended, waiting up to `timeout`. A pidfd turns
/// readable once the process has exited: after the kernel closed all its descriptors,
/// the GPU driver's among them, which tears down its CUDA contexts (and stops their
/// work).
fn process_ended(pidfd: &OwnedFd, timeout: Duration) -> bool {
    let deadline = Instant::now().checked_add(timeout);
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let ts = left.map(|l| Timespec {
            tv_sec: l.as_secs().min(3600) as i64,
            tv_nsec: i64::from(l.subsec_nanos()),
        });
        let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, ts.as_ref()) {
            Ok(n) if n > 0 => return true,
            Ok(_) if left.is_some_and(|l| l.is_zero()) => return false,
            Ok(_) | Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return false,
        }
    }
}

/// Keeps a dropped hand-off's buffer until it ends: a thread waits for the hand-back or
/// the receiver's end, then frees the buffer. Nothing is freed under the receiver: if no
/// thread can be started, the buffer is leaked.
fn park<T: DeviceRepr>(out: Box<Outgoing<T>>) {
    let cell = std::sync::Arc::new(std::sync::Mutex::new(Some(out)));
    let mine = std::sync::Arc::clone(&cell);
    let spawned = std::thread::Builder::new()
        .name("gpubind-handoff".into())
        .spawn(move || {
            let taken = mine.lock().unwrap_or_else(|p| p.into_inner()).take();
            let Some(mut out) = taken else { return };
            loop {
                match out.settle(PARK_ROUND) {
                    Settled::Back(buffer, why) => {
                        if let Some(e) = why {
                            log::debug!("a dropped hand-off ended: {e}");
                        }
                        drop(buffer);
                        return;
                    }
                    Settled::Out(o, e) => {
                        if !matches!(e, Error::Timeout { .. }) {
                            // A broken connection: do not spin on it.
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        out = o;
                    }
                }
            }
        });
    if let Err(e) = spawned {
        log::error!("could not park a dropped hand-off ({e}); its buffer is leaked");
        std::mem::forget(cell);
    }
}

/// A [`PoolSlice`] lent to another process by [`PoolSlice::lend`]: the receiver may read
/// and write it; this process has no access to it until [`join`](Self::join) returns it.
///
/// The buffer was moved into the `Lent`, so the sender's code cannot use it, free it or
/// lend it again while it is out:
///
/// ```compile_fail,E0382
/// # fn f(gpu: &gpubind::BoundDevice<'_>, s: &gpubind::BoundStream<'_>,
/// #      buf: gpubind::ipc::PoolSlice<u32>, conn: &std::os::unix::net::UnixStream)
/// #      -> gpubind::Result<()> {
/// let lent = buf.lend(s, conn, &Default::default())?;
/// let data = gpu.dtoh(&buf)?; // error[E0382]: borrow of moved value: `buf`
/// # Ok(()) }
/// ```
///
/// ```compile_fail,E0382
/// # fn f(s: &gpubind::BoundStream<'_>, buf: gpubind::ipc::PoolSlice<u32>,
/// #      conn: &std::os::unix::net::UnixStream) -> gpubind::Result<()> {
/// let lent = buf.lend(s, conn, &Default::default())?;
/// drop(buf); // error[E0382]: use of moved value: `buf`
/// # Ok(()) }
/// ```
///
/// Dropping a `Lent` without joining does not free the memory under the receiver: the
/// hand-off is parked on a thread that waits for the hand-back or for the receiver's
/// process to end, and frees the buffer then.
pub struct Lent<T: DeviceRepr> {
    out: Option<Box<Outgoing<T>>>,
}

/// A [`PoolSlice`] shared for reading with another process by [`PoolSlice::share`]: both
/// read it, neither writes, until [`join`](Self::join) returns it.
///
/// The sender reads it through the `Shared` itself: a copy source (`gpu.dtoh(&shared)`),
/// a kernel argument by `&`, [`DeviceMemory`](crate::DeviceMemory). It has no way to
/// write it in safe code: it is no copy destination, has no deref to `DeviceSlice<T>`
/// (whose shared borrows graph captures and products write through), is no
/// [`DeviceOnlyMemory`](crate::DeviceOnlyMemory) (the bound of every API that writes
/// through `&`), and is no [`WritableArg`](crate::WritableArg), so a launch does not take
/// it as written (`&mut shared`, `arg_written(&shared)`):
///
/// ```compile_fail,E0614
/// # fn f(gpu: &gpubind::BoundDevice<'_>, s: &gpubind::BoundStream<'_>,
/// #      buf: gpubind::ipc::PoolSlice<u32>, conn: &std::os::unix::net::UnixStream)
/// #      -> gpubind::Result<()> {
/// let mut shared = buf.share(s, conn, &Default::default())?;
/// gpu.htod_copy(&[1u32], &mut *shared)?; // error[E0614]: cannot be dereferenced
/// # Ok(()) }
/// ```
///
/// ```compile_fail,E0277
/// # fn f(gpu: &gpubind::BoundDevice<'_>, shared: &mut gpubind::ipc::Shared<u32>)
/// #      -> gpubind::Result<()> {
/// gpu.htod_copy(&[1u32], shared)?; // error[E0277]: `Shared<u32>` is no copy destination
/// # Ok(()) }
/// ```
///
/// ```compile_fail,E0277
/// # fn f<'buf>(c: &mut gpubind::Capture<'_, 'buf>, shared: &'buf gpubind::ipc::Shared<u32>)
/// #      -> gpubind::Result<()> {
/// c.memset_zeros(shared)?; // error[E0277]: `Shared<u32>: DeviceOnlyMemory` is not satisfied
/// # Ok(()) }
/// ```
///
/// ```compile_fail,E0277
/// # fn f<'buf>(c: &mut gpubind::Capture<'_, 'buf>, src: &'buf gpubind::DeviceSlice<u32>,
/// #      shared: &'buf gpubind::ipc::Shared<u32>) -> gpubind::Result<()> {
/// c.dtod(src, shared)?; // error[E0277]: `Shared<u32>: DeviceOnlyMemory` is not satisfied
/// # Ok(()) }
/// ```
///
/// ```compile_fail,E0277
/// # fn f(s: &gpubind::BoundStream<'_>, fill: &gpubind::Function<'_>,
/// #      shared: &gpubind::ipc::Shared<u32>) -> gpubind::Result<()> {
/// let cfg = gpubind::LaunchConfig::for_num_elems(shared.len() as u32);
/// // SAFETY: (unsigned*) matches `fill`, which stays in bounds.
/// unsafe { s.launch(fill, cfg).arg_written(shared).launch()? };
/// // error[E0277]: `Shared<u32>` is read-only as a kernel argument
/// # Ok(()) }
/// ```
///
/// A kernel that only reads it takes it by `&` (`.arg(shared)`). Writing while it is
/// shared needs [`view_mut`](Self::view_mut), which is `unsafe` (as
/// [`SharedImport`](super::SharedImport)'s shows). Dropped without a join, it is parked like a [`Lent`].
pub struct Shared<T: DeviceRepr> {
    out: Option<Box<Outgoing<T>>>,
}

impl<T: DeviceRepr> PoolSlice<T> {
    /// Lends the buffer to the process at the other end of `conn`: sends an offer that
    /// [`recv_handoff`](super::recv_handoff) takes there, and returns the [`Lent`] that
    /// holds the buffer until the receiver hands it back.
    ///
    /// Returns at once: nothing waits on the host. `stream` waits on the device for every
    /// pending use of the buffer (on any stream) and records an interprocess event after
    /// them, which the receiver's first use waits for.
    ///
    /// ```no_run
    /// # fn f(gpu: &gpubind::BoundDevice<'_>, s: &gpubind::BoundStream<'_>,
    /// #      pool: &gpubind::ipc::MemoryPool, conn: &std::os::unix::net::UnixStream)
    /// #      -> gpubind::Result<()> {
    /// use gpubind::ipc::{PoolSlice, TransportOptions};
    /// let mut buf: PoolSlice<f32> = pool.alloc_zeros(s, 256)?;
    /// gpu.htod_copy(&[1.0f32; 256], &mut buf)?;
    /// let lent = buf.lend(s, conn, &TransportOptions::default())?;
    /// // … the other process writes it and hands it back …
    /// let buf = lent.join()?;
    /// let values = gpu.dtoh(&buf)?; // the receiver's data
    /// # let _ = values; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`HandoffFailed`] with the buffer: [`Error::NotIpcPool`] for a pool created
    /// without IPC, [`Error::WrongDevice`] for a stream of another device,
    /// [`Error::InvalidArgument`] for an empty slice, for a connection with a hand-off
    /// already out, for a peer whose pid is not visible here, and for a connection whose
    /// other end this process created (a `socketpair`, even one whose end a child holds
    /// now: the receiver must connect itself, so that its end names its process);
    /// [`Error::PeerNotAllowed`], [`Error::PeerGone`] or [`Error::Timeout`] from the
    /// transport (`options`); driver errors naming their call.
    pub fn lend(
        self,
        stream: &BoundStream<'_>,
        conn: &UnixStream,
        options: &TransportOptions,
    ) -> std::result::Result<Lent<T>, Box<HandoffFailed<T>>> {
        Outgoing::start(self, Mode::Lend, stream, conn, options).map(|o| Lent { out: Some(o) })
    }

    /// Shares the buffer for reading with the process at the other end of `conn`: as
    /// [`lend`](Self::lend), but the receiver gets a read-only
    /// [`SharedImport`](super::SharedImport) and this process keeps read access through
    /// the [`Shared`]. The receiver's first use waits for the buffer's last pending
    /// write only, so readers on both sides run concurrently.
    ///
    /// # Errors
    ///
    /// As [`lend`](Self::lend).
    pub fn share(
        self,
        stream: &BoundStream<'_>,
        conn: &UnixStream,
        options: &TransportOptions,
    ) -> std::result::Result<Shared<T>, Box<HandoffFailed<T>>> {
        Outgoing::start(self, Mode::ShareRead, stream, conn, options)
            .map(|o| Shared { out: Some(o) })
    }
}

/// What [`Lent`] and [`Shared`] share: join, drop.
macro_rules! outgoing_handoff {
    ($ty:ident) => {
        impl<T: DeviceRepr> $ty<T> {
            /// Waits for the receiver to hand the buffer back (or to drop its import),
            /// at most the timeout of the options the hand-off was started with, and
            /// returns the buffer. Its next use in this process is ordered after every
            /// use the receiver made of it.
            ///
            /// # Errors
            ///
            /// [`JoinError::Returned`] with the buffer when the receiver died
            /// ([`Error::PeerGone`]: its connection closed and its process ended; a
            /// closed connection whose process lives on past the timeout is
            /// [`JoinError::StillOut`]) or refused the offer
            /// ([`Error::HandoffRefused`]); [`JoinError::StillOut`] with the hand-off for
            /// [`Error::Timeout`] and for a message that is not this hand-off's
            /// hand-back ([`Error::CorruptHandle`]). Waits at most twice the timeout
            /// (the hand-back, then the receiver's end).
            pub fn join(self) -> std::result::Result<PoolSlice<T>, JoinError<Self, T>> {
                let timeout = self.options().get_timeout();
                self.join_timeout(timeout)
            }

            /// [`join`](Self::join) with another timeout. `Duration::ZERO` waits for
            /// nothing: a hand-back that has already arrived is taken, else
            /// [`JoinError::StillOut`] with [`Error::Timeout`].
            ///
            /// # Errors
            ///
            /// As [`join`](Self::join).
            pub fn join_timeout(
                mut self,
                timeout: Duration,
            ) -> std::result::Result<PoolSlice<T>, JoinError<Self, T>> {
                let out = self
                    .out
                    .take()
                    .expect("a hand-off holds its buffer until joined");
                out.join(timeout, |o| $ty { out: Some(o) })
            }

            fn options(&self) -> &TransportOptions {
                &self
                    .out
                    .as_ref()
                    .expect("a hand-off holds its buffer until joined")
                    .options
            }
        }

        impl<T: DeviceRepr> Drop for $ty<T> {
            fn drop(&mut self) {
                if let Some(out) = self.out.take() {
                    park(out);
                }
            }
        }

        impl<T: DeviceRepr> std::fmt::Debug for $ty<T> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let mut d = f.debug_struct(stringify!($ty));
                if let Some(out) = &self.out {
                    d.field("buffer", &out.buffer)
                        .field("id", &crate::ipc::wire::hex::encode(&out.id));
                }
                d.finish()
            }
        }
    };
}
outgoing_handoff!(Lent);
outgoing_handoff!(Shared);

super::read_only_handoff!(Shared);

impl<T: DeviceRepr> Shared<T> {
    /// The buffer, for the read-only API ([`super::read_only_handoff`]).
    fn inner(&self) -> &DeviceSlice<T> {
        &self
            .out
            .as_ref()
            .expect("a hand-off holds its buffer until joined")
            .buffer
    }

    /// A writable view of `range` while the buffer is shared, or
    /// [`Error::OutOfBounds`].
    ///
    /// # Safety
    ///
    /// Another process maps this memory and reads it (or, if it took the same escape
    /// with [`SharedImport::view_mut`](super::SharedImport::view_mut), writes it) at the
    /// same time, and gpubind orders nothing between the two processes while the buffer
    /// is shared. The caller guarantees that no byte written through the view is
    /// accessed by the other process while the write may be in flight: disjoint ranges,
    /// or an ordering of your own (interprocess events, messages after a
    /// synchronisation). Uses in this process stay ordered as usual.
    pub unsafe fn view_mut(
        &mut self,
        range: impl std::ops::RangeBounds<usize>,
    ) -> Result<DeviceViewMut<'_, T>> {
        self.out
            .as_mut()
            .expect("a hand-off holds its buffer until joined")
            .buffer
            .slice_mut(range)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_process_ends_its_pidfd_and_a_live_one_does_not() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        let fd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).unwrap();
        let t = Instant::now();
        assert!(!process_ended(&fd, Duration::from_millis(200)));
        assert!(t.elapsed() >= Duration::from_millis(200));
        child.kill().unwrap();
        assert!(process_ended(&fd, Duration::from_secs(10)));
        child.wait().unwrap();
    }

    #[test]
    fn a_peer_in_this_process_is_refused() {
        let (a, _b) = UnixStream::pair().unwrap();
        match open_peer(&a, &TransportOptions::default()) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("created by this process"), "{m}"),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn only_a_visible_other_process_is_watchable() {
        let own = rustix::process::getpid();
        let other = own.as_raw_nonzero().get() + 1;
        assert_eq!(
            watchable_peer(other, own).unwrap().as_raw_nonzero().get(),
            other
        );
        for (pid, why) in [
            (0, "not visible"),
            (own.as_raw_nonzero().get(), "this process"),
        ] {
            match watchable_peer(pid, own) {
                Err(Error::InvalidArgument(m)) => assert!(m.contains(why), "{pid}: {m}"),
                other => panic!("{pid}: expected InvalidArgument, got {other:?}"),
            }
        }
    }
}
