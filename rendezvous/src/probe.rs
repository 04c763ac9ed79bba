//! The peer probe on the wire: the 30-byte datagram by which agents of a run ask one another,
//! and a rendezvous session asks an agent, whether they still reach each other (the launcher's
//! `peers` module probes; `session/liveness.rs` knocks).
//!
//! A probe carries the run's tag, the generation the prober watches, its node rank and a
//! sequence number; the answer echoes them with the answering agent's node rank. Every agent of
//! a run answers every probe of its run on its probe port (`Candidate.probe_port`).

/// Size of a probe and of its answer.
pub const PROBE_BYTES: usize = 30;

const MAGIC: &[u8; 4] = b"drnp";
const VERSION: u8 = 1;
const PING: u8 = 0;
const PONG: u8 = 1;

/// One probe or answer on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    /// An answer (true) or a probe.
    pub answer: bool,
    /// The run's tag ([`run_tag`]): probes of other runs are ignored.
    pub run_tag: u64,
    /// The generation the prober watches (echoed in the answer).
    pub generation: u64,
    /// The sender's node rank in its generation.
    pub node_rank: u32,
    /// The prober's sequence number (echoed).
    pub seq: u32,
}

impl Message {
    /// The message's bytes.
    pub fn encode(&self) -> [u8; PROBE_BYTES] {
        let mut b = [0u8; PROBE_BYTES];
        b[..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[5] = if self.answer { PONG } else { PING };
        b[6..14].copy_from_slice(&self.run_tag.to_be_bytes());
        b[14..22].copy_from_slice(&self.generation.to_be_bytes());
        b[22..26].copy_from_slice(&self.node_rank.to_be_bytes());
        b[26..30].copy_from_slice(&self.seq.to_be_bytes());
        b
    }

    /// The message in `b`; `None` for anything else.
    pub fn decode(b: &[u8]) -> Option<Message> {
        if b.len() != PROBE_BYTES || &b[..4] != MAGIC || b[4] != VERSION || b[5] > PONG {
            return None;
        }
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Some(Message {
            answer: b[5] == PONG,
            run_tag: u64_at(6),
            generation: u64_at(14),
            node_rank: u32_at(22),
            seq: u32_at(26),
        })
    }
}

/// A stable 64-bit tag of the run id (FNV-1a), so probes of other runs on the same hosts are
/// ignored.
pub fn run_tag(run_id: &str) -> u64 {
    run_id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_survives_the_wire_and_garbage_does_not_decode() {
        let m = Message {
            answer: true,
            run_tag: run_tag("job-42"),
            generation: 7,
            node_rank: 3,
            seq: 99,
        };
        assert_eq!(Message::decode(&m.encode()), Some(m));
        assert_eq!(Message::decode(b"GET / HTTP/1.1\r\n"), None);
        let mut other = m.encode();
        other[4] = 2;
        assert_eq!(Message::decode(&other), None, "another version");
        assert_ne!(run_tag("job-42"), run_tag("job-43"));
    }
}
