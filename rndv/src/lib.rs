//! # rndv — the rdmx message layer
//!
//! Sits on top of the `rdm` engine ("deliver these bytes to peer P reliably and in
//! order") and gives them libfabric's message semantics:
//!
//! * [`endpoint`]: [`Endpoint`], what the provider calls: it owns the device, the
//!   `rdm` engine and the message engine side by side, the transmit staging and the
//!   posted remote reads, and runs one progress round in a fixed order, and a
//!   close's linger;
//! * [`background`]: when a background thread progresses an endpoint (the
//!   provider owns the thread and asks this policy);
//! * [`engine`]: [`MsgEngine`], the protocol of each message (eager, rendezvous
//!   pulled by the receiver where the path can read remotely, pushed in granted
//!   windows where it cannot), RMA and atomics emulated as messages, peer failure;
//! * [`matching`]: tag matching between posted receives and arriving messages, with
//!   unexpected messages held until a receive is posted;
//! * [`wire`]: the packets of this layer, each kind's encoder beside its decoder
//!   ([`wire::msg`] is the header every message carries: operation, tag, CQ data);
//! * [`atomic`] and [`iov`]: atomic operations on bytes, and scatter/gather lists.
//!
//! Like the engine it is sans-IO and safe: time is an argument or comes from the
//! endpoint's [`Clock`], and application memory is reached only through the
//! [`Memory`] trait, which the provider implements over raw pointers.
#![forbid(unsafe_code)]

pub mod atomic;
pub mod background;
pub mod endpoint;
pub mod engine;
pub mod iov;
pub mod matching;
/// Whole endpoints on the simulated network (tests, benches, fuzz targets).
#[cfg(feature = "sim")]
pub mod sim;
pub mod wire;

pub use background::{BackgroundProgress, BackgroundStep};
pub use endpoint::{Clock, Endpoint, EndpointConfig, EndpointEvent, EndpointStats, MsgBytes, PeerStats, WaitOn};
pub use engine::{
    Access, Action, AtomicRequest, Completion, Config, Io, IoBuf, IoList, Memory, MsgEngine, OpError, OpKind, OpMeta,
    OutMsg, Path, PostError, ReadOutcome, RecvSpec, RegHandle, Registration, RegistrationError, Registrations,
    RmaTarget,
};
pub use matching::{Arrived, Matcher, RecvPost, Src};
pub use wire::msg::{MsgHeader, MsgKind, HEADER_LEN};
pub use wire::rendezvous::{FinStatus, RemoteIov, Rts};
pub use wire::rma::Status;
pub use wire::{Kind, Packet};
