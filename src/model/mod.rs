//! Model architectures: one file per architecture, each a forward over a layer range.
