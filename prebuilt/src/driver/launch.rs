//! Launching an entry function: its geometry ([`LaunchConfig`]) and launch attributes
//! ([`LaunchAttributes`]), `cuLaunchKernel` and `cuLaunchKernelEx`, and what bounds a launch:
//! the device's limits ([`DeviceLimits`], asked once per [`Context`]), the function's
//! attributes ([`FunctionAttributes`]) and occupancy. Part of [`super`], the crate's one place
//! for driver calls; its checks against these facts live in the registry (`kernel.rs`).

use super::*;

/// What a device allows one launch: asked of the driver once per [`Context`]
/// ([`Context::limits`]), only when a launch needs more than the defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Streaming multiprocessors (`CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`).
    pub multiprocessors: u32,
    /// Shared memory one block may have when its function opts in
    /// (`CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`): 227 KB on an H100 or H200.
    pub shared_memory_per_block_optin: u32,
    /// Whether the device launches thread block clusters (`CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH`).
    pub cluster_launch: bool,
    /// Whether the device launches cooperatively (`CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH`).
    pub cooperative_launch: bool,
}

impl Context {
    /// What the device allows one launch: asked of the driver the first time, the same answer
    /// after.
    pub fn limits(&self) -> Result<DeviceLimits, DriverError> {
        if let Some(limits) = self.limits.get() {
            return Ok(*limits);
        }
        let handle = self.device.handle;
        // A driver older than an attribute answers CUDA_ERROR_INVALID_VALUE for it: such a
        // device has none of what the attribute would allow.
        let flag = |name| attribute(handle, name).is_ok_and(|value| value != 0);
        let limits = DeviceLimits {
            multiprocessors: attribute(
                handle,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )?,
            shared_memory_per_block_optin: attribute(
                handle,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )?,
            cluster_launch: flag(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH),
            cooperative_launch: flag(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH,
            ),
        };
        Ok(*self.limits.get_or_init(|| limits))
    }
}

/// Launch geometry: grid and block dimensions, dynamic shared memory, and the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Grid dimensions, in blocks.
    pub grid: [u32; 3],
    /// Block dimensions, in threads.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
    /// The `CUstream` handle as an integer: `0` is the legacy default stream; from PyTorch,
    /// `torch.cuda.current_stream().cuda_stream`.
    pub stream: u64,
}

/// What a launch asks of the driver beyond its geometry: the launch attributes of
/// `cuLaunchKernelEx`. The default asks for none, and launches through `cuLaunchKernel`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchAttributes {
    /// Thread block cluster dimensions, in blocks (compute capability 9.0 and later): the
    /// blocks of one cluster run at once on one GPC and share their shared memory.
    pub cluster: Option<[u32; 3]>,
    /// A cooperative launch: every block is resident at once, so that the kernel may
    /// synchronize its whole grid (`cooperative_groups::this_grid().sync()`).
    pub cooperative: bool,
    /// Programmatic dependent launch (programmatic stream serialization): the kernel may start
    /// before the kernel before it on the stream has finished, and waits for it where it reads
    /// its results (`griddepcontrol.wait`, `cudaGridDependencySynchronize()`).
    pub programmatic: bool,
    /// The launch's priority, numbered as stream priorities are (a lower number is a higher
    /// priority); `None` keeps the stream's.
    pub priority: Option<i32>,
}

impl LaunchAttributes {
    /// Whether the launch asks for no attribute, so `cuLaunchKernel` launches it.
    pub fn is_empty(&self) -> bool {
        *self == LaunchAttributes::default()
    }
}

/// What the driver says about one entry function that bounds its launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FunctionAttributes {
    /// Its static shared memory, in bytes (`CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES`).
    pub static_shared_memory: u32,
    /// The dynamic shared memory a launch may ask for now, in bytes
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`): 48 KB less the static shared memory
    /// until raised ([`Function::set_max_dynamic_shared_memory`]).
    pub max_dynamic_shared_memory: u32,
    /// Whether it may launch with clusters of more than 8 blocks
    /// (`CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`).
    pub non_portable_cluster_size_allowed: bool,
}

impl Function {
    /// The attributes that bound its launches.
    pub fn attributes(&self) -> Result<FunctionAttributes, DriverError> {
        let _current = self.module.context.make_current()?;
        let get = |attribute| {
            // SAFETY: the function is loaded (its `Arc` of the module keeps it so) and its
            // context is current.
            let value = unsafe { result::function::get_function_attribute(self.handle, attribute) };
            checked("cuFuncGetAttribute", value).map(|value| u32::try_from(value).unwrap_or(0))
        };
        use sys::CUfunction_attribute as Attribute;
        Ok(FunctionAttributes {
            static_shared_memory: get(Attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            max_dynamic_shared_memory: get(
                Attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            )?,
            // A driver older than clusters does not know the attribute; it allows none.
            non_portable_cluster_size_allowed: get(
                Attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
            )
            .is_ok_and(|allowed| allowed != 0),
        })
    }

    /// Lets its launches ask for up to `bytes` of dynamic shared memory
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`), which the driver caps at the
    /// device's opt-in maximum less the function's static shared memory.
    pub fn set_max_dynamic_shared_memory(&self, bytes: u32) -> Result<(), DriverError> {
        let _current = self.module.context.make_current()?;
        // SAFETY: the function is loaded and its context current; the driver checks the value.
        let result = unsafe {
            result::function::set_function_attribute(
                self.handle,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                i32::try_from(bytes).unwrap_or(i32::MAX),
            )
        };
        checked("cuFuncSetAttribute", result)
    }

    /// How many of its blocks of `block_threads` threads and `dynamic_shared_memory` bytes one
    /// multiprocessor holds at once (`cuOccupancyMaxActiveBlocksPerMultiprocessor`).
    pub fn max_active_blocks_per_multiprocessor(
        &self,
        block_threads: u32,
        dynamic_shared_memory: u32,
    ) -> Result<u32, DriverError> {
        let _current = self.module.context.make_current()?;
        // SAFETY: the function is loaded and its context current; the driver only computes.
        let blocks = unsafe {
            result::occupancy::max_active_block_per_multiprocessor(
                self.handle,
                i32::try_from(block_threads).unwrap_or(i32::MAX),
                dynamic_shared_memory as usize,
            )
        };
        checked("cuOccupancyMaxActiveBlocksPerMultiprocessor", blocks)
            .map(|blocks| u32::try_from(blocks).unwrap_or(0))
    }

    /// Launches the kernel with one byte image per parameter, in order. Returns once the
    /// launch is queued; errors of the kernel itself surface at the next synchronization.
    ///
    /// # Safety
    ///
    /// `params` must match the kernel's parameters one for one, in size and meaning: every
    /// pointer a device address the kernel may access as it does, over the whole range it
    /// accesses, and alive until the kernel finishes. A kernel given wrong pointers can write
    /// anywhere the device can reach, host memory included on systems with unified memory.
    /// `config.stream` must be 0 or a live stream of this function's context.
    pub unsafe fn launch(
        &self,
        config: &LaunchConfig,
        params: &[&[u8]],
    ) -> Result<(), DriverError> {
        let context = &self.module.context;
        let mut pointers: Vec<*mut std::ffi::c_void> = params
            .iter()
            .map(|param| param.as_ptr().cast_mut().cast())
            .collect();
        let _current = context.make_current()?;
        let [grid_x, grid_y, grid_z] = config.grid;
        let [block_x, block_y, block_z] = config.block;
        // SAFETY: the function is loaded (its `Arc` of the module keeps it so) in the current
        // context; `pointers` holds one pointer per parameter into `params`, which the driver
        // copies before returning (the caller vouches for their sizes and meaning, and for
        // the stream).
        let result = unsafe {
            result::launch_kernel(
                self.handle,
                (grid_x, grid_y, grid_z),
                (block_x, block_y, block_z),
                config.shared_mem_bytes as c_uint,
                config.stream as usize as sys::CUstream,
                &mut pointers,
            )
        };
        checked("cuLaunchKernel", result)
    }

    /// Launches the kernel as [`Function::launch`] does, with `attributes`: through
    /// `cuLaunchKernelEx` when there are any (captured into a CUDA graph like any launch),
    /// through `cuLaunchKernel` when there are none. A driver without `cuLaunchKernelEx` gets
    /// [`DriverError::Unsupported`] for a launch with attributes, before anything is queued.
    ///
    /// # Safety
    ///
    /// As [`Function::launch`]. The attributes are the driver's to check against the device.
    pub unsafe fn launch_with_attributes(
        &self,
        config: &LaunchConfig,
        attributes: &LaunchAttributes,
        params: &[&[u8]],
    ) -> Result<(), DriverError> {
        if attributes.is_empty() {
            // SAFETY: the caller upholds `launch`'s contract.
            return unsafe { self.launch(config, params) };
        }
        let context = &self.module.context;
        if !context.driver.launch_ex {
            return Err(DriverError::Unsupported {
                library: context.driver.library_name.clone(),
                symbol: LAUNCH_EX,
                needed_by: "launches with a cluster, cooperative, programmatic or priority \
                            attribute",
            });
        }
        let mut launch_attributes = launch_attributes(attributes);
        let mut pointers: Vec<*mut std::ffi::c_void> = params
            .iter()
            .map(|param| param.as_ptr().cast_mut().cast())
            .collect();
        let [grid_x, grid_y, grid_z] = config.grid;
        let [block_x, block_y, block_z] = config.block;
        let launch_config = sys::CUlaunchConfig {
            gridDimX: grid_x,
            gridDimY: grid_y,
            gridDimZ: grid_z,
            blockDimX: block_x,
            blockDimY: block_y,
            blockDimZ: block_z,
            sharedMemBytes: config.shared_mem_bytes as c_uint,
            hStream: config.stream as usize as sys::CUstream,
            attrs: launch_attributes.as_mut_ptr(),
            numAttrs: launch_attributes.len() as c_uint,
        };
        let _current = context.make_current()?;
        // SAFETY: the entry point exists (checked when the library loaded, and above); the
        // function is loaded in the current context; `launch_config` and the attributes it
        // points to live until the call returns, and the driver copies them; `pointers` holds
        // one pointer per parameter into `params`, copied before the call returns (the caller
        // vouches for their sizes and meaning, and for the stream).
        let status = unsafe {
            sys::cuLaunchKernelEx(
                &launch_config,
                self.handle,
                pointers.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        checked("cuLaunchKernelEx", status.result())
    }
}

/// `attributes` as the driver's array of launch attributes, one per attribute asked for.
fn launch_attributes(attributes: &LaunchAttributes) -> Vec<sys::CUlaunchAttribute> {
    use sys::CUlaunchAttributeID as Id;
    let mut list = Vec::with_capacity(4);
    let mut push = |id, set: &dyn Fn(&mut sys::CUlaunchAttributeValue)| {
        // All zeros, then the one member the id selects: the driver reads only that member.
        let mut value = sys::CUlaunchAttributeValue { pad: [0; 64] };
        set(&mut value);
        list.push(sys::CUlaunchAttribute {
            id,
            pad: [0; 4],
            value,
        });
    };
    if let Some([x, y, z]) = attributes.cluster {
        push(Id::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &|value| {
            value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x, y, z };
        });
    }
    if attributes.cooperative {
        push(Id::CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &|value| {
            value.cooperative = 1;
        });
    }
    if attributes.programmatic {
        push(
            Id::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            &|value| {
                value.programmaticStreamSerializationAllowed = 1;
            },
        );
    }
    if let Some(priority) = attributes.priority {
        push(Id::CU_LAUNCH_ATTRIBUTE_PRIORITY, &|value| {
            value.priority = priority;
        });
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_attributes_is_a_plain_launch() {
        assert!(LaunchAttributes::default().is_empty());
        assert!(launch_attributes(&LaunchAttributes::default()).is_empty());
        for attributes in [
            LaunchAttributes {
                cluster: Some([1, 1, 1]),
                ..LaunchAttributes::default()
            },
            LaunchAttributes {
                priority: Some(0),
                ..LaunchAttributes::default()
            },
        ] {
            assert!(!attributes.is_empty(), "{attributes:?}");
        }
    }

    #[test]
    fn launch_attributes_are_one_driver_attribute_each() {
        let list = launch_attributes(&LaunchAttributes {
            cluster: Some([2, 1, 3]),
            cooperative: true,
            programmatic: true,
            priority: Some(-2),
        });
        use sys::CUlaunchAttributeID as Id;
        let ids: Vec<Id> = list.iter().map(|attribute| attribute.id).collect();
        assert_eq!(
            ids,
            [
                Id::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                Id::CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
                Id::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                Id::CU_LAUNCH_ATTRIBUTE_PRIORITY,
            ]
        );
        // SAFETY: each member read is the one its id selects, written by `launch_attributes`.
        unsafe {
            let cluster = list[0].value.clusterDim;
            assert_eq!((cluster.x, cluster.y, cluster.z), (2, 1, 3));
            assert_eq!(list[1].value.cooperative, 1);
            assert_eq!(list[2].value.programmaticStreamSerializationAllowed, 1);
            assert_eq!(list[3].value.priority, -2);
            // The rest of the value is zero, as the driver expects of unused bytes.
            assert!(list[3].value.pad[4..].iter().all(|&byte| byte == 0));
        }
        let only_programmatic = launch_attributes(&LaunchAttributes {
            programmatic: true,
            ..LaunchAttributes::default()
        });
        assert_eq!(only_programmatic.len(), 1);
    }
}
