//! The NVRTC kernels of `train_gpt` (`kernels.cu`) as owned [`Kernel`]s in one registry,
//! and one launch wrapper per kernel that checks every length the kernel relies on.
//!
//! The SAFETY comments write the kernels' `act_t*` parameters as `float*`: with bf16
//! activations ([`Kernels::load`] with `bf16`) they are `__nv_bfloat16*`, and the model
//! ([`Gpt<T>`](crate::gpt::Gpt)) passes buffers of `T` there and of `f32` elsewhere.

use crate::launch::In;
use gpubind::{BoundDevice, DeviceRepr, DeviceSlice, DeviceView};
use gpubind::{CompileOptions, Error, Kernel, LaunchConfig, Result};
use gpubind::{Issue, KernelLaunch};

/// The kernels' CUDA source.
pub const SOURCE: &str = include_str!("kernels.cu");

macro_rules! registry {
    ($($name:ident),* $(,)?) => {
        /// Every kernel of [`SOURCE`], compiled once per device.
        pub struct Kernels {
            $(pub $name: Kernel,)*
            /// Bytes of two activations (`act2_t`): the alignment the row kernels need.
            pair_bytes: u64,
        }
        impl Kernels {
            /// Compiles [`SOURCE`] for `gpu`'s device, with bf16 activations if `bf16`,
            /// and looks every kernel up.
            pub fn load(gpu: &BoundDevice<'_>, bf16: bool) -> Result<Self> {
                let mut opts = CompileOptions::new();
                if bf16 {
                    opts = opts.define("ACT_BF16", 1);
                }
                let module = gpu.compile_and_load_with(SOURCE, "train_gpt.cu", &opts)?.into_shared();
                Ok(Kernels {
                    $($name: module.kernel(stringify!($name))?,)*
                    pair_bytes: if bf16 { 4 } else { 8 },
                })
            }
        }
    };
}

registry!(
    encoder_fwd,
    encoder_bwd_wpe,
    encoder_bwd_wte_partial,
    encoder_bwd_wte_finish,
    layernorm_fwd,
    residual_layernorm_fwd,
    layernorm_bwd,
    layernorm_bwd_dx,
    layernorm_bwd_wb,
    colsum_partial,
    colsum_finish,
    colsum_finish_qkv,
    bias_add,
    permute_qkv,
    unpermute,
    softmax_causal_fwd,
    softmax_causal_bwd,
    gelu_fwd,
    gelu_bwd,
    xent,
    sum_finish,
    sumsq_partial,
    adamw,
    cast_weights,
);

#[path = "kernels_optim.rs"]
mod optim;

/// Blocks of [`sumsq_partial`](Kernels::sumsq_partial) (and the length of its output).
pub const NORM_PARTS: usize = 1024;

/// `v` as a kernel's 32-bit size (below 2^31, so grid-stride sums cannot wrap).
pub fn u32_of(what: &str, v: usize) -> Result<u32> {
    i32::try_from(v)
        .map(|v| v as u32)
        .map_err(|_| Error::InvalidArgument(format!("train_gpt: {what} = {v} exceeds 2^31 - 1")))
}

fn need(what: &str, len: usize, want: usize) -> Result<()> {
    if len == want {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "train_gpt: {what} has {len} elements, the kernel needs {want}"
        )))
    }
}

fn need_at_least(what: &str, len: usize, want: usize) -> Result<()> {
    if len >= want {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "train_gpt: {what} has {len} elements, needs at least {want}"
        )))
    }
}

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n.div_ceil(256)).clamp(1, 8192) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One warp per row, 8 rows per block.
fn warp_rows(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.div_ceil(8).max(1) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Blocks of (32, 8) threads for the column partial sums: `x` over `cols` columns (or
/// column pairs), 32 a block, `y` over `parts` chunks of rows.
fn column_chunks(cols: u32, parts: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (cols.div_ceil(32), parts, 1),
        block_dim: (32, 8, 1),
        shared_mem_bytes: 0,
    }
}

fn blocks(n: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.max(1), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Row chunks of the token embedding's two-pass gradient (`encoder_bwd`'s `partial`
/// holds this many `V × C` sums).
pub fn wte_parts(rows: usize) -> usize {
    rows.div_ceil(256).clamp(1, 32)
}

/// The most row chunks [`colsum_parts`] gives: the partial buffers hold this many rows of
/// sums at most.
pub const COLSUM_MAX_PARTS: usize = 256;

/// [`colsum_parts`] gives a chunk per this many rows, up to [`COLSUM_MAX_PARTS`]: one a
/// warp of `layernorm_bwd`'s eight, one a thread row of `colsum_partial`'s eight.
const COLSUM_MIN_CHUNK: usize = 8;

/// Row chunks of the two-pass column sums (`colsum_partial` writes one row of partial sums
/// per chunk, `colsum_finish` adds them up) and of the layer-norm backward (a block of
/// `layernorm_bwd` per chunk): `⌈rows/8⌉`, at most 256. Below 2048 rows that spreads even
/// a small batch over many blocks (chunks of 8 rows); from 2048 rows on, the 256 blocks
/// (about two per SM of a 132-SM H100) take longer chunks instead, so that
/// `colsum_finish` never adds more than 256 partial rows a column (two a thread).
pub fn colsum_parts(rows: usize) -> usize {
    rows.div_ceil(COLSUM_MIN_CHUNK).clamp(1, COLSUM_MAX_PARTS)
}

/// The widest rows the one-pass layer-norm backward (`layernorm_bwd` of `kernels.cu`)
/// takes: 64·RP (RP = 12 there; a test checks), every pair of a row in its lane's
/// registers.
const LN_BWD_FUSED_MAX_C: usize = 64 * 12;

impl Kernels {
    /// The layer-norm and column-sum kernels read and write pairs of activations: the
    /// `kernel`'s width `c` even and every buffer aligned to a pair.
    fn check_pairs(&self, kernel: &str, c: usize, bufs: &[(&str, &dyn In)]) -> Result<()> {
        if !c.is_multiple_of(2) {
            return Err(Error::InvalidArgument(format!(
                "train_gpt: the {kernel} kernel reads pairs of columns; width {c} is odd"
            )));
        }
        for (what, b) in bufs {
            if !b.addr().is_multiple_of(self.pair_bytes) {
                return Err(Error::InvalidArgument(format!(
                    "train_gpt: {kernel} {what} at {:#x} is not aligned to a pair of \
                     activations ({} bytes)",
                    b.addr(),
                    self.pair_bytes
                )));
            }
        }
        Ok(())
    }

    /// `out[b,t] = wte[tok[b,t]] + wpe[t]`.
    pub fn encoder_fwd<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        out: &'b impl In,
        tok: &'b impl In,
        wte: &'b impl In,
        wpe: &'b impl In,
        (t, c): (usize, usize),
    ) -> Result<()> {
        let bt = tok.len();
        need("encoder out", out.len(), bt * c)?;
        if wpe.len() < t * c || !bt.is_multiple_of(t) {
            return Err(Error::InvalidArgument(format!(
                "train_gpt: {bt} tokens are not rows of {t} positions of wpe ({})",
                wpe.len()
            )));
        }
        let (bt, t, c) = (u32_of("BT", bt)?, u32_of("T", t)?, u32_of("C", c)?);
        u32_of("BT*C", out.len())?;
        // SAFETY: (float*, const unsigned*, const float*, const float*, unsigned ×3) matches
        // encoder_fwd; it writes BT·C elements of out (checked), reads BT tokens (tok's
        // length), wpe rows < T (checked) and wte rows named by the tokens, which the host
        // checks are below the vocabulary (data::Batches makes them from bytes, V = 256).
        unsafe {
            tg.launch(&self.encoder_fwd, grid(out.len()))
                .arg_written(out)
                .arg(tok)
                .arg(wte)
                .arg(wpe)
                .value(bt)
                .value(t)
                .value(c)
                .launch()
        }
    }

    /// `dwpe = Σ_b dout[b]`, `dwte += scatter(dout)` by token (through `partial`,
    /// [`wte_parts`] `× V × C`).
    #[allow(clippy::too_many_arguments)]
    pub fn encoder_bwd<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        (dwte, dwpe): (&'b impl In, &'b impl In),
        partial: &'b impl In,
        dout: &'b impl In,
        tok: &'b impl In,
        (b, t, c, v): (usize, usize, usize, usize),
    ) -> Result<()> {
        need("encoder dout", dout.len(), b * t * c)?;
        need("encoder tokens", tok.len(), b * t)?;
        need("dwpe", dwpe.len(), t * c)?;
        need("dwte", dwte.len(), v * c)?;
        let parts = wte_parts(b * t);
        need("dwte partial", partial.len(), parts * v * c)?;
        if v > 256 {
            return Err(Error::InvalidArgument(format!(
                "train_gpt: the embedding gradient takes up to 256 tokens, not {v}"
            )));
        }
        u32_of("P*V*C", partial.len())?;
        let [b, t, c, v, bt, pp, vc] = [b, t, c, v, b * t, parts, v * c].map(|x| x as u32);
        u32_of("BT*C", dout.len())?;
        // SAFETY: (float*, const float*, unsigned ×3) matches encoder_bwd_wpe; it writes T·C
        // of dwpe and reads B·T·C of dout (both checked).
        unsafe {
            tg.launch(&self.encoder_bwd_wpe, grid(dwpe.len()))
                .arg_written(dwpe)
                .arg(dout)
                .value(b)
                .value(t)
                .value(c)
                .launch()?;
        }
        let cfg = LaunchConfig {
            grid_dim: (c.div_ceil(32), pp, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: (float*, const float*, const unsigned*, unsigned ×3) matches
        // encoder_bwd_wte_partial; block (x, y < P) reads rows of chunk y of tok (BT) and
        // columns < C of dout (BT·C, checked) and writes partial[(y·V + v)·C + c] < P·V·C
        // (checked); the tokens index its 256 accumulator rows: they are below V <= 256
        // (checked; the host makes them from bytes).
        unsafe {
            tg.launch(&self.encoder_bwd_wte_partial, cfg)
                .arg_written(partial)
                .arg(dout)
                .arg(tok)
                .value(bt)
                .value(v)
                .value(c)
                .launch()?;
        }
        // SAFETY: (float*, const float*, unsigned ×2) matches encoder_bwd_wte_finish; it
        // touches V·C of dwte (checked) and P·V·C of partial (checked).
        unsafe {
            tg.launch(&self.encoder_bwd_wte_finish, grid(dwte.len()))
                .arg_written(dwte)
                .arg(partial)
                .value(pp)
                .value(vc)
                .launch()
        }
    }

    /// Layer norm of `n` rows of `c`: `out`, and the rows' `mean` and `rstd`.
    #[allow(clippy::too_many_arguments)]
    pub fn layernorm_fwd<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        out: &'b impl In,
        mean: &'b impl In,
        rstd: &'b impl In,
        inp: &'b impl In,
        wb: (&'b impl In, &'b impl In),
        c: usize,
    ) -> Result<()> {
        let n = inp.len() / c;
        need("layernorm out", out.len(), inp.len())?;
        need("layernorm input", inp.len(), n * c)?;
        need("layernorm mean", mean.len(), n)?;
        need("layernorm rstd", rstd.len(), n)?;
        need("layernorm weight", wb.0.len(), c)?;
        need("layernorm bias", wb.1.len(), c)?;
        self.check_pairs(
            "layer-norm",
            c,
            &[
                ("out", out),
                ("input", inp),
                ("weight", wb.0),
                ("bias", wb.1),
            ],
        )?;
        let (nn, cc) = (u32_of("rows", n)?, u32_of("C", c)?);
        // SAFETY: (float* ×3, const float* ×3, unsigned ×2) matches layernorm_fwd; warp r
        // < N touches row r of out and inp (N·C, checked), mean[r], rstd[r], C of w and b,
        // in pairs (C even, every buffer pair-aligned: checked).
        unsafe {
            tg.launch(&self.layernorm_fwd, warp_rows(n))
                .arg_written(out)
                .arg_written(mean)
                .arg_written(rstd)
                .arg(inp)
                .arg(wb.0)
                .arg(wb.1)
                .value(nn)
                .value(cc)
                .launch()
        }
    }

    /// `res = x + y + pb` (a residual with its projection's bias), then the layer norm
    /// of `res` (weight and bias `wb`) into `out` with its rows' `mean` and `rstd`, as
    /// [`layernorm_fwd`](Self::layernorm_fwd) computes it.
    pub fn residual_layernorm<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        (res, out, mean, rstd): (&'b impl In, &'b impl In, &'b impl In, &'b impl In),
        (x, y, pb): (&'b impl In, &'b impl In, &'b impl In),
        wb: (&'b impl In, &'b impl In),
    ) -> Result<()> {
        let c = wb.0.len();
        let n = res.len() / c.max(1);
        for (what, len) in [("res", res.len()), ("out", out.len()), ("x", x.len())] {
            need(what, len, n * c)?;
        }
        need("residual y", y.len(), n * c)?;
        need("layernorm mean", mean.len(), n)?;
        need("layernorm rstd", rstd.len(), n)?;
        need("projection bias", pb.len(), c)?;
        need("layernorm bias", wb.1.len(), c)?;
        self.check_pairs(
            "layer-norm",
            c,
            &[
                ("res", res),
                ("out", out),
                ("x", x),
                ("y", y),
                ("projection bias", pb),
            ],
        )?;
        self.check_pairs("layer-norm", c, &[("weight", wb.0), ("bias", wb.1)])?;
        let (nn, cc) = (u32_of("rows", n)?, u32_of("C", c)?);
        u32_of("N*C", res.len())?;
        // SAFETY: (float* ×4, const float* ×5, unsigned ×2) matches residual_layernorm_fwd;
        // warp r < N touches row r of res, out, x and y (N·C each, checked), mean[r],
        // rstd[r] (N, checked) and C of pb, w and b (checked), in pairs (C even, every
        // buffer pair-aligned: checked).
        unsafe {
            tg.launch(&self.residual_layernorm_fwd, warp_rows(n))
                .arg_written(res)
                .arg_written(out)
                .arg_written(mean)
                .arg_written(rstd)
                .arg(x)
                .arg(y)
                .arg(pb)
                .arg(wb.0)
                .arg(wb.1)
                .value(nn)
                .value(cc)
                .launch()
        }
    }

    /// Layer-norm backward: `dinp += dx`, and the weight and bias gradients into `dwb`
    /// (weight then bias, `2c`), through `partial`. Rows of up to 768 (every width of
    /// the models) take one pass (`layernorm_bwd`: the input gradient and the column
    /// partial sums together); wider ones two (`layernorm_bwd_dx`, `layernorm_bwd_wb`).
    ///
    /// With `res = (db, rpartial)`, also `db = Σ_rows dinp` (after the update): the bias
    /// gradient of the product whose output gradient `dinp` is (the residual stream's
    /// gradient feeds the MLP's and the attention projection's biases), summed by the
    /// one-pass kernel as it writes `dinp` (through `rpartial`, `colsum_parts(rows)·c`),
    /// the same sums `bias_grad` takes in a pass of its own.
    #[allow(clippy::too_many_arguments)]
    pub fn layernorm_bwd<'b, T: DeviceRepr>(
        &self,
        tg: &mut impl Issue<'b>,
        dinp: &'b DeviceSlice<T>,
        dwb: &'b impl In,
        partial: &'b impl In,
        dout: &'b impl In,
        inp: &'b impl In,
        stats: (&'b impl In, &'b impl In),
        w: &'b impl In,
        res: Option<(&'b DeviceView<'_, T>, &'b DeviceSlice<f32>)>,
    ) -> Result<()> {
        let c = w.len();
        let n = inp.len() / c.max(1);
        need("layernorm dinp", dinp.len(), n * c)?;
        need("layernorm dout", dout.len(), n * c)?;
        need("layernorm input", inp.len(), n * c)?;
        need("layernorm mean", stats.0.len(), n)?;
        need("layernorm rstd", stats.1.len(), n)?;
        need("layernorm dweight+dbias", dwb.len(), 2 * c)?;
        self.check_pairs(
            "layer-norm",
            c,
            &[
                ("dinp", dinp),
                ("dout", dout),
                ("input", inp),
                ("weight", w),
            ],
        )?;
        // The one-pass kernel's blocks take the two-pass kernels' row chunks (the partial
        // buffer is sized for those): from 2048 rows on, 256 blocks (at 32768 rows, of 128
        // rows each), in bf16 (two blocks per SM) all resident at once on an H100's 132
        // SMs; below 2048 rows, ⌈rows/8⌉ blocks of up to 8 rows, one a warp.
        let parts = colsum_parts(n);
        need_at_least("layer-norm partial", partial.len(), parts * 2 * c)?;
        let (nn, cc, pp, ww) = (
            u32_of("rows", n)?,
            u32_of("C", c)?,
            parts as u32,
            u32_of("2C", 2 * c)?,
        );
        if let Some((db, rpartial)) = res {
            need("layernorm residual bias gradient", db.len(), c)?;
            need_at_least("layer-norm residual partial", rpartial.len(), parts * c)?;
        }
        if c <= LN_BWD_FUSED_MAX_C {
            // The residual sums' scratch, or none (a null pointer the kernel never uses
            // without res_sums).
            let want = u32::from(res.is_some());
            // SAFETY: (float*, float* ×2, const float* ×5, unsigned ×3) matches
            // layernorm_bwd; block y < parts takes the rows r of [y·chunk, min(N,
            // (y+1)·chunk)) (chunk = ⌈N/parts⌉; the chunks are disjoint, each row is one
            // warp's, and a block whose chunk starts at or past N takes no row and writes
            // zero sums), reading and writing row r of dinp and reading row r of dout and inp
            // (N·C each, checked), mean[r] and rstd[r] (N, checked) and C of w (C, by
            // definition), in pairs (C even, every buffer pair-aligned: checked); its
            // shared sums hold 32·RP pairs, at least the C/2 of a row (C ≤ 64·RP: this
            // branch); it writes partial row y (2C wide), inside parts·2C ≤ partial's
            // length (checked), and with res_sums = 1 only (`res` given) rpartial row y
            // (C wide), inside parts·C ≤ rpartial's length (checked).
            unsafe {
                let mut l = tg.launch(&self.layernorm_bwd, blocks(pp, 256));
                l.arg_written(dinp).arg_written(partial);
                match res {
                    Some((_, rpartial)) => l.arg_written(rpartial),
                    None => l.value(0u64),
                };
                l.arg(dout)
                    .arg(inp)
                    .arg(stats.0)
                    .arg(stats.1)
                    .arg(w)
                    .value(nn)
                    .value(cc)
                    .value(want)
                    .launch()?;
            }
        } else {
            // SAFETY: (float*, const float* ×5, unsigned ×2) matches layernorm_bwd_dx; warp
            // row < N reads and writes row `row` of dinp, dout and inp (N·C, checked), and
            // reads mean[row], rstd[row] (N, checked) and C of w (C, by definition), in pairs
            // (C even, every buffer pair-aligned: checked).
            unsafe {
                tg.launch(&self.layernorm_bwd_dx, warp_rows(n))
                    .arg_written(dinp)
                    .arg(dout)
                    .arg(inp)
                    .arg(stats.0)
                    .arg(stats.1)
                    .arg(w)
                    .value(nn)
                    .value(cc)
                    .launch()?;
            }
            // SAFETY: (float*, const float* ×4, unsigned ×2) matches layernorm_bwd_wb; block
            // (x, y) reads rows of chunk y < parts, column pairs < C/2, of dout and inp (N·C,
            // checked, C even and both pair-aligned) and their mean and rstd (N, checked),
            // and writes partial row y (2C wide), inside parts·2C ≤ partial's length
            // (checked).
            unsafe {
                tg.launch(&self.layernorm_bwd_wb, column_chunks(cc / 2, pp))
                    .arg_written(partial)
                    .arg(dout)
                    .arg(inp)
                    .arg(stats.0)
                    .arg(stats.1)
                    .value(nn)
                    .value(cc)
                    .launch()?;
            }
        }
        self.colsum_finish(tg, dwb, partial, pp, ww)?;
        match res {
            Some((db, rpartial)) if c <= LN_BWD_FUSED_MAX_C => {
                self.colsum_finish(tg, db, rpartial, pp, cc)
            }
            Some((db, rpartial)) => self.colsum(tg, db, rpartial, dinp, c),
            None => Ok(()),
        }
    }

    /// Column sums of `dout` (`rows × c`) into `out` (`c`), through `partial`.
    fn colsum<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        out: &'b impl In,
        partial: &'b impl In,
        dout: &'b impl In,
        c: usize,
    ) -> Result<()> {
        let n = dout.len() / c.max(1);
        let parts = colsum_parts(n);
        need("colsum output", out.len(), c)?;
        need("colsum input", dout.len(), n * c)?;
        need_at_least("colsum partial", partial.len(), parts * c)?;
        self.check_pairs("column-sum", c, &[("input", dout)])?;
        let (nn, cc, pp) = (u32_of("rows", n)?, u32_of("C", c)?, parts as u32);
        // SAFETY: (float*, const float*, unsigned ×2) matches colsum_partial; block (x, y)
        // reads rows of chunk y < parts of column pairs < C/2 of dout (N·C, checked, C
        // even and dout pair-aligned) and writes partial row y (C wide), inside parts·C
        // ≤ partial's length (checked).
        unsafe {
            tg.launch(&self.colsum_partial, column_chunks(cc / 2, pp))
                .arg_written(partial)
                .arg(dout)
                .value(nn)
                .value(cc)
                .launch()?
        };
        self.colsum_finish(tg, out, partial, pp, cc)
    }

    /// `out[j] = Σ_p partial[p·w + j]` for `j < w`, `p < parts`: the second pass of the
    /// two-pass column sums.
    fn colsum_finish<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        out: &'b impl In,
        partial: &'b impl In,
        parts: u32,
        w: u32,
    ) -> Result<()> {
        need("column sums", out.len(), w as usize)?;
        need_at_least(
            "column partial sums",
            partial.len(),
            parts as usize * w as usize,
        )?;
        // SAFETY: (float*, const float*, unsigned ×2) matches colsum_finish; block j < w
        // writes out[j] (w elements, checked) and reads column j of the parts·w partials
        // (checked).
        unsafe {
            tg.launch(&self.colsum_finish, blocks(w, 128))
                .arg_written(out)
                .arg(partial)
                .value(parts)
                .value(w)
                .launch()
        }
    }

    /// The QKV bias gradient `db` (`3c`: q, k, v parts) from the fused attention
    /// backward's column-sum partials (`attn_bwd_dq`'s and `attn_bwd_dkdv`'s `bsum`): `pq`
    /// rows of `c` for q, then `pkv` rows each for k and v; each column added up as
    /// `colsum_finish` adds one.
    pub fn qkv_bias_finish<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        db: &'b impl In,
        partial: &'b impl In,
        (pq, pkv): (usize, usize),
    ) -> Result<()> {
        let c = db.len() / 3;
        need("QKV bias gradient", db.len(), 3 * c)?;
        need_at_least("QKV bias partial sums", partial.len(), (pq + 2 * pkv) * c)?;
        let (ww, cc) = (u32_of("3C", 3 * c)?, c as u32);
        let (qq, kk) = (u32_of("q parts", pq)?, u32_of("k parts", pkv)?);
        // SAFETY: (float*, const float*, unsigned ×3) matches colsum_finish_qkv; block j <
        // 3C writes db[j] (3C elements, checked) and reads column j % C of partial's rows
        // of part j / C: rows [0, pq) for q, [pq + (part - 1)·pkv, + pkv) for k and v, all
        // below pq + 2·pkv, inside (pq + 2·pkv)·C ≤ partial's length (checked).
        unsafe {
            tg.launch(&self.colsum_finish_qkv, blocks(ww, 128))
                .arg_written(db)
                .arg(partial)
                .value(qq)
                .value(kk)
                .value(cc)
                .launch()
        }
    }

    /// Bias gradient: the column sums of `dout` (`rows × db.len()`).
    pub fn bias_grad<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        db: &'b impl In,
        partial: &'b impl In,
        dout: &'b impl In,
    ) -> Result<()> {
        let c = db.len();
        self.colsum(tg, db, partial, dout, c)
    }

    /// `y[r] += b`.
    pub fn bias_add<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        y: &'b impl In,
        b: &'b impl In,
    ) -> Result<()> {
        let c = b.len();
        let n = y.len() / c.max(1);
        need("bias_add y", y.len(), n * c)?;
        let (nn, cc) = (u32_of("rows", n)?, u32_of("C", c)?);
        u32_of("N*C", y.len())?;
        // SAFETY: (float*, const float*, unsigned ×2) matches bias_add; N·C of y, C of b.
        unsafe {
            tg.launch(&self.bias_add, grid(y.len()))
                .arg_written(y)
                .arg(b)
                .value(nn)
                .value(cc)
                .launch()
        }
    }

    /// `qkv (B,T,3,NH,hs)` to `q, k, v (B,NH,T,hs)` (`back`: the reverse).
    #[allow(clippy::too_many_arguments)]
    pub fn permute_qkv<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        q: &'b impl In,
        k: &'b impl In,
        v: &'b impl In,
        qkv: &'b impl In,
        (b, t, nh, hs): (usize, usize, usize, usize),
        back: bool,
    ) -> Result<()> {
        let n = b * t * nh * hs;
        for (what, len) in [("q", q.len()), ("k", k.len()), ("v", v.len())] {
            need(what, len, n)?;
        }
        need("qkv", qkv.len(), 3 * n)?;
        u32_of("3*B*T*C", 3 * n)?;
        let [b, t, nh, hs] = [b, t, nh, hs].map(|x| x as u32);
        let dir = i32::from(back);
        // SAFETY: (float* ×4, unsigned ×4, int) matches permute_qkv; it touches B·T·C of q,
        // k, v and 3·B·T·C of qkv (checked).
        unsafe {
            tg.launch(&self.permute_qkv, grid(n))
                .arg_written(q)
                .arg_written(k)
                .arg_written(v)
                .arg_written(qkv)
                .value(b)
                .value(t)
                .value(nh)
                .value(hs)
                .value(dir)
                .launch()
        }
    }

    /// `y (B,NH,T,hs)` to `out (B,T,C)` (`back`: `out` to `y`).
    pub fn unpermute<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        out: &'b impl In,
        y: &'b impl In,
        (b, t, nh, hs): (usize, usize, usize, usize),
        back: bool,
    ) -> Result<()> {
        let n = b * t * nh * hs;
        need("unpermute out", out.len(), n)?;
        need("unpermute y", y.len(), n)?;
        u32_of("B*T*C", n)?;
        let [b, t, nh, hs] = [b, t, nh, hs].map(|x| x as u32);
        let dir = i32::from(back);
        // SAFETY: (float* ×2, unsigned ×4, int) matches unpermute; B·T·C of both (checked).
        unsafe {
            tg.launch(&self.unpermute, grid(n))
                .arg_written(out)
                .arg_written(y)
                .value(b)
                .value(t)
                .value(nh)
                .value(hs)
                .value(dir)
                .launch()
        }
    }

    /// Causal softmax of rows of `t` (row r is query `r % t`).
    pub fn softmax_fwd<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        att: &'b impl In,
        pre: &'b impl In,
        t: usize,
    ) -> Result<()> {
        let rows = pre.len() / t;
        need("softmax input", pre.len(), rows * t)?;
        need("softmax output", att.len(), rows * t)?;
        let (r, tt) = (u32_of("rows", rows)?, u32_of("T", t)?);
        // SAFETY: (float*, const float*, unsigned ×2) matches softmax_causal_fwd; warp r <
        // rows touches row r of both (rows·T, checked).
        unsafe {
            tg.launch(&self.softmax_causal_fwd, warp_rows(rows))
                .arg_written(att)
                .arg(pre)
                .value(r)
                .value(tt)
                .launch()
        }
    }

    /// Causal softmax backward.
    pub fn softmax_bwd<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        dpre: &'b impl In,
        datt: &'b impl In,
        att: &'b impl In,
        t: usize,
    ) -> Result<()> {
        let rows = att.len() / t;
        need("softmax att", att.len(), rows * t)?;
        need("softmax datt", datt.len(), rows * t)?;
        need("softmax dpre", dpre.len(), rows * t)?;
        let (r, tt) = (u32_of("rows", rows)?, u32_of("T", t)?);
        // SAFETY: (float*, const float* ×2, unsigned ×2) matches softmax_causal_bwd; warp r
        // < rows touches row r of the three (rows·T each, checked).
        unsafe {
            tg.launch(&self.softmax_causal_bwd, warp_rows(rows))
                .arg_written(dpre)
                .arg(datt)
                .arg(att)
                .value(r)
                .value(tt)
                .launch()
        }
    }

    /// `out = gelu(inp)` (tanh approximation).
    pub fn gelu_fwd<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        out: &'b impl In,
        inp: &'b impl In,
    ) -> Result<()> {
        need("gelu out", out.len(), inp.len())?;
        let n = u32_of("gelu n", inp.len())?;
        // SAFETY: (float*, const float*, unsigned) matches gelu_fwd; n of each (checked).
        unsafe {
            tg.launch(&self.gelu_fwd, grid(inp.len()))
                .arg_written(out)
                .arg(inp)
                .value(n)
                .launch()
        }
    }

    /// `dinp = gelu'(inp) · dout`.
    pub fn gelu_bwd<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        dinp: &'b impl In,
        inp: &'b impl In,
        dout: &'b impl In,
    ) -> Result<()> {
        need("gelu dinp", dinp.len(), inp.len())?;
        need("gelu dout", dout.len(), inp.len())?;
        let n = u32_of("gelu n", inp.len())?;
        // SAFETY: (float*, const float* ×2, unsigned) matches gelu_bwd; n of each (checked).
        unsafe {
            tg.launch(&self.gelu_bwd, grid(inp.len()))
                .arg_written(dinp)
                .arg(inp)
                .arg(dout)
                .value(n)
                .launch()
        }
    }

    /// Cross-entropy of `logits` (`rows × v`) against `targets`: per-row `losses`, their
    /// mean into `loss[0]`, and with `grad = Some(k)` the logits' gradient of `k` × the
    /// mean (`k = 1/ranks` makes the ranks' summed gradients the global batch's).
    #[allow(clippy::too_many_arguments)]
    pub fn xent<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        dlogits: &'b impl In,
        losses: &'b impl In,
        loss: &'b impl In,
        logits: &'b impl In,
        targets: &'b impl In,
        v: usize,
        grad: Option<f32>,
    ) -> Result<()> {
        let n = targets.len();
        need("logits", logits.len(), n * v)?;
        need("dlogits", dlogits.len(), n * v)?;
        need("losses", losses.len(), n)?;
        need("loss", loss.len(), 1)?;
        let (nn, vv) = (u32_of("rows", n)?, u32_of("V", v)?);
        let scale = 1.0f32 / n as f32;
        let dscale = grad.unwrap_or(0.0) * scale;
        let g = i32::from(grad.is_some());
        // SAFETY: (float* ×2, const float*, const unsigned*, unsigned ×2, float, int) matches
        // xent; block r < N touches row r of logits and dlogits (N·V, checked), losses[r]
        // and targets[r]; the targets are below V (the host makes them from bytes, V = 256).
        unsafe {
            tg.launch(&self.xent, blocks(nn, 256))
                .arg_written(dlogits)
                .arg_written(losses)
                .arg(logits)
                .arg(targets)
                .value(nn)
                .value(vv)
                .value(dscale)
                .value(g)
                .launch()?;
        }
        let zero = 0u32;
        // SAFETY: (float*, const float*, unsigned, float, unsigned) matches sum_finish; it
        // reads N of losses and writes loss[0] (one element, checked).
        unsafe {
            tg.launch(&self.sum_finish, blocks(1, 256))
                .arg_written(loss)
                .arg(losses)
                .value(nn)
                .value(scale)
                .value(zero)
                .launch()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's widest fused layer-norm backward is the kernel's 64·RP.
    #[test]
    fn ln_bwd_fused_width_is_the_kernels() {
        let rp: usize = SOURCE
            .lines()
            .find_map(|l| l.strip_prefix("#define RP "))
            .expect("kernels.cu defines RP")
            .trim()
            .parse()
            .expect("RP is a number");
        assert_eq!(LN_BWD_FUSED_MAX_C, 64 * rp);
    }

    /// Chunks of 8 rows below 2048 rows, 256 chunks from there on (gpt2's 32768 rows
    /// included).
    #[test]
    fn colsum_parts_are_chunks_of_8_rows_up_to_256() {
        for (rows, parts) in [
            (0, 1),
            (1, 1),
            (8, 1),
            (9, 2),
            (65, 9),
            (2047, 256),
            (2048, 256),
            (2100, 256),
            (8192, 256),
            (16384, 256),
            (32768, 256),
            (131072, 256),
        ] {
            assert_eq!(colsum_parts(rows), parts, "{rows} rows");
        }
        // Every chunk below 2048 rows holds at most 8 rows, one a warp of layernorm_bwd.
        for rows in 1..2048usize {
            assert!(
                rows.div_ceil(colsum_parts(rows)) <= COLSUM_MIN_CHUNK,
                "{rows} rows"
            );
        }
    }

    /// The host emulator's check programs launch the column sums and the layer-norm
    /// backward with the chunks the host gives.
    #[test]
    fn the_emulated_colsum_parts_are_the_hosts() {
        let rule = format!("cdiv(rows, {COLSUM_MIN_CHUNK}), 1u, {COLSUM_MAX_PARTS}u)");
        for (file, source) in [
            ("layernorm_check", include_str!("emu/layernorm_check.cpp")),
            ("kernels_check", include_str!("emu/kernels_check.cpp")),
        ] {
            let line = source
                .lines()
                .find(|l| l.starts_with("static unsigned colsum_parts(unsigned rows)"))
                .unwrap_or_else(|| panic!("{file}.cpp defines colsum_parts(unsigned rows)"));
            assert!(line.contains(&rule), "{file}.cpp: `{line}` is not `{rule}`");
        }
    }
}
