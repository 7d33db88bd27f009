//! # devices — the datagram devices under rdmx's engine
//!
//! Each device moves whole datagrams between endpoints and knows nothing about
//! reliability; it implements the seam the engine drives, [`rdm::device::Device`]
//! (the trait and the types it speaks live beside the engine, in `rdm`, so the
//! engine, the simulator and the message layer build without any of this).
//!
//! * [`udp`]: a UDP socket (GSO/GRO where the kernel has them): any Linux host.
//! * [`shm`]: per-endpoint shared-memory rings for peers on the same host, with
//!   `process_vm_readv` remote reads.
//! * [`verbs`]: verbs UD queue pairs on any RDMA NIC (Soft-RoCE included), with
//!   RDMA-read rendezvous over lazily made RC connections (the connection table,
//!   sans-IO, is [`rdm::device::rc`]).
//! * [`efa`]: EFA SRD through efadv.
//! * [`composite`]: `auto` ([`composite::AutoDevice`]): shared memory to peers
//!   on this host; to the others, on a host with an RDMA device, its queue
//!   pair where the peer's address carries one on a fabric that reaches it,
//!   else UDP ([`composite::NetPair`]); on a host without one, UDP. The RDMA
//!   device is EFA SRD on a host with an EFA device (which then opens no verbs
//!   UD: verbs UD does not work on EFA), else verbs UD. The peer's address
//!   picks the way ([`addr::RdmxAddr::route`]); the provider opens the halves
//!   (`prov/src/devices.rs`).
//! * [`fault`]: a decorator that drops, duplicates, reorders and corrupts
//!   (`FI_RDMX_FAULT_*`).
//! * [`iface`], [`host`]: which interface and address UDP and verbs bind, and
//!   this host's identity (which peers shared memory can reach).
//! * [`addr`]: the endpoint address, one slot per device, and which device
//!   reaches which peer.
//! * [`ib`]: what verbs and EFA share of rdma-core, the address-handle cache
//!   included.
//! * [`probe`]: which RDMA devices this host offers, asked once per process.
//!
//! This crate and `prov` are the only ones with system calls, `unsafe` and
//! rdma-core; every `unsafe` block says why it is sound (`// SAFETY:`). Each
//! module declares its own: `#![forbid(unsafe_code)]` where it has none, and
//! where it has some, `#![allow(unsafe_code)]` with a line of its module doc
//! that begins "Unsafe here:" and says what for (`prov/tests/crate_graph.rs`
//! holds every module to one or the other). The crate denies unsafe code by
//! default, so a new module has none until it says otherwise.
#![deny(unsafe_code)]

pub mod addr;
pub mod composite;
pub mod efa;
pub mod fault;
pub mod host;
pub mod ib;
pub mod iface;
pub mod probe;
pub mod shm;
pub mod udp;
pub mod verbs;
