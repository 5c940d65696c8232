//! The shard chain: plan, protocol frames, transport, roles.
