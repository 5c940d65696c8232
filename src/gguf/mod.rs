//! GGUF format: header, metadata, tensor infos, and the ranged sources bytes come from.
