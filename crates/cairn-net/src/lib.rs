//! Cairn's transports and RPC.
//!
//! Everything above this crate speaks in byte strings it encodes and decodes itself with
//! `cairn_core::codec`; this crate only moves them:
//!
//! - [`frame`]: length-prefixed framing (`u32` big-endian length, then the payload) with a
//!   configurable size limit, as blocking reads and writes over any `Read`/`Write` and as
//!   a sans-IO incremental [`FrameDecoder`]. A length over the limit is a clear error,
//!   and a length field never makes the reader allocate more than the bytes that
//!   actually arrived.
//! - [`rpc`]: a blocking TCP request/response server (a thread per connection, driven by a
//!   `Fn(&[u8]) -> Vec<u8>` handler) and [`Client`]. Connections are pipelined: a client
//!   may send many requests before reading any response, and responses come back in
//!   request order, so no request ids are needed. The server stops gracefully through its
//!   [`ServerHandle`].
//!
//! A connection starts with a 5-byte preamble each way ([`rpc::PREAMBLE`]: `CRPC` and the
//! protocol version), so a peer speaking anything else is refused at once.

#![warn(missing_docs)]

pub mod frame;
pub mod rpc;

pub use frame::{DEFAULT_MAX_FRAME, FrameDecoder, read_frame, write_frame};
pub use rpc::{
    Client, ClientConfig, Reserve, SITE_CONNECTIONS_FACTOR, ServerConfig, ServerHandle, peer_group,
    peer_site, serve, serve_listener, serve_listener_reserving, serve_reserving,
};
