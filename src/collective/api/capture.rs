//! Collectives captured into a CUDA graph: [`Capture::all_reduce`], for the one case
//! of a [`Communicator`] that is a single kernel on a single stream — a communicator of
//! the own-kernel backend whose ranks all live on the capturing device (they share one
//! lane, and the engine reduces them in one pass by a kernel reading all their buffers).
//! One rank's NCCL collectives ([`RankComm`](super::RankComm) of the NCCL backend) are
//! captured by `Capture::rank_all_reduce` and its siblings (`rank_capture.rs`).
//!
//! Every other `Communicator` collective is [`Error::NotCapturable`]: ranks on several
//! devices (a graph of this capture runs on one device; the engine would need one stream
//! per device and barriers between them), the host-staged transport (its copies go
//! through pinned host memory that the communicator reuses between calls), and NCCL with
//! one thread driving every device (NCCL documents that several GPUs per process with
//! graph capture may deadlock — `cudaGraphLaunch` may block, preventing the launch on
//! the other GPUs — and recommends one GPU per process: capture each rank's part from
//! its own thread or process through an NCCL `RankComm` instead).

use super::communicator::Communicator;
use super::types::{CollectiveType, DType, Op};
use crate::access::Access;
use crate::collective::backend::kernels::engine::Shared;
use crate::copy::DeviceOnlyMemory;
use crate::error::{Error, Result};
use crate::graph::Capture;
use crate::memory::{ByteSpan, DeviceMemory};

/// The first output that overlaps another output or any input: `(output, what, index)`.
/// Inputs may overlap each other (they are only read).
fn first_overlap(outs: &[ByteSpan], ins: &[ByteSpan]) -> Option<(usize, &'static str, usize)> {
    for (i, o) in outs.iter().enumerate() {
        if let Some(j) = outs
            .iter()
            .enumerate()
            .position(|(j, p)| j != i && o.overlaps(p))
        {
            return Some((i, "output", j));
        }
        if let Some(j) = ins.iter().position(|p| o.overlaps(p)) {
            return Some((i, "input", j));
        }
    }
    None
}

/// The communicator's own-kernel engine, if a collective of it can be captured on
/// `device` (see the module docs).
fn capturable<'a>(comm: &'a Communicator, device: &crate::device::Device) -> Result<&'a Shared> {
    // NCCL driven by one thread is not capturable: its backend says why.
    let shared = comm.engine.capturable_engine()?;
    let elsewhere: Vec<usize> = comm
        .devices
        .iter()
        .map(|d| d.ordinal())
        .filter(|&o| o != device.ordinal())
        .collect();
    if !elsewhere.is_empty() {
        return Err(Error::NotCapturable {
            what: "a collective over several devices",
            reason: format!(
                "the communicator has ranks on device(s) {elsewhere:?} and the capture is on \
                 device {}: a CUDA graph runs on one device; only a communicator whose ranks \
                 all live on the capturing device is one kernel on one stream",
                device.ordinal()
            ),
        });
    }
    if shared.is_staged() {
        return Err(Error::NotCapturable {
            what: "a host-staged collective",
            reason: "Transport::HostStaged copies through pinned host memory that the \
                     communicator reuses between calls; create the communicator with \
                     Transport::Auto or Transport::Direct"
                .into(),
        });
    }
    Ok(shared)
}

impl<'c, 'buf> Capture<'c, 'buf> {
    /// Captures an all-reduce over all of `comm`'s ranks: at each launch of the graph,
    /// `recvs[r] = op(sends[0], …, sends[n-1])` for every rank `r`, elementwise — what
    /// [`Group::all_reduce`](super::Group::all_reduce) called for every rank computes,
    /// with the same kernel, so the results are bit-identical.
    ///
    /// Only for a communicator of the own-kernel backend whose ranks all live on the
    /// capturing device (direct transport): one kernel reading every rank's input; any
    /// other communicator is [`Error::NotCapturable`] (see the
    /// [module docs](crate::collective)); an NCCL rank's part is captured through its
    /// [`RankComm`](super::RankComm) ([`rank_all_reduce`](Self::rank_all_reduce)). `sends` and `recvs` have one buffer per rank,
    /// all of one length; outputs must not overlap each other or any input
    /// ([`Error::InvalidArgument`]: they are shared borrows). Like the other captured
    /// operations, the buffers are borrowed for the graph's lifetime, inputs claimed as
    /// read and outputs as written at each launch; the communicator is borrowed too (its
    /// kernels are in the graph).
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{Device, ThreadContext, collective::{CommOptions, Communicator, Op}};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let dev = Device::get(0)?;
    /// let comm = Communicator::new(&mut ctx, &[dev.clone(), dev.clone()], CommOptions::kernels())?;
    /// let gpu = ctx.bind(&dev)?;
    /// let send = [gpu.clone_htod(&[1.0f32; 256])?, gpu.clone_htod(&[2.0f32; 256])?];
    /// let out = [gpu.alloc_zeros::<f32>(256)?, gpu.alloc_zeros::<f32>(256)?];
    /// let graph = gpu.capture(|c| {
    ///     c.all_reduce(&comm, &[&send[0], &send[1]], &[&out[0], &out[1]], Op::Sum)
    /// })?;
    /// graph.instantiate()?.launch(&gpu.default_stream())?;
    /// assert_eq!(gpu.dtoh(&out[1])?, vec![3.0f32; 256]);
    /// # Ok(()) }
    /// ```
    pub fn all_reduce<T, S, D>(
        &mut self,
        comm: &'buf Communicator,
        sends: &[&'buf S],
        recvs: &[&'buf D],
        op: Op,
    ) -> Result<()>
    where
        T: CollectiveType,
        S: DeviceMemory<T> + ?Sized,
        D: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        let device = self.device();
        let shared = capturable(comm, device)?;
        let n = comm.len();
        for (what, got) in [
            ("send buffers", sends.len()),
            ("receive buffers", recvs.len()),
        ] {
            if got != n {
                return Err(Error::InvalidArgument(format!(
                    "all_reduce: {got} {what} for a communicator of {n} rank(s) (one per rank)"
                )));
            }
        }
        let count = sends[0].len();
        for s in sends {
            device.expect_same("send buffer", s.device())?;
            crate::memory::expect_len("all_reduce send buffer", count, s.len())?;
        }
        for r in recvs {
            device.expect_same("receive buffer", r.device())?;
            crate::memory::expect_len("all_reduce receive buffer", count, r.len())?;
        }
        if count == 0 {
            return Ok(());
        }
        let ins: Vec<ByteSpan> = sends.iter().map(|s| ByteSpan::of::<T, S>(*s)).collect();
        let outs: Vec<ByteSpan> = recvs.iter().map(|r| ByteSpan::of::<T, D>(*r)).collect();
        if let Some((i, what, j)) = first_overlap(&outs, &ins) {
            return Err(Error::InvalidArgument(format!(
                "all_reduce: receive buffer {i} overlaps {what} buffer {j} (outputs must not \
                 overlap each other or any input)"
            )));
        }
        let kernels = shared.kernels(device)?;
        for s in sends {
            self.record_memory(*s, Access::Read)?;
        }
        for r in recvs {
            self.record_memory(*r, Access::Write)?;
        }
        // The communicator's drop waits for the launches of its kernels (as for its
        // eager collectives); it is borrowed for 'buf anyway.
        self.record(shared.work(), Access::Read)?;
        let ins: Vec<u64> = sends.iter().map(|s| s.device_ptr()).collect();
        let outs: Vec<u64> = recvs.iter().map(|r| r.device_ptr()).collect();
        // Code outside gpubind may have changed the thread's context since the capture
        // began: make the capture's device current for the launches.
        let _current = device.enter()?;
        let stream = self.stream_handle();
        self.marked(|| {
            // SAFETY: the kernels are the capture device's (every rank is on it, checked
            // by `capturable`), whose context is current (entered just above); the stream
            // is the capturing stream, so the kernels are recorded, not run. Every address
            // is a live allocation of this device with `count` elements of T (checked
            // above), borrowed for 'buf and claimed at each launch; outputs overlap
            // nothing (checked).
            unsafe { kernels.reduce(stream, DType::of::<T>(), op, &ins, &outs, count, n) }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::AccessTracker;

    fn span(t: &AccessTracker, lo: u64, hi: u64) -> ByteSpan {
        ByteSpan::new(t, lo, hi - lo)
    }

    #[test]
    fn outputs_may_not_overlap_outputs_or_inputs_but_inputs_may_overlap() {
        let (a, b) = (AccessTracker::default(), AccessTracker::default());
        // Disjoint outputs in one allocation, inputs that overlap each other: fine.
        let outs = [span(&a, 0, 64), span(&a, 64, 128)];
        let ins = [span(&b, 0, 64), span(&b, 32, 96), span(&a, 128, 192)];
        assert_eq!(first_overlap(&outs, &ins), None);
        // The same range in another allocation does not overlap.
        assert_eq!(first_overlap(&[span(&a, 0, 64)], &[span(&b, 0, 64)]), None);
        // Two outputs sharing a byte.
        let outs = [span(&a, 0, 65), span(&a, 64, 128)];
        assert_eq!(first_overlap(&outs, &[]), Some((0, "output", 1)));
        // An output that is an input (in place) is refused too.
        let outs = [span(&a, 0, 64)];
        assert_eq!(
            first_overlap(&outs, &[span(&b, 0, 64), span(&a, 0, 64)]),
            Some((0, "input", 1))
        );
    }
}
