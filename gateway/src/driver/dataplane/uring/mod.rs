//! The io_uring engine (`engine`: ring and pool set-up, multishot receives, one
//! `io_uring_enter` per round) and its executor (`sqe_backend`: batches as SQEs in
//! registered pool buffers).

pub mod engine;
pub mod sqe_backend;
