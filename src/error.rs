//! The one error type of gpubind.
//!
//! Every fallible call returns [`Result<T>`](crate::Result). Driver failures keep the
//! result code (a [`DriverErrorCode`]) and the name of the call that failed, so a message
//! reads like `cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)`.

mod code;
mod given_back;
mod transmute;
pub use code::DriverErrorCode;
use cudarc::driver::sys::CUresult;
pub use given_back::GivenBack;
use std::fmt;
pub use transmute::TransmuteRefusal;

/// Everything that can go wrong in gpubind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `libcuda.so` could not be loaded: no NVIDIA driver on this machine.
    #[error(
        "no CUDA driver found: libcuda could not be loaded (is an NVIDIA driver installed and on LD_LIBRARY_PATH?)"
    )]
    NoDriver,

    /// The driver is older than gpubind supports (CUDA 12.2, driver branch R535), or
    /// `GPUBIND_ASSUME_DRIVER_VERSION` caps it below that. Returned by `init`.
    #[error(
        "the CUDA driver supports CUDA {found}, gpubind needs CUDA {needed} or newer (driver R535 or later); if {found} is less than the driver's real version, unset GPUBIND_ASSUME_DRIVER_VERSION"
    )]
    DriverTooOld {
        /// The version the driver reports (capped by `GPUBIND_ASSUME_DRIVER_VERSION`).
        found: crate::cuda_version::DriverVersion,
        /// The oldest version gpubind runs on (`DriverVersion::MINIMUM`).
        needed: crate::cuda_version::DriverVersion,
    },

    /// The operation needs a driver entry point that this driver (or the version
    /// `GPUBIND_ASSUME_DRIVER_VERSION` caps it at) does not have, and nothing older does
    /// the same job. docs/compat.md lists the entry points and their fallbacks.
    #[error("{what} needs a CUDA {needs} driver; this one supports CUDA {found}")]
    Unsupported {
        /// The driver entry point, e.g. `cuFuncGetParamInfo`.
        what: &'static str,
        /// The CUDA version that introduced it.
        needs: crate::cuda_version::DriverVersion,
        /// The driver's version as gpubind uses it (capped, where a cap is set).
        found: crate::cuda_version::DriverVersion,
    },

    /// A CUDA driver call returned an error.
    #[error("{call} failed: {name} ({description})")]
    Driver {
        /// The driver entry point, e.g. `cuMemAlloc_v2`.
        call: &'static str,
        /// The result code.
        code: DriverErrorCode,
        /// `cuGetErrorName`, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
        /// `cuGetErrorString`, e.g. `out of memory`.
        description: String,
    },

    /// `ThreadContext::acquire` was called on a thread that already holds one.
    #[error(
        "this thread already holds a ThreadContext; drop it (or pass it down by &mut) before acquiring another"
    )]
    ThreadContextTaken,

    /// A device ordinal that names no visible device.
    #[error("device ordinal {ordinal} is out of range: {count} CUDA device(s) are visible")]
    BadOrdinal {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        count: usize,
    },

    /// A resource of one device was used with another device bound.
    #[error("wrong device: {what} lives on device {found}, but device {bound} is bound")]
    WrongDevice {
        /// What was passed (e.g. "source slice").
        what: &'static str,
        /// The ordinal of the bound device.
        bound: usize,
        /// The ordinal the resource belongs to.
        found: usize,
    },

    /// Two lengths that must agree do not.
    #[error("size mismatch in {what}: expected {expected} elements, got {found}")]
    SizeMismatch {
        /// The operation.
        what: &'static str,
        /// The length required.
        expected: usize,
        /// The length given.
        found: usize,
    },

    /// A range outside a buffer.
    #[error("range {start}..{end} is out of bounds for a buffer of {len} elements")]
    OutOfBounds {
        /// Range start.
        start: usize,
        /// Range end (exclusive).
        end: usize,
        /// Buffer length.
        len: usize,
    },

    /// The NVRTC library (`libnvrtc.so`) could not be loaded.
    #[error(
        "NVRTC not found: libnvrtc could not be loaded (add the CUDA toolkit's lib64, e.g. /usr/local/cuda/lib64, to LD_LIBRARY_PATH)"
    )]
    NoNvrtc,

    /// NVRTC rejected a kernel source.
    #[error("NVRTC failed to compile `{program}`: {status}\n{log}")]
    Compile {
        /// Program name given to NVRTC.
        program: String,
        /// The NVRTC status name.
        status: String,
        /// The compiler log.
        log: String,
    },

    /// Kernel arguments that do not fit the kernel's parameter list.
    #[error("kernel `{kernel}` launch arguments: {reason}")]
    LaunchArgs {
        /// Kernel name.
        kernel: String,
        /// What is wrong.
        reason: String,
    },

    /// A launch configuration over a limit of the device or of the kernel (threads per
    /// block, a block or grid dimension, shared memory), refused before the driver is
    /// called. `what` says what is over which limit, whose (the device's or the
    /// kernel's) and its attribute name, e.g. "threads per block exceed the device's
    /// CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK".
    #[error("kernel `{kernel}`: {what}: {requested} requested, limit {limit}")]
    LaunchLimit {
        /// Kernel name.
        kernel: String,
        /// What is over which limit.
        what: &'static str,
        /// What the configuration asks for (threads, blocks or bytes).
        requested: u64,
        /// The most the limit allows.
        limit: u64,
    },

    /// [`Module::global`](crate::Module::global) for a name the module does not define
    /// (`cuModuleGetGlobal_v2` answers `CUDA_ERROR_NOT_FOUND`).
    #[error(
        "the module has no global `{name}` (a `__device__` or `__constant__` variable at namespace scope; C++ names inside a namespace or class are mangled)"
    )]
    GlobalNotFound {
        /// The name looked up.
        name: String,
    },

    /// [`Module::global`](crate::Module::global) with an element type that does not fit
    /// the symbol: its size is not a whole, non-zero number of elements, or its address
    /// is not aligned for the element type.
    #[error("global `{name}` cannot be viewed as {element}: {reason}")]
    GlobalType {
        /// The symbol's name.
        name: String,
        /// The element type asked for.
        element: &'static str,
        /// What does not fit, with both sizes (or the address and alignment).
        reason: String,
    },

    /// A cluster launch whose grid is not a whole number of clusters in some dimension
    /// (`CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`), refused before the driver is called.
    #[error(
        "kernel `{kernel}`: grid {grid:?} is not a whole number of clusters of {cluster:?} blocks (each grid dimension must be a multiple of the cluster's)"
    )]
    ClusterGrid {
        /// Kernel name.
        kernel: String,
        /// The grid, in blocks.
        grid: (u32, u32, u32),
        /// The cluster, in blocks.
        cluster: (u32, u32, u32),
    },

    /// A stream priority outside the device's range
    /// ([`BoundDevice::stream_priority_range`](crate::BoundDevice::stream_priority_range)),
    /// refused rather than clamped by the driver as `cuStreamCreateWithPriority` would.
    /// Lower numbers are higher priorities: the range runs from `greatest` (e.g. -5) to
    /// `least` (0, the default).
    #[error(
        "stream priority {requested} is outside device {device}'s range {greatest}..={least} (lower numbers are higher priorities; {least} is the default)"
    )]
    StreamPriority {
        /// The device's ordinal.
        device: usize,
        /// The priority asked for.
        requested: i32,
        /// The highest priority (numerically the lowest value).
        greatest: i32,
        /// The lowest priority (numerically the highest value, the default).
        least: i32,
    },

    /// [`BoundDevice::enable_peer_access`](crate::BoundDevice::enable_peer_access) for a
    /// pair of devices without peer access (`cuDeviceCanAccessPeer` says no: no NVLink or
    /// PCIe peer path, or an IOMMU in the way).
    #[error(
        "device {device} cannot access device {peer}'s memory directly (cuDeviceCanAccessPeer reports no peer path); copy through host memory instead"
    )]
    NoPeerAccess {
        /// The device that would read and write.
        device: usize,
        /// The device whose memory it would access.
        peer: usize,
    },

    /// [`DevicePool::set`](crate::DevicePool::set) with a value the device (or gpubind,
    /// for a switch other than 0 or 1) refuses.
    #[error("device {device}'s memory pool refused {setting} = {value}: {reason}")]
    PoolSetting {
        /// The device's ordinal.
        device: usize,
        /// The setting's driver name, e.g. `CU_MEMPOOL_ATTR_USED_MEM_HIGH`.
        setting: &'static str,
        /// The value asked for.
        value: u64,
        /// Why: the driver's error (naming `cuMemPoolSetAttribute`), or gpubind's check.
        reason: String,
        /// The driver's result code, when the driver refused.
        code: Option<DriverErrorCode>,
    },

    /// `libcublas` could not be loaded.
    #[error(
        "cuBLAS not found: libcublas could not be loaded (add the CUDA toolkit's lib64, e.g. /usr/local/cuda/lib64, to LD_LIBRARY_PATH)"
    )]
    NoCublas,

    /// A cuBLAS call failed.
    #[error("{call} failed: {status}")]
    Cublas {
        /// The cuBLAS entry point.
        call: &'static str,
        /// The `cublasStatus_t` name.
        status: String,
    },

    /// `libcublasLt` could not be loaded (needed by
    /// `BoundStream::matmul_lt` only, feature `cublas`).
    #[error(
        "cuBLASLt not found: libcublasLt could not be loaded (add the CUDA toolkit's lib64, e.g. /usr/local/cuda/lib64, to LD_LIBRARY_PATH, or set GPUBIND_CUBLASLT_PATH)"
    )]
    NoCublasLt,

    /// A matrix product was refused before it reached cuBLAS: the shape, the buffers or
    /// the options do not fit together (see `gpubind::blas::MatmulError`,
    /// feature `cublas`).
    #[error("{0}")]
    Matmul(MatmulError),

    /// [`GraphExec::update`](crate::GraphExec::update) could not update the
    /// executable graph in place (`CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE`): the new graph
    /// differs in more than parameters. The executable graph is unchanged; instantiate
    /// the new graph instead.
    #[error(
        "the executable graph cannot be updated in place: {reason}; instantiate the new graph instead"
    )]
    GraphUpdate {
        /// Why, from the driver's `CUgraphExecUpdateResult`.
        reason: String,
    },

    /// [`Graph::instantiate_with`](crate::Graph::instantiate_with) was refused one of its
    /// [`InstantiateFlags`](crate::InstantiateFlags): by gpubind (device launch, whose
    /// launches gpubind could not order), or by the driver (the graph does not meet the
    /// flag's requirements, or the driver lacks it). Nothing was instantiated.
    #[error("cannot instantiate the graph with {flags}: {reason}")]
    GraphInstantiate {
        /// The flags refused, as the driver names them
        /// (`CUDA_GRAPH_INSTANTIATE_FLAG_…`, several joined by ` | `).
        flags: String,
        /// Why: gpubind's reason, or the driver's error.
        reason: String,
    },

    /// An operation that cannot be recorded into a CUDA graph (e.g. a collective whose
    /// ranks span several devices driven by one thread, or a `RankComm` of own kernels,
    /// whose ranks meet on the host at every call). Nothing was captured for it; the
    /// capture goes on (return the error from the closure to abandon it).
    #[error("{what} cannot be captured into a CUDA graph: {reason}")]
    NotCapturable {
        /// What was refused, e.g. `an NCCL collective`.
        what: &'static str,
        /// Why, and what can be captured instead.
        reason: String,
    },

    /// A value that the driver would reject or that makes no sense (zero grid, bad name, …).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The device lacks a capability this operation needs, and nothing safe replaces it.
    #[error("device {device} lacks {capability}, which {what} needs{}", hint.map(|h| format!("; {h}")).unwrap_or_default())]
    DeviceLacks {
        /// The device's ordinal.
        device: usize,
        /// The missing capability, e.g. `CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS`.
        capability: &'static str,
        /// What needed it.
        what: &'static str,
        /// What to do instead, if anything.
        hint: Option<&'static str>,
    },
    /// A run-time choice that needs an optional part of gpubind left out of this build:
    /// the collectives' `Backend::Nccl` without the `nccl` feature.
    /// (Whole modules behind a feature are absent instead, a compile-time error.)
    #[error(
        "{what} needs gpubind's `{feature}` feature, which this build leaves out (enable it: gpubind = {{ features = [\"{feature}\"] }})"
    )]
    FeatureDisabled {
        /// The Cargo feature, e.g. `nccl`.
        feature: &'static str,
        /// What needed it, e.g. `the NCCL backend`.
        what: &'static str,
    },

    /// Serialized IPC data (a handle or a socket message) failed validation: bad magic,
    /// unsupported version, checksum mismatch, truncation, malformed fields.
    #[error("corrupt IPC handle or message: {reason}")]
    CorruptHandle {
        /// What was wrong.
        reason: String,
    },

    /// An IPC handle names a device (by UUID) that is not visible in this process.
    #[error(
        "no visible CUDA device has UUID {uuid} (is it hidden by CUDA_VISIBLE_DEVICES in this process?)"
    )]
    UnknownDevice {
        /// The UUID the handle names.
        uuid: crate::uuid::Uuid,
    },

    /// The peer process closed its end of an IPC socket (exited or was killed) before a
    /// message was complete.
    #[error(
        "the IPC peer closed the connection (exited or crashed) before the message was complete"
    )]
    PeerGone,

    /// The process a buffer was handed to (`PoolSlice::lend` / `PoolSlice::share` in
    /// `gpubind::ipc`) sent it back without using it, because it could not take it (a
    /// wrong element type, a device it cannot see, …).
    #[error("the IPC peer refused the hand-off and returned the buffer unused: {reason}")]
    HandoffRefused {
        /// The peer's error, as it described it.
        reason: String,
    },

    /// Exporting from a memory pool that was created without IPC support.
    #[error(
        "this memory pool was not created for IPC; create it with PoolConfig::default().ipc(true) to export it"
    )]
    NotIpcPool,

    /// Importing a handle that this same process exported: the pool (or allocation) is
    /// already owned here, and a second owning slice of it would free and use the same
    /// memory unordered. Use the exporting `ipc::MemoryPool` /
    /// slice directly instead.
    #[error(
        "{what} was exported by this same process: importing it here would give two owners of one allocation (use the exporting pool or slice directly)"
    )]
    SameProcessImport {
        /// What was imported, e.g. `pool 0a1b…` or `legacy IPC handle`.
        what: String,
    },

    /// Importing an allocation that a live slice of this process already maps (the same
    /// buffer handle imported twice, or two handles naming one allocation). Two owning
    /// slices of one mapping would alias and unmap it twice.
    #[error(
        "{what} is already imported in this process and still mapped by a live slice: use that slice, or drop it before importing again"
    )]
    AlreadyImported {
        /// What was imported, e.g. `buffer of pool 0a1b…` or `legacy IPC handle`.
        what: String,
    },

    /// `ipc::LegacyIpcHandle::export` of memory that is
    /// not a whole plain `cuMemAlloc` allocation (pool memory, imported memory, or a
    /// pointer that is not the allocation's base): the handle would describe the wrong
    /// memory to the importer.
    #[error("cannot export this memory as a legacy IPC handle: {reason}")]
    NotLegacyExportable {
        /// Why the memory was refused.
        reason: String,
    },

    /// An operating-system I/O call failed.
    #[error("{what} failed: {message}")]
    Io {
        /// The call, e.g. `recvmsg`.
        what: &'static str,
        /// The error kind.
        kind: std::io::ErrorKind,
        /// The OS error message.
        message: String,
    },

    /// Waiting took longer than allowed: on an IPC socket, for a message from the peer
    /// or (sending) for the peer to read a message that does not fit the socket buffer;
    /// or, in a drop, `into_raw`, `into_vec` or a DLPack export, for a buffer's pending
    /// GPU work (`GPUBIND_DROP_TIMEOUT`; a drop then leaks the memory and logs it, the
    /// others give their input back in a [`GivenBack`](crate::GivenBack)).
    #[error("timed out after {after_ms} ms waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// How long was waited.
        after_ms: u64,
    },

    /// This process ran out of file descriptors while receiving an IPC message: the
    /// kernel could not install the descriptors the message carried (`EMFILE`, the
    /// `RLIMIT_NOFILE` soft limit; or `ENFILE`, the system-wide limit), closed them and
    /// truncated the control data (`MSG_CTRUNC`). Not the peer's fault: close
    /// descriptors here or raise the limit.
    #[error(
        "the receiving process ran out of file descriptors (EMFILE: RLIMIT_NOFILE soft limit {}, or the system-wide ENFILE limit): the kernel dropped the file descriptors of an IPC message after {received} arrived; close descriptors or raise the limit (ulimit -n / setrlimit)",
        fmt_limit(.soft_limit)
    )]
    FdLimit {
        /// Descriptors of the message that did arrive (and are closed again).
        received: usize,
        /// This process's `RLIMIT_NOFILE` soft limit when the error was seen (`None`:
        /// unlimited).
        soft_limit: Option<u64>,
    },

    /// The process at the other end of an IPC socket runs as a user the peer policy
    /// does not allow (`SO_PEERCRED`, checked before anything is sent or received).
    #[error(
        "IPC peer not allowed: the peer process (pid {peer_pid}) runs as uid {peer_uid}, this process as uid {own_uid}, and the peer policy allows {allowed} (use TransportOptions::peer with PeerPolicy::Uids or PeerPolicy::AnyUid to accept it)"
    )]
    PeerNotAllowed {
        /// The peer's process id (as of its `connect`).
        peer_pid: i32,
        /// The peer's effective uid (as of its `connect`).
        peer_uid: u32,
        /// This process's effective uid.
        own_uid: u32,
        /// What the policy allows, in words.
        allowed: String,
    },

    /// An imported buffer was requested as an element type other than the exported one.
    #[error(
        "type mismatch: the handle describes elements of type {handle}, but {requested} was requested"
    )]
    TypeMismatch {
        /// Element type (and size) recorded in the handle.
        handle: String,
        /// Element type (and size) asked for.
        requested: String,
    },

    /// A managed allocation larger than the device's free memory was refused before
    /// asking the driver (over-subscribing managed memory can stall the whole GPU).
    #[error(
        "managed allocation of {requested} bytes refused: device {device} has only {free} bytes free"
    )]
    ManagedTooLarge {
        /// The device ordinal.
        device: usize,
        /// Bytes asked for.
        requested: usize,
        /// Bytes free on the device (`cuMemGetInfo`) at the time of the request.
        free: usize,
    },

    /// Memory viewed as another element type (`transmute`) that does not fit it: its
    /// byte length is not a multiple of the new type's size, or its address is not
    /// aligned for it (or the new type has no size).
    #[error(
        "cannot view {bytes} bytes at {addr:#x} as `{to}` (size {size}, align {align}): {reason}"
    )]
    Transmute {
        /// The new element type.
        to: &'static str,
        /// The memory's length in bytes.
        bytes: usize,
        /// The memory's address.
        addr: u64,
        /// `size_of` the new type.
        size: usize,
        /// `align_of` the new type.
        align: usize,
        /// Why it does not fit.
        reason: TransmuteRefusal,
    },

    /// A DLPack tensor that does not fit what the importer asked for.
    #[error("DLPack {what} mismatch: expected {expected}, found {found}")]
    DlpackMismatch {
        /// What differs: "version", "device", "dtype", "layout" or "shape".
        what: &'static str,
        /// What was required.
        expected: String,
        /// What the tensor has.
        found: String,
    },

    /// A write to memory that is read-only (e.g. a DLPack tensor flagged read-only).
    #[error("{what} is read-only")]
    ReadOnly {
        /// What was written to.
        what: &'static str,
    },

    /// The NCCL library (`libnccl.so.2`) could not be loaded.
    #[error(
        "NCCL not found: libnccl.so.2 could not be loaded (install NCCL and add the directory holding libnccl.so.2 to LD_LIBRARY_PATH, or set GPUBIND_NCCL_PATH to its path)"
    )]
    NoNccl,

    /// An NCCL call returned an error.
    #[error("{call} failed: {name} ({description})")]
    Nccl {
        /// The NCCL entry point, e.g. `ncclAllReduce`.
        call: &'static str,
        /// The raw `ncclResult_t`.
        code: i32,
        /// The result's name, e.g. `ncclInvalidUsage`.
        name: String,
        /// `ncclGetErrorString`.
        description: String,
    },

    /// Two ranks of one NCCL communicator on the same device (NCCL refuses this in one
    /// process; the own-kernel backend allows it).
    #[error(
        "NCCL needs a distinct device per rank in one process: ranks {first} and {second} are both on device {ordinal} (use Backend::Kernels for several ranks on one GPU)"
    )]
    DuplicateDevice {
        /// The shared device.
        ordinal: usize,
        /// The first rank on it.
        first: usize,
        /// The second rank on it.
        second: usize,
    },

    /// A launcher environment variable (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
    /// `GPUBIND_RDZV_PORT`, `SLURM_PROCID`, …) that is missing, not a number, out of
    /// range or inconsistent with another (see `gpubind::collective::LaunchEnv`).
    #[error("launcher environment: {variable}: {reason}")]
    LaunchEnv {
        /// The variable, e.g. `WORLD_SIZE`.
        variable: String,
        /// What is wrong with it, and what to set.
        reason: String,
    },

    /// The multi-process rendezvous failed on bad input: a frame that is not gpubind's
    /// (wrong magic, version or checksum), two processes with one rank, ranks launched
    /// with different world sizes, a rank out of range, a port that cannot be used. Every
    /// rank that reached rank 0 gets the same error (rank 0 sends it to each).
    #[error("rendezvous failed: {reason}")]
    Rendezvous {
        /// What was wrong.
        reason: String,
    },

    /// Another rank failed: it exited, crashed or closed its connection part-way, or
    /// reported an error of its own.
    #[error("rank {rank} failed: {reason}")]
    PeerFailed {
        /// The rank that failed.
        rank: usize,
        /// What was seen.
        reason: String,
    },

    /// Other ranks did not do their part within the timeout (the rendezvous timeout,
    /// `GPUBIND_RDZV_TIMEOUT`, or the one given to NCCL's initialisation).
    #[error(
        "timed out after {after_ms} ms waiting for {what} (missing: {})",
        fmt_ranks(.ranks)
    )]
    PeerTimeout {
        /// What was awaited.
        what: String,
        /// The ranks that did not arrive (empty: not known, e.g. inside NCCL).
        ranks: Vec<usize>,
        /// How long was waited.
        after_ms: u64,
    },

    /// A sticky error (an illegal address, a device-side assert, …) made the device's
    /// context unusable; every later operation on the device reports this at once.
    /// Recovery: drop every gpubind value of the device, reset its primary context
    /// (`Device::reset_primary_context`, when no other library uses it) and `Device::get`
    /// it again, or restart the process (see below).
    ///
    /// Some CUDA errors — an illegal address, a misaligned access, an illegal instruction, a
    /// device-side `assert`, a hardware stack error — are *sticky*: the context is unusable
    /// from then on, and every later call in it fails the same way, whatever it was. Without
    /// help, the error surfaces at some unrelated later call (`cuMemcpyDtoH_v2 failed:
    /// CUDA_ERROR_ILLEGAL_ADDRESS`), and drops call into the dead context.
    ///
    /// gpubind recognises these codes where a call on a device's context or streams returns
    /// them (synchronisations, copies, launches, allocations, stream and event creation,
    /// event waits, memory queries: every such call passes its result through
    /// `Device::check` of the operation's own device, never a guess from the current
    /// context), and marks that [`Device`](crate::Device) **poisoned** with the first
    /// failing call, its code and the last kernel launched on the device. From then on:
    ///
    /// * every operation on the device returns [`Error::ContextPoisoned`] at once, without
    ///   calling into the context (binding, allocation, copies, launches, stream work);
    /// * drops skip their driver calls and leak instead (`Device::enter` refuses), so nothing
    ///   touches the dead context;
    /// * **recovery**: CUDA documents these errors as fatal to the process, and the H200
    ///   (driver 580) behaves so: after a null-pointer write, neither releasing gpubind's
    ///   retain nor [`Device::reset_primary_context`](crate::Device::reset_primary_context)
    ///   made a new retain succeed — it reported the sticky error again (typed: the fresh
    ///   [`Device`](crate::Device) is poisoned in turn). **Restart the process.** Where a
    ///   driver does clear the state, the path is: drop every gpubind value of the device,
    ///   [`Device::reset_primary_context`](crate::Device::reset_primary_context) (`unsafe`:
    ///   other libraries sharing the primary context lose everything in it), then
    ///   [`Device::get`](crate::Device::get) a fresh device.
    ///   ([`Device::is_poisoned`](crate::Device::is_poisoned) tells whether a live device
    ///   is.)
    #[error(
        "device {device}'s context is poisoned: {first_call} failed with {name} ({description}){}; it is unusable now — drop every gpubind value of device {device} (buffers, streams, modules, Arc<Device>), then Device::reset_primary_context({device}) (if no other library uses the context) and Device::get again, or restart the process",
        kernel.as_deref().map(|k| format!(" after kernel `{k}`")).unwrap_or_default()
    )]
    ContextPoisoned {
        /// The device ordinal.
        device: usize,
        /// The first call that reported the sticky error.
        first_call: &'static str,
        /// Its result code.
        code: DriverErrorCode,
        /// `cuGetErrorName`.
        name: String,
        /// `cuGetErrorString`.
        description: String,
        /// The last kernel launched on the device before the failure, when known.
        kernel: Option<String>,
    },
}

impl Error {
    /// Builds [`Error::Driver`] from a result code (a [`DriverErrorCode`], or cudarc's
    /// `CUresult` of a driver call made directly), asking the driver for its name and
    /// description.
    pub fn driver(call: &'static str, code: impl Into<DriverErrorCode>) -> Self {
        let code = code.into();
        let (name, description) = Error::driver_names(code.0);
        Error::Driver {
            call,
            code,
            name,
            description,
        }
    }

    /// `cuGetErrorName` and `cuGetErrorString` of `code`.
    pub(crate) fn driver_names(code: CUresult) -> (String, String) {
        if !crate::loader::loadable(&["cuda", "nvcuda"]) {
            // `Error::driver` is public: without libcuda, asking it would panic in
            // cudarc's loader. The name is known without it.
            return (
                DriverErrorCode(code).name(),
                "no description (no CUDA driver loaded)".to_owned(),
            );
        }
        let err = cudarc::driver::DriverError(code);
        let name = err
            .error_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("{code:?}"));
        let description = err
            .error_string()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "no description".to_owned());
        (name, description)
    }

    /// The driver result code, where this is a driver error (or a poisoned context).
    pub fn driver_code(&self) -> Option<DriverErrorCode> {
        match self {
            Error::Driver { code, .. } | Error::ContextPoisoned { code, .. } => Some(*code),
            Error::PoolSetting { code, .. } => *code,
            _ => None,
        }
    }
}

/// A list of ranks for a message: `rank(s) 1, 3`, or `unknown ranks`.
fn fmt_ranks(ranks: &[usize]) -> String {
    if ranks.is_empty() {
        return "unknown ranks".to_owned();
    }
    let list: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
    format!("rank(s) {}", list.join(", "))
}

/// An rlimit for a message: the number, or `unlimited`.
fn fmt_limit(limit: &Option<u64>) -> String {
    limit.map_or_else(|| "unlimited".to_owned(), |n| n.to_string())
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The step of a drop that waits for the resource's pending stream-ordered uses.
pub(crate) const WAIT: &str = "waiting for its pending uses";
/// The step of a drop that makes the resource's context current.
pub(crate) const ENTER: &str = "entering its device's context";
/// The step of a drop that frees, unloads or destroys the resource.
pub(crate) const RELEASE: &str = "releasing it";

/// After a failed wait: nothing is released while the device may still use it.
pub(crate) const LEAKED_UNWAITED: &str =
    "it is leaked, not released, because the device may still use it";
/// After a failed context push: the release call was never made.
pub(crate) const LEAKED: &str = "it is leaked (not released)";
/// After a release call that failed.
pub(crate) const MAYBE_LEAKED: &str = "the driver did not release it, so it may be leaked";

/// Reports a failure a `Drop` cannot return, at warn level through the `log` facade
/// (which costs nothing without a logger):
/// `gpubind: dropping {what} (device {d}): {step}: {error}; {outcome}`.
pub(crate) fn report_drop(
    what: fmt::Arguments<'_>,
    device: Option<usize>,
    step: &str,
    error: &Error,
    outcome: &str,
) {
    match device {
        Some(d) => {
            log::warn!("gpubind: dropping {what} (device {d}): {step}: {error}; {outcome}")
        }
        None => log::warn!("gpubind: dropping {what}: {step}: {error}; {outcome}"),
    }
}

mod matmul;
pub use matmul::MatmulError;

#[cfg(test)]
mod tests;
