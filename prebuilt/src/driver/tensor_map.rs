//! Tensor map descriptors (`CUtensorMap`) for the Tensor Memory Accelerator: what Hopper and
//! Blackwell kernels that copy tiles with TMA (CUTLASS 3 and CuTe GEMMs, FlashAttention 3,
//! DeepGEMM) take as a `__grid_constant__ const CUtensorMap` parameter. The driver encodes one
//! with `cuTensorMapEncodeTiled` from a tensor's address, sizes and strides and the tile (the
//! *box*) one copy moves; the 128 bytes it writes are the parameter.
//!
//! [`TensorMapSpec::check`] applies the driver's documented rules first, so that a wrong map
//! is refused naming the rule and the dimension instead of the driver's bare
//! `CUDA_ERROR_INVALID_VALUE`. Dimensions are listed innermost first, as the driver takes them
//! (a row-major `[rows, cols]` tensor is `dims = [cols, rows]`). `cuTensorMapEncodeTiled` is
//! an optional entry point (CUDA 12.0 and later): a driver without it still loads and launches
//! every kernel, and only encoding a map is [`DriverError::Unsupported`].

use super::*;

/// The size of an encoded map: `CUtensorMap` is 128 bytes (aligned to 64 in CUDA 12's
/// header, to 128 in CUDA 13's; a kernel parameter takes the bytes wherever they are).
pub const TENSOR_MAP_BYTES: usize = 128;

/// The driver's entry point for tiled maps.
pub(super) const ENCODE_TILED: &str = "cuTensorMapEncodeTiled";

/// The element type of a mapped tensor, as the copy engine sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorMapElement {
    /// One byte: `uint8`, `int8` and the 8-bit float types are all moved as bytes.
    U8,
    /// `uint16`, `int16`.
    U16,
    /// `uint32`.
    U32,
    /// `int32`.
    I32,
    /// `uint64`.
    U64,
    /// `int64`.
    I64,
    /// `float16`.
    F16,
    /// `float32`.
    F32,
    /// `float64`.
    F64,
    /// `bfloat16`.
    BF16,
    /// `float32` read as TF32.
    TF32,
}

impl TensorMapElement {
    /// The type for a torch dtype's name (`torch.bfloat16` → `"bfloat16"`), `None` for one the
    /// copy engine cannot move (`bool`, complex types).
    pub fn from_torch(dtype: &str) -> Option<TensorMapElement> {
        let name = dtype.strip_prefix("torch.").unwrap_or(dtype);
        Some(match name {
            "uint8" | "int8" | "float8_e4m3fn" | "float8_e5m2" | "float8_e4m3fnuz"
            | "float8_e5m2fnuz" | "float8_e8m0fnu" => TensorMapElement::U8,
            "uint16" | "int16" => TensorMapElement::U16,
            "uint32" => TensorMapElement::U32,
            "int32" => TensorMapElement::I32,
            "uint64" => TensorMapElement::U64,
            "int64" => TensorMapElement::I64,
            "float16" | "half" => TensorMapElement::F16,
            "float32" | "float" => TensorMapElement::F32,
            "float64" | "double" => TensorMapElement::F64,
            "bfloat16" => TensorMapElement::BF16,
            "tfloat32" => TensorMapElement::TF32,
            _ => return None,
        })
    }

    /// Its size in bytes.
    pub fn size(self) -> u64 {
        match self {
            TensorMapElement::U8 => 1,
            TensorMapElement::U16 | TensorMapElement::F16 | TensorMapElement::BF16 => 2,
            TensorMapElement::U32
            | TensorMapElement::I32
            | TensorMapElement::F32
            | TensorMapElement::TF32 => 4,
            TensorMapElement::U64 | TensorMapElement::I64 | TensorMapElement::F64 => 8,
        }
    }

    fn is_float(self) -> bool {
        matches!(
            self,
            TensorMapElement::F16
                | TensorMapElement::F32
                | TensorMapElement::F64
                | TensorMapElement::BF16
                | TensorMapElement::TF32
        )
    }

    fn driver(self) -> sys::CUtensorMapDataType {
        use sys::CUtensorMapDataType as T;
        match self {
            TensorMapElement::U8 => T::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            TensorMapElement::U16 => T::CU_TENSOR_MAP_DATA_TYPE_UINT16,
            TensorMapElement::U32 => T::CU_TENSOR_MAP_DATA_TYPE_UINT32,
            TensorMapElement::I32 => T::CU_TENSOR_MAP_DATA_TYPE_INT32,
            TensorMapElement::U64 => T::CU_TENSOR_MAP_DATA_TYPE_UINT64,
            TensorMapElement::I64 => T::CU_TENSOR_MAP_DATA_TYPE_INT64,
            TensorMapElement::F16 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            TensorMapElement::F32 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
            TensorMapElement::F64 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
            TensorMapElement::BF16 => T::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            TensorMapElement::TF32 => T::CU_TENSOR_MAP_DATA_TYPE_TFLOAT32,
        }
    }
}

/// How a map lays a tile out in shared memory: the swizzle span in bytes (0: none). A
/// kernel's shared-memory layout decides it (CuTe's `Swizzle<3,4,3>` is the 128-byte one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Swizzle {
    /// Rows of the tile as they are.
    #[default]
    None,
    /// 32-byte swizzle.
    B32,
    /// 64-byte swizzle.
    B64,
    /// 128-byte swizzle.
    B128,
}

impl Swizzle {
    /// The swizzle of a span in bytes: 0, 32, 64 or 128.
    pub fn from_bytes(bytes: u32) -> Option<Swizzle> {
        Some(match bytes {
            0 => Swizzle::None,
            32 => Swizzle::B32,
            64 => Swizzle::B64,
            128 => Swizzle::B128,
            _ => return None,
        })
    }

    fn span(self) -> Option<u64> {
        match self {
            Swizzle::None => None,
            Swizzle::B32 => Some(32),
            Swizzle::B64 => Some(64),
            Swizzle::B128 => Some(128),
        }
    }

    fn driver(self) -> sys::CUtensorMapSwizzle {
        use sys::CUtensorMapSwizzle as S;
        match self {
            Swizzle::None => S::CU_TENSOR_MAP_SWIZZLE_NONE,
            Swizzle::B32 => S::CU_TENSOR_MAP_SWIZZLE_32B,
            Swizzle::B64 => S::CU_TENSOR_MAP_SWIZZLE_64B,
            Swizzle::B128 => S::CU_TENSOR_MAP_SWIZZLE_128B,
        }
    }
}

/// How far the copy engine promotes a line into L2, in bytes (0: no promotion).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum L2Promotion {
    /// None.
    #[default]
    None,
    /// 64 bytes.
    B64,
    /// 128 bytes.
    B128,
    /// 256 bytes.
    B256,
}

impl L2Promotion {
    /// The promotion of a size in bytes: 0, 64, 128 or 256.
    pub fn from_bytes(bytes: u32) -> Option<L2Promotion> {
        Some(match bytes {
            0 => L2Promotion::None,
            64 => L2Promotion::B64,
            128 => L2Promotion::B128,
            256 => L2Promotion::B256,
            _ => return None,
        })
    }

    fn driver(self) -> sys::CUtensorMapL2promotion {
        use sys::CUtensorMapL2promotion as P;
        match self {
            L2Promotion::None => P::CU_TENSOR_MAP_L2_PROMOTION_NONE,
            L2Promotion::B64 => P::CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
            L2Promotion::B128 => P::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            L2Promotion::B256 => P::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        }
    }
}

/// A tiled tensor map to encode: the tensor in global memory and the box one copy moves.
/// Every list is innermost dimension first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMapSpec {
    /// The element type.
    pub element: TensorMapElement,
    /// The tensor's device address.
    pub address: u64,
    /// Its size in elements per dimension (1 to 5 dimensions).
    pub dims: Vec<u64>,
    /// Its strides in bytes, for every dimension but the innermost (which is dense).
    pub strides: Vec<u64>,
    /// The box: elements per dimension one copy moves into shared memory.
    pub box_dims: Vec<u32>,
    /// Elements to step per dimension (1: every element).
    pub element_strides: Vec<u32>,
    /// The shared-memory swizzle.
    pub swizzle: Swizzle,
    /// L2 promotion.
    pub l2_promotion: L2Promotion,
    /// Fill out-of-bounds float elements with NaN rather than zero.
    pub oob_nan: bool,
}

/// The largest rank a map may have.
const MAX_RANK: usize = 5;
/// The largest box dimension, in elements.
const MAX_BOX: u32 = 256;
/// The largest element stride.
const MAX_ELEMENT_STRIDE: u32 = 8;
/// Address and stride alignment, in bytes.
const ALIGNMENT: u64 = 16;
/// Strides must be below 2^40 bytes.
const STRIDE_LIMIT: u64 = 1 << 40;
/// Dimensions must be at most 2^32 elements.
const DIM_LIMIT: u64 = 1 << 32;

impl TensorMapSpec {
    /// The driver's rules for `cuTensorMapEncodeTiled` (without interleave), applied before
    /// the driver sees the map: `Err` says which rule, for which dimension (counted innermost
    /// first, as the lists are).
    pub fn check(&self) -> Result<(), String> {
        self.check_naming(|dim| dim)
    }

    /// [`TensorMapSpec::check`], with each dimension named by `number(dim)` (`dim` innermost
    /// first): a caller whose user counts outermost first, as torch's `shape` does, passes
    /// `|dim| rank - 1 - dim`.
    pub fn check_naming(&self, number: impl Fn(usize) -> usize) -> Result<(), String> {
        let rank = self.dims.len();
        if !(1..=MAX_RANK).contains(&rank) {
            return Err(format!(
                "a tensor map has 1 to {MAX_RANK} dimensions, not {rank}"
            ));
        }
        let lists = [
            ("strides", self.strides.len(), rank - 1),
            ("box", self.box_dims.len(), rank),
            ("element strides", self.element_strides.len(), rank),
        ];
        for (what, len, want) in lists {
            if len != want {
                return Err(format!(
                    "{what} has {len} entries; a {rank}-dimensional map needs {want}"
                ));
            }
        }
        if !self.address.is_multiple_of(ALIGNMENT) {
            return Err(format!(
                "the tensor's address {:#x} is not a multiple of {ALIGNMENT} bytes, which the \
                 copy engine needs",
                self.address
            ));
        }
        for (dim, &size) in self.dims.iter().enumerate() {
            let dim = number(dim);
            if size == 0 || size > DIM_LIMIT {
                return Err(format!(
                    "dimension {dim} has {size} elements; it must have 1 to 2^32"
                ));
            }
        }
        let element = self.element.size();
        for (index, &stride) in self.strides.iter().enumerate() {
            let dim = number(index + 1);
            if !stride.is_multiple_of(ALIGNMENT) || stride >= STRIDE_LIMIT {
                return Err(format!(
                    "dimension {dim}'s stride is {stride} bytes; it must be a multiple of \
                     {ALIGNMENT} below 2^40 (pad the rows, or map a copy)"
                ));
            }
        }
        for (dim, (&size, &step)) in self.box_dims.iter().zip(&self.element_strides).enumerate() {
            let dim = number(dim);
            if size == 0 || size > MAX_BOX {
                return Err(format!(
                    "the box has {size} elements in dimension {dim}; it must have 1 to {MAX_BOX}"
                ));
            }
            if step == 0 || step > MAX_ELEMENT_STRIDE {
                return Err(format!(
                    "the element stride of dimension {dim} is {step}; it must be 1 to \
                     {MAX_ELEMENT_STRIDE}"
                ));
            }
        }
        let inner = u64::from(self.box_dims[0]) * element;
        if !inner.is_multiple_of(ALIGNMENT) {
            return Err(format!(
                "the box's innermost dimension is {inner} bytes ({} elements of {element}); it \
                 must be a multiple of {ALIGNMENT} bytes",
                self.box_dims[0]
            ));
        }
        if let Some(span) = self.swizzle.span() {
            if inner > span {
                return Err(format!(
                    "the box's innermost dimension is {inner} bytes, more than the {span}-byte \
                     swizzle spans; make the box at most {} elements wide there",
                    span / element
                ));
            }
        }
        if self.oob_nan && !self.element.is_float() {
            return Err("a NaN fill needs a floating-point element type".to_owned());
        }
        Ok(())
    }
}

/// A map that could not be encoded: a rule the spec breaks, or the driver's refusal.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TensorMapError {
    /// The spec breaks one of the driver's rules ([`TensorMapSpec::check`]).
    #[error("{0}")]
    Invalid(String),
    /// The driver has no encoder or refused the map.
    #[error(transparent)]
    Driver(#[from] DriverError),
}

impl Driver {
    /// Encodes a tiled tensor map: the 128 bytes a kernel's `CUtensorMap` parameter takes.
    /// The spec is checked first; the driver needs no context for this.
    pub fn encode_tensor_map(
        &self,
        spec: &TensorMapSpec,
    ) -> Result<[u8; TENSOR_MAP_BYTES], TensorMapError> {
        spec.check().map_err(TensorMapError::Invalid)?;
        if !self.tensor_maps {
            return Err(DriverError::Unsupported {
                library: self.library_name.clone(),
                symbol: ENCODE_TILED,
                needed_by: "tensor maps (TMA descriptors)",
            }
            .into());
        }
        let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
        let oob_fill = if spec.oob_nan {
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA
        } else {
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE
        };
        // The rank was checked to be at most 5.
        let rank = spec.dims.len() as u32;
        // SAFETY: the entry point exists (looked up when the library loaded); `map` is valid
        // for a write of one `CUtensorMap`; every array holds `rank` (strides: `rank - 1`)
        // entries, as checked above, and outlives the call. The address is only recorded in
        // the map, never dereferenced here.
        let status = unsafe {
            sys::cuTensorMapEncodeTiled(
                map.as_mut_ptr(),
                spec.element.driver(),
                rank,
                spec.address as *mut std::ffi::c_void,
                spec.dims.as_ptr(),
                spec.strides.as_ptr(),
                spec.box_dims.as_ptr(),
                spec.element_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                spec.swizzle.driver(),
                spec.l2_promotion.driver(),
                oob_fill,
            )
        };
        checked(ENCODE_TILED, status.result())?;
        // SAFETY: the driver wrote the map (the call succeeded); it was zeroed before.
        let map = unsafe { map.assume_init() };
        let mut bytes = [0; TENSOR_MAP_BYTES];
        // SAFETY: `CUtensorMap` is a plain 128-byte array of integers.
        let raw: &[u8] = unsafe {
            std::slice::from_raw_parts(
                (&map as *const sys::CUtensorMap).cast::<u8>(),
                std::mem::size_of::<sys::CUtensorMap>(),
            )
        };
        bytes.copy_from_slice(raw);
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row-major bf16 `[rows, cols]` tensor mapped with a `[box_rows, box_cols]` box.
    fn matrix(rows: u64, cols: u64, box_rows: u32, box_cols: u32) -> TensorMapSpec {
        TensorMapSpec {
            element: TensorMapElement::BF16,
            address: 0x7f00_0000_0000,
            dims: vec![cols, rows],
            strides: vec![cols * 2],
            box_dims: vec![box_cols, box_rows],
            element_strides: vec![1, 1],
            swizzle: Swizzle::None,
            l2_promotion: L2Promotion::None,
            oob_nan: false,
        }
    }

    #[test]
    fn the_size_of_a_map_is_cudas() {
        assert_eq!(std::mem::size_of::<sys::CUtensorMap>(), TENSOR_MAP_BYTES);
        assert!(std::mem::align_of::<sys::CUtensorMap>() >= 64);
    }

    #[test]
    fn a_map_is_checked_by_the_drivers_rules_naming_the_dimension() {
        assert_eq!(matrix(128, 256, 64, 256).check(), Ok(()));
        let fault = |spec: TensorMapSpec| spec.check().unwrap_err();

        let mut misaligned = matrix(128, 256, 64, 256);
        misaligned.address += 2;
        assert!(fault(misaligned).contains("not a multiple of 16 bytes"));
        assert!(fault(matrix(128, 100, 64, 64)).contains("dimension 1's stride is 200 bytes"));
        assert!(fault(matrix(128, 512, 64, 512)).contains("512 elements in dimension 0"));
        assert!(fault(matrix(128, 256, 64, 4)).contains("innermost dimension is 8 bytes"));
        let mut swizzled = matrix(128, 256, 64, 128);
        swizzled.swizzle = Swizzle::B128;
        assert!(fault(swizzled.clone()).contains("at most 64 elements wide"));
        swizzled.box_dims[0] = 64;
        assert_eq!(swizzled.check(), Ok(()));
        let mut six = matrix(1, 16, 1, 16);
        six.dims = vec![16, 1, 1, 1, 1, 1];
        assert!(fault(six).contains("1 to 5 dimensions, not 6"));
        let mut short = matrix(128, 256, 64, 256);
        short.element_strides.pop();
        assert!(fault(short).contains("element strides has 1 entries"));
        let mut stepped = matrix(128, 256, 64, 256);
        stepped.element_strides[1] = 9;
        assert!(fault(stepped).contains("element stride of dimension 1 is 9"));
        let mut nan = matrix(128, 256, 64, 256);
        nan.element = TensorMapElement::I32;
        nan.oob_nan = true;
        assert!(fault(nan).contains("NaN fill"));
    }

    #[test]
    fn torch_dtypes_name_their_element_types() {
        assert_eq!(
            TensorMapElement::from_torch("torch.bfloat16"),
            Some(TensorMapElement::BF16)
        );
        assert_eq!(
            TensorMapElement::from_torch("float8_e4m3fn").map(TensorMapElement::size),
            Some(1)
        );
        assert_eq!(TensorMapElement::from_torch("torch.bool"), None);
        assert_eq!(TensorMapElement::from_torch("complex64"), None);
    }
}
