//! The model of `train_mlp`: a 3-layer MLP classifier (ReLU, softmax cross-entropy) trained
//! by SGD with momentum, on the GPU (cuBLAS products + NVRTC elementwise kernels) and, for
//! checking, on the CPU. Shared by the example and `tests/gpu_train.rs`.
#![allow(dead_code)]

use gpubind::blas::{Blas, Matmul};
use gpubind::collective::{Communicator, Op};
use gpubind::{BoundDevice, BoundStream, DeviceSlice, Function, LaunchConfig, Module, Result};
use gpubind::{Device, ThreadContext};
use rand::{Rng, SeedableRng};
use std::sync::Arc;

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

// ---------------------------------------------------------------- GPU

pub const KERNELS: &str = r#"
extern "C" __global__ void bias_act(float* z, const float* b, unsigned rows, unsigned cols, int relu) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols) {
        float v = z[i] + b[i % cols];
        z[i] = (relu && v < 0.0f) ? 0.0f : v;
    }
}
// One thread per row: softmax, per-row loss, d loss / d logits scaled by `scale`.
extern "C" __global__ void softmax_xent(const float* logits, const unsigned* labels, float* dlogits,
                                        float* loss, unsigned rows, unsigned cols, float scale) {
    unsigned r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* row = logits + r * cols;
    float m = row[0];
    for (unsigned j = 1; j < cols; ++j) m = fmaxf(m, row[j]);
    float s = 0.0f;
    for (unsigned j = 0; j < cols; ++j) s += expf(row[j] - m);
    unsigned y = labels[r];
    for (unsigned j = 0; j < cols; ++j) {
        float p = expf(row[j] - m) / s;
        dlogits[r * cols + j] = (p - (j == y ? 1.0f : 0.0f)) * scale;
    }
    loss[r] = -logf(expf(row[y] - m) / s);
}
extern "C" __global__ void relu_back(float* d, const float* a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && a[i] <= 0.0f) d[i] = 0.0f;
}
extern "C" __global__ void col_sum(const float* d, float* out, unsigned rows, unsigned cols) {
    unsigned c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float s = 0.0f;
    for (unsigned r = 0; r < rows; ++r) s += d[r * cols + c];
    out[c] = s;
}
extern "C" __global__ void sgd_momentum(float* w, float* v, const float* g, unsigned n, float lr, float mu) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float vi = mu * v[i] + g[i];
        v[i] = vi;
        w[i] -= lr * vi;
    }
}
"#;

/// The compiled kernels of one device.
pub struct Kernels {
    module: Module,
}

impl Kernels {
    pub fn load(gpu: &BoundDevice<'_>) -> Result<Self> {
        Ok(Kernels {
            module: gpu.compile_and_load(KERNELS, "train_mlp.cu")?,
        })
    }
    fn f(&self, name: &str) -> Result<Function<'_>> {
        self.module.function(name)
    }
}

/// Which gradients an SGD step uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gradients {
    /// `Replica::grads`: one replica trains alone.
    Local,
    /// `Replica::reduced`: the sum over replicas, written by the all-reduce.
    Reduced,
}

/// One data-parallel replica: parameters, gradients, momentum and activations on one device.
pub struct Replica {
    pub shape: Shape,
    pub rows: usize,
    pub params: Vec<DeviceSlice<f32>>,
    pub grads: Vec<DeviceSlice<f32>>,
    /// Gradients summed over all replicas (the all-reduce's output).
    pub reduced: Vec<DeviceSlice<f32>>,
    pub vel: Vec<DeviceSlice<f32>>,
    x: DeviceSlice<f32>,
    y: DeviceSlice<u32>,
    a1: DeviceSlice<f32>,
    a2: DeviceSlice<f32>,
    logits: DeviceSlice<f32>,
    d1: DeviceSlice<f32>,
    d2: DeviceSlice<f32>,
    loss: DeviceSlice<f32>,
    pub blas: Blas,
    pub kernels: Kernels,
}

fn launch_cfg(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n as u32)
}

impl Replica {
    /// Uploads `params` and allocates buffers for shards of `rows` rows.
    pub fn new(
        gpu: &BoundDevice<'_>,
        shape: Shape,
        params: &[Vec<f32>],
        rows: usize,
    ) -> Result<Self> {
        let lens = shape.tensor_lens();
        Ok(Replica {
            shape,
            rows,
            params: params
                .iter()
                .map(|p| gpu.clone_htod(p))
                .collect::<Result<_>>()?,
            grads: lens
                .iter()
                .map(|&n| gpu.alloc_zeros(n))
                .collect::<Result<_>>()?,
            reduced: lens
                .iter()
                .map(|&n| gpu.alloc_zeros(n))
                .collect::<Result<_>>()?,
            vel: lens
                .iter()
                .map(|&n| gpu.alloc_zeros(n))
                .collect::<Result<_>>()?,
            x: gpu.alloc_zeros(rows * shape.input)?,
            y: gpu.alloc_zeros(rows)?,
            a1: gpu.alloc_zeros(rows * shape.hidden)?,
            a2: gpu.alloc_zeros(rows * shape.hidden)?,
            logits: gpu.alloc_zeros(rows * shape.classes)?,
            d1: gpu.alloc_zeros(rows * shape.hidden)?,
            d2: gpu.alloc_zeros(rows * shape.hidden)?,
            loss: gpu.alloc_zeros(rows)?,
            blas: gpu.new_blas()?,
            kernels: Kernels::load(gpu)?,
        })
    }

    /// Uploads one shard (`x`: rows×input, `y`: rows).
    pub fn load_batch(&mut self, gpu: &BoundDevice<'_>, x: &[f32], y: &[u32]) -> Result<()> {
        gpu.htod_copy(x, &mut self.x)?;
        gpu.htod_copy(y, &mut self.y)
    }

    /// Forward pass into `self.logits`.
    pub fn forward(&mut self, s: &BoundStream<'_>) -> Result<()> {
        let (rows, sh) = (self.rows, self.shape);
        let [l1, l2, l3] = sh.layers();
        let bias_act = self.kernels.f("bias_act")?;
        let (r, relu, linear) = (rows as u32, 1i32, 0i32);
        s.matmul(
            &mut self.blas,
            &Matmul::new(rows, l1.1, l1.0),
            &self.x,
            &self.params[0],
            &mut self.a1,
        )?;
        let c1 = l1.1 as u32;
        // SAFETY: (float*, const float*, unsigned, unsigned, int) matches bias_act, which
        // stays inside rows*cols elements of z and cols of b.
        unsafe {
            s.launch(&bias_act, launch_cfg(rows * l1.1))
                .arg(&mut self.a1)
                .arg(&self.params[1])
                .arg(&r)
                .arg(&c1)
                .arg(&relu)
                .launch()?
        };
        s.matmul(
            &mut self.blas,
            &Matmul::new(rows, l2.1, l2.0),
            &self.a1,
            &self.params[2],
            &mut self.a2,
        )?;
        let c2 = l2.1 as u32;
        // SAFETY: as above.
        unsafe {
            s.launch(&bias_act, launch_cfg(rows * l2.1))
                .arg(&mut self.a2)
                .arg(&self.params[3])
                .arg(&r)
                .arg(&c2)
                .arg(&relu)
                .launch()?
        };
        s.matmul(
            &mut self.blas,
            &Matmul::new(rows, l3.1, l3.0),
            &self.a2,
            &self.params[4],
            &mut self.logits,
        )?;
        let c3 = l3.1 as u32;
        // SAFETY: as above.
        unsafe {
            s.launch(&bias_act, launch_cfg(rows * l3.1))
                .arg(&mut self.logits)
                .arg(&self.params[5])
                .arg(&r)
                .arg(&c3)
                .arg(&linear)
                .launch()?
        };
        Ok(())
    }

    /// Forward + backward: gradients (scaled by `1/global_rows`) into `self.grads`,
    /// per-row losses into `self.loss`.
    pub fn forward_backward(&mut self, s: &BoundStream<'_>, global_rows: usize) -> Result<()> {
        self.forward(s)?;
        let (rows, sh) = (self.rows, self.shape);
        let [l1, l2, l3] = sh.layers();
        let (r, scale) = (rows as u32, 1.0f32 / global_rows as f32);
        let (xent, relu_back, col_sum) = (
            self.kernels.f("softmax_xent")?,
            self.kernels.f("relu_back")?,
            self.kernels.f("col_sum")?,
        );
        let classes = sh.classes as u32;
        // d2 (rows×hidden) is reused for dlogits (rows×classes ≤ rows×hidden) via a view.
        let mut dz3 = self.d2.slice_mut(..rows * sh.classes)?;
        // SAFETY: signature (const float*, const unsigned*, float*, float*, unsigned, unsigned,
        // float) matches; one thread per row, each inside its row.
        unsafe {
            s.launch(&xent, launch_cfg(rows))
                .arg(&self.logits)
                .arg(&self.y)
                .arg(&mut dz3)
                .arg(&mut self.loss)
                .arg(&r)
                .arg(&classes)
                .arg(&scale)
                .launch()?
        };
        // Layer 3: dW3 = A2ᵀ·dZ3, db3 = colsum(dZ3), dA2 = dZ3·W3ᵀ (into d1).
        s.matmul(
            &mut self.blas,
            &Matmul::new(l3.0, l3.1, rows).transpose_a(),
            &self.a2,
            &dz3,
            &mut self.grads[4],
        )?;
        // SAFETY: (const float*, float*, unsigned, unsigned): one thread per column.
        unsafe {
            s.launch(&col_sum, launch_cfg(l3.1))
                .arg(&dz3)
                .arg(&mut self.grads[5])
                .arg(&r)
                .arg(&classes)
                .launch()?
        };
        s.matmul(
            &mut self.blas,
            &Matmul::new(rows, l3.0, l3.1).transpose_b(),
            &dz3,
            &self.params[4],
            &mut self.d1,
        )?;
        drop(dz3);
        let n_hidden = (rows * sh.hidden) as u32;
        let hidden = sh.hidden as u32;
        // SAFETY: (float*, const float*, unsigned) over rows*hidden elements.
        unsafe {
            s.launch(&relu_back, launch_cfg(rows * sh.hidden))
                .arg(&mut self.d1)
                .arg(&self.a2)
                .arg(&n_hidden)
                .launch()?
        };
        // Layer 2: dW2 = A1ᵀ·dZ2, db2, dA1 = dZ2·W2ᵀ (into d2).
        s.matmul(
            &mut self.blas,
            &Matmul::new(l2.0, l2.1, rows).transpose_a(),
            &self.a1,
            &self.d1,
            &mut self.grads[2],
        )?;
        // SAFETY: as above.
        unsafe {
            s.launch(&col_sum, launch_cfg(l2.1))
                .arg(&self.d1)
                .arg(&mut self.grads[3])
                .arg(&r)
                .arg(&hidden)
                .launch()?
        };
        s.matmul(
            &mut self.blas,
            &Matmul::new(rows, l2.0, l2.1).transpose_b(),
            &self.d1,
            &self.params[2],
            &mut self.d2,
        )?;
        // SAFETY: as above.
        unsafe {
            s.launch(&relu_back, launch_cfg(rows * sh.hidden))
                .arg(&mut self.d2)
                .arg(&self.a1)
                .arg(&n_hidden)
                .launch()?
        };
        // Layer 1: dW1 = Xᵀ·dZ1, db1.
        s.matmul(
            &mut self.blas,
            &Matmul::new(l1.0, l1.1, rows).transpose_a(),
            &self.x,
            &self.d2,
            &mut self.grads[0],
        )?;
        // SAFETY: as above.
        unsafe {
            s.launch(&col_sum, launch_cfg(l1.1))
                .arg(&self.d2)
                .arg(&mut self.grads[1])
                .arg(&r)
                .arg(&hidden)
                .launch()?
        };
        Ok(())
    }

    /// SGD with momentum on every tensor, from this replica's own gradients
    /// (`Gradients::Local`, single replica) or the all-reduced ones.
    pub fn sgd(&mut self, s: &BoundStream<'_>, lr: f32, mu: f32, from: Gradients) -> Result<()> {
        let sgd = self.kernels.f("sgd_momentum")?;
        let grads = match from {
            Gradients::Local => &self.grads,
            Gradients::Reduced => &self.reduced,
        };
        for ((w, v), g) in self.params.iter_mut().zip(self.vel.iter_mut()).zip(grads) {
            let n = w.len() as u32;
            // SAFETY: (float*, float*, const float*, unsigned, float, float) over n elements
            // of three equally long tensors.
            unsafe {
                s.launch(&sgd, launch_cfg(w.len()))
                    .arg(w)
                    .arg(v)
                    .arg(g)
                    .arg(&n)
                    .arg(&lr)
                    .arg(&mu)
                    .launch()?
            };
        }
        Ok(())
    }

    /// Sum of the per-row losses of the last `forward_backward`.
    pub fn loss_sum(&self, gpu: &BoundDevice<'_>) -> Result<f64> {
        Ok(gpu.dtoh(&self.loss)?.iter().map(|&v| v as f64).sum())
    }

    /// Logits of the last forward pass.
    pub fn logits(&self, gpu: &BoundDevice<'_>) -> Result<Vec<f32>> {
        gpu.dtoh(&self.logits)
    }

    /// Parameters back on the host.
    pub fn download(
        &self,
        gpu: &BoundDevice<'_>,
        which: &[DeviceSlice<f32>],
    ) -> Result<Vec<Vec<f32>>> {
        which.iter().map(|t| gpu.dtoh(t)).collect()
    }
}

/// One data-parallel step over every rank of `comm`: rank `r` (on `devices[r]`) trains on
/// rows `r·shard .. (r+1)·shard` of the batch `x`/`y`; gradients are summed over the ranks
/// with one group all-reduce (each is pre-scaled by 1/batch, so the sum is the mean) and
/// every replica takes the same SGD step. Returns the batch's summed loss.
#[allow(clippy::too_many_arguments)]
pub fn data_parallel_step(
    ctx: &mut ThreadContext,
    comm: &Communicator,
    devices: &[Arc<Device>],
    replicas: &mut [Replica],
    x: &[f32],
    y: &[u32],
    lr: f32,
    mu: f32,
) -> Result<f64> {
    let batch = y.len();
    let shard = batch / replicas.len();
    let input = replicas[0].shape.input;
    // Forward + backward of every rank's shard, each on its device's communicator stream.
    for (r, (dev, rep)) in devices.iter().zip(replicas.iter_mut()).enumerate() {
        let gpu = ctx.bind(dev)?;
        let rows = r * shard;
        rep.load_batch(
            &gpu,
            &x[rows * input..(rows + shard) * input],
            &y[rows..rows + shard],
        )?;
        let stream = comm.stream(r).expect("one stream per rank");
        rep.forward_backward(&gpu.on(stream)?, batch)?;
    }
    ctx.group(comm, |g| {
        for (r, rep) in replicas.iter_mut().enumerate() {
            for (local, sum) in rep.grads.iter().zip(rep.reduced.iter_mut()) {
                g.all_reduce(r, local, sum, Op::Sum)?;
            }
        }
        Ok(())
    })?;
    for (r, (dev, rep)) in devices.iter().zip(replicas.iter_mut()).enumerate() {
        let gpu = ctx.bind(dev)?;
        let stream = comm.stream(r).expect("one stream per rank");
        rep.sgd(&gpu.on(stream)?, lr, mu, Gradients::Reduced)?;
    }
    comm.synchronize(ctx)?;
    let mut loss = 0.0;
    for (dev, rep) in devices.iter().zip(replicas.iter()) {
        loss += rep.loss_sum(&ctx.bind(dev)?)?;
    }
    Ok(loss)
}
