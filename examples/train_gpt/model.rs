//! The GPT's shape ([`Config`]), its parameters laid out in one flat buffer
//! ([`ParamLayout`], names as in `scripts/torch_gpt.py`'s `state_dict`) and their
//! initialisation ([`init_params`]). Pure host code.

use crate::GptError;
use crate::kernels;
use gpubind::blas::Matmul;

/// Byte-level tokens.
pub const VOCAB: usize = 256;

/// A GPT-2 shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    pub layers: usize,
    pub heads: usize,
    pub width: usize,
    pub context: usize,
    pub vocab: usize,
}

impl Config {
    /// `small` (6 layers, 6 heads, 384 wide, context 256) or `gpt2` (12, 12, 768, 1024).
    pub fn named(name: &str) -> Result<Config, GptError> {
        let (layers, heads, width, context) = match name {
            "small" => (6, 6, 384, 256),
            "gpt2" => (12, 12, 768, 1024),
            other => return Err(GptError::UnknownModel(other.to_string())),
        };
        Ok(Config {
            layers,
            heads,
            width,
            context,
            vocab: VOCAB,
        })
    }

    /// Head size.
    pub fn head_size(&self) -> usize {
        self.width / self.heads
    }

    /// Model FLOPs of one training step per token (forward + backward = 3 × forward),
    /// counting the matrix products and the attention, as PaLM's MFU does:
    /// `6·N + 6·L·T·C` (N: non-embedding parameters plus the tied head).
    pub fn flops_per_token(&self) -> f64 {
        let (l, c, t, v) = (
            self.layers as f64,
            self.width as f64,
            self.context as f64,
            self.vocab as f64,
        );
        let n = l * 12.0 * c * c + v * c;
        6.0 * n + 6.0 * l * t * c
    }
}

/// Sizes of one step: batch `b` of `t` tokens.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub b: usize,
    pub t: usize,
    pub c: usize,
    pub nh: usize,
    pub hs: usize,
    pub v: usize,
    pub l: usize,
}

impl Dims {
    pub fn new(cfg: &Config, b: usize) -> Dims {
        Dims {
            b,
            t: cfg.context,
            c: cfg.width,
            nh: cfg.heads,
            hs: cfg.head_size(),
            v: cfg.vocab,
            l: cfg.layers,
        }
    }
    pub fn bt(&self) -> usize {
        self.b * self.t
    }
    pub fn att(&self) -> usize {
        self.b * self.nh * self.t * self.t
    }
    /// The largest element counts the kernels index, by name: `B·T·4C` (the MLP's hidden
    /// activations) and, unfused, `B·NH·T·T` (else 0). Each must stay below 2³¹.
    pub fn largest_indices(&self, unfused: bool) -> [(&'static str, usize); 2] {
        let att = if unfused { self.att() } else { 0 };
        [("B·T·4C", self.bt() * 4 * self.c), ("B·NH·T·T", att)]
    }
    /// Elements of the activations and scratch buffers, with the unfused attention's
    /// (`B·NH·T·T` matrices and per-head copies) or the fused one's (row statistics).
    pub fn activation_floats(&self, unfused: bool) -> usize {
        let (bt, c) = (self.bt(), self.c);
        let common = bt * (19 * c + 4);
        // The column sums' partials: 4C wide, and the residual gradient's C.
        let scratch = bt * (17 * c + 2 * self.v) + kernels::COLSUM_MAX_PARTS * 5 * c;
        let (block, scratch) = if unfused {
            (
                common + bt * 4 * c + self.att(),
                scratch + 2 * self.att() + bt * 4 * c,
            )
        } else {
            // dsum, and the mma attention's QKV bias partial sums.
            let rows = self.b * self.nh * self.t;
            let bias = crate::attention::bias_partial_len(self.b, self.t, c);
            (common + rows, scratch + rows + bias)
        };
        self.l * block + scratch + bt * (2 * c + 2 + self.v + 1) + 2 * bt
    }
}

/// Free device memory a model keeps beyond its buffers (cuBLAS workspaces, graphs,
/// kernels).
pub const HEADROOM: usize = 1 << 30;

/// Bytes of device memory a model of `cfg` allocates for batch `b` (per device): the
/// activations and scratch in elements of `act` bytes, and the parameters, their
/// gradients and the optimizer state (f32 master weights and two moments, two copies in
/// the activation type).
pub fn device_bytes(cfg: &Config, b: usize, unfused: bool, act: usize) -> usize {
    let params = ParamLayout::new(cfg).total;
    Dims::new(cfg, b).activation_floats(unfused) * act + params * (3 * 4 + 2 * act)
}

/// The largest batch whose buffers and [`HEADROOM`] fit in `free` bytes, and whose
/// [`Dims::largest_indices`] stay below 2³¹: the batches `Gpt::new` accepts; 0 when not
/// even one sequence fits.
pub fn largest_batch(cfg: &Config, unfused: bool, act: usize, free: usize) -> usize {
    let fits = |b: usize| {
        let indices = Dims::new(cfg, b).largest_indices(unfused);
        indices.iter().all(|&(_, n)| n <= i32::MAX as usize)
            && device_bytes(cfg, b, unfused, act) + HEADROOM <= free
    };
    // The need grows with the batch: the last batch that fits, by bisection.
    let (mut lo, mut hi) = (0, 1);
    while fits(hi) {
        (lo, hi) = (hi, hi * 2);
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) { lo = mid } else { hi = mid }
    }
    lo
}

/// `Y[n×out] = X[n×in] · Wᵀ` (W stored out × in, as torch's Linear).
pub fn linear(n: usize, out: usize, inp: usize) -> Matmul {
    Matmul::new(n, out, inp).transpose_b()
}

/// One parameter tensor inside the flat buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    pub name: String,
    pub shape: Vec<usize>,
    pub offset: usize,
    /// AdamW weight decay applies (every 2-D tensor: the embeddings and the linear
    /// weights; not biases nor layer-norm parameters).
    pub decay: bool,
}

impl Param {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len()
    }
}

/// Where each parameter lives in the flat buffer: `wte`, `wpe`, each block's tensors in
/// order, `ln_f`. A layer-norm weight is directly followed by its bias.
#[derive(Debug, Clone)]
pub struct ParamLayout {
    pub params: Vec<Param>,
    pub total: usize,
}

/// The per-block tensors: name suffix and shape in units of the width C (rows, cols).
const BLOCK: [(&str, usize, usize); 12] = [
    ("ln_1.weight", 1, 0),
    ("ln_1.bias", 1, 0),
    ("attn.c_attn.weight", 3, 1),
    ("attn.c_attn.bias", 3, 0),
    ("attn.c_proj.weight", 1, 1),
    ("attn.c_proj.bias", 1, 0),
    ("ln_2.weight", 1, 0),
    ("ln_2.bias", 1, 0),
    ("mlp.c_fc.weight", 4, 1),
    ("mlp.c_fc.bias", 4, 0),
    ("mlp.c_proj.weight", 1, 4),
    ("mlp.c_proj.bias", 1, 0),
];

impl ParamLayout {
    pub fn new(cfg: &Config) -> ParamLayout {
        let c = cfg.width;
        let mut params = Vec::new();
        let mut offset = 0;
        let mut push = |name: String, shape: Vec<usize>| {
            let decay = shape.len() == 2;
            let p = Param {
                name,
                shape,
                offset,
                decay,
            };
            offset += p.len();
            params.push(p);
        };
        push("wte.weight".into(), vec![cfg.vocab, c]);
        push("wpe.weight".into(), vec![cfg.context, c]);
        for l in 0..cfg.layers {
            for (suffix, rows, cols) in BLOCK {
                let shape = if cols == 0 {
                    vec![rows * c]
                } else {
                    vec![rows * c, cols * c]
                };
                push(format!("h.{l}.{suffix}"), shape);
            }
        }
        push("ln_f.weight".into(), vec![c]);
        push("ln_f.bias".into(), vec![c]);
        ParamLayout {
            params,
            total: offset,
        }
    }

    /// The tensor `name` (a layout has every name once).
    pub fn get(&self, name: &str) -> &Param {
        self.params
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("train_gpt: no parameter {name}"))
    }

    /// The index of tensor `name` in [`params`](Self::params).
    /// One byte per parameter of the flat buffer: 1 where AdamW decays it, else 0.
    pub fn decay_mask(&self) -> Vec<u8> {
        let mut mask = vec![0u8; self.total];
        for p in self.params.iter().filter(|p| p.decay) {
            mask[p.range()].fill(1);
        }
        mask
    }

    pub fn index(&self, name: &str) -> usize {
        self.params
            .iter()
            .position(|p| p.name == name)
            .unwrap_or_else(|| panic!("train_gpt: no parameter {name}"))
    }

    /// The range of block `l`'s tensor `suffix`.
    pub fn block(&self, l: usize, suffix: &str) -> std::ops::Range<usize> {
        self.get(&format!("h.{l}.{suffix}")).range()
    }
}

/// SplitMix64: the example's seeded generator (data order, initialisation, sampling).
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in 0..n.
    pub fn below(&mut self, n: usize) -> usize {
        (self.uniform() * n as f64) as usize % n.max(1)
    }
    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// GPT-2's initialisation: weights and embeddings N(0, 0.02), the residual projections
/// (`c_proj`) N(0, 0.02/√(2L)), biases 0, layer-norm weights 1.
pub fn init_params(cfg: &Config, layout: &ParamLayout, seed: u64) -> Vec<f32> {
    let mut rng = Rng(seed ^ 0x6770_7432);
    let mut out = vec![0.0f32; layout.total];
    let proj_std = 0.02 / (2.0 * cfg.layers as f64).sqrt();
    for p in &layout.params {
        let dst = &mut out[p.range()];
        if p.shape.len() == 2 {
            let std = if p.name.ends_with("c_proj.weight") {
                proj_std
            } else {
                0.02
            };
            dst.iter_mut()
                .for_each(|x| *x = (rng.normal() * std) as f32);
        } else if p.name.contains("ln_") && p.name.ends_with(".weight") {
            dst.fill(1.0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn largest_batch_is_the_last_that_fits() {
        for (model, act) in [("gpt2", 2), ("gpt2", 4), ("small", 2)] {
            let cfg = Config::named(model).unwrap();
            for unfused in [false, true] {
                let need = |b| device_bytes(&cfg, b, unfused, act) + HEADROOM;
                assert_eq!(largest_batch(&cfg, unfused, act, need(1) - 1), 0);
                for b in [1, 7, 32, 100] {
                    // Exactly enough for b, and one byte short of b + 1.
                    assert_eq!(largest_batch(&cfg, unfused, act, need(b)), b, "{model} {b}");
                    assert_eq!(largest_batch(&cfg, unfused, act, need(b + 1) - 1), b);
                }
            }
        }
        // gpt2's B·T·4C passes 2³¹ - 1 above 682 sequences, whatever the memory.
        let cfg = Config::named("gpt2").unwrap();
        assert_eq!(largest_batch(&cfg, false, 2, usize::MAX / 4), 682);
        // The unfused attention's B·NH·T·T passes it first: above 170.
        assert_eq!(largest_batch(&cfg, true, 2, usize::MAX / 4), 170);
    }

    #[test]
    fn layout_counts_gpt2_parameters() {
        let cfg = Config::named("gpt2").unwrap();
        let layout = ParamLayout::new(&cfg);
        // GPT-2 small with a 256-token vocabulary: 124,439,808 - (50257 - 256)·768.
        assert_eq!(layout.total, 124_439_808 - (50257 - 256) * 768);
        assert_eq!(layout.params.len(), 2 + 12 * 12 + 2);
        let ln = layout.get("h.3.ln_2.weight");
        assert_eq!(layout.get("h.3.ln_2.bias").offset, ln.offset + 768);
        assert!(layout.get("h.0.mlp.c_fc.weight").decay);
        assert!(!layout.get("h.0.mlp.c_fc.bias").decay);
        let mask = layout.decay_mask();
        assert_eq!(mask.len(), layout.total);
        for p in &layout.params {
            assert!(
                mask[p.range()].iter().all(|&d| d == u8::from(p.decay)),
                "{}",
                p.name
            );
        }
        // The one AdamW launch decays all but the biases and layer norms: 13·C a block
        // (ln_1 2C, c_attn.bias 3C, c_proj.bias C, ln_2 2C, c_fc.bias 4C, mlp c_proj.bias
        // C) and ln_f's 2C.
        let kept = mask.iter().filter(|&&d| d == 0).count();
        assert_eq!(kept, 12 * 13 * 768 + 2 * 768);
        assert!(
            mask[layout.get("wte.weight").range()]
                .iter()
                .all(|&d| d == 1)
        );
        assert_eq!(layout.get("h.0.attn.c_attn.weight").shape, [2304, 768]);
    }

    #[test]
    fn fused_attention_needs_no_square_matrices() {
        let d = Dims::new(&Config::named("gpt2").unwrap(), 8);
        let (un, fu) = (d.activation_floats(true), d.activation_floats(false));
        assert!(un - fu > (d.l + 2) * d.att(), "unfused {un}, fused {fu}");
    }

    #[test]
    fn unknown_model_is_an_error() {
        assert!(matches!(
            Config::named("gpt5"),
            Err(GptError::UnknownModel(n)) if n == "gpt5"
        ));
    }

    #[test]
    fn init_is_seeded_and_scaled() {
        let cfg = Config::named("small").unwrap();
        let layout = ParamLayout::new(&cfg);
        let a = init_params(&cfg, &layout, 1);
        assert_eq!(a, init_params(&cfg, &layout, 1));
        assert_ne!(a, init_params(&cfg, &layout, 2));
        let w = &a[layout.get("wte.weight").range()];
        let var = w.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / w.len() as f64;
        assert!((var.sqrt() - 0.02).abs() < 0.001, "std {}", var.sqrt());
        assert!(
            a[layout.get("ln_f.weight").range()]
                .iter()
                .all(|&x| x == 1.0)
        );
        assert!(
            a[layout.get("h.0.attn.c_attn.bias").range()]
                .iter()
                .all(|&x| x == 0.0)
        );
    }
}
