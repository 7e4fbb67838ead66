//! The training step — forward pass and loss, backward pass, the gradient buckets' hook
//! (data parallelism's all-reduce), clipping and AdamW — written once ([`train_step`],
//! [`eval_step`]) and issued eagerly on a stream ([`Eager`]), into a graph capture
//! ([`Captured`]) or on every rank of `dp.rs` (its `Replicas`).
//!
//! A step is a sequence of [`Part`]s, one per gradient bucket (so that data parallelism
//! can all-reduce a bucket while the next part runs, and `dp.rs` can issue each part on
//! every rank in turn); `Gpt::issue` (`pass.rs`) issues one, generic over gpubind's
//! [`Enqueue`](gpubind::blas::Enqueue) (products) and the [`Issue`](gpubind::Issue) it
//! extends (memsets, copies and kernels), both implemented by a `BoundStream` and a
//! `Capture`. A part borrows the model shared, its cuBLAS handle included: in a capture
//! for the graph's lifetime, eagerly for the issuer's.

use super::graph::Views;
use super::{Act, Gpt};
use crate::optim::AdamW;
use gpubind::blas::Blas;
use gpubind::{BoundStream, Capture, Result};

/// One part of a step. The backward pass's parts finish the gradient buckets of
/// `dp::bucket_ranges` in its order: the head's ([`Head`](Part::Head)), each block's from
/// the last, the embeddings'.
#[derive(Debug, Clone, Copy)]
pub enum Part {
    /// The forward pass: logits, and the loss against the targets (with `grad`, the
    /// logits' gradient too, scaled by `grad_scale`).
    Forward { grad: bool },
    /// The tied head's products (the `wte` gradient and the final layer norm's output
    /// gradient), then the final layer norm's backward pass into the zeroed `dres`.
    Head,
    /// Block `l`'s backward pass: its gradients, and `dres` becomes its input's.
    Block(usize),
    /// The embeddings' gradients.
    Embed,
    /// The gradient-norm clip and AdamW, with the schedule values in `sched`.
    Update(AdamW),
}

/// Issues the parts of a step for one model ([`Eager`], [`Captured`]) or several
/// (`dp.rs`).
pub trait Issuer {
    /// The model's blocks.
    fn layers(&self) -> usize;
    /// Issues `part`.
    fn issue(&mut self, part: Part) -> Result<()>;
}

/// A training step: forward, backward, clip and AdamW (`hp`); `bucket(x, k)` runs
/// when the backward pass has finished gradient bucket `k` (`dp::bucket_ranges`), the
/// last before the update.
pub fn train_step<X: Issuer>(
    x: &mut X,
    hp: AdamW,
    mut bucket: impl FnMut(&mut X, usize) -> Result<()>,
) -> Result<()> {
    x.issue(Part::Forward { grad: true })?;
    x.issue(Part::Head)?;
    bucket(x, 0)?;
    let layers = x.layers();
    for l in (0..layers).rev() {
        x.issue(Part::Block(l))?;
        bucket(x, layers - l)?;
    }
    x.issue(Part::Embed)?;
    bucket(x, layers + 1)?;
    x.issue(Part::Update(hp))
}

/// The hook of a step without data parallelism: nothing.
pub fn no_hook<X>(_: &mut X, _: usize) -> Result<()> {
    Ok(())
}

/// A validation step: the loss, without the logits' gradient.
pub fn eval_step(x: &mut impl Issuer) -> Result<()> {
    x.issue(Part::Forward { grad: false })
}

/// Issues parts eagerly on `s`, with the model's cuBLAS handle and views of its weights
/// and gradients made once for the issuer.
pub struct Eager<'x, 's, T: Act> {
    pub s: &'x mut BoundStream<'s>,
    pub model: &'x Gpt<T>,
    views: Views<'x, T>,
}

impl<'x, 's, T: Act> Eager<'x, 's, T> {
    /// The eager issuer of `model`'s parts on `s`.
    pub fn new(s: &'x mut BoundStream<'s>, model: &'x Gpt<T>) -> Result<Self> {
        Ok(Eager {
            s,
            model,
            views: model.views()?,
        })
    }
}

impl<T: Act> Issuer for Eager<'_, '_, T> {
    fn layers(&self) -> usize {
        self.model.dims.l
    }
    fn issue(&mut self, part: Part) -> Result<()> {
        let m = self.model;
        m.issue(self.s, &m.blas, &self.views, part)
    }
}

/// Records parts into a graph capture that borrows the model and `views` for the
/// graph's lifetime `'a`.
pub struct Captured<'x, 'c, 'a, T: Act> {
    pub cap: &'x mut Capture<'c, 'a>,
    pub blas: &'x Blas,
    pub model: &'a Gpt<T>,
    pub views: &'a Views<'a, T>,
}

impl<T: Act> Issuer for Captured<'_, '_, '_, T> {
    fn layers(&self) -> usize {
        self.model.dims.l
    }
    fn issue(&mut self, part: Part) -> Result<()> {
        self.model.issue(self.cap, self.blas, self.views, part)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records what a step issues, in order.
    struct Log {
        layers: usize,
        seen: Vec<String>,
    }

    impl Issuer for Log {
        fn layers(&self) -> usize {
            self.layers
        }
        fn issue(&mut self, part: Part) -> Result<()> {
            self.seen.push(format!("{part:?}"));
            Ok(())
        }
    }

    #[test]
    fn a_train_step_finishes_the_buckets_in_order_before_the_update() {
        let mut log = Log {
            layers: 2,
            seen: Vec::new(),
        };
        let hp = AdamW::default();
        train_step(&mut log, hp, |x, k| {
            x.seen.push(format!("bucket {k}"));
            Ok(())
        })
        .unwrap();
        let update = format!("{:?}", Part::Update(hp));
        let want = [
            "Forward { grad: true }",
            "Head",
            "bucket 0",
            "Block(1)",
            "bucket 1",
            "Block(0)",
            "bucket 2",
            "Embed",
            "bucket 3",
            &update,
        ];
        assert_eq!(log.seen, want);
    }

    #[test]
    fn an_eval_step_is_the_forward_pass_without_the_gradient() {
        let mut log = Log {
            layers: 2,
            seen: Vec::new(),
        };
        eval_step(&mut log).unwrap();
        assert_eq!(log.seen, ["Forward { grad: false }"]);
    }
}
