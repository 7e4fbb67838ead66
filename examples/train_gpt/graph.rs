//! `--graph`: the whole training step — forward, backward, gradient clipping and AdamW —
//! captured once into a CUDA graph ([`Gpt::capture`]) and launched every step, and the
//! validation forward pass likewise.
//!
//! The graph reads its inputs (tokens, targets, the schedule's lr and bias corrections)
//! from the model's device buffers, which it holds borrowed (shared) for its lifetime.
//! `htod_copy` needs `&mut` of its destination, so a step's inputs are uploaded into
//! staging buffers ([`Staging`]) and moved into the graph's input buffers by an eager
//! `copy_words` kernel, which (like any launch) takes its buffers by shared reference and
//! is ordered before the graph's launch by gpubind's access tracking.
//!
//! The captured step is the eager one (`gpt.rs`) call for call, with shared views in
//! place of the `&mut` outputs of the eager products: `--check-graph` runs both and
//! requires the same losses bit for bit.

use super::{Act, Gpt};
use crate::attend;
use crate::linear::Lin;
use crate::model::{ParamLayout, linear};
use crate::optim::{AdamW, SCHED_LEN};
use gpubind::blas::{Blas, Matmul};
use gpubind::{
    BoundDevice, BoundStream, Capture, DeviceRepr, DeviceSlice, DeviceView, Graph, Result,
};

/// Views of the flat buffers per tensor, made before a capture so that they live as
/// long as its graph: parameters, gradients, and each layer norm's weight-and-bias
/// gradient pair.
pub struct Views<'a, T: Act> {
    /// The weights the products and kernels read.
    p: Vec<DeviceView<'a, T>>,
    g: Vec<DeviceView<'a, T>>,
    /// Indexed like `p`: `Some` at a layer norm's weight, covering weight and bias.
    g_pair: Vec<Option<DeviceView<'a, T>>>,
}

/// Device buffers the host writes a step's inputs into (see the module docs).
pub struct Staging {
    tokens: DeviceSlice<u32>,
    targets: DeviceSlice<u32>,
    sched: DeviceSlice<f32>,
}

impl Staging {
    pub fn new<T: Act>(gpu: &BoundDevice<'_>, model: &Gpt<T>) -> Result<Staging> {
        Ok(Staging {
            tokens: gpu.alloc_zeros(model.tokens.len())?,
            targets: gpu.alloc_zeros(model.targets.len())?,
            sched: gpu.alloc_zeros(SCHED_LEN)?,
        })
    }
}

impl<T: Act> Gpt<T> {
    /// The linear layers' biases and GELU as `--epilogues` says.
    fn lin(&self) -> Lin<'_> {
        Lin {
            ks: &self.k,
            partial: &self.sc.partial,
            epilogues: self.fusion.epilogues,
        }
    }

    /// The per-tensor views a capture needs.
    pub fn views(&self) -> Result<Views<'_, T>> {
        fn each<'x, E: DeviceRepr>(
            lay: &ParamLayout,
            buf: &'x DeviceSlice<E>,
        ) -> Result<Vec<DeviceView<'x, E>>> {
            lay.params.iter().map(|p| buf.slice(p.range())).collect()
        }
        let lay = &self.layout;
        let mut g_pair = Vec::new();
        for (i, p) in self.layout.params.iter().enumerate() {
            let is_ln = p.name.contains("ln_") && p.name.ends_with(".weight");
            g_pair.push(if is_ln {
                let bias = &self.layout.params[i + 1];
                Some(self.grads.slice(p.offset..bias.range().end)?)
            } else {
                None
            });
        }
        Ok(Views {
            p: each(lay, &self.weights)?,
            g: each(lay, &self.grads)?,
            g_pair,
        })
    }

    /// Captures a training step (`train`: forward, backward, clip and AdamW) or a
    /// validation forward pass. The graph borrows the model and `views`.
    pub fn capture<'a>(
        &'a self,
        gpu: &BoundDevice<'_>,
        views: &'a Views<'a, T>,
        hp: AdamW,
        train: bool,
    ) -> Result<Graph<'a>> {
        // The graph keeps the handle's workspace: this handle may go when the capture ends.
        let mut blas = gpu.new_blas()?;
        gpu.capture(|cap| {
            self.cap_forward(cap, &mut blas, views, train)?;
            if train {
                self.cap_backward(cap, &mut blas, views)?;
                self.cap_update(cap, &hp)?;
            }
            Ok(())
        })
    }

    /// Moves a step's inputs into the buffers the graphs read (`sched`: the schedule
    /// values, for a training step).
    pub fn feed(
        &self,
        gpu: &BoundDevice<'_>,
        s: &mut BoundStream<'_>,
        st: &mut Staging,
        (x, y): (&[u32], &[u32]),
        sched: Option<&[f32; SCHED_LEN]>,
    ) -> Result<()> {
        gpu.htod_copy(x, &mut st.tokens)?;
        gpu.htod_copy(y, &mut st.targets)?;
        self.k.copy_words(s, &self.tokens, &st.tokens)?;
        self.k.copy_words(s, &self.targets, &st.targets)?;
        if let Some(v) = sched {
            gpu.htod_copy(v, &mut st.sched)?;
            self.k.copy_words(s, &self.sched, &st.sched)?;
        }
        Ok(())
    }

    fn cap_forward<'a>(
        &'a self,
        cap: &mut Capture<'_, 'a>,
        blas: &mut Blas,
        vw: &'a Views<'a, T>,
        grad: bool,
    ) -> Result<()> {
        let (d, k, sc, lay) = (self.dims, &self.k, &self.sc, &self.layout);
        let (bt, c) = (d.b * d.t, d.c);
        let w = |name: &str| &vw.p[lay.index(name)];
        let wl = |l: usize, suffix: &str| &vw.p[lay.index(&format!("h.{l}.{suffix}"))];
        k.encoder_fwd(
            cap,
            &self.encoded,
            &self.tokens,
            w("wte.weight"),
            w("wpe.weight"),
            (d.t, c),
        )?;
        let lin = self.lin();
        for l in 0..d.l {
            let x = if l == 0 {
                &self.encoded
            } else {
                &self.blocks[l - 1].res3
            };
            let bl = &self.blocks[l];
            if l == 0 {
                // Later blocks' first layer norms come with the last block's residual.
                let ln1 = (wl(l, "ln_1.weight"), wl(l, "ln_1.bias"));
                k.layernorm_fwd(cap, &bl.ln1, &bl.ln1_mean, &bl.ln1_rstd, x, ln1, c)?;
            }
            let qkv = (
                &bl.ln1,
                wl(l, "attn.c_attn.weight"),
                wl(l, "attn.c_attn.bias"),
            );
            lin.fwd_bias(cap, blas, (bt, 3 * c, c), qkv, &bl.qkv)?;
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
            attend::forward(cap, (k, self.attn.as_ref()), blas, d, io)?;
            cap.matmul(
                blas,
                &linear(bt, c, c),
                &bl.atty_un,
                wl(l, "attn.c_proj.weight"),
                &sc.proj,
            )?;
            let ln2 = (wl(l, "ln_2.weight"), wl(l, "ln_2.bias"));
            let out = (&bl.res2, &bl.ln2, &bl.ln2_mean, &bl.ln2_rstd);
            let inp = (x, &sc.proj, wl(l, "attn.c_proj.bias"));
            k.residual_layernorm(cap, out, inp, ln2)?;
            let fc = (&bl.ln2, wl(l, "mlp.c_fc.weight"), wl(l, "mlp.c_fc.bias"));
            lin.fwd_gelu(cap, blas, (bt, 4 * c, c), fc, (&bl.fch, &bl.fch_gelu))?;
            cap.matmul(
                blas,
                &linear(bt, c, 4 * c),
                &bl.fch_gelu,
                wl(l, "mlp.c_proj.weight"),
                &sc.proj,
            )?;
            // res3, then the layer norm that reads it: the next block's first, or the final.
            let inp = (&bl.res2, &sc.proj, wl(l, "mlp.c_proj.bias"));
            match self.blocks.get(l + 1) {
                Some(nb) => {
                    let ln1 = (wl(l + 1, "ln_1.weight"), wl(l + 1, "ln_1.bias"));
                    let out = (&bl.res3, &nb.ln1, &nb.ln1_mean, &nb.ln1_rstd);
                    k.residual_layernorm(cap, out, inp, ln1)?;
                }
                None => {
                    let lnf = (w("ln_f.weight"), w("ln_f.bias"));
                    let out = (&bl.res3, &self.lnf, &self.lnf_mean, &self.lnf_rstd);
                    k.residual_layernorm(cap, out, inp, lnf)?;
                }
            }
        }
        cap.matmul(
            blas,
            &linear(bt, d.v, c),
            &self.lnf,
            w("wte.weight"),
            &self.logits,
        )?;
        k.xent(
            cap,
            &sc.dlogits,
            &self.losses,
            &self.loss,
            &self.logits,
            &self.targets,
            d.v,
            grad.then_some(self.grad_scale),
        )
    }

    fn cap_backward<'a>(
        &'a self,
        cap: &mut Capture<'_, 'a>,
        blas: &mut Blas,
        vw: &'a Views<'a, T>,
    ) -> Result<()> {
        let (d, k, sc, lay) = (self.dims, &self.k, &self.sc, &self.layout);
        let (bt, c) = (d.b * d.t, d.c);
        let w = |name: &str| &vw.p[lay.index(name)];
        let gw = |name: &str| &vw.g[lay.index(name)];
        let pair = |name: &str| {
            vw.g_pair[lay.index(name)]
                .as_ref()
                .expect("a layer-norm weight")
        };
        let head = Matmul::new(d.v, c, bt).transpose_a();
        cap.matmul(blas, &head, &sc.dlogits, &self.lnf, gw("wte.weight"))?;
        cap.matmul(
            blas,
            &Matmul::new(bt, c, d.v),
            &sc.dlogits,
            w("wte.weight"),
            &sc.dln,
        )?;
        cap.memset_zeros(&sc.dres)?;
        let last = &self.blocks[d.l - 1].res3;
        let stats = (&self.lnf_mean, &self.lnf_rstd);
        k.layernorm_bwd(
            cap,
            &sc.dres,
            pair("ln_f.weight"),
            &sc.partial,
            &sc.dln,
            last,
            stats,
            w("ln_f.weight"),
        )?;
        for l in (0..d.l).rev() {
            self.cap_backward_block(cap, blas, vw, l)?;
        }
        let dims = (d.b, d.t, c, d.v);
        let dw = (gw("wte.weight"), gw("wpe.weight"));
        k.encoder_bwd(cap, dw, &sc.wte_partial, &sc.dres, &self.tokens, dims)
    }

    /// Block `l`'s backward pass, captured.
    fn cap_backward_block<'a>(
        &'a self,
        cap: &mut Capture<'_, 'a>,
        blas: &mut Blas,
        vw: &'a Views<'a, T>,
        l: usize,
    ) -> Result<()> {
        self.cap_backward_mlp(cap, blas, vw, l)?;
        self.cap_backward_attn(cap, blas, vw, l)
    }

    /// Block `l`'s MLP backward pass, captured.
    fn cap_backward_mlp<'a>(
        &'a self,
        cap: &mut Capture<'_, 'a>,
        blas: &mut Blas,
        vw: &'a Views<'a, T>,
        l: usize,
    ) -> Result<()> {
        let (d, k, sc, lay) = (self.dims, &self.k, &self.sc, &self.layout);
        let (bt, c) = (d.b * d.t, d.c);
        let wl = |l: usize, suffix: &str| &vw.p[lay.index(&format!("h.{l}.{suffix}"))];
        let gl = |l: usize, suffix: &str| &vw.g[lay.index(&format!("h.{l}.{suffix}"))];
        let pair = |name: &str| {
            vw.g_pair[lay.index(name)]
                .as_ref()
                .expect("a layer-norm weight")
        };
        let bl = &self.blocks[l];
        let lin = self.lin();
        let (dwp, dbp) = (gl(l, "mlp.c_proj.weight"), gl(l, "mlp.c_proj.bias"));
        let io = (&sc.dres, &bl.fch_gelu);
        lin.weight_grad(cap, blas, (bt, c, 4 * c), io, dwp, Some(dbp))?;
        let through = (&sc.dres, wl(l, "mlp.c_proj.weight"), &bl.fch);
        let out = (&sc.dfch, gl(l, "mlp.c_fc.bias"));
        lin.gelu_grad(cap, blas, (bt, c, 4 * c), through, out, &sc.dfch_gelu)?;
        let io = (&sc.dfch, &bl.ln2);
        lin.weight_grad(
            cap,
            blas,
            (bt, 4 * c, c),
            io,
            gl(l, "mlp.c_fc.weight"),
            None,
        )?;
        cap.matmul(
            blas,
            &Matmul::new(bt, c, 4 * c),
            &sc.dfch,
            wl(l, "mlp.c_fc.weight"),
            &sc.dln,
        )?;
        let ln2 = pair(&format!("h.{l}.ln_2.weight"));
        let stats = (&bl.ln2_mean, &bl.ln2_rstd);
        k.layernorm_bwd(
            cap,
            &sc.dres,
            ln2,
            &sc.partial,
            &sc.dln,
            &bl.res2,
            stats,
            wl(l, "ln_2.weight"),
        )?;
        Ok(())
    }

    /// Block `l`'s attention backward pass, captured.
    fn cap_backward_attn<'a>(
        &'a self,
        cap: &mut Capture<'_, 'a>,
        blas: &mut Blas,
        vw: &'a Views<'a, T>,
        l: usize,
    ) -> Result<()> {
        let (d, k, sc, lay) = (self.dims, &self.k, &self.sc, &self.layout);
        let (bt, c) = (d.b * d.t, d.c);
        let wl = |l: usize, suffix: &str| &vw.p[lay.index(&format!("h.{l}.{suffix}"))];
        let gl = |l: usize, suffix: &str| &vw.g[lay.index(&format!("h.{l}.{suffix}"))];
        let pair = |name: &str| {
            vw.g_pair[lay.index(name)]
                .as_ref()
                .expect("a layer-norm weight")
        };
        let x = if l == 0 {
            &self.encoded
        } else {
            &self.blocks[l - 1].res3
        };
        let bl = &self.blocks[l];
        let lin = self.lin();
        let (dwp, dbp) = (gl(l, "attn.c_proj.weight"), gl(l, "attn.c_proj.bias"));
        let io = (&sc.dres, &bl.atty_un);
        lin.weight_grad(cap, blas, (bt, c, c), io, dwp, Some(dbp))?;
        cap.matmul(
            blas,
            &Matmul::new(bt, c, c),
            &sc.dres,
            wl(l, "attn.c_proj.weight"),
            &sc.daty_un,
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
        attend::backward(cap, (k, self.attn.as_ref()), blas, d, io)?;
        let (dwa, dba) = (gl(l, "attn.c_attn.weight"), gl(l, "attn.c_attn.bias"));
        let io = (&sc.dqkv, &bl.ln1);
        lin.weight_grad(cap, blas, (bt, 3 * c, c), io, dwa, Some(dba))?;
        cap.matmul(
            blas,
            &Matmul::new(bt, c, 3 * c),
            &sc.dqkv,
            wl(l, "attn.c_attn.weight"),
            &sc.dln,
        )?;
        let ln1 = pair(&format!("h.{l}.ln_1.weight"));
        let stats = (&bl.ln1_mean, &bl.ln1_rstd);
        k.layernorm_bwd(
            cap,
            &sc.dres,
            ln1,
            &sc.partial,
            &sc.dln,
            x,
            stats,
            wl(l, "ln_1.weight"),
        )?;
        Ok(())
    }

    fn cap_update<'a>(&'a self, cap: &mut Capture<'_, 'a>, hp: &AdamW) -> Result<()> {
        self.k
            .sumsq(cap, &self.normsq, &self.sc.norm_partial, &self.grads)?;
        let tensors = (&self.params, &self.weights, &self.grads);
        let moments = (&self.m, &self.v);
        let (sched, normsq) = (&self.sched, &self.normsq);
        self.k
            .adamw(cap, tensors, moments, sched, normsq, &self.decay, hp)
    }
}
