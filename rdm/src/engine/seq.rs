//! Packet sequence numbers: a newtype with wrapping (serial-number)
//! comparison, so no code compares raw integers across the wrap.
/// A packet sequence number. Wraps at 2^32; ordering is defined only within
/// half the space (RFC 1982 serial-number arithmetic).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Psn(pub u32);

impl Psn {
    pub fn next(self) -> Psn {
        Psn(self.0.wrapping_add(1))
    }
    /// `n` numbers later (wrapping).
    pub fn plus(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n))
    }
    /// Signed distance `self - other`.
    pub fn diff(self, other: Psn) -> i32 {
        self.0.wrapping_sub(other.0) as i32
    }
    pub fn lt(self, other: Psn) -> bool {
        self.diff(other) < 0
    }
}
