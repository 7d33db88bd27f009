//! The arguments the C entry points hand to the endpoint (the runtime in
//! `core.rs`): application buffers, and what a send or a receive carries.
//! Plain data, below the runtime and the fid objects.
use rndv::{IoBuf, IoList, MsgKind};

/// A piece of application memory the provider writes received data into. The
/// application owns it and guarantees it stays valid until the receive completes
/// (libfabric's contract for posted buffers).
#[derive(Clone, Copy, Debug, Default)]
pub struct UserBuf {
    ptr: usize,
    len: usize,
}

impl UserBuf {
    /// # Safety
    /// `ptr..ptr+len` is application memory that stays valid (and, for a
    /// receive or read target, unaliased) as long as libfabric's contract for
    /// the operation requires: everything downstream dereferences it.
    pub unsafe fn new(ptr: usize, len: usize) -> UserBuf {
        UserBuf { ptr, len }
    }

    pub fn ptr(&self) -> usize {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

const MAX_IOV: usize = crate::info::IOV_LIMIT;

#[derive(Clone, Copy, Debug, Default)]
pub struct UserIov {
    pub bufs: [UserBuf; MAX_IOV],
    pub count: usize,
}

impl UserIov {
    pub fn total(&self) -> usize {
        self.bufs[..self.count].iter().map(|b| b.len).sum()
    }
}

impl UserIov {
    /// The same buffers as the message engine's gather/scatter list.
    pub fn io(&self) -> IoList {
        let mut l = IoList { count: self.count, ..IoList::default() };
        for (o, b) in l.bufs.iter_mut().zip(&self.bufs[..self.count]) {
            *o = IoBuf { addr: b.ptr as u64, len: b.len as u64 };
        }
        l
    }
}

/// What a send carries.
pub struct SendArgs<'a> {
    pub kind: MsgKind,
    pub dest: u64,
    pub payload: &'a [&'a [u8]],
    /// Per buffer: the application's descriptor (`fi_mr_desc`), 0 for none.
    pub desc: [usize; MAX_IOV],
    pub tag: u64,
    pub data: Option<u64>,
    pub context: usize,
    pub flags: u64,
    /// An `fi_inject*` call: never generates a completion.
    pub inject: bool,
}

/// What a receive accepts.
pub struct RecvArgs {
    pub kind: MsgKind,
    pub src: u64,
    pub iov: UserIov,
    pub tag: u64,
    pub ignore: u64,
    pub context: usize,
    pub flags: u64,
}
