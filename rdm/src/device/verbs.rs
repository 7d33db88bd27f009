//! The verbs UD device: one unreliable-datagram queue pair per endpoint over
//! libibverbs (Soft-RoCE, RoCE NICs, InfiniBand HCAs).
//!
//! # API (for the provider's integration)
//!
//! * [`VerbsConfig`] `{ iface, ah_cache, sq_depth, rq_depth }`: `iface` names a
//!   netdev (`"eth0"`, `"dummy0"`), an RDMA device (`"rxe0"`, `"mlx5_0"`) or an
//!   IP address of a netdev (picks the RoCE v2 GID of that address); `None`:
//!   the RDMA device whose netdev the UDP device would choose
//!   ([`super::iface::default_choice`]), else the first active port of any
//!   device. `ah_cache` 0 = the device's `max_ah` capped at
//!   [`DEFAULT_AH_CACHE`]; the depths 0 = the defaults.
//! * [`VerbsContext::open`]`(&VerbsConfig) -> Result<VerbsContext, DeviceError>`:
//!   one per libfabric domain. Opens the device and one protection domain
//!   (shared, through an `Arc`, by every queue it opens and by its
//!   registrars). Implements [`DeviceContext`]: `open(&OpenSpec)` gives a
//!   `Box<dyn Device>` ([`VerbsContext::open_device`] gives the concrete
//!   [`VerbsDevice`], which has `stats`); `registrar()` is always `Some`.
//!   [`VerbsContext::available`]`()` says whether any RDMA device exists
//!   (cheap: lists devices, opens none). Accessors: `device_name()`,
//!   `port()`, `netdev()`, `gid()`, `gid_index()`, `lid()`, `mtu()`.
//! * [`VerbsDevice`] implements [`Device`]: caps = unreliable, unordered,
//!   `mtu` = the port's active MTU in bytes, `remote_read` false (UD cannot
//!   read; `post_read` returns `Unsupported`), `gso` false, `registration`
//!   true, `max_inline` = the QP's `max_inline_data`. `wait_fd` is the
//!   completion channel's fd (non-blocking): call `prepare_wait` before each
//!   sleep. `poll_unreachable` reports destinations whose send completed in
//!   error or whose address handle could not be created.
//! * Address: `DevAddr::Raw(RawAddr)` of family [`RawAddr::FAMILY_VERBS_UD`],
//!   22 bytes = GID (16, network order as in the GID table) ++ QPN (u32 LE)
//!   ++ LID (u16 LE). On RoCE the LID is 0; on InfiniBand (no GRH) the GID is
//!   all zeros and the LID names the port. [`ud_addr`]`(gid, qpn, lid)` builds
//!   one, [`parse_ud_addr`]`(&DevAddr) -> Option<([u8; 16], u32, u16)>` reads
//!   one back (`None` for any other family or length). The Q_Key is not in
//!   the address: every endpoint of a job derives the same one from
//!   `OpenSpec::job_key` ([`qkey_for`]); the NIC drops other jobs' packets.
//! * Registration: the registrar's `register(addr, len, access)` takes
//!   libfabric access bits ([`FI_READ`], [`FI_WRITE`], [`FI_RECV`],
//!   [`FI_SEND`], [`FI_REMOTE_READ`], [`FI_REMOTE_WRITE`], the values of
//!   `rdma/fabric.h`) and returns the key `(rkey as u64) << 32 | lkey as u64`;
//!   [`mr_keys`]`(key) -> (lkey, rkey)` splits it. A [`LocalBuf`] of a local
//!   read target carries this key (the device takes the low half); a peer's
//!   remote read names the high half. `deregister(key)` takes the same key.
//!   Registrations are of the context's PD, valid on every queue it opens.
//! * Transmit buffers: `transmit_buffers(count, len)` allocates and registers
//!   them (one MR per buffer); a datagram whose bytes lie inside one is sent
//!   from it without a copy. Keep them alive as long as the device (the
//!   endpoint does): the registration stays until the device drops. Other
//!   datagrams go inline (up to `max_inline`) or through a registered bounce
//!   slot (`stats.bounce_copies`).
