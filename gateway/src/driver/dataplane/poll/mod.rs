//! The portable engine (`engine`: `poll(2)`, `recvmmsg`, `read`) and its executor
//! (`backend`: `sendmsg`/`sendmmsg`/`write` at the end of a round).

pub mod backend;
pub mod engine;
