//! The activation types of `--precision` ([`Act`]): `f32` and `bf16`.

use gpubind::DeviceRepr;
use gpubind::blas::BlasScalar;
use gpubind::collective::CollectiveType;

/// The activation type: `f32`, or `bf16` (products in bf16 with f32 accumulation).
pub trait Act: BlasScalar + CollectiveType + DeviceRepr + Copy + 'static {
    /// Compile the kernels with bf16 activations.
    const BF16: bool;
    /// `--precision`'s name.
    const PRECISION: &'static str;
    /// The H200's dense peak for this type's products, TFLOP/s (MFU's denominator).
    const PEAK_TFLOPS: f64;
    fn to_f32(self) -> f32;
    /// The nearest value of the type.
    fn from_f32(x: f32) -> Self;
}

impl Act for f32 {
    const BF16: bool = false;
    const PRECISION: &'static str = "fp32";
    /// 16,896 FP32 lanes × 2 FLOP × 1.98 GHz, no tensor cores (TF32 off).
    const PEAK_TFLOPS: f64 = 67.0;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Act for half::bf16 {
    const BF16: bool = true;
    const PRECISION: &'static str = "bf16";
    /// Dense BF16 tensor-core peak.
    const PEAK_TFLOPS: f64 = 989.0;
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
}
