//! `FI_RDMX_STATS=<path>`: JSON documents of an endpoint's counters, appended
//! to a file one per line (JSON Lines), at close, on `SIGUSR1` and every
//! `FI_RDMX_STATS_INTERVAL` ms. The document itself is built in `ep_stats.rs`;
//! here are the writer, the file, the signal and the timing.
//!
//! `SIGUSR1` only bumps an atomic counter (async-signal-safe) and calls the
//! handler that was installed before ours, if any; each endpoint's next
//! progress (the progress thread's, or the application's calls) sees the
//! counter moved and writes its document. Nothing here runs on the data path
//! unless a path is set: then each progress call loads one atomic, and with an
//! interval also reads the monotonic clock.
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

/// The `rdmx_stats` field of every document: bumped when a field changes
/// meaning or goes away (new fields are documented with the version that
/// added them).
pub const SCHEMA_VERSION: u64 = 1;

/// Why a document was written (its `reason` field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DumpReason {
    Close,
    Signal,
    Interval,
}

impl DumpReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DumpReason::Close => "close",
            DumpReason::Signal => "signal",
            DumpReason::Interval => "interval",
        }
    }
}

/// SIGUSR1s received so far.
static SIGNALS: AtomicU64 = AtomicU64::new(0);
/// The handler installed before ours: its address and whether it takes
/// `siginfo` (`SA_SIGINFO`); 0 when it was SIG_DFL or SIG_IGN (not called).
static PREV_HANDLER: AtomicUsize = AtomicUsize::new(0);
static PREV_SIGINFO: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();

extern "C" fn on_sigusr1(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    SIGNALS.fetch_add(1, Ordering::Relaxed);
    let prev = PREV_HANDLER.load(Ordering::Acquire);
    if prev == 0 {
        return;
    }
    if PREV_SIGINFO.load(Ordering::Relaxed) {
        // SAFETY: `prev` is the sa_sigaction of the action sigaction(2)
        // returned when ours was installed, with SA_SIGINFO set: a function of
        // this type. We pass on exactly what the kernel gave us.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(prev) };
        f(sig, info, ctx);
    } else {
        // SAFETY: `prev` is the sa_handler of the previous action (SA_SIGINFO
        // unset, neither SIG_DFL nor SIG_IGN): a `void (*)(int)`.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(prev) };
        f(sig);
    }
}

/// Installs the SIGUSR1 handler once per process (only called when
/// `FI_RDMX_STATS` names a path). A handler installed before it keeps being
/// called (after ours); one installed after it replaces it, as with any
/// handler.
pub fn install_signal_handler() {
    INSTALL.call_once(|| {
        // SAFETY: sigaction structs are plain data, zero is a valid value; the
        // handler only touches atomics and calls the previous handler, which
        // is async-signal-safe as far as we are concerned.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGUSR1, std::ptr::null(), &mut old) != 0 {
                crate::log::warn(
                    crate::log::Subsys::EpCtrl,
                    "stats",
                    "SIGUSR1: cannot read the current handler; FI_RDMX_STATS documents only at close and by interval",
                );
                return;
            }
            let prev = old.sa_sigaction;
            if prev != libc::SIG_DFL && prev != libc::SIG_IGN {
                PREV_SIGINFO.store(old.sa_flags & libc::SA_SIGINFO != 0, Ordering::Relaxed);
                PREV_HANDLER.store(prev, Ordering::Release);
            }
            // The previous handler's mask, and an alternate stack if the
            // application set one up (harmless without): a handler chained
            // after ours runs as it was installed to.
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_sigusr1 as *const () as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK;
            new.sa_mask = old.sa_mask;
            if libc::sigaction(libc::SIGUSR1, &new, std::ptr::null_mut()) != 0 {
                PREV_HANDLER.store(0, Ordering::Release);
                crate::log::warn(
                    crate::log::Subsys::EpCtrl,
                    "stats",
                    "SIGUSR1: cannot install the handler; FI_RDMX_STATS documents only at close and by interval",
                );
            }
        }
    });
}

/// An endpoint's schedule of documents besides the one at close.
pub struct DumpSchedule {
    signals_seen: u64,
    interval: Option<Duration>,
    next: Option<Instant>,
}

impl DumpSchedule {
    pub fn new(interval: Option<Duration>) -> DumpSchedule {
        DumpSchedule {
            signals_seen: SIGNALS.load(Ordering::Relaxed),
            interval,
            next: interval.map(|i| Instant::now() + i),
        }
    }

    /// Whether a document is due now, and why (called from progress).
    #[inline]
    pub fn due(&mut self) -> Option<DumpReason> {
        let signals = SIGNALS.load(Ordering::Relaxed);
        if signals != self.signals_seen {
            self.signals_seen = signals;
            return Some(DumpReason::Signal);
        }
        let (Some(interval), Some(next)) = (self.interval, self.next) else { return None };
        let now = Instant::now();
        if now < next {
            return None;
        }
        self.next = Some(now + interval);
        Some(DumpReason::Interval)
    }
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The path with `%p` replaced by the process id and `%%` by `%`.
pub fn expand_path(template: &str) -> String {
    let mut out = String::with_capacity(template.len() + 8);
    let mut chars = template.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('p') => {
                let _ = write!(out, "{}", std::process::id());
            }
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Appends `line` and a newline to the file at `template` (expanded) in one
/// write: several endpoints and processes may share the file (O_APPEND).
pub fn append_line(template: &str, mut line: String) {
    line.push('\n');
    let path = expand_path(template);
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    // Warned once: an interval would otherwise repeat it for every endpoint.
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if let Err(e) = written {
        if !WARNED.swap(true, Ordering::Relaxed) {
            crate::log::warn(
                crate::log::Subsys::EpCtrl,
                "stats",
                &format!("cannot write the JSON stats to {path}: {e} (said once)"),
            );
        }
    }
}

/// A JSON text written by hand (keys are ours; string values are escaped).
pub struct Json {
    out: String,
    /// Per open container: whether it has no element yet, and its closing bracket.
    first: Vec<(bool, char)>,
}

impl Json {
    pub fn object() -> Json {
        Json { out: String::from("{"), first: vec![(true, '}')] }
    }

    fn sep(&mut self) {
        if let Some((f, _)) = self.first.last_mut() {
            if !*f {
                self.out.push(',');
            }
            *f = false;
        }
    }

    fn key(&mut self, k: &str) {
        self.sep();
        push_str(&mut self.out, k);
        self.out.push(':');
    }

    pub fn field_u64(&mut self, k: &str, v: u64) {
        self.key(k);
        let _ = write!(self.out, "{v}");
    }

    pub fn field_f64(&mut self, k: &str, v: f64) {
        self.key(k);
        if v.is_finite() {
            // Always with a fraction, so readers see a number of type float.
            let _ = write!(self.out, "{v:?}");
        } else {
            self.out.push_str("null");
        }
    }

    pub fn field_opt_f64(&mut self, k: &str, v: Option<f64>) {
        match v {
            Some(v) => self.field_f64(k, v),
            None => {
                self.key(k);
                self.out.push_str("null");
            }
        }
    }

    pub fn field_bool(&mut self, k: &str, v: bool) {
        self.key(k);
        self.out.push_str(if v { "true" } else { "false" });
    }

    pub fn field_str(&mut self, k: &str, v: &str) {
        self.key(k);
        push_str(&mut self.out, v);
    }

    pub fn msg_bytes(&mut self, k: &str, messages: u64, bytes: u64) {
        self.begin_object(k);
        self.field_u64("messages", messages);
        self.field_u64("bytes", bytes);
        self.end();
    }

    pub fn begin_object(&mut self, k: &str) {
        self.key(k);
        self.out.push('{');
        self.first.push((true, '}'));
    }

    pub fn begin_array(&mut self, k: &str) {
        self.key(k);
        self.out.push('[');
        self.first.push((true, ']'));
    }

    /// An object as the next element of the open array.
    pub fn begin_object_elem(&mut self) {
        self.sep();
        self.out.push('{');
        self.first.push((true, '}'));
    }

    /// Closes the innermost open object or array.
    pub fn end(&mut self) {
        if let Some((_, close)) = self.first.pop() {
            self.out.push(close);
        }
    }

    /// The text, with every container closed.
    pub fn finish(mut self) -> String {
        while !self.first.is_empty() {
            self.end();
        }
        self.out
    }
}

fn push_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_nests_and_escapes() {
        let mut j = Json::object();
        j.field_u64("a", 1);
        j.begin_array("p");
        j.begin_object_elem();
        j.field_str("s", "x\"y\\z\n[");
        j.msg_bytes("m", 2, 3);
        j.end();
        j.begin_object_elem();
        j.field_opt_f64("r", None);
        j.field_f64("c", 10.0);
        j.end();
        j.end();
        j.field_bool("b", true);
        assert_eq!(
            j.finish(),
            r#"{"a":1,"p":[{"s":"x\"y\\z\u000a[","m":{"messages":2,"bytes":3}},{"r":null,"c":10.0}],"b":true}"#
        );
    }

    #[test]
    fn the_path_names_the_process() {
        let pid = std::process::id();
        assert_eq!(expand_path("/tmp/s.%p.json"), format!("/tmp/s.{pid}.json"));
        assert_eq!(expand_path("a%%p%q%"), "a%p%q%");
    }
}
