//! A block's attention core — from the QKV product to the projection's input, and back —
//! in either implementation of `--attention`: fused ([`Attention`]: tiles, online softmax,
//! no T×T matrix) or unfused (llm.c's: batched products into a `B·NH·T·T` matrix, a
//! softmax kernel, permutes). Generic over where the work goes ([`Enqueue`]: a stream
//! or a graph capture), so the eager and captured steps and `--check-attention` run the
//! same calls.

use crate::attention::{self, Attention};
use crate::kernels::Kernels;
use crate::model::Dims;
use crate::precision::Act;
use gpubind::blas::{Batch, Blas, Enqueue, Matmul};
use gpubind::{DeviceSlice, DeviceView, Error, Result};

/// What the forward pass writes and the backward pass reads again, with their input
/// `qkv` `(B, T, 3C)`: `y` `(B, T, C)`; the fused path's `lse` (`B·NH·T`), the unfused
/// one's `q`, `k`, `v` (`B·NH·T·hs`) and `att` (`B·NH·T·T`). Buffers a path does not use
/// may be of any length.
pub struct Saved<'b, T: Act> {
    pub qkv: &'b DeviceSlice<T>,
    pub y: &'b DeviceSlice<T>,
    pub lse: &'b DeviceSlice<f32>,
    pub q: &'b DeviceSlice<T>,
    pub k: &'b DeviceSlice<T>,
    pub v: &'b DeviceSlice<T>,
    pub att: &'b DeviceSlice<T>,
}

/// The buffers of the forward pass: `qkv` in, the rest of [`Saved`] out; scratch of the
/// unfused path: `atty` (`B·NH·T·hs`) and `preatt` (`B·NH·T·T`).
pub struct Fwd<'b, T: Act> {
    pub saved: Saved<'b, T>,
    pub preatt: &'b DeviceSlice<T>,
    pub atty: &'b DeviceSlice<T>,
}

/// The buffers of the backward pass: the forward's [`Saved`]; `dy` `(B, T, C)` in; `dqkv`
/// `(B, T, 3C)` out (overwritten). Scratch: `dsum` (fused, `B·NH·T`), `daty`, `dq`, `dk`,
/// `dv` (`B·NH·T·hs`), `datt` and `dpre` (`B·NH·T·T`) (unfused). `bias`: where
/// [`sums_qkv_bias`] holds, the QKV bias gradient (`3C`, out) and the scratch of its
/// partial sums ([`attention::bias_partial_len`](crate::attention::bias_partial_len)).
pub struct Bwd<'b, T: Act> {
    pub bias: Option<(&'b DeviceView<'b, T>, &'b DeviceSlice<f32>)>,
    pub saved: Saved<'b, T>,
    pub dy: &'b DeviceSlice<T>,
    pub dqkv: &'b DeviceSlice<T>,
    pub dsum: &'b DeviceSlice<f32>,
    pub daty: &'b DeviceSlice<T>,
    pub dq: &'b DeviceSlice<T>,
    pub dk: &'b DeviceSlice<T>,
    pub dv: &'b DeviceSlice<T>,
    pub datt: &'b DeviceSlice<T>,
    pub dpre: &'b DeviceSlice<T>,
}

fn bmm<'b, T: Act>(
    e: &mut impl Enqueue<'b>,
    blas: &Blas,
    shape: Matmul,
    count: usize,
    (a, b, c): (&'b DeviceSlice<T>, &'b DeviceSlice<T>, &'b DeviceSlice<T>),
) -> Result<()> {
    e.matmul_batched(blas, &shape, &Batch::packed(count, &shape), a, b, c)
}

/// The attention forward pass: fused with `fused`, else unfused.
pub fn forward<'b, T: Act, E: Enqueue<'b>>(
    e: &mut E,
    (ks, fused): (&Kernels, Option<&Attention>),
    blas: &Blas,
    d: Dims,
    io: Fwd<'b, T>,
) -> Result<()> {
    let sv = &io.saved;
    let shape4 = (d.b, d.t, d.nh, d.hs);
    if let Some(fa) = fused {
        return fa.forward(e, sv.y, sv.lse, sv.qkv, shape4);
    }
    ks.permute_qkv(e, sv.q, sv.k, sv.v, sv.qkv, shape4, false)?;
    let scale = 1.0 / (d.hs as f64).sqrt();
    let qk = Matmul::new(d.t, d.t, d.hs).transpose_b().scaled(scale, 0.0);
    bmm(e, blas, qk, d.b * d.nh, (sv.q, sv.k, io.preatt))?;
    ks.softmax_fwd(e, sv.att, io.preatt, d.t)?;
    let av = Matmul::new(d.t, d.hs, d.t);
    bmm(e, blas, av, d.b * d.nh, (sv.att, sv.v, io.atty))?;
    ks.unpermute(e, sv.y, io.atty, shape4, false)
}

/// Whether the attention backward pass with `fused` also writes the QKV bias gradient
/// (`Bwd::bias`): the mma kernels sum the columns of the dq, dk and dv they store, which
/// spares the QKV product's bias gradient a column-sum pass of its own.
pub fn sums_qkv_bias(fused: Option<&Attention>) -> bool {
    fused.is_some_and(Attention::sums_bias)
}

/// The attention backward pass: fused with `fused`, else unfused; with `io.bias`, which
/// only [`sums_qkv_bias`] paths take, also the QKV bias gradient.
pub fn backward<'b, T: Act, E: Enqueue<'b>>(
    e: &mut E,
    (ks, fused): (&Kernels, Option<&Attention>),
    blas: &Blas,
    d: Dims,
    io: Bwd<'b, T>,
) -> Result<()> {
    let sv = &io.saved;
    let shape4 = (d.b, d.t, d.nh, d.hs);
    if io.bias.is_some() && !sums_qkv_bias(fused) {
        return Err(Error::InvalidArgument(
            "train_gpt: only the mma attention sums the QKV bias gradient".into(),
        ));
    }
    if let Some(fa) = fused {
        let bsum = io.bias.map(|(_, partial)| partial);
        let saved = (sv.qkv, sv.y, sv.lse);
        fa.backward(e, io.dqkv, io.dsum, bsum, saved, io.dy, shape4)?;
        return match io.bias {
            Some((db, partial)) => {
                ks.qkv_bias_finish(e, db, partial, attention::bias_parts(d.b, d.t))
            }
            None => Ok(()),
        };
    }
    ks.unpermute(e, io.dy, io.daty, shape4, true)?;
    let n = d.b * d.nh;
    // atty = att·v: datt = daty·vᵀ, dv = attᵀ·daty.
    let datt = Matmul::new(d.t, d.t, d.hs).transpose_b();
    bmm(e, blas, datt, n, (io.daty, sv.v, io.datt))?;
    let dv = Matmul::new(d.t, d.hs, d.t).transpose_a();
    bmm(e, blas, dv, n, (sv.att, io.daty, io.dv))?;
    ks.softmax_bwd(e, io.dpre, io.datt, sv.att, d.t)?;
    // preatt = scale·q·kᵀ: dq = scale·dpre·k, dk = scale·dpreᵀ·q.
    let scale = 1.0 / (d.hs as f64).sqrt();
    let dq = Matmul::new(d.t, d.hs, d.t).scaled(scale, 0.0);
    bmm(e, blas, dq, n, (io.dpre, sv.k, io.dq))?;
    let dk = Matmul::new(d.t, d.hs, d.t).transpose_a().scaled(scale, 0.0);
    bmm(e, blas, dk, n, (io.dpre, sv.q, io.dk))?;
    ks.permute_qkv(e, io.dq, io.dk, io.dv, io.dqkv, shape4, true)
}
