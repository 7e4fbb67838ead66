//! The model of `train_mlp`: a 3-layer MLP classifier (ReLU, softmax cross-entropy) trained
//! by SGD with momentum, on the GPU (cuBLAS products + NVRTC elementwise kernels) and, for
//! checking, on the CPU. Shared by the example and `tests/gpu_train.rs`.
#![allow(dead_code, unused_imports)]
// Buffers a kernel writes are passed as `&mut` to document intent (see LaunchBuilder::arg).
#![allow(clippy::unnecessary_mut_passed)]

use rand::{Rng, SeedableRng};

#[path = "graph.rs"]
mod graph;
#[path = "kernels.rs"]
mod kernels;
#[path = "replica.rs"]
mod replica;
#[path = "step.rs"]
mod step;

pub use graph::{StepPlan, StepViews, capture_steps, launch_steps};
pub use kernels::{Fns, KERNELS, Kernels};
pub use replica::{Gradients, PinnedBatch, Replica};
pub use step::{data_parallel_step, enqueue_step, train_steps};

/// Layer widths: input, hidden, hidden, classes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    pub input: usize,
    pub hidden: usize,
    pub classes: usize,
}

impl Shape {
    /// `(fan_in, fan_out)` of the three layers.
    pub fn layers(&self) -> [(usize, usize); 3] {
        [
            (self.input, self.hidden),
            (self.hidden, self.hidden),
            (self.hidden, self.classes),
        ]
    }
    /// Number of parameter tensors (W and b per layer).
    pub const TENSORS: usize = 6;
    /// Element count of each parameter tensor: W1, b1, W2, b2, W3, b3.
    pub fn tensor_lens(&self) -> [usize; 6] {
        let l = self.layers();
        [
            l[0].0 * l[0].1,
            l[0].1,
            l[1].0 * l[1].1,
            l[1].1,
            l[2].0 * l[2].1,
            l[2].1,
        ]
    }
    /// Offset of each tensor (W1, b1, W2, b2, W3, b3) in the flat device layout, which
    /// stores the weights first and the biases after them, `[W1 W2 W3 b1 b2 b3]`, so that
    /// the three bias gradients are one contiguous range (one reduction kernel writes
    /// them) and SGD and the all-reduce each cover every parameter in one call.
    pub fn offsets(&self) -> [usize; 6] {
        let n = self.tensor_lens();
        let (w1, w2, w3) = (0, n[0], n[0] + n[2]);
        let b1 = w3 + n[4];
        [w1, b1, w2, b1 + n[1], w3, b1 + n[1] + n[3]]
    }
    /// Total number of parameters.
    pub fn param_count(&self) -> usize {
        self.tensor_lens().iter().sum()
    }
    /// Where the biases start in the flat layout.
    pub fn bias_offset(&self) -> usize {
        self.offsets()[1]
    }
    /// The range of tensor `t` (0..6, order W1, b1, W2, b2, W3, b3) in the flat layout.
    pub fn range(&self, t: usize) -> std::ops::Range<usize> {
        let off = self.offsets()[t];
        off..off + self.tensor_lens()[t]
    }
    /// The six tensors laid out flat.
    pub fn flatten(&self, tensors: &[Vec<f32>]) -> Vec<f32> {
        let mut flat = vec![0.0; self.param_count()];
        for (t, v) in tensors.iter().enumerate() {
            flat[self.range(t)].copy_from_slice(v);
        }
        flat
    }
    /// The flat layout split back into the six tensors.
    pub fn split(&self, flat: &[f32]) -> Vec<Vec<f32>> {
        (0..Self::TENSORS)
            .map(|t| flat[self.range(t)].to_vec())
            .collect()
    }
    /// Floating-point operations of one training step per sample, counting `2·M·N·K` per
    /// matrix product: the three forward products, the three weight gradients and the two
    /// activation gradients (layer 1's input gradient is not computed). Elementwise work
    /// is not counted.
    pub fn flops_per_sample(&self) -> f64 {
        let [l1, l2, l3] = self.layers();
        let mac = |l: (usize, usize)| (l.0 * l.1) as f64;
        2.0 * (3.0 * (mac(l1) + mac(l2) + mac(l3)) - mac(l1))
    }
}

/// Host-side parameters (W row-major `in×out`), initialised He-uniform from `seed`.
pub fn init_params(shape: Shape, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    for (fan_in, fan_out) in shape.layers() {
        let bound = (6.0 / fan_in as f32).sqrt();
        out.push(
            (0..fan_in * fan_out)
                .map(|_| rng.random_range(-bound..bound))
                .collect(),
        );
        out.push(vec![0.0; fan_out]);
    }
    out
}

/// A synthetic, learnable task: labels are the argmax of a fixed random "teacher" MLP on
/// Gaussian-ish inputs. Returns `(x: n×input, y: n)`.
pub fn teacher_data(shape: Shape, n: usize, seed: u64) -> (Vec<f32>, Vec<u32>) {
    let teacher = init_params(shape, 0x7EAC_4E55);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let x: Vec<f32> = (0..n * shape.input)
        .map(|_| (0..4).map(|_| rng.random_range(-1.0f32..1.0)).sum::<f32>() * 0.75)
        .collect();
    let logits = cpu_forward(shape, &teacher, &x, n).logits;
    let y = (0..n)
        .map(|i| argmax(&logits[i * shape.classes..(i + 1) * shape.classes]) as u32)
        .collect();
    (x, y)
}

pub fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| {
            if x > bv { (i, x) } else { (bi, bv) }
        })
        .0
}

// ---------------------------------------------------------------- CPU reference

/// Activations of a CPU forward pass.
pub struct CpuForward {
    pub a1: Vec<f32>,
    pub a2: Vec<f32>,
    pub logits: Vec<f32>,
}

pub fn cpu_matmul(
    a: &[f32],
    b: &[f32],
    m: usize,
    n: usize,
    k: usize,
    ta: bool,
    tb: bool,
) -> Vec<f32> {
    if !ta && !tb {
        // Row by row with the sums in f64, each over p in ascending order: the same
        // operations as the general loop below, in a cache-friendly order (the teacher's
        // labels for a million rows take seconds, not minutes).
        let mut c = vec![0.0f32; m * n];
        let mut row = vec![0.0f64; n];
        for i in 0..m {
            row.iter_mut().for_each(|v| *v = 0.0);
            for p in 0..k {
                let av = a[i * k + p] as f64;
                for (s, &bv) in row.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                    *s += av * bv as f64;
                }
            }
            for (cv, &s) in c[i * n..(i + 1) * n].iter_mut().zip(&row) {
                *cv = s as f32;
            }
        }
        return c;
    }
    let mut c = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0f64;
            for p in 0..k {
                let av = if ta { a[p * m + i] } else { a[i * k + p] };
                let bv = if tb { b[j * k + p] } else { b[p * n + j] };
                s += av as f64 * bv as f64;
            }
            c[i * n + j] = s as f32;
        }
    }
    c
}

fn add_bias(z: &mut [f32], b: &[f32], relu: bool) {
    for row in z.chunks_mut(b.len()) {
        for (v, bias) in row.iter_mut().zip(b) {
            *v += bias;
            if relu && *v < 0.0 {
                *v = 0.0;
            }
        }
    }
}

pub fn cpu_forward(shape: Shape, p: &[Vec<f32>], x: &[f32], rows: usize) -> CpuForward {
    let [l1, l2, l3] = shape.layers();
    let mut a1 = cpu_matmul(x, &p[0], rows, l1.1, l1.0, false, false);
    add_bias(&mut a1, &p[1], true);
    let mut a2 = cpu_matmul(&a1, &p[2], rows, l2.1, l2.0, false, false);
    add_bias(&mut a2, &p[3], true);
    let mut logits = cpu_matmul(&a2, &p[4], rows, l3.1, l3.0, false, false);
    add_bias(&mut logits, &p[5], false);
    CpuForward { a1, a2, logits }
}

/// Mean cross-entropy loss and `d loss / d logits` scaled by `1 / scale_rows`.
pub fn cpu_softmax_xent(
    logits: &[f32],
    y: &[u32],
    classes: usize,
    scale_rows: usize,
) -> (f64, Vec<f32>) {
    let mut d = vec![0.0f32; logits.len()];
    let mut loss = 0.0f64;
    for (i, row) in logits.chunks(classes).enumerate() {
        let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = row.iter().map(|v| (v - max).exp()).sum();
        for j in 0..classes {
            let p = (row[j] - max).exp() / sum;
            d[i * classes + j] = (p - (j as u32 == y[i]) as u32 as f32) / scale_rows as f32;
        }
        loss += -(((row[y[i] as usize] - max).exp() / sum) as f64).ln();
    }
    (loss, d)
}

/// Gradients of all six tensors for one batch, scaled by `1/scale_rows`; plus summed loss.
pub fn cpu_gradients(
    shape: Shape,
    p: &[Vec<f32>],
    x: &[f32],
    y: &[u32],
    scale_rows: usize,
) -> (f64, Vec<Vec<f32>>) {
    let rows = y.len();
    let [l1, l2, l3] = shape.layers();
    let f = cpu_forward(shape, p, x, rows);
    let (loss, dz3) = cpu_softmax_xent(&f.logits, y, shape.classes, scale_rows);
    let col_sum = |d: &[f32], cols: usize| -> Vec<f32> {
        let mut s = vec![0.0f32; cols];
        for row in d.chunks(cols) {
            for (a, b) in s.iter_mut().zip(row) {
                *a += b;
            }
        }
        s
    };
    let relu_back = |d: &mut [f32], a: &[f32]| {
        d.iter_mut().zip(a).for_each(|(g, &v)| {
            if v <= 0.0 {
                *g = 0.0
            }
        })
    };
    let dw3 = cpu_matmul(&f.a2, &dz3, l3.0, l3.1, rows, true, false);
    let db3 = col_sum(&dz3, l3.1);
    let mut dz2 = cpu_matmul(&dz3, &p[4], rows, l3.0, l3.1, false, true);
    relu_back(&mut dz2, &f.a2);
    let dw2 = cpu_matmul(&f.a1, &dz2, l2.0, l2.1, rows, true, false);
    let db2 = col_sum(&dz2, l2.1);
    let mut dz1 = cpu_matmul(&dz2, &p[2], rows, l2.0, l2.1, false, true);
    relu_back(&mut dz1, &f.a1);
    let dw1 = cpu_matmul(x, &dz1, l1.0, l1.1, rows, true, false);
    let db1 = col_sum(&dz1, l1.1);
    (loss, vec![dw1, db1, dw2, db2, dw3, db3])
}

/// One SGD-with-momentum step on the CPU: `v = mu·v + g; w -= lr·v`.
pub fn cpu_sgd(p: &mut [Vec<f32>], vel: &mut [Vec<f32>], g: &[Vec<f32>], lr: f32, mu: f32) {
    for ((w, v), g) in p.iter_mut().zip(vel.iter_mut()).zip(g) {
        for ((w, v), g) in w.iter_mut().zip(v.iter_mut()).zip(g) {
            *v = mu * *v + g;
            *w -= lr * *v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::kernels::{elementwise, u32_of};
    use super::*;

    const SHAPE: Shape = Shape {
        input: 32,
        hidden: 256,
        classes: 8,
    };

    #[test]
    fn flat_layout_puts_weights_first_and_biases_together() {
        let n = SHAPE.tensor_lens();
        let off = SHAPE.offsets();
        assert_eq!(off, [0, 75_776, 8192, 76_032, 73_728, 76_288]);
        assert_eq!(SHAPE.param_count(), 76_296);
        assert_eq!(SHAPE.bias_offset(), n[0] + n[2] + n[4]);
        // The bias range is b1, b2, b3 back to back, ending at the last parameter.
        assert_eq!(off[3], off[1] + n[1]);
        assert_eq!(off[5], off[3] + n[3]);
        assert_eq!(off[5] + n[5], SHAPE.param_count());
        // Every parameter belongs to exactly one tensor.
        let mut seen = vec![0u8; SHAPE.param_count()];
        for t in 0..Shape::TENSORS {
            SHAPE.range(t).for_each(|i| seen[i] += 1);
        }
        assert!(seen.iter().all(|&c| c == 1));
    }

    #[test]
    fn flatten_and_split_round_trip() {
        let shape = Shape {
            input: 3,
            hidden: 5,
            classes: 2,
        };
        let tensors: Vec<Vec<f32>> = shape
            .tensor_lens()
            .iter()
            .enumerate()
            .map(|(t, &n)| (0..n).map(|i| (t * 1000 + i) as f32).collect())
            .collect();
        let flat = shape.flatten(&tensors);
        assert_eq!(flat.len(), shape.param_count());
        assert_eq!(shape.split(&flat), tensors);
        assert_eq!(flat[shape.bias_offset()], 1000.0, "b1 starts the biases");
    }

    #[test]
    fn row_major_matmul_matches_the_general_loop_bit_for_bit() {
        let (m, n, k) = (7, 5, 9);
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) / 3.0)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 53 % 13) as f32 - 6.0) / 7.0)
            .collect();
        let fast = cpu_matmul(&a, &b, m, n, k, false, false);
        // The general loop on Bᵀ stored n×k gives the same sums in the same order.
        let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let general = cpu_matmul(&a, &bt, m, n, k, false, true);
        assert_eq!(fast, general);
    }

    #[test]
    fn flops_count_eight_products() {
        // Forward 32·256 + 256·256 + 256·8 = 75,776 MACs; weight gradients the same;
        // activation gradients of layers 3 and 2: 2,048 + 65,536. Two FLOPs a MAC.
        assert_eq!(
            SHAPE.flops_per_sample(),
            2.0 * (75_776.0 + 75_776.0 + 67_584.0)
        );
    }

    #[test]
    fn kernel_indices_are_bounded() {
        assert_eq!(u32_of("x", 5).unwrap(), 5);
        assert!(u32_of("x", i32::MAX as usize).is_ok());
        assert!(matches!(
            u32_of("x", i32::MAX as usize + 1),
            Err(gpubind::Error::InvalidArgument(_))
        ));
        let cfg = elementwise(u32::MAX);
        assert_eq!(cfg.grid_dim.0, 4096);
        assert_eq!(elementwise(0).grid_dim.0, 1);
    }
}
