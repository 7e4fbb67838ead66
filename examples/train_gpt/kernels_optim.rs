//! The optimizer's launch wrappers of [`Kernels`]: the gradient norm, AdamW and the
//! weights' cast.

use super::{Kernels, NORM_PARTS, blocks, grid, need, u32_of};
use crate::launch::In;
use gpubind::Result;
use gpubind::{Issue, KernelLaunch};

impl Kernels {
    /// The squared norm of `g` into `out[0]`, through `partial` ([`NORM_PARTS`]).
    pub fn sumsq<'b>(
        &self,
        tg: &mut impl Issue<'b>,
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
            tg.launch(&self.sumsq_partial, blocks(parts, 256))
                .arg_written(partial)
                .arg(g)
                .value(n)
                .launch()?;
        }
        // SAFETY: as in `xent`: NORM_PARTS of partial, out[0].
        unsafe {
            tg.launch(&self.sum_finish, blocks(1, 256))
                .arg_written(out)
                .arg(partial)
                .value(parts)
                .value(one)
                .value(zero)
                .launch()
        }
    }

    /// One AdamW update of the parameters (clipped by the norm in `normsq[0]`; `sched`:
    /// lr and the bias corrections; weight decay where `decay`, one byte per parameter,
    /// is not 0).
    #[allow(clippy::too_many_arguments)]
    pub fn adamw<'b>(
        &self,
        tg: &mut impl Issue<'b>,
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
            tg.launch(&self.adamw, grid(n))
                .arg_written(p)
                .arg_written(w)
                .arg(g)
                .arg_written(m)
                .arg_written(v)
                .value(nn)
                .arg(sched)
                .arg(normsq)
                .arg(decay)
                .value(hp.weight_decay)
                .value(hp.beta1)
                .value(hp.beta2)
                .value(hp.eps)
                .value(hp.max_norm)
                .launch()
        }
    }

    /// `w = p` converted to the activation type.
    pub fn cast_weights<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        w: &'b impl In,
        p: &'b impl In,
    ) -> Result<()> {
        need("weights", w.len(), p.len())?;
        let n = u32_of("parameters", p.len())?;
        // SAFETY: (act_t*, const float*, unsigned) matches cast_weights (the model's buffer
        // types); n of both (checked).
        unsafe {
            tg.launch(&self.cast_weights, grid(p.len()))
                .arg_written(w)
                .arg(p)
                .value(n)
                .launch()
        }
    }
}
