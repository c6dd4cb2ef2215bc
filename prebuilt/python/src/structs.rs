//! A `ctypes.Structure` argument checked field by field against the layout the loaded
//! variant's compile computed (the manifest's `structs`).
//!
//! A structure says which C struct it is with a class attribute, `_kwheel_struct_ =
//! "ConvParamsBase"`; without one it is checked by its size only, as any buffer. Each field
//! the manifest names must be a field of the class (ctypes' field descriptor) at the offset and
//! of the size the compiler computed for this arch; the first that is not is an
//! `ArgumentError` naming the kernel, the struct, the field, and both offsets and sizes.

use std::collections::BTreeMap;

use prebuilt::index::StructLayout;
use pyo3::prelude::*;

use crate::errors::ArgumentError;

/// The class attribute that names a structure's C struct.
const STRUCT_ATTRIBUTE: &str = "_kwheel_struct_";

/// Checks `value` (argument `index` of `entry`) against `structs` when it names its C struct.
pub(crate) fn check_struct_argument(
    kernel: &str,
    entry: &str,
    index: usize,
    value: &Bound<'_, PyAny>,
    structs: &BTreeMap<String, StructLayout>,
) -> PyResult<()> {
    let class = value.get_type();
    let Ok(name) = class.getattr(STRUCT_ATTRIBUTE) else {
        return Ok(());
    };
    let name: String = name.extract()?;
    let at = format!("argument {index} of `{entry}` (kernel `{kernel}`)");
    let Some(layout) = structs.get(&name) else {
        if structs.is_empty() {
            // A JIT-compiled variant records no layouts: its size is still checked.
            return Ok(());
        }
        return Err(ArgumentError::new_err(format!(
            "{at} declares `{STRUCT_ATTRIBUTE} = \"{name}\"`, but the kernel's manifest names no \
             such struct (its `structs`: {})",
            structs.keys().cloned().collect::<Vec<_>>().join(", ")
        )));
    };
    for field in &layout.fields {
        let Ok(descriptor) = class.getattr(field.name.as_str()) else {
            return Err(ArgumentError::new_err(format!(
                "{at}: struct `{name}` has field `{}` at offset {} of {} bytes, but `{}` has no \
                 such field",
                field.name,
                field.offset,
                field.size,
                class.name()?
            )));
        };
        let offset: u64 = descriptor.getattr("offset")?.extract()?;
        let size: u64 = descriptor.getattr("size")?.extract()?;
        if (offset, size) != (field.offset, field.size) {
            return Err(ArgumentError::new_err(format!(
                "{at}: field `{}` of struct `{name}` is at offset {offset} with {size} bytes in \
                 `{}`, but the kernel was compiled with it at offset {} with {} bytes",
                field.name,
                class.name()?,
                field.offset,
                field.size
            )));
        }
    }
    Ok(())
}

/// `check_struct_layout(value, layouts, kernel, entry, index)`: the launch's check of one
/// structure argument against `layouts` (`Kernel.structs`' shape: name → `{"size", "align",
/// "fields": [(name, offset, size)]}`), without a GPU; raises `ArgumentError`.
#[pyfunction]
#[pyo3(signature = (value, layouts, kernel="kernel", entry="entry", index=0))]
pub(crate) fn check_struct_layout(
    value: &Bound<'_, PyAny>,
    layouts: &Bound<'_, PyAny>,
    kernel: &str,
    entry: &str,
    index: usize,
) -> PyResult<()> {
    let mut structs = BTreeMap::new();
    let layouts: BTreeMap<String, Bound<'_, PyAny>> = layouts.extract()?;
    for (name, layout) in layouts {
        let fields: Vec<(String, u64, u64)> = layout.get_item("fields")?.extract()?;
        structs.insert(
            name,
            StructLayout {
                size: layout.get_item("size")?.extract()?,
                align: layout.get_item("align")?.extract()?,
                fields: fields
                    .into_iter()
                    .map(|(name, offset, size)| prebuilt::index::FieldLayout { name, offset, size })
                    .collect(),
            },
        );
    }
    check_struct_argument(kernel, entry, index, value, &structs)
}

/// `Kernel.structs`: each struct's layout as a dict.
pub(crate) fn structs_dict<'py>(
    py: Python<'py>,
    structs: &BTreeMap<String, StructLayout>,
) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    let dict = pyo3::types::PyDict::new(py);
    for (name, layout) in structs {
        let entry = pyo3::types::PyDict::new(py);
        entry.set_item("size", layout.size)?;
        entry.set_item("align", layout.align)?;
        let fields: Vec<(String, u64, u64)> = layout
            .fields
            .iter()
            .map(|field| (field.name.clone(), field.offset, field.size))
            .collect();
        entry.set_item("fields", fields)?;
        dict.set_item(name, entry)?;
    }
    Ok(dict)
}
