//! What every client of a rendezvous server shares — the agent's link (`drun`) and both
//! `status` commands: names resolved afresh at each attempt ([`dns`]), what listens on an
//! endpoint that fails the gRPC handshake ([`foreign`]) and the token a client sends
//! ([`token`]). The status client itself is [`crate::status::client`].

pub mod dns;
pub mod foreign;
pub mod token;
