//! Operators: one family per file, the Rust side of a WGSL kernel next to its CPU reference.
pub mod attention;
pub mod elementwise;
pub mod norm;
pub mod quant;
pub mod rope;
pub mod select;
pub mod short_conv;
