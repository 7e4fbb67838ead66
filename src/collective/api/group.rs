//! [`Group`]: the calls of one thread for every rank of a [`Communicator`], recorded by
//! [`ThreadContext::group`] and enqueued together.

use super::call::{Buf, Call, Kind, buf, make_call, rank_error, uses};
use super::communicator::Communicator;
use super::types::{CollectiveType, DType, Op};
use crate::access::{Access, AccessTracker};
use crate::context::ThreadContext;
use crate::error::Result;
use crate::memory::{DeviceMemory, DeviceMemoryMut};
use std::marker::PhantomData;

/// The calls of one rank set, recorded by [`ThreadContext::group`] and enqueued when
/// its closure returns. `'b` is how long the group borrows the buffers given to it.
pub struct Group<'c, 'b> {
    comm: &'c Communicator,
    calls: Vec<Call>,
    /// Each call's buffers: `(rank, tracker, how the collective uses it)`.
    tracked: Vec<(usize, &'b AccessTracker, Access)>,
    _buffers: PhantomData<&'b mut ()>,
}

impl std::fmt::Debug for Group<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("communicator", self.comm)
            .field("calls", &self.calls.len())
            .field("buffers", &self.tracked.len())
            .finish()
    }
}

impl ThreadContext {
    /// Records the collective calls `f` makes on `g` for any of `comm`'s ranks and
    /// enqueues them when `f` returns `Ok` (nothing is enqueued if it fails), binding
    /// each rank's device for its calls. Returns once everything is enqueued; use
    /// [`Communicator::synchronize`] (or events on [`Communicator::stream`]) to wait.
    ///
    /// Every rank must make the same collective calls in the same order (NCCL's rule);
    /// a mismatch is an error before anything is enqueued.
    pub fn group<'c, 'b, F>(&mut self, comm: &'c Communicator, f: F) -> Result<()>
    where
        F: FnOnce(&mut Group<'c, 'b>) -> Result<()>,
    {
        let mut g = Group {
            comm,
            calls: Vec::new(),
            tracked: Vec::new(),
            _buffers: PhantomData,
        };
        f(&mut g)?;
        comm.run(self, &g.calls, &g.tracked)
    }
}

impl<'c, 'b> Group<'c, 'b> {
    fn push<T: CollectiveType>(
        &mut self,
        rank: usize,
        kind: Kind,
        send: Option<Buf<'b>>,
        recv: Option<Buf<'b>>,
    ) -> Result<()> {
        let dtype = DType::of::<T>();
        let n = self.comm.len();
        let device = self
            .comm
            .device(rank)
            .ok_or_else(|| rank_error("rank", rank, n))?;
        let call = make_call(n, rank, device, kind, dtype, send, recv)?;
        self.calls.push(call);
        self.tracked
            .extend(uses(send, recv).into_iter().map(|(t, a)| (rank, t, a)));
        Ok(())
    }

    /// Rank `rank`'s part of an all-reduce: `recv = op(send of every rank)`.
    pub fn all_reduce<T: CollectiveType>(
        &mut self,
        rank: usize,
        send: &'b impl DeviceMemory<T>,
        recv: &'b mut impl DeviceMemoryMut<T>,
        op: Op,
    ) -> Result<()> {
        self.push::<T>(rank, Kind::AllReduce(op), Some(buf(send)), Some(buf(recv)))
    }

    /// Rank `rank`'s part of an in-place all-reduce: `data = op(data of every rank)`,
    /// `data` claimed as one write (see
    /// [`RankComm::all_reduce_in_place`](super::RankComm::all_reduce_in_place)).
    pub fn all_reduce_in_place<T: CollectiveType>(
        &mut self,
        rank: usize,
        data: &'b mut impl DeviceMemoryMut<T>,
        op: Op,
    ) -> Result<()> {
        let b = buf(data);
        self.push::<T>(rank, Kind::AllReduce(op), Some(b), Some(b))
    }

    /// Rank `rank`'s part of a reduce to `root`: only the root's `recv` is written
    /// (every rank passes one of the same length, as in NCCL).
    pub fn reduce<T: CollectiveType>(
        &mut self,
        rank: usize,
        send: &'b impl DeviceMemory<T>,
        recv: &'b mut impl DeviceMemoryMut<T>,
        op: Op,
        root: usize,
    ) -> Result<()> {
        self.push::<T>(
            rank,
            Kind::Reduce(op, root),
            Some(buf(send)),
            Some(buf(recv)),
        )
    }

    /// Rank `rank`'s part of an in-place broadcast: `root`'s `buf` is copied into every
    /// other rank's `buf`.
    pub fn broadcast<T: CollectiveType>(
        &mut self,
        rank: usize,
        buf_: &'b mut impl DeviceMemoryMut<T>,
        root: usize,
    ) -> Result<()> {
        let b = buf(buf_);
        self.push::<T>(rank, Kind::Broadcast(root), Some(b), Some(b))
    }

    /// Rank `rank`'s part of an all-gather: `recv[r*n..(r+1)*n] = send of rank r`,
    /// `recv.len() == nranks * send.len()`.
    pub fn all_gather<T: CollectiveType>(
        &mut self,
        rank: usize,
        send: &'b impl DeviceMemory<T>,
        recv: &'b mut impl DeviceMemoryMut<T>,
    ) -> Result<()> {
        self.push::<T>(rank, Kind::AllGather, Some(buf(send)), Some(buf(recv)))
    }

    /// Rank `rank`'s part of a reduce-scatter: `recv = op(block rank of every send)`,
    /// `send.len() == nranks * recv.len()`.
    pub fn reduce_scatter<T: CollectiveType>(
        &mut self,
        rank: usize,
        send: &'b impl DeviceMemory<T>,
        recv: &'b mut impl DeviceMemoryMut<T>,
        op: Op,
    ) -> Result<()> {
        self.push::<T>(
            rank,
            Kind::ReduceScatter(op),
            Some(buf(send)),
            Some(buf(recv)),
        )
    }

    /// Rank `rank` sends `data` to `peer`, which must post a matching
    /// [`recv`](Self::recv) in the same group.
    pub fn send<T: CollectiveType>(
        &mut self,
        rank: usize,
        data: &'b impl DeviceMemory<T>,
        peer: usize,
    ) -> Result<()> {
        self.push::<T>(rank, Kind::Send(peer), Some(buf(data)), None)
    }

    /// Rank `rank` receives into `data` from `peer`.
    pub fn recv<T: CollectiveType>(
        &mut self,
        rank: usize,
        data: &'b mut impl DeviceMemoryMut<T>,
        peer: usize,
    ) -> Result<()> {
        self.push::<T>(rank, Kind::Recv(peer), None, Some(buf(data)))
    }
}
