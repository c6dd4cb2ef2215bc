//! Release machinery for prebuilt-kernel bundles: wheel writing, the manylinux audit, wheel
//! verification and the release checklist. It reads bundles through `prebuilt` and never
//! builds kernels itself.
#![deny(missing_docs)]
