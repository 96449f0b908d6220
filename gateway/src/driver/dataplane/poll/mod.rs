//! The portable engine (`engine`: `poll(2)`, `recvmmsg`, `read`) and its executor
//! (`syscall_backend`: `sendmsg`/`sendmmsg`/`write` at the end of a round).

pub mod engine;
pub mod syscall_backend;
