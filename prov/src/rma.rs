//! One-sided operations as the C entry points hand them to the endpoint; the
//! protocol (requests, checks at the target, answers) is `rndv`'s.
use crate::args::{UserBuf, UserIov};
use libfabric_sys as fi;
use rndv::atomic::{Datatype, Op};

/// libfabric's `enum fi_datatype` to rdmx's datatype (complex and long double:
/// none).
pub fn datatype_from_fi(v: fi::fi_datatype) -> Option<Datatype> {
    Some(match v {
        fi::FI_INT8 => Datatype::I8,
        fi::FI_UINT8 => Datatype::U8,
        fi::FI_INT16 => Datatype::I16,
        fi::FI_UINT16 => Datatype::U16,
        fi::FI_INT32 => Datatype::I32,
        fi::FI_UINT32 => Datatype::U32,
        fi::FI_INT64 => Datatype::I64,
        fi::FI_UINT64 => Datatype::U64,
        fi::FI_FLOAT => Datatype::F32,
        fi::FI_DOUBLE => Datatype::F64,
        _ => return None,
    })
}

/// libfabric's `enum fi_op` to rdmx's operation.
pub fn op_from_fi(v: fi::fi_op) -> Option<Op> {
    Some(match v {
        fi::FI_MIN => Op::Min,
        fi::FI_MAX => Op::Max,
        fi::FI_SUM => Op::Sum,
        fi::FI_PROD => Op::Prod,
        fi::FI_LOR => Op::Lor,
        fi::FI_LAND => Op::Land,
        fi::FI_BOR => Op::Bor,
        fi::FI_BAND => Op::Band,
        fi::FI_LXOR => Op::Lxor,
        fi::FI_BXOR => Op::Bxor,
        fi::FI_ATOMIC_READ => Op::Read,
        fi::FI_ATOMIC_WRITE => Op::Write,
        fi::FI_CSWAP => Op::Cswap,
        fi::FI_CSWAP_NE => Op::CswapNe,
        fi::FI_CSWAP_LE => Op::CswapLe,
        fi::FI_CSWAP_LT => Op::CswapLt,
        fi::FI_CSWAP_GE => Op::CswapGe,
        fi::FI_CSWAP_GT => Op::CswapGt,
        fi::FI_MSWAP => Op::Mswap,
        _ => return None,
    })
}

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
///
/// # Safety
/// As for [`UserBuf::new`].
pub unsafe fn one(ptr: usize, len: usize) -> UserIov {
    let mut v = UserIov { count: 1, ..UserIov::default() };
    // SAFETY: this function's contract.
    v.bufs[0] = unsafe { UserBuf::new(ptr, len) };
    v
}
