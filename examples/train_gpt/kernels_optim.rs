//! The optimizer's and the graphs' launch wrappers of [`Kernels`]: the gradient norm,
//! AdamW, the weights' cast and the input copies.

use super::{Kernels, NORM_PARTS, blocks, grid, need, u32_of};
use crate::launch::{Arg, In, Target};
use gpubind::{DeviceMemory, Error, KernelArg, Result};

impl Kernels {
    /// The squared norm of `g` into `out[0]`, through `partial` ([`NORM_PARTS`]).
    pub fn sumsq<'b>(
        &self,
        tg: &mut (impl Target<'b> + ?Sized),
        out: &'b impl In,
        partial: &'b impl In,
        g: &'b impl In,
    ) -> Result<()> {
        need("norm partial", partial.len(), NORM_PARTS)?;
        need("norm out", out.len(), 1)?;
        let n = u32_of("parameters", g.len())?;
        let (parts, one, zero) = (NORM_PARTS as u32, 1.0f32, 0u32);
        // SAFETY: (float*, const float*, unsigned) matches sumsq_partial; block b <
        // NORM_PARTS writes partial[b] (checked) and reads n of g.
        unsafe {
            tg.run(
                &self.sumsq_partial,
                blocks(parts, 256),
                &[Arg::w(partial), Arg::b(g), Arg::s(&n)],
            )?;
        }
        // SAFETY: as in `xent`: NORM_PARTS of partial, out[0].
        unsafe {
            tg.run(
                &self.sum_finish,
                blocks(1, 256),
                &[
                    Arg::w(out),
                    Arg::b(partial),
                    Arg::s(&parts),
                    Arg::s(&one),
                    Arg::s(&zero),
                ],
            )
        }
    }

    /// One AdamW update of the parameters (clipped by the norm in `normsq[0]`; `sched`:
    /// lr and the bias corrections; weight decay where `decay`, one byte per parameter,
    /// is not 0).
    #[allow(clippy::too_many_arguments)]
    pub fn adamw<'b>(
        &self,
        tg: &mut (impl Target<'b> + ?Sized),
        (p, w, g): (&'b impl In, &'b impl In, &'b impl In),
        (m, v): (&'b impl In, &'b impl In),
        sched: &'b impl In,
        normsq: &'b impl In,
        decay: &'b impl In,
        hp: &crate::optim::AdamW,
    ) -> Result<()> {
        let n = p.len();
        need("adamw decay mask", decay.len(), n)?;
        need("adamw grad", g.len(), n)?;
        need("adamw weights", w.len(), n)?;
        need("adamw m", m.len(), n)?;
        need("adamw v", v.len(), n)?;
        need("schedule", sched.len(), crate::optim::SCHED_LEN)?;
        need("norm", normsq.len(), 1)?;
        let nn = u32_of("tensor", n)?;
        // SAFETY: (float*, act_t*, const act_t*, float* ×2, unsigned, const float* ×2,
        // const unsigned char*, float ×5) matches adamw (the model's buffer types); n of
        // p, w, g, m, v and decay (checked), 3 of sched, 1 of normsq.
        unsafe {
            tg.run(
                &self.adamw,
                grid(n),
                &[
                    Arg::w(p),
                    Arg::w(w),
                    Arg::b(g),
                    Arg::w(m),
                    Arg::w(v),
                    Arg::s(&nn),
                    Arg::b(sched),
                    Arg::b(normsq),
                    Arg::b(decay),
                    Arg::s(&hp.weight_decay),
                    Arg::s(&hp.beta1),
                    Arg::s(&hp.beta2),
                    Arg::s(&hp.eps),
                    Arg::s(&hp.max_norm),
                ],
            )
        }
    }

    /// `dst = src` for buffers of 32-bit elements.
    pub fn copy_words<'b, T: gpubind::DeviceRepr>(
        &self,
        tg: &mut (impl Target<'b> + ?Sized),
        dst: &'b (impl DeviceMemory<T> + KernelArg),
        src: &'b (impl DeviceMemory<T> + KernelArg),
    ) -> Result<()> {
        if std::mem::size_of::<T>() != 4 {
            return Err(Error::InvalidArgument(
                "train_gpt: copy_words copies 4-byte elements".into(),
            ));
        }
        need("copy destination", dst.len(), src.len())?;
        let n = u32_of("copy length", src.len())?;
        // SAFETY: (unsigned*, const unsigned*, unsigned) matches copy_words (4-byte
        // elements, checked); n elements of both (equal lengths, checked).
        unsafe {
            tg.run(
                &self.copy_words,
                grid(src.len()),
                &[Arg::w(dst), Arg::b(src), Arg::s(&n)],
            )
        }
    }

    /// `w = p` converted to the activation type.
    pub fn cast_weights<'b>(
        &self,
        tg: &mut (impl Target<'b> + ?Sized),
        w: &'b impl In,
        p: &'b impl In,
    ) -> Result<()> {
        need("weights", w.len(), p.len())?;
        let n = u32_of("parameters", p.len())?;
        // SAFETY: (act_t*, const float*, unsigned) matches cast_weights (the model's buffer
        // types); n of both (checked).
        unsafe {
            tg.run(
                &self.cast_weights,
                grid(p.len()),
                &[Arg::w(w), Arg::b(p), Arg::s(&n)],
            )
        }
    }
}
