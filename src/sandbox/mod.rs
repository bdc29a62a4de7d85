//! Sandboxes. (Placeholder: being written.)
