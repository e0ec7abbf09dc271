//! TODO (eBPF helper)
