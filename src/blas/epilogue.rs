//! cuBLASLt epilogues: what [`Epilogue`] each computes, which extra operands it reads
//! or writes ([`LtArgs`]), and their checks.

use super::plan::Plan;
use super::types::{DataType, Matmul};
use crate::access::AccessTracker;
use crate::device::Device;
use crate::error::MatmulError;
use crate::memory::{ByteSpan, DeviceMemory, DeviceMemoryMut};
use std::sync::Arc;

/// What [`matmul_lt`](crate::BoundStream::matmul_lt) applies to the product `P =
/// alpha·op(A)·op(B) + beta·C` before it writes C (cuBLASLt's epilogues).
///
/// The bias vector and the bias gradient have one element per column of a row-major C
/// (`n`; per row, `m`, for column-major), except for [`BGradA`](Self::BGradA) (`m`).
/// The auxiliary outputs of the forward epilogues are what the backward ones read:
/// `GELU_AUX` stores the pre-activation `Z` ([`Matmul::gelu_aux_len`] elements of the
/// product's type, rows [`Matmul::gelu_aux_ld`] apart), `RELU_AUX` a bit mask of `Z > 0`
/// ([`Matmul::relu_mask_len`] bytes). GELU is the tanh approximation
/// `0.5·z·(1 + tanh(√(2/π)·(z + 0.044715·z³)))`.
///
/// Epilogues other than [`Default`](Self::Default) are for f16, bf16 and f32 products.
///
/// Every epilogue may take an addend ([`LtArgs::addend`]): `beta·addend` then takes the
/// place of `beta·C`, and C is only written (`D = epilogue(alpha·op(A)·op(B) +
/// beta·addend)`, cuBLASLt's separate C and D), as a residual connection adds its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Epilogue {
    /// `C = P`.
    #[default]
    Default,
    /// `C = relu(P)`.
    Relu,
    /// `C = gelu(P)`.
    Gelu,
    /// `C = P + bias` (reads [`LtArgs::bias`]).
    Bias,
    /// `C = relu(P + bias)`.
    ReluBias,
    /// `C = gelu(P + bias)`.
    GeluBias,
    /// `C = relu(Z)`, `Z = P`, and the mask `Z > 0` ([`LtArgs::relu_mask_out`]).
    ReluAux,
    /// `C = relu(Z)`, `Z = P + bias`, and the mask `Z > 0`.
    ReluAuxBias,
    /// `C = gelu(Z)`, `Z = P`, and `Z` itself ([`LtArgs::aux_out`]).
    GeluAux,
    /// `C = gelu(Z)`, `Z = P + bias`, and `Z` itself.
    GeluAuxBias,
    /// `C = P ⊙ (Z > 0)`, with the mask of a `ReluAux*` product ([`LtArgs::relu_mask`]).
    DRelu,
    /// `DRelu`, and the bias gradient `Σ_rows C` ([`LtArgs::bias_grad`]).
    DReluBGrad,
    /// `C = P ⊙ gelu'(Z)`, with `Z` of a `GeluAux*` product ([`LtArgs::aux`]).
    DGelu,
    /// `DGelu`, and the bias gradient `Σ_rows C`.
    DGeluBGrad,
    /// `C = P`, and the bias gradient `Σ_k op(A)` (`m` elements: the gradient of a bias
    /// that was added along A's rows).
    BGradA,
    /// `C = P`, and the bias gradient `Σ_k op(B)` (`n` elements: for `dW = Xᵀ·dY`, the
    /// gradient of the bias that was added to Y).
    BGradB,
}

/// The extra operands of an epilogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Bias,
    BiasGrad,
    Aux,
    AuxOut,
    ReluMask,
    ReluMaskOut,
    /// The matrix `beta` scales in place of C (any epilogue; not in [`Role::ALL`]).
    Addend,
}

impl Role {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::Bias => "bias",
            Role::BiasGrad => "bias_grad",
            Role::Aux => "aux",
            Role::AuxOut => "aux_out",
            Role::ReluMask => "relu_mask",
            Role::ReluMaskOut => "relu_mask_out",
            Role::Addend => "addend",
        }
    }

    pub(crate) fn writes(self) -> bool {
        matches!(self, Role::BiasGrad | Role::AuxOut | Role::ReluMaskOut)
    }

    /// The operands an epilogue uses or not (every role but the optional addend).
    pub(crate) const ALL: [Role; 6] = [
        Role::Bias,
        Role::BiasGrad,
        Role::Aux,
        Role::AuxOut,
        Role::ReluMask,
        Role::ReluMaskOut,
    ];
}

impl Epilogue {
    /// Every epilogue.
    #[cfg(test)]
    pub(crate) const ALL: [Epilogue; 16] = [
        Epilogue::Default,
        Epilogue::Relu,
        Epilogue::Gelu,
        Epilogue::Bias,
        Epilogue::ReluBias,
        Epilogue::GeluBias,
        Epilogue::ReluAux,
        Epilogue::ReluAuxBias,
        Epilogue::GeluAux,
        Epilogue::GeluAuxBias,
        Epilogue::DRelu,
        Epilogue::DReluBGrad,
        Epilogue::DGelu,
        Epilogue::DGeluBGrad,
        Epilogue::BGradA,
        Epilogue::BGradB,
    ];

    /// cuBLASLt's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Epilogue::Default => "DEFAULT",
            Epilogue::Relu => "RELU",
            Epilogue::Gelu => "GELU",
            Epilogue::Bias => "BIAS",
            Epilogue::ReluBias => "RELU_BIAS",
            Epilogue::GeluBias => "GELU_BIAS",
            Epilogue::ReluAux => "RELU_AUX",
            Epilogue::ReluAuxBias => "RELU_AUX_BIAS",
            Epilogue::GeluAux => "GELU_AUX",
            Epilogue::GeluAuxBias => "GELU_AUX_BIAS",
            Epilogue::DRelu => "DRELU",
            Epilogue::DReluBGrad => "DRELU_BGRAD",
            Epilogue::DGelu => "DGELU",
            Epilogue::DGeluBGrad => "DGELU_BGRAD",
            Epilogue::BGradA => "BGRADA",
            Epilogue::BGradB => "BGRADB",
        }
    }

    /// Whether it uses the operand `role`.
    pub(crate) fn uses(self, role: Role) -> bool {
        use Epilogue::*;
        match role {
            Role::Bias => matches!(self, Bias | ReluBias | GeluBias | ReluAuxBias | GeluAuxBias),
            Role::BiasGrad => matches!(self, DReluBGrad | DGeluBGrad | BGradA | BGradB),
            Role::Aux => matches!(self, DGelu | DGeluBGrad),
            Role::AuxOut => matches!(self, GeluAux | GeluAuxBias),
            Role::ReluMask => matches!(self, DRelu | DReluBGrad),
            Role::ReluMaskOut => matches!(self, ReluAux | ReluAuxBias),
            Role::Addend => false,
        }
    }

    /// `cublasLtEpilogue_t` for cuBLAS's operand order (`swapped`: its A is the caller's
    /// B, which exchanges BGRADA and BGRADB).
    pub(crate) fn code(self, swapped: bool) -> u32 {
        match (self, swapped) {
            (Epilogue::Default, _) => 1,
            (Epilogue::Relu, _) => 2,
            (Epilogue::Bias, _) => 4,
            (Epilogue::ReluBias, _) => 6,
            (Epilogue::Gelu, _) => 32,
            (Epilogue::GeluBias, _) => 36,
            (Epilogue::ReluAux, _) => 130,
            (Epilogue::ReluAuxBias, _) => 134,
            (Epilogue::DRelu, _) => 136,
            (Epilogue::DReluBGrad, _) => 152,
            (Epilogue::GeluAux, _) => 160,
            (Epilogue::GeluAuxBias, _) => 164,
            (Epilogue::DGelu, _) => 192,
            (Epilogue::DGeluBGrad, _) => 208,
            (Epilogue::BGradA, false) | (Epilogue::BGradB, true) => 256,
            (Epilogue::BGradB, false) | (Epilogue::BGradA, true) => 512,
        }
    }

    /// The auxiliary operand's leading dimension for cuBLASLt, if it has one.
    pub(crate) fn aux_ld(self, shape: &Matmul) -> Option<usize> {
        if self.uses(Role::Aux) || self.uses(Role::AuxOut) {
            Some(shape.gelu_aux_ld())
        } else if self.uses(Role::ReluMask) || self.uses(Role::ReluMaskOut) {
            Some(shape.relu_mask_ld())
        } else {
            None
        }
    }
}

/// The elements the operand `role` of `epilogue` needs for `shape` (planned as `plan`).
pub(crate) fn needed_len(epilogue: Epilogue, role: Role, shape: &Matmul, plan: &Plan) -> usize {
    match (role, epilogue) {
        (Role::Aux | Role::AuxOut, _) => shape.gelu_aux_len(),
        (Role::ReluMask | Role::ReluMaskOut, _) => shape.relu_mask_len(),
        (Role::BiasGrad, Epilogue::BGradA) => shape.m,
        (Role::BiasGrad, Epilogue::BGradB) => shape.n,
        // One per row of cuBLAS's column-major D.
        _ => plan.m.max(0) as usize,
    }
}

/// [`MatmulError::Unsupported`] unless `dtype` products take `epilogue`.
pub(crate) fn check_type(epilogue: Epilogue, dtype: DataType) -> Result<(), MatmulError> {
    if epilogue != Epilogue::Default && dtype == DataType::F64 {
        return Err(MatmulError::Unsupported {
            what: format!("the cuBLASLt epilogue {}", epilogue.name()),
            dtype: dtype.name(),
        });
    }
    Ok(())
}

/// One extra operand of an epilogue, type-erased for the checks and claims.
pub(crate) struct Extra<'x> {
    pub(crate) role: Role,
    pub(crate) tracker: &'x AccessTracker,
    pub(crate) device: &'x Arc<Device>,
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    pub(crate) bytes: u64,
}

impl<'x> Extra<'x> {
    pub(crate) fn of<E, M: DeviceMemory<E> + ?Sized>(role: Role, m: &'x M) -> Self {
        Extra {
            role,
            tracker: m.tracker(),
            device: m.device(),
            ptr: m.device_ptr(),
            len: m.len(),
            bytes: m.num_bytes() as u64,
        }
    }

    /// The claim a stream makes on the operand.
    pub(crate) fn claim(&self) -> (&'x AccessTracker, crate::access::Access) {
        let access = if self.role.writes() {
            crate::access::Access::Write
        } else {
            crate::access::Access::Read
        };
        (self.tracker, access)
    }

    pub(crate) fn span(&self) -> ByteSpan {
        ByteSpan::new(self.tracker, self.ptr, self.bytes)
    }
}

/// Checks that `given` (each operand with its length) are exactly the operands
/// `epilogue` uses, with the lengths it needs.
pub(crate) fn check_operands(
    epilogue: Epilogue,
    shape: &Matmul,
    plan: &Plan,
    given: &[(Role, usize)],
) -> Result<(), MatmulError> {
    for role in Role::ALL {
        let found = given.iter().find(|(r, _)| *r == role);
        if epilogue.uses(role) != found.is_some() {
            return Err(MatmulError::EpilogueOperand {
                epilogue: epilogue.name(),
                operand: role.name(),
                missing: found.is_none(),
            });
        }
        if let Some(&(_, len)) = found {
            let expected = needed_len(epilogue, role, shape, plan);
            if len != expected {
                return Err(MatmulError::BufferSize {
                    operand: role.name(),
                    shape: format!(
                        "epilogue {} of a {}×{} C",
                        epilogue.name(),
                        shape.m,
                        shape.n
                    ),
                    expected,
                    found: len,
                    exact: true,
                });
            }
        }
    }
    Ok(())
}

/// [`check_operands`] of `extras`.
pub(crate) fn check_extras(
    epilogue: Epilogue,
    shape: &Matmul,
    plan: &Plan,
    extras: &[Extra<'_>],
) -> Result<(), MatmulError> {
    let given: Vec<(Role, usize)> = extras.iter().map(|e| (e.role, e.len)).collect();
    check_operands(epilogue, shape, plan, &given)
}

/// The extra operands of a [`matmul_lt`](crate::BoundStream::matmul_lt) epilogue:
/// inputs by `&` (read claims), outputs by `&mut` (write claims). Give exactly those the
/// [`Epilogue`] uses.
///
/// ```
/// use gpubind::blas::LtArgs;
/// let args: LtArgs<'_, f32> = LtArgs::new();
/// assert!(args.is_empty());
/// ```
pub struct LtArgs<'e, T> {
    pub(crate) bias: Option<&'e dyn DeviceMemory<T>>,
    pub(crate) bias_grad: Option<&'e mut dyn DeviceMemoryMut<T>>,
    pub(crate) aux: Option<&'e dyn DeviceMemory<T>>,
    pub(crate) aux_out: Option<&'e mut dyn DeviceMemoryMut<T>>,
    pub(crate) relu_mask: Option<&'e dyn DeviceMemory<u8>>,
    pub(crate) relu_mask_out: Option<&'e mut dyn DeviceMemoryMut<u8>>,
    pub(crate) addend: Option<&'e dyn DeviceMemory<T>>,
}

impl<T> Default for LtArgs<'_, T> {
    fn default() -> Self {
        LtArgs::new()
    }
}

impl<T> std::fmt::Debug for LtArgs<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LtArgs")
            .field("bias", &self.bias.is_some())
            .field("bias_grad", &self.bias_grad.is_some())
            .field("aux", &self.aux.is_some())
            .field("aux_out", &self.aux_out.is_some())
            .field("relu_mask", &self.relu_mask.is_some())
            .field("relu_mask_out", &self.relu_mask_out.is_some())
            .field("addend", &self.addend.is_some())
            .finish()
    }
}

impl<'e, T> LtArgs<'e, T> {
    /// No extra operand (for `Default`, `Relu`, `Gelu`).
    pub fn new() -> Self {
        LtArgs {
            bias: None,
            bias_grad: None,
            aux: None,
            aux_out: None,
            relu_mask: None,
            relu_mask_out: None,
            addend: None,
        }
    }

    /// Whether no operand was given.
    pub fn is_empty(&self) -> bool {
        self.bias.is_none()
            && self.bias_grad.is_none()
            && self.aux.is_none()
            && self.aux_out.is_none()
            && self.relu_mask.is_none()
            && self.relu_mask_out.is_none()
            && self.addend.is_none()
    }

    /// The bias vector the `*Bias` epilogues add (read).
    pub fn bias(mut self, bias: &'e dyn DeviceMemory<T>) -> Self {
        self.bias = Some(bias);
        self
    }

    /// Where the `*BGrad*` epilogues write the bias gradient.
    pub fn bias_grad(mut self, grad: &'e mut dyn DeviceMemoryMut<T>) -> Self {
        self.bias_grad = Some(grad);
        self
    }

    /// The pre-activation `DGelu*` reads (written by a `GeluAux*` product).
    pub fn aux(mut self, aux: &'e dyn DeviceMemory<T>) -> Self {
        self.aux = Some(aux);
        self
    }

    /// Where `GeluAux*` writes the pre-activation.
    pub fn aux_out(mut self, aux: &'e mut dyn DeviceMemoryMut<T>) -> Self {
        self.aux_out = Some(aux);
        self
    }

    /// The ReLU mask `DRelu*` reads (written by a `ReluAux*` product).
    pub fn relu_mask(mut self, mask: &'e dyn DeviceMemory<u8>) -> Self {
        self.relu_mask = Some(mask);
        self
    }

    /// Where `ReluAux*` writes the ReLU mask.
    pub fn relu_mask_out(mut self, mask: &'e mut dyn DeviceMemoryMut<u8>) -> Self {
        self.relu_mask_out = Some(mask);
        self
    }

    /// The matrix `beta` scales in place of C (read; any epilogue): the product writes
    /// `epilogue(alpha·op(A)·op(B) + beta·addend)` into C, whose old contents it does not
    /// read. The addend has C's layout and length, does not overlap C, and needs `beta`
    /// ≠ 0 ([`Matmul::scaled`]).
    ///
    /// ```no_run
    /// # fn main() -> gpubind::Result<()> {
    /// use gpubind::{blas::{Epilogue, LtArgs, Matmul}, Device, ThreadContext};
    /// let mut ctx = ThreadContext::acquire()?;
    /// let gpu = ctx.bind(&Device::get(0)?)?;
    /// let blas = gpu.new_blas()?;
    /// // A residual connection: Y = X + (H·W + b), X left as it is.
    /// let (batch, width) = (32, 64);
    /// let shape = Matmul::new(batch, width, width).scaled(1.0, 1.0);
    /// let (h, w) = (gpu.alloc_zeros::<f32>(batch * width)?, gpu.alloc_zeros::<f32>(width * width)?);
    /// let (x, b) = (gpu.alloc_zeros::<f32>(batch * width)?, gpu.alloc_zeros::<f32>(width)?);
    /// let mut y = gpu.alloc_zeros::<f32>(batch * width)?;
    /// let args = LtArgs::new().bias(&b).addend(&x);
    /// gpu.default_stream().matmul_lt(&blas, &shape, Epilogue::Bias, &h, &w, &mut y, args)?;
    /// # Ok(()) }
    /// ```
    pub fn addend(mut self, addend: &'e dyn DeviceMemory<T>) -> Self {
        self.addend = Some(addend);
        self
    }

    /// The operands given, type-erased.
    pub(crate) fn extras(&self) -> Vec<Extra<'_>> {
        let mut v = Vec::new();
        if let Some(m) = self.bias {
            v.push(Extra::of(Role::Bias, m));
        }
        if let Some(m) = self.bias_grad.as_deref() {
            v.push(Extra::of(Role::BiasGrad, m));
        }
        if let Some(m) = self.aux {
            v.push(Extra::of(Role::Aux, m));
        }
        if let Some(m) = self.aux_out.as_deref() {
            v.push(Extra::of(Role::AuxOut, m));
        }
        if let Some(m) = self.relu_mask {
            v.push(Extra::of(Role::ReluMask, m));
        }
        if let Some(m) = self.relu_mask_out.as_deref() {
            v.push(Extra::of(Role::ReluMaskOut, m));
        }
        if let Some(m) = self.addend {
            v.push(Extra::of(Role::Addend, m));
        }
        v
    }
}
