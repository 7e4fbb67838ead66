//! The handles that cross the process boundary, and their serialized form.
//!
//! All three handle types derive `serde::{Serialize, Deserialize}` (so they can be
//! embedded in your own messages) and have `to_bytes` / `from_bytes`, which wrap the
//! serde form in the checksummed envelope of [`wire`]. A [`PoolHandle`]'s
//! file descriptor is never serialized: it travels beside the bytes, by `SCM_RIGHTS`
//! ([`send_handles`](super::send_handles)).

use super::wire::{self, Kind, corrupt, hex};
use crate::device::Uuid;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

/// Longest element type name a handle may carry.
pub(crate) const MAX_TYPE_NAME: usize = 256;

/// A memory pool's identity: 16 bytes from the operating system's CSPRNG (`getrandom`),
/// so ids are unique in practice (128 random bits) and cannot be guessed from a pid, a
/// counter or a clock. Buffer handles name the pool they belong to, so a buffer is never
/// imported into the wrong pool.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PoolId(#[serde(with = "hex")] pub(crate) [u8; 16]);

impl PoolId {
    /// A new random id; [`Error::Io`] if the OS random source fails (it does not block
    /// once the kernel's pool is initialised, early in boot).
    pub(crate) fn fresh() -> Result<PoolId> {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b).map_err(|e| {
            let io = match e.raw_os_error() {
                Some(code) => std::io::Error::from_raw_os_error(code),
                None => std::io::Error::other(e.to_string()),
            };
            super::io_error("getrandom (pool id)", &io)
        })?;
        Ok(PoolId(b))
    }

    /// The raw 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(&self.0))
    }
}

impl fmt::Debug for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PoolId({self})")
    }
}

/// An exported IPC memory pool: its POSIX file descriptor plus the pool's id and device.
///
/// Made by [`MemoryPool::export`](super::MemoryPool::export), sent with
/// [`send_handles`](super::send_handles), turned back into a pool by
/// [`ImportedPool::import`](super::ImportedPool::import) in the other process. The
/// descriptor is not part of the serde / `to_bytes` form; a handle read back from bytes
/// has none until [`with_fd`](Self::with_fd) gives it one ([`recv_handles`](super::recv_handles)
/// does that for you).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolHandle {
    pool_id: PoolId,
    #[serde(with = "hex")]
    device_uuid: [u8; 16],
    device_ordinal: u32,
    #[serde(skip)]
    fd: Option<OwnedFd>,
}

impl PoolHandle {
    pub(crate) fn new(pool_id: PoolId, uuid: Uuid, ordinal: usize, fd: OwnedFd) -> Self {
        PoolHandle {
            pool_id,
            device_uuid: uuid.0,
            device_ordinal: ordinal as u32,
            fd: Some(fd),
        }
    }

    /// The pool's id.
    pub fn pool_id(&self) -> PoolId {
        self.pool_id
    }

    /// UUID of the device the pool lives on (how an importer finds the device).
    pub fn device_uuid(&self) -> Uuid {
        Uuid(self.device_uuid)
    }

    /// The device's ordinal *in the exporting process*: informational only, since
    /// ordinals depend on each process's `CUDA_VISIBLE_DEVICES`.
    pub fn exporter_ordinal(&self) -> usize {
        self.device_ordinal as usize
    }

    /// The shareable file descriptor, if this handle carries one.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|fd| fd.as_fd())
    }

    /// Attaches a descriptor (replacing any), e.g. after [`from_bytes`](Self::from_bytes).
    pub fn with_fd(mut self, fd: OwnedFd) -> Self {
        self.fd = Some(fd);
        self
    }

    /// Takes the descriptor out, leaving none.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fd.take()
    }

    /// A copy with a duplicated descriptor (`dup`), e.g. to send to several processes.
    pub fn try_clone(&self) -> Result<PoolHandle> {
        let fd = match &self.fd {
            Some(fd) => Some(fd.try_clone().map_err(|e| super::io_error("dup", &e))?),
            None => None,
        };
        Ok(PoolHandle {
            pool_id: self.pool_id,
            device_uuid: self.device_uuid,
            device_ordinal: self.device_ordinal,
            fd,
        })
    }

    /// The sealed byte form (magic, version, checksum), **without** the descriptor.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        wire::seal(Kind::Pool, self)
    }

    /// Parses [`to_bytes`](Self::to_bytes) output; the result has no descriptor.
    /// Anything else is [`Error::CorruptHandle`].
    pub fn from_bytes(bytes: &[u8]) -> Result<PoolHandle> {
        wire::open(Kind::Pool, bytes)
    }

    /// The descriptor or [`Error::CorruptHandle`] saying it never arrived.
    pub(crate) fn require_fd(&self) -> Result<BorrowedFd<'_>> {
        self.fd().ok_or_else(|| {
            corrupt(
                "the pool handle carries no file descriptor (descriptors travel by SCM_RIGHTS: \
                 use send_handles/recv_handles, or attach one with PoolHandle::with_fd)",
            )
        })
    }
}

impl fmt::Debug for PoolHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolHandle")
            .field("pool_id", &self.pool_id)
            .field("device_uuid", &self.device_uuid())
            .field("exporter_ordinal", &self.device_ordinal)
            .field("fd", &self.fd.as_ref().map(|fd| fd.as_raw_fd()))
            .finish()
    }
}

/// An exported allocation of an IPC pool: `cuMemPoolExportPointer`'s 64 bytes plus what
/// the importer needs to rebuild a typed slice. Plain data: it may travel by any channel.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BufferHandle {
    pool_id: PoolId,
    #[serde(with = "hex")]
    device_uuid: [u8; 16],
    #[serde(with = "hex")]
    export_data: [u8; 64],
    len: u64,
    elem_size: u32,
    elem_type: String,
}

/// A legacy `cuIpcGetMemHandle` handle of a whole [`DeviceSlice`](crate::DeviceSlice)
/// allocation, plus its device, length and element type. Plain data.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LegacyIpcHandle {
    #[serde(with = "hex")]
    device_uuid: [u8; 16],
    #[serde(with = "hex")]
    data: [u8; 64],
    len: u64,
    elem_size: u32,
    elem_type: String,
}

/// What both plain handle kinds describe: `len` elements of a named type on a device.
pub(crate) struct Layout<'a> {
    pub(crate) len: u64,
    pub(crate) elem_size: u32,
    pub(crate) elem_type: &'a str,
}

impl Layout<'_> {
    /// Checks the fields are self-consistent and returns the byte size.
    fn validate(&self) -> Result<usize> {
        if self.elem_size == 0 {
            return Err(corrupt("element size is 0"));
        }
        if self.elem_type.is_empty() || self.elem_type.len() > MAX_TYPE_NAME {
            return Err(corrupt(format!(
                "element type name has {} bytes (1..={MAX_TYPE_NAME} allowed)",
                self.elem_type.len()
            )));
        }
        if self.len == 0 {
            return Err(corrupt(
                "buffer length is 0 (empty buffers cannot be exported)",
            ));
        }
        self.len
            .checked_mul(u64::from(self.elem_size))
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| {
                corrupt(format!(
                    "{} elements of {} bytes overflow the address space",
                    self.len, self.elem_size
                ))
            })
    }

    /// Validates and checks that the handle holds `T`s; returns the element count.
    pub(crate) fn expect_type<T>(&self) -> Result<usize> {
        self.validate()?;
        let (name, size) = (std::any::type_name::<T>(), std::mem::size_of::<T>());
        if self.elem_type != name || self.elem_size as usize != size {
            return Err(Error::TypeMismatch {
                handle: format!("{} ({} bytes)", self.elem_type, self.elem_size),
                requested: format!("{name} ({size} bytes)"),
            });
        }
        usize::try_from(self.len).map_err(|_| corrupt("length overflows usize"))
    }
}

/// Element type name and size as recorded in handles.
pub(crate) fn type_of<T>() -> (String, u32) {
    (
        std::any::type_name::<T>().to_owned(),
        std::mem::size_of::<T>() as u32,
    )
}

impl BufferHandle {
    pub(crate) fn new<T>(pool_id: PoolId, uuid: Uuid, export_data: [u8; 64], len: usize) -> Self {
        let (elem_type, elem_size) = type_of::<T>();
        BufferHandle {
            pool_id,
            device_uuid: uuid.0,
            export_data,
            len: len as u64,
            elem_size,
            elem_type,
        }
    }

    /// The pool the buffer was allocated from.
    pub fn pool_id(&self) -> PoolId {
        self.pool_id
    }

    /// The opaque `CUmemPoolPtrExportData`.
    pub fn export_data(&self) -> &[u8; 64] {
        &self.export_data
    }
}

impl LegacyIpcHandle {
    pub(crate) fn new<T>(uuid: Uuid, data: [u8; 64], len: usize) -> Self {
        let (elem_type, elem_size) = type_of::<T>();
        LegacyIpcHandle {
            device_uuid: uuid.0,
            data,
            len: len as u64,
            elem_size,
            elem_type,
        }
    }

    /// The opaque `CUipcMemHandle` bytes.
    pub fn data(&self) -> &[u8; 64] {
        &self.data
    }
}

/// What the two plain handle kinds share: layout accessors, validation, sealed bytes
/// and `Debug` (which shows only the first 8 opaque bytes).
macro_rules! plain_handle {
    ($ty:ident, $kind:expr, $data:ident) => {
        impl $ty {
            /// UUID of the allocation's device.
            pub fn device_uuid(&self) -> Uuid {
                Uuid(self.device_uuid)
            }

            /// Number of elements.
            pub fn len(&self) -> usize {
                self.len as usize
            }

            /// Whether there are no elements (never true for an exported handle).
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// Size of one element in bytes.
            pub fn elem_size(&self) -> usize {
                self.elem_size as usize
            }

            /// `std::any::type_name` of the element type in the exporting program.
            pub fn elem_type(&self) -> &str {
                &self.elem_type
            }

            pub(crate) fn layout(&self) -> Layout<'_> {
                Layout {
                    len: self.len,
                    elem_size: self.elem_size,
                    elem_type: &self.elem_type,
                }
            }

            /// Checks the fields are self-consistent (what [`from_bytes`](Self::from_bytes)
            /// and imports check).
            pub fn validate(&self) -> Result<()> {
                self.layout().validate().map(drop)
            }

            /// The sealed byte form (magic, version, checksum).
            pub fn to_bytes(&self) -> Result<Vec<u8>> {
                wire::seal($kind, self)
            }

            /// Parses and validates [`to_bytes`](Self::to_bytes) output; anything else is
            /// [`Error::CorruptHandle`].
            pub fn from_bytes(bytes: &[u8]) -> Result<$ty> {
                let h: $ty = wire::open($kind, bytes)?;
                h.validate()?;
                Ok(h)
            }
        }

        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("device_uuid", &self.device_uuid())
                    .field("len", &self.len)
                    .field("elem_type", &self.elem_type)
                    .field("elem_size", &self.elem_size)
                    .field(stringify!($data), &hex::encode(&self.$data[..8]))
                    .finish_non_exhaustive()
            }
        }
    };
}
plain_handle!(BufferHandle, Kind::Buffer, export_data);
plain_handle!(LegacyIpcHandle, Kind::Legacy, data);

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ipc::wire::tests::is_corrupt;
    use proptest::prelude::*;

    pub(crate) fn sample_buffer(len: usize, seed: u8) -> BufferHandle {
        BufferHandle::new::<f32>(PoolId([seed; 16]), Uuid([seed ^ 0x5a; 16]), [seed; 64], len)
    }

    fn pipe_fd() -> OwnedFd {
        let (r, _w) = std::io::pipe().unwrap();
        r.into()
    }

    #[test]
    fn pool_handle_round_trips_without_its_fd() {
        let h = PoolHandle::new(PoolId::fresh().unwrap(), Uuid([3; 16]), 2, pipe_fd());
        let back = PoolHandle::from_bytes(&h.to_bytes().unwrap()).unwrap();
        assert_eq!(back.pool_id(), h.pool_id());
        assert_eq!(back.device_uuid(), h.device_uuid());
        assert_eq!(back.exporter_ordinal(), 2);
        assert!(back.fd().is_none());
        assert!(matches!(
            back.require_fd(),
            Err(Error::CorruptHandle { .. })
        ));
        let with = back.with_fd(pipe_fd());
        assert!(with.require_fd().is_ok());
        let dup = with.try_clone().unwrap();
        assert_ne!(
            dup.fd().unwrap().as_raw_fd(),
            with.fd().unwrap().as_raw_fd()
        );
        // The fd is not in the bytes: JSON has exactly the three documented fields.
        let json = serde_json::to_value(&h).unwrap();
        assert_eq!(json.as_object().unwrap().len(), 3);
    }

    #[test]
    fn pool_ids_are_unique() {
        let ids: std::collections::HashSet<_> =
            (0..1000).map(|_| PoolId::fresh().unwrap()).collect();
        assert_eq!(ids.len(), 1000);
    }

    #[test]
    fn pool_ids_are_random_in_every_byte() {
        // No byte is derived from the pid, a counter or the clock: across 1000 ids every
        // position takes many values (uniform bytes give ~250 distinct of 256; the old
        // pid | counter | time scheme had constant pid bytes and near-constant high bytes).
        let ids: Vec<[u8; 16]> = (0..1000).map(|_| PoolId::fresh().unwrap().0).collect();
        for pos in 0..16 {
            let distinct: std::collections::HashSet<u8> = ids.iter().map(|id| id[pos]).collect();
            assert!(
                distinct.len() > 150,
                "byte {pos} took only {} values",
                distinct.len()
            );
        }
        let pid = std::process::id().to_le_bytes();
        assert!(ids.iter().filter(|id| id[0..4] == pid).count() <= 1);
    }

    #[test]
    fn kinds_are_not_interchangeable() {
        let b = sample_buffer(4, 1).to_bytes().unwrap();
        assert!(matches!(
            LegacyIpcHandle::from_bytes(&b),
            Err(Error::CorruptHandle { .. })
        ));
        assert!(matches!(
            PoolHandle::from_bytes(&b),
            Err(Error::CorruptHandle { .. })
        ));
    }

    #[test]
    fn semantic_checks() {
        let mut h = sample_buffer(4, 1);
        assert_eq!(h.layout().expect_type::<f32>().unwrap(), 4);
        assert!(matches!(
            h.layout().expect_type::<u32>(),
            Err(Error::TypeMismatch { .. })
        ));
        assert!(matches!(
            h.layout().expect_type::<f64>(),
            Err(Error::TypeMismatch { .. })
        ));
        h.len = 0;
        assert!(matches!(
            BufferHandle::from_bytes(&h.to_bytes().unwrap()),
            Err(Error::CorruptHandle { .. })
        ));
        h.len = u64::MAX;
        assert!(matches!(h.validate(), Err(Error::CorruptHandle { .. })));
        h.len = 1;
        h.elem_size = 0;
        assert!(matches!(h.validate(), Err(Error::CorruptHandle { .. })));
        h.elem_size = 4;
        h.elem_type = "x".repeat(MAX_TYPE_NAME + 1);
        assert!(matches!(h.validate(), Err(Error::CorruptHandle { .. })));
        // Unknown fields in a hand-made JSON are rejected too.
        let mut v = serde_json::to_value(sample_buffer(1, 2)).unwrap();
        v["extra"] = serde_json::json!(1);
        assert!(serde_json::from_value::<BufferHandle>(v).is_err());
    }

    proptest! {
        #[test]
        fn buffer_handles_round_trip(pool in any::<[u8; 16]>(), uuid in any::<[u8; 16]>(),
                                     data in proptest::collection::vec(any::<u8>(), 64),
                                     len in 1usize..1 << 40) {
            let mut export = [0u8; 64];
            export.copy_from_slice(&data);
            let h = BufferHandle::new::<u16>(PoolId(pool), Uuid(uuid), export, len);
            let back = BufferHandle::from_bytes(&h.to_bytes().unwrap()).unwrap();
            prop_assert_eq!(&back, &h);
            prop_assert_eq!(back.layout().expect_type::<u16>().unwrap(), len);
        }

        #[test]
        fn legacy_handles_round_trip(uuid in any::<[u8; 16]>(), seed in any::<u8>(), len in 1usize..1 << 30) {
            let h = LegacyIpcHandle::new::<i64>(Uuid(uuid), [seed; 64], len);
            let back = LegacyIpcHandle::from_bytes(&h.to_bytes().unwrap()).unwrap();
            prop_assert_eq!(back, h);
        }

        #[test]
        fn corrupted_buffer_bytes_are_rejected(seed in any::<u8>(), pos in any::<prop::sample::Index>(),
                                               xor in 1u8..=255) {
            let bytes = sample_buffer(7, seed).to_bytes().unwrap();
            let mut bad = bytes.clone();
            let i = pos.index(bad.len());
            bad[i] ^= xor;
            prop_assert!(is_corrupt(&BufferHandle::from_bytes(&bad)));
        }

        #[test]
        fn truncated_handle_bytes_are_rejected(seed in any::<u8>(), cut in any::<prop::sample::Index>()) {
            let bytes = sample_buffer(7, seed).to_bytes().unwrap();
            let keep = cut.index(bytes.len());
            prop_assert!(is_corrupt(&BufferHandle::from_bytes(&bytes[..keep])));
            let pool = PoolHandle::new(PoolId([seed; 16]), Uuid([1; 16]), 0, pipe_fd()).to_bytes().unwrap();
            let keep = cut.index(pool.len());
            prop_assert!(is_corrupt(&PoolHandle::from_bytes(&pool[..keep])));
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            prop_assert!(BufferHandle::from_bytes(&bytes).is_err());
            prop_assert!(PoolHandle::from_bytes(&bytes).is_err());
            prop_assert!(LegacyIpcHandle::from_bytes(&bytes).is_err());
        }
    }
}
