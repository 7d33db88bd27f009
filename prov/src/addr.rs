//! The rdmx endpoint address is the devices' ([`::devices::addr`]): its
//! layout, encoding and routing live there; the provider copies its bytes for
//! `fi_getname` and `fi_av_insert`.
pub use ::devices::addr::*;

// OpenMPI's `mtl ofi` gives fi_getname a buffer of FI_NAME_MAX bytes.
const _: () = assert!(ADDR_LEN <= libfabric_sys::FI_NAME_MAX as usize);
