//! `train_mlp --graph`: the whole data-parallel step — batch upload, forward, backward,
//! all-reduce and SGD of every rank — captured once per batch into a CUDA graph and
//! launched once per step. The kernels, products and their order are those of the eager
//! step (`step::enqueue_step`), so both give bit-identical results.
//!
//! What the capture needs from the types:
//! * Everything is borrowed **shared** for the graphs' lifetime ([`StepViews`] holds the
//!   parts of buffers the step uses: the six parameter tensors, the gradient ranges the
//!   products write, the overlapping prefixes of the scratch buffer). A graph may write
//!   through a shared borrow; every other use of the buffers is ordered against each
//!   launch by gpubind's claims.
//! * One graph per batch: the upload is a captured copy from that batch's page-locked
//!   memory (`Capture::copy_from_host`), and the loss goes to that batch's slot, so the
//!   graphs differ only in those two nodes.
//! * The all-reduce is captured too, which gpubind supports for communicators whose ranks
//!   are all on one device (own kernels); for ranks on several devices, `Capture::all_reduce`
//!   returns [`Error::NotCapturable`] (and `main` refuses `--graph` before capturing).

use super::kernels::{BiasAct, Fns, ReluBack, elementwise, finish_config, xent_config};
use super::replica::{PinnedBatch, Replica};
use gpubind::blas::{Blas, Enqueue, Matmul};
use gpubind::collective::{Communicator, Op};
use gpubind::{BoundDevice, Capture, DeviceMemory, DeviceView, Error, GraphExec, Result};
use std::sync::Arc;

/// The parts of one replica's buffers that a captured step reads or writes, made once
/// and borrowed by every graph.
pub struct StepViews<'r> {
    rep: &'r Replica,
    /// W1, b1, W2, b2, W3, b3 of the parameters.
    w: [DeviceView<'r, f32>; 6],
    /// The gradient ranges of W1, W2, W3 (written by products) and of the three biases
    /// (written by `col_finish`).
    gw: [DeviceView<'r, f32>; 3],
    gbias: DeviceView<'r, f32>,
    /// `d2`'s prefixes: dlogits (rows × classes), then dZ1 (rows × hidden).
    dz3: DeviceView<'r, f32>,
    dz1: DeviceView<'r, f32>,
}

impl<'r> StepViews<'r> {
    pub fn new(rep: &'r Replica) -> Result<Self> {
        let sh = rep.shape;
        let p = |t: usize| rep.params.slice(sh.range(t));
        let g = |t: usize| rep.grads.slice(sh.range(t));
        Ok(StepViews {
            rep,
            w: [p(0)?, p(1)?, p(2)?, p(3)?, p(4)?, p(5)?],
            gw: [g(0)?, g(2)?, g(4)?],
            gbias: rep.grads.slice(sh.bias_offset()..)?,
            dz3: rep.d2.slice(..rep.rows * sh.classes)?,
            dz1: rep.d2.slice(..rep.rows * sh.hidden)?,
        })
    }
}

/// What every step's graph shares: the ranks, their kernels and the optimiser settings.
pub struct StepPlan<'a> {
    pub comm: &'a Communicator,
    pub views: &'a [StepViews<'a>],
    pub fns: &'a [Fns<'a>],
    pub global_batch: usize,
    pub lr: f32,
    pub mu: f32,
}

/// Captures and instantiates one graph per batch (`batches[step][rank]`): graph `k`
/// uploads batch `k`, runs the step and writes its loss into slot `k`. `blas` serves
/// every captured product (the graphs keep its workspace).
pub fn capture_steps<'a>(
    gpu: &BoundDevice<'_>,
    blas: &Blas,
    plan: &StepPlan<'a>,
    batches: &'a [Vec<PinnedBatch>],
) -> Result<Vec<GraphExec<'a>>> {
    let ranks = plan.views.len();
    if plan.comm.len() != ranks || plan.fns.len() != ranks {
        return Err(Error::InvalidArgument(format!(
            "train_mlp --graph: {} ranks but {ranks} replicas, {} kernel sets",
            plan.comm.len(),
            plan.fns.len()
        )));
    }
    if let Some(v) = plan
        .views
        .iter()
        .find(|v| !Arc::ptr_eq(v.rep.params.device(), gpu.device()))
    {
        return Err(Error::InvalidArgument(format!(
            "train_mlp --graph: a replica on device {} in a capture on device {}",
            v.rep.params.device().ordinal(),
            gpu.device().ordinal()
        )));
    }
    batches
        .iter()
        .enumerate()
        .map(|(slot, shards)| {
            if shards.len() != ranks {
                return Err(Error::InvalidArgument(format!(
                    "train_mlp --graph: step {slot} has {} shards for {ranks} ranks",
                    shards.len()
                )));
            }
            let graph = gpu.capture(|c| capture_step(c, blas, plan, shards, slot))?;
            graph.instantiate()
        })
        .collect()
}

/// One step of every rank into the capture `c`.
fn capture_step<'a>(
    c: &mut Capture<'_, 'a>,
    blas: &Blas,
    plan: &StepPlan<'a>,
    shards: &'a [PinnedBatch],
    slot: usize,
) -> Result<()> {
    for ((v, f), batch) in plan.views.iter().zip(plan.fns).zip(shards) {
        c.copy_from_host(&batch.x, &v.rep.x)?;
        c.copy_from_host(&batch.y, &v.rep.y)?;
        forward(c, blas, v, f)?;
        backward(c, blas, v, f, plan.global_batch, slot)?;
    }
    let grads: Vec<_> = plan.views.iter().map(|v| &v.rep.grads).collect();
    let reduced: Vec<_> = plan.views.iter().map(|v| &v.rep.reduced).collect();
    c.all_reduce(plan.comm, &grads, &reduced, Op::Sum)?;
    for (v, f) in plan.views.iter().zip(plan.fns) {
        let rep = v.rep;
        let n = rep.params.len() as u32;
        // SAFETY: (float*, float*, const float*, unsigned, float, float) matches
        // sgd_momentum, which stays inside n elements of three tensors of exactly n
        // elements (params, vel and reduced are allocated with the parameter count).
        unsafe {
            c.launch(&f.sgd_momentum, elementwise(n))
                .arg_written(&rep.params)
                .arg_written(&rep.vel)
                .arg(&rep.reduced)
                .value(n)
                .value(plan.lr)
                .value(plan.mu)
                .launch()?
        };
    }
    Ok(())
}

/// `z += b` (and ReLU) into the capture.
fn bias_act<'a>(
    c: &mut Capture<'_, 'a>,
    f: &'a Fns<'a>,
    z: &'a gpubind::DeviceSlice<f32>,
    b: &'a DeviceView<'a, f32>,
    (rows, cols): (usize, usize),
    relu: bool,
) -> Result<()> {
    let k = BiasAct::new(z.len(), b.len(), rows as u32, cols as u32, relu)?;
    // SAFETY: as in `kernels::bias_act`: the signature matches and the lengths were
    // checked by BiasAct::new.
    unsafe {
        c.launch(&f.bias_act, k.cfg)
            .arg_written(z)
            .arg(b)
            .value(k.rows)
            .value(k.cols)
            .value(k.relu)
            .launch()
    }
}

/// The forward pass (as `Replica::forward`) into the capture.
fn forward<'a>(
    c: &mut Capture<'_, 'a>,
    blas: &Blas,
    v: &'a StepViews<'a>,
    f: &'a Fns<'a>,
) -> Result<()> {
    let (rep, rows) = (v.rep, v.rep.rows);
    let [l1, l2, l3] = rep.shape.layers();
    c.matmul(
        blas,
        &Matmul::new(rows, l1.1, l1.0),
        &rep.x,
        &v.w[0],
        &rep.a1,
    )?;
    bias_act(c, f, &rep.a1, &v.w[1], (rows, l1.1), true)?;
    c.matmul(
        blas,
        &Matmul::new(rows, l2.1, l2.0),
        &rep.a1,
        &v.w[2],
        &rep.a2,
    )?;
    bias_act(c, f, &rep.a2, &v.w[3], (rows, l2.1), true)?;
    c.matmul(
        blas,
        &Matmul::new(rows, l3.1, l3.0),
        &rep.a2,
        &v.w[4],
        &rep.logits,
    )?;
    bias_act(c, f, &rep.logits, &v.w[5], (rows, l3.1), false)
}

/// The backward pass (as `Replica::forward_backward_slot` after its forward) into the
/// capture, with the loss into slot `slot`.
fn backward<'a>(
    c: &mut Capture<'_, 'a>,
    blas: &Blas,
    v: &'a StepViews<'a>,
    f: &'a Fns<'a>,
    global_rows: usize,
    slot: usize,
) -> Result<()> {
    let rep = v.rep;
    if global_rows == 0 || slot >= rep.losses.len() {
        return Err(Error::InvalidArgument(format!(
            "train_mlp --graph: global batch {global_rows}, loss slot {slot} of {}",
            rep.losses.len()
        )));
    }
    let (rows, sh) = (rep.rows, rep.shape);
    let [l1, l2, l3] = sh.layers();
    let (h, cl) = (sh.hidden, sh.classes);
    let width = Replica::width(sh) as u32;
    let (r, parts) = (rows as u32, rep.parts as u32);
    // SAFETY: the arguments of softmax_xent as in `Replica::forward_backward_slot`
    // (same buffers, same bounds: dz3 is the rows·classes prefix of d2 it uses there).
    unsafe {
        c.launch(&f.softmax_xent, xent_config(parts))
            .arg(&rep.logits)
            .arg(&rep.y)
            .arg_written(&v.dz3)
            .arg_written(&rep.partial)
            .value(r)
            .value(cl as u32)
            .value((cl as u32).next_power_of_two())
            .value(1.0f32 / global_rows as f32)
            .value(width)
            .value((2 * h) as u32)
            .launch()?
    };
    c.matmul(
        blas,
        &Matmul::new(l3.0, l3.1, rows).transpose_a(),
        &rep.a2,
        &v.dz3,
        &v.gw[2],
    )?;
    c.matmul(
        blas,
        &Matmul::new(rows, l3.0, l3.1).transpose_b(),
        &v.dz3,
        &v.w[4],
        &rep.d1,
    )?;
    relu_back(c, f, (&rep.d1, &rep.a2), v, h, h)?;
    c.matmul(
        blas,
        &Matmul::new(l2.0, l2.1, rows).transpose_a(),
        &rep.a1,
        &rep.d1,
        &v.gw[1],
    )?;
    c.matmul(
        blas,
        &Matmul::new(rows, l2.0, l2.1).transpose_b(),
        &rep.d1,
        &v.w[2],
        &v.dz1,
    )?;
    relu_back(c, f, (&v.dz1, &rep.a1), v, h, 0)?;
    c.matmul(
        blas,
        &Matmul::new(l1.0, l1.1, rows).transpose_a(),
        &rep.x,
        &v.dz1,
        &v.gw[0],
    )?;
    // SAFETY: col_finish's arguments as in `Replica::forward_backward_slot`: it reads
    // parts·width elements of partial, writes the bias range (width - 1 elements) and
    // loss slot `slot` < the slots' length (checked above) of the page-locked losses,
    // which the host reads only through a copy that waits for the launches.
    unsafe {
        c.launch(&f.col_finish, finish_config(width))
            .arg(&rep.partial)
            .arg_written(&v.gbias)
            .arg_written(&rep.losses)
            .value(parts)
            .value(width)
            .value(slot as u32)
            .launch()
    }
}

/// `relu_back_colsum` of `(d, a)` into partial-sum columns `poff..poff + cols`.
fn relu_back<'a, D: DeviceMemory<f32> + gpubind::WritableArg>(
    c: &mut Capture<'_, 'a>,
    f: &'a Fns<'a>,
    (d, a): (&'a D, &'a gpubind::DeviceSlice<f32>),
    v: &'a StepViews<'a>,
    cols: usize,
    poff: usize,
) -> Result<()> {
    let rep = v.rep;
    let width = Replica::width(rep.shape) as u32;
    let k = ReluBack::new(
        [d.len(), a.len(), rep.partial.len()],
        rep.rows as u32,
        cols as u32,
        width,
        poff as u32,
        rep.parts as u32,
    )?;
    let [rows, cols, pstride, poff] = k.scalars;
    // SAFETY: as in `kernels::relu_back_colsum`: the signature matches and the bounds
    // were checked by ReluBack::new.
    unsafe {
        c.launch(&f.relu_back_colsum, k.cfg)
            .arg_written(d)
            .arg(a)
            .arg_written(&rep.partial)
            .value(rows)
            .value(cols)
            .value(pstride)
            .value(poff)
            .launch()
    }
}

/// Launches every step's graph on `stream`, in order, then waits once and returns each
/// step's loss summed over the ranks (reading a replica's losses waits for the launches
/// that write them).
pub fn launch_steps(
    gpu: &BoundDevice<'_>,
    stream: &gpubind::Stream,
    graphs: &[GraphExec<'_>],
    views: &[StepViews<'_>],
) -> Result<Vec<f64>> {
    let on = gpu.on(stream)?;
    for g in graphs {
        g.launch(&on)?;
    }
    let mut total = vec![0.0f64; graphs.len()];
    for v in views {
        let losses = v.rep.losses(gpu)?;
        for (t, l) in total.iter_mut().zip(&losses) {
            *t += *l as f64;
        }
    }
    Ok(total)
}
