//! The step's parts ([`Part`]) as products, memsets and kernels, generic over where they
//! go (gpubind's [`Enqueue`]: a stream or a graph capture): the one description of the
//! forward pass, the backward pass and the update that the eager and the captured steps
//! both issue.
//!
//! Every buffer is taken by shared reference; the outputs of kernels, products and
//! memsets are claimed as written (`arg_written`, `Enqueue`, `Issue::memset_zeros`), so a
//! captured part can borrow them for the graph's lifetime.

use super::graph::Views;
use super::step::Part;
use super::{Act, Gpt};
use crate::attend;
use crate::linear::Lin;
use crate::model::linear;
use crate::optim::AdamW;
use gpubind::blas::{Blas, Enqueue, Matmul};
use gpubind::{DeviceSlice, Result};

/// Where a part goes and what it reads besides the model: the stream or capture, the
/// cuBLAS handle of its products, and views of the model's weights and gradients.
struct On<'x, 'b, E, T: Act> {
    e: &'x mut E,
    blas: &'x Blas,
    vw: &'b Views<'b, T>,
}

impl<T: Act> Gpt<T> {
    /// Issues `part` on `e`, with `blas` for the products and `vw`, views of this
    /// model's weights and gradients.
    pub(super) fn issue<'b, E: Enqueue<'b>>(
        &'b self,
        e: &mut E,
        blas: &Blas,
        vw: &'b Views<'b, T>,
        part: Part,
    ) -> Result<()> {
        let on = &mut On { e, blas, vw };
        match part {
            Part::Forward { grad } => {
                self.fwd_embed(on)?;
                for l in 0..self.dims.l {
                    self.fwd_attn(on, l)?;
                    self.fwd_mlp(on, l)?;
                }
                self.fwd_head(on, grad)
            }
            Part::Head => {
                self.bwd_head_products(on)?;
                on.e.memset_zeros(&self.sc.dres)?;
                self.bwd_head_norm(on)
            }
            Part::Block(l) => {
                self.bwd_mlp(on, l)?;
                self.bwd_attn_core(on, l)?;
                self.bwd_qkv(on, l)
            }
            Part::Embed => self.bwd_embed(on),
            Part::Update(hp) => self.clip_adamw(on.e, &hp),
        }
    }

    /// The linear layers' biases and GELU as `--epilogues` says.
    fn lin(&self) -> Lin<'_> {
        Lin {
            ks: &self.k,
            partial: &self.sc.partial,
            epilogues: self.fusion.epilogues,
        }
    }

    /// Block `l`'s input: the embeddings, or the last block's residual stream.
    fn block_input(&self, l: usize) -> &DeviceSlice<T> {
        match l.checked_sub(1) {
            None => &self.encoded,
            Some(prev) => &self.blocks[prev].res3,
        }
    }

    /// Block `l`'s attention buffers that its backward pass reads again.
    fn saved(&self, l: usize) -> attend::Saved<'_, T> {
        let bl = &self.blocks[l];
        attend::Saved {
            qkv: &bl.qkv,
            y: &bl.atty_un,
            lse: &bl.lse,
            q: &bl.q,
            k: &bl.k,
            v: &bl.v,
            att: &bl.att,
        }
    }

    /// The embeddings: `encoded`.
    fn fwd_embed<'b>(&'b self, on: &mut On<'_, 'b, impl Enqueue<'b>, T>) -> Result<()> {
        let (d, w) = (self.dims, (on.vw.w("wte.weight"), on.vw.w("wpe.weight")));
        let tokens = &self.tokens;
        self.k
            .encoder_fwd(on.e, &self.encoded, tokens, w.0, w.1, (d.t, d.c))
    }

    /// Block `l`'s attention (with its residual).
    fn fwd_attn<'b>(&'b self, on: &mut On<'_, 'b, impl Enqueue<'b>, T>, l: usize) -> Result<()> {
        let vw = on.vw;
        let (d, k, sc) = (self.dims, &self.k, &self.sc);
        let (bt, c) = (d.bt(), d.c);
        let x = self.block_input(l);
        let bl = &self.blocks[l];
        if l == 0 {
            // Later blocks' first layer norms come with the last block's residual.
            let ln1 = (vw.wl(l, "ln_1.weight"), vw.wl(l, "ln_1.bias"));
            k.layernorm_fwd(on.e, &bl.ln1, &bl.ln1_mean, &bl.ln1_rstd, x, ln1, c)?;
        }
        let (w, b) = (vw.wl(l, "attn.c_attn.weight"), vw.wl(l, "attn.c_attn.bias"));
        self.lin()
            .fwd_bias(on.e, on.blas, (bt, 3 * c, c), (&bl.ln1, w, b), &bl.qkv)?;
        let io = attend::Fwd {
            saved: self.saved(l),
            preatt: &sc.preatt,
            atty: &bl.atty,
        };
        attend::forward(on.e, (k, self.attn.as_ref()), on.blas, d, io)?;
        let wp = vw.wl(l, "attn.c_proj.weight");
        let proj = (&bl.atty_un, wp, vw.wl(l, "attn.c_proj.bias"));
        let ln2 = (vw.wl(l, "ln_2.weight"), vw.wl(l, "ln_2.bias"));
        let out = (&bl.res2, &bl.ln2, &bl.ln2_mean, &bl.ln2_rstd); // written
        self.lin()
            .residual_norm(on.e, on.blas, (bt, c, c), proj, (x, &sc.proj), out, ln2)
    }

    /// Block `l`'s MLP (with its residual).
    fn fwd_mlp<'b>(&'b self, on: &mut On<'_, 'b, impl Enqueue<'b>, T>, l: usize) -> Result<()> {
        let vw = on.vw;
        let (d, sc) = (self.dims, &self.sc);
        let (bt, c) = (d.bt(), d.c);
        let bl = &self.blocks[l];
        let fc = (
            &bl.ln2,
            vw.wl(l, "mlp.c_fc.weight"),
            vw.wl(l, "mlp.c_fc.bias"),
        );
        let gelu = (&bl.fch, &bl.fch_gelu);
        self.lin()
            .fwd_gelu(on.e, on.blas, (bt, 4 * c, c), fc, gelu)?;
        let wp = vw.wl(l, "mlp.c_proj.weight");
        let proj = (&bl.fch_gelu, wp, vw.wl(l, "mlp.c_proj.bias"));
        let inp = (&bl.res2, &sc.proj);
        // res3, then the layer norm that reads it: the next block's first, or the final.
        let (out, lnw) = match self.blocks.get(l + 1) {
            Some(nb) => {
                let ln1 = (vw.wl(l + 1, "ln_1.weight"), vw.wl(l + 1, "ln_1.bias"));
                ((&bl.res3, &nb.ln1, &nb.ln1_mean, &nb.ln1_rstd), ln1) // written
            }
            None => {
                let lnf = (vw.w("ln_f.weight"), vw.w("ln_f.bias"));
                ((&bl.res3, &self.lnf, &self.lnf_mean, &self.lnf_rstd), lnf) // written
            }
        };
        self.lin()
            .residual_norm(on.e, on.blas, (bt, c, 4 * c), proj, inp, out, lnw)
    }

    /// The head and the loss (after the final layer norm, which came with the last
    /// block's residual).
    fn fwd_head<'b>(&'b self, on: &mut On<'_, 'b, impl Enqueue<'b>, T>, grad: bool) -> Result<()> {
        let d = self.dims;
        let (bt, c) = (d.bt(), d.c);
        let wte = on.vw.w("wte.weight");
        let shape = linear(bt, d.v, c);
        self.lin()
            .product(on.e, on.blas, &shape, (&self.lnf, wte), &self.logits)?;
        self.k.xent(
            on.e,
            &self.sc.dlogits,
            &self.losses,
            &self.loss,
            &self.logits,
            &self.targets,
            d.v,
            grad.then_some(self.grad_scale),
        )
    }

    /// The head (tied to wte): `dwte = dlogitsᵀ·lnf`, `dln = dlogits·wte`.
    fn bwd_head_products<'b>(&'b self, on: &mut On<'_, 'b, impl Enqueue<'b>, T>) -> Result<()> {
        let (d, sc) = (self.dims, &self.sc);
        let (bt, c) = (d.bt(), d.c);
        let head = Matmul::new(d.v, c, bt).transpose_a();
        let dwte = on.vw.g("wte.weight");
        self.lin()
            .product(on.e, on.blas, &head, (&sc.dlogits, &self.lnf), dwte)?;
        let wte = on.vw.w("wte.weight");
        let shape = Matmul::new(bt, c, d.v);
        self.lin()
            .product(on.e, on.blas, &shape, (&sc.dlogits, wte), &sc.dln)
    }

    /// The final layer norm's backward pass: `dres` and its gradients.
    fn bwd_head_norm<'b>(&'b self, on: &mut On<'_, 'b, impl Enqueue<'b>, T>) -> Result<()> {
        let sc = &self.sc;
        let last = &self.blocks[self.dims.l - 1].res3;
        let stats = (&self.lnf_mean, &self.lnf_rstd);
        let (dwb, w) = (on.vw.g_pair("ln_f.weight"), on.vw.w("ln_f.weight"));
        // dres is the last block's MLP output gradient: its bias gradient comes along.
        let res = (
            on.vw.gl(self.dims.l - 1, "mlp.c_proj.bias"),
            &sc.res_partial,
        );
        let p = &sc.partial;
        self.k
            .layernorm_bwd(on.e, &sc.dres, dwb, p, &sc.dln, last, stats, w, Some(res))
    }

    /// Block `l`'s MLP backward pass (and its second layer norm's).
    fn bwd_mlp<'b>(&'b self, on: &mut On<'_, 'b, impl Enqueue<'b>, T>, l: usize) -> Result<()> {
        let vw = on.vw;
        let (d, k, sc) = (self.dims, &self.k, &self.sc);
        let (bt, c) = (d.bt(), d.c);
        let bl = &self.blocks[l];
        let lin = self.lin();
        // MLP: res3 = res2 + fch_gelu·Wpᵀ + b, fch_gelu = gelu(fch), fch = ln2·Wfᵀ + bf.
        // The bias gradient came with the layer norm backward that wrote dres.
        let dwp = vw.gl(l, "mlp.c_proj.weight");
        let io = (&sc.dres, &bl.fch_gelu);
        lin.weight_grad(on.e, on.blas, (bt, c, 4 * c), io, dwp, None)?;
        let through = (&sc.dres, vw.wl(l, "mlp.c_proj.weight"), &bl.fch);
        let out = (&sc.dfch, vw.gl(l, "mlp.c_fc.bias"));
        lin.gelu_grad(on.e, on.blas, (bt, c, 4 * c), through, out, &sc.dfch_gelu)?;
        let (io, dwf) = ((&sc.dfch, &bl.ln2), vw.gl(l, "mlp.c_fc.weight"));
        lin.weight_grad(on.e, on.blas, (bt, 4 * c, c), io, dwf, None)?;
        let wf = vw.wl(l, "mlp.c_fc.weight");
        let shape = Matmul::new(bt, c, 4 * c);
        self.lin()
            .product(on.e, on.blas, &shape, (&sc.dfch, wf), &sc.dln)?;
        let stats = (&bl.ln2_mean, &bl.ln2_rstd);
        let (dwb, w) = (vw.g_pair_l(l, "ln_2.weight"), vw.wl(l, "ln_2.weight"));
        // dres is now the attention projection's output gradient: its bias gradient.
        let res = (vw.gl(l, "attn.c_proj.bias"), &sc.res_partial);
        k.layernorm_bwd(
            on.e,
            &sc.dres,
            dwb,
            &sc.partial,
            &sc.dln,
            &bl.res2,
            stats,
            w,
            Some(res),
        )
    }

    /// Block `l`'s attention projection and attention backward: `dqkv`.
    fn bwd_attn_core<'b>(
        &'b self,
        on: &mut On<'_, 'b, impl Enqueue<'b>, T>,
        l: usize,
    ) -> Result<()> {
        let vw = on.vw;
        let (d, sc) = (self.dims, &self.sc);
        let (bt, c) = (d.bt(), d.c);
        let bl = &self.blocks[l];
        // Attention projection: res2 = x + atty_un·Wᵀ + b.
        // The bias gradient came with the second layer norm's backward.
        let dw = vw.gl(l, "attn.c_proj.weight");
        let io = (&sc.dres, &bl.atty_un);
        self.lin()
            .weight_grad(on.e, on.blas, (bt, c, c), io, dw, None)?;
        let wp = vw.wl(l, "attn.c_proj.weight");
        let shape = Matmul::new(bt, c, c);
        self.lin()
            .product(on.e, on.blas, &shape, (&sc.dres, wp), &sc.daty_un)?;
        // The QKV bias gradient comes with the attention where its kernels sum it.
        let bias = attend::sums_qkv_bias(self.attn.as_ref())
            .then(|| (vw.gl(l, "attn.c_attn.bias"), &sc.qkv_partial));
        let io = attend::Bwd {
            bias,
            saved: self.saved(l),
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
        attend::backward(on.e, (&self.k, self.attn.as_ref()), on.blas, d, io)
    }

    /// Block `l`'s QKV projection and first layer norm backward.
    fn bwd_qkv<'b>(&'b self, on: &mut On<'_, 'b, impl Enqueue<'b>, T>, l: usize) -> Result<()> {
        let vw = on.vw;
        let (d, sc) = (self.dims, &self.sc);
        let (bt, c) = (d.bt(), d.c);
        let x = self.block_input(l);
        let bl = &self.blocks[l];
        let dw = vw.gl(l, "attn.c_attn.weight");
        // The bias gradient: from the attention backward where it summed it, else here.
        let db = (!attend::sums_qkv_bias(self.attn.as_ref())).then(|| vw.gl(l, "attn.c_attn.bias"));
        let io = (&sc.dqkv, &bl.ln1);
        self.lin()
            .weight_grad(on.e, on.blas, (bt, 3 * c, c), io, dw, db)?;
        let wa = vw.wl(l, "attn.c_attn.weight");
        let shape = Matmul::new(bt, c, 3 * c);
        self.lin()
            .product(on.e, on.blas, &shape, (&sc.dqkv, wa), &sc.dln)?;
        let stats = (&bl.ln1_mean, &bl.ln1_rstd);
        let (dwb, w) = (vw.g_pair_l(l, "ln_1.weight"), vw.wl(l, "ln_1.weight"));
        // dres becomes the previous block's MLP output gradient: its bias gradient too.
        let res = l
            .checked_sub(1)
            .map(|p| (vw.gl(p, "mlp.c_proj.bias"), &sc.res_partial));
        let p = &sc.partial;
        self.k
            .layernorm_bwd(on.e, &sc.dres, dwb, p, &sc.dln, x, stats, w, res)
    }

    /// The embeddings' gradients.
    fn bwd_embed<'b>(&'b self, on: &mut On<'_, 'b, impl Enqueue<'b>, T>) -> Result<()> {
        let d = self.dims;
        let dw = (on.vw.g("wte.weight"), on.vw.g("wpe.weight"));
        let (partial, dout) = (&self.sc.wte_partial, &self.sc.dres);
        let dims = (d.b, d.t, d.c, d.v);
        self.k
            .encoder_bwd(on.e, dw, partial, dout, &self.tokens, dims)
    }

    /// Clips the gradients to norm `hp.max_norm` and applies AdamW with the lr and bias
    /// corrections in `sched`: writes `params`, `weights`, `m` and `v`.
    fn clip_adamw<'b>(&'b self, e: &mut impl Enqueue<'b>, hp: &AdamW) -> Result<()> {
        let (k, sc) = (&self.k, &self.sc);
        k.sumsq(e, &self.normsq, &sc.norm_partial, &self.grads)?;
        let tensors = (&self.params, &self.weights, &self.grads);
        let moments = (&self.m, &self.v);
        k.adamw(
            e,
            tensors,
            moments,
            &self.sched,
            &self.normsq,
            &self.decay,
            hp,
        )
    }
}
