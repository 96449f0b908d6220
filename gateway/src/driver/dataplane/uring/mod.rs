//! The io_uring engine (`engine`: ring and pool set-up, multishot receives, one
//! `io_uring_enter` per round) and its executor (`backend`: batches as SQEs in
//! registered pool buffers).

pub mod backend;
pub mod engine;
