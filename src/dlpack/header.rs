//! The `dlpack.h` (v1.x) structs and constants, and [`ManagedTensor`], the trait over
//! its two managed-tensor structs.

use std::ffi::c_void;
use std::ptr::NonNull;

/// `DLPACK_MAJOR_VERSION` of the header these structs follow.
pub const DLPACK_MAJOR_VERSION: u32 = 1;
/// `DLPACK_MINOR_VERSION` of the header these structs follow.
pub const DLPACK_MINOR_VERSION: u32 = 3;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the data.
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the producer made a copy the consumer solely owns.
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;
/// `DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED`: sub-byte elements are padded, not packed.
pub const DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED: u64 = 1 << 2;

/// `DLPackVersion`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DLPackVersion {
    /// Major version: a different one means another ABI.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl DLPackVersion {
    /// The version these definitions follow.
    pub const CURRENT: DLPackVersion = DLPackVersion {
        major: DLPACK_MAJOR_VERSION,
        minor: DLPACK_MINOR_VERSION,
    };
}

/// `DLDeviceType`: an `int32_t` enum. A newtype rather than a Rust enum, so values a
/// newer producer sends are representable (and rejected with an error, not UB).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DLDeviceType(pub i32);

impl DLDeviceType {
    /// `kDLCPU`.
    pub const CPU: Self = Self(1);
    /// `kDLCUDA`.
    pub const CUDA: Self = Self(2);
    /// `kDLCUDAHost`: pinned CUDA host memory.
    pub const CUDA_HOST: Self = Self(3);
    /// `kDLOpenCL`.
    pub const OPENCL: Self = Self(4);
    /// `kDLVulkan`.
    pub const VULKAN: Self = Self(7);
    /// `kDLMetal`.
    pub const METAL: Self = Self(8);
    /// `kDLVPI`.
    pub const VPI: Self = Self(9);
    /// `kDLROCM`.
    pub const ROCM: Self = Self(10);
    /// `kDLROCMHost`.
    pub const ROCM_HOST: Self = Self(11);
    /// `kDLExtDev`.
    pub const EXT_DEV: Self = Self(12);
    /// `kDLCUDAManaged`: CUDA managed memory.
    pub const CUDA_MANAGED: Self = Self(13);
    /// `kDLOneAPI`.
    pub const ONE_API: Self = Self(14);
    /// `kDLWebGPU`.
    pub const WEBGPU: Self = Self(15);
    /// `kDLHexagon`.
    pub const HEXAGON: Self = Self(16);
    /// `kDLMAIA`.
    pub const MAIA: Self = Self(17);
    /// `kDLTrn`.
    pub const TRN: Self = Self(18);
}

/// `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DLDevice {
    /// The device type.
    pub device_type: DLDeviceType,
    /// The device index (0 for CPU, pinned and managed memory).
    pub device_id: i32,
}

/// `DLDataTypeCode` values (the `code` of a [`DLDataType`]).
pub mod type_code {
    /// `kDLInt`.
    pub const INT: u8 = 0;
    /// `kDLUInt`.
    pub const UINT: u8 = 1;
    /// `kDLFloat`.
    pub const FLOAT: u8 = 2;
    /// `kDLOpaqueHandle`.
    pub const OPAQUE_HANDLE: u8 = 3;
    /// `kDLBfloat`.
    pub const BFLOAT: u8 = 4;
    /// `kDLComplex`.
    pub const COMPLEX: u8 = 5;
    /// `kDLBool`.
    pub const BOOL: u8 = 6;
}

/// `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DLDataType {
    /// A [`type_code`] value.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Vector lanes (1 for scalars).
    pub lanes: u16,
}

/// `DLTensor`: a plain, non-owning tensor description.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLTensor {
    /// Base pointer (host or device address; NULL for an empty tensor).
    pub data: *mut c_void,
    /// Where the data lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides in elements (NULL meant "compact row-major" before v1.2).
    pub strides: *mut i64,
    /// Offset in bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// `DLManagedTensor` (legacy, pre-v1.0 exchange struct).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees `manager_ctx` and the struct itself; called once by the consumer.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLManagedTensorVersioned` (the v1.x exchange struct).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// ABI version of this struct.
    pub version: DLPackVersion,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees `manager_ctx` and the struct itself; called once by the consumer.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*` bits.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

/// The two managed-tensor structs, for code shared by versioned and legacy exchange.
/// Sealed.
pub trait ManagedTensor: private::Sealed + Sized {
    /// The tensor description.
    fn dl_tensor(&self) -> &DLTensor;
    /// The version (`None` for the legacy struct).
    fn version(&self) -> Option<DLPackVersion>;
    /// The flags (0 for the legacy struct).
    fn flags(&self) -> u64;
    /// The deleter.
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)>;
    /// Calls the deleter of `ptr`, if any.
    ///
    /// # Safety
    ///
    /// `ptr` is a live managed tensor owned by the caller; it is invalid afterwards.
    unsafe fn delete(ptr: NonNull<Self>) {
        // SAFETY: the caller owns the live struct; the deleter field is readable for any
        // major version (the ABI keeps everything up to `flags` stable).
        if let Some(d) = unsafe { ptr.as_ref() }.deleter() {
            // SAFETY: the producer's deleter, called once with its own pointer.
            unsafe { d(ptr.as_ptr()) }
        }
    }
    #[doc(hidden)]
    fn assemble(
        dl_tensor: DLTensor,
        manager_ctx: *mut c_void,
        deleter: unsafe extern "C" fn(*mut Self),
    ) -> Self;
    #[doc(hidden)]
    fn manager_ctx(&self) -> *mut c_void;
    #[doc(hidden)]
    fn set_manager_ctx(&mut self, ctx: *mut c_void);
}

mod private {
    pub trait Sealed {}
    impl Sealed for super::DLManagedTensor {}
    impl Sealed for super::DLManagedTensorVersioned {}
}

/// The accessors both managed structs share (same field names).
macro_rules! managed_fields {
    () => {
        fn dl_tensor(&self) -> &DLTensor {
            &self.dl_tensor
        }
        fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
            self.deleter
        }
        fn manager_ctx(&self) -> *mut c_void {
            self.manager_ctx
        }
        fn set_manager_ctx(&mut self, ctx: *mut c_void) {
            self.manager_ctx = ctx;
        }
    };
}

impl ManagedTensor for DLManagedTensorVersioned {
    managed_fields!();
    fn version(&self) -> Option<DLPackVersion> {
        Some(self.version)
    }
    fn flags(&self) -> u64 {
        self.flags
    }
    fn assemble(
        dl_tensor: DLTensor,
        manager_ctx: *mut c_void,
        deleter: unsafe extern "C" fn(*mut Self),
    ) -> Self {
        DLManagedTensorVersioned {
            version: DLPackVersion::CURRENT,
            manager_ctx,
            deleter: Some(deleter),
            flags: 0,
            dl_tensor,
        }
    }
}

impl ManagedTensor for DLManagedTensor {
    managed_fields!();
    fn version(&self) -> Option<DLPackVersion> {
        None
    }
    fn flags(&self) -> u64 {
        0
    }
    fn assemble(
        dl_tensor: DLTensor,
        manager_ctx: *mut c_void,
        deleter: unsafe extern "C" fn(*mut Self),
    ) -> Self {
        DLManagedTensor {
            dl_tensor,
            manager_ctx,
            deleter: Some(deleter),
        }
    }
}
