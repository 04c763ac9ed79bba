//! The `drun.v1` wire schema shared by the agent (`drun`) and the rendezvous server
//! (`drun-rendezvous`). Generated code, and the codec it names ([`codec`]).

pub mod codec;

/// Generated messages and the `Rendezvous` service for protocol version 1.
pub mod v1 {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("drun.v1");
}

/// Protocol version carried in every `JoinRequest`; the server rejects other majors.
pub const PROTOCOL_VERSION: u32 = 1;
