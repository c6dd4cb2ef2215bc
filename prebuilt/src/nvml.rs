//! NVML (`libnvidia-ml.so.1`, the driver's management library): the visible GPUs' names and
//! compute capabilities, read without a CUDA context.
//!
//! `cuInit` in a process that later forks breaks CUDA in the child (a DataLoader worker), so
//! what runs at `import` (the extension modules' device check) and what `status()` says of a
//! module never initialise CUDA; NVML answers instead. Loaded with `libloading` at run time,
//! as [`crate::nvrtc`] is: a machine without the NVIDIA driver gets
//! [`NvmlError::NoLibrary`], never a panic.
//!
//! NVML numbers every GPU of the machine; CUDA numbers the ones `CUDA_VISIBLE_DEVICES` shows.
//! The mapping is torch's (`torch.cuda._parse_visible_devices`,
//! `_transform_uuid_to_ordinals`, `_device_count_nvml`), so kwheel's ordinal `n` is torch's
//! `cuda:n`:
//!
//! | `CUDA_VISIBLE_DEVICES` | CUDA ordinal `n` is NVML's device |
//! | --- | --- |
//! | unset | `n` (NVML's order, PCI bus order) |
//! | `2,0` (integers, `strtoul`-like: `1gpu` is 1) | the `n`th listed; a negative or non-number entry ends the list, a repeated one empties it, one past NVML's count ends it |
//! | `GPU-8a1f…,GPU-3c…` (UUIDs or unique prefixes) | the device whose UUID starts with the `n`th listed; an unknown or ambiguous one ends the list, a repeated one empties it |
//! | empty, or anything that names no device | none |
//! | `MIG-…` | not mapped ([`NvmlError::MigDevices`]) |
//!
//! CUDA's own order is fastest first unless `CUDA_DEVICE_ORDER=PCI_BUS_ID`; torch's NVML
//! path ignores that, and so does this one: on a machine with GPUs of different speeds and
//! neither variable set, ordinal `n` here is the `n`th GPU by PCI bus, which may not be the
//! device CUDA calls `n` (`docs/extensions.md`).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use crate::env::CUDA_VISIBLE_DEVICES_ENV;

/// The file name NVML is loaded from (the driver installs it in the loader's path).
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// One GPU the process sees, as NVML reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmlDevice {
    /// Its CUDA ordinal (torch's `cuda:n`).
    pub ordinal: u32,
    /// Its NVML index (`nvidia-smi`'s number).
    pub index: u32,
    /// Its name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// Its UUID (`GPU-8a1f…`).
    pub uuid: String,
    /// Its compute capability, `(9, 0)`.
    pub capability: (u32, u32),
}

impl NvmlDevice {
    /// `cuda:0 (NVIDIA H100 80GB HBM3, compute capability 9.0)`.
    pub fn describe(&self) -> String {
        format!(
            "cuda:{} ({}, compute capability {}.{})",
            self.ordinal, self.name, self.capability.0, self.capability.1
        )
    }
}

/// Why NVML could not say which GPUs the process sees.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// The library is not there: no NVIDIA driver (a CPU machine, a container without it).
    #[error("NVML ({library}) could not be loaded: no NVIDIA driver here")]
    NoLibrary {
        /// The file name looked for.
        library: &'static str,
        /// The dynamic loader's reason.
        #[source]
        source: libloading::Error,
    },
    /// The library lacks an entry point kwheel calls (a driver too old for it).
    #[error("NVML ({library}) has no `{symbol}`: the driver is too old")]
    Symbol {
        /// The file name.
        library: &'static str,
        /// The missing entry point.
        symbol: &'static str,
        /// The dynamic loader's reason.
        #[source]
        source: libloading::Error,
    },
    /// A call failed.
    #[error("NVML's `{call}` failed with nvmlReturn_t {code}")]
    Call {
        /// The entry point.
        call: &'static str,
        /// Its `nvmlReturn_t` (2: invalid argument, 9: driver not loaded, 999: unknown).
        code: i32,
    },
    /// `CUDA_VISIBLE_DEVICES` names MIG instances, which have no NVML device index; torch does
    /// not map them either.
    #[error("CUDA_VISIBLE_DEVICES={value} names MIG instances, which NVML's device list does not map to CUDA ordinals")]
    MigDevices {
        /// The variable's value.
        value: String,
    },
}

/// `CUDA_VISIBLE_DEVICES`, parsed as torch parses it (`_parse_visible_devices`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VisibleDevices {
    /// Unset: every device, in NVML's order.
    All,
    /// NVML indices in CUDA ordinal order, before trimming to the machine's count (empty: none).
    Indices(Vec<u32>),
    /// UUIDs or unique prefixes of them (`GPU-…`), in CUDA ordinal order.
    Uuids(Vec<String>),
    /// MIG instances (`MIG-…`), not mapped.
    Mig(String),
}

/// Parses `CUDA_VISIBLE_DEVICES` (`None`: unset) by torch's rules (the module docs' table).
pub fn parse_visible_devices(value: Option<&str>) -> VisibleDevices {
    let Some(value) = value else {
        return VisibleDevices::All;
    };
    for prefix in ["GPU-", "MIG-"] {
        if !value.starts_with(prefix) {
            continue;
        }
        if prefix == "MIG-" {
            return VisibleDevices::Mig(value.to_owned());
        }
        let mut listed: Vec<String> = Vec::new();
        for entry in value.split(',') {
            if listed.iter().any(|seen| seen == entry) {
                return VisibleDevices::Uuids(Vec::new());
            }
            if !entry.starts_with(prefix) {
                break;
            }
            listed.push(entry.to_owned());
        }
        return VisibleDevices::Uuids(listed);
    }
    let mut listed: Vec<u32> = Vec::new();
    for entry in value.split(',') {
        let Some(index) = leading_index(entry.trim()) else {
            break;
        };
        if listed.contains(&index) {
            return VisibleDevices::Indices(Vec::new());
        }
        listed.push(index);
    }
    VisibleDevices::Indices(listed)
}

/// The non-negative number an entry starts with (`strtoul`-like: `1gpu` is 1, `+2` is 2),
/// or `None` for a negative or non-number entry, which ends the list.
fn leading_index(entry: &str) -> Option<u32> {
    let (negative, digits) = match entry.as_bytes().first() {
        Some(b'-') => (true, &entry[1..]),
        Some(b'+') => (false, &entry[1..]),
        _ => (false, entry),
    };
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    let number: u64 = digits[..end].parse().ok()?;
    match negative && number != 0 {
        true => None,
        false => u32::try_from(number).ok(),
    }
}

/// The NVML index of each CUDA ordinal, in ordinal order, for a machine whose NVML devices
/// have `uuids` (one per NVML index, so `uuids.len()` is NVML's count): torch's
/// `_device_count_nvml` and `_transform_uuid_to_ordinals`. MIG instances map to none.
pub fn visible_indices(visible: &VisibleDevices, uuids: &[String]) -> Vec<u32> {
    let count = u32::try_from(uuids.len()).unwrap_or(u32::MAX);
    match visible {
        VisibleDevices::All => (0..count).collect(),
        VisibleDevices::Indices(listed) => listed
            .iter()
            .copied()
            .take_while(|index| *index < count)
            .collect(),
        VisibleDevices::Uuids(listed) => {
            let mut indices: Vec<u32> = Vec::new();
            for prefix in listed {
                let mut matching =
                    (0..count).filter(|index| uuids[*index as usize].starts_with(prefix.as_str()));
                let (Some(index), None) = (matching.next(), matching.next()) else {
                    // Unknown or ambiguous: the list ends here.
                    break;
                };
                if indices.contains(&index) {
                    return Vec::new();
                }
                indices.push(index);
            }
            indices
        }
        VisibleDevices::Mig(_) => Vec::new(),
    }
}

/// Every GPU this process sees through CUDA, in CUDA ordinal order, read from NVML without a
/// CUDA context; `CUDA_VISIBLE_DEVICES` as torch reads it. `Ok(vec![])` when it shows none.
pub fn visible_devices() -> Result<Vec<NvmlDevice>, NvmlError> {
    let value = std::env::var(CUDA_VISIBLE_DEVICES_ENV).ok();
    let visible = parse_visible_devices(value.as_deref());
    match &visible {
        VisibleDevices::Mig(value) => {
            return Err(NvmlError::MigDevices {
                value: value.clone(),
            })
        }
        VisibleDevices::Indices(listed) if listed.is_empty() => return Ok(Vec::new()),
        VisibleDevices::Uuids(listed) if listed.is_empty() => return Ok(Vec::new()),
        _ => {}
    }
    let nvml = Nvml::open()?;
    let count = nvml.device_count()?;
    let handles = (0..count)
        .map(|index| nvml.device(index))
        .collect::<Result<Vec<_>, _>>()?;
    let uuids = handles
        .iter()
        .map(|handle| nvml.uuid(*handle))
        .collect::<Result<Vec<_>, _>>()?;
    visible_indices(&visible, &uuids)
        .into_iter()
        .zip(0..)
        .map(|(index, ordinal)| {
            let handle = handles[index as usize];
            Ok(NvmlDevice {
                ordinal,
                index,
                name: nvml.name(handle)?,
                uuid: uuids[index as usize].clone(),
                capability: nvml.capability(handle)?,
            })
        })
        .collect()
}

/// `nvmlReturn_t`: 0 is success.
type NvmlReturn = c_int;
/// `nvmlDevice_t`, an opaque handle valid until `nvmlShutdown`.
type DeviceHandle = *mut c_void;

/// NVML's longest name and UUID (`NVML_DEVICE_NAME_V2_BUFFER_SIZE`,
/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE`), with room to spare.
const TEXT_BUFFER: usize = 128;

/// The entry points, resolved once.
struct Api {
    shutdown: unsafe extern "C" fn() -> NvmlReturn,
    device_count: unsafe extern "C" fn(*mut c_uint) -> NvmlReturn,
    device_by_index: unsafe extern "C" fn(c_uint, *mut DeviceHandle) -> NvmlReturn,
    capability: unsafe extern "C" fn(DeviceHandle, *mut c_int, *mut c_int) -> NvmlReturn,
    name: unsafe extern "C" fn(DeviceHandle, *mut c_char, c_uint) -> NvmlReturn,
    uuid: unsafe extern "C" fn(DeviceHandle, *mut c_char, c_uint) -> NvmlReturn,
}

/// NVML loaded and initialised; shut down (and unloaded) when dropped.
struct Nvml {
    api: Api,
    // The function pointers in `api` point into it: it outlives them, as a field dropped after
    // `Drop::drop` has called `nvmlShutdown`.
    _library: libloading::Library,
}

impl Nvml {
    /// Loads the library and calls `nvmlInit_v2`.
    fn open() -> Result<Nvml, NvmlError> {
        // SAFETY: loading NVML runs no initialiser with preconditions of ours; the driver's
        // library is made to be opened by any process (torch and nvidia-smi do).
        let library = unsafe { libloading::Library::new(NVML_LIBRARY) }.map_err(|source| {
            NvmlError::NoLibrary {
                library: NVML_LIBRARY,
                source,
            }
        })?;
        // Each `symbol` call below: the types are the C signatures of `nvml.h` (CUDA 12/13),
        // and `library` is kept in the returned `Nvml`, outliving every pointer.
        // SAFETY: as just said.
        let init: unsafe extern "C" fn() -> NvmlReturn =
            unsafe { symbol(&library, "nvmlInit_v2") }?;
        let api = Api {
            // SAFETY: as above.
            shutdown: unsafe { symbol(&library, "nvmlShutdown") }?,
            // SAFETY: as above.
            device_count: unsafe { symbol(&library, "nvmlDeviceGetCount_v2") }?,
            // SAFETY: as above.
            device_by_index: unsafe { symbol(&library, "nvmlDeviceGetHandleByIndex_v2") }?,
            // SAFETY: as above.
            capability: unsafe { symbol(&library, "nvmlDeviceGetCudaComputeCapability") }?,
            // SAFETY: as above.
            name: unsafe { symbol(&library, "nvmlDeviceGetName") }?,
            // SAFETY: as above.
            uuid: unsafe { symbol(&library, "nvmlDeviceGetUUID") }?,
        };
        // SAFETY: `nvmlInit_v2` takes nothing; it is reference-counted, so a process where
        // torch or pynvml holds NVML too is fine, and each init is matched by the shutdown in
        // `Drop`.
        check("nvmlInit_v2", unsafe { init() })?;
        Ok(Nvml {
            api,
            _library: library,
        })
    }

    fn device_count(&self) -> Result<u32, NvmlError> {
        let mut count: c_uint = 0;
        // SAFETY: NVML is initialised; `count` is a valid place for one unsigned int.
        check("nvmlDeviceGetCount_v2", unsafe {
            (self.api.device_count)(&mut count)
        })?;
        Ok(count)
    }

    fn device(&self, index: u32) -> Result<DeviceHandle, NvmlError> {
        let mut handle: DeviceHandle = std::ptr::null_mut();
        // SAFETY: NVML is initialised; `handle` is a valid place for one handle, which stays
        // valid until `nvmlShutdown` (in `Drop`, after every use).
        check("nvmlDeviceGetHandleByIndex_v2", unsafe {
            (self.api.device_by_index)(index, &mut handle)
        })?;
        Ok(handle)
    }

    fn capability(&self, handle: DeviceHandle) -> Result<(u32, u32), NvmlError> {
        let (mut major, mut minor): (c_int, c_int) = (0, 0);
        // SAFETY: `handle` came from `nvmlDeviceGetHandleByIndex_v2` of this initialised NVML;
        // both pointers are valid places for one int.
        check("nvmlDeviceGetCudaComputeCapability", unsafe {
            (self.api.capability)(handle, &mut major, &mut minor)
        })?;
        Ok((major.max(0) as u32, minor.max(0) as u32))
    }

    fn name(&self, handle: DeviceHandle) -> Result<String, NvmlError> {
        self.text("nvmlDeviceGetName", self.api.name, handle)
    }

    fn uuid(&self, handle: DeviceHandle) -> Result<String, NvmlError> {
        self.text("nvmlDeviceGetUUID", self.api.uuid, handle)
    }

    fn text(
        &self,
        call: &'static str,
        function: unsafe extern "C" fn(DeviceHandle, *mut c_char, c_uint) -> NvmlReturn,
        handle: DeviceHandle,
    ) -> Result<String, NvmlError> {
        let mut buffer = [0 as c_char; TEXT_BUFFER];
        // SAFETY: `handle` is this NVML's; the buffer holds `TEXT_BUFFER` chars, the length
        // passed, and NVML writes a NUL-terminated string of at most that many.
        check(call, unsafe {
            function(handle, buffer.as_mut_ptr(), TEXT_BUFFER as c_uint)
        })?;
        // Terminated in any case: a driver that filled the buffer without a NUL still reads
        // as text up to its last byte.
        buffer[TEXT_BUFFER - 1] = 0;
        // SAFETY: the buffer is NUL-terminated (just above) and lives for this call.
        let text = unsafe { CStr::from_ptr(buffer.as_ptr()) };
        Ok(text.to_string_lossy().into_owned())
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: matches the successful `nvmlInit_v2` of `open`; no handle is used after it.
        // Its result is of no use: nothing is left to release.
        let _ = unsafe { (self.api.shutdown)() };
    }
}

/// `Ok` for `NVML_SUCCESS`, else the call and its code.
fn check(call: &'static str, code: NvmlReturn) -> Result<(), NvmlError> {
    match code {
        0 => Ok(()),
        code => Err(NvmlError::Call { call, code }),
    }
}

/// Resolves one entry point and copies the function pointer out of the library.
///
/// # Safety
///
/// `T` must be the function's true C signature, and the pointer must not be called after
/// `library` is unloaded.
unsafe fn symbol<T: Copy>(
    library: &libloading::Library,
    name: &'static str,
) -> Result<T, NvmlError> {
    // SAFETY: the caller guarantees `T` is the symbol's signature and keeps `library` loaded.
    let symbol = unsafe { library.get::<T>(name) };
    symbol
        .map(|symbol| *symbol)
        .map_err(|source| NvmlError::Symbol {
            library: NVML_LIBRARY,
            symbol: name,
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuids() -> Vec<String> {
        [
            "GPU-8a1f0000-0000-0000-0000-000000000000",
            "GPU-3c200000-0000-0000-0000-000000000000",
            "GPU-3c210000-0000-0000-0000-000000000000",
            "GPU-d4000000-0000-0000-0000-000000000000",
        ]
        .map(String::from)
        .to_vec()
    }

    fn mapped(value: Option<&str>) -> Vec<u32> {
        visible_indices(&parse_visible_devices(value), &uuids())
    }

    #[test]
    fn unset_shows_every_device_in_nvml_order() {
        assert_eq!(parse_visible_devices(None), VisibleDevices::All);
        assert_eq!(mapped(None), [0, 1, 2, 3]);
        assert_eq!(
            visible_indices(&VisibleDevices::All, &[]),
            Vec::<u32>::new()
        );
    }

    #[test]
    fn integers_are_read_as_strtoul_reads_them_and_trimmed_to_the_machine() {
        assert_eq!(mapped(Some("2,0")), [2, 0]);
        assert_eq!(mapped(Some(" 3 , 1")), [3, 1]);
        assert_eq!(mapped(Some("1gpu,+2")), [1, 2]);
        // A negative or non-number entry ends the list.
        assert_eq!(mapped(Some("1,-1,2")), [1]);
        assert_eq!(mapped(Some("0,x,2")), [0]);
        // One past the machine's count ends it too.
        assert_eq!(mapped(Some("1,7,2")), [1]);
        // A repeated one empties it.
        assert_eq!(mapped(Some("0,1,0")), Vec::<u32>::new());
    }

    #[test]
    fn empty_or_invalid_shows_no_device() {
        for value in ["", "-1", "none", ",0", "NoDevFiles"] {
            assert_eq!(mapped(Some(value)), Vec::<u32>::new(), "{value:?}");
        }
    }

    #[test]
    fn uuids_and_unique_prefixes_map_to_their_devices() {
        assert_eq!(
            mapped(Some(
                "GPU-d4000000-0000-0000-0000-000000000000,GPU-8a1f0000-0000-0000-0000-000000000000"
            )),
            [3, 0]
        );
        assert_eq!(mapped(Some("GPU-3c21,GPU-8a")), [2, 0]);
        // An ambiguous prefix (two devices start with `GPU-3c2`) or an unknown one ends the list.
        assert_eq!(mapped(Some("GPU-8a,GPU-3c2,GPU-d4")), [0]);
        assert_eq!(mapped(Some("GPU-ff,GPU-8a")), Vec::<u32>::new());
        // A non-UUID entry ends the list; a repeated one empties it, as do two prefixes of one
        // device.
        assert_eq!(mapped(Some("GPU-8a,1")), [0]);
        assert_eq!(mapped(Some("GPU-8a,GPU-8a")), Vec::<u32>::new());
        assert_eq!(mapped(Some("GPU-8a,GPU-8a1f")), Vec::<u32>::new());
    }

    #[test]
    fn mig_instances_are_not_mapped() {
        assert_eq!(
            parse_visible_devices(Some("MIG-1234")),
            VisibleDevices::Mig("MIG-1234".into())
        );
        assert_eq!(mapped(Some("MIG-1234")), Vec::<u32>::new());
    }

    #[test]
    fn no_library_is_an_error_not_a_panic() {
        // On a machine with the driver this reads the real devices; without it, the typed
        // error. Either way nothing panics.
        match visible_devices() {
            Ok(devices) => {
                for (ordinal, device) in devices.iter().enumerate() {
                    assert_eq!(device.ordinal as usize, ordinal);
                }
            }
            Err(error) => assert!(!error.to_string().is_empty()),
        }
    }
}
