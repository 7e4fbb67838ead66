//! How a [`Blas`](super::Blas) picks a cuBLASLt algorithm for a new shape: cuBLASLt's
//! heuristic, or the fastest of its candidates timed on the device ([`AlgoSelection`]),
//! and the timed choices, kept per device for the process.

use super::lt::LtKey;
use super::sys::LtAlgo;
use super::types::DataType;
use crate::driver::result;
use crate::error::Result;
use cudarc::driver::sys as driver;
use std::collections::HashMap;
use std::sync::Mutex;

/// How a [`Blas`](super::Blas) picks the algorithm of a
/// [`matmul_lt`](crate::BoundStream::matmul_lt) product of a shape it has not run yet.
///
/// cuBLASLt's heuristic ranks its algorithms by a model of the device, without running
/// them; on Hopper its first choice for large training shapes is often 5–25 % slower
/// than the best of its next few. [`Timed`](Self::Timed) runs the candidates and keeps
/// the fastest, as PyTorch's `cudnn.benchmark` does for convolutions.
///
/// ```no_run
/// # fn main() -> gpubind::Result<()> {
/// use gpubind::{blas::AlgoSelection, Device, ThreadContext};
/// let mut ctx = ThreadContext::acquire()?;
/// let gpu = ctx.bind(&Device::get(0)?)?;
/// let blas = gpu.new_blas()?;
/// blas.set_algo_selection(AlgoSelection::timed());
/// // The first product of each shape now times up to 8 candidates first.
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum AlgoSelection {
    /// The heuristic's first algorithm (nothing runs to choose it). The default.
    #[default]
    Heuristic,
    /// The fastest of the heuristic's first `candidates` algorithms (1 to
    /// [`MAX_CANDIDATES`](Self::MAX_CANDIDATES)), timed once per shape and device.
    ///
    /// The first product of a shape (its types, transposes, sizes, leading dimensions,
    /// epilogue and operand alignments) runs each candidate a few times on scratch
    /// memory of the product's size, filled with values in [-1, 1), on a stream of its
    /// own, in interleaved rounds, and waits for that: a host synchronisation, once per
    /// shape, so keep the first step of a loop out of any timing. Issued on a gpubind
    /// stream, it first waits for that stream's earlier work; on another library's
    /// stream, the legacy stream or in a graph capture it waits for nothing else. The
    /// product's own buffers are never touched (it plans before it claims them), so
    /// products that accumulate (`beta ≠ 0`) are timed too.
    ///
    /// The choice is kept for the process, per device and number of candidates, and
    /// shared by every `Blas` of the device: a graph captured with a new `Blas` of the
    /// same selection runs the algorithm an eager product of the same shape ran, so the
    /// two compute the same bits. Two processes may choose differently (timings vary),
    /// and different algorithms may round differently: runs that must repeat bit for bit
    /// across processes keep [`Heuristic`](Self::Heuristic).
    ///
    /// When the scratch memory cannot be allocated, or no candidate runs, the shape
    /// takes the heuristic's first algorithm for the rest of the process (logged at
    /// `debug`). A device error while timing (a faulted context) is the product's error.
    Timed {
        /// How many of the heuristic's algorithms to time.
        candidates: u32,
    },
}

impl AlgoSelection {
    /// The most candidates [`Timed`](Self::Timed) runs.
    pub const MAX_CANDIDATES: u32 = 16;

    /// [`Timed`](Self::Timed) with 8 candidates.
    pub fn timed() -> Self {
        AlgoSelection::Timed { candidates: 8 }
    }

    /// How many algorithms to ask the heuristic for (at least 1, at most
    /// [`MAX_CANDIDATES`](Self::MAX_CANDIDATES)).
    pub(crate) fn requested(self) -> usize {
        match self {
            AlgoSelection::Heuristic => 1,
            AlgoSelection::Timed { candidates } => {
                candidates.clamp(1, Self::MAX_CANDIDATES) as usize
            }
        }
    }
}

/// A timed choice's key: the device ordinal, the candidates asked for, the product.
type ChoiceKey = (usize, usize, LtKey);

/// The timed choices of the process; `None` where a timing found nothing to choose
/// (no scratch, no candidate ran), so that the heuristic serves without timing again.
/// The lock is held only to look up or insert one entry; nothing else is called under
/// it. (Not loom's: no model covers it.)
static TIMED: Mutex<Option<HashMap<ChoiceKey, Option<LtAlgo>>>> = Mutex::new(None);

/// Runs `f` on the choices, recovering from poisoning (an entry is inserted whole or not
/// at all).
fn with_choices<R>(f: impl FnOnce(&mut HashMap<ChoiceKey, Option<LtAlgo>>) -> R) -> R {
    let mut guard = TIMED.lock().unwrap_or_else(|p| p.into_inner());
    f(guard.get_or_insert_with(HashMap::new))
}

/// What timing `key` among `candidates` candidates on device `ordinal` chose: `None` if
/// it was never timed, `Some(None)` if the timing found nothing to choose.
pub(crate) fn timed_choice(
    ordinal: usize,
    candidates: usize,
    key: &LtKey,
) -> Option<Option<LtAlgo>> {
    with_choices(|c| c.get(&(ordinal, candidates, *key)).copied())
}

/// Keeps `choice` for `key` among `candidates` on device `ordinal` and returns the
/// choice kept (the first, if two threads timed one key).
pub(crate) fn keep_choice(
    ordinal: usize,
    candidates: usize,
    key: LtKey,
    choice: Option<LtAlgo>,
) -> Option<LtAlgo> {
    with_choices(|c| *c.entry((ordinal, candidates, key)).or_insert(choice))
}

/// Rounds of timing runs (each round runs every candidate in turn, so that clock changes
/// fall on all alike; a candidate's time is its fastest round).
pub(crate) const ROUNDS: usize = 2;
/// Timing runs of a candidate in one round.
pub(crate) const REPS: usize = 3;

/// Bytes of scratch a timing run of a product needs, laid out at 256-byte boundaries:
/// A, B, C, the epilogue's bias and aux operands and a workspace, as offsets into one
/// allocation (`[a, b, c, bias, aux, workspace, total]`).
pub(crate) fn scratch_layout(parts: [usize; 6]) -> [usize; 7] {
    let mut out = [0usize; 7];
    let mut at = 0usize;
    for (i, bytes) in parts.iter().enumerate() {
        out[i] = at;
        at = at.saturating_add(bytes.div_ceil(256).saturating_mul(256));
    }
    out[6] = at;
    out
}

/// Bytes of the host pattern the scratch is filled from (repeated on the device).
const PATTERN_BYTES: usize = 1 << 20;

/// `bytes` of `dtype` elements uniform in [-1, 1) (rounded to the type; a tail shorter
/// than 8 bytes is zeros), from a fixed xorshift sequence: data like a product's, whose timings (tensor-core power, hence
/// clocks) constant or zero operands would flatter.
pub(crate) fn pattern(dtype: DataType, bytes: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // 24 random bits → [-1, 1).
        ((x >> 40) as f32) / (1u32 << 23) as f32 - 1.0
    };
    let mut out = Vec::with_capacity(bytes);
    while out.len() + 8 <= bytes {
        match dtype {
            DataType::Bf16 => {
                for _ in 0..4 {
                    out.extend_from_slice(&half::bf16::from_f32(next()).to_le_bytes());
                }
            }
            DataType::F16 => {
                for _ in 0..4 {
                    out.extend_from_slice(&half::f16::from_f32(next()).to_le_bytes());
                }
            }
            DataType::F32 => {
                for _ in 0..2 {
                    out.extend_from_slice(&next().to_le_bytes());
                }
            }
            DataType::F64 => out.extend_from_slice(&f64::from(next()).to_le_bytes()),
        }
    }
    out.resize(bytes, 0);
    out
}

/// Scratch device memory and a stream of its own for timing runs, freed (in stream
/// order) and destroyed on drop.
pub(crate) struct Scratch {
    pub(crate) stream: driver::CUstream,
    pub(crate) base: driver::CUdeviceptr,
    events: Vec<driver::CUevent>,
    /// The host pattern the memory is filled from, kept until the copies are done.
    pattern: Vec<u8>,
}

impl Scratch {
    /// `bytes` of scratch filled with [`pattern`]s of `dtype`, on a new non-blocking
    /// stream, and `events` events for timing.
    ///
    /// # Safety
    ///
    /// The device's context is current, and stays current until the `Scratch` drops.
    pub(crate) unsafe fn new(bytes: usize, dtype: DataType, events: usize) -> Result<Scratch> {
        let flags = driver::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the caller's contract (the current context); destroyed by drop.
        let stream = unsafe { result::stream::create(flags) }?;
        let mut s = Scratch {
            stream,
            base: 0,
            events: Vec::with_capacity(events),
            pattern: pattern(dtype, PATTERN_BYTES.min(bytes.next_multiple_of(8))),
        };
        // SAFETY: a live stream of the current context; freed in its order by drop,
        // used only by work on it.
        s.base = unsafe { result::memory::alloc_async(bytes, s.stream) }?;
        // The pattern, then doubling copies of what is filled.
        let first = s.pattern.len().min(bytes);
        // SAFETY: `first` bytes of the allocation from the host pattern, which lives in
        // `s` until after its drop has waited for the stream (the fields drop after
        // `Drop::drop`), on every path.
        unsafe { result::copy::htod_async(s.base, s.pattern.as_ptr().cast(), first, s.stream) }?;
        let mut filled = first;
        while filled < bytes {
            let n = filled.min(bytes - filled);
            // SAFETY: [0, n) onto [filled, filled + n), disjoint ranges of the allocation,
            // ordered on its stream after the writes of [0, filled).
            unsafe { result::copy::dtod_async(s.base + filled as u64, s.base, n, s.stream) }?;
            filled += n;
        }
        for _ in 0..events {
            let flags = driver::CUevent_flags::CU_EVENT_DEFAULT as u32;
            // SAFETY: the current context's event, destroyed by drop.
            let e = unsafe { result::event::create(flags) }?;
            s.events.push(e);
        }
        Ok(s)
    }

    /// Event `i`.
    pub(crate) fn event(&self, i: usize) -> driver::CUevent {
        self.events[i]
    }

    /// Waits for the scratch stream's work (the timing runs).
    pub(crate) fn wait(&self) -> Result<()> {
        // SAFETY: the live stream this `Scratch` created.
        unsafe { result::stream::synchronize(self.stream) }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY (each call): handles this `Scratch` created in the current context,
        // released once, here; the memory is freed in its stream's order after the
        // timing runs, which are the only work that uses it. The wait lets the pool give
        // the memory back (at its default release threshold) before the products that
        // follow allocate; it runs where the timing runs, in relaxed capture mode.
        unsafe {
            for &e in &self.events {
                let _ = result::event::destroy(e);
            }
            if self.base != 0 {
                let _ = result::memory::free_async(self.base, self.stream);
            }
            let _ = result::stream::synchronize(self.stream);
            let _ = result::stream::destroy(self.stream);
        }
    }
}

/// The index of the fastest of `times` (milliseconds; `None`: the candidate did not
/// run), if any ran.
pub(crate) fn fastest(times: &[Option<f32>]) -> Option<usize> {
    times
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.map(|t| (i, t)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requested_candidates_are_clamped() {
        assert_eq!(AlgoSelection::Heuristic.requested(), 1);
        assert_eq!(AlgoSelection::timed().requested(), 8);
        assert_eq!(AlgoSelection::Timed { candidates: 0 }.requested(), 1);
        assert_eq!(AlgoSelection::Timed { candidates: 99 }.requested(), 16);
        assert_eq!(AlgoSelection::default(), AlgoSelection::Heuristic);
    }

    #[test]
    fn scratch_parts_are_256_byte_aligned_and_disjoint() {
        let l = scratch_layout([1, 256, 257, 0, 3, 32 << 20]);
        assert_eq!(l, [0, 256, 512, 1024, 1024, 1280, 1280 + (32 << 20)]);
        for i in 0..6 {
            assert_eq!(l[i] % 256, 0);
            assert!(l[i] <= l[i + 1]);
        }
    }

    #[test]
    fn timed_choices_are_per_device_and_the_first_kept_stays() {
        let algo = |x: u64| LtAlgo { data: [x; 8] };
        // Shapes no other test uses: the choices are the process's.
        let (k1, k2) = (LtKey::example(7001), LtKey::example(7002));
        assert!(timed_choice(0, 8, &k1).is_none());
        assert_eq!(keep_choice(0, 8, k1, Some(algo(1))).unwrap().data, [1; 8]);
        assert_eq!(timed_choice(0, 8, &k1).unwrap().unwrap().data, [1; 8]);
        // Another device, another shape, another number of candidates: their own.
        assert!(timed_choice(1, 8, &k1).is_none());
        assert!(timed_choice(0, 8, &k2).is_none());
        assert!(timed_choice(0, 4, &k1).is_none());
        // A second timing of the same key keeps the first choice.
        assert_eq!(keep_choice(0, 8, k1, Some(algo(2))).unwrap().data, [1; 8]);
        assert_eq!(timed_choice(0, 8, &k1).unwrap().unwrap().data, [1; 8]);
        // A timing that found nothing is kept too: the heuristic serves, untimed.
        assert!(keep_choice(0, 8, k2, None).is_none());
        assert_eq!(timed_choice(0, 8, &k2).map(|c| c.is_none()), Some(true));
    }

    #[test]
    fn patterns_are_uniform_in_minus_one_to_one_for_every_type() {
        let b = pattern(DataType::Bf16, 4096);
        assert_eq!(b.len(), 4096);
        let v: Vec<f32> = b
            .chunks(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect();
        assert!(v.iter().all(|x| (-1.0..=1.0).contains(x)));
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        assert!(mean.abs() < 0.1, "mean {mean}");
        assert!(v.iter().filter(|x| **x < 0.0).count() > 800);
        let f: Vec<f32> = pattern(DataType::F32, 4096)
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert!(f.iter().all(|x| (-1.0..1.0).contains(x)));
        let d = pattern(DataType::F64, 1000);
        assert_eq!(d.len(), 1000);
        let h = pattern(DataType::F16, 64);
        assert!(
            h.chunks(2)
                .all(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32().abs() <= 1.0)
        );
    }

    #[test]
    fn fastest_skips_candidates_that_did_not_run() {
        assert_eq!(fastest(&[Some(2.0), None, Some(1.5), Some(1.7)]), Some(2));
        assert_eq!(fastest(&[None, None]), None);
        assert_eq!(fastest(&[]), None);
    }
}
