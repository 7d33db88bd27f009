//! The message and tagged operation tables of an endpoint (`fi_send`,
//! `fi_recv`, `fi_tsend`, ... and their `v`, `msg`, `inject` and `data`
//! forms): each validates the application's arguments and hands one typed
//! request to the endpoint's runtime ([`crate::core`]).
use crate::args::{RecvArgs, SendArgs, UserIov};
use crate::entry::{entry, non_null};
use crate::ep::{descs, one_desc, single, user_iov, Ctx, Desc, DescV, Ep};
use crate::error::{Error, Result};
use crate::info;
use libfabric_sys as fi;
use rndv::MsgKind;

pub(crate) static MSG_OPS: fi::fi_ops_msg = fi::fi_ops_msg {
    size: std::mem::size_of::<fi::fi_ops_msg>(),
    recv: Some(msg_recv),
    recvv: Some(msg_recvv),
    recvmsg: Some(msg_recvmsg),
    send: Some(msg_send),
    sendv: Some(msg_sendv),
    sendmsg: Some(msg_sendmsg),
    inject: Some(msg_inject),
    senddata: Some(msg_senddata),
    injectdata: Some(msg_injectdata),
};

pub(crate) static TAGGED_OPS: fi::fi_ops_tagged = fi::fi_ops_tagged {
    size: std::mem::size_of::<fi::fi_ops_tagged>(),
    recv: Some(tagged_recv),
    recvv: Some(tagged_recvv),
    recvmsg: Some(tagged_recvmsg),
    send: Some(tagged_send),
    sendv: Some(tagged_sendv),
    sendmsg: Some(tagged_sendmsg),
    inject: Some(tagged_inject),
    senddata: Some(tagged_senddata),
    injectdata: Some(tagged_injectdata),
};

#[allow(clippy::too_many_arguments)]
fn do_send(
    ep: &Ep,
    kind: MsgKind,
    iov: UserIov,
    desc: [usize; info::IOV_LIMIT],
    dest: u64,
    tag: u64,
    data: Option<u64>,
    context: Ctx,
    flags: Option<u64>,
    inject: bool,
) -> Result<isize> {
    let mut st = ep.shared.lock();
    let flags = flags.unwrap_or(st.profile.tx_op_flags);
    let mut slices: [&[u8]; info::IOV_LIMIT] = [&[]; info::IOV_LIMIT];
    for (s, b) in slices.iter_mut().zip(&iov.bufs[..iov.count]) {
        if !b.is_empty() {
            // SAFETY: a UserBuf is the application's buffer of `len` bytes (its
            // constructor's contract), valid for the call.
            *s = unsafe { std::slice::from_raw_parts(b.ptr() as *const u8, b.len()) };
        }
    }
    st.send(SendArgs {
        kind,
        dest,
        payload: &slices[..iov.count],
        desc,
        tag,
        data,
        context: context as usize,
        flags,
        inject,
    })?;
    Ok(0)
}

#[allow(clippy::too_many_arguments)] // the union of the fi_recv family's arguments
fn do_recv(
    ep: &Ep,
    kind: MsgKind,
    iov: UserIov,
    src: u64,
    tag: u64,
    ignore: u64,
    context: Ctx,
    flags: Option<u64>,
) -> Result<isize> {
    let mut st = ep.shared.lock();
    let flags = flags.unwrap_or(st.profile.rx_op_flags);
    let supported =
        (fi::FI_COMPLETION | fi::FI_MORE | fi::FI_MULTI_RECV | fi::FI_PEEK) as u64 | fi::FI_CLAIM | fi::FI_DISCARD;
    if flags & !supported != 0 {
        return Err(Error::BadFlags);
    }
    st.post_recv(RecvArgs { kind, src, iov, tag, ignore, context: context as usize, flags })?;
    Ok(0)
}

const SEND_MSG_FLAGS: u64 = (fi::FI_COMPLETION
    | fi::FI_INJECT
    | fi::FI_INJECT_COMPLETE
    | fi::FI_TRANSMIT_COMPLETE
    | fi::FI_DELIVERY_COMPLETE
    | fi::FI_REMOTE_CQ_DATA
    | fi::FI_MORE
    | fi::FI_FENCE) as u64;

/// The `fi_msg` / `fi_msg_tagged` fields the two-sided `*msg` calls read.
trait TwoSidedMsg {
    fn parts(&self) -> (*const fi::iovec, usize, u64, Ctx, u64, u64, u64);
    fn desc(&self) -> DescV;
}

impl TwoSidedMsg for fi::fi_msg {
    fn parts(&self) -> (*const fi::iovec, usize, u64, Ctx, u64, u64, u64) {
        (self.msg_iov, self.iov_count, self.addr, self.context, self.data, 0, 0)
    }
    fn desc(&self) -> DescV {
        self.desc
    }
}

impl TwoSidedMsg for fi::fi_msg_tagged {
    fn parts(&self) -> (*const fi::iovec, usize, u64, Ctx, u64, u64, u64) {
        (self.msg_iov, self.iov_count, self.addr, self.context, self.data, self.tag, self.ignore)
    }
    fn desc(&self) -> DescV {
        self.desc
    }
}

/// The nine send/receive entry points of one two-sided family, from one
/// definition: `FI_MSG` (no tag arguments) and `FI_TAGGED` (`tag` for sends,
/// `tag, ignore` for receives, inserted before the context as in libfabric's
/// prototypes). Every variant lands in [`do_send`] / [`do_recv`].
macro_rules! two_sided_family {
    (
        kind: $kind:expr, msg: $msg:ty,
        send_tag: [$($st:ident: $stt:ty),*] => $tag:expr,
        recv_tag: [$($rt:ident: $rtt:ty),*] => ($rtag:expr, $rignore:expr),
        $recv:ident, $recvv:ident, $recvmsg:ident, $send:ident, $sendv:ident, $sendmsg:ident, $inject:ident, $senddata:ident, $injectdata:ident
    ) => {
        entry! {
            fn $recv(ep: *mut fi::fid_ep => &Ep, buf: *mut libc::c_void, len: usize, desc: Desc, src: u64, $($rt: $rtt,)* context: Ctx) -> isize {
                let _ = desc;
                // SAFETY: the application's buffer of `len` bytes, valid until the
                // receive completes (libfabric's contract for posted buffers).
                let iov = unsafe { single(buf, len) }?;
                do_recv(ep, $kind, iov, src, $rtag, $rignore, context, None)
            }
        }
        entry! {
            fn $recvv(ep: *mut fi::fid_ep => &Ep, iov: *const fi::iovec, desc: DescV, count: usize, src: u64, $($rt: $rtt,)* context: Ctx) -> isize {
                let _ = desc;
                // SAFETY: the application's iov array of `count` entries.
                let iov = unsafe { user_iov(iov, count) }?;
                do_recv(ep, $kind, iov, src, $rtag, $rignore, context, None)
            }
        }
        entry! {
            fn $recvmsg(ep: *mut fi::fid_ep => &Ep, msg: *const $msg, flags: u64) -> isize {
                non_null!(msg);
                // SAFETY: checked non-null; the application's message.
                let (iov, count, addr, context, _, tag, ignore) = unsafe { &*msg }.parts();
                // SAFETY: the message's iov array of `count` entries.
                let iov = unsafe { user_iov(iov, count) }?;
                do_recv(ep, $kind, iov, addr, tag, ignore, context, Some(flags))
            }
        }
        entry! {
            fn $send(ep: *mut fi::fid_ep => &Ep, buf: *const libc::c_void, len: usize, desc: Desc, dest: u64, $($st: $stt,)* context: Ctx) -> isize {
                // SAFETY: the application's buffer of `len` bytes, valid for the
                // call (the engine copies it, or keeps it until the send completes).
                let iov = unsafe { single(buf, len) }?;
                do_send(ep, $kind, iov, one_desc(desc), dest, $tag, None, context, None, false)
            }
        }
        entry! {
            fn $sendv(ep: *mut fi::fid_ep => &Ep, iov: *const fi::iovec, desc: DescV, count: usize, dest: u64, $($st: $stt,)* context: Ctx) -> isize {
                // SAFETY: the application's iov array of `count` entries.
                let iov = unsafe { user_iov(iov, count) }?;
                // SAFETY: its descriptor array has as many entries, or is null.
                let desc = unsafe { descs(desc, iov.count) };
                do_send(ep, $kind, iov, desc, dest, $tag, None, context, None, false)
            }
        }
        entry! {
            fn $sendmsg(ep: *mut fi::fid_ep => &Ep, msg: *const $msg, flags: u64) -> isize {
                non_null!(msg);
                if flags & !SEND_MSG_FLAGS != 0 {
                    return Err(Error::BadFlags);
                }
                // SAFETY: checked non-null; the application's message.
                let m = unsafe { &*msg };
                let (iov, count, addr, context, data, tag, _) = m.parts();
                // SAFETY: the message's iov array of `count` entries.
                let iov = unsafe { user_iov(iov, count) }?;
                // SAFETY: the message's descriptor array has as many entries, or is null.
                let desc = unsafe { descs(m.desc(), iov.count) };
                let data = (flags & fi::FI_REMOTE_CQ_DATA as u64 != 0).then_some(data);
                do_send(ep, $kind, iov, desc, addr, tag, data, context, Some(flags), false)
            }
        }
        entry! {
            fn $inject(ep: *mut fi::fid_ep => &Ep, buf: *const libc::c_void, len: usize, dest: u64, $($st: $stt),*) -> isize {
                // SAFETY: the application's buffer of `len` bytes, valid for the call
                // (an inject is copied before it returns).
                let iov = unsafe { single(buf, len) }?;
                do_send(ep, $kind, iov, [0; info::IOV_LIMIT], dest, $tag, None, std::ptr::null_mut(), Some(0), true)
            }
        }
        entry! {
            fn $senddata(ep: *mut fi::fid_ep => &Ep, buf: *const libc::c_void, len: usize, desc: Desc, data: u64, dest: u64, $($st: $stt,)* context: Ctx) -> isize {
                // SAFETY: as for the plain send.
                let iov = unsafe { single(buf, len) }?;
                do_send(ep, $kind, iov, one_desc(desc), dest, $tag, Some(data), context, None, false)
            }
        }
        entry! {
            fn $injectdata(ep: *mut fi::fid_ep => &Ep, buf: *const libc::c_void, len: usize, data: u64, dest: u64, $($st: $stt),*) -> isize {
                // SAFETY: as for the plain inject.
                let iov = unsafe { single(buf, len) }?;
                do_send(ep, $kind, iov, [0; info::IOV_LIMIT], dest, $tag, Some(data), std::ptr::null_mut(), Some(0), true)
            }
        }
    };
}

two_sided_family! {
    kind: MsgKind::Msg, msg: fi::fi_msg,
    send_tag: [] => 0,
    recv_tag: [] => (0, 0),
    msg_recv, msg_recvv, msg_recvmsg, msg_send, msg_sendv, msg_sendmsg, msg_inject, msg_senddata, msg_injectdata
}

two_sided_family! {
    kind: MsgKind::Tagged, msg: fi::fi_msg_tagged,
    send_tag: [tag: u64] => tag,
    recv_tag: [tag: u64, ignore: u64] => (tag, ignore),
    tagged_recv, tagged_recvv, tagged_recvmsg, tagged_send, tagged_sendv, tagged_sendmsg, tagged_inject, tagged_senddata, tagged_injectdata
}
