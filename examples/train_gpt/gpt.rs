//! The GPT on one device: parameters, gradients and AdamW moments as flat buffers,
//! preallocated activations per block (as llm.c), and the forward pass, backward pass
//! and optimizer step as NVRTC kernels ([`Kernels`]) and cuBLAS products.
//!
//! Kernel outputs are passed as `&mut` to say which buffers a launch writes (the
//! wrappers take `&`, as launches order every buffer argument as written).
#![allow(clippy::unnecessary_mut_passed)]

#[path = "graph.rs"]
pub mod graph;

use crate::GptError;
use crate::args::{AttnMode, Fusion};
use crate::attend;
use crate::attention::Attention;
use crate::kernels::{self, Kernels, NORM_PARTS};
use crate::linear::Lin;
use crate::model::{Config, Dims, ParamLayout, linear};
use crate::optim::{AdamW, SCHED_LEN};
pub use crate::precision::Act;
use gpubind::blas::{Blas, BlasScalar, Matmul};
use gpubind::{
    BoundDevice, BoundStream, DeviceMemory, DeviceMemoryMut, DeviceRepr, DeviceSlice, Result,
};

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
    partial: DeviceSlice<f32>,
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
    blas: Blas,
}

fn z<T: DeviceRepr>(gpu: &BoundDevice<'_>, n: usize) -> Result<DeviceSlice<T>> {
    gpu.alloc_zeros::<T>(n)
}

fn mm<T: BlasScalar>(
    s: &BoundStream<'_>,
    blas: &mut Blas,
    shape: Matmul,
    a: &impl DeviceMemory<T>,
    b: &impl DeviceMemory<T>,
    c: &mut impl DeviceMemoryMut<T>,
) -> Result<()> {
    s.matmul(blas, &shape, a, b, c)
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
        let t = std::mem::size_of::<T>();
        let need = dims.activation_floats(unfused) * t + layout.total * (3 * 4 + 2 * t);
        let (free, _) = gpu.memory_info()?;
        if need + (1 << 30) > free {
            return Err(GptError::BatchTooLarge {
                batch: b,
                need,
                free,
            });
        }
        let att = if unfused { dims.att() } else { 0 };
        for (what, n) in [("B·T·4C", dims.bt() * 4 * dims.c), ("B·NH·T·T", att)] {
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
            blas: gpu.new_blas()?,
        })
    }

    /// Converts the master weights into `weights` (after an upload of `params`).
    pub fn sync_weights(&self, s: &mut BoundStream<'_>) -> Result<()> {
        self.k.cast_weights(s, &self.weights, &self.params)
    }

    /// The forward pass over `tokens`: logits, and the mean loss against `targets` into
    /// `loss` (with `grad`, the logits' gradient too).
    pub fn forward(&mut self, s: &mut BoundStream<'_>, grad: bool) -> Result<()> {
        self.forward_embed(s)?;
        for l in 0..self.dims.l {
            self.forward_block(s, l)?;
        }
        self.forward_head(s, grad)
    }

    /// The embeddings: `encoded`.
    fn forward_embed(&mut self, s: &mut BoundStream<'_>) -> Result<()> {
        let d = self.dims;
        let c = d.c;
        let Gpt {
            layout,
            weights: p,
            k,
            ..
        } = self;
        let w = |name: &str| p.slice(layout.get(name).range());
        k.encoder_fwd(
            s,
            &mut self.encoded,
            &self.tokens,
            &w("wte.weight")?,
            &w("wpe.weight")?,
            (d.t, c),
        )?;
        Ok(())
    }

    /// Block `l`'s forward pass.
    fn forward_block(&mut self, s: &mut BoundStream<'_>, l: usize) -> Result<()> {
        self.forward_attn(s, l)?;
        self.forward_mlp(s, l)
    }

    /// Block `l`'s attention (with its residual).
    fn forward_attn(&mut self, s: &mut BoundStream<'_>, l: usize) -> Result<()> {
        let d = self.dims;
        let (bt, c) = (d.bt(), d.c);
        let Gpt {
            layout,
            weights: p,
            blocks,
            k,
            blas,
            sc,
            fusion,
            attn,
            ..
        } = self;
        let wl = |l: usize, suffix: &str| p.slice(layout.block(l, suffix));
        let (done, rest) = blocks.split_at_mut(l);
        let x = if l == 0 {
            &self.encoded
        } else {
            &done[l - 1].res3
        };
        let bl = &mut rest[0];
        if l == 0 {
            // Later blocks' first layer norms come with the last block's residual.
            let ln1 = (&wl(l, "ln_1.weight")?, &wl(l, "ln_1.bias")?);
            let stats = (&mut bl.ln1_mean, &mut bl.ln1_rstd);
            k.layernorm_fwd(s, &mut bl.ln1, stats.0, stats.1, x, ln1, c)?;
        }
        let lin = Lin {
            ks: k,
            partial: &sc.partial,
            epilogues: fusion.epilogues,
        };
        let (w, b) = (wl(l, "attn.c_attn.weight")?, wl(l, "attn.c_attn.bias")?);
        lin.fwd_bias(s, blas, (bt, 3 * c, c), (&bl.ln1, &w, &b), &bl.qkv)?;
        let io = attend::Fwd {
            qkv: &bl.qkv,
            y: &bl.atty_un,
            lse: &bl.lse,
            q: &bl.q,
            k: &bl.k,
            v: &bl.v,
            preatt: &sc.preatt,
            att: &bl.att,
            atty: &bl.atty,
        };
        attend::forward(s, (k, attn.as_ref()), blas, d, io)?;
        mm(
            s,
            blas,
            linear(bt, c, c),
            &bl.atty_un,
            &wl(l, "attn.c_proj.weight")?,
            &mut sc.proj,
        )?;
        let ln2 = (&wl(l, "ln_2.weight")?, &wl(l, "ln_2.bias")?);
        let out = (&bl.res2, &bl.ln2, &bl.ln2_mean, &bl.ln2_rstd); // written
        let pb = wl(l, "attn.c_proj.bias")?;
        k.residual_layernorm(s, out, (x, &sc.proj, &pb), ln2)
    }

    /// Block `l`'s MLP (with its residual).
    fn forward_mlp(&mut self, s: &mut BoundStream<'_>, l: usize) -> Result<()> {
        let d = self.dims;
        let (bt, c) = (d.bt(), d.c);
        let Gpt {
            layout,
            weights: p,
            blocks,
            k,
            blas,
            sc,
            fusion,
            lnf,
            lnf_mean,
            lnf_rstd,
            ..
        } = self;
        let lnf_out = (lnf, lnf_mean, lnf_rstd);
        let wl = |l: usize, suffix: &str| p.slice(layout.block(l, suffix));
        let named = |name: &str| p.slice(layout.get(name).range());
        let (done, next) = blocks.split_at_mut(l + 1);
        let bl = &mut done[l];
        let lin = Lin {
            ks: k,
            partial: &sc.partial,
            epilogues: fusion.epilogues,
        };
        let (w, b) = (wl(l, "mlp.c_fc.weight")?, wl(l, "mlp.c_fc.bias")?);
        let fc = (&bl.ln2, &w, &b);
        lin.fwd_gelu(s, blas, (bt, 4 * c, c), fc, (&bl.fch, &bl.fch_gelu))?;
        mm(
            s,
            blas,
            linear(bt, c, 4 * c),
            &bl.fch_gelu,
            &wl(l, "mlp.c_proj.weight")?,
            &mut sc.proj,
        )?;
        // res3, then the layer norm that reads it: the next block's first, or the final.
        let pb = wl(l, "mlp.c_proj.bias")?;
        let inp = (&bl.res2, &sc.proj, &pb);
        match next.first_mut() {
            Some(nb) => {
                let ln1 = (&wl(l + 1, "ln_1.weight")?, &wl(l + 1, "ln_1.bias")?);
                let out = (&bl.res3, &nb.ln1, &nb.ln1_mean, &nb.ln1_rstd); // written
                k.residual_layernorm(s, out, inp, ln1)
            }
            None => {
                let lnf = (&named("ln_f.weight")?, &named("ln_f.bias")?);
                let out = (&bl.res3, &*lnf_out.0, &*lnf_out.1, &*lnf_out.2); // written
                k.residual_layernorm(s, out, inp, lnf)
            }
        }
    }

    /// The head and the loss (after the final layer norm, which came with the last
    /// block's residual).
    fn forward_head(&mut self, s: &mut BoundStream<'_>, grad: bool) -> Result<()> {
        let d = self.dims;
        let (bt, c) = (d.bt(), d.c);
        let Gpt {
            layout,
            weights: p,
            k,
            blas,
            sc,
            ..
        } = self;
        let w = |name: &str| p.slice(layout.get(name).range());
        mm(
            s,
            blas,
            linear(bt, d.v, c),
            &self.lnf,
            &w("wte.weight")?,
            &mut self.logits,
        )?;
        k.xent(
            s,
            &mut sc.dlogits,
            &mut self.losses,
            &mut self.loss,
            &self.logits,
            &self.targets,
            d.v,
            grad.then_some(self.grad_scale),
        )
    }

    /// The backward pass (after `forward(.., true)`): every parameter's gradient into
    /// `grads` (overwritten).
    pub fn backward(&mut self, s: &mut BoundStream<'_>) -> Result<()> {
        self.backward_head(s)?;
        for l in (0..self.dims.l).rev() {
            self.backward_block(s, l)?;
        }
        self.backward_embed(s)
    }

    /// The head and the final layer norm: `dres` and their gradients.
    pub fn backward_head(&mut self, s: &mut BoundStream<'_>) -> Result<()> {
        let d = self.dims;
        let (bt, c) = (d.bt(), d.c);
        let Gpt {
            layout,
            weights: p,
            grads: g,
            blocks,
            k,
            blas,
            sc,
            ..
        } = self;
        let w = |name: &str| p.slice(layout.get(name).range());
        let gr = |name: &str| layout.get(name).range();
        // Head (tied to wte): dwte = dlogitsᵀ·lnf, dlnf = dlogits·wte.
        mm(
            s,
            blas,
            Matmul::new(d.v, c, bt).transpose_a(),
            &sc.dlogits,
            &self.lnf,
            &mut g.slice_mut(gr("wte.weight"))?,
        )?;
        mm(
            s,
            blas,
            Matmul::new(bt, c, d.v),
            &sc.dlogits,
            &w("wte.weight")?,
            &mut sc.dln,
        )?;
        s.memset_zeros_async(&mut sc.dres)?;
        let lnf_wb = layout.get("ln_f.weight").offset..layout.get("ln_f.bias").range().end;
        let last = &blocks[d.l - 1].res3;
        k.layernorm_bwd(
            s,
            &mut sc.dres,
            &mut g.slice_mut(lnf_wb)?,
            &mut sc.partial,
            &sc.dln,
            last,
            (&self.lnf_mean, &self.lnf_rstd),
            &w("ln_f.weight")?,
        )?;
        Ok(())
    }

    /// Block `l`'s backward pass: its gradients, and `dres` becomes its input's.
    pub fn backward_block(&mut self, s: &mut BoundStream<'_>, l: usize) -> Result<()> {
        self.backward_mlp(s, l)?;
        self.backward_attn(s, l)
    }

    /// Block `l`'s MLP backward pass (and its second layer norm's).
    fn backward_mlp(&mut self, s: &mut BoundStream<'_>, l: usize) -> Result<()> {
        let d = self.dims;
        let (bt, c) = (d.bt(), d.c);
        let Gpt {
            layout,
            weights: p,
            grads: g,
            blocks,
            k,
            blas,
            sc,
            fusion,
            ..
        } = self;
        let wl = |l: usize, suffix: &str| p.slice(layout.block(l, suffix));
        let gl = |l: usize, suffix: &str| layout.block(l, suffix);
        let bl = &blocks[l];
        let lin = Lin {
            ks: k,
            partial: &sc.partial,
            epilogues: fusion.epilogues,
        };
        let gv = |suffix: &str| g.slice(gl(l, suffix));
        // MLP: res3 = res2 + fch_gelu·Wpᵀ + b, fch_gelu = gelu(fch), fch = ln2·Wfᵀ + bf.
        let (dwp, dbp) = (gv("mlp.c_proj.weight")?, gv("mlp.c_proj.bias")?);
        let io = (&sc.dres, &bl.fch_gelu);
        lin.weight_grad(s, blas, (bt, c, 4 * c), io, &dwp, Some(&dbp))?;
        let (wp, dbf) = (wl(l, "mlp.c_proj.weight")?, gv("mlp.c_fc.bias")?);
        let through = (&sc.dres, &wp, &bl.fch);
        lin.gelu_grad(
            s,
            blas,
            (bt, c, 4 * c),
            through,
            (&sc.dfch, &dbf),
            &sc.dfch_gelu,
        )?;
        let dwf = gv("mlp.c_fc.weight")?;
        lin.weight_grad(s, blas, (bt, 4 * c, c), (&sc.dfch, &bl.ln2), &dwf, None)?;
        mm(
            s,
            blas,
            Matmul::new(bt, c, 4 * c),
            &sc.dfch,
            &wl(l, "mlp.c_fc.weight")?,
            &mut sc.dln,
        )?;
        let ln2_wb = gl(l, "ln_2.weight").start..gl(l, "ln_2.bias").end;
        k.layernorm_bwd(
            s,
            &mut sc.dres,
            &mut g.slice_mut(ln2_wb)?,
            &mut sc.partial,
            &sc.dln,
            &bl.res2,
            (&bl.ln2_mean, &bl.ln2_rstd),
            &wl(l, "ln_2.weight")?,
        )?;
        Ok(())
    }

    /// Block `l`'s attention backward pass (and its first layer norm's).
    fn backward_attn(&mut self, s: &mut BoundStream<'_>, l: usize) -> Result<()> {
        self.backward_attn_core(s, l)?;
        self.backward_qkv(s, l)
    }

    /// Block `l`'s attention projection and attention backward: `dqkv`.
    fn backward_attn_core(&mut self, s: &mut BoundStream<'_>, l: usize) -> Result<()> {
        let d = self.dims;
        let (bt, c) = (d.bt(), d.c);
        let Gpt {
            layout,
            weights: p,
            grads: g,
            blocks,
            k,
            blas,
            sc,
            fusion,
            attn,
            ..
        } = self;
        let wl = |l: usize, suffix: &str| p.slice(layout.block(l, suffix));
        let gl = |l: usize, suffix: &str| layout.block(l, suffix);
        let bl = &blocks[l];
        let lin = Lin {
            ks: k,
            partial: &sc.partial,
            epilogues: fusion.epilogues,
        };
        // Attention projection: res2 = x + atty_un·Wᵀ + b.
        let dw = g.slice(gl(l, "attn.c_proj.weight"))?;
        let db = g.slice(gl(l, "attn.c_proj.bias"))?;
        let io = (&sc.dres, &bl.atty_un);
        lin.weight_grad(s, blas, (bt, c, c), io, &dw, Some(&db))?;
        mm(
            s,
            blas,
            Matmul::new(bt, c, c),
            &sc.dres,
            &wl(l, "attn.c_proj.weight")?,
            &mut sc.daty_un,
        )?;
        let io = attend::Bwd {
            qkv: &bl.qkv,
            y: &bl.atty_un,
            lse: &bl.lse,
            q: &bl.q,
            k: &bl.k,
            v: &bl.v,
            att: &bl.att,
            dy: &sc.daty_un,
            dqkv: &sc.dqkv,
            dsum: &sc.dsum,
            daty: &sc.daty,
            dq: &sc.dq,
            dk: &sc.dk,
            dv: &sc.dv,
            datt: &sc.datt,
            dpre: &sc.preatt,
        };
        attend::backward(s, (k, attn.as_ref()), blas, d, io)
    }

    /// Block `l`'s QKV projection and first layer norm backward.
    fn backward_qkv(&mut self, s: &mut BoundStream<'_>, l: usize) -> Result<()> {
        let d = self.dims;
        let (bt, c) = (d.bt(), d.c);
        let Gpt {
            layout,
            weights: p,
            grads: g,
            blocks,
            k,
            blas,
            sc,
            fusion,
            ..
        } = self;
        let wl = |l: usize, suffix: &str| p.slice(layout.block(l, suffix));
        let gl = |l: usize, suffix: &str| layout.block(l, suffix);
        let (done, rest) = blocks.split_at(l);
        let x = if l == 0 {
            &self.encoded
        } else {
            &done[l - 1].res3
        };
        let bl = &rest[0];
        let lin = Lin {
            ks: k,
            partial: &sc.partial,
            epilogues: fusion.epilogues,
        };
        let dw = g.slice(gl(l, "attn.c_attn.weight"))?;
        let db = g.slice(gl(l, "attn.c_attn.bias"))?;
        let io = (&sc.dqkv, &bl.ln1);
        lin.weight_grad(s, blas, (bt, 3 * c, c), io, &dw, Some(&db))?;
        mm(
            s,
            blas,
            Matmul::new(bt, c, 3 * c),
            &sc.dqkv,
            &wl(l, "attn.c_attn.weight")?,
            &mut sc.dln,
        )?;
        let ln1_wb = gl(l, "ln_1.weight").start..gl(l, "ln_1.bias").end;
        k.layernorm_bwd(
            s,
            &mut sc.dres,
            &mut g.slice_mut(ln1_wb)?,
            &mut sc.partial,
            &sc.dln,
            x,
            (&bl.ln1_mean, &bl.ln1_rstd),
            &wl(l, "ln_1.weight")?,
        )?;
        Ok(())
    }

    /// The embeddings' gradients.
    pub fn backward_embed(&mut self, s: &mut BoundStream<'_>) -> Result<()> {
        let d = self.dims;
        let c = d.c;
        let Gpt {
            layout,
            grads: g,
            k,
            sc,
            ..
        } = self;
        let gr = |name: &str| layout.get(name).range();
        let [mut dwte, mut dwpe] = g.get_disjoint_mut([gr("wte.weight"), gr("wpe.weight")])?;
        k.encoder_bwd(
            s,
            (&mut dwte, &mut dwpe),
            &mut sc.wte_partial,
            &sc.dres,
            &self.tokens,
            (d.b, d.t, c, d.v),
        )
    }

    /// Clips the gradients to norm `hp.max_norm` and applies AdamW with the lr and bias
    /// corrections in `sched` (uploaded by the caller).
    pub fn update(&mut self, s: &mut BoundStream<'_>, hp: &AdamW) -> Result<()> {
        let Gpt {
            params,
            weights,
            grads,
            m,
            v,
            k,
            sc,
            sched,
            normsq,
            decay,
            ..
        } = self;
        k.sumsq(s, normsq, &mut sc.norm_partial, grads)?;
        // Writes params, weights, m and v.
        let tensors = (&*params, &*weights, &*grads);
        k.adamw(s, tensors, (&*m, &*v), &*sched, &*normsq, &*decay, hp)
    }

    /// Uploads a batch (`tokens` and `targets`, `b × t` each, below the vocabulary).
    pub fn upload(&mut self, gpu: &BoundDevice<'_>, x: &[u32], y: &[u32]) -> Result<()> {
        gpu.htod_copy(x, &mut self.tokens)?;
        gpu.htod_copy(y, &mut self.targets)
    }
}
