//! TODO (lab helper)
