//! The fused causal attention (flash-attention style) as owned [`Kernel`]s, compiled in a
//! module of their own, and launch wrappers that check every length the kernels rely on.
//! Two implementations with one interface: `attention.cu` (tiles of scores and
//! accumulators in shared memory; wmma products in bf16, FMA loops in fp32) and, for bf16
//! only, `attention_mma.cu` (flash-attention-2 style: each warp's scores and accumulators
//! in registers, `mma.sync` products).
//!
//! The forward pass reads q, k and v from the QKV product `(B, T, 3, NH, 64)` and writes
//! `y` as `(B, T, NH, 64)` (the projection's input) and each row's log-sum-exp; the
//! backward pass recomputes the probabilities from q, k and the log-sum-exp and writes
//! dq, dk and dv into `dqkv` (`(B, T, 3, NH, 64)`), with each row's `rowsum(dy ⊙ y)` on
//! the way (a kernel of its own in `attention.cu`, computed by dq's kernel in
//! `attention_mma.cu`). Only head size 64 is compiled.

use crate::kernels::u32_of;
use crate::launch::In;
use gpubind::{BoundDevice, CompileOptions, Error, Kernel, LaunchConfig, Result};
use gpubind::{Issue, KernelLaunch};

/// The shared-memory tiled kernels' CUDA source.
pub const SOURCE: &str = include_str!("attention.cu");

/// The register-tiled bf16 kernels' CUDA source.
pub const SOURCE_MMA: &str = include_str!("attention_mma.cu");

/// Queries per block of [`SOURCE_MMA`]'s forward and dq kernels (`QT`), and keys per block
/// of its dk/dv kernel (`KB`: 4 warps of `DKM` m-tiles of 16 keys).
const MMA_TILES: (usize, usize) = (128, 128);

/// The one head size the kernels are compiled for.
pub const HEAD_SIZE: usize = 64;

/// Threads per block of the tiled kernels (`NT` in the source).
const THREADS: u32 = 128;

/// Queries per block and keys per tile (`BR`, `BC` in the source).
pub fn tiles(bf16: bool) -> (usize, usize) {
    if bf16 { (32, 32) } else { (16, 16) }
}

/// The fused attention kernels of one precision, compiled once per device.
pub struct Attention {
    fwd: Kernel,
    /// `rowsum(dy ⊙ y)` on its own ([`SOURCE`]); [`SOURCE_MMA`]'s dq kernel computes it.
    bwd_d: Option<Kernel>,
    bwd_dq: Kernel,
    bwd_dkdv: Kernel,
    tiles: (usize, usize),
    /// The kernels load and store 16 bytes at a time: every buffer 16-byte aligned.
    aligned: bool,
}

/// Rows of the column-sum partials that [`SOURCE_MMA`]'s backward kernels write with a
/// `bsum` buffer for batch `b` and sequence length `t`: `B·⌈T/QT⌉` for dq, `B·⌈T/KB⌉` each
/// for dk and dv.
pub fn bias_parts(b: usize, t: usize) -> (usize, usize) {
    (b * t.div_ceil(MMA_TILES.0), b * t.div_ceil(MMA_TILES.1))
}

/// f32 elements of that `bsum` buffer for width `c`: dq's partial rows, then dk's, then
/// dv's, each `c` wide (the layout `Kernels::qkv_bias_finish` reads).
pub fn bias_partial_len(b: usize, t: usize, c: usize) -> usize {
    let (pq, pkv) = bias_parts(b, t);
    (pq + 2 * pkv) * c
}

/// `(b, t, nh, hs)`: batch, sequence length, heads, head size.
pub type Shape = (usize, usize, usize, usize);

/// Checks that the fused kernels take `shape`: head size [`HEAD_SIZE`], a non-empty
/// sequence, `b·nh` blocks in the grid's y dimension, every buffer below 2^31 elements.
pub fn check_shape((b, t, nh, hs): Shape) -> Result<()> {
    if hs != HEAD_SIZE {
        return Err(Error::InvalidArgument(format!(
            "train_gpt: the fused attention takes head size {HEAD_SIZE}, not {hs} \
             (use --attention unfused)"
        )));
    }
    if b == 0 || t == 0 || nh == 0 {
        return Err(Error::InvalidArgument(format!(
            "train_gpt: fused attention of an empty shape (B {b}, T {t}, NH {nh})"
        )));
    }
    if b * nh > 65_535 {
        return Err(Error::InvalidArgument(format!(
            "train_gpt: fused attention of B·NH = {} heads exceeds the grid's 65535",
            b * nh
        )));
    }
    u32_of("3·B·T·C", 3 * b * t * nh * hs)?;
    Ok(())
}

fn need(what: &str, len: usize, want: usize) -> Result<()> {
    if len == want {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "train_gpt: fused attention {what} has {len} elements, the kernel needs {want}"
        )))
    }
}

impl Attention {
    /// Compiles the kernels for `gpu`'s device and looks them up: with `bf16` and `mma`,
    /// [`SOURCE_MMA`]; otherwise [`SOURCE`] (bf16 activations and wmma if `bf16`). A
    /// compile error carries NVRTC's log.
    pub fn load(gpu: &BoundDevice<'_>, bf16: bool, mma: bool) -> Result<Self> {
        let mut opts = CompileOptions::new();
        if bf16 {
            opts = opts.define("ACT_BF16", 1);
        }
        let (source, name, tiles) = if bf16 && mma {
            (SOURCE_MMA, "train_gpt_attention_mma.cu", MMA_TILES)
        } else {
            (SOURCE, "train_gpt_attention.cu", tiles(bf16))
        };
        let module = gpu
            .compile_and_load_with(source, name, &opts)?
            .into_shared();
        Ok(Attention {
            fwd: module.kernel("attn_fwd")?,
            bwd_d: if bf16 && mma {
                None
            } else {
                Some(module.kernel("attn_bwd_d")?)
            },
            bwd_dq: module.kernel("attn_bwd_dq")?,
            bwd_dkdv: module.kernel("attn_bwd_dkdv")?,
            tiles,
            aligned: bf16 && mma,
        })
    }

    /// Whether [`backward`](Self::backward) takes a `bsum` buffer: the column sums of dq,
    /// dk and dv (the QKV bias gradient's partial sums) come with the mma kernels.
    pub fn sums_bias(&self) -> bool {
        self.aligned
    }

    /// Which implementation this is, for messages.
    pub fn name(&self) -> &'static str {
        if self.aligned { "mma" } else { "tiled" }
    }

    /// Every buffer 16-byte aligned, where the kernels need it.
    fn check_aligned(&self, bufs: &[(&str, &dyn In)]) -> Result<()> {
        for (what, b) in bufs {
            if self.aligned && b.addr() % 16 != 0 {
                return Err(Error::InvalidArgument(format!(
                    "train_gpt: fused attention {what} at {:#x} is not 16-byte aligned",
                    b.addr()
                )));
            }
        }
        Ok(())
    }

    /// A block per tile of `tile` rows and head: grid (tiles, heads), or for the mma
    /// kernels (heads, tiles), so that every head's tiles of the most work (the last
    /// queries', the first keys') start before any head's lighter ones and the grid ends on
    /// light tiles.
    fn tiled(&self, rows: usize, tile: usize, heads: usize) -> LaunchConfig {
        let (tiles, heads) = (rows.div_ceil(tile) as u32, heads as u32);
        LaunchConfig {
            grid_dim: if self.aligned {
                (heads, tiles, 1)
            } else {
                (tiles, heads, 1)
            },
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// `y = softmax(q·kᵀ/√64, causal)·v` per head, and `lse` (`B·NH·T`, f32): each
    /// row's log-sum-exp, which the backward pass reads.
    pub fn forward<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        y: &'b impl In,
        lse: &'b impl In,
        qkv: &'b impl In,
        shape: Shape,
    ) -> Result<()> {
        check_shape(shape)?;
        let (b, t, nh, hs) = shape;
        need("qkv", qkv.len(), 3 * b * t * nh * hs)?;
        need("y", y.len(), b * t * nh * hs)?;
        need("lse", lse.len(), b * nh * t)?;
        self.check_aligned(&[("qkv", qkv), ("y", y)])?;
        let (tt, nn) = (t as u32, nh as u32);
        let scale = 1.0f32 / (hs as f32).sqrt();
        // SAFETY: (act_t*, float*, const act_t*, unsigned ×2, float) matches attn_fwd
        // of both sources. The block of tile i and head j < B·NH (`tiled`) handles queries
        // [q0, q0 + BR) of head j with q0 = (tiles - 1 - i)·BR < T (BR: `tiles.0`); it
        // reads rows < T of q, k, v of that head inside qkv (3·B·T·C, checked), writes
        // rows < T of y (B·T·C, checked) and lse entries j·T + t, t < T (B·NH·T). Head
        // size 64 (checked) is the sources' HD; the 16-byte accesses of the mma kernels
        // are at multiples of 8 elements from 16-byte aligned buffers (checked).
        unsafe {
            tg.launch(&self.fwd, self.tiled(t, self.tiles.0, b * nh))
                .arg_written(y)
                .arg_written(lse)
                .arg(qkv)
                .value(tt)
                .value(nn)
                .value(scale)
                .launch()
        }
    }

    /// `dsum = rowsum(dy ⊙ y)` with `attention.cu`'s `attn_bwd_d`: eight lanes a row.
    fn dsum<'b>(
        tg: &mut impl Issue<'b>,
        kernel: &Kernel,
        dsum: &'b impl In,
        y: &'b impl In,
        dy: &'b impl In,
        (rr, tt, nn): (u32, u32, u32),
    ) -> Result<()> {
        let eight_lanes_a_row = LaunchConfig {
            grid_dim: (rr.div_ceil(32), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: (float*, const act_t* ×2, unsigned ×3) matches attention.cu's
        // attn_bwd_d; lanes of row r < B·T·NH read the 64 elements of row r of y and dy
        // (B·T·NH·64, checked by `backward`, the one caller) and write one dsum entry
        // (b·NH + h)·T + t < B·NH·T (checked there too).
        unsafe {
            tg.launch(kernel, eight_lanes_a_row)
                .arg_written(dsum)
                .arg(y)
                .arg(dy)
                .value(rr)
                .value(tt)
                .value(nn)
                .launch()
        }
    }

    /// A gradient kernel taking `(dqkv, qkv, dy, lse, dsum, T, NH, scale)`: attention.cu's
    /// `attn_bwd_dq` and `attn_bwd_dkdv`. `backward`, the one caller, has checked every
    /// length.
    fn grads<'b>(
        tg: &mut impl Issue<'b>,
        kernel: &Kernel,
        grid: LaunchConfig,
        dqkv: &'b impl In,
        (qkv, dy, lse, dsum): (&'b impl In, &'b impl In, &'b impl In, &'b impl In),
        (tt, nn, scale): (u32, u32, f32),
    ) -> Result<()> {
        // SAFETY: (act_t*, const act_t* ×2, const float* ×2, unsigned ×2, float) matches
        // those kernels; the block of head j (`tiled`) reads rows < T of head j's q, k, v
        // (qkv: 3·B·T·C), dy (B·T·C), lse and dsum (B·NH·T), and writes rows < T of head
        // j in dqkv (3·B·T·C): attn_bwd_dq its dq, attn_bwd_dkdv its dk and dv, disjoint
        // from each other.
        unsafe {
            tg.launch(kernel, grid)
                .arg_written(dqkv)
                .arg(qkv)
                .arg(dy)
                .arg(lse)
                .arg(dsum)
                .value(tt)
                .value(nn)
                .value(scale)
                .launch()
        }
    }

    /// The backward pass of [`forward`](Self::forward): `dqkv` (dq, dk, dv, laid out
    /// as `qkv`; overwritten) from `dy` (as `y`), with `dsum` (`B·NH·T`, f32) holding
    /// `rowsum(dy ⊙ y)` on the way. With `bsum` (only where [`sums_bias`](Self::sums_bias);
    /// [`bias_partial_len`] f32 elements at least), also the column sums of dq, dk and dv
    /// per block of rows, laid out as [`bias_parts`] says, which
    /// `Kernels::qkv_bias_finish` adds up into the QKV bias gradient.
    #[allow(clippy::too_many_arguments)]
    pub fn backward<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        dqkv: &'b impl In,
        dsum: &'b impl In,
        bsum: Option<&'b impl In>,
        (qkv, y, lse): (&'b impl In, &'b impl In, &'b impl In),
        dy: &'b impl In,
        shape: Shape,
    ) -> Result<()> {
        check_shape(shape)?;
        let (b, t, nh, hs) = shape;
        let n = b * t * nh * hs;
        need("qkv", qkv.len(), 3 * n)?;
        need("dqkv", dqkv.len(), 3 * n)?;
        need("y", y.len(), n)?;
        need("dy", dy.len(), n)?;
        need("lse", lse.len(), b * nh * t)?;
        need("dsum", dsum.len(), b * nh * t)?;
        self.check_aligned(&[("qkv", qkv), ("dqkv", dqkv), ("y", y), ("dy", dy)])?;
        if let Some(bsum) = bsum {
            if !self.sums_bias() {
                return Err(Error::InvalidArgument(
                    "train_gpt: the tiled attention takes no bias partial sums".into(),
                ));
            }
            let want = bias_partial_len(b, t, nh * hs);
            if bsum.len() < want {
                return Err(Error::InvalidArgument(format!(
                    "train_gpt: fused attention bias partial sums have {} elements, the \
                     kernels need {want}",
                    bsum.len()
                )));
            }
        }
        let rows = b * t * nh;
        let (rr, tt, nn) = (rows as u32, t as u32, nh as u32);
        let scale = 1.0f32 / (hs as f32).sqrt();
        let (dq_grid, dkdv_grid) = (
            self.tiled(t, self.tiles.0, b * nh),
            self.tiled(t, self.tiles.1, b * nh),
        );
        let grads = (qkv, dy, lse, dsum);
        let Some(bwd_d) = &self.bwd_d else {
            let grids = (dq_grid, dkdv_grid);
            let ins = (qkv, y, lse, dy);
            return self.backward_mma(tg, grids, (dqkv, dsum, bsum), ins, (tt, nn, scale));
        };
        Self::dsum(tg, bwd_d, dsum, y, dy, (rr, tt, nn))?;
        Self::grads(tg, &self.bwd_dq, dq_grid, dqkv, grads, (tt, nn, scale))?;
        // dsum is written by the launch before, on the same stream or capture.
        Self::grads(tg, &self.bwd_dkdv, dkdv_grid, dqkv, grads, (tt, nn, scale))
    }

    /// [`backward`](Self::backward) with [`SOURCE_MMA`]'s kernels, on `backward`'s grids;
    /// `backward`, the one caller, has checked every length and alignment.
    fn backward_mma<'b>(
        &self,
        tg: &mut impl Issue<'b>,
        (dq_grid, dkdv_grid): (LaunchConfig, LaunchConfig),
        (dqkv, dsum, bsum): (&'b impl In, &'b impl In, Option<&'b impl In>),
        (qkv, y, lse, dy): (&'b impl In, &'b impl In, &'b impl In, &'b impl In),
        (tt, nn, scale): (u32, u32, f32),
    ) -> Result<()> {
        // SAFETY: (bf16*, float* ×2, const bf16* ×3, const float*, unsigned ×2, float)
        // matches attention_mma.cu's attn_bwd_dq. The block of tile i and head j < B·NH
        // handles queries [q0, q0 + 128), q0 = (tiles - 1 - i)·128 < T: it reads rows < T
        // of head j's q, k, v (qkv, checked), y and dy (B·T·C, checked) and lse (B·NH·T,
        // checked), and writes the dq rows < T of head j in dqkv (3·B·T·C, checked) and
        // dsum entries j·T + t, t < T (B·NH·T, checked). With bsum (else a null pointer,
        // which the kernel never dereferences), it writes the 64 entries of head h = j %
        // NH in row b·⌈T/128⌉ + q0/128 < B·⌈T/128⌉ (b = j / NH < B) of its C-wide rows:
        // inside bias_partial_len ≤ bsum's length (checked). 16-byte accesses are at
        // multiples of 8 elements from 16-byte aligned buffers (checked).
        unsafe {
            let mut l = tg.launch(&self.bwd_dq, dq_grid);
            l.arg_written(dqkv).arg_written(dsum);
            match bsum {
                Some(bsum) => l.arg_written(bsum),
                None => l.value(0u64),
            };
            l.arg(qkv)
                .arg(y)
                .arg(dy)
                .arg(lse)
                .value(tt)
                .value(nn)
                .value(scale)
                .launch()?;
        }
        // SAFETY: (bf16*, float*, const bf16* ×2, const float* ×2, unsigned ×2, float)
        // matches attention_mma.cu's attn_bwd_dkdv. The block of tile i and head j <
        // B·NH handles keys [i·KB, (i + 1)·KB) (KB = 128, `MMA_TILES`): it reads rows < T
        // of head j's q, k, v (qkv), dy, and lse and dsum (B·NH·T; dsum written by the
        // launch before, on the same stream or capture), and writes the dk and dv rows
        // < T of head j in dqkv (3·B·T·C), disjoint from dq's. With bsum (else a null
        // pointer, never dereferenced), it writes the 64 entries of head j % NH in rows
        // B·⌈T/128⌉ + b·⌈T/KB⌉ + i (dk's) and that + B·⌈T/KB⌉ (dv's) (b = j / NH < B, i <
        // ⌈T/KB⌉), both below B·⌈T/128⌉ + 2·B·⌈T/KB⌉ (`bias_parts`), so inside
        // bias_partial_len ≤ bsum's length (checked). Lengths and alignment are checked
        // by `backward`.
        unsafe {
            let mut l = tg.launch(&self.bwd_dkdv, dkdv_grid);
            l.arg_written(dqkv);
            match bsum {
                Some(bsum) => l.arg_written(bsum),
                None => l.value(0u64),
            };
            l.arg(qkv)
                .arg(dy)
                .arg(lse)
                .arg(dsum)
                .value(tt)
                .value(nn)
                .value(scale)
                .launch()
        }
    }
}

#[cfg(test)]
#[path = "attention_emu.rs"]
mod emu;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_head_size_64_is_taken() {
        assert!(check_shape((8, 1024, 12, 64)).is_ok());
        assert!(check_shape((2, 77, 3, 64)).is_ok());
        for bad in [
            (8, 256, 6, 32),
            (0, 256, 6, 64),
            (1, 0, 1, 64),
            (70_000, 1, 1, 64),
        ] {
            assert!(
                matches!(check_shape(bad), Err(Error::InvalidArgument(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn tiles_are_what_the_source_defines() {
        for (bf16, (br, bc)) in [(true, tiles(true)), (false, tiles(false))] {
            let section = if bf16 {
                SOURCE.split("#else").next().unwrap()
            } else {
                SOURCE.split("#else").nth(1).unwrap()
            };
            assert!(section.contains(&format!("#define BR {br}\n")), "{bf16}");
            assert!(section.contains(&format!("#define BC {bc}\n")), "{bf16}");
        }
        for src in [SOURCE, SOURCE_MMA] {
            assert!(src.contains(&format!("#define HD {HEAD_SIZE}\n")));
            assert!(src.contains(&format!("#define NT {THREADS}\n")));
        }
        assert!(SOURCE_MMA.contains(&format!("#define QT {}\n", MMA_TILES.0)));
        assert!(SOURCE_MMA.contains(&format!("#define DKM {}\n", MMA_TILES.1 / 64)));
        assert!(SOURCE_MMA.contains("#define KB (4 * 16 * DKM)\n"));
        // The bias partial sums' rows, as `bias_parts` counts them: dq's B·⌈T/QT⌉, then
        // dk's and dv's B·⌈T/KB⌉ each.
        assert!(SOURCE_MMA.contains("const idx_t part = (idx_t)b * gridDim.y + q0 / QT;"));
        assert!(SOURCE_MMA.contains("q_parts = batch * ((T + QT - 1) / QT);"));
        assert!(SOURCE_MMA.contains("q_parts + kv * batch * gridDim.y + (idx_t)b * gridDim.y"));
        assert_eq!(bias_parts(2, 129), (4, 4));
        assert_eq!(bias_partial_len(2, 129, 64), 12 * 64);
    }
}
