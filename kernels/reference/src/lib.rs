//! CPU references for the kernels in `kernels/`.
