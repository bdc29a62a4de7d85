//! NVIDIA GPU discovery and injection. (Placeholder: being written.)
