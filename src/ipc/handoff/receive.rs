//! The receiver's side: [`recv_handoff`], and the [`LentImport`] / [`SharedImport`] it
//! gives, which hand the buffer back when given back or dropped.

use super::{HandBack, Id, MAX_REASON, Mode, decode_offer, encode_hand_back, expect_none_out};
use crate::access::Access;
use crate::error::{Error, GivenBack, Result};
use crate::ipc::OwnedPool;
use crate::ipc::import::unmap_import;
use crate::ipc::registry::LiveImport;
use crate::ipc::socket::{TransportOptions, recv_message_with, send_message_with};
use crate::ipc::{ImportedPool, io_error};
use crate::memory::{DeviceRepr, DeviceSlice, DeviceViewMut, Tracked};
use crate::stream::BoundStream;
use std::mem::ManuallyDrop;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

/// Where and how the hand-back goes.
struct ReturnPath {
    conn: UnixStream,
    options: TransportOptions,
    id: Id,
}

impl ReturnPath {
    fn send(self, refused: Option<String>) -> Result<()> {
        let bytes = encode_hand_back(&HandBack {
            id: self.id,
            refused,
        })?;
        send_message_with(&self.conn, &bytes, &[], &self.options)
    }
}

/// Ends a hand-off on the receiver's side: waits for this process's uses of the buffer,
/// unmaps it and tells the sender. Does nothing once `back` is taken (the slice is then
/// gone): call it from `give_back` and `Drop` alike.
fn hand_back<T: DeviceRepr>(
    slice: &mut ManuallyDrop<DeviceSlice<T>>,
    live: &mut LiveImport,
    back: &mut Option<ReturnPath>,
) -> Result<()> {
    let Some(back) = back.take() else {
        return Ok(());
    };
    if !unmap_import(slice, live) {
        // Its work here may still run (or its context faulted with it in flight): the
        // sender must not get it back. It stays mapped, and the sender's join waits for
        // this process to end.
        return Err(Error::Timeout {
            what: "this process's uses of a handed-off buffer (it stays mapped and is not \
                   handed back)",
            after_ms: u64::try_from(crate::teardown::drop_wait::drop_timeout().as_millis())
                .unwrap_or(u64::MAX),
        });
    }
    back.send(None)
}

/// A buffer another process lent to this one ([`Incoming::Lent`]): a writable typed
/// slice (core copies, views, kernel argument by `&` or `&mut`), ordered after the
/// sender's last use. [`give_back`](Self::give_back) or its drop waits for this
/// process's uses of it, unmaps it and hands it back.
pub struct LentImport<T: DeviceRepr> {
    slice: ManuallyDrop<DeviceSlice<T>>,
    _pool: Arc<OwnedPool>,
    live: LiveImport,
    /// `None` once handed back.
    back: Option<ReturnPath>,
}

crate::ipc::foreign_slice!(LentImport);

/// A buffer another process shares for reading with this one ([`Incoming::Shared`]):
/// read-only (copy source, kernel argument by `&`,
/// [`DeviceMemory`](crate::DeviceMemory)), ordered after the sender's last write.
/// [`give_back`](Self::give_back) or its drop waits for this process's uses of it,
/// unmaps it and hands it back.
///
/// There is no way to write it in safe code: it is no copy destination, has no deref to
/// `DeviceSlice<T>` (whose shared borrows graph captures and products write through), is
/// no [`DeviceOnlyMemory`](crate::DeviceOnlyMemory) (the bound of every API that writes
/// through `&`), and is no [`WritableArg`](crate::WritableArg), so a launch does not take
/// it as written (`.arg(&mut shared)`, `arg_written(&shared)`):
///
/// ```compile_fail,E0614
/// # fn f(gpu: &gpubind::BoundDevice<'_>, shared: &mut gpubind::ipc::SharedImport<u32>)
/// #      -> gpubind::Result<()> {
/// gpu.htod_copy(&[1u32], &mut **shared)?; // error[E0614]: cannot be dereferenced
/// # Ok(()) }
/// ```
///
/// ```compile_fail,E0277
/// # fn f(gpu: &gpubind::BoundDevice<'_>, shared: &mut gpubind::ipc::SharedImport<u32>)
/// #      -> gpubind::Result<()> {
/// gpu.htod_copy(&[1u32], shared)?; // error[E0277]: `SharedImport<u32>` is no copy destination
/// # Ok(()) }
/// ```
///
/// ```compile_fail,E0277
/// # fn f<'buf>(c: &mut gpubind::Capture<'_, 'buf>,
/// #      shared: &'buf gpubind::ipc::SharedImport<u32>) -> gpubind::Result<()> {
/// c.memset(shared, 7u32)?; // error[E0277]: `SharedImport<u32>: DeviceOnlyMemory` is not satisfied
/// # Ok(()) }
/// ```
///
/// ```compile_fail,E0277
/// # fn f(s: &gpubind::BoundStream<'_>, fill: &gpubind::Function<'_>,
/// #      shared: &mut gpubind::ipc::SharedImport<u32>) -> gpubind::Result<()> {
/// let cfg = gpubind::LaunchConfig::for_num_elems(shared.len() as u32);
/// // SAFETY: (unsigned*) matches `fill`, which stays in bounds.
/// unsafe { s.launch(fill, cfg).arg(shared).launch()? };
/// // error[E0277]: `&mut SharedImport<u32>` cannot be passed to a kernel
/// # Ok(()) }
/// ```
///
/// A kernel that only reads it takes it by `&` (`.arg(&*shared)`). Writing it needs the
/// `unsafe` [`view_mut`](Self::view_mut), whose view a launch takes by `&mut`:
///
/// ```no_run
/// # fn f(s: &gpubind::BoundStream<'_>, fill: &gpubind::Function<'_>,
/// #      shared: &mut gpubind::ipc::SharedImport<u32>) -> gpubind::Result<()> {
/// let n = shared.len();
/// // SAFETY: the sender does not touch the second half while the buffer is shared.
/// let mut half = unsafe { shared.view_mut(n / 2..) }?;
/// let cfg = gpubind::LaunchConfig::for_num_elems((n - n / 2) as u32);
/// // SAFETY: (unsigned*) matches `fill`, which stays in bounds.
/// unsafe { s.launch(fill, cfg).arg(&mut half).launch()? };
/// # Ok(()) }
/// ```
pub struct SharedImport<T: DeviceRepr> {
    slice: ManuallyDrop<DeviceSlice<T>>,
    _pool: Arc<OwnedPool>,
    live: LiveImport,
    /// `None` once handed back.
    back: Option<ReturnPath>,
}

/// What [`recv_handoff`] received.
#[derive(Debug)]
pub enum Incoming<T: DeviceRepr> {
    /// Lent ([`PoolSlice::lend`](crate::ipc::PoolSlice::lend)): this process may write.
    Lent(LentImport<T>),
    /// Shared for reading ([`PoolSlice::share`](crate::ipc::PoolSlice::share)).
    Shared(SharedImport<T>),
}

/// Receives a buffer handed off by [`PoolSlice::lend`](crate::ipc::PoolSlice::lend) or
/// [`PoolSlice::share`](crate::ipc::PoolSlice::share) over `conn` (at most `options`'
/// timeout), imports it and orders its first use after the sender's last use: `stream`
/// waits on the device for the sender's interprocess event, and that wait is recorded
/// as the buffer's pending write, so a use on any stream of this process waits for it.
/// Nothing waits on the host.
///
/// A buffer this process cannot take (wrong element type, a device not visible here,
/// a stream of another device, a driver error) is handed back unused at once, so the
/// sender's join returns it with [`Error::HandoffRefused`]; the error is returned here.
///
/// ```no_run
/// # fn f(gpu: &gpubind::BoundDevice<'_>, s: &gpubind::BoundStream<'_>,
/// #      k: &gpubind::Function<'_>, conn: &std::os::unix::net::UnixStream)
/// #      -> gpubind::Result<()> {
/// use gpubind::ipc::{self, Incoming};
/// let cfg = gpubind::LaunchConfig::for_num_elems(256);
/// match ipc::recv_handoff::<f32>(conn, s, &Default::default())? {
///     Incoming::Lent(mut buf) => {
///         // SAFETY: `k` is `void k(float*)` and stays inside its 256 elements.
///         unsafe { s.launch(k, cfg).arg(&mut buf).launch() }?;
///         buf.give_back()?; // after the kernel: the sender's join returns the buffer
///     }
///     Incoming::Shared(buf) => {
///         let values = gpu.dtoh(&buf)?;
///         // SAFETY: as above, and `k` only reads through its argument.
///         unsafe { s.launch(k, cfg).arg(&buf).launch() }?;
///         drop(buf); // hands it back too
///         # let _ = values;
///     }
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// Transport errors ([`Error::PeerGone`], [`Error::Timeout`],
/// [`Error::PeerNotAllowed`]), [`Error::CorruptHandle`] for a message that is not an
/// offer, [`Error::InvalidArgument`] (refused) when this end of the connection was
/// created by another process (the sender watches that one for the receiver's end),
/// [`Error::InvalidArgument`] (nothing read) when this process has a hand-off of its own
/// out on `conn` (its hand-back arrives there),
/// and the import's errors ([`Error::TypeMismatch`], [`Error::UnknownDevice`],
/// [`Error::WrongDevice`], [`Error::SameProcessImport`], [`Error::AlreadyImported`],
/// driver errors naming their call).
pub fn recv_handoff<T: DeviceRepr>(
    conn: &UnixStream,
    stream: &BoundStream<'_>,
    options: &TransportOptions,
) -> Result<Incoming<T>> {
    expect_none_out(conn)?;
    let own = conn
        .try_clone()
        .map_err(|e| io_error("dup of the hand-off socket", &e))?;
    let msg = recv_message_with(conn, options)?;
    let (offer, fd) = decode_offer(&msg.bytes, msg.fds)?;
    let back = ReturnPath {
        conn: own,
        options: options.clone(),
        id: offer.id,
    };
    if !own_pids(&proc_status()).contains(&offer.receiver_pid) {
        return Err(refuse(back, not_watched(offer.receiver_pid)));
    }
    let imported = match ImportedPool::import(offer.pool.with_fd(fd))
        .and_then(|pool| pool.import_buffer::<T>(&offer.buffer))
    {
        Ok(imported) => imported,
        Err(e) => return Err(refuse(back, e)),
    };
    let (mut slice, pool, mut live) = imported.into_parts();
    if let Err(e) = wait_for_sender(&slice, &offer.event, stream) {
        if unmap_import(&mut slice, &mut live) {
            return Err(refuse(back, e));
        }
        // Still mapped, maybe in use: no hand-back; the sender waits for this process.
        return Err(e);
    }
    let back = Some(back);
    Ok(match offer.mode {
        Mode::Lend => Incoming::Lent(LentImport {
            slice,
            _pool: pool,
            live,
            back,
        }),
        Mode::ShareRead => Incoming::Shared(SharedImport {
            slice,
            _pool: pool,
            live,
            back,
        }),
    })
}

/// The refusal of an offer whose sender watches process `pid` for this end of the
/// connection, which is not this process.
fn not_watched(pid: i32) -> Error {
    Error::InvalidArgument(format!(
        "the hand-off sender watches process {pid} for the end of this receiver (the \
         process that created this end of the connection), and that is not this process: \
         a connection's end passed on to another process cannot receive hand-offs, the \
         sender could not tell when this process's work has ended"
    ))
}

/// `/proc/self/status`, or nothing if it cannot be read.
fn proc_status() -> String {
    std::fs::read_to_string("/proc/self/status").unwrap_or_default()
}

/// This process's pids in every pid namespace it is in (the `NSpid` line of `status`,
/// `/proc/self/status`), or only `getpid()` without one.
fn own_pids(status: &str) -> Vec<i32> {
    let listed = status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let own = rustix::process::getpid().as_raw_nonzero().get();
    if listed.contains(&own) {
        listed
    } else {
        vec![own]
    }
}

/// Makes `stream` wait for the sender's event and records that as the buffer's pending
/// write. The opened event is dropped before this returns, so the sender may destroy
/// its event once the buffer is handed back.
fn wait_for_sender<T: DeviceRepr>(
    slice: &DeviceSlice<T>,
    event: &crate::ipc::EventHandle,
    stream: &BoundStream<'_>,
) -> Result<()> {
    stream.bound().expect_device(
        "handed-off buffer",
        crate::memory::DeviceMemory::device(slice),
    )?;
    let opened = event.open()?;
    // Claimed as a write in both modes: every later use, read or write, on any stream
    // must come after the wait.
    let claim = stream.claim([Some((Tracked::tracker(slice), Access::Write))])?;
    stream.wait(&opened)?;
    drop(claim);
    Ok(())
}

/// Hands the buffer back unused, saying why, and returns the error.
fn refuse(back: ReturnPath, e: Error) -> Error {
    let mut reason = e.to_string();
    if reason.len() > MAX_REASON {
        let mut cut = MAX_REASON;
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        reason.truncate(cut);
    }
    if let Err(send) = back.send(Some(reason)) {
        log::warn!("could not refuse a hand-off ({e}): {send}");
    }
    e
}

macro_rules! incoming_handoff {
    ($ty:ident) => {
        impl<T: DeviceRepr> $ty<T> {
            /// Hands the buffer back: waits (on the host, at most `GPUBIND_DROP_TIMEOUT`)
            /// for this process's uses of it, unmaps it and tells the sender, whose join
            /// then returns it. Dropping does the same and logs what fails.
            ///
            /// ```no_run
            /// # fn f(lent: gpubind::ipc::LentImport<f32>) -> gpubind::Result<()> {
            /// use gpubind::ipc::GiveBackError;
            /// let mut lent = lent;
            /// loop {
            ///     match lent.give_back() {
            ///         Ok(()) => break,
            ///         // Nothing was done: this process's kernels on it still run.
            ///         Err(GiveBackError::StillHeld(held)) => {
            ///             eprintln!("{}; trying again", held.error);
            ///             lent = held.input;
            ///             std::thread::sleep(std::time::Duration::from_secs(1));
            ///         }
            ///         Err(GiveBackError::Failed(e)) => return Err(e),
            ///     }
            /// }
            /// # Ok(()) }
            /// ```
            ///
            /// # Errors
            ///
            /// [`GiveBackError::StillHeld`] with the import, untouched, when the wait for
            /// this process's uses failed ([`Error::Timeout`] past
            /// `GPUBIND_DROP_TIMEOUT`, or the context's error): give it back again once
            /// the work has ended, or drop it (the drop tries once more; failing, the
            /// buffer stays mapped and the sender gets it once this process ends).
            /// [`GiveBackError::Failed`] once the buffer has left this process's hands:
            /// [`Error::Timeout`] if the unmap did not finish (the buffer stays mapped
            /// and is not handed back; the sender gets it once this process ends), or a
            /// transport error from the hand-back message ([`Error::PeerGone`] when the
            /// sender is gone).
            pub fn give_back(mut self) -> std::result::Result<(), GiveBackError<Self>> {
                // Everything that can fail before the buffer leaves this process is done
                // first, so that a failure gives the import back untouched; a failed wait
                // forgets nothing, so a later one waits again.
                if let Err(e) = self.slice.tracker_mut().wait_all() {
                    return Err(GiveBackError::StillHeld(GivenBack::boxed(self, e)));
                }
                hand_back(&mut self.slice, &mut self.live, &mut self.back)
                    .map_err(GiveBackError::Failed)
            }
        }

        impl<T: DeviceRepr> Drop for $ty<T> {
            fn drop(&mut self) {
                if let Err(e) = hand_back(&mut self.slice, &mut self.live, &mut self.back) {
                    log::warn!("dropping a {}: the hand-back failed: {e}", stringify!($ty));
                }
            }
        }
    };
}

/// Why [`LentImport::give_back`] / [`SharedImport::give_back`] did not hand the buffer
/// back.
pub enum GiveBackError<I> {
    /// Nothing was done: this process's uses of the buffer could not be waited for (not
    /// finished within `GPUBIND_DROP_TIMEOUT`, or the context's error). The import is
    /// given back, untouched and usable: give it back again later, or drop it.
    StillHeld(Box<GivenBack<I>>),
    /// The buffer left this process's hands, but the hand-back did not complete: its
    /// unmap did not finish (it stays mapped; the sender gets it once this process
    /// ends), or the message to the sender failed.
    Failed(Error),
}

impl<I> GiveBackError<I> {
    /// The error, whichever the case.
    pub fn error(&self) -> &Error {
        match self {
            GiveBackError::StillHeld(held) => &held.error,
            GiveBackError::Failed(error) => error,
        }
    }
}

impl<I> std::fmt::Debug for GiveBackError<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GiveBackError::StillHeld(held) => f.debug_tuple("StillHeld").field(held).finish(),
            GiveBackError::Failed(error) => f.debug_tuple("Failed").field(error).finish(),
        }
    }
}

impl<I> std::fmt::Display for GiveBackError<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GiveBackError::StillHeld(held) => {
                write!(
                    f,
                    "the import is still held, not handed back: {}",
                    held.error
                )
            }
            GiveBackError::Failed(error) => write!(f, "the hand-back failed: {error}"),
        }
    }
}

impl<I> std::error::Error for GiveBackError<I> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.error())
    }
}

impl<I> From<GiveBackError<I>> for Error {
    /// The error; an import still held is dropped (which tries to hand it back once more).
    fn from(e: GiveBackError<I>) -> Error {
        match e {
            GiveBackError::StillHeld(held) => held.error,
            GiveBackError::Failed(error) => error,
        }
    }
}

incoming_handoff!(LentImport);
incoming_handoff!(SharedImport);

super::read_only_handoff!(SharedImport);

impl<T: DeviceRepr> SharedImport<T> {
    /// The buffer, for the read-only API ([`super::read_only_handoff`]).
    fn inner(&self) -> &DeviceSlice<T> {
        &self.slice
    }

    /// A writable view of `range` of the shared buffer, or
    /// [`Error::OutOfBounds`].
    ///
    /// # Safety
    ///
    /// The sender's process keeps this memory and reads it (or, if it took the same
    /// escape with [`Shared::view_mut`](crate::ipc::Shared::view_mut), writes it) at the
    /// same time, and gpubind orders nothing between the two processes while the buffer
    /// is shared. The caller guarantees that no byte written through the view is
    /// accessed by the other process while the write may be in flight: disjoint ranges,
    /// or an ordering of your own. Uses in this process stay ordered as usual, and the
    /// hand-back still waits for them.
    pub unsafe fn view_mut(
        &mut self,
        range: impl std::ops::RangeBounds<usize>,
    ) -> Result<DeviceViewMut<'_, T>> {
        self.slice.slice_mut(range)
    }
}

impl<T: DeviceRepr> std::fmt::Debug for SharedImport<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedImport")
            .field("device", &self.slice.device().ordinal())
            .field("ptr", &format_args!("{:#x}", self.slice.ptr))
            .field("len", &self.slice.len())
            .field("type", &std::any::type_name::<T>())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_known_by_its_pids_in_every_namespace() {
        let own = rustix::process::getpid().as_raw_nonzero().get();
        let here = own_pids(&proc_status());
        assert!(here.contains(&own), "{here:?} lacks {own}");
        // A nested namespace: the pid seen from the outer one counts too.
        let nested = format!("Name:\tx\nNSpid:\t9000 {own}\nTgid:\t1\n");
        assert_eq!(own_pids(&nested), vec![9000, own]);
        // A status without NSpid, or one that does not name this process: getpid only.
        assert_eq!(own_pids("Name:\tx\n"), vec![own]);
        assert_eq!(own_pids("NSpid:\t1 2\n"), vec![own]);
        assert!(matches!(not_watched(4242), Error::InvalidArgument(m) if m.contains("4242")));
    }

    #[test]
    fn give_back_error_keeps_a_held_import_and_converts_to_its_error() {
        let timeout = Error::Timeout {
            what: "this process's uses",
            after_ms: 1000,
        };
        let held: GiveBackError<Vec<u8>> =
            GiveBackError::StillHeld(GivenBack::boxed(vec![1, 2, 3], timeout.clone()));
        assert_eq!(held.error(), &timeout);
        assert!(held.to_string().starts_with("the import is still held"));
        assert!(format!("{held:?}").starts_with("StillHeld"));
        let GiveBackError::StillHeld(back) = held else {
            unreachable!()
        };
        assert_eq!(back.input, [1, 2, 3]);
        let held = GiveBackError::StillHeld(back);
        assert_eq!(Error::from(held), timeout);
        let failed: GiveBackError<Vec<u8>> = GiveBackError::Failed(Error::PeerGone);
        assert!(failed.to_string().starts_with("the hand-back failed"));
        assert_eq!(Error::from(failed), Error::PeerGone);
    }
}
