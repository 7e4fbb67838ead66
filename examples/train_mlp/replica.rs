//! One data-parallel replica on one device, and page-locked batches to feed it.

use super::Shape;
use super::kernels::xent_config;
use super::kernels::{Fns, bias_act, elementwise, finish_config, relu_back_colsum, u32_of};
use gpubind::blas::{Blas, Matmul};
use gpubind::{BoundDevice, BoundStream, DeviceSlice, Error, LaunchConfig, Result};
use gpubind::{PinnedHostBuffer, PinnedOptions};

/// Which gradients an SGD step uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gradients {
    /// `Replica::grads`: one replica trains alone.
    Local,
    /// `Replica::reduced`: the sum over replicas, written by the all-reduce.
    Reduced,
}

/// One rank's shard of one batch in page-locked host memory. Written once, by
/// [`PinnedBatch::new`], and never again (the fields are private to the model's modules
/// and nothing hands out
/// `&mut` access), so stream-ordered uploads from it need no scope: the host cannot write
/// it while a copy reads it, and dropping it waits for the copies (they are tracked uses
/// of the buffers).
pub struct PinnedBatch {
    pub(super) x: PinnedHostBuffer<f32>,
    pub(super) y: PinnedHostBuffer<u32>,
}

impl PinnedBatch {
    pub fn new(gpu: &BoundDevice<'_>, x: &[f32], y: &[u32]) -> Result<Self> {
        let opts = PinnedOptions::default();
        Ok(PinnedBatch {
            x: gpu.pinned_from_slice(x, opts)?,
            y: gpu.pinned_from_slice(y, opts)?,
        })
    }
}

/// One data-parallel replica: parameters, gradients, momentum and activations on one
/// device. Parameters, gradients and momentum are flat ([`Shape::offsets`]).
///
/// Every field is private to the model's modules (this one, the step and the graph
/// capture, none of which assigns one after construction): the kernels' bounds follow
/// from `shape` and `rows` matching the buffers allocated for them.
pub struct Replica {
    pub(super) shape: Shape,
    pub(super) rows: usize,
    pub(super) params: DeviceSlice<f32>,
    pub(crate) grads: DeviceSlice<f32>,
    /// Gradients summed over all replicas (the all-reduce's output).
    pub(crate) reduced: DeviceSlice<f32>,
    pub(super) vel: DeviceSlice<f32>,
    pub(super) x: DeviceSlice<f32>,
    pub(super) y: DeviceSlice<u32>,
    pub(super) a1: DeviceSlice<f32>,
    pub(super) a2: DeviceSlice<f32>,
    pub(super) logits: DeviceSlice<f32>,
    pub(super) d1: DeviceSlice<f32>,
    pub(super) d2: DeviceSlice<f32>,
    /// Per-chunk partial sums of the bias gradients and the loss (`parts × width()`).
    pub(super) partial: DeviceSlice<f32>,
    pub(super) parts: usize,
    /// Each step's summed loss, written by the reduction kernel straight into mapped
    /// page-locked memory (slot = the step's index in its epoch): no copy and no host
    /// wait per step.
    pub(super) losses: PinnedHostBuffer<f32>,
    pub(super) blas: Blas,
}

impl Replica {
    /// Uploads `params` (the six tensors) and allocates buffers for shards of `rows` rows,
    /// with one loss slot.
    pub fn new(
        gpu: &BoundDevice<'_>,
        shape: Shape,
        params: &[Vec<f32>],
        rows: usize,
    ) -> Result<Self> {
        Self::with_loss_slots(gpu, shape, params, rows, 1)
    }

    /// As [`Replica::new`], with `slots` loss slots (one per step between host waits).
    pub fn with_loss_slots(
        gpu: &BoundDevice<'_>,
        shape: Shape,
        params: &[Vec<f32>],
        rows: usize,
        slots: usize,
    ) -> Result<Self> {
        if rows == 0 || slots == 0 {
            return Err(Error::InvalidArgument(
                "train_mlp: a replica needs at least one row and one loss slot".into(),
            ));
        }
        if shape.classes == 0 || shape.classes > 32 {
            return Err(Error::InvalidArgument(format!(
                "train_mlp: {} classes; the softmax kernel handles 1..=32",
                shape.classes
            )));
        }
        let lens = shape.tensor_lens();
        if params.len() != Shape::TENSORS || params.iter().zip(lens).any(|(p, n)| p.len() != n) {
            return Err(Error::InvalidArgument(
                "train_mlp: parameters do not match the shape".into(),
            ));
        }
        // Every element count the kernels index with `unsigned` must fit.
        let widest = shape.hidden.max(shape.input).max(shape.classes);
        u32_of("rows × widest layer", rows.saturating_mul(widest))?;
        u32_of("parameter count", shape.param_count())?;
        let parts = rows.div_ceil(64).clamp(1, 1024);
        let width = Self::width(shape);
        u32_of("partial sums", parts.saturating_mul(width))?;
        let n = shape.param_count();
        Ok(Replica {
            shape,
            rows,
            params: gpu.clone_htod(&shape.flatten(params))?,
            grads: gpu.alloc_zeros(n)?,
            reduced: gpu.alloc_zeros(n)?,
            vel: gpu.alloc_zeros(n)?,
            x: gpu.alloc_zeros(rows * shape.input)?,
            y: gpu.alloc_zeros(rows)?,
            a1: gpu.alloc_zeros(rows * shape.hidden)?,
            a2: gpu.alloc_zeros(rows * shape.hidden)?,
            logits: gpu.alloc_zeros(rows * shape.classes)?,
            d1: gpu.alloc_zeros(rows * shape.hidden)?,
            d2: gpu.alloc_zeros(rows * shape.hidden.max(shape.classes))?,
            partial: gpu.alloc_zeros(parts * width)?,
            parts,
            losses: gpu.alloc_pinned(slots, PinnedOptions::default())?,
            blas: gpu.new_blas()?,
        })
    }

    /// The layer widths.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// Rows of this replica's shard.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns of the partial-sum matrix: b1, b2, b3, then the loss.
    pub(super) fn width(shape: Shape) -> usize {
        2 * shape.hidden + shape.classes + 1
    }

    /// Uploads one shard (`x`: rows×input, `y`: rows) synchronously.
    pub fn load_batch(&mut self, gpu: &BoundDevice<'_>, x: &[f32], y: &[u32]) -> Result<()> {
        gpu.htod_copy(x, &mut self.x)?;
        gpu.htod_copy(y, &mut self.y)
    }

    /// Enqueues the upload of one shard from page-locked memory on `s` (no host wait).
    pub fn upload(&mut self, s: &BoundStream<'_>, batch: &PinnedBatch) -> Result<()> {
        // SAFETY: copy_async's contract is that the host memory stays alive, and is not
        // written by the host, until the stream has passed the copy. A PinnedBatch is
        // never written after construction (private fields, no `&mut` access), and the
        // whole PinnedHostBuffer is the copy's source, so the copy is a tracked use of it
        // and the buffer's drop waits for it. Lengths and devices are checked by the call.
        unsafe {
            s.copy_async(&batch.x, &mut self.x)?;
            s.copy_async(&batch.y, &mut self.y)
        }
    }

    /// Forward pass into `self.logits`.
    pub fn forward(&mut self, s: &BoundStream<'_>, f: &Fns<'_>) -> Result<()> {
        let (rows, sh) = (self.rows, self.shape);
        let [l1, l2, l3] = sh.layers();
        let r = rows as u32;
        let Replica {
            params,
            x,
            a1,
            a2,
            logits,
            blas,
            ..
        } = self;
        let w = |t: usize| params.slice(sh.range(t));
        s.matmul(blas, &Matmul::new(rows, l1.1, l1.0), &*x, &w(0)?, &mut *a1)?;
        bias_act(s, f, a1, &w(1)?, r, l1.1 as u32, true)?;
        s.matmul(blas, &Matmul::new(rows, l2.1, l2.0), &*a1, &w(2)?, &mut *a2)?;
        bias_act(s, f, a2, &w(3)?, r, l2.1 as u32, true)?;
        s.matmul(
            blas,
            &Matmul::new(rows, l3.1, l3.0),
            &*a2,
            &w(4)?,
            &mut *logits,
        )?;
        bias_act(s, f, logits, &w(5)?, r, l3.1 as u32, false)
    }

    /// Forward + backward: gradients (scaled by `1/global_rows`) into `self.grads`, the
    /// shard's summed loss into loss slot 0.
    pub fn forward_backward(
        &mut self,
        s: &BoundStream<'_>,
        f: &Fns<'_>,
        global_rows: usize,
    ) -> Result<()> {
        self.forward_backward_slot(s, f, global_rows, 0)
    }

    /// [`Replica::forward_backward`] writing the loss into slot `slot`. Enqueue-only.
    pub fn forward_backward_slot(
        &mut self,
        s: &BoundStream<'_>,
        f: &Fns<'_>,
        global_rows: usize,
        slot: usize,
    ) -> Result<()> {
        if global_rows == 0 {
            return Err(Error::InvalidArgument(
                "train_mlp: the global batch (the gradients' 1/rows scale) is 0".into(),
            ));
        }
        if slot >= self.losses.len() {
            return Err(Error::InvalidArgument(format!(
                "train_mlp: loss slot {slot} of {}",
                self.losses.len()
            )));
        }
        self.forward(s, f)?;
        let (rows, sh) = (self.rows, self.shape);
        let [l1, l2, l3] = sh.layers();
        let (h, c) = (sh.hidden, sh.classes);
        let width = Self::width(sh);
        let (r, parts, w32) = (rows as u32, self.parts as u32, width as u32);
        let scale = 1.0f32 / global_rows as f32;
        let Replica {
            params,
            grads,
            x,
            y,
            a1,
            a2,
            logits,
            d1,
            d2,
            partial,
            losses,
            blas,
            ..
        } = self;
        let w = |t: usize| params.slice(sh.range(t));
        // d2 (rows×max(hidden, classes)) holds dlogits first.
        let mut dz3 = d2.slice_mut(..rows * c)?;
        let lpr = (c as u32).next_power_of_two();
        let (c32, pstride, poff3) = (c as u32, w32, (2 * h) as u32);
        let xent_cfg = xent_config(parts);
        // SAFETY: softmax_xent takes (const float*, const unsigned*, float*, float*,
        // unsigned ×3, float, unsigned ×2), matched here. Block g reads and writes rows
        // inside rows·classes elements of logits and dlogits (chunk bounds are clamped to
        // rows), reads labels < rows, and writes partial row g < parts at columns
        // 2h..2h+classes < width; lpr is a power of two with classes ≤ lpr ≤ 32 (classes
        // checked in `with_loss_slots`), the block is 256 threads as the kernel assumes.
        unsafe {
            s.launch(&f.softmax_xent, xent_cfg)
                .arg(&*logits)
                .arg(&*y)
                .arg(&mut dz3)
                .arg(&mut *partial)
                .arg(&r)
                .arg(&c32)
                .arg(&lpr)
                .arg(&scale)
                .arg(&pstride)
                .arg(&poff3)
                .launch()?
        };
        // Layer 3: dW3 = A2ᵀ·dZ3, dA2 = dZ3·W3ᵀ (into d1).
        s.matmul(
            blas,
            &Matmul::new(l3.0, l3.1, rows).transpose_a(),
            &*a2,
            &dz3,
            &mut grads.slice_mut(sh.range(4))?,
        )?;
        s.matmul(
            blas,
            &Matmul::new(rows, l3.0, l3.1).transpose_b(),
            &dz3,
            &w(4)?,
            &mut *d1,
        )?;
        // dZ2 = dA2 ⊙ (A2 > 0) and db2's partial sums (columns h..2h).
        relu_back_colsum(
            s, f, &mut *d1, a2, partial, r, h as u32, pstride, h as u32, parts,
        )?;
        // Layer 2: dW2 = A1ᵀ·dZ2, dA1 = dZ2·W2ᵀ (into d2).
        s.matmul(
            blas,
            &Matmul::new(l2.0, l2.1, rows).transpose_a(),
            &*a1,
            &*d1,
            &mut grads.slice_mut(sh.range(2))?,
        )?;
        s.matmul(
            blas,
            &Matmul::new(rows, l2.0, l2.1).transpose_b(),
            &*d1,
            &w(2)?,
            &mut d2.slice_mut(..rows * h)?,
        )?;
        // dZ1 and db1's partial sums (columns 0..h).
        let mut dz1 = d2.slice_mut(..rows * h)?;
        relu_back_colsum(s, f, &mut dz1, a1, partial, r, h as u32, pstride, 0, parts)?;
        // Layer 1: dW1 = Xᵀ·dZ1.
        s.matmul(
            blas,
            &Matmul::new(l1.0, l1.1, rows).transpose_a(),
            &*x,
            &dz1,
            &mut grads.slice_mut(sh.range(0))?,
        )?;
        // The three bias gradients and the loss, from the partial sums.
        let mut biases = grads.slice_mut(sh.bias_offset()..)?;
        let finish_cfg = finish_config(w32);
        let slot32 = slot as u32;
        // SAFETY: col_finish takes (const float*, float*, float*, unsigned ×3), matched.
        // It reads parts·width elements of partial (its length), writes out[c] for
        // c < width - 1 = 2h + classes (the bias range's length) and loss_out[slot] with
        // slot < the slots' length (checked above); the block is the 128 threads it
        // assumes. `losses` is page-locked host memory: it is private to the replica and
        // the host reaches it only through `losses()`, a synchronous copy that waits for
        // this (tracked) write, and its drop waits for it too.
        unsafe {
            s.launch(&f.col_finish, finish_cfg)
                .arg(&*partial)
                .arg(&mut biases)
                .arg(&mut *losses)
                .arg(&parts)
                .arg(&w32)
                .arg(&slot32)
                .launch()?
        };
        Ok(())
    }

    /// SGD with momentum on every parameter, in one launch, from this replica's own
    /// gradients (`Gradients::Local`, single replica) or the all-reduced ones.
    pub fn sgd(
        &mut self,
        s: &BoundStream<'_>,
        f: &Fns<'_>,
        lr: f32,
        mu: f32,
        from: Gradients,
    ) -> Result<()> {
        let grads = match from {
            Gradients::Local => &self.grads,
            Gradients::Reduced => &self.reduced,
        };
        let n = self.params.len() as u32;
        // SAFETY: (float*, float*, const float*, unsigned, float, float) matches; the
        // kernel stays inside n elements of three tensors of exactly n elements.
        unsafe {
            s.launch(&f.sgd_momentum, elementwise(n))
                .arg(&mut self.params)
                .arg(&mut self.vel)
                .arg(grads)
                .arg(&n)
                .arg(&lr)
                .arg(&mu)
                .launch()
        }
    }

    /// Every loss slot (summed loss of this shard per step), waiting for the kernels
    /// that write them: a synchronous copy claims the page-locked buffer, so it waits
    /// for its pending (tracked) kernel writes. The host touches `losses` only here.
    pub fn losses(&self, gpu: &BoundDevice<'_>) -> Result<Vec<f32>> {
        let mut host = vec![0.0f32; self.losses.len()];
        gpu.copy(&self.losses, &mut host)?;
        Ok(host)
    }

    /// Sum of the losses of the last `forward_backward` (slot 0).
    pub fn loss_sum(&self, gpu: &BoundDevice<'_>) -> Result<f64> {
        Ok(self.losses(gpu)?[0] as f64)
    }

    /// Logits of the last forward pass.
    pub fn logits(&self, gpu: &BoundDevice<'_>) -> Result<Vec<f32>> {
        gpu.dtoh(&self.logits)
    }

    /// The parameters, as the six tensors.
    pub fn params(&self, gpu: &BoundDevice<'_>) -> Result<Vec<Vec<f32>>> {
        Ok(self.shape.split(&gpu.dtoh(&self.params)?))
    }

    /// This replica's own gradients, as the six tensors.
    pub fn grads(&self, gpu: &BoundDevice<'_>) -> Result<Vec<Vec<f32>>> {
        Ok(self.shape.split(&gpu.dtoh(&self.grads)?))
    }
}
