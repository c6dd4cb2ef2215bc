//! toolchain.
