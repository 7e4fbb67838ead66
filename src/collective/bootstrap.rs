//! One rank per process: the launcher's environment ([`LaunchEnv`]), NCCL's unique id
//! as a value ([`NcclUniqueId`]), and the TCP rendezvous that hands rank 0's id to every
//! other rank ([`LaunchEnv::exchange_id`]) with bounded waits and typed errors.
//!
//! See docs/collective.md, "Deployment", for the launcher table, the port choice, the
//! wire format and the failure semantics.
//!
//! # Wire format (version 2)
//!
//! Every message is one frame, all integers little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `GBRZ` |
//! | 2 | protocol version (2) |
//! | 1 | kind: 1 hello, 2 id, 3 ack, 4 go, 5 abort, 6 call, 7 agreed |
//! | 1 | reserved, 0 |
//! | 4 | world size of the sender's job |
//! | 4 | rank (hello, ack: the sender's; id, go, abort: the addressee's) |
//! | 4 | payload length (at most 4096) |
//! | n | payload (hello: nothing, or flags u8 — bit 0: the rank keeps the connection to agree on every collective, see `callcheck`; id: the 128 id bytes; abort: the error, see `encode_error`; call: a collective's header) |
//! | 8 | FNV-1a 64 of everything before it |
//!
//! A peer connects to rank 0 and sends `hello`; once every rank has checked in, rank 0
//! sends each `id`, waits for every `ack`, then sends `go`. Any failure on rank 0 sends
//! `abort` (carrying the typed error) to every rank connected so far. Version 2 added the
//! hello's flags and the `call`/`agreed` frames of the per-collective agreement
//! (`callcheck`), which goes on over the same connections.

use crate::error::{Error, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Size of an NCCL unique id (`NCCL_UNIQUE_ID_BYTES` in nccl.h).
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// NCCL's `ncclUniqueId`: 128 opaque bytes made by rank 0 ([`NcclUniqueId::new`]) that
/// every rank passes to [`RankComm::init_process`](super::RankComm::init_process).
///
/// It moves between processes as bytes ([`as_bytes`](Self::as_bytes),
/// [`from_bytes`](Self::from_bytes)) or as 256 hex digits (`Display`, `FromStr`), so any
/// channel works; [`LaunchEnv::exchange_id`] is gpubind's own. `Debug` shows only the
/// first 8 bytes.
///
/// ```
/// use gpubind::collective::NcclUniqueId;
/// let id = NcclUniqueId::from_bytes(&[7u8; 128])?;
/// let text = id.to_string();
/// assert_eq!(text.len(), 256);
/// assert_eq!(text.parse::<NcclUniqueId>()?, id);
/// assert!("nope".parse::<NcclUniqueId>().is_err());
/// # Ok::<(), gpubind::Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NcclUniqueId([u8; NCCL_UNIQUE_ID_BYTES]);

impl NcclUniqueId {
    /// A fresh id from `ncclGetUniqueId` (rank 0 only: it also starts NCCL's bootstrap
    /// listener in this process). [`Error::NoNccl`] without the library,
    /// [`Error::FeatureDisabled`] without the `nccl` feature. Needs no GPU.
    pub fn new() -> Result<Self> {
        super::nccl::unique_id_bytes().map(NcclUniqueId)
    }

    /// The id from its 128 bytes ([`Error::InvalidArgument`] for any other length).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let arr: [u8; NCCL_UNIQUE_ID_BYTES] = bytes.try_into().map_err(|_| {
            Error::InvalidArgument(format!(
                "an NCCL unique id is {NCCL_UNIQUE_ID_BYTES} bytes, got {}",
                bytes.len()
            ))
        })?;
        Ok(NcclUniqueId(arr))
    }

    /// The 128 bytes.
    pub fn as_bytes(&self) -> &[u8; NCCL_UNIQUE_ID_BYTES] {
        &self.0
    }
}

impl std::fmt::Display for NcclUniqueId {
    /// 256 lowercase hex digits.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for NcclUniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclUniqueId(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

impl std::str::FromStr for NcclUniqueId {
    type Err = Error;

    /// Exactly 256 hex digits (either case).
    fn from_str(s: &str) -> Result<Self> {
        let bad = |why: String| Error::InvalidArgument(format!("not an NCCL unique id: {why}"));
        if s.len() != 2 * NCCL_UNIQUE_ID_BYTES {
            return Err(bad(format!(
                "{} characters, expected {} hex digits",
                s.len(),
                2 * NCCL_UNIQUE_ID_BYTES
            )));
        }
        let mut out = [0u8; NCCL_UNIQUE_ID_BYTES];
        for (i, pair) in s.as_bytes().chunks(2).enumerate() {
            let text = std::str::from_utf8(pair).map_err(|_| bad("not ASCII".into()))?;
            out[i] = u8::from_str_radix(text, 16)
                .map_err(|_| bad(format!("{text:?} at offset {} is not hex", 2 * i)))?;
        }
        Ok(NcclUniqueId(out))
    }
}

/// Which launcher's variables a [`LaunchEnv`] was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Launcher {
    /// `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`: torchrun and the
    /// launchers that copy it (`torch.distributed.launch`, DeepSpeed, Accelerate).
    Torch,
    /// Open MPI's `mpirun`: `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, `_LOCAL_SIZE`.
    OpenMpi,
    /// MPICH / Intel MPI (Hydra): `PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`,
    /// `MPI_LOCALNRANKS`.
    Mpich,
    /// Slurm's `srun`: `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`,
    /// `SLURM_NTASKS_PER_NODE` (when a plain number), `SLURM_NNODES`.
    Slurm,
}

/// `(launcher, rank, world size, local rank, local world size)` variables, in the order
/// they are tried: the first launcher whose rank variable is set wins.
///
/// torchrun first: under `srun torchrun …` the Slurm variables describe the torchrun
/// agent, not the worker. MPI before Slurm: under `mpirun` in a Slurm allocation,
/// `SLURM_PROCID` belongs to the MPI daemon of the node.
const LAUNCHERS: [(Launcher, &str, &str, &str, &str); 4] = [
    (
        Launcher::Torch,
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
    ),
    (
        Launcher::OpenMpi,
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    (
        Launcher::Mpich,
        "PMI_RANK",
        "PMI_SIZE",
        "MPI_LOCALRANKID",
        "MPI_LOCALNRANKS",
    ),
    (
        Launcher::Slurm,
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_LOCALID",
        "SLURM_NTASKS_PER_NODE",
    ),
];

/// gpubind's rendezvous port variable.
pub const PORT_VAR: &str = "GPUBIND_RDZV_PORT";
/// gpubind's rendezvous timeout variable (seconds, may have a fraction).
pub const TIMEOUT_VAR: &str = "GPUBIND_RDZV_TIMEOUT";
/// The port when neither `GPUBIND_RDZV_PORT` nor `MASTER_PORT` is set: PyTorch's
/// default `MASTER_PORT` (29500) plus one.
pub const DEFAULT_PORT: u16 = 29501;
/// gpubind's variable that turns the agreement on every NCCL collective across processes
/// off (`0`, `false`, `off`, `no`) or on (`1`, `true`, `on`, `yes`; the default): see
/// [`LaunchEnv::check_calls`].
pub const CHECK_VAR: &str = "GPUBIND_CHECK_CALLS";
/// The rendezvous (and NCCL init) timeout when `GPUBIND_RDZV_TIMEOUT` is not set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Where this process sits in a multi-process job, read from the launcher's environment
/// ([`from_env`](Self::from_env)); see docs/collective.md, "Deployment".
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LaunchEnv {
    /// Whose variables these are.
    pub launcher: Launcher,
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// Number of ranks (processes) in the job.
    pub world_size: usize,
    /// This process's index on its machine: the usual device ordinal to use.
    pub local_rank: usize,
    /// Processes on this machine, when the launcher says.
    pub local_world_size: Option<usize>,
    /// Rank 0's host (`MASTER_ADDR`; `127.0.0.1` for a one-machine job without it).
    pub master_addr: String,
    /// The port rank 0 serves the id on (`GPUBIND_RDZV_PORT`, else `MASTER_PORT + 1`,
    /// else [`DEFAULT_PORT`]).
    pub port: u16,
    /// Bound on every wait of the rendezvous and of NCCL's initialisation
    /// (`GPUBIND_RDZV_TIMEOUT` seconds, else [`DEFAULT_TIMEOUT`]).
    pub timeout: Duration,
    /// Whether [`RankComm::from_launch`](super::RankComm::from_launch) makes the ranks
    /// agree on every collective (op, type, length, root) through rank 0 before NCCL
    /// enqueues it, so that a mismatch is the same typed error on every rank instead of
    /// a hang or corrupt data (`GPUBIND_CHECK_CALLS`, default on; it costs one round
    /// trip to rank 0 per collective: docs/collective.md, "Ranks agree before NCCL
    /// enqueues"). Every rank must use the same setting (checked at the rendezvous).
    pub check_calls: bool,
}

fn env_err(variable: &str, reason: impl Into<String>) -> Error {
    Error::LaunchEnv {
        variable: variable.to_owned(),
        reason: reason.into(),
    }
}

impl LaunchEnv {
    /// Reads the process environment (see [`from_vars`](Self::from_vars)).
    pub fn from_env() -> Result<LaunchEnv> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Reads the variables through `get` (a name to its value, `None` if unset).
    ///
    /// The first launcher whose rank variable is set supplies rank, world size, local
    /// rank and local world size (torchrun, then Open MPI, then MPICH, then Slurm); its
    /// world size must be set too. Then `MASTER_ADDR`, the port and the timeout (see
    /// the fields). Every missing, unparsable or inconsistent value is
    /// [`Error::LaunchEnv`] naming the variable.
    ///
    /// ```
    /// use gpubind::collective::{LaunchEnv, Launcher};
    /// let vars = [("RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1"),
    ///             ("MASTER_ADDR", "node0"), ("MASTER_PORT", "29500")];
    /// let env = LaunchEnv::from_vars(|k| {
    ///     vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    /// })?;
    /// assert_eq!((env.launcher, env.rank, env.world_size), (Launcher::Torch, 1, 4));
    /// assert_eq!((env.master_addr.as_str(), env.port), ("node0", 29501));
    /// # Ok::<(), gpubind::Error>(())
    /// ```
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv> {
        let get = |name: &str| get(name).map(|v| v.trim().to_owned());
        let number = |name: &str| -> Result<Option<usize>> {
            match get(name) {
                None => Ok(None),
                Some(v) => v
                    .parse::<usize>()
                    .map(Some)
                    .map_err(|_| env_err(name, format!("{v:?} is not a non-negative integer"))),
            }
        };
        let Some(&(launcher, rank_var, world_var, local_var, local_world_var)) =
            LAUNCHERS.iter().find(|l| get(l.1).is_some())
        else {
            return Err(env_err(
                "RANK",
                "no launcher variables found: run under torchrun, mpirun or srun, or set RANK, WORLD_SIZE and LOCAL_RANK (and MASTER_ADDR for more than one machine)",
            ));
        };
        let rank = number(rank_var)?.unwrap_or(0);
        let world_size = number(world_var)?
            .ok_or_else(|| env_err(world_var, format!("not set, but {rank_var} is")))?;
        if world_size == 0 {
            return Err(env_err(world_var, "is 0: a job has at least one rank"));
        }
        if rank >= world_size {
            return Err(env_err(
                rank_var,
                format!("{rank} is out of range for {world_var}={world_size}"),
            ));
        }
        let local_world_size = match launcher {
            // "2(x3)" and lists are legal Slurm values: use only a plain number.
            Launcher::Slurm => get(local_world_var).and_then(|v| v.parse::<usize>().ok()),
            _ => number(local_world_var)?,
        };
        let local_rank = match number(local_var)? {
            Some(l) => l,
            None if world_size == 1 => 0,
            None => {
                return Err(env_err(
                    local_var,
                    format!(
                        "not set, but {rank_var} is: set it to this process's index on its machine (its GPU)"
                    ),
                ));
            }
        };
        if let Some(lw) = local_world_size {
            if lw == 0 || lw > world_size {
                return Err(env_err(
                    local_world_var,
                    format!("{lw} is not in 1..={world_size} ({world_var})"),
                ));
            }
            if local_rank >= lw {
                return Err(env_err(
                    local_var,
                    format!("{local_rank} is out of range for {local_world_var}={lw}"),
                ));
            }
        }
        let single_machine = world_size == 1
            || local_world_size == Some(world_size)
            || (launcher == Launcher::Slurm && get("SLURM_NNODES").as_deref() == Some("1"));
        let master_addr = match get("MASTER_ADDR") {
            Some(a) if !a.is_empty() => a,
            Some(_) => return Err(env_err("MASTER_ADDR", "is empty")),
            None if single_machine => "127.0.0.1".to_owned(),
            None => {
                return Err(env_err(
                    "MASTER_ADDR",
                    "not set, and the job may span machines: set it to rank 0's host name or address (under Slurm: export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1))",
                ));
            }
        };
        let port_of = |name: &str, v: &str| -> Result<u16> {
            match v.parse::<u16>() {
                Ok(p) if p > 0 => Ok(p),
                _ => Err(env_err(
                    name,
                    format!("{v:?} is not a TCP port (1..=65535)"),
                )),
            }
        };
        let port = match (get(PORT_VAR), get("MASTER_PORT")) {
            (Some(v), _) => port_of(PORT_VAR, &v)?,
            (None, Some(v)) => {
                let master = port_of("MASTER_PORT", &v)?;
                master.checked_add(1).ok_or_else(|| {
                    env_err(
                        "MASTER_PORT",
                        format!("is 65535, so gpubind's default port (MASTER_PORT + 1) does not exist: set {PORT_VAR}"),
                    )
                })?
            }
            (None, None) => DEFAULT_PORT,
        };
        let check_calls = match get(CHECK_VAR).map(|v| v.to_ascii_lowercase()).as_deref() {
            None | Some("1" | "true" | "on" | "yes") => true,
            Some("0" | "false" | "off" | "no") => false,
            Some(v) => {
                return Err(env_err(
                    CHECK_VAR,
                    format!("{v:?} is not one of 1/true/on/yes or 0/false/off/no"),
                ));
            }
        };
        let timeout = match get(TIMEOUT_VAR) {
            None => DEFAULT_TIMEOUT,
            Some(v) => match v.parse::<f64>() {
                Ok(s) if s.is_finite() && s > 0.0 && s < 1e9 => Duration::from_secs_f64(s),
                _ => {
                    return Err(env_err(
                        TIMEOUT_VAR,
                        format!("{v:?} is not a positive number of seconds"),
                    ));
                }
            },
        };
        Ok(LaunchEnv {
            launcher,
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            port,
            timeout,
            check_calls,
        })
    }

    /// The same environment with another timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The same environment with the agreement on every collective on or off (see
    /// [`check_calls`](Self::check_calls)).
    pub fn with_call_check(mut self, on: bool) -> Self {
        self.check_calls = on;
        self
    }

    /// Gets the job's NCCL unique id: rank 0 makes it ([`NcclUniqueId::new`]) and serves
    /// it over TCP on `port`; every other rank connects to `master_addr:port` and
    /// receives it. See [`exchange_id_with`](Self::exchange_id_with).
    pub fn exchange_id(&self) -> Result<NcclUniqueId> {
        self.exchange_id_with(NcclUniqueId::new)
    }

    /// [`exchange_id`](Self::exchange_id) with rank 0's id made by `make_id` (called on
    /// rank 0 only, once every rank has checked in): any 128 bytes, for tests or for an
    /// id made elsewhere.
    ///
    /// Returns once every rank has the id and acknowledged it, so no rank starts NCCL
    /// with a wrong world. Every wait is bounded by `timeout` (peers wait a quarter
    /// longer, at least 2 s, for rank 0's verdict). Errors, the same on every rank that reached rank 0:
    /// [`Error::Rendezvous`] (garbage, wrong version, duplicate rank, different world
    /// sizes, a port in use), [`Error::PeerFailed`] (a rank closed its connection
    /// part-way), [`Error::PeerTimeout`] naming the ranks that never came. A rank that
    /// never reached rank 0 gets [`Error::PeerTimeout`] naming rank 0. A world of one
    /// rank opens no socket.
    pub fn exchange_id_with(
        &self,
        make_id: impl FnOnce() -> Result<NcclUniqueId>,
    ) -> Result<NcclUniqueId> {
        self.exchange(make_id, 0).map(|(id, _)| id)
    }

    /// [`exchange_id_with`](Self::exchange_id_with), keeping the rendezvous connections
    /// as the job's [`CallCheck`](super::CallCheck), through which the ranks agree on
    /// every collective before NCCL enqueues it (`None` for a world of one, which has
    /// nobody to disagree with). Every rank of the job must call this one (rank 0
    /// refuses a mix with a `Rendezvous` error naming [`CHECK_VAR`]).
    /// [`RankComm::from_launch`](super::RankComm::from_launch) uses it when
    /// [`check_calls`](Self::check_calls) is on.
    pub fn exchange_id_checked_with(
        &self,
        make_id: impl FnOnce() -> Result<NcclUniqueId>,
    ) -> Result<(NcclUniqueId, Option<super::CallCheck>)> {
        let (id, links) = self.exchange(make_id, HELLO_CHECKS_CALLS)?;
        let check = match links {
            Links::None => None,
            Links::Rank0(streams) => Some(super::CallCheck::rank0(streams, self.timeout)),
            Links::Peer(stream) => Some(super::CallCheck::peer(
                stream,
                self.rank,
                self.world_size,
                self.timeout,
            )),
        };
        Ok((id, check))
    }

    fn exchange(
        &self,
        make_id: impl FnOnce() -> Result<NcclUniqueId>,
        flags: u8,
    ) -> Result<(NcclUniqueId, Links)> {
        if self.rank >= self.world_size {
            return Err(Error::InvalidArgument(format!(
                "rank {} is out of range for a world of {}",
                self.rank, self.world_size
            )));
        }
        let deadline = super::deadline_after(self.timeout);
        if self.world_size == 1 {
            return Ok((make_id()?, Links::None));
        }
        if u32::try_from(self.world_size).is_err() {
            return Err(Error::InvalidArgument(format!(
                "world size {} is too large",
                self.world_size
            )));
        }
        if self.rank == 0 {
            let (id, streams) = serve(self, deadline, make_id, flags)?;
            Ok((id, Links::Rank0(streams)))
        } else {
            let (id, stream) = join(self, deadline, flags)?;
            Ok((id, Links::Peer(stream)))
        }
    }
}

/// The connections a rendezvous leaves: none (a world of one), rank 0's one per rank
/// (`None` at its own index), or a rank's one to rank 0.
enum Links {
    None,
    Rank0(Vec<Option<TcpStream>>),
    Peer(TcpStream),
}

/// Hello flag: the rank keeps the connection for the per-collective agreement.
const HELLO_CHECKS_CALLS: u8 = 1;

// ---------------------------------------------------------------------------------------
// Frames

const MAGIC: [u8; 4] = *b"GBRZ";
/// The protocol version this build speaks (2: the hello's flags and the per-collective
/// `call`/`agreed` frames).
pub const PROTOCOL_VERSION: u16 = 2;
const HEADER: usize = 20;
const MAX_PAYLOAD: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Hello = 1,
    Id = 2,
    Ack = 3,
    Go = 4,
    Abort = 5,
    /// A rank's header of its next collective (to rank 0).
    Call = 6,
    /// Rank 0's verdict: every rank called the same collective.
    Agreed = 7,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Hello,
            2 => Kind::Id,
            3 => Kind::Ack,
            4 => Kind::Go,
            5 => Kind::Abort,
            6 => Kind::Call,
            7 => Kind::Agreed,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Frame {
    pub(super) kind: Kind,
    pub(super) world: u32,
    pub(super) rank: u32,
    pub(super) payload: Vec<u8>,
}

fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

fn encode(f: &Frame) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER + f.payload.len() + 8);
    v.extend_from_slice(&MAGIC);
    v.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    v.push(f.kind as u8);
    v.push(0);
    v.extend_from_slice(&f.world.to_le_bytes());
    v.extend_from_slice(&f.rank.to_le_bytes());
    v.extend_from_slice(&(f.payload.len() as u32).to_le_bytes());
    v.extend_from_slice(&f.payload);
    let sum = fnv1a64(&[&v]);
    v.extend_from_slice(&sum.to_le_bytes());
    v
}

/// Why a frame could not be read.
#[derive(Debug)]
pub(super) enum ReadFail {
    /// The peer closed the connection after `got` bytes of the frame.
    Closed { got: usize },
    /// Nothing complete before the deadline.
    TimedOut,
    /// Bytes that are not a frame of this version.
    Garbage(String),
    /// Another I/O error.
    Io(std::io::Error),
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Checks a frame header (magic, version, kind, length).
fn check_header(h: &[u8; HEADER]) -> std::result::Result<(Kind, u32, u32, usize), String> {
    if h[..4] != MAGIC {
        return Err(format!("bad magic {:02x?} (expected \"GBRZ\")", &h[..4]));
    }
    let version = u16::from_le_bytes([h[4], h[5]]);
    if version != PROTOCOL_VERSION {
        return Err(format!(
            "protocol version {version}, this build of gpubind speaks version {PROTOCOL_VERSION} (all ranks must run the same gpubind)"
        ));
    }
    let kind = Kind::from_u8(h[6]).ok_or_else(|| format!("unknown frame kind {}", h[6]))?;
    let len = le_u32(&h[16..20]) as usize;
    if len > MAX_PAYLOAD {
        return Err(format!(
            "payload of {len} bytes, more than the {MAX_PAYLOAD} allowed"
        ));
    }
    Ok((kind, le_u32(&h[8..12]), le_u32(&h[12..16]), len))
}

/// Decodes one whole frame from `bytes` (which must hold exactly one).
#[cfg(test)]
fn decode(bytes: &[u8]) -> std::result::Result<Frame, String> {
    let header: &[u8; HEADER] = bytes
        .get(..HEADER)
        .and_then(|h| h.try_into().ok())
        .ok_or("truncated header")?;
    let (kind, world, rank, len) = check_header(header)?;
    if bytes.len() != HEADER + len + 8 {
        return Err(format!("{} bytes for a payload of {len}", bytes.len()));
    }
    let body = &bytes[..HEADER + len];
    check_sum(body, &bytes[HEADER + len..])?;
    Ok(Frame {
        kind,
        world,
        rank,
        payload: bytes[HEADER..HEADER + len].to_vec(),
    })
}

fn check_sum(body: &[u8], sum: &[u8]) -> std::result::Result<(), String> {
    let expected = fnv1a64(&[body]);
    let mut s = [0u8; 8];
    s.copy_from_slice(sum);
    let found = u64::from_le_bytes(s);
    if found != expected {
        return Err(format!(
            "checksum mismatch (frame says {found:016x}, contents give {expected:016x})"
        ));
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes before `deadline`; `done` bytes of the frame came
/// before (for [`ReadFail::Closed`]).
fn read_full(
    s: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
    done: usize,
) -> std::result::Result<(), ReadFail> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadFail::TimedOut);
        }
        s.set_read_timeout(Some(left)).map_err(ReadFail::Io)?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(ReadFail::Closed { got: done + got }),
            Ok(n) => got += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(ReadFail::TimedOut);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionReset
                        | ErrorKind::ConnectionAborted
                        | ErrorKind::BrokenPipe
                ) =>
            {
                return Err(ReadFail::Closed { got: done + got });
            }
            Err(e) => return Err(ReadFail::Io(e)),
        }
    }
    Ok(())
}

pub(super) fn read_frame(
    s: &mut TcpStream,
    deadline: Instant,
) -> std::result::Result<Frame, ReadFail> {
    let mut header = [0u8; HEADER];
    // The magic first: a stranger speaking another protocol is named as such even if it
    // sent fewer bytes than a header.
    read_full(s, &mut header[..4], deadline, 0)?;
    if header[..4] != MAGIC {
        return Err(ReadFail::Garbage(format!(
            "bad magic {:02x?} (expected \"GBRZ\")",
            &header[..4]
        )));
    }
    read_full(s, &mut header[4..], deadline, 4)?;
    let (kind, world, rank, len) = check_header(&header).map_err(ReadFail::Garbage)?;
    let mut rest = vec![0u8; len + 8];
    read_full(s, &mut rest, deadline, HEADER)?;
    let mut body = header.to_vec();
    body.extend_from_slice(&rest[..len]);
    check_sum(&body, &rest[len..]).map_err(ReadFail::Garbage)?;
    rest.truncate(len);
    Ok(Frame {
        kind,
        world,
        rank,
        payload: rest,
    })
}

pub(super) fn write_frame(s: &mut TcpStream, f: &Frame, deadline: Instant) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    s.set_write_timeout(Some(left.max(Duration::from_millis(1))))?;
    s.write_all(&encode(f))?;
    s.flush()
}

// An error carried by an abort frame: code u8 (1 Rendezvous, 2 PeerFailed, 3
// PeerTimeout, 4 InvalidArgument: a collective mismatch), rank u32, after_ms u64, n u16,
// n ranks u32, then the text (reason or what), UTF-8.
pub(super) fn encode_error(e: &Error) -> Vec<u8> {
    let (code, rank, after, ranks, text): (u8, usize, u64, &[usize], String) = match e {
        Error::Rendezvous { reason } => (1, 0, 0, &[], reason.clone()),
        Error::InvalidArgument(text) => (4, 0, 0, &[], text.clone()),
        Error::PeerFailed { rank, reason } => (2, *rank, 0, &[], reason.clone()),
        Error::PeerTimeout {
            what,
            ranks,
            after_ms,
        } => (3, 0, *after_ms, ranks.as_slice(), what.clone()),
        other => (1, 0, 0, &[], format!("rank 0 failed: {other}")),
    };
    let mut v = vec![code];
    v.extend_from_slice(&(rank as u32).to_le_bytes());
    v.extend_from_slice(&after.to_le_bytes());
    let n = ranks.len().min(256);
    v.extend_from_slice(&(n as u16).to_le_bytes());
    for &r in &ranks[..n] {
        v.extend_from_slice(&(r as u32).to_le_bytes());
    }
    let room = MAX_PAYLOAD.saturating_sub(v.len());
    let mut cut = text.len().min(room);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    v.extend_from_slice(&text.as_bytes()[..cut]);
    v
}

pub(super) fn decode_error(p: &[u8]) -> Error {
    let undecodable = || Error::Rendezvous {
        reason: "rank 0 aborted the rendezvous with an undecodable reason".into(),
    };
    if p.len() < 15 {
        return undecodable();
    }
    let code = p[0];
    let rank = le_u32(&p[1..5]) as usize;
    let after_ms = u64::from_le_bytes(p[5..13].try_into().unwrap_or([0; 8]));
    let n = u16::from_le_bytes([p[13], p[14]]) as usize;
    let Some(list) = p.get(15..15 + 4 * n) else {
        return undecodable();
    };
    let ranks: Vec<usize> = list.chunks(4).map(|c| le_u32(c) as usize).collect();
    let text = String::from_utf8_lossy(&p[15 + 4 * n..]).into_owned();
    match code {
        1 => Error::Rendezvous { reason: text },
        2 => Error::PeerFailed { rank, reason: text },
        3 => Error::PeerTimeout {
            what: text,
            ranks,
            after_ms,
        },
        4 => Error::InvalidArgument(text),
        _ => undecodable(),
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

// ---------------------------------------------------------------------------------------
// Rank 0

/// One connection that checked in (or tried to).
struct Peer {
    stream: TcpStream,
    addr: SocketAddr,
}

/// The listening address for rank 0: the wildcard of `MASTER_ADDR`'s family, or the
/// loopback address itself when `MASTER_ADDR` is one (a one-machine job is not exposed).
fn listen_addr(env: &LaunchEnv) -> SocketAddr {
    let resolved = (env.master_addr.as_str(), env.port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next());
    match resolved {
        Some(a) if a.ip().is_loopback() => a,
        Some(SocketAddr::V6(_)) => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), env.port),
        _ => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), env.port),
    }
}

fn serve(
    env: &LaunchEnv,
    deadline: Instant,
    make_id: impl FnOnce() -> Result<NcclUniqueId>,
    flags: u8,
) -> Result<(NcclUniqueId, Vec<Option<TcpStream>>)> {
    let addr = listen_addr(env);
    let listener = TcpListener::bind(addr).map_err(|e| Error::Rendezvous {
        reason: format!(
            "rank 0 cannot listen on {addr}: {e}{}",
            if e.kind() == ErrorKind::AddrInUse {
                format!(
                    " (is another job, or torchrun's store on MASTER_PORT, using port {}? set {PORT_VAR} to a free port, the same on every rank)",
                    env.port
                )
            } else {
                String::new()
            }
        ),
    })?;
    let io = |what: &'static str| {
        move |e: std::io::Error| Error::Io {
            what,
            kind: e.kind(),
            message: e.to_string(),
        }
    };
    listener
        .set_nonblocking(true)
        .map_err(io("setting the rendezvous listener non-blocking"))?;
    let world = env.world_size;
    let mut peers: Vec<Option<Peer>> = (0..world).map(|_| None).collect();
    // Connections that broke a rule: they are told why, then dropped.
    let mut offenders: Vec<TcpStream> = Vec::new();
    let started = Instant::now();
    let outcome = (|| -> Result<NcclUniqueId> {
        loop {
            let missing: Vec<usize> = (1..world).filter(|&r| peers[r].is_none()).collect();
            if missing.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Error::PeerTimeout {
                    what: format!("every rank to check in at rank 0 (port {})", env.port),
                    ranks: missing,
                    after_ms: ms(started.elapsed()),
                });
            }
            let (mut stream, from) = match listener.accept() {
                Ok(c) => c,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                // EMFILE: rank 0 holds one connection per rank until the end.
                Err(e) if e.raw_os_error() == Some(24) => {
                    return Err(Error::Rendezvous {
                        reason: format!(
                            "rank 0 ran out of file descriptors ({e}) holding one connection per rank for a world of {world}: raise its limit (ulimit -n) above the world size"
                        ),
                    });
                }
                Err(e) => return Err(io("accepting a rendezvous connection")(e)),
            };
            stream
                .set_nonblocking(false)
                .map_err(io("setting a rendezvous connection blocking"))?;
            let _ = stream.set_nodelay(true);
            // A silent connection may hold the loop up for a while, not until the end.
            let hello_by = deadline.min(Instant::now() + Duration::from_secs(10));
            let hello = match read_frame(&mut stream, hello_by) {
                Ok(f) => f,
                Err(ReadFail::Garbage(why)) => {
                    offenders.push(stream);
                    return Err(Error::Rendezvous {
                        reason: format!(
                            "a connection from {from} sent bytes that are not a gpubind rendezvous hello: {why}"
                        ),
                    });
                }
                Err(ReadFail::Closed { got: 0 }) | Err(ReadFail::TimedOut) => {
                    log::warn!(
                        "gpubind rendezvous: a connection from {from} sent nothing; ignored"
                    );
                    continue;
                }
                Err(ReadFail::Closed { got }) => {
                    return Err(Error::Rendezvous {
                        reason: format!(
                            "a connection from {from} closed after {got} bytes of its hello (a rank that exited or crashed while checking in)"
                        ),
                    });
                }
                Err(ReadFail::Io(e)) => {
                    log::warn!("gpubind rendezvous: reading a hello from {from}: {e}; ignored");
                    continue;
                }
            };
            let (r, w) = (hello.rank as usize, hello.world as usize);
            let reject = if hello.kind != Kind::Hello {
                Some(format!(
                    "a connection from {from} sent a {:?} frame where a hello was due",
                    hello.kind
                ))
            } else if w != world {
                Some(format!(
                    "rank {r} (at {from}) was launched with a world size of {w}, rank 0 with {world}: all ranks must come from one launch"
                ))
            } else if r == 0 || r >= world {
                Some(format!(
                    "a process at {from} claims rank {r}, which is not in 1..{world} (rank 0 is this process)"
                ))
            } else if hello.payload.first().copied().unwrap_or(0) != flags {
                let on = |f: u8| {
                    if f & HELLO_CHECKS_CALLS != 0 {
                        "on"
                    } else {
                        "off"
                    }
                };
                Some(format!(
                    "rank {r} (at {from}) has the agreement on every collective {}, rank 0 has it {} ({CHECK_VAR}, or RankComm::from_launch on one rank and exchange_id on another): set it alike on every rank",
                    on(hello.payload.first().copied().unwrap_or(0)),
                    on(flags)
                ))
            } else {
                peers[r].as_ref().map(|first| {
                    format!(
                        "rank {r} checked in twice (from {} and from {from}): two processes have the same rank",
                        first.addr
                    )
                })
            };
            if let Some(reason) = reject {
                offenders.push(stream);
                return Err(Error::Rendezvous { reason });
            }
            peers[r] = Some(Peer { stream, addr: from });
        }
        let id = make_id()?;
        let w = world as u32;
        for (r, p) in peers.iter_mut().enumerate() {
            if let Some(p) = p {
                let f = Frame {
                    kind: Kind::Id,
                    world: w,
                    rank: r as u32,
                    payload: id.as_bytes().to_vec(),
                };
                write_frame(&mut p.stream, &f, deadline).map_err(|e| Error::PeerFailed {
                    rank: r,
                    reason: format!("sending it the id failed: {e} (it exited or crashed)"),
                })?;
            }
        }
        for (r, p) in peers.iter_mut().enumerate() {
            if let Some(p) = p {
                match read_frame(&mut p.stream, deadline) {
                    Ok(f) if f.kind == Kind::Ack && f.rank as usize == r => {}
                    Ok(f) => {
                        return Err(Error::Rendezvous {
                            reason: format!(
                                "rank {r} answered the id with a {:?} frame for rank {}, not its ack",
                                f.kind, f.rank
                            ),
                        });
                    }
                    Err(ReadFail::Closed { .. }) => {
                        return Err(Error::PeerFailed {
                            rank: r,
                            reason: "it closed its connection before acknowledging the id (it exited or crashed)".into(),
                        });
                    }
                    Err(ReadFail::TimedOut) => {
                        return Err(Error::PeerTimeout {
                            what: "the ranks to acknowledge the id".into(),
                            ranks: vec![r],
                            after_ms: ms(started.elapsed()),
                        });
                    }
                    Err(ReadFail::Garbage(why)) => {
                        return Err(Error::Rendezvous {
                            reason: format!("rank {r} answered the id with garbage: {why}"),
                        });
                    }
                    Err(ReadFail::Io(e)) => {
                        return Err(Error::PeerFailed {
                            rank: r,
                            reason: format!("reading its ack failed: {e}"),
                        });
                    }
                }
            }
        }
        for (r, p) in peers.iter_mut().enumerate() {
            if let Some(p) = p {
                let f = Frame {
                    kind: Kind::Go,
                    world: w,
                    rank: r as u32,
                    payload: Vec::new(),
                };
                write_frame(&mut p.stream, &f, deadline).map_err(|e| Error::PeerFailed {
                    rank: r,
                    reason: format!("sending it the go-ahead failed: {e} (it exited or crashed)"),
                })?;
            }
        }
        Ok(id)
    })();
    if let Err(e) = &outcome {
        // Tell everyone connected (best effort, briefly): they return the same error.
        let payload = encode_error(e);
        let tell_by = Instant::now() + Duration::from_millis(500);
        let streams = peers
            .iter_mut()
            .enumerate()
            .filter_map(|(r, p)| p.as_mut().map(|p| (r as u32, &mut p.stream)))
            .chain(offenders.iter_mut().map(|s| (u32::MAX, s)));
        for (r, s) in streams {
            let f = Frame {
                kind: Kind::Abort,
                world: world as u32,
                rank: r,
                payload: payload.clone(),
            };
            let _ = write_frame(s, &f, tell_by);
        }
    }
    let id = outcome?;
    // The connections stay open for the per-collective agreement (dropped, i.e. closed,
    // by a plain `exchange_id`).
    Ok((id, peers.into_iter().map(|p| p.map(|p| p.stream)).collect()))
}

// ---------------------------------------------------------------------------------------
// Other ranks

fn join(env: &LaunchEnv, deadline: Instant, flags: u8) -> Result<(NcclUniqueId, TcpStream)> {
    let started = Instant::now();
    let target = format!("{}:{}", env.master_addr, env.port);
    let never_came = |what: String| Error::PeerTimeout {
        what,
        ranks: vec![0],
        after_ms: ms(started.elapsed()),
    };
    // Connect, retrying while rank 0 is not listening yet (resolving again each time:
    // rank 0's name may not resolve before its machine is up).
    let mut last_error = String::from("no attempt");
    let mut stream = loop {
        if Instant::now() >= deadline {
            return Err(never_came(format!(
                "rank 0 to accept a connection at {target} (last error: {last_error})"
            )));
        }
        let addrs: Vec<SocketAddr> = match (env.master_addr.as_str(), env.port).to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => {
                last_error = format!("cannot resolve MASTER_ADDR={}: {e}", env.master_addr);
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        let mut connected = None;
        for a in &addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match TcpStream::connect_timeout(a, left.min(Duration::from_secs(2))) {
                Ok(s) => {
                    connected = Some(s);
                    break;
                }
                Err(e) => last_error = format!("{a}: {e}"),
            }
        }
        match connected {
            Some(s) => break s,
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let _ = stream.set_nodelay(true);
    let (w, me) = (env.world_size as u32, env.rank as u32);
    let frame = |kind| Frame {
        kind,
        world: w,
        rank: me,
        payload: Vec::new(),
    };
    let lost = |e: std::io::Error| Error::PeerFailed {
        rank: 0,
        reason: format!(
            "the connection to rank 0 at {target} broke: {e} (rank 0 exited or crashed)"
        ),
    };
    let hello = Frame {
        payload: vec![flags],
        ..frame(Kind::Hello)
    };
    write_frame(&mut stream, &hello, deadline).map_err(lost)?;
    // Rank 0 decides at its own deadline, which may be a little after ours (it may have
    // started later): wait a quarter longer, at least 2 s, for its verdict (which names
    // the missing ranks).
    let verdict_by = deadline
        .checked_add((env.timeout / 4).max(Duration::from_secs(2)))
        .unwrap_or(deadline);
    let expect = |stream: &mut TcpStream, want: Kind, stage: &str| -> Result<Frame> {
        let f = read_frame(stream, verdict_by).map_err(|fail| match fail {
            ReadFail::Closed { .. } => Error::PeerFailed {
                rank: 0,
                reason: format!(
                    "rank 0 closed the connection before {stage} (it exited or crashed)"
                ),
            },
            ReadFail::TimedOut => never_came(format!("rank 0 to send {stage}")),
            ReadFail::Garbage(why) => Error::Rendezvous {
                reason: format!(
                    "{target} answered with bytes that are not a gpubind rendezvous frame ({why}): is {PORT_VAR} (default MASTER_PORT + 1) another service's port? all ranks must run the same gpubind"
                ),
            },
            ReadFail::Io(e) => lost(e),
        })?;
        if f.kind == Kind::Abort {
            return Err(decode_error(&f.payload));
        }
        if f.kind != want || f.rank != me || f.world != w {
            return Err(Error::Rendezvous {
                reason: format!(
                    "rank 0 sent a {:?} frame for rank {} of {} where {stage} for rank {me} of {w} was due",
                    f.kind, f.rank, f.world
                ),
            });
        }
        Ok(f)
    };
    let id_frame = expect(&mut stream, Kind::Id, "the id")?;
    let id = NcclUniqueId::from_bytes(&id_frame.payload).map_err(|_| Error::Rendezvous {
        reason: format!(
            "rank 0 sent an id of {} bytes, not {NCCL_UNIQUE_ID_BYTES}",
            id_frame.payload.len()
        ),
    })?;
    write_frame(&mut stream, &frame(Kind::Ack), verdict_by).map_err(lost)?;
    expect(&mut stream, Kind::Go, "the go-ahead")?;
    Ok((id, stream))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> Result<LaunchEnv> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchEnv::from_vars(|k| map.get(k).cloned())
    }

    fn variable(e: Error) -> String {
        match e {
            Error::LaunchEnv { variable, .. } => variable,
            other => panic!("expected LaunchEnv, got {other:?}"),
        }
    }

    #[test]
    fn torchrun_variables() {
        let e = env_of(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29400"),
            // Slurm around torchrun: the torchrun variables win.
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "4"),
        ])
        .unwrap();
        assert_eq!(e.launcher, Launcher::Torch);
        assert_eq!((e.rank, e.world_size, e.local_rank), (3, 8, 1));
        assert_eq!(e.local_world_size, Some(2));
        assert_eq!((e.master_addr.as_str(), e.port), ("10.0.0.1", 29401));
        assert_eq!(e.timeout, DEFAULT_TIMEOUT);
    }

    #[test]
    fn open_mpi_mpich_and_slurm_variables() {
        let ompi = env_of(&[
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "6"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "3"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("MASTER_ADDR", "head"),
        ])
        .unwrap();
        assert_eq!(ompi.launcher, Launcher::OpenMpi, "MPI wins over Slurm");
        assert_eq!((ompi.rank, ompi.world_size, ompi.local_rank), (5, 6, 2));
        assert_eq!(ompi.port, DEFAULT_PORT);

        let mpich = env_of(&[
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
            ("MPI_LOCALRANKID", "1"),
            ("MPI_LOCALNRANKS", "2"),
        ])
        .unwrap();
        assert_eq!(mpich.launcher, Launcher::Mpich);
        // One machine (local size == world size): loopback without MASTER_ADDR.
        assert_eq!(mpich.master_addr, "127.0.0.1");

        let slurm = env_of(&[
            ("SLURM_PROCID", "7"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "3"),
            ("SLURM_NTASKS_PER_NODE", "4(x2)"),
            ("MASTER_ADDR", "node001"),
            ("GPUBIND_RDZV_PORT", "40000"),
            ("MASTER_PORT", "29500"),
            ("GPUBIND_RDZV_TIMEOUT", "2.5"),
        ])
        .unwrap();
        assert_eq!(slurm.launcher, Launcher::Slurm);
        assert_eq!((slurm.rank, slurm.local_rank), (7, 3));
        assert_eq!(slurm.local_world_size, None, "4(x2) is not a plain number");
        assert_eq!(slurm.port, 40000, "GPUBIND_RDZV_PORT wins over MASTER_PORT");
        assert_eq!(slurm.timeout, Duration::from_millis(2500));

        let one_node = env_of(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NNODES", "1"),
        ])
        .unwrap();
        assert_eq!(one_node.master_addr, "127.0.0.1");
    }

    #[test]
    fn bad_launcher_values_are_typed_errors() {
        let base = [("MASTER_ADDR", "h"), ("LOCAL_RANK", "0")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v: Vec<(&str, &str)> = base.to_vec();
            v.extend_from_slice(extra);
            env_of(&v)
        };
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[], "RANK"),
            (&[("RANK", "0")], "WORLD_SIZE"),
            (&[("RANK", "x"), ("WORLD_SIZE", "2")], "RANK"),
            (&[("RANK", "-1"), ("WORLD_SIZE", "2")], "RANK"),
            (&[("RANK", "2"), ("WORLD_SIZE", "2")], "RANK"),
            (&[("RANK", "0"), ("WORLD_SIZE", "0")], "WORLD_SIZE"),
            (&[("RANK", "0"), ("WORLD_SIZE", "two")], "WORLD_SIZE"),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("LOCAL_WORLD_SIZE", "3"),
                ],
                "LOCAL_WORLD_SIZE",
            ),
            (
                &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "65535")],
                "MASTER_PORT",
            ),
            (
                &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "http")],
                "MASTER_PORT",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("GPUBIND_RDZV_PORT", "0"),
                ],
                "GPUBIND_RDZV_PORT",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("GPUBIND_RDZV_TIMEOUT", "-3"),
                ],
                "GPUBIND_RDZV_TIMEOUT",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("GPUBIND_RDZV_TIMEOUT", "inf"),
                ],
                "GPUBIND_RDZV_TIMEOUT",
            ),
        ];
        for (vars, var) in cases {
            let e = with(vars).expect_err(&format!("{vars:?} must fail"));
            let msg = e.to_string();
            assert_eq!(variable(e), *var, "{vars:?}: {msg}");
        }
        // LOCAL_RANK out of LOCAL_WORLD_SIZE; LOCAL_RANK missing for a world of 2.
        let e = env_of(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "2"),
            ("LOCAL_WORLD_SIZE", "2"),
        ])
        .unwrap_err();
        assert_eq!(variable(e), "LOCAL_RANK");
        let e = env_of(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]).unwrap_err();
        assert_eq!(variable(e), "LOCAL_RANK");
        // Two machines possible and no MASTER_ADDR.
        let e = env_of(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")]).unwrap_err();
        assert_eq!(variable(e), "MASTER_ADDR");
        // A world of one needs nothing else.
        let one = env_of(&[("RANK", "0"), ("WORLD_SIZE", "1")]).unwrap();
        assert_eq!((one.local_rank, one.master_addr.as_str()), (0, "127.0.0.1"));
    }

    #[test]
    fn id_hex_round_trip_and_bad_text() {
        let mut bytes = [0u8; 128];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 37 + 11) as u8;
        }
        let id = NcclUniqueId::from_bytes(&bytes).unwrap();
        let hex = id.to_string();
        assert_eq!(hex.len(), 256);
        assert_eq!(hex.parse::<NcclUniqueId>().unwrap(), id);
        assert_eq!(hex.to_uppercase().parse::<NcclUniqueId>().unwrap(), id);
        assert_eq!(id.as_bytes(), &bytes);
        assert!(format!("{id:?}").starts_with("NcclUniqueId(0b30"));
        assert!(NcclUniqueId::from_bytes(&bytes[..127]).is_err());
        assert!(hex[..254].parse::<NcclUniqueId>().is_err());
        let mut bad = hex.clone();
        bad.replace_range(10..12, "zz");
        let e = bad.parse::<NcclUniqueId>().unwrap_err();
        assert!(e.to_string().contains("offset 10"), "{e}");
        let mut multibyte = hex[..254].to_string();
        multibyte.push('é');
        assert!(matches!(
            multibyte.parse::<NcclUniqueId>(),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn frames_round_trip_and_corruption_is_caught() {
        let f = Frame {
            kind: Kind::Id,
            world: 4,
            rank: 2,
            payload: vec![9; 128],
        };
        let bytes = encode(&f);
        assert_eq!(bytes.len(), HEADER + 128 + 8);
        assert_eq!(decode(&bytes).unwrap(), f);
        // Every single-bit flip anywhere is refused (magic, version, kind, length,
        // payload or checksum).
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                assert!(
                    decode(&b).is_err(),
                    "flip of bit {bit} of byte {i} accepted"
                );
            }
        }
        // Every truncation is refused.
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err());
        }
        let mut wrong_version = bytes.clone();
        wrong_version[4] = 3;
        assert!(decode(&wrong_version).unwrap_err().contains("version 3"));
        let mut wrong_magic = bytes.clone();
        wrong_magic[0] = b'X';
        assert!(decode(&wrong_magic).unwrap_err().contains("magic"));
        let mut huge = bytes.clone();
        huge[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&huge).unwrap_err().contains("more than"));
    }

    #[test]
    fn abort_payload_carries_the_typed_error() {
        let errors = [
            Error::Rendezvous {
                reason: "rank 1 checked in twice".into(),
            },
            Error::PeerFailed {
                rank: 3,
                reason: "gone".into(),
            },
            Error::PeerTimeout {
                what: "ranks".into(),
                ranks: vec![2, 5],
                after_ms: 1500,
            },
            Error::InvalidArgument("collective mismatch: rank 0 called …".into()),
        ];
        for e in errors {
            assert_eq!(decode_error(&encode_error(&e)), e);
        }
        assert!(matches!(
            decode_error(&encode_error(&Error::NoNccl)),
            Error::Rendezvous { reason } if reason.contains("NCCL not found")
        ));
        assert!(matches!(decode_error(&[1, 2]), Error::Rendezvous { .. }));
        let long = Error::Rendezvous {
            reason: "é".repeat(4000),
        };
        assert!(encode_error(&long).len() <= MAX_PAYLOAD);
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_never_panic_the_decoders(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
        ) {
            let _ = decode(&bytes);
            let _ = decode_error(&bytes);
            let _ = LaunchEnv::from_vars(|k| {
                (k == "RANK" || k == "WORLD_SIZE")
                    .then(|| String::from_utf8_lossy(&bytes).into_owned())
            });
        }

        #[test]
        fn a_frame_with_a_valid_header_and_a_random_body_is_refused(
            world in 1u32..100, rank in 0u32..100,
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
        ) {
            let mut bytes = encode(&Frame { kind: Kind::Hello, world, rank, payload: body.clone() });
            // Replace the checksum with body-derived bytes unless they happen to agree.
            let n = bytes.len();
            let fake: [u8; 8] = std::array::from_fn(|i| body.get(i).copied().unwrap_or(0));
            if bytes[n - 8..] != fake {
                bytes[n - 8..].copy_from_slice(&fake);
                proptest::prop_assert!(decode(&bytes).is_err());
            }
        }
    }

    #[test]
    fn unique_id_needs_nccl_not_a_gpu() {
        match NcclUniqueId::new() {
            Ok(a) => {
                // Two ids differ (each names its own bootstrap listener and a random magic).
                let b = NcclUniqueId::new().unwrap();
                assert_ne!(a, b);
            }
            Err(e) => assert!(
                matches!(e, Error::NoNccl | Error::FeatureDisabled { .. }),
                "{e:?}"
            ),
        }
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn local(rank: usize, world: usize, port: u16, timeout_ms: u64) -> LaunchEnv {
        LaunchEnv {
            launcher: Launcher::Torch,
            rank,
            world_size: world,
            local_rank: rank,
            local_world_size: Some(world),
            master_addr: "127.0.0.1".into(),
            port,
            timeout: Duration::from_millis(timeout_ms),
            check_calls: true,
        }
    }

    #[test]
    fn threads_rendezvous_on_loopback() {
        let port = free_port();
        let id = NcclUniqueId::from_bytes(&[42; 128]).unwrap();
        let got: Vec<Result<NcclUniqueId>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|r| s.spawn(move || local(r, 4, port, 5000).exchange_id_with(|| Ok(id))))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for g in got {
            assert_eq!(g.unwrap(), id);
        }
    }

    #[test]
    fn world_of_one_opens_no_socket() {
        let id = NcclUniqueId::from_bytes(&[1; 128]).unwrap();
        // Port 1 would need privileges: nothing is bound.
        assert_eq!(local(0, 1, 1, 100).exchange_id_with(|| Ok(id)).unwrap(), id);
    }

    #[test]
    fn missing_rank_times_out_on_every_rank_naming_it() {
        let port = free_port();
        let id = NcclUniqueId::from_bytes(&[3; 128]).unwrap();
        let t0 = Instant::now();
        let got: Vec<Result<NcclUniqueId>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| s.spawn(move || local(r, 3, port, 800).exchange_id_with(|| Ok(id))))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(t0.elapsed() < Duration::from_secs(3));
        for g in got {
            match g {
                Err(Error::PeerTimeout { ranks, .. }) => assert_eq!(ranks, vec![2]),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn rank0_failing_to_make_the_id_fails_every_rank() {
        let port = free_port();
        let got: Vec<Result<NcclUniqueId>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    s.spawn(move || local(r, 2, port, 3000).exchange_id_with(|| Err(Error::NoNccl)))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(got[0], Err(Error::NoNccl));
        assert!(
            matches!(&got[1], Err(Error::Rendezvous { reason }) if reason.contains("NCCL not found")),
            "{:?}",
            got[1]
        );
    }
}
