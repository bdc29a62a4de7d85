//! Root filesystems: the read-only lower layers of every sandbox.
//! (Placeholder: being written; see the issue for the API.)
