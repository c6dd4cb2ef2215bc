//! compiler.
