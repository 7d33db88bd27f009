//! # rndv — the rdmx message layer
//!
//! Sits on top of the `rdm` engine ("deliver these bytes to peer P reliably and in
//! order") and gives them libfabric's message semantics: a small header per message
//! ([`header`]) carrying the operation, tag and remote CQ data, and tag matching
//! ([`matching`]) between posted receives and arriving messages, with unexpected
//! messages buffered until a receive is posted. Long messages to peers whose
//! memory the receiver can read go by rendezvous ([`rendezvous`]): only a
//! ready-to-send is matched, and the receiver pulls the bytes.
//!
//! Like the engine it is sans-IO and safe: it never touches application memory.
//! A match hands the provider the receive's token and the bytes to place; the
//! provider copies them into the user's buffer.
#![forbid(unsafe_code)]

pub mod atomic;
pub mod endpoint;
pub mod engine;
pub mod iov;
pub mod matching;
/// Whole endpoints on the simulated network (tests, benches, fuzz targets).
#[cfg(feature = "sim")]
pub mod sim;
pub mod wire;

pub use endpoint::{Clock, Endpoint, EndpointConfig, EndpointEvent, EndpointStats, MsgBytes, PeerStats, WaitOn};
pub use engine::{Access, Action, Completion, Config, IoBuf, IoList, Memory, MsgEngine, OpError, OpKind, OpMeta, Path, PostError, ReadOutcome, RecvSpec, RegHandle, Registration, RegistrationError, Registrations};
pub use matching::{Arrived, Matcher, RecvPost, Src};
pub use wire::msg::{MsgHeader, MsgKind, HEADER_LEN};
pub use wire::rendezvous::{FinStatus, RemoteIov, Rts};
pub use wire::rma::Status;
pub use wire::{Kind, Packet};
