//! The GPT on one device: parameters, gradients and AdamW moments as flat buffers,
//! preallocated activations per block (as llm.c), and the forward pass, backward pass
//! and optimizer step as NVRTC kernels ([`Kernels`]) and cuBLAS products.
//!
//! The step itself — which products and kernels, in which order — is written once, in
//! `pass.rs` (the parts) and `step.rs` (their order), for an eager stream and a graph
//! capture alike; the methods here issue its parts eagerly.

#[path = "graph.rs"]
pub mod graph;
#[path = "pass.rs"]
mod pass;
#[path = "step.rs"]
pub mod step;

use crate::GptError;
use crate::args::{AttnMode, Fusion};
use crate::attention::{self, Attention};
use crate::kernels::{self, Kernels, NORM_PARTS};
use crate::model::{self, Config, Dims, ParamLayout};
use crate::optim::SCHED_LEN;
pub use crate::precision::Act;
use gpubind::blas::Blas;
use gpubind::{BoundDevice, BoundStream, DeviceRepr, DeviceSlice, Result};
use step::{Eager, Issuer, Part};

/// The activations of one block kept for the backward pass.
struct Block<T: DeviceRepr> {
    ln1: DeviceSlice<T>,
    ln1_mean: DeviceSlice<f32>,
    ln1_rstd: DeviceSlice<f32>,
    qkv: DeviceSlice<T>,
    /// Each query row's log-sum-exp (fused attention).
    lse: DeviceSlice<f32>,
    q: DeviceSlice<T>,
    k: DeviceSlice<T>,
    v: DeviceSlice<T>,
    att: DeviceSlice<T>,
    atty: DeviceSlice<T>,
    atty_un: DeviceSlice<T>,
    res2: DeviceSlice<T>,
    ln2: DeviceSlice<T>,
    ln2_mean: DeviceSlice<f32>,
    ln2_rstd: DeviceSlice<f32>,
    fch: DeviceSlice<T>,
    fch_gelu: DeviceSlice<T>,
    res3: DeviceSlice<T>,
}

/// Buffers of one block's size reused by every block: gradients flowing backward.
struct Scratch<T: DeviceRepr> {
    preatt: DeviceSlice<T>,
    proj: DeviceSlice<T>,
    dres: DeviceSlice<T>,
    dln: DeviceSlice<T>,
    dqkv: DeviceSlice<T>,
    dq: DeviceSlice<T>,
    dk: DeviceSlice<T>,
    dv: DeviceSlice<T>,
    /// `rowsum(dy ⊙ y)` of the fused attention's backward pass.
    dsum: DeviceSlice<f32>,
    datt: DeviceSlice<T>,
    daty: DeviceSlice<T>,
    daty_un: DeviceSlice<T>,
    dfch: DeviceSlice<T>,
    dfch_gelu: DeviceSlice<T>,
    dlogits: DeviceSlice<T>,
    /// The column sums' partial sums (bias gradients, layer-norm backward):
    /// [`kernels::colsum_parts`] rows of up to `4C`.
    partial: DeviceSlice<f32>,
    /// The residual gradient's column sums that the layer-norm backward takes along (the
    /// MLP's and the attention projection's bias gradients): `colsum_parts(B·T)·C`.
    res_partial: DeviceSlice<f32>,
    /// The QKV bias gradient's partial sums that the mma attention backward takes along
    /// ([`attention::bias_partial_len`](crate::attention::bias_partial_len); one element
    /// on the other paths).
    qkv_partial: DeviceSlice<f32>,
    /// The token embedding gradient's partial sums.
    wte_partial: DeviceSlice<f32>,
    norm_partial: DeviceSlice<f32>,
}

/// The model, its optimizer state and every buffer a step needs, on one device.
pub struct Gpt<T: Act> {
    pub cfg: Config,
    pub dims: Dims,
    pub layout: ParamLayout,
    /// The f32 master weights (AdamW updates these).
    pub params: DeviceSlice<f32>,
    /// The weights as `T`, what the products and kernels read (AdamW writes them too).
    pub weights: DeviceSlice<T>,
    pub grads: DeviceSlice<T>,
    pub m: DeviceSlice<f32>,
    pub v: DeviceSlice<f32>,
    blocks: Vec<Block<T>>,
    encoded: DeviceSlice<T>,
    lnf: DeviceSlice<T>,
    lnf_mean: DeviceSlice<f32>,
    lnf_rstd: DeviceSlice<f32>,
    pub logits: DeviceSlice<T>,
    losses: DeviceSlice<f32>,
    pub loss: DeviceSlice<f32>,
    pub tokens: DeviceSlice<u32>,
    pub targets: DeviceSlice<u32>,
    pub sched: DeviceSlice<f32>,
    /// Factor of the loss gradient: 1, or 1/ranks under data parallelism.
    pub grad_scale: f32,
    normsq: DeviceSlice<f32>,
    /// 1 for each parameter AdamW decays (`Param::decay`), else 0.
    decay: DeviceSlice<u8>,
    sc: Scratch<T>,
    k: Kernels,
    /// The fused attention's kernels (`--attention fused`); `None`: unfused.
    attn: Option<Attention>,
    fusion: Fusion,
    /// The eager parts' cuBLAS handle.
    blas: Blas,
}

fn z<T: DeviceRepr>(gpu: &BoundDevice<'_>, n: usize) -> Result<DeviceSlice<T>> {
    gpu.alloc_zeros::<T>(n)
}

impl<T: Act> Gpt<T> {
    /// Allocates everything for batch `b` (per device), with the fused paths `fusion`, and
    /// uploads `init`. A batch whose buffers do not fit in the free device memory is
    /// [`GptError::BatchTooLarge`]; a shape the fused attention does not take, a
    /// [`gpubind::Error::InvalidArgument`] naming it.
    pub fn new(
        gpu: &BoundDevice<'_>,
        cfg: Config,
        b: usize,
        init: &[f32],
        mut fusion: Fusion,
    ) -> std::result::Result<Gpt<T>, GptError> {
        fusion.attention = fusion.attention.resolve(T::BF16);
        let dims = Dims::new(&cfg, b);
        let layout = ParamLayout::new(&cfg);
        let unfused = fusion.attention == AttnMode::Unfused;
        if !unfused {
            crate::attention::check_shape((dims.b, dims.t, dims.nh, dims.hs))?;
        }
        let need = model::device_bytes(&cfg, b, unfused, std::mem::size_of::<T>());
        let (free, _) = gpu.memory_info()?;
        if need + model::HEADROOM > free {
            return Err(GptError::BatchTooLarge {
                batch: b,
                need,
                free,
            });
        }
        for (what, n) in dims.largest_indices(unfused) {
            kernels::u32_of(what, n)?;
        }
        let model = Self::alloc(gpu, cfg, dims, layout, init, fusion)?;
        model.sync_weights(&mut gpu.default_stream())?;
        Ok(model)
    }

    fn alloc(
        gpu: &BoundDevice<'_>,
        cfg: Config,
        d: Dims,
        layout: ParamLayout,
        init: &[f32],
        fusion: Fusion,
    ) -> Result<Gpt<T>> {
        let (bt, c) = (d.bt(), d.c);
        let unfused = fusion.attention == AttnMode::Unfused;
        // The buffers only one attention path uses: one element for the other.
        let (un, fu) = (
            |n: usize| if unfused { n } else { 1 },
            |n: usize| if unfused { 1 } else { n },
        );
        // The mma attention's buffers likewise.
        let mma_attn = T::BF16 && fusion.attention == AttnMode::Fused;
        let mma = |n: usize| if mma_attn { n } else { 1 };
        let rows = d.b * d.nh * d.t;
        let blocks = (0..d.l)
            .map(|_| {
                Ok(Block {
                    ln1: z(gpu, bt * c)?,
                    ln1_mean: z(gpu, bt)?,
                    ln1_rstd: z(gpu, bt)?,
                    qkv: z(gpu, bt * 3 * c)?,
                    lse: z(gpu, fu(rows))?,
                    q: z(gpu, un(bt * c))?,
                    k: z(gpu, un(bt * c))?,
                    v: z(gpu, un(bt * c))?,
                    att: z(gpu, un(d.att()))?,
                    atty: z(gpu, un(bt * c))?,
                    atty_un: z(gpu, bt * c)?,
                    res2: z(gpu, bt * c)?,
                    ln2: z(gpu, bt * c)?,
                    ln2_mean: z(gpu, bt)?,
                    ln2_rstd: z(gpu, bt)?,
                    fch: z(gpu, bt * 4 * c)?,
                    fch_gelu: z(gpu, bt * 4 * c)?,
                    res3: z(gpu, bt * c)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let sc = Scratch {
            preatt: z(gpu, un(d.att()))?,
            proj: z(gpu, bt * c)?,
            dres: z(gpu, bt * c)?,
            dln: z(gpu, bt * c)?,
            dqkv: z(gpu, bt * 3 * c)?,
            dq: z(gpu, un(bt * c))?,
            dk: z(gpu, un(bt * c))?,
            dv: z(gpu, un(bt * c))?,
            dsum: z(gpu, fu(rows))?,
            datt: z(gpu, un(d.att()))?,
            daty: z(gpu, un(bt * c))?,
            daty_un: z(gpu, bt * c)?,
            dfch: z(gpu, bt * 4 * c)?,
            dfch_gelu: z(gpu, bt * 4 * c)?,
            dlogits: z(gpu, bt * d.v)?,
            partial: z(gpu, kernels::colsum_parts(bt) * 4 * c)?,
            res_partial: z(gpu, kernels::colsum_parts(bt) * c)?,
            qkv_partial: z(gpu, mma(attention::bias_partial_len(d.b, d.t, c)))?,
            wte_partial: z(gpu, kernels::wte_parts(bt) * d.v * c)?,
            norm_partial: z(gpu, NORM_PARTS)?,
        };
        let decay = gpu.clone_htod(&layout.decay_mask())?;
        Ok(Gpt {
            cfg,
            dims: d,
            params: gpu.clone_htod(init)?,
            weights: z(gpu, layout.total)?,
            grads: z(gpu, layout.total)?,
            m: z(gpu, layout.total)?,
            v: z(gpu, layout.total)?,
            layout,
            blocks,
            encoded: z(gpu, bt * c)?,
            lnf: z(gpu, bt * c)?,
            lnf_mean: z(gpu, bt)?,
            lnf_rstd: z(gpu, bt)?,
            logits: z(gpu, bt * d.v)?,
            losses: z(gpu, bt)?,
            loss: z(gpu, 1)?,
            tokens: gpu.alloc_zeros::<u32>(bt)?,
            targets: gpu.alloc_zeros::<u32>(bt)?,
            sched: z(gpu, SCHED_LEN)?,
            grad_scale: 1.0,
            normsq: z(gpu, 1)?,
            decay,
            sc,
            k: Kernels::load(gpu, T::BF16)?,
            attn: match fusion.attention {
                AttnMode::Unfused | AttnMode::Auto => None,
                AttnMode::Fused => Some(Attention::load(gpu, T::BF16, true)?),
                AttnMode::Tiled => Some(Attention::load(gpu, T::BF16, false)?),
            },
            fusion,
            blas: {
                let blas = gpu.new_blas()?;
                blas.set_algo_selection(fusion.gemm_algos);
                blas
            },
        })
    }

    /// Converts the master weights into `weights` (after an upload of `params`).
    pub fn sync_weights(&self, s: &mut BoundStream<'_>) -> Result<()> {
        self.k.cast_weights(s, &self.weights, &self.params)
    }

    /// The issuer of a step's parts eagerly on `s` ([`step::train_step`]).
    pub fn eager<'x, 's>(&'x self, s: &'x mut BoundStream<'s>) -> Result<Eager<'x, 's, T>> {
        Eager::new(s, self)
    }

    /// The forward pass over `tokens`: logits, and the mean loss against `targets` into
    /// `loss` (with `grad`, the logits' gradient too).
    pub fn forward(&self, s: &mut BoundStream<'_>, grad: bool) -> Result<()> {
        self.eager(s)?.issue(Part::Forward { grad })
    }

    /// Uploads a batch (`tokens` and `targets`, `b × t` each, below the vocabulary).
    pub fn upload(&mut self, gpu: &BoundDevice<'_>, x: &[u32], y: &[u32]) -> Result<()> {
        gpu.htod_copy(x, &mut self.tokens)?;
        gpu.htod_copy(y, &mut self.targets)
    }
}
