//! Handle bundles: pool handles (with their descriptors) and buffer handles sent as one
//! sealed message.

use super::{Message, TransportOptions, recv_message_with, send_message_with};
use crate::error::{Error, Result};
use crate::ipc::handle::{BufferHandle, PoolHandle};
use crate::ipc::wire::{self, Kind, corrupt};
use serde::{Deserialize, Serialize};
use std::os::unix::net::UnixStream;
use std::time::Duration;

#[derive(Serialize)]
struct BundleOut<'a> {
    pools: &'a [PoolHandle],
    buffers: &'a [BufferHandle],
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BundleIn {
    pools: Vec<PoolHandle>,
    buffers: Vec<BufferHandle>,
}

/// Sends pool handles (their descriptors by `SCM_RIGHTS`) and buffer handles as one
/// message: a sealed (checksummed) bundle plus one descriptor per pool, in order.
///
/// The handles stay valid here; the peer receives duplicates of the descriptors. Uses
/// the default [`TransportOptions`]; see [`send_handles_with`].
pub fn send_handles(
    stream: &UnixStream,
    pools: &[PoolHandle],
    buffers: &[BufferHandle],
) -> Result<()> {
    send_handles_with(stream, pools, buffers, &TransportOptions::default())
}

/// [`send_handles`] with a timeout and peer policy of your choice.
pub fn send_handles_with(
    stream: &UnixStream,
    pools: &[PoolHandle],
    buffers: &[BufferHandle],
    options: &TransportOptions,
) -> Result<()> {
    let fds = pools
        .iter()
        .enumerate()
        .map(|(i, p)| {
            p.fd().ok_or_else(|| {
                Error::InvalidArgument(format!("pool handle {i} has no file descriptor to send"))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes = wire::seal(Kind::Bundle, &BundleOut { pools, buffers })?;
    send_message_with(stream, &bytes, &fds, options)
}

/// [`recv_handles_with`] with the default [`TransportOptions`] ([`DEFAULT_TIMEOUT`](super::DEFAULT_TIMEOUT),
/// [`PeerPolicy::SameUid`](super::PeerPolicy::SameUid)).
pub fn recv_handles(stream: &UnixStream) -> Result<(Vec<PoolHandle>, Vec<BufferHandle>)> {
    recv_handles_with(stream, &TransportOptions::default())
}

/// [`recv_handles_with`] with `timeout` and [`PeerPolicy::SameUid`](super::PeerPolicy::SameUid).
pub fn recv_handles_timeout(
    stream: &UnixStream,
    timeout: Duration,
) -> Result<(Vec<PoolHandle>, Vec<BufferHandle>)> {
    recv_handles_with(stream, &TransportOptions::default().timeout(timeout))
}

/// Receives what [`send_handles`] sent: pool handles with their descriptors attached and
/// validated buffer handles. Errors as [`recv_message_with`], and
/// [`Error::CorruptHandle`] for a bundle that does not open or validate.
pub fn recv_handles_with(
    stream: &UnixStream,
    options: &TransportOptions,
) -> Result<(Vec<PoolHandle>, Vec<BufferHandle>)> {
    let Message { bytes, fds } = recv_message_with(stream, options)?;
    let bundle: BundleIn = wire::open(Kind::Bundle, &bytes)?;
    if bundle.pools.len() != fds.len() {
        return Err(corrupt(format!(
            "bundle has {} pool handles but {} file descriptors arrived",
            bundle.pools.len(),
            fds.len()
        )));
    }
    for b in &bundle.buffers {
        b.validate()?;
    }
    let pools = bundle
        .pools
        .into_iter()
        .zip(fds)
        .map(|(p, fd)| p.with_fd(fd))
        .collect();
    Ok((pools, bundle.buffers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Uuid;
    use crate::ipc::handle::{PoolId, tests::sample_buffer};
    use crate::ipc::socket::send_message;
    use crate::ipc::socket::tests::{SHORT, pipe_with, read_fd};
    use std::os::fd::{AsFd, OwnedFd};

    #[test]
    fn handles_travel_with_their_fds() {
        let (a, b) = UnixStream::pair().unwrap();
        let pools: Vec<_> = (0..2u8)
            .map(|i| {
                let fd: OwnedFd = pipe_with(&[b'a' + i]).into();
                PoolHandle::new(PoolId::fresh().unwrap(), Uuid([i; 16]), i as usize, fd)
            })
            .collect();
        let buffers: Vec<_> = (0..32).map(|i| sample_buffer(i + 1, i as u8)).collect();
        send_handles(&a, &pools, &buffers).unwrap();
        let (got_pools, got_buffers) = recv_handles(&b).unwrap();
        assert_eq!(got_buffers, buffers);
        assert_eq!(got_pools.len(), 2);
        for (i, (mut got, sent)) in got_pools.into_iter().zip(&pools).enumerate() {
            assert_eq!(got.pool_id(), sent.pool_id());
            assert_eq!(got.device_uuid(), sent.device_uuid());
            assert_eq!(read_fd(got.take_fd().unwrap()), [b'a' + i as u8]);
        }
    }

    #[test]
    fn handle_bundle_errors() {
        // A pool handle without a descriptor cannot be sent.
        let (a, b) = UnixStream::pair().unwrap();
        let fd: OwnedFd = pipe_with(b"").into();
        let mut h = PoolHandle::new(PoolId::fresh().unwrap(), Uuid([0; 16]), 0, fd);
        drop(h.take_fd());
        assert!(matches!(
            send_handles(&a, &[h], &[]),
            Err(Error::InvalidArgument(_))
        ));
        // A plain message that is not a bundle.
        send_message(&a, b"not a bundle", &[]).unwrap();
        assert!(matches!(
            recv_handles_timeout(&b, SHORT),
            Err(Error::CorruptHandle { .. })
        ));
        // A bundle whose checksum was damaged in flight.
        let mut bytes = wire::seal(
            Kind::Bundle,
            &BundleOut {
                pools: &[],
                buffers: &[sample_buffer(3, 3)],
            },
        )
        .unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x20;
        send_message(&a, &bytes, &[]).unwrap();
        assert!(matches!(
            recv_handles_timeout(&b, SHORT),
            Err(Error::CorruptHandle { .. })
        ));
        // A bundle with a descriptor too many: rejected, and the descriptor is closed.
        let bytes = wire::seal(
            Kind::Bundle,
            &BundleOut {
                pools: &[],
                buffers: &[],
            },
        )
        .unwrap();
        let extra = pipe_with(b"");
        send_message(&a, &bytes, &[extra.as_fd()]).unwrap();
        assert!(matches!(
            recv_handles_timeout(&b, SHORT),
            Err(Error::CorruptHandle { .. })
        ));
    }
}
