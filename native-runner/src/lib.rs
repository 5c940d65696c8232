//! The native side of webshard: the pieces behind the `runner` commands, kept in a library so
//! integration tests and later commands (shard donors, `/signal`) can reuse them.

pub mod info;
pub mod serve;
