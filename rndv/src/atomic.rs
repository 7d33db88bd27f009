//! Atomic operations applied at the target, on little-endian byte images of the
//! target memory. The provider reads the target bytes, calls [`apply`], and writes
//! the result back under the endpoint lock, so rdmx atomics are atomic with
//! respect to each other (emulation over messages, like every software RDM).
//!
//! Datatypes and operations travel on the wire as rdmx's own codes
//! ([`Datatype::wire`], [`Op::wire`]), not libfabric's enum values: the
//! provider translates `enum fi_datatype` / `enum fi_op` at its boundary.
//! Complex and long-double types are not supported.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Datatype {
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    F32,
    F64,
}

impl Datatype {
    pub const ALL: [Datatype; 10] = [
        Datatype::I8,
        Datatype::U8,
        Datatype::I16,
        Datatype::U16,
        Datatype::I32,
        Datatype::U32,
        Datatype::I64,
        Datatype::U64,
        Datatype::F32,
        Datatype::F64,
    ];

    /// The datatype's code on the wire.
    pub fn wire(self) -> u8 {
        match self {
            Datatype::U8 => 1,
            Datatype::I8 => 2,
            Datatype::U16 => 3,
            Datatype::I16 => 4,
            Datatype::U32 => 5,
            Datatype::I32 => 6,
            Datatype::U64 => 7,
            Datatype::I64 => 8,
            Datatype::F32 => 9,
            Datatype::F64 => 10,
        }
    }

    pub fn from_wire(code: u8) -> Option<Datatype> {
        Datatype::ALL.into_iter().find(|d| d.wire() == code)
    }

    pub fn size(self) -> usize {
        match self {
            Datatype::I8 | Datatype::U8 => 1,
            Datatype::I16 | Datatype::U16 => 2,
            Datatype::I32 | Datatype::U32 | Datatype::F32 => 4,
            Datatype::I64 | Datatype::U64 | Datatype::F64 => 8,
        }
    }

    fn is_float(self) -> bool {
        matches!(self, Datatype::F32 | Datatype::F64)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Min,
    Max,
    Sum,
    Prod,
    Lor,
    Land,
    Bor,
    Band,
    Lxor,
    Bxor,
    Read,
    Write,
    Cswap,
    CswapNe,
    CswapLe,
    CswapLt,
    CswapGe,
    CswapGt,
    Mswap,
}

/// Which libfabric call family an operation belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// fi_atomic (no result returned).
    Write,
    /// fi_fetch_atomic (old value returned).
    Fetch,
    /// fi_compare_atomic (compare operand, old value returned).
    Compare,
}

impl Op {
    pub const ALL: [Op; 19] = [
        Op::Min,
        Op::Max,
        Op::Sum,
        Op::Prod,
        Op::Lor,
        Op::Land,
        Op::Bor,
        Op::Band,
        Op::Lxor,
        Op::Bxor,
        Op::Read,
        Op::Write,
        Op::Cswap,
        Op::CswapNe,
        Op::CswapLe,
        Op::CswapLt,
        Op::CswapGe,
        Op::CswapGt,
        Op::Mswap,
    ];

    /// The operation's code on the wire.
    pub fn wire(self) -> u8 {
        match self {
            Op::Sum => 1,
            Op::Prod => 2,
            Op::Min => 3,
            Op::Max => 4,
            Op::Lor => 5,
            Op::Land => 6,
            Op::Lxor => 7,
            Op::Bor => 8,
            Op::Band => 9,
            Op::Bxor => 10,
            Op::Read => 11,
            Op::Write => 12,
            Op::Cswap => 13,
            Op::CswapNe => 14,
            Op::CswapLe => 15,
            Op::CswapLt => 16,
            Op::CswapGe => 17,
            Op::CswapGt => 18,
            Op::Mswap => 19,
        }
    }

    pub fn from_wire(code: u8) -> Option<Op> {
        Op::ALL.into_iter().find(|o| o.wire() == code)
    }

    fn is_compare(self) -> bool {
        matches!(self, Op::Cswap | Op::CswapNe | Op::CswapLe | Op::CswapLt | Op::CswapGe | Op::CswapGt | Op::Mswap)
    }

    fn is_bitwise(self) -> bool {
        matches!(self, Op::Bor | Op::Band | Op::Bxor | Op::Mswap)
    }
}

/// Splits an atomic request's payload into operands and compare operands
/// (compare-family ops carry both, `Read` none): `None` when the length does not
/// match `bytes` of operands.
pub fn split_operands(op: Op, payload: &[u8], bytes: usize) -> Option<(&[u8], &[u8])> {
    match op {
        Op::Read => Some((&payload[..0], &payload[..0])),
        Op::Cswap | Op::CswapNe | Op::CswapLe | Op::CswapLt | Op::CswapGe | Op::CswapGt | Op::Mswap => {
            (payload.len() == 2 * bytes).then(|| payload.split_at(bytes))
        }
        _ => (payload.len() == bytes).then_some((payload, &payload[..0])),
    }
}

/// Whether `op` on `dt` is valid in `family` (the `fi_*atomicvalid` answer).
pub fn valid(family: Family, dt: Datatype, op: Op) -> bool {
    if op.is_bitwise() && dt.is_float() {
        return false;
    }
    match family {
        Family::Write => !op.is_compare() && op != Op::Read,
        Family::Fetch => !op.is_compare(),
        Family::Compare => op.is_compare(),
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AtomicError {
    #[error("operation not valid for this datatype")]
    Invalid,
    #[error("operand lengths do not match the target")]
    Length,
}

macro_rules! int_ops {
    ($t:ty, $op:expr, $cur:expr, $opd:expr, $cmp:expr) => {{
        let (c, o, k): ($t, $t, $t) = ($cur, $opd, $cmp);
        match $op {
            Op::Min => Some(c.min(o)),
            Op::Max => Some(c.max(o)),
            Op::Sum => Some(c.wrapping_add(o)),
            Op::Prod => Some(c.wrapping_mul(o)),
            Op::Lor => Some(((c != 0) || (o != 0)) as $t),
            Op::Land => Some(((c != 0) && (o != 0)) as $t),
            Op::Lxor => Some(((c != 0) ^ (o != 0)) as $t),
            Op::Bor => Some(c | o),
            Op::Band => Some(c & o),
            Op::Bxor => Some(c ^ o),
            Op::Read => None,
            Op::Write => Some(o),
            Op::Cswap => (c == k).then_some(o),
            Op::CswapNe => (c != k).then_some(o),
            Op::CswapLe => (k <= c).then_some(o),
            Op::CswapLt => (k < c).then_some(o),
            Op::CswapGe => (k >= c).then_some(o),
            Op::CswapGt => (k > c).then_some(o),
            Op::Mswap => Some((o & k) | (c & !k)),
        }
    }};
}

macro_rules! float_ops {
    ($t:ty, $op:expr, $cur:expr, $opd:expr, $cmp:expr) => {{
        let (c, o, k): ($t, $t, $t) = ($cur, $opd, $cmp);
        let b = |v: bool| if v { 1.0 as $t } else { 0.0 as $t };
        match $op {
            Op::Min => Some(c.min(o)),
            Op::Max => Some(c.max(o)),
            Op::Sum => Some(c + o),
            Op::Prod => Some(c * o),
            Op::Lor => Some(b((c != 0.0) || (o != 0.0))),
            Op::Land => Some(b((c != 0.0) && (o != 0.0))),
            Op::Lxor => Some(b((c != 0.0) ^ (o != 0.0))),
            Op::Read => None,
            Op::Write => Some(o),
            Op::Cswap => (c == k).then_some(o),
            Op::CswapNe => (c != k).then_some(o),
            Op::CswapLe => (k <= c).then_some(o),
            Op::CswapLt => (k < c).then_some(o),
            Op::CswapGe => (k >= c).then_some(o),
            Op::CswapGt => (k > c).then_some(o),
            Op::Bor | Op::Band | Op::Bxor | Op::Mswap => None,
        }
    }};
}

macro_rules! elementwise {
    ($t:ty, $kind:ident, $op:expr, $target:expr, $operand:expr, $compare:expr) => {{
        const N: usize = core::mem::size_of::<$t>();
        for i in 0..$target.len() / N {
            let r = i * N..(i + 1) * N;
            let get = |s: &[u8]| -> $t {
                let mut a = [0u8; N];
                if let Some(src) = s.get(r.clone()) {
                    a.copy_from_slice(src);
                }
                <$t>::from_le_bytes(a)
            };
            let cur = get($target);
            if let Some(new) = $kind!($t, $op, cur, get($operand), get($compare)) {
                $target[r].copy_from_slice(&new.to_le_bytes());
            }
        }
    }};
}

/// Applies `op` element-wise to `target` (the current target bytes, updated in
/// place) with `operand` (and `compare` for compare ops). The caller saves the old
/// bytes first if it must return them.
pub fn apply(dt: Datatype, op: Op, target: &mut [u8], operand: &[u8], compare: &[u8]) -> Result<(), AtomicError> {
    if op.is_bitwise() && dt.is_float() {
        return Err(AtomicError::Invalid);
    }
    let size = dt.size();
    if !target.len().is_multiple_of(size) || (op != Op::Read && operand.len() != target.len()) {
        return Err(AtomicError::Length);
    }
    if op.is_compare() && compare.len() != target.len() {
        return Err(AtomicError::Length);
    }
    match dt {
        Datatype::I8 => elementwise!(i8, int_ops, op, target, operand, compare),
        Datatype::U8 => elementwise!(u8, int_ops, op, target, operand, compare),
        Datatype::I16 => elementwise!(i16, int_ops, op, target, operand, compare),
        Datatype::U16 => elementwise!(u16, int_ops, op, target, operand, compare),
        Datatype::I32 => elementwise!(i32, int_ops, op, target, operand, compare),
        Datatype::U32 => elementwise!(u32, int_ops, op, target, operand, compare),
        Datatype::I64 => elementwise!(i64, int_ops, op, target, operand, compare),
        Datatype::U64 => elementwise!(u64, int_ops, op, target, operand, compare),
        Datatype::F32 => elementwise!(f32, float_ops, op, target, operand, compare),
        Datatype::F64 => elementwise!(f64, float_ops, op, target, operand, compare),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_codes_are_unique_and_roundtrip() {
        let mut seen = std::collections::HashSet::new();
        for d in Datatype::ALL {
            assert!(seen.insert(d.wire()));
            assert_eq!(Datatype::from_wire(d.wire()), Some(d));
        }
        seen.clear();
        for o in Op::ALL {
            assert!(seen.insert(o.wire()));
            assert_eq!(Op::from_wire(o.wire()), Some(o));
        }
        assert_eq!(Datatype::from_wire(0), None);
        assert_eq!(Op::from_wire(0), None);
    }
    use proptest::prelude::*;

    fn u64s(v: &[u64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn sum_cswap_mswap_and_float_max() {
        let mut t = u64s(&[5, 10]);
        apply(Datatype::U64, Op::Sum, &mut t, &u64s(&[1, 2]), &[]).unwrap();
        assert_eq!(t, u64s(&[6, 12]));
        apply(Datatype::U64, Op::Cswap, &mut t, &u64s(&[100, 200]), &u64s(&[6, 0])).unwrap();
        assert_eq!(t, u64s(&[100, 12]), "only the equal element swaps");
        apply(Datatype::U64, Op::Mswap, &mut t, &u64s(&[0xff, 0xff]), &u64s(&[0x0f, 0])).unwrap();
        assert_eq!(t, u64s(&[(100 & !0x0f) | 0x0f, 12]));
        let mut f: Vec<u8> = 1.5f64.to_le_bytes().to_vec();
        apply(Datatype::F64, Op::Max, &mut f, &2.5f64.to_le_bytes(), &[]).unwrap();
        assert_eq!(f64::from_le_bytes(f.try_into().unwrap()), 2.5);
        let mut i = (-3i32).to_le_bytes().to_vec();
        apply(Datatype::I32, Op::Min, &mut i, &(-7i32).to_le_bytes(), &[]).unwrap();
        assert_eq!(i32::from_le_bytes(i.clone().try_into().unwrap()), -7);
        assert_eq!(apply(Datatype::F32, Op::Bor, &mut [0; 4], &[0; 4], &[]), Err(AtomicError::Invalid));
        assert_eq!(apply(Datatype::U32, Op::Sum, &mut [0; 4], &[0; 8], &[]), Err(AtomicError::Length));
        let before = i.clone();
        apply(Datatype::I32, Op::Read, &mut i, &[], &[]).unwrap();
        assert_eq!(i, before, "read leaves the target alone");
    }

    #[test]
    fn validity_table() {
        assert!(valid(Family::Write, Datatype::U64, Op::Sum));
        assert!(!valid(Family::Write, Datatype::U64, Op::Cswap));
        assert!(valid(Family::Fetch, Datatype::U32, Op::Write));
        assert!(valid(Family::Compare, Datatype::U64, Op::Cswap));
        assert!(!valid(Family::Compare, Datatype::U64, Op::Sum));
        assert!(!valid(Family::Write, Datatype::F64, Op::Bxor));
    }

    proptest! {
        /// u32 sum/min/max/bxor agree with plain arithmetic, element by element.
        #[test]
        fn u32_ops_match_model(cur in proptest::collection::vec(any::<u32>(), 1..16), seed: u32) {
            let opd: Vec<u32> = cur.iter().map(|c| c.rotate_left(7) ^ seed).collect();
            for (op, f) in [
                (Op::Sum, (|a: u32, b: u32| a.wrapping_add(b)) as fn(u32, u32) -> u32),
                (Op::Min, |a, b| a.min(b)),
                (Op::Max, |a, b| a.max(b)),
                (Op::Bxor, |a, b| a ^ b),
            ] {
                let mut t: Vec<u8> = cur.iter().flat_map(|x| x.to_le_bytes()).collect();
                let o: Vec<u8> = opd.iter().flat_map(|x| x.to_le_bytes()).collect();
                apply(Datatype::U32, op, &mut t, &o, &[]).unwrap();
                let want: Vec<u8> = cur.iter().zip(&opd).flat_map(|(a, b)| f(*a, *b).to_le_bytes()).collect();
                prop_assert_eq!(t, want);
            }
        }
    }
}
