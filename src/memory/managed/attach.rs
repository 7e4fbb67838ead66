//! Managed memory's attachment: global, host, or one stream (`CU_MEM_ATTACH_*`), and
//! what it means for host access.

use super::ManagedSlice;
use crate::access::{Access, StreamRef, StreamSlot};
use crate::device::Device;
use crate::driver::result::stream as raw_stream;
use crate::error::{Error, Result};
use crate::memory::DeviceRepr;
use crate::stream::BoundStream;
use cudarc::driver::sys::CUmemAttach_flags as Flags;

/// Which streams may use managed memory, set at allocation
/// ([`BoundDevice::alloc_managed_attached`](crate::BoundDevice::alloc_managed_attached))
/// or later ([`BoundStream::attach_managed_to_host`], [`BoundStream::attach_managed_global`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ManagedAttach {
    /// `CU_MEM_ATTACH_GLOBAL`: any stream of any device may use the memory.
    #[default]
    Global,
    /// `CU_MEM_ATTACH_HOST`: the memory starts attached to the host. On a device with
    /// concurrent managed access (the only kind gpubind accepts it on) it is a
    /// placement hint: every stream may still use the memory.
    Host,
}

impl ManagedAttach {
    pub(super) fn flags(self) -> u32 {
        match self {
            ManagedAttach::Global => Flags::CU_MEM_ATTACH_GLOBAL as u32,
            ManagedAttach::Host => Flags::CU_MEM_ATTACH_HOST as u32,
        }
    }
}

/// What a host reference into managed memory needs: the device's concurrent managed
/// access (`CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS`), and the stream the memory
/// is attached to, if one (its work so far is waited for first).
pub(super) struct HostRule {
    concurrent: bool,
    stream: Option<StreamRef>,
}

impl HostRule {
    /// The rule for memory not attached to one stream (global or host attachment).
    pub(super) fn new(concurrent: bool) -> Self {
        HostRule {
            concurrent,
            stream: None,
        }
    }

    /// Checks that the host may take a reference, and waits for the attached stream.
    ///
    /// On devices without concurrent managed access the host may not touch managed
    /// memory while the device runs *anything* (or, for memory attached to a stream,
    /// while that stream runs anything), and a reference handed out cannot stop another
    /// thread or library from launching work meanwhile: host references are refused
    /// there ([`Error::DeviceLacks`]); copies work.
    pub(super) fn ready(&self, device: &Device, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        if !self.concurrent {
            return Err(Error::DeviceLacks {
                device: device.ordinal(),
                capability: "CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS",
                what: "a host reference into managed memory (as_slice/as_mut_slice)",
                hint: Some("copy with BoundDevice::dtoh / htod_copy instead"),
            });
        }
        match &self.stream {
            Some(stream) => stream.synchronize(),
            None => Ok(()),
        }
    }
}

/// [`Error::DeviceLacks`] for an attachment other than global on a device without
/// concurrent managed access: there the device may touch host- or stream-attached memory
/// only from the stream it is attached to, which gpubind's copies (on the legacy stream)
/// and other streams would not respect.
pub(super) fn check_attachable(
    device: &Device,
    concurrent: bool,
    attach: ManagedAttach,
) -> Result<()> {
    if concurrent || attach == ManagedAttach::Global {
        return Ok(());
    }
    Err(Error::DeviceLacks {
        device: device.ordinal(),
        capability: "CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS",
        what: "managed memory attached to the host or to one stream",
        hint: Some("allocate it attached globally (ManagedAttach::Global)"),
    })
}

/// The attachment `cuStreamAttachMemAsync` is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Global,
    Host,
    Single,
}

impl<'b> BoundStream<'b> {
    /// Attaches `mem` to this stream alone (`cuStreamAttachMemAsync` with
    /// `CU_MEM_ATTACH_SINGLE`), in stream order: ordered after every pending use of
    /// `mem`, and tracked as a write on this stream.
    ///
    /// From then on a host reference ([`ManagedSlice::as_slice`] /
    /// [`as_mut_slice`](ManagedSlice::as_mut_slice)) waits for this stream's work so far
    /// as well as for `mem`'s pending uses; work on other streams may keep running
    /// (`docs/safety.md`, "Managed memory"). Other streams may still use `mem`: gpubind
    /// orders them through its tracker as for any memory.
    ///
    /// Refused with [`Error::InvalidArgument`] on the legacy default stream (the driver
    /// cannot attach to it), with [`Error::DeviceLacks`] on a device without concurrent
    /// managed access, with [`Error::WrongDevice`] for memory of another device.
    pub fn attach_managed<T: DeviceRepr>(&self, mem: &mut ManagedSlice<T>) -> Result<()> {
        self.attach(mem, Target::Single)
    }

    /// Attaches `mem` to the host (`CU_MEM_ATTACH_HOST`), in stream order; undoes
    /// [`attach_managed`](Self::attach_managed). Refused like it, except that the legacy
    /// default stream is accepted.
    pub fn attach_managed_to_host<T: DeviceRepr>(&self, mem: &mut ManagedSlice<T>) -> Result<()> {
        self.attach(mem, Target::Host)
    }

    /// Attaches `mem` globally (`CU_MEM_ATTACH_GLOBAL`), in stream order; undoes
    /// [`attach_managed`](Self::attach_managed). Accepted on every device.
    pub fn attach_managed_global<T: DeviceRepr>(&self, mem: &mut ManagedSlice<T>) -> Result<()> {
        self.attach(mem, Target::Global)
    }

    fn attach<T: DeviceRepr>(&self, mem: &mut ManagedSlice<T>, target: Target) -> Result<()> {
        self.bound().expect_device("managed memory", &mem.device)?;
        let (flags, checked_as) = match target {
            Target::Global => (ManagedAttach::Global.flags(), ManagedAttach::Global),
            Target::Host => (ManagedAttach::Host.flags(), ManagedAttach::Host),
            // Checked like a host attachment: neither is global.
            Target::Single => (Flags::CU_MEM_ATTACH_SINGLE as u32, ManagedAttach::Host),
        };
        check_attachable(&mem.device, mem.host.concurrent, checked_as)?;
        if target == Target::Single && matches!(self.slot(), StreamSlot::Legacy(_)) {
            return Err(Error::InvalidArgument(
                "attach_managed: managed memory cannot be attached to the legacy default \
                 stream alone (CU_MEM_ATTACH_SINGLE); attach it to a stream from new_stream"
                    .into(),
            ));
        }
        if mem.ptr != 0 {
            let _claim = self.claim_mut(&mut mem.tracker, Access::Write)?;
            // SAFETY: this stream is live and of `mem`'s context (device checked above;
            // not the legacy stream for SINGLE); `ptr` starts a live managed allocation
            // whose free waits for this call (tracked by the claim).
            let attached =
                unsafe { raw_stream::attach_mem_async(self.raw_handle(), mem.ptr, flags) };
            mem.device.check(attached)?;
        }
        mem.host.stream = (target == Target::Single).then(|| self.to_ref());
        Ok(())
    }

    fn raw_handle(&self) -> cudarc::driver::sys::CUstream {
        self.slot().raw()
    }
}
