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

mod launch_env;
mod rendezvous;
mod unique_id;
mod wire;

pub use launch_env::{
    CHECK_VAR, DEFAULT_PORT, DEFAULT_TIMEOUT, LaunchEnv, Launcher, PORT_VAR, TIMEOUT_VAR,
};
pub use unique_id::{NCCL_UNIQUE_ID_BYTES, NcclUniqueId};
pub use wire::PROTOCOL_VERSION;
pub(super) use wire::{Frame, Kind, ReadFail, decode_error, encode_error, read_frame, write_frame};
