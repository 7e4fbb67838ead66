//! Ordered hand-offs: a [`PoolSlice`] sent to another process together with its pending
//! work, and sent back.
//!
//! * [`PoolSlice::lend`] moves the buffer into a [`Lent`]: the receiver may write, the
//!   sender cannot touch the buffer (it no longer has it) until [`Lent::join`] gives it
//!   back. [`PoolSlice::share`] moves it into a [`Shared`], which still reads it (a copy
//!   source, a kernel argument by `&`) while the receiver reads it too; neither writes.
//! * [`recv_handoff`] in the receiver gives an [`Incoming`]: a [`LentImport`] (a
//!   writable slice) or a [`SharedImport`] (read-only: a copy source and a kernel
//!   argument by `&`, never written in safe code). Its first use waits on the device for the
//!   sender's last use; [`give_back`](LentImport::give_back) (or its drop) waits for the
//!   receiver's own uses, unmaps the buffer and tells the sender, whose `join` then
//!   returns the [`PoolSlice`].
//! * A receiver that dies hands the buffer back too: `join` sees the connection close,
//!   waits for the receiver's process to end (so no work of its runs on the buffer any
//!   more) and returns the buffer inside [`JoinError::Returned`] with
//!   [`Error::PeerGone`]. A receiver that stays silent past the timeout gives
//!   [`JoinError::StillOut`], which holds the hand-off for another `join`.
//!
//! The whole protocol, the ordering argument and what it does not promise are in
//! `docs/ipc.md` ("Ordered hand-offs").

mod receive;
mod send;

pub use receive::{GiveBackError, Incoming, LentImport, SharedImport, recv_handoff};
pub use send::{Lent, Shared};

use super::handle::{BufferHandle, PoolHandle};
use super::wire::{self, Kind, corrupt, hex};
use super::{EventHandle, PoolSlice};
use crate::error::{Error, Result};
use crate::memory::DeviceRepr;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::fmt;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Longest refusal reason a hand-back message may carry.
const MAX_REASON: usize = 4096;

/// What the receiver may do with a handed-off buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Mode {
    /// The receiver reads and writes; the sender has no access until it is back.
    Lend,
    /// Both read; neither writes.
    ShareRead,
}

/// A hand-off's identity: 16 random bytes, so a hand-back names the hand-off it ends.
type Id = [u8; 16];

fn fresh_id() -> Result<Id> {
    Ok(*super::handle::PoolId::fresh()?.as_bytes())
}

/// The offer, as the sender writes it (borrowing its handles).
#[derive(Serialize)]
struct OfferOut<'a> {
    #[serde(with = "hex")]
    id: Id,
    mode: Mode,
    receiver_pid: i32,
    pool: &'a PoolHandle,
    buffer: &'a BufferHandle,
    event: &'a EventHandle,
}

/// The offer, as the receiver reads it: the pid the sender watches for the receiver's
/// end (`SO_PEERCRED`'s, in the sender's pid namespace), the pool (its descriptor
/// travels beside the bytes), the buffer, and the event recorded after the sender's
/// last use.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Offer {
    #[serde(with = "hex")]
    id: Id,
    mode: Mode,
    receiver_pid: i32,
    pool: PoolHandle,
    buffer: BufferHandle,
    event: EventHandle,
}

/// The hand-back: the receiver's uses are complete and its mapping is gone; `refused`
/// says it never used the buffer, and why.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HandBack {
    #[serde(with = "hex")]
    id: Id,
    refused: Option<String>,
}

/// One hand-off message.
#[derive(Serialize)]
enum MessageOut<'a> {
    Offer(OfferOut<'a>),
    HandBack(&'a HandBack),
}

#[derive(Deserialize)]
enum MessageIn {
    Offer(Box<Offer>),
    HandBack(HandBack),
}

/// Decodes an offer: the sealed message must be an offer with a valid buffer handle and
/// exactly one descriptor (the pool's), else [`Error::CorruptHandle`].
fn decode_offer(bytes: &[u8], mut fds: Vec<OwnedFd>) -> Result<(Offer, OwnedFd)> {
    let offer = match wire::open(Kind::Handoff, bytes)? {
        MessageIn::Offer(offer) => *offer,
        MessageIn::HandBack(_) => {
            return Err(corrupt("expected a hand-off offer, found a hand-back"));
        }
    };
    offer.buffer.validate()?;
    if fds.len() != 1 {
        return Err(corrupt(format!(
            "a hand-off offer carries one file descriptor (its pool's), {} arrived",
            fds.len()
        )));
    }
    let fd = fds.pop().expect("one descriptor");
    Ok((offer, fd))
}

/// Decodes the hand-back of hand-off `id`: `Ok(None)` for a buffer the receiver used,
/// `Ok(Some(reason))` for one it refused; anything else (another kind, another id,
/// descriptors, an oversized reason) is [`Error::CorruptHandle`].
fn decode_hand_back(bytes: &[u8], fds: &[OwnedFd], id: &Id) -> Result<Option<String>> {
    let back = match wire::open(Kind::Handoff, bytes)? {
        MessageIn::HandBack(back) => back,
        MessageIn::Offer(_) => return Err(corrupt("expected a hand-back, found an offer")),
    };
    if !fds.is_empty() {
        return Err(corrupt(format!(
            "a hand-back carries no file descriptor, {} arrived",
            fds.len()
        )));
    }
    if back.id != *id {
        return Err(corrupt(format!(
            "the hand-back names hand-off {}, not {}",
            hex::encode(&back.id),
            hex::encode(id)
        )));
    }
    if back.refused.as_ref().is_some_and(|r| r.len() > MAX_REASON) {
        return Err(corrupt(format!(
            "the refusal reason exceeds {MAX_REASON} bytes"
        )));
    }
    Ok(back.refused.map(|r| printable(&r)))
}

/// `reason` with its control characters escaped (`\n`, `\u{1b}`): a peer's text goes
/// into errors and logs, where it must not move the cursor or forge lines.
fn printable(reason: &str) -> String {
    reason
        .chars()
        .flat_map(|c| {
            let escaped = c.is_control().then(|| c.escape_debug());
            let plain = (!c.is_control()).then_some(c);
            escaped.into_iter().flatten().chain(plain)
        })
        .collect()
}

fn encode_hand_back(back: &HandBack) -> Result<Vec<u8>> {
    wire::seal(Kind::Handoff, &MessageOut::HandBack(back))
}

/// The connections that carry a hand-off now, by socket inode: one at a time per
/// connection, so a hand-back is always read by the `join` it belongs to.
fn busy() -> MutexGuard<'static, HashSet<(u64, u64)>> {
    static BUSY: OnceLock<Mutex<HashSet<(u64, u64)>>> = OnceLock::new();
    BUSY.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// A connection's place in [`busy`], held for as long as its hand-off is out.
struct ConnSlot {
    key: (u64, u64),
}

impl ConnSlot {
    /// Takes `conn`'s place; [`Error::InvalidArgument`] if a hand-off is already out on
    /// it (the same socket, through any descriptor of it).
    fn take(conn: &UnixStream) -> Result<ConnSlot> {
        let key = conn_key(conn)?;
        if !busy().insert(key) {
            return Err(Error::InvalidArgument(
                "a hand-off is already out on this connection: join it first (one hand-off \
                 per connection at a time)"
                    .into(),
            ));
        }
        Ok(ConnSlot { key })
    }
}

/// `conn`'s socket, by device and inode (the same through any descriptor of it).
fn conn_key(conn: &UnixStream) -> Result<(u64, u64)> {
    let dup = conn
        .try_clone()
        .map_err(|e| super::io_error("dup of the hand-off socket", &e))?;
    let meta = std::fs::File::from(OwnedFd::from(dup))
        .metadata()
        .map_err(|e| super::io_error("fstat of the hand-off socket", &e))?;
    Ok((meta.dev(), meta.ino()))
}

/// [`Error::InvalidArgument`] if this process has a hand-off out on `conn`: the next
/// hand-off message there is its hand-back, which only its `join` may read.
fn expect_none_out(conn: &UnixStream) -> Result<()> {
    if busy().contains(&conn_key(conn)?) {
        return Err(Error::InvalidArgument(
            "a hand-off sent on this connection is still out, and its hand-back arrives \
             here: join it before receiving one (a connection carries hand-offs one way at \
             a time)"
                .into(),
        ));
    }
    Ok(())
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        busy().remove(&self.key);
    }
}

/// A hand-off that ended with its buffer back in the sender's hands, but not as planned:
/// [`error`](Self::error) says why (the lend could not start, the receiver refused it,
/// or the receiver died: [`Error::PeerGone`]).
pub struct HandoffFailed<T: DeviceRepr> {
    /// The buffer, usable again.
    pub buffer: PoolSlice<T>,
    /// What went wrong.
    pub error: Error,
}

impl<T: DeviceRepr> fmt::Debug for HandoffFailed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandoffFailed")
            .field("buffer", &self.buffer)
            .field("error", &self.error)
            .finish()
    }
}

impl<T: DeviceRepr> fmt::Display for HandoffFailed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "hand-off failed, buffer returned: {}", self.error)
    }
}

impl<T: DeviceRepr> std::error::Error for HandoffFailed<T> {}

impl<T: DeviceRepr> From<Box<HandoffFailed<T>>> for Error {
    /// The error; the buffer is dropped (freed).
    fn from(e: Box<HandoffFailed<T>>) -> Error {
        e.error
    }
}

/// Why [`Lent::join`] / [`Shared::join`] did not end with the buffer handed back.
pub enum JoinError<H, T: DeviceRepr> {
    /// The buffer is back, with the reason the hand-off failed: the receiver died
    /// ([`Error::PeerGone`], its process has ended) or refused the buffer
    /// ([`Error::HandoffRefused`]).
    Returned(Box<HandoffFailed<T>>),
    /// The buffer is still out (no hand-back before the timeout, or a message that was
    /// not one): `handoff` can be joined again, or dropped (see [`Lent`]).
    StillOut {
        /// The hand-off, still out.
        handoff: H,
        /// Why the join ended without the buffer.
        error: Error,
    },
}

impl<H, T: DeviceRepr> JoinError<H, T> {
    /// The error, whichever the case.
    pub fn error(&self) -> &Error {
        match self {
            JoinError::Returned(f) => &f.error,
            JoinError::StillOut { error, .. } => error,
        }
    }
}

impl<H, T: DeviceRepr> fmt::Debug for JoinError<H, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::Returned(r) => f.debug_tuple("Returned").field(r).finish(),
            JoinError::StillOut { error, .. } => f
                .debug_struct("StillOut")
                .field("error", error)
                .finish_non_exhaustive(),
        }
    }
}

impl<H, T: DeviceRepr> fmt::Display for JoinError<H, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::Returned(r) => r.fmt(f),
            JoinError::StillOut { error, .. } => {
                write!(f, "the handed-off buffer is still out: {error}")
            }
        }
    }
}

impl<H, T: DeviceRepr> std::error::Error for JoinError<H, T> {}

impl<H, T: DeviceRepr> From<JoinError<H, T>> for Error {
    /// The error; a returned buffer is dropped (freed), a hand-off still out is dropped
    /// (parked until it ends, see [`Lent`]).
    fn from(e: JoinError<H, T>) -> Error {
        match e {
            JoinError::Returned(r) => r.error,
            JoinError::StillOut { error, .. } => error,
        }
    }
}

/// The read-only API of [`Shared`] and [`SharedImport`], each of which has
/// `fn inner(&self) -> &DeviceSlice<T>`: [`DeviceMemory`](crate::DeviceMemory) (`len`,
/// `device`, `dtoh`), [`CopySource`](crate::CopySource) (no `CopyDest`), and
/// [`KernelArg`](crate::KernelArg) by `&` only (no [`WritableArg`](crate::WritableArg):
/// passing it by `&mut` or to `arg_written` does not compile).
///
/// Deliberately none of: `Deref<Target = DeviceSlice<T>>` (a `&DeviceSlice<T>` or a
/// view of it is written through a shared borrow by graph captures and products),
/// [`DeviceOnlyMemory`](crate::DeviceOnlyMemory) (the bound of every API that writes
/// through `&`), `DeviceMemoryMut`, `CopyDest`.
macro_rules! read_only_handoff {
    ($ty:ident) => {
        impl<T: DeviceRepr> crate::memory::private::Sealed for $ty<T> {
            fn tracker(&self) -> &crate::access::AccessTracker {
                crate::memory::Tracked::tracker(self.inner())
            }
        }

        impl<T: DeviceRepr> crate::memory::DeviceMemory<T> for $ty<T> {
            fn device(&self) -> &std::sync::Arc<crate::device::Device> {
                self.inner().device()
            }
            fn len(&self) -> usize {
                self.inner().len()
            }
            fn device_ptr(&self) -> cudarc::driver::sys::CUdeviceptr {
                self.inner().ptr
            }
        }

        crate::copy::copy_endpoints!($ty, const, crate::copy::device_endpoint);

        // SAFETY: passes the inner slice's address field: 8 bytes that live as long as
        // the borrow of `self` (the slice is owned by `self` until it is consumed).
        unsafe impl<T: DeviceRepr> crate::module::KernelArg for $ty<T> {
            fn param_ptr(&self) -> *mut std::ffi::c_void {
                crate::module::KernelArg::param_ptr(self.inner())
            }
            fn param_size(&self) -> usize {
                crate::module::KernelArg::param_size(self.inner())
            }
            fn arg_device(&self) -> Option<&crate::device::Device> {
                Some(self.inner().device())
            }
            fn describe(&self) -> String {
                format!("{}<{}>", stringify!($ty), std::any::type_name::<T>())
            }
            fn access_tracker(&self) -> Option<&crate::access::AccessTracker> {
                Some(crate::memory::Tracked::tracker(self.inner()))
            }
        }

        impl<T: DeviceRepr> $ty<T> {
            /// Number of elements.
            pub fn len(&self) -> usize {
                self.inner().len()
            }

            /// Whether there are no elements (never: empty slices are not handed off).
            pub fn is_empty(&self) -> bool {
                self.inner().is_empty()
            }

            /// The device the buffer lives on.
            pub fn device(&self) -> &std::sync::Arc<crate::device::Device> {
                self.inner().device()
            }
        }
    };
}
use read_only_handoff;

/// A buffer shared for reading is written by no safe API: not as a kernel argument
/// (`WritableArg`), not through a `&mut` API (`DeviceMemoryMut`), and not through the
/// shared-borrow writes of `Issue`, `blas::Enqueue` and captured epilogues, which take
/// device-only memory (`DeviceOnlyMemory`) only. A lent import, which this process alone
/// uses while it holds it, is written through all of them.
#[cfg(test)]
mod read_only_by_type {
    use super::{LentImport, Shared, SharedImport};
    use crate::copy::DeviceOnlyMemory;
    use crate::memory::DeviceMemoryMut;
    use crate::module::WritableArg;
    static_assertions::assert_not_impl_any!(Shared<f32>: DeviceOnlyMemory, DeviceMemoryMut<f32>, WritableArg);
    static_assertions::assert_not_impl_any!(SharedImport<f32>: DeviceOnlyMemory, DeviceMemoryMut<f32>, WritableArg);
    static_assertions::assert_impl_all!(LentImport<f32>: DeviceOnlyMemory, DeviceMemoryMut<f32>, WritableArg);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Uuid;
    use crate::ipc::handle::PoolId;
    use crate::ipc::handle::tests::sample_buffer;
    use proptest::prelude::*;

    fn pipe_fd() -> OwnedFd {
        let (r, _w) = std::io::pipe().unwrap();
        r.into()
    }

    fn sample_event() -> EventHandle {
        serde_json::from_value(serde_json::json!({
            "device_uuid": "11".repeat(16), "data": "22".repeat(64)
        }))
        .unwrap()
    }

    fn offer_bytes(id: Id, buffer: &BufferHandle) -> Vec<u8> {
        let pool = PoolHandle::new(PoolId([3; 16]), Uuid([4; 16]), 0, pipe_fd());
        let out = OfferOut {
            id,
            mode: Mode::Lend,
            receiver_pid: 4242,
            pool: &pool,
            buffer,
            event: &sample_event(),
        };
        wire::seal(Kind::Handoff, &MessageOut::Offer(out)).unwrap()
    }

    fn reason(r: Result<impl Sized>) -> String {
        match r {
            Err(Error::CorruptHandle { reason }) => reason,
            Err(e) => panic!("expected CorruptHandle, got {e:?}"),
            Ok(_) => panic!("expected CorruptHandle, got a message"),
        }
    }

    #[test]
    fn offers_round_trip_with_one_descriptor() {
        let buffer = sample_buffer(16, 5);
        let bytes = offer_bytes([9; 16], &buffer);
        let (offer, _fd) = decode_offer(&bytes, vec![pipe_fd()]).unwrap();
        assert_eq!(offer.id, [9; 16]);
        assert_eq!(offer.mode, Mode::Lend);
        assert_eq!(offer.receiver_pid, 4242);
        assert_eq!(offer.buffer, buffer);
        assert_eq!(offer.event, sample_event());
        assert!(
            offer.pool.fd().is_none(),
            "the descriptor travels beside the bytes"
        );
        assert!(reason(decode_offer(&bytes, vec![])).contains("one file descriptor"));
        assert!(reason(decode_offer(&bytes, vec![pipe_fd(), pipe_fd()])).contains("2 arrived"));
        // A hand-back is no offer, and the other way round.
        let back = encode_hand_back(&HandBack {
            id: [9; 16],
            refused: None,
        })
        .unwrap();
        assert!(reason(decode_offer(&back, vec![pipe_fd()])).contains("found a hand-back"));
        assert!(reason(decode_hand_back(&bytes, &[], &[9; 16])).contains("found an offer"));
        // An offer whose buffer handle does not validate (length 0).
        let bad = offer_bytes([9; 16], &sample_buffer(0, 5));
        assert!(reason(decode_offer(&bad, vec![pipe_fd()])).contains("length is 0"));
        // Another kind of sealed handle is not a hand-off message.
        let other = sample_buffer(4, 1).to_bytes().unwrap();
        assert!(reason(decode_offer(&other, vec![pipe_fd()])).contains("hand-off message"));
    }

    #[test]
    fn hand_backs_must_name_their_hand_off() {
        let id = [7; 16];
        let ok = encode_hand_back(&HandBack { id, refused: None }).unwrap();
        assert_eq!(decode_hand_back(&ok, &[], &id).unwrap(), None);
        assert!(reason(decode_hand_back(&ok, &[], &[8; 16])).contains("names hand-off"));
        assert!(reason(decode_hand_back(&ok, &[pipe_fd()], &id)).contains("no file descriptor"));
        let refused = encode_hand_back(&HandBack {
            id,
            refused: Some("wrong type".into()),
        })
        .unwrap();
        assert_eq!(
            decode_hand_back(&refused, &[], &id).unwrap().as_deref(),
            Some("wrong type")
        );
        // A peer's text cannot carry control characters into errors and logs.
        let forged = encode_hand_back(&HandBack {
            id,
            refused: Some("bad\n[ERROR] forged\u{1b}[2Jé".into()),
        })
        .unwrap();
        assert_eq!(
            decode_hand_back(&forged, &[], &id).unwrap().as_deref(),
            Some("bad\\n[ERROR] forged\\u{1b}[2Jé")
        );
        let long = encode_hand_back(&HandBack {
            id,
            refused: Some("x".repeat(MAX_REASON + 1)),
        })
        .unwrap();
        assert!(reason(decode_hand_back(&long, &[], &id)).contains("exceeds"));
        // Unknown fields and unknown modes are refused.
        let extra =
            serde_json::json!({"HandBack": {"id": "07".repeat(16), "refused": null, "x": 1}});
        let sealed = wire::seal(Kind::Handoff, &extra).unwrap();
        assert!(reason(decode_hand_back(&sealed, &[], &id)).contains("malformed"));
        let bytes = offer_bytes(id, &sample_buffer(2, 2));
        let mut v: serde_json::Value = serde_json::from_slice(&bytes[12..bytes.len() - 8]).unwrap();
        assert_eq!(v["Offer"]["mode"], "lend");
        v["Offer"]["mode"] = "write_all".into();
        let sealed = wire::seal(Kind::Handoff, &v).unwrap();
        assert!(reason(decode_offer(&sealed, vec![pipe_fd()])).contains("malformed"));
    }

    /// Shared-for-reading buffers reach none of the APIs that write through `&` or `&mut`
    /// (nor a launch's write claim: no `WritableArg`); a lent import reaches them all.
    #[test]
    fn shared_buffers_have_no_writable_api() {
        use crate::copy::{CopyDest, CopySource, DeviceOnlyMemory};
        use crate::memory::{DeviceMemory, DeviceMemoryMut};
        use crate::module::{KernelArg, WritableArg};
        static_assertions::assert_not_impl_any!(
            Shared<u32>: std::ops::Deref, std::ops::DerefMut, DeviceOnlyMemory,
            DeviceMemoryMut<u32>, CopyDest<u32>, WritableArg
        );
        static_assertions::assert_not_impl_any!(
            SharedImport<u32>: std::ops::Deref, std::ops::DerefMut, DeviceOnlyMemory,
            DeviceMemoryMut<u32>, CopyDest<u32>, WritableArg
        );
        static_assertions::assert_impl_all!(
            LentImport<u32>: DeviceOnlyMemory, DeviceMemoryMut<u32>, CopyDest<u32>, WritableArg
        );
        static_assertions::assert_impl_all!(
            Shared<u32>: DeviceMemory<u32>, CopySource<u32>, KernelArg
        );
        static_assertions::assert_impl_all!(
            SharedImport<u32>: DeviceMemory<u32>, CopySource<u32>, KernelArg
        );
    }

    #[test]
    fn one_hand_off_per_connection() {
        let (a, b) = UnixStream::pair().unwrap();
        let slot = ConnSlot::take(&a).unwrap();
        let dup = a.try_clone().unwrap();
        assert!(matches!(
            ConnSlot::take(&dup),
            Err(Error::InvalidArgument(m)) if m.contains("already out")
        ));
        // Nothing is received where a hand-off is out: its hand-back comes there.
        assert!(matches!(
            expect_none_out(&dup),
            Err(Error::InvalidArgument(m)) if m.contains("still out")
        ));
        expect_none_out(&b).unwrap();
        // The other end is another socket.
        let other = ConnSlot::take(&b).unwrap();
        drop(slot);
        expect_none_out(&a).unwrap();
        let again = ConnSlot::take(&a).unwrap();
        drop((again, other));
    }

    proptest! {
        #[test]
        fn hostile_hand_off_bytes_are_typed_errors(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            prop_assert!(decode_offer(&bytes, vec![pipe_fd()]).is_err());
            prop_assert!(decode_hand_back(&bytes, &[], &[0; 16]).is_err());
        }

        #[test]
        fn flipped_offer_bytes_are_rejected(pos in any::<prop::sample::Index>(), flip in 1u8..) {
            let mut b = offer_bytes([1; 16], &sample_buffer(8, 3));
            let i = pos.index(b.len());
            b[i] ^= flip;
            let corrupt = matches!(decode_offer(&b, vec![pipe_fd()]), Err(Error::CorruptHandle { .. }));
            prop_assert!(corrupt);
        }
    }
}
