//! include.
