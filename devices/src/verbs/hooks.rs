//! Test hooks of the verbs device: ways for the conformance tests to reach
//! the error-completion, recovery and address-handle retry paths without a
//! faulty NIC. Apart so that the device's own code carries none of them
//! but the flags they set.
#![forbid(unsafe_code)]

use super::VerbsDevice;

impl VerbsDevice {
    /// Test hook: the next send that is not inline names a wrong memory
    /// key, so it completes in error (a local protection error): how the
    /// tests reach the error-completion and queue-pair recovery paths.
    #[doc(hidden)]
    pub fn corrupt_next_send_key_for_test(&mut self) {
        self.ud.corrupt_next_key = true;
    }

    /// Test hook: the next `n` address handles to create are refused as a
    /// device out of them would (ENOMEM): how the tests reach the evict and
    /// retry path without exhausting a real device.
    #[doc(hidden)]
    pub fn refuse_next_ahs_for_test(&mut self, n: u32) {
        self.ahs.refuse_next_for_test(n);
    }
}
