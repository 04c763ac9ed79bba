//! The `drun.v1` wire schema shared by the agent (`drun`) and the rendezvous server
//! (`drun-rendezvous`). Only generated code lives here.

/// Generated messages and the `Rendezvous` service for protocol version 1.
pub mod v1 {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("drun.v1");
}

/// Protocol version carried in every `JoinRequest`; the server rejects other majors.
pub const PROTOCOL_VERSION: u32 = 1;
