//! The GPU: device and capabilities, buffers, pipeline cache, command recording.
