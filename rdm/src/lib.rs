//! # rdm — reliable datagrams for rdmx
//!
//! * The **engine** ([`engine`] and its modules `wire`, `seq`, `recovery`,
//!   `congestion`, `reassembly`; its methods by part in `peers`, `send`,
//!   `direct`, `transmit` and `receive`): sans-IO. It owns per-peer state (the
//!   peer's incarnation, learnt from its packets: there is no handshake;
//!   sequence numbers, SACK, retransmission, the receive window the peer
//!   advertises, congestion window, segmentation and reassembly) and is a pure
//!   function of its inputs: time comes in as an argument ([`time::Instant`]),
//!   datagrams come in through `handle_datagram`, and everything it wants to
//!   send or report is pulled with `poll_transmit`, `poll_timeout` and
//!   `poll_event`. No sockets, no clock, no `unsafe`: this is what makes the
//!   simulator tests deterministic.
//! * The **device seam** ([`device`]): the [`Device`] trait and the types a
//!   device and the engine exchange, plus the sans-IO table of lazily made RC
//!   connections ([`device::rc`]). The devices themselves (UDP, shared memory,
//!   verbs UD, EFA SRD, `auto`, the fault decorator) are the `devices` crate,
//!   the only one with system calls and rdma-core besides the provider.
//! * The **simulator** (`sim`, `simnet`: the `sim` feature, tests only).
//!
//! The message layer (`rndv`) drives an engine over a device: it drains
//! `device.recv_batch` into the engine (`handle_datagram`, or
//! `handle_datagram_lending`, which lends a whole message of one DIRECT
//! datagram back from the device's buffer instead of copying it), and
//! `engine.poll_transmit` into `device.send_batch`. `prov/tests/crate_graph.rs`
//! holds the layering.
#![forbid(unsafe_code)]

pub mod device;
pub mod engine;
pub mod rng;
/// The deterministic network simulator (tests only: the `sim` feature).
#[cfg(feature = "sim")]
pub mod sim;
/// The simulated network as a device under whole endpoints (tests only).
#[cfg(feature = "sim")]
pub mod simnet;
pub mod time;

pub use device::{DevAddr, Device, DeviceCaps, DeviceError, DeviceExt, InputProbe};
pub use time::Instant;
