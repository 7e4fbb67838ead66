//! Instantiation flags ([`InstantiateFlags`], [`Graph::instantiate_with`]), and the upload
//! of an executable graph ([`GraphExec::upload`]).

use super::{Graph, GraphExec};
use crate::access::{Access, AccessTracker};
use crate::driver::result;
use crate::error::{DriverErrorCode, Error, Result};
use crate::stream::BoundStream;
use cudarc::driver::sys;
use std::sync::Arc;

/// How [`Graph::instantiate_with`] instantiates a graph (`CUgraphInstantiate_flags`).
/// [`InstantiateFlags::new`] (also the `Default`) sets none: what
/// [`Graph::instantiate`] uses.
///
/// ```
/// use gpubind::InstantiateFlags;
/// let f = InstantiateFlags::new().use_node_priority(true);
/// assert!(f.has_use_node_priority() && !f.has_auto_free_on_launch());
/// assert_eq!(InstantiateFlags::default(), InstantiateFlags::new());
/// ```
///
/// What each flag means for gpubind's graphs:
///
/// * **Auto-free on launch** (`CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`):
///   accepted, and changes nothing here. It frees, at each launch, what the graph's
///   memory allocation nodes allocated at the previous launch and left unfreed; a capture
///   never contains allocation nodes (stream-ordered allocation is not capturable, see
///   [`Capture`](crate::Capture)).
/// * **Node priority** (`CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`): accepted. Each
///   kernel node runs at the priority recorded in the node instead of the launch stream's.
///   Priority changes how the device schedules work that is already free to run, never
///   what waits for what: each launch still claims every buffer it uses.
/// * **Device launch** (`CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH`): refused,
///   [`Error::GraphInstantiate`] before the driver is called. The flag exists so that a
///   kernel can launch the graph (`cudaGraphLaunch` in device code); such a launch never
///   passes through [`GraphExec::launch`], so nothing claims the graph's buffers: the
///   graph could write a buffer that a host read or another stream is using. gpubind
///   cannot order those launches, so it does not make them possible. (To launch a graph
///   from the device, instantiate [`Graph::raw`] yourself; ordering those launches is
///   then yours.)
/// * **Upload** (`CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`, instantiate and upload in one
///   call): not a flag here; [`GraphExec::upload`] does the same after instantiating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct InstantiateFlags {
    auto_free_on_launch: bool,
    use_node_priority: bool,
    device_launch: bool,
}

/// The driver's flag bits, each with its name.
const NAMED: [(u64, &str); 3] = [
    (
        sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH.0 as u64,
        "CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH",
    ),
    (
        sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY.0 as u64,
        "CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY",
    ),
    (
        sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH.0 as u64,
        "CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH",
    ),
];

impl InstantiateFlags {
    /// No flags: the driver's default instantiation.
    pub const fn new() -> Self {
        InstantiateFlags {
            auto_free_on_launch: false,
            use_node_priority: false,
            device_launch: false,
        }
    }

    /// Whether each launch frees what the previous launch's allocation nodes left
    /// allocated (`CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`; no effect on
    /// gpubind's captures, which have no allocation nodes).
    pub const fn auto_free_on_launch(mut self, on: bool) -> Self {
        self.auto_free_on_launch = on;
        self
    }

    /// Whether kernel nodes run at their own priority instead of the launch stream's
    /// (`CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`).
    pub const fn use_node_priority(mut self, on: bool) -> Self {
        self.use_node_priority = on;
        self
    }

    /// Whether the graph may be launched from the device
    /// (`CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH`). [`Graph::instantiate_with`]
    /// refuses it: see [`InstantiateFlags`], "Device launch".
    pub const fn device_launch(mut self, on: bool) -> Self {
        self.device_launch = on;
        self
    }

    /// Whether auto-free on launch is set.
    pub const fn has_auto_free_on_launch(self) -> bool {
        self.auto_free_on_launch
    }

    /// Whether node priority is set.
    pub const fn has_use_node_priority(self) -> bool {
        self.use_node_priority
    }

    /// Whether device launch is set.
    pub const fn has_device_launch(self) -> bool {
        self.device_launch
    }

    /// The flags as `cuGraphInstantiateWithFlags` takes them.
    fn bits(self) -> u64 {
        let set = [
            self.auto_free_on_launch,
            self.use_node_priority,
            self.device_launch,
        ];
        NAMED
            .iter()
            .zip(set)
            .filter(|(_, on)| *on)
            .fold(0, |bits, ((bit, _), _)| bits | bit)
    }

    /// The flags of `bits` (as `cuGraphExecGetFlags` returns them), or the bits that are
    /// none of these flags.
    fn from_bits(bits: u64) -> std::result::Result<Self, u64> {
        let unknown = NAMED.iter().fold(bits, |rest, (bit, _)| rest & !bit);
        if unknown != 0 {
            return Err(unknown);
        }
        let has = |i: usize| bits & NAMED[i].0 != 0;
        Ok(InstantiateFlags {
            auto_free_on_launch: has(0),
            use_node_priority: has(1),
            device_launch: has(2),
        })
    }

    /// The driver's names of the flags set, joined by ` | ` (`0` for none).
    fn names(self) -> String {
        let bits = self.bits();
        let names: Vec<&str> = NAMED
            .iter()
            .filter(|(bit, _)| bits & bit != 0)
            .map(|(_, name)| *name)
            .collect();
        if names.is_empty() {
            "0".to_owned()
        } else {
            names.join(" | ")
        }
    }

    /// gpubind's refusal of a flag whose launches it could not order.
    fn refuse_unordered(self) -> Result<()> {
        if self.device_launch {
            return Err(Error::GraphInstantiate {
                flags: NAMED[2].1.to_owned(),
                reason: "a device-launchable graph can be launched by a kernel, a launch that \
                         claims none of the graph's buffers and that gpubind cannot order \
                         against their other uses; launch it from the host \
                         (GraphExec::launch), or instantiate Graph::raw yourself"
                    .into(),
            });
        }
        Ok(())
    }

    /// `e`, from instantiating with these flags, as the driver's refusal of them where it
    /// is one (an invalid or unsupported value while flags were set).
    fn refused(self, e: Error) -> Error {
        let refusal = matches!(
            e.driver_code(),
            Some(DriverErrorCode::INVALID_VALUE | DriverErrorCode::NOT_SUPPORTED)
        );
        if refusal && self.bits() != 0 && matches!(e, Error::Driver { .. }) {
            Error::GraphInstantiate {
                flags: self.names(),
                reason: e.to_string(),
            }
        } else {
            e
        }
    }
}

impl<'buf> Graph<'buf> {
    /// Instantiates the graph with `flags` (`cuGraphInstantiateWithFlags`); see
    /// [`InstantiateFlags`] for what each flag does here. Otherwise as
    /// [`instantiate`](Self::instantiate): the executable graph borrows what this one
    /// borrows, and its launches claim it.
    ///
    /// ```no_run
    /// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
    /// use gpubind::InstantiateFlags;
    /// let x = gpu.alloc_zeros::<u32>(1024)?;
    /// let graph = gpu.capture(|c| c.memset(&x, 7u32))?;
    /// let flags = InstantiateFlags::new().use_node_priority(true);
    /// let exec = graph.instantiate_with(flags)?;
    /// assert_eq!(exec.flags()?, flags);
    /// # Ok(()) }
    /// ```
    ///
    /// [`Error::GraphInstantiate`] naming the flag for device launch (refused by gpubind)
    /// and for a flag the driver refuses (`CUDA_ERROR_INVALID_VALUE` or
    /// `CUDA_ERROR_NOT_SUPPORTED` with flags set).
    pub fn instantiate_with(&self, flags: InstantiateFlags) -> Result<GraphExec<'buf>> {
        flags.refuse_unordered()?;
        let _guard = self.device.enter()?;
        // SAFETY: a live graph of this context (current for the call); the flags are
        // the driver's, device launch excluded above.
        let instantiated = unsafe { result::graph::instantiate(self.raw, flags.bits()) };
        let raw = self
            .device
            .check(instantiated)
            .map_err(|e| flags.refused(e))?;
        Ok(GraphExec {
            device: Arc::clone(&self.device),
            raw,
            uses: self.uses.clone(),
            launches: AccessTracker::default(),
        })
    }
}

impl GraphExec<'_> {
    /// The flags the driver reports for this executable graph (`cuGraphExecGetFlags`).
    /// Auto-free on launch and device launch are reported; node priority is applied at
    /// instantiation but not reported back by every driver (R580 does not).
    pub fn flags(&self) -> Result<InstantiateFlags> {
        let _guard = self.device.enter()?;
        // SAFETY: a live executable graph of this context (current for the call).
        let bits = self
            .device
            .check(unsafe { result::graph::exec_flags(self.raw) })?;
        InstantiateFlags::from_bits(bits).map_err(|unknown| {
            Error::InvalidArgument(format!(
                "cuGraphExecGetFlags returned flags gpubind does not know: {unknown:#x}"
            ))
        })
    }

    /// Uploads the executable graph's work to the device on `stream`, a stream of its
    /// device, without running it (`cuGraphUpload`), so that a later launch does not pay
    /// for the upload. The upload is ordered after the work already on `stream` and after
    /// the graph's earlier launches; it reads and writes none of the graph's buffers (so
    /// it claims none), and the drop of the executable graph waits for it like for a
    /// launch.
    ///
    /// ```no_run
    /// # fn f(gpu: &gpubind::BoundDevice<'_>) -> gpubind::Result<()> {
    /// let x = gpu.alloc_zeros::<u32>(1024)?;
    /// let exec = gpu.capture(|c| c.memset(&x, 7u32))?.instantiate()?;
    /// let stream = gpu.new_stream()?;
    /// let s = gpu.on(&stream)?;
    /// exec.upload(&s)?;
    /// exec.launch(&s)?;
    /// # Ok(()) }
    /// ```
    pub fn upload(&self, stream: &BoundStream<'_>) -> Result<()> {
        stream.bound().expect_device("graph", &self.device)?;
        // This executable graph's own tracker, as for a launch: its drop waits for the
        // upload, and the upload follows its launches on other streams.
        let _claim = stream.claim([Some((&self.launches, Access::Write))])?;
        // SAFETY: a live executable graph of this device, uploaded on a stream of it
        // (context checked by the claim); its destruction waits for the upload (claimed
        // above). Nothing runs, so no buffer is touched.
        self.device
            .check(unsafe { result::graph::upload(self.raw, stream.raw()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> impl Iterator<Item = InstantiateFlags> {
        (0..8u8).map(|i| {
            InstantiateFlags::new()
                .auto_free_on_launch(i & 1 != 0)
                .use_node_priority(i & 2 != 0)
                .device_launch(i & 4 != 0)
        })
    }

    #[test]
    fn flags_are_the_drivers_bits_and_round_trip() {
        assert_eq!(InstantiateFlags::new().bits(), 0);
        assert_eq!(InstantiateFlags::new().auto_free_on_launch(true).bits(), 1);
        assert_eq!(InstantiateFlags::new().device_launch(true).bits(), 4);
        assert_eq!(InstantiateFlags::new().use_node_priority(true).bits(), 8);
        for f in all() {
            assert_eq!(InstantiateFlags::from_bits(f.bits()), Ok(f));
        }
        // CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD (2) and unknown bits are reported.
        assert_eq!(InstantiateFlags::from_bits(2 | 8), Err(2));
        assert_eq!(InstantiateFlags::from_bits(1 << 40), Err(1 << 40));
    }

    #[test]
    fn names_are_the_drivers() {
        assert_eq!(InstantiateFlags::new().names(), "0");
        let f = InstantiateFlags::new()
            .auto_free_on_launch(true)
            .use_node_priority(true);
        assert_eq!(
            f.names(),
            "CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | \
             CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY"
        );
    }

    #[test]
    fn device_launch_is_refused_by_name() {
        for f in all() {
            match f.refuse_unordered() {
                Ok(()) => assert!(!f.has_device_launch()),
                Err(Error::GraphInstantiate { flags, reason }) => {
                    assert!(f.has_device_launch());
                    assert_eq!(flags, "CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH");
                    assert!(reason.contains("cannot order"), "{reason}");
                }
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
    }

    #[test]
    fn driver_refusals_name_the_flags_set() {
        let invalid = Error::driver(
            "cuGraphInstantiateWithFlags",
            sys::CUresult::CUDA_ERROR_INVALID_VALUE,
        );
        let prio = InstantiateFlags::new().use_node_priority(true);
        match prio.refused(invalid.clone()) {
            Error::GraphInstantiate { flags, reason } => {
                assert_eq!(flags, "CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY");
                assert!(reason.contains("cuGraphInstantiateWithFlags"), "{reason}");
            }
            e => panic!("unexpected {e:?}"),
        }
        // Without flags, or for an error that is no refusal, the driver's error stays.
        assert_eq!(InstantiateFlags::new().refused(invalid.clone()), invalid);
        let oom = Error::driver(
            "cuGraphInstantiateWithFlags",
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
        );
        assert_eq!(prio.refused(oom.clone()), oom);
    }
}
