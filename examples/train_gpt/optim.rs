//! AdamW's hyper-parameters and the learning-rate schedule (linear warm-up, then cosine
//! decay to a tenth of the peak). Pure host code.

/// AdamW as `torch.optim.AdamW`, plus the gradient-norm clip.
#[derive(Debug, Clone, Copy)]
pub struct AdamW {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// Applied to 2-D tensors only ([`crate::model::Param::decay`]).
    pub weight_decay: f32,
    /// `clip_grad_norm_`'s maximum norm.
    pub max_norm: f32,
}

impl Default for AdamW {
    fn default() -> Self {
        AdamW {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            max_norm: 1.0,
        }
    }
}

/// Floats of the device schedule buffer: `[lr, 1 - β1^t, 1 - β2^t, 0]`.
pub const SCHED_LEN: usize = 4;

/// Warm-up for `warmup` steps, then cosine decay to `min_frac · lr` at `total`.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    pub lr: f64,
    pub warmup: usize,
    pub total: usize,
    pub min_frac: f64,
}

impl Schedule {
    /// The schedule of a run of `total` steps: warm-up over 10 % of them (at most 100).
    pub fn new(lr: f64, total: usize) -> Schedule {
        Schedule {
            lr,
            warmup: (total / 10).clamp(1, 100),
            total,
            min_frac: 0.1,
        }
    }

    /// The learning rate of step `step` (0-based).
    pub fn lr_at(&self, step: usize) -> f64 {
        if step < self.warmup {
            return self.lr * (step + 1) as f64 / self.warmup as f64;
        }
        let span = (self.total - self.warmup).max(1) as f64;
        let ratio = ((step - self.warmup) as f64 / span).min(1.0);
        let coeff = 0.5 * (1.0 + (std::f64::consts::PI * ratio).cos());
        let min = self.lr * self.min_frac;
        min + coeff * (self.lr - min)
    }

    /// The device schedule buffer of step `step`: its lr and AdamW's bias corrections
    /// for the update number `step + 1`.
    pub fn device_values(&self, step: usize, hp: &AdamW) -> [f32; SCHED_LEN] {
        let t = (step + 1) as i32;
        [
            self.lr_at(step) as f32,
            (1.0 - (hp.beta1 as f64).powi(t)) as f32,
            (1.0 - (hp.beta2 as f64).powi(t)) as f32,
            0.0,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_to_a_tenth() {
        let s = Schedule::new(6e-4, 1000);
        assert_eq!(s.warmup, 100);
        assert!((s.lr_at(0) - 6e-6).abs() < 1e-12);
        assert!((s.lr_at(99) - 6e-4).abs() < 1e-12);
        assert!((s.lr_at(100) - 6e-4).abs() < 1e-12);
        assert!((s.lr_at(550) - 3.3e-4).abs() < 1e-9);
        assert!((s.lr_at(1000) - 6e-5).abs() < 1e-12);
        assert!((1..1000).all(|i| s.lr_at(i) <= s.lr_at(i.min(99)) + 1e-15));
    }

    #[test]
    fn bias_corrections_follow_the_step() {
        let s = Schedule::new(1e-3, 10);
        let v = s.device_values(0, &AdamW::default());
        assert!((v[1] - 0.1).abs() < 1e-7 && (v[2] - 0.05).abs() < 1e-7);
    }
}
