//! Cubin inspection.
