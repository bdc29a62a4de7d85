//! Privileged syscalls. (Placeholder: being written.)
