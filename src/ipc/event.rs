//! Interprocess events: an [`Event`] created with [`EventFlags::interprocess`] is
//! exported as an [`EventHandle`] (`cuIpcGetEventHandle`) and opened in another process
//! (`cuIpcOpenEventHandle`) into an [`Event`] that its streams can
//! [`wait`](crate::BoundStream::wait) on and [`record`](crate::BoundStream::record).

use super::registry;
use super::wire::{self, Kind, hex};
use crate::device::{Device, Uuid};
use crate::driver::result;
use crate::error::{Error, Result};
use crate::stream::Event;
#[cfg(doc)]
use crate::stream::EventFlags;
use cudarc::driver::sys;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// An exported interprocess event: `cuIpcGetEventHandle`'s 64 bytes and the event's
/// device. Plain data with the same conventions as
/// [`BufferHandle`](super::BufferHandle): serde (`device_uuid` and `data` as hex
/// strings), [`to_bytes`](Self::to_bytes) / [`from_bytes`](Self::from_bytes) in the
/// checksummed envelope, [`send_message`](super::send_message) for transport.
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::ipc::EventHandle;
/// use gpubind::{Device, EventFlags, ThreadContext};
/// let mut ctx = ThreadContext::acquire()?;
/// let gpu = ctx.bind(&Device::get(0)?)?;
/// let stream = gpu.new_stream()?;
/// let event = gpu.new_event_with(EventFlags::new().interprocess(true))?;
/// gpu.on(&stream)?.record(&event)?;
/// let bytes = EventHandle::export(&event)?.to_bytes()?;
/// // In another process: its stream waits for this process's work before `event`.
/// // let opened = EventHandle::from_bytes(&bytes)?.open()?;
/// // gpu.on(&stream)?.wait(&opened)?;
/// # let _ = bytes; Ok(()) }
/// ```
///
/// Rules the types cannot check across processes (`docs/ipc.md`, "Interprocess
/// events"): the exporter keeps its `Event` alive until every process that opened it has
/// dropped the opened one (the driver makes any use of an opened event after the
/// exporter destroyed it undefined); a stream that waits on an opened event waits for
/// ever if the exporter dies before its recorded work completes — bound such waits on
/// the host ([`Event::is_complete`] with a deadline) where the peer may die.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventHandle {
    #[serde(with = "hex")]
    device_uuid: [u8; 16],
    #[serde(with = "hex")]
    data: [u8; 64],
}

impl EventHandle {
    /// Exports `event`, which must have been created with
    /// [`EventFlags::interprocess`] (else [`Error::InvalidArgument`]).
    pub fn export(event: &Event) -> Result<EventHandle> {
        if !event.flags().has_interprocess() {
            return Err(Error::InvalidArgument(
                "cannot export an event created without EventFlags::interprocess".into(),
            ));
        }
        let device = event.device();
        let _guard = device.enter()?;
        // SAFETY: `event` is a live interprocess event of `device`, whose context is
        // current; the call writes 64 bytes.
        let h = device.check(unsafe { result::ipc::get_event_handle(event.raw()) })?;
        let data = h.reserved.map(|b| b as u8);
        registry::lock().add_own_event(data);
        Ok(EventHandle {
            device_uuid: device.uuid().0,
            data,
        })
    }

    /// Opens the exported event on its device (found by UUID; needs only
    /// [`crate::init`]). The opened [`Event`] can be recorded on and waited on by this
    /// process's streams of that device. Errors: [`Error::SameProcessImport`] for an
    /// event this process exported, [`Error::UnknownDevice`] for a UUID not visible
    /// here, a driver error naming `cuIpcOpenEventHandle` for a handle the driver does
    /// not know (forged, or its exporter destroyed it or exited).
    pub fn open(&self) -> Result<Event> {
        if registry::lock().is_own_event(&self.data) {
            return Err(Error::SameProcessImport {
                what: "interprocess event handle".into(),
            });
        }
        let uuid = Uuid(self.device_uuid);
        let device: Arc<Device> = Device::by_uuid(uuid)?.ok_or(Error::UnknownDevice { uuid })?;
        let mut h = sys::CUipcEventHandle { reserved: [0; 64] };
        for (d, s) in h.reserved.iter_mut().zip(self.data) {
            *d = s as _;
        }
        let _guard = device.enter()?;
        // SAFETY: the device's context is current; the handle is plain data (one the
        // driver does not know is an error from it).
        let raw = device.check(unsafe { result::ipc::open_event_handle(h) })?;
        Ok(Event::from_opened(Arc::clone(&device), raw))
    }

    /// UUID of the event's device.
    pub fn device_uuid(&self) -> Uuid {
        Uuid(self.device_uuid)
    }

    /// The driver's 64 opaque bytes.
    pub fn data(&self) -> &[u8; 64] {
        &self.data
    }

    /// The sealed byte form (magic, version, checksum).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        wire::seal(Kind::Event, self)
    }

    /// Parses [`to_bytes`](Self::to_bytes) output; anything else is
    /// [`Error::CorruptHandle`].
    pub fn from_bytes(bytes: &[u8]) -> Result<EventHandle> {
        wire::open(Kind::Event, bytes)
    }
}

impl fmt::Debug for EventHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventHandle")
            .field("device_uuid", &self.device_uuid())
            .field("data", &hex::encode(&self.data[..8]))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipc::wire::tests::is_corrupt;
    use proptest::prelude::*;

    fn sample(seed: u8) -> EventHandle {
        EventHandle {
            device_uuid: [seed; 16],
            data: std::array::from_fn(|i| seed.wrapping_add(i as u8)),
        }
    }

    #[test]
    fn json_names_its_fields_in_hex() {
        let v = serde_json::to_value(sample(1)).unwrap();
        assert_eq!(v["device_uuid"], "01".repeat(16));
        assert_eq!(v["data"].as_str().unwrap().len(), 128);
        let extra = serde_json::json!({
            "device_uuid": "01".repeat(16), "data": "00".repeat(64), "x": 1
        });
        assert!(serde_json::from_value::<EventHandle>(extra).is_err());
    }

    #[test]
    fn other_kinds_are_not_event_handles() {
        let buf = crate::ipc::handle::tests::sample_buffer(4, 3)
            .to_bytes()
            .unwrap();
        assert!(is_corrupt(&EventHandle::from_bytes(&buf)));
        let ev = sample(2).to_bytes().unwrap();
        assert!(is_corrupt(&crate::ipc::BufferHandle::from_bytes(&ev)));
    }

    #[test]
    fn an_own_event_is_refused_before_any_driver_call() {
        let h = sample(9);
        registry::lock().add_own_event(h.data);
        assert!(matches!(h.open(), Err(Error::SameProcessImport { .. })));
    }

    proptest! {
        #[test]
        fn event_handles_round_trip(seed in any::<u8>()) {
            let h = sample(seed);
            prop_assert_eq!(EventHandle::from_bytes(&h.to_bytes().unwrap()).unwrap(), h);
        }

        #[test]
        fn corrupted_event_bytes_are_rejected(seed in any::<u8>(), pos in any::<prop::sample::Index>(),
                                              flip in 1u8..) {
            let mut b = sample(seed).to_bytes().unwrap();
            let i = pos.index(b.len());
            b[i] ^= flip;
            prop_assert!(is_corrupt(&EventHandle::from_bytes(&b)));
        }
    }
}
