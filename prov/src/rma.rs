//! One-sided operations as the C entry points hand them to the endpoint; the
//! protocol (requests, checks at the target, answers) is `rndv`'s.
use crate::core::{UserBuf, UserIov};

/// What an RMA or atomic call asks for.
pub struct RmaArgs<'a> {
    pub peer_addr: u64,
    pub key: u64,
    pub addr: u64,
    pub context: usize,
    pub flags: u64,
    /// An `inject` call: no completion.
    pub inject: bool,
    /// Data to write / operands.
    pub payload: &'a [&'a [u8]],
    /// Compare operands (compare atomics).
    pub compare: &'a [&'a [u8]],
    /// Destination of read data / fetched values.
    pub result: UserIov,
}

/// One user buffer as an iov (helper for the C entry points).
pub fn one(ptr: usize, len: usize) -> UserIov {
    let mut v = UserIov { count: 1, ..UserIov::default() };
    v.bufs[0] = UserBuf { ptr, len };
    v
}
