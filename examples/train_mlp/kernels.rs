//! The NVRTC kernels of `train_mlp` and thin launch helpers that check every length a
//! kernel relies on.

use gpubind::{BoundDevice, BoundStream, DeviceMemory, DeviceMemoryMut, DeviceSlice, DeviceView};
use gpubind::{Error, Function, LaunchConfig, Module, Result, WritableArg};

/// The NVRTC kernels. Every reduction has a fixed order (no atomics), so a step's results
/// depend only on its inputs and on the shard size: the same seed gives the same bits on
/// every run.
pub const KERNELS: &str = r#"
// Every index fits in 32 bits: the host checks rows × widest layer and the partial sums.
__device__ __forceinline__ unsigned lo(unsigned a, unsigned b) { return a < b ? a : b; }

// z[r][c] += b[c], then ReLU if `relu`; grid-stride over rows*cols (< 2^32, checked by the host).
extern "C" __global__ void bias_act(float* z, const float* b, unsigned rows, unsigned cols, int relu) {
    unsigned n = rows * cols;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = z[i] + b[i % cols];
        z[i] = (relu && v < 0.0f) ? 0.0f : v;
    }
}

// Softmax cross-entropy, `lpr` lanes per row (a power of two, cols <= lpr <= 32), 256 threads
// a block. Block g handles the g-th of gridDim.x equal chunks of the rows; it writes
// dlogits = (softmax - onehot) * scale, and into row g of `partial` (row stride `pstride`):
// at column poff + j the chunk's sum of dlogits[.][j], at column poff + cols its summed loss.
extern "C" __global__ void softmax_xent(const float* logits, const unsigned* labels, float* dlogits,
                                        float* partial, unsigned rows, unsigned cols, unsigned lpr,
                                        float scale, unsigned pstride, unsigned poff) {
    __shared__ float sd[256];
    __shared__ float sl[256];
    unsigned t = threadIdx.x, lane = t % lpr, group = t / lpr, rpb = 256 / lpr;
    unsigned chunk = (rows + gridDim.x - 1) / gridDim.x;
    unsigned r0 = lo(rows, blockIdx.x * chunk), r1 = lo(rows, r0 + chunk);
    float dsum = 0.0f, lsum = 0.0f;
    // Every thread runs the same number of iterations, so the shuffles see full warps.
    for (unsigned base = r0; base < r1; base += rpb) {
        unsigned r = base + group;
        bool ok = r < r1, has = ok && lane < cols;
        float v = has ? logits[r * cols + lane] : __int_as_float(0xff800000u);
        float m = v;
        for (unsigned o = lpr / 2; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        float e = has ? expf(v - m) : 0.0f;
        float s = e;
        for (unsigned o = lpr / 2; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
        unsigned y = ok ? labels[r] : 0xffffffffu;
        if (has) {
            float g = (e / s - (lane == y ? 1.0f : 0.0f)) * scale;
            dlogits[r * cols + lane] = g;
            dsum += g;
            if (lane == y) lsum += logf(s) - (v - m);
        }
    }
    sd[t] = dsum;
    sl[t] = lsum;
    __syncthreads();
    if (t < cols) {
        float acc = 0.0f;
        for (unsigned k = 0; k < rpb; ++k) acc += sd[k * lpr + t];
        partial[blockIdx.x * pstride + poff + t] = acc;
    } else if (t == cols) {
        float acc = 0.0f;
        for (unsigned k = 0; k < 256; ++k) acc += sl[k];
        partial[blockIdx.x * pstride + poff + cols] = acc;
    }
}

// ReLU backward in place (d = 0 where a <= 0) fused with the column sums of the result:
// block (32, 8) covers 32 columns; blockIdx.y is the chunk of rows (gridDim.y equal chunks),
// whose column sums go to partial[blockIdx.y * pstride + poff + c].
extern "C" __global__ void relu_back_colsum(float* d, const float* a, float* partial, unsigned rows,
                                            unsigned cols, unsigned pstride, unsigned poff) {
    __shared__ float sh[8][33];
    unsigned c = blockIdx.x * 32 + threadIdx.x;
    unsigned chunk = (rows + gridDim.y - 1) / gridDim.y;
    unsigned r0 = lo(rows, blockIdx.y * chunk), r1 = lo(rows, r0 + chunk);
    float s = 0.0f;
    if (c < cols) {
        for (unsigned r = r0 + threadIdx.y; r < r1; r += 8) {
            unsigned i = r * cols + c;
            float v = a[i] > 0.0f ? d[i] : 0.0f;
            d[i] = v;
            s += v;
        }
    }
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float acc = 0.0f;
        for (unsigned k = 0; k < 8; ++k) acc += sh[k][threadIdx.x];
        partial[blockIdx.y * pstride + poff + c] = acc;
    }
}

// Sums the `parts` rows of `partial` (width columns): column c < width - 1 into out[c] (the
// bias gradients), the last column (the loss) into loss_out[slot]. One block of 128 threads
// per column, a fixed-order tree.
extern "C" __global__ void col_finish(const float* partial, float* out, float* loss_out,
                                      unsigned parts, unsigned width, unsigned slot) {
    __shared__ float sh[128];
    unsigned c = blockIdx.x, t = threadIdx.x;
    float s = 0.0f;
    for (unsigned p = t; p < parts; p += 128) s += partial[p * width + c];
    sh[t] = s;
    __syncthreads();
    for (unsigned o = 64; o > 0; o /= 2) {
        if (t < o) sh[t] += sh[t + o];
        __syncthreads();
    }
    if (t == 0) {
        if (c + 1 < width) out[c] = sh[0];
        else loss_out[slot] = sh[0];
    }
}

// v = mu*v + g; w -= lr*v over all n parameters (grid-stride).
extern "C" __global__ void sgd_momentum(float* w, float* v, const float* g, unsigned n, float lr, float mu) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float vi = mu * v[i] + g[i];
        v[i] = vi;
        w[i] -= lr * vi;
    }
}
"#;

/// Threads a block of the elementwise kernels.
const BLOCK: u32 = 256;

/// The compiled kernels of one device. Look the functions up once with [`Kernels::fns`]
/// and pass them to every step: a lookup costs several driver calls.
pub struct Kernels {
    module: Module,
}

/// The looked-up kernels of one device.
pub struct Fns<'m> {
    pub(crate) bias_act: Function<'m>,
    pub(crate) softmax_xent: Function<'m>,
    pub(crate) relu_back_colsum: Function<'m>,
    pub(crate) col_finish: Function<'m>,
    pub(crate) sgd_momentum: Function<'m>,
}

impl Kernels {
    pub fn load(gpu: &BoundDevice<'_>) -> Result<Self> {
        Ok(Kernels {
            module: gpu.compile_and_load(KERNELS, "train_mlp.cu")?,
        })
    }
    pub fn fns(&self) -> Result<Fns<'_>> {
        let f = |name| self.module.function(name);
        Ok(Fns {
            bias_act: f("bias_act")?,
            softmax_xent: f("softmax_xent")?,
            relu_back_colsum: f("relu_back_colsum")?,
            col_finish: f("col_finish")?,
            sgd_momentum: f("sgd_momentum")?,
        })
    }
}

/// `v` as the kernels' 32-bit index type, with headroom for grid-stride steps (≤ 2^31).
pub(crate) fn u32_of(what: &str, v: usize) -> Result<u32> {
    i32::try_from(v)
        .map(|v| v as u32)
        .map_err(|_| Error::InvalidArgument(format!("train_mlp: {what} = {v} exceeds 2^31 - 1")))
}

/// Grid-stride launch over `n` elements: enough blocks to fill the GPU, not one per element.
pub(crate) fn elementwise(n: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(BLOCK).clamp(1, 4096), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `softmax_xent`'s launch: one block of 256 threads per chunk of rows (`parts` chunks).
pub(crate) fn xent_config(parts: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (parts, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `col_finish`'s launch: one block of 128 threads per column of the partial sums.
pub(crate) fn finish_config(width: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (width, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn expect_elems(what: &str, len: usize, want: usize) -> Result<()> {
    if len == want {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "train_mlp: {what} has {len} elements, the kernel needs {want}"
        )))
    }
}

/// `z += b` per row, then ReLU if `relu`: the launch and its scalar arguments, once
/// the buffers' lengths were checked (the kernel's bounds follow from them).
pub(crate) struct BiasAct {
    pub(crate) cfg: LaunchConfig,
    pub(crate) rows: u32,
    pub(crate) cols: u32,
    pub(crate) relu: i32,
}

impl BiasAct {
    pub(crate) fn new(z: usize, b: usize, rows: u32, cols: u32, relu: bool) -> Result<Self> {
        expect_elems("bias_act z", z, rows as usize * cols as usize)?;
        expect_elems("bias_act b", b, cols as usize)?;
        Ok(BiasAct {
            cfg: elementwise(rows * cols),
            rows,
            cols,
            relu: i32::from(relu),
        })
    }
}

/// `z += b` per row, then ReLU if `relu`.
pub(crate) fn bias_act(
    s: &BoundStream<'_>,
    f: &Fns<'_>,
    z: &mut DeviceSlice<f32>,
    b: &DeviceView<'_, f32>,
    rows: u32,
    cols: u32,
    relu: bool,
) -> Result<()> {
    let k = BiasAct::new(z.len(), b.len(), rows, cols, relu)?;
    // SAFETY: (float*, const float*, unsigned, unsigned, int) matches bias_act, which
    // stays inside rows·cols elements of z and cols of b (their lengths, checked by
    // BiasAct::new).
    unsafe {
        s.launch(&f.bias_act, k.cfg)
            .arg(z)
            .arg(b)
            .arg(&k.rows)
            .arg(&k.cols)
            .arg(&k.relu)
            .launch()
    }
}

/// `d = 0` where `a <= 0`, and the column sums of the result per chunk of rows into
/// columns `poff..poff+cols` of `partial` (row stride `pstride`): the launch and its
/// scalars, once the lengths were checked.
pub(crate) struct ReluBack {
    pub(crate) cfg: LaunchConfig,
    pub(crate) scalars: [u32; 4],
}

impl ReluBack {
    /// `lens`: of d, a and partial.
    pub(crate) fn new(
        lens: [usize; 3],
        rows: u32,
        cols: u32,
        pstride: u32,
        poff: u32,
        parts: u32,
    ) -> Result<Self> {
        let n = rows as usize * cols as usize;
        expect_elems("relu_back_colsum d", lens[0], n)?;
        expect_elems("relu_back_colsum a", lens[1], n)?;
        expect_elems(
            "relu_back_colsum partial",
            lens[2],
            parts as usize * pstride as usize,
        )?;
        if poff as usize + cols as usize > pstride as usize {
            return Err(Error::InvalidArgument(format!(
                "train_mlp: partial columns {poff}+{cols} exceed the stride {pstride}"
            )));
        }
        Ok(ReluBack {
            cfg: LaunchConfig {
                grid_dim: (cols.div_ceil(32), parts, 1),
                block_dim: (32, 8, 1),
                shared_mem_bytes: 0,
            },
            scalars: [rows, cols, pstride, poff],
        })
    }
}

/// [`ReluBack`] on a stream.
#[allow(clippy::too_many_arguments)]
pub(crate) fn relu_back_colsum(
    s: &BoundStream<'_>,
    f: &Fns<'_>,
    d: &mut (impl DeviceMemoryMut<f32> + WritableArg),
    a: &DeviceSlice<f32>,
    partial: &mut DeviceSlice<f32>,
    rows: u32,
    cols: u32,
    pstride: u32,
    poff: u32,
    parts: u32,
) -> Result<()> {
    let k = ReluBack::new(
        [d.len(), a.len(), partial.len()],
        rows,
        cols,
        pstride,
        poff,
        parts,
    )?;
    let [rows, cols, pstride, poff] = &k.scalars;
    // SAFETY: (float*, const float*, float*, unsigned ×4) matches relu_back_colsum. It
    // touches rows·cols elements of d and a (their lengths, checked by ReluBack::new)
    // and writes partial rows < parts (gridDim.y) at columns poff..poff+cols ≤ pstride,
    // inside parts·pstride elements (checked too).
    unsafe {
        s.launch(&f.relu_back_colsum, k.cfg)
            .arg(d)
            .arg(a)
            .arg(partial)
            .arg(rows)
            .arg(cols)
            .arg(pstride)
            .arg(poff)
            .launch()
    }
}
