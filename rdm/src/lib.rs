//! # rdm — reliable datagrams for rdmx
//!
//! Two halves, kept apart on purpose:
//!
//! * the **engine** ([`engine`] and its modules `wire`, `seq`, `recovery`, `reassembly`): sans-IO. It owns per-peer
//!   state (handshake, sequence numbers, SACK, retransmission, credits, congestion
//!   window, segmentation and reassembly) and is a pure function of its inputs: time
//!   comes in as an argument ([`time::Instant`]), datagrams come in through
//!   `handle_datagram`, and everything it wants to send or report is pulled with
//!   `poll_transmit`, `poll_timeout` and `poll_event`. No sockets, no clock, no
//!   `unsafe`: this is what makes the simulator tests deterministic.
//! * the **devices** ([`device`]): the only place with syscalls and `unsafe`. A
//!   device moves datagrams (UDP socket, shared-memory ring, verbs UD queue pair,
//!   EFA SRD queue pair, `auto` combining them per peer) and knows nothing about
//!   reliability.
//!
//! `rndv::Endpoint` glues the two: it drains `device.recv_batch` into
//! `engine.handle_datagram`, and `engine.poll_transmit` into `device.send_batch`.
#![deny(unsafe_code)]

pub mod device;
pub mod engine;
/// The deterministic network simulator (tests only: the `sim` feature).
#[cfg(feature = "sim")]
pub mod sim;
/// The simulated network as a device under whole endpoints (tests only).
#[cfg(feature = "sim")]
pub mod simnet;
pub mod time;

pub use device::{DevAddr, Device, DeviceCaps, DeviceError};
pub use time::Instant;
