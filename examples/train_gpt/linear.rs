//! The model's linear layers with their biases and the MLP's GELU, forward and backward:
//! as cuBLASLt epilogues of the products (`--epilogues on`: `BIAS`, `GELU_AUX_BIAS`,
//! `DGELU`, and the plain products through cuBLASLt too, so that `--gemm-algos timed`
//! times every product's algorithm) or as cuBLAS products followed by kernels of their
//! own (`--epilogues off`); the bias gradients are column-sum kernels either way. A
//! residual connection's product takes its input as the addend (`--epilogues on`), so
//! that the layer norm after it reads the sum once. Generic over where the work goes (a
//! stream or a graph capture).

use crate::kernels::Kernels;
use crate::model::linear;
use crate::precision::Act;
use gpubind::blas::{Blas, CaptureLtArgs, Enqueue, Epilogue, Matmul};
use gpubind::{DeviceMemory, DeviceOnlyMemory, DeviceSlice, DeviceView, Result};

/// How the biases and GELU run: the kernels, the scratch their bias gradients sum
/// through, and whether to use the epilogues instead.
#[derive(Clone, Copy)]
pub struct Lin<'k> {
    pub ks: &'k Kernels,
    pub partial: &'k DeviceSlice<f32>,
    pub epilogues: bool,
}

/// `(n, out, inp)`: rows, output and input features of a layer `y = x·Wᵀ + b`, `W`
/// stored `out × inp` (as torch's Linear).
pub type Dims3 = (usize, usize, usize);

impl<'k> Lin<'k> {
    /// `c = op(a)·op(b)` as `shape` says: a cuBLASLt product without epilogue
    /// (`--epilogues on`, its algorithm chosen as the handle's selection says) or a
    /// cuBLAS one.
    pub fn product<'b, T, E, A, B, C>(
        &self,
        e: &mut E,
        blas: &Blas,
        shape: &Matmul,
        (a, b): (&'b A, &'b B),
        c: &'b C,
    ) -> Result<()>
    where
        T: Act,
        E: Enqueue<'b>,
        A: DeviceMemory<T> + ?Sized,
        B: DeviceMemory<T> + ?Sized,
        C: DeviceMemory<T> + DeviceOnlyMemory + ?Sized,
    {
        if self.epilogues {
            e.matmul_lt(
                blas,
                shape,
                Epilogue::Default,
                a,
                b,
                c,
                CaptureLtArgs::new(),
            )
        } else {
            e.matmul(blas, shape, a, b, c)
        }
    }

    /// `y = x·Wᵀ + b`.
    pub fn fwd_bias<'b, T: Act, E: Enqueue<'b>>(
        &self,
        e: &mut E,
        blas: &Blas,
        (n, out, inp): Dims3,
        (x, w, b): (
            &'b DeviceSlice<T>,
            &'b DeviceView<'_, T>,
            &'b DeviceView<'_, T>,
        ),
        y: &'b DeviceSlice<T>,
    ) -> Result<()> {
        let shape = linear(n, out, inp);
        if self.epilogues {
            let args = CaptureLtArgs::new().bias(b);
            e.matmul_lt(blas, &shape, Epilogue::Bias, x, w, y, args)
        } else {
            e.matmul(blas, &shape, x, w, y)?;
            self.ks.bias_add(e, y, b)
        }
    }

    /// A residual connection and the layer norm after it: `res = x + y·Wᵀ + b`, then
    /// `ln`, its rows' mean and rstd = the layer norm of `res` (weight and bias `lnw`).
    /// With the epilogues, one product (`BIAS`, with `x` its addend: `res` is written
    /// once, never read back) and the layer norm; without, the product into `proj` and
    /// the kernel that adds and normalises in one pass.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    pub fn residual_norm<'b, T: Act, E: Enqueue<'b>>(
        &self,
        e: &mut E,
        blas: &Blas,
        (n, out, inp): Dims3,
        (y, w, b): (
            &'b DeviceSlice<T>,
            &'b DeviceView<'_, T>,
            &'b DeviceView<'_, T>,
        ),
        (x, proj): (&'b DeviceSlice<T>, &'b DeviceSlice<T>),
        (res, ln, mean, rstd): (
            &'b DeviceSlice<T>,
            &'b DeviceSlice<T>,
            &'b DeviceSlice<f32>,
            &'b DeviceSlice<f32>,
        ),
        lnw: (&'b DeviceView<'_, T>, &'b DeviceView<'_, T>),
    ) -> Result<()> {
        let shape = linear(n, out, inp);
        if self.epilogues {
            let args = CaptureLtArgs::new().bias(b).addend(x);
            let shape = shape.scaled(1.0, 1.0);
            e.matmul_lt(blas, &shape, Epilogue::Bias, y, w, res, args)?;
            self.ks.layernorm_fwd(e, ln, mean, rstd, res, lnw, out)
        } else {
            e.matmul(blas, &shape, y, w, proj)?;
            self.ks
                .residual_layernorm(e, (res, ln, mean, rstd), (x, proj, b), lnw)
        }
    }

    /// `pre = x·Wᵀ + b`, `y = gelu(pre)`.
    pub fn fwd_gelu<'b, T: Act, E: Enqueue<'b>>(
        &self,
        e: &mut E,
        blas: &Blas,
        (n, out, inp): Dims3,
        (x, w, b): (
            &'b DeviceSlice<T>,
            &'b DeviceView<'_, T>,
            &'b DeviceView<'_, T>,
        ),
        (pre, y): (&'b DeviceSlice<T>, &'b DeviceSlice<T>),
    ) -> Result<()> {
        let shape = linear(n, out, inp);
        if self.epilogues {
            let args = CaptureLtArgs::new().bias(b).aux_out(pre);
            e.matmul_lt(blas, &shape, Epilogue::GeluAuxBias, x, w, y, args)
        } else {
            e.matmul(blas, &shape, x, w, pre)?;
            self.ks.bias_add(e, pre, b)?;
            self.ks.gelu_fwd(e, y, pre)
        }
    }

    /// The weight gradient `dW = dyᵀ·x` (`out × inp`) and, with `db`, the bias gradient
    /// `Σ_rows dy`.
    #[allow(clippy::too_many_arguments)]
    pub fn weight_grad<'b, T: Act, E: Enqueue<'b>>(
        &self,
        e: &mut E,
        blas: &Blas,
        (n, out, inp): Dims3,
        (dy, x): (&'b DeviceSlice<T>, &'b DeviceSlice<T>),
        dw: &'b DeviceView<'_, T>,
        db: Option<&'b DeviceView<'_, T>>,
    ) -> Result<()>
    where
        'k: 'b,
    {
        let shape = Matmul::new(out, inp, n).transpose_a();
        // The bias gradient from a kernel of its own, with the epilogues too: cuBLASLt's
        // BGRADA runs as a separate reduction kernel on sm_90 that is slower than
        // train_gpt's column sums (docs/performance.md, "Where the time goes").
        self.product(e, blas, &shape, (dy, x), dw)?;
        match db {
            Some(db) => self.ks.bias_grad(e, db, self.partial, dy),
            None => Ok(()),
        }
    }

    /// Through the GELU layer `y = gelu(pre)`, `pre = x·W1ᵀ + b1`, from the next layer's
    /// output gradient `dz` (`n × out2`, its weight `w2` `out2 × inp2`): `dpre =
    /// (dz·w2) ⊙ gelu'(pre)` (`n × inp2`) and `db1 = Σ_rows dpre`; `dy` is scratch of
    /// `dpre`'s size for the kernels.
    #[allow(clippy::too_many_arguments)]
    pub fn gelu_grad<'b, T: Act, E: Enqueue<'b>>(
        &self,
        e: &mut E,
        blas: &Blas,
        (n, out2, inp2): Dims3,
        (dz, w2, pre): (
            &'b DeviceSlice<T>,
            &'b DeviceView<'_, T>,
            &'b DeviceSlice<T>,
        ),
        (dpre, db1): (&'b DeviceSlice<T>, &'b DeviceView<'_, T>),
        dy: &'b DeviceSlice<T>,
    ) -> Result<()>
    where
        'k: 'b,
    {
        let shape = Matmul::new(n, inp2, out2);
        if self.epilogues {
            // DGELU without BGRAD, and the bias gradient from a kernel of its own:
            // cuBLASLt's DGELU_BGRAD adds a separate epilogue kernel on sm_90 that takes
            // longer than the product itself (docs/performance.md, "Where the time goes").
            let args = CaptureLtArgs::new().aux(pre);
            e.matmul_lt(blas, &shape, Epilogue::DGelu, dz, w2, dpre, args)?;
            self.ks.bias_grad(e, db1, self.partial, dpre)
        } else {
            e.matmul(blas, &shape, dz, w2, dy)?;
            self.ks.gelu_bwd(e, dpre, pre, dy)?;
            self.ks.bias_grad(e, db1, self.partial, dpre)
        }
    }
}
