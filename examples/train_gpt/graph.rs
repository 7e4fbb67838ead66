//! `--graph`: the whole training step — forward, backward, gradient clipping and AdamW —
//! captured once into a CUDA graph ([`Gpt::capture`]) and launched every step, and the
//! validation forward pass likewise.
//!
//! The graph reads its inputs (tokens, targets, the schedule's lr and bias corrections)
//! from the model's device buffers, which it holds borrowed (shared) for its lifetime.
//! `htod_copy` needs `&mut` of its destination, so a step's inputs are uploaded into
//! staging buffers ([`Staging`]) and copied into the graph's input buffers on the stream
//! through shared borrows (`Issue::dtod`), ordered before the graph's launch by gpubind's
//! access tracking.
//!
//! The captured step is the eager one: both issue the parts of `step.rs`, which
//! `pass.rs` writes once for a stream and a capture alike; `--check-graph` runs both and
//! requires the same losses bit for bit.

use super::step::{self, Captured};
use super::{Act, Gpt};
use crate::model::ParamLayout;
use crate::optim::{AdamW, SCHED_LEN};
use gpubind::Result;
use gpubind::{BoundDevice, BoundStream, DeviceRepr, DeviceSlice, DeviceView, Graph, Issue};

/// Views of the flat buffers per tensor, by name: parameters, gradients, and each layer
/// norm's weight-and-bias gradient pair. A capture makes them first, so that they live as
/// long as its graph; an eager part makes them for itself.
pub struct Views<'a, T: Act> {
    lay: &'a ParamLayout,
    /// The weights the products and kernels read.
    p: Vec<DeviceView<'a, T>>,
    g: Vec<DeviceView<'a, T>>,
    /// Indexed like `p`: `Some` at a layer norm's weight, covering weight and bias.
    g_pair: Vec<Option<DeviceView<'a, T>>>,
}

impl<'a, T: Act> Views<'a, T> {
    /// The weight `name`.
    pub fn w(&self, name: &str) -> &DeviceView<'a, T> {
        &self.p[self.lay.index(name)]
    }
    /// Block `l`'s weight `suffix`.
    pub fn wl(&self, l: usize, suffix: &str) -> &DeviceView<'a, T> {
        self.w(&format!("h.{l}.{suffix}"))
    }
    /// The gradient of `name`.
    pub fn g(&self, name: &str) -> &DeviceView<'a, T> {
        &self.g[self.lay.index(name)]
    }
    /// The gradient of block `l`'s `suffix`.
    pub fn gl(&self, l: usize, suffix: &str) -> &DeviceView<'a, T> {
        self.g(&format!("h.{l}.{suffix}"))
    }
    /// The gradients of layer norm weight `name` and its bias, which follows it.
    ///
    /// # Panics
    ///
    /// If `name` is not a layer norm's weight.
    pub fn g_pair(&self, name: &str) -> &DeviceView<'a, T> {
        self.g_pair[self.lay.index(name)]
            .as_ref()
            .expect("a layer-norm weight")
    }
    /// [`g_pair`](Self::g_pair) of block `l`'s `suffix`.
    pub fn g_pair_l(&self, l: usize, suffix: &str) -> &DeviceView<'a, T> {
        self.g_pair(&format!("h.{l}.{suffix}"))
    }
}

/// Device buffers the host writes a step's inputs into (see the module docs).
pub struct Staging {
    tokens: DeviceSlice<u32>,
    targets: DeviceSlice<u32>,
    sched: DeviceSlice<f32>,
}

impl Staging {
    pub fn new<T: Act>(gpu: &BoundDevice<'_>, model: &Gpt<T>) -> Result<Staging> {
        Ok(Staging {
            tokens: gpu.alloc_zeros(model.tokens.len())?,
            targets: gpu.alloc_zeros(model.targets.len())?,
            sched: gpu.alloc_zeros(SCHED_LEN)?,
        })
    }
}

impl<T: Act> Gpt<T> {
    /// The per-tensor views a capture (or an eager part) needs.
    pub fn views(&self) -> Result<Views<'_, T>> {
        fn each<'x, E: DeviceRepr>(
            lay: &ParamLayout,
            buf: &'x DeviceSlice<E>,
        ) -> Result<Vec<DeviceView<'x, E>>> {
            lay.params.iter().map(|p| buf.slice(p.range())).collect()
        }
        let lay = &self.layout;
        let mut g_pair = Vec::with_capacity(lay.params.len());
        for (i, p) in lay.params.iter().enumerate() {
            let is_ln = p.name.contains("ln_") && p.name.ends_with(".weight");
            g_pair.push(if is_ln {
                let bias = &lay.params[i + 1];
                Some(self.grads.slice(p.offset..bias.range().end)?)
            } else {
                None
            });
        }
        Ok(Views {
            lay,
            p: each(lay, &self.weights)?,
            g: each(lay, &self.grads)?,
            g_pair,
        })
    }

    /// Captures a training step (`train`: forward, backward, clip and AdamW) or a
    /// validation forward pass: [`step::train_step`] and [`step::eval_step`], the eager
    /// steps' description. The graph borrows the model and `views`.
    pub fn capture<'a>(
        &'a self,
        gpu: &BoundDevice<'_>,
        views: &'a Views<'a, T>,
        hp: AdamW,
        train: bool,
    ) -> Result<Graph<'a>> {
        // The graph keeps the handle's workspace: this handle may go when the capture ends.
        let blas = gpu.new_blas()?;
        // Timed algorithms are the device's: the graph runs those eager steps ran.
        blas.set_algo_selection(self.fusion.gemm_algos);
        gpu.capture(|cap| {
            let mut x = Captured {
                cap,
                blas: &blas,
                model: self,
                views,
            };
            if train {
                step::train_step(&mut x, hp, step::no_hook)
            } else {
                step::eval_step(&mut x)
            }
        })
    }

    /// Moves a step's inputs into the buffers the graphs read (`sched`: the schedule
    /// values, for a training step).
    pub fn feed(
        &self,
        gpu: &BoundDevice<'_>,
        s: &mut BoundStream<'_>,
        st: &mut Staging,
        (x, y): (&[u32], &[u32]),
        sched: Option<&[f32; SCHED_LEN]>,
    ) -> Result<()> {
        gpu.htod_copy(x, &mut st.tokens)?;
        gpu.htod_copy(y, &mut st.targets)?;
        s.dtod(&st.tokens, &self.tokens)?;
        s.dtod(&st.targets, &self.targets)?;
        if let Some(v) = sched {
            gpu.htod_copy(v, &mut st.sched)?;
            s.dtod(&st.sched, &self.sched)?;
        }
        Ok(())
    }
}
