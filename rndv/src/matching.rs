//! Tag matching between posted receives and arrived messages.
//!
//! Receives the application posted that no message matched yet, and messages that
//! arrived before a matching receive ("unexpected"), both binned by source (see
//! [`Matcher`]): a new receive takes the oldest unexpected message it accepts, a
//! new message the oldest posted receive that accepts it, so that matching cost does
//! not grow with the number of peers. The bins are vectors indexed by the
//! engine's dense peer id: an arriving message finds its source's bin with one
//! index, not a hash. Together with the engine's per-peer in-order
//! delivery this gives MPI's non-overtaking rule.
//!
//! Untagged (`FI_MSG`) and tagged (`FI_TAGGED`) traffic match only within their
//! own kind.
use crate::wire::msg::MsgKind;
use rdm::engine::PeerId;
use std::collections::{BTreeMap, VecDeque};

/// Which senders a receive accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Src {
    Any,
    Peer(PeerId),
}

/// A receive the application posted. `token` is the provider's handle for the
/// user buffer and context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvPost {
    pub token: u64,
    pub kind: MsgKind,
    pub src: Src,
    pub tag: u64,
    pub ignore: u64,
    /// A multi-receive buffer: stays posted after a match until the provider
    /// releases it with [`Matcher::cancel`].
    pub persistent: bool,
}

/// A message that arrived (header parsed, payload owned).
#[derive(Debug, PartialEq, Eq)]
pub struct Arrived {
    pub peer: PeerId,
    pub kind: MsgKind,
    pub tag: u64,
    pub data: Option<u64>,
    /// The whole rdm message; the payload starts at `offset`.
    pub msg: Vec<u8>,
    pub offset: usize,
    /// A long message announced by a ready-to-send: the bytes are still in the
    /// sender's memory and `payload()` is empty.
    pub rndv: Option<crate::Rts>,
}

impl Arrived {
    pub fn payload(&self) -> &[u8] {
        if self.rndv.is_some() {
            return &[];
        }
        self.msg.get(self.offset..).unwrap_or(&[])
    }

    /// The message's length, whether it arrived whole or was announced.
    pub fn len(&self) -> usize {
        match &self.rndv {
            Some(r) => r.total as usize,
            None => self.payload().len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl RecvPost {
    fn accepts(&self, peer: PeerId, kind: MsgKind, tag: u64) -> bool {
        self.kind == kind
            && match self.src {
                Src::Any => true,
                Src::Peer(p) => p == peer,
            }
            && (kind == MsgKind::Msg || (self.tag | self.ignore) == (tag | self.ignore))
    }
}

/// Posted receives and unexpected messages, binned by source so that matching
/// cost does not grow with the number of peers.
///
/// Every entry gets a sequence number from one counter. A message from peer P
/// can only match receives posted for P or for any source: the oldest candidate
/// of P's bin and of the wildcard list are compared by sequence number, which
/// preserves posting order between the two. A receive for one source searches
/// only that source's unexpected messages; a wildcard receive walks the
/// unexpected messages in arrival order (a global index).
#[derive(Debug, Default)]
pub struct Matcher {
    seq: u64,
    /// Receives directed at one source, by its peer id.
    posted_by_src: Bins<RecvPost>,
    posted_any: VecDeque<(u64, RecvPost)>,
    posted_count: usize,
    unexpected_by_src: Bins<Arrived>,
    /// Arrival order of unexpected messages: seq -> source.
    unexpected_order: BTreeMap<u64, PeerId>,
    unexpected_bytes: usize,
}

/// Queues of sequence-numbered entries, one per peer, indexed by its dense
/// id (grown on first use of an id; empty bins stay, so that a busy peer's
/// queue is not made again per message).
#[derive(Debug)]
struct Bins<T>(Vec<VecDeque<(u64, T)>>);

impl<T> Default for Bins<T> {
    fn default() -> Self {
        Bins(Vec::new())
    }
}

impl<T> Bins<T> {
    #[inline]
    fn get(&self, peer: PeerId) -> Option<&VecDeque<(u64, T)>> {
        self.0.get(peer.index() as usize)
    }

    #[inline]
    fn get_mut(&mut self, peer: PeerId) -> Option<&mut VecDeque<(u64, T)>> {
        self.0.get_mut(peer.index() as usize)
    }

    /// `peer`'s bin, made (with those of every lower id) if it had none.
    fn bin(&mut self, peer: PeerId) -> &mut VecDeque<(u64, T)> {
        let i = peer.index() as usize;
        if self.0.len() <= i {
            self.0.resize_with(i + 1, VecDeque::new);
        }
        &mut self.0[i]
    }

    /// Every non-empty bin with its peer.
    fn iter(&self) -> impl Iterator<Item = (PeerId, &VecDeque<(u64, T)>)> {
        self.0.iter().enumerate().filter(|(_, q)| !q.is_empty()).map(|(i, q)| (PeerId::from_index(i as u32), q))
    }
}

/// The position and sequence number of the oldest entry of `q` that `pred`
/// accepts. The oldest is tried alone first: receives posted in the order
/// their messages come (the common case) match at the front, and a walk of a
/// `VecDeque` costs several times a look at its front.
#[inline]
fn first_match<T>(q: &VecDeque<(u64, T)>, pred: impl Fn(&T) -> bool) -> Option<(usize, u64)> {
    let (s, x) = q.front()?;
    if pred(x) {
        return Some((0, *s));
    }
    q.iter().enumerate().skip(1).find(|(_, (_, x))| pred(x)).map(|(i, (s, _))| (i, *s))
}

impl Matcher {
    pub fn new() -> Self {
        Self::default()
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Finds the oldest unexpected message `recv` accepts: (source, index in
    /// its bin).
    fn find_unexpected(&self, recv: &RecvPost) -> Option<(PeerId, usize)> {
        // Nothing unexpected (the usual case of pre-posted receives): no bin to look at.
        if self.unexpected_order.is_empty() {
            return None;
        }
        match recv.src {
            Src::Peer(p) => {
                let bin = self.unexpected_by_src.get(p)?;
                first_match(bin, |m| recv.accepts(m.peer, m.kind, m.tag)).map(|(i, _)| (p, i))
            }
            Src::Any => {
                for (&seq, &peer) in &self.unexpected_order {
                    let bin = self.unexpected_by_src.get(peer)?;
                    if let Some(i) = bin.iter().position(|(s, m)| *s == seq && recv.accepts(m.peer, m.kind, m.tag)) {
                        return Some((peer, i));
                    }
                }
                None
            }
        }
    }

    fn remove_unexpected(&mut self, peer: PeerId, i: usize) -> Option<Arrived> {
        let bin = self.unexpected_by_src.get_mut(peer)?;
        let (seq, m) = bin.remove(i)?;
        self.unexpected_order.remove(&seq);
        self.unexpected_bytes -= m.msg.len();
        Some(m)
    }

    /// Posts a receive. Returns the oldest unexpected message it matches (the
    /// receive is then complete), or queues it.
    #[inline]
    pub fn post(&mut self, recv: RecvPost) -> Option<Arrived> {
        if let Some(m) = self.take_unexpected(&recv) {
            return Some(m);
        }
        self.post_only(recv);
        None
    }

    /// A message arrived: returns the oldest posted receive it matches (a
    /// persistent one stays posted), or keeps the message as unexpected
    /// (returning `None`).
    pub fn arrive(&mut self, msg: Arrived) -> Option<(RecvPost, Arrived)> {
        if let Some(r) = self.match_posted(msg.peer, msg.kind, msg.tag) {
            return Some((r, msg));
        }
        let seq = self.next_seq();
        self.unexpected_bytes += msg.msg.len();
        self.unexpected_order.insert(seq, msg.peer);
        self.unexpected_by_src.bin(msg.peer).push_back((seq, msg));
        None
    }

    /// Takes the oldest posted receive a message from `peer` of `kind` and
    /// `tag` matches (a persistent one stays posted), if any; the unexpected
    /// queue is not involved (datagram endpoints drop what nothing awaits).
    pub fn match_posted(&mut self, peer: PeerId, kind: MsgKind, tag: u64) -> Option<RecvPost> {
        let accepts = |r: &RecvPost| r.accepts(peer, kind, tag);
        let in_any = if self.posted_any.is_empty() { None } else { first_match(&self.posted_any, accepts) };
        // The source's bin, by index (this runs for every arriving message).
        if let Some(q) = self.posted_by_src.get_mut(peer) {
            if let Some((i, seq)) = first_match(q, accepts) {
                if in_any.is_none_or(|(_, any_seq)| seq < any_seq) {
                    if q[i].1.persistent {
                        return Some(q[i].1);
                    }
                    self.posted_count -= 1;
                    return if i == 0 { q.pop_front() } else { q.remove(i) }.map(|(_, r)| r);
                }
            }
        }
        let (i, _) = in_any?;
        if self.posted_any[i].1.persistent {
            return Some(self.posted_any[i].1);
        }
        self.posted_count -= 1;
        if i == 0 { self.posted_any.pop_front() } else { self.posted_any.remove(i) }.map(|(_, r)| r)
    }

    /// The oldest unexpected message `probe` would match, left in place (FI_PEEK).
    pub fn peek(&self, probe: &RecvPost) -> Option<&Arrived> {
        let (peer, i) = self.find_unexpected(probe)?;
        self.unexpected_by_src.get(peer).and_then(|b| b.get(i)).map(|(_, m)| m)
    }

    /// Removes and returns the oldest unexpected message `probe` matches, without
    /// posting anything (FI_PEEK|FI_CLAIM, FI_PEEK|FI_DISCARD, multi-receive).
    #[inline]
    pub fn take_unexpected(&mut self, probe: &RecvPost) -> Option<Arrived> {
        // Nothing unexpected (the usual case of pre-posted receives): no call.
        if self.unexpected_order.is_empty() {
            return None;
        }
        let (peer, i) = self.find_unexpected(probe)?;
        self.remove_unexpected(peer, i)
    }

    /// Queues a receive without searching the unexpected queue (the caller
    /// already did, e.g. for a multi-receive buffer).
    pub fn post_only(&mut self, recv: RecvPost) {
        let seq = self.next_seq();
        self.posted_count += 1;
        match recv.src {
            Src::Peer(p) => self.posted_by_src.bin(p).push_back((seq, recv)),
            Src::Any => self.posted_any.push_back((seq, recv)),
        }
    }

    /// Removes a posted receive (fi_cancel). Returns it if it was still posted.
    pub fn cancel(&mut self, token: u64) -> Option<RecvPost> {
        if let Some(i) = self.posted_any.iter().position(|(_, r)| r.token == token) {
            self.posted_count -= 1;
            return self.posted_any.remove(i).map(|(_, r)| r);
        }
        let peer = self.posted_by_src.iter().find(|(_, q)| q.iter().any(|(_, r)| r.token == token)).map(|(p, _)| p)?;
        let q = self.posted_by_src.get_mut(peer)?;
        let i = q.iter().position(|(_, r)| r.token == token)?;
        let r = q.remove(i).map(|(_, r)| r);
        self.posted_count -= 1;
        r
    }

    /// Finds a posted receive without removing it.
    pub fn find_posted(&self, pred: impl Fn(&RecvPost) -> bool) -> Option<&RecvPost> {
        self.posted_any
            .iter()
            .map(|(_, r)| r)
            .find(|r| pred(r))
            .or_else(|| self.posted_by_src.iter().flat_map(|(_, q)| q.iter().map(|(_, r)| r)).find(|r| pred(r)))
    }

    pub fn posted_len(&self) -> usize {
        self.posted_count
    }

    pub fn unexpected_len(&self) -> usize {
        self.unexpected_order.len()
    }

    /// Bytes held for unexpected messages (the provider applies back-pressure on it).
    pub fn unexpected_bytes(&self) -> usize {
        self.unexpected_bytes
    }

    /// Removes the receives directed at `peer` only (the peer failed: they can
    /// never match), oldest first. Wildcard receives stay: another peer may
    /// still satisfy them.
    pub fn take_posted_from(&mut self, peer: PeerId) -> Vec<RecvPost> {
        let Some(q) = self.posted_by_src.get_mut(peer) else { return Vec::new() };
        self.posted_count -= q.len();
        q.drain(..).map(|(_, r)| r).collect()
    }

    /// Drops everything (endpoint close); returns the posted receives.
    pub fn drain_posted(&mut self) -> Vec<RecvPost> {
        self.posted_count = 0;
        let mut v: Vec<(u64, RecvPost)> = self.posted_any.drain(..).collect();
        for q in &mut self.posted_by_src.0 {
            v.extend(q.drain(..));
        }
        v.sort_by_key(|(s, _)| *s);
        v.into_iter().map(|(_, r)| r).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn take_posted_from_removes_only_that_peers_directed_receives() {
        let mut m = Matcher::new();
        let post = |token, src| RecvPost { token, kind: MsgKind::Tagged, src, tag: 0, ignore: 0, persistent: false };
        m.post_only(post(1, Src::Peer(PeerId::from_index(3))));
        m.post_only(post(2, Src::Any));
        m.post_only(post(3, Src::Peer(PeerId::from_index(4))));
        m.post_only(post(4, Src::Peer(PeerId::from_index(3))));
        let taken: Vec<u64> = m.take_posted_from(PeerId::from_index(3)).iter().map(|r| r.token).collect();
        assert_eq!(taken, [1, 4]);
        assert_eq!(m.posted_len(), 2);
        assert!(m.take_posted_from(PeerId::from_index(3)).is_empty());
        let rest: Vec<u64> = m.drain_posted().iter().map(|r| r.token).collect();
        assert_eq!(rest, [2, 3]);
    }

    fn msg(peer: u32, kind: MsgKind, tag: u64, id: u8) -> Arrived {
        Arrived { peer: PeerId::from_index(peer), kind, tag, data: None, msg: vec![id], offset: 0, rndv: None }
    }

    #[test]
    fn posted_first_then_unexpected_in_order() {
        let mut m = Matcher::new();
        let any = |token, tag, ignore| RecvPost {
            token,
            kind: MsgKind::Tagged,
            src: Src::Any,
            tag,
            ignore,
            persistent: false,
        };
        assert!(m.post(any(1, 5, 0)).is_none());
        let (r, a) = m.arrive(msg(0, MsgKind::Tagged, 5, 10)).unwrap();
        assert_eq!((r.token, a.msg[0]), (1, 10));
        // Two unexpected with tags 7 and 8; a wildcard receive takes the oldest.
        assert!(m.arrive(msg(0, MsgKind::Tagged, 7, 11)).is_none());
        assert!(m.arrive(msg(1, MsgKind::Tagged, 8, 12)).is_none());
        assert_eq!(m.post(any(2, 0, u64::MAX)).unwrap().msg[0], 11);
        // Directed receive skips other peers.
        let directed = RecvPost {
            token: 3,
            kind: MsgKind::Tagged,
            src: Src::Peer(PeerId::from_index(2)),
            tag: 8,
            ignore: 0,
            persistent: false,
        };
        assert!(m.post(directed).is_none());
        assert_eq!(m.unexpected_len(), 1);
        // Kinds never cross.
        assert!(m.arrive(msg(2, MsgKind::Msg, 8, 13)).is_none());
        assert_eq!(m.cancel(3).map(|r| r.token), Some(3));
        assert_eq!(m.cancel(3), None);
    }

    #[test]
    fn peek_take_and_persistent_posts() {
        let mut m = Matcher::new();
        let probe =
            RecvPost { token: 0, kind: MsgKind::Tagged, src: Src::Any, tag: 0, ignore: u64::MAX, persistent: false };
        assert!(m.peek(&probe).is_none());
        assert!(m.arrive(msg(0, MsgKind::Tagged, 4, 1)).is_none());
        assert!(m.arrive(msg(0, MsgKind::Tagged, 5, 2)).is_none());
        assert_eq!(m.peek(&probe).map(|a| a.msg[0]), Some(1));
        assert_eq!(m.unexpected_len(), 2, "peek leaves the message");
        assert_eq!(m.take_unexpected(&probe).map(|a| a.msg[0]), Some(1));
        assert_eq!(m.unexpected_bytes(), 1);
        // A persistent (multi-receive) post matches several messages.
        let multi = RecvPost { token: 9, kind: MsgKind::Msg, src: Src::Any, tag: 0, ignore: 0, persistent: true };
        m.post_only(multi);
        assert_eq!(m.arrive(msg(1, MsgKind::Msg, 0, 3)).map(|(r, _)| r.token), Some(9));
        assert_eq!(m.arrive(msg(1, MsgKind::Msg, 0, 4)).map(|(r, _)| r.token), Some(9));
        assert_eq!(m.posted_len(), 1);
        assert_eq!(m.cancel(9).map(|r| r.token), Some(9));
        assert!(m.arrive(msg(1, MsgKind::Msg, 0, 5)).is_none());
    }

    #[derive(Clone, Debug)]
    enum Op {
        Post { src: Option<u32>, tag: u64, ignore: u64 },
        Arrive { peer: u32, tag: u64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (proptest::option::of(0u32..3), 0u64..4, prop_oneof![Just(0u64), Just(1), Just(u64::MAX)])
                .prop_map(|(src, tag, ignore)| Op::Post { src, tag, ignore }),
            (0u32..3, 0u64..4).prop_map(|(peer, tag)| Op::Arrive { peer, tag }),
        ]
    }

    proptest! {
        /// The matcher agrees with a brute-force model: every message is matched by
        /// the oldest compatible receive / every receive takes the oldest compatible
        /// message, and nothing is lost or duplicated.
        #[test]
        fn agrees_with_model(ops in proptest::collection::vec(op(), 0..200)) {
            let mut m = Matcher::new();
            let mut model_posted: Vec<RecvPost> = Vec::new();
            let mut model_unexp: Vec<(u32, u64, u64)> = Vec::new();
            let mut next = 0u64;
            for o in ops {
                next += 1;
                match o {
                    Op::Post { src, tag, ignore } => {
                        let r = RecvPost { token: next, kind: MsgKind::Tagged, src: src.map(|p| Src::Peer(PeerId::from_index(p))).unwrap_or(Src::Any), tag, ignore, persistent: false };
                        let want = model_unexp.iter().position(|(p, t, _)| r.accepts(PeerId::from_index(*p), MsgKind::Tagged, *t));
                        let got = m.post(r);
                        match want {
                            Some(i) => { let (_, _, id) = model_unexp.remove(i); prop_assert_eq!(got.map(|a| a.data), Some(Some(id))); }
                            None => { prop_assert!(got.is_none()); model_posted.push(r); }
                        }
                    }
                    Op::Arrive { peer, tag } => {
                        let a = Arrived { peer: PeerId::from_index(peer), kind: MsgKind::Tagged, tag, data: Some(next), msg: vec![], offset: 0, rndv: None };
                        let want = model_posted.iter().position(|r| r.accepts(PeerId::from_index(peer), MsgKind::Tagged, tag));
                        let got = m.arrive(a);
                        match want {
                            Some(i) => { let r = model_posted.remove(i); prop_assert_eq!(got.map(|(g, _)| g.token), Some(r.token)); }
                            None => { prop_assert!(got.is_none()); model_unexp.push((peer, tag, next)); }
                        }
                    }
                }
            }
            prop_assert_eq!(m.posted_len(), model_posted.len());
            prop_assert_eq!(m.unexpected_len(), model_unexp.len());
        }
    }
}
