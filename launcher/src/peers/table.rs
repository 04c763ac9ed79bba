//! Which peers of this node's generation answer its probes: a pure table of answers, judged at
//! an instant ([`Table::verdict`]), tested with synthetic instants.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

/// A peer of the generation: its node rank and where its agent answers probes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Its node rank in the generation.
    pub node_rank: u32,
    /// Its agent's probe address (the member's address and probe port).
    pub addr: SocketAddr,
}

#[derive(Debug, Clone)]
struct Watched {
    peer: Peer,
    /// When this peer's watch began (the generation's start): a peer is not silent before it
    /// had a fair chance to answer.
    since: Instant,
    last_answer: Option<Instant>,
    /// Probes sent to it since its last answer (or the watch's start).
    unanswered: u32,
}

/// What the answers say at an instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No generation with other members is watched (one node, or between generations).
    Alone,
    /// Some member cannot be probed (an older agent without a probe port): no evidence.
    Unknown,
    /// Every peer answered within the quiet limit.
    AllAnswer,
    /// These peers (node ranks) have not answered for longer than the quiet limit.
    Silent(Vec<u32>),
}

/// The answers of the current generation's peers.
#[derive(Debug, Clone, Default)]
pub struct Table {
    generation: u64,
    peers: Vec<Watched>,
    unprobeable: bool,
}

impl Table {
    /// Starts watching `peers` of `generation` at `now` (the previous generation's answers are
    /// dropped); `unprobeable`: some member has no probe port.
    pub fn follow(&mut self, generation: u64, peers: Vec<Peer>, unprobeable: bool, now: Instant) {
        self.generation = generation;
        self.unprobeable = unprobeable;
        self.peers = peers
            .into_iter()
            .map(|peer| Watched {
                peer,
                since: now,
                last_answer: None,
                unanswered: 0,
            })
            .collect();
    }

    /// Stops watching (the generation ended).
    pub fn clear(&mut self) {
        *self = Table::default();
    }

    /// The generation watched (0: none).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Where to send this round's probes.
    pub fn targets(&self) -> Vec<Peer> {
        self.peers.iter().map(|w| w.peer.clone()).collect()
    }

    /// A round of probes went out to every target.
    pub fn sent(&mut self) {
        for w in &mut self.peers {
            w.unanswered = w.unanswered.saturating_add(1);
        }
    }

    /// `from` answered a probe of `generation` at `now`; an answer for another generation, or
    /// from an address that is no peer's probe address, is ignored. The peer is known by its
    /// address, not by the node rank the answer carries: that is the answering agent's rank
    /// now, which changes when its group re-forms without this node (a node sent away by a
    /// partition keeps probing the peers of its last generation).
    pub fn answered(&mut self, generation: u64, from: SocketAddr, now: Instant) {
        if generation != self.generation {
            return;
        }
        if let Some(w) = self.peers.iter_mut().find(|w| w.peer.addr == from) {
            w.last_answer = Some(now);
            w.unanswered = 0;
        }
    }

    /// Whether every peer answered within `quiet` of `now` (no peer: true).
    pub fn all_heard(&self, now: Instant, quiet: Duration) -> bool {
        self.peers.iter().all(|w| {
            w.last_answer
                .is_some_and(|at| now.saturating_duration_since(at) <= quiet)
        })
    }

    /// The verdict at `now`: a peer is silent when it answered in this generation and then not
    /// for longer than `quiet`, although at least `min_unanswered` probes went to it meanwhile —
    /// a node whose own probing stalled (its process starved) blames nobody for the answers it
    /// never asked for. A peer that never answered leaves no evidence ([`Verdict::Unknown`]).
    pub fn verdict(&self, now: Instant, quiet: Duration, min_unanswered: u32) -> Verdict {
        if self.peers.is_empty() && !self.unprobeable {
            return Verdict::Alone;
        }
        if self.unprobeable {
            return Verdict::Unknown;
        }
        let stale = |w: &Watched, since: Instant| {
            now.saturating_duration_since(since) > quiet && w.unanswered >= min_unanswered
        };
        let silent: Vec<u32> = self
            .peers
            .iter()
            .filter(|w| w.last_answer.is_some_and(|at| stale(w, at)))
            .map(|w| w.peer.node_rank)
            .collect();
        if !silent.is_empty() {
            return Verdict::Silent(silent);
        }
        // A peer that never answered in this generation says nothing either way: the probes may
        // be blocked between the nodes (a firewall that lets the workers' TCP through), which
        // must never look like a partition. Within the first quiet limit it is given the benefit
        // of the doubt.
        if self
            .peers
            .iter()
            .any(|w| w.last_answer.is_none() && stale(w, w.since))
        {
            return Verdict::Unknown;
        }
        Verdict::AllAnswer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(rank: u32) -> Peer {
        Peer {
            node_rank: rank,
            addr: format!("10.0.0.{}:7{rank:03}", rank + 1).parse().unwrap(),
        }
    }

    const QUIET: Duration = Duration::from_secs(3);

    impl Table {
        /// The verdict as if every probe round went out (6 a quiet limit).
        fn verdict_(&mut self, now: Instant, quiet: Duration) -> Verdict {
            for _ in 0..6 {
                self.sent();
            }
            self.verdict(now, quiet, 6)
        }
    }

    #[test]
    fn all_heard_wants_an_answer_from_every_peer_within_the_quiet_limit() {
        let t0 = Instant::now();
        let mut t = Table::default();
        assert!(t.all_heard(t0, QUIET), "nobody to reach");
        t.follow(4, vec![peer(0), peer(1)], false, t0);
        assert!(
            !t.all_heard(t0, QUIET),
            "a peer that never answered is not heard"
        );
        t.answered(4, peer(0).addr, t0);
        assert!(!t.all_heard(t0, QUIET));
        t.answered(4, peer(1).addr, t0 + QUIET);
        assert!(t.all_heard(t0 + QUIET, QUIET));
        assert!(
            !t.all_heard(t0 + QUIET + Duration::from_millis(1), QUIET),
            "peer 0's answer is too old"
        );
    }

    #[test]
    fn without_a_generation_the_node_is_alone() {
        let mut t = Table::default();
        assert_eq!(t.verdict_(Instant::now(), QUIET), Verdict::Alone);
    }

    #[test]
    fn a_peer_that_never_answered_leaves_no_evidence_after_the_first_quiet_limit() {
        let t0 = Instant::now();
        let mut t = Table::default();
        t.follow(3, vec![peer(1), peer(2)], false, t0);
        assert_eq!(t.verdict_(t0 + QUIET, QUIET), Verdict::AllAnswer);
        // Probes blocked between the nodes (a firewall): neither silent nor answering.
        assert_eq!(
            t.verdict_(t0 + QUIET + Duration::from_millis(1), QUIET),
            Verdict::Unknown
        );
        t.answered(3, peer(1).addr, t0 + QUIET);
        t.answered(3, peer(2).addr, t0 + QUIET);
        assert_eq!(
            t.verdict_(t0 + QUIET + Duration::from_millis(1), QUIET),
            Verdict::AllAnswer
        );
    }

    #[test]
    fn answers_keep_peers_alive_and_a_peer_that_stops_answering_is_named() {
        let t0 = Instant::now();
        let mut t = Table::default();
        t.follow(3, vec![peer(1), peer(2)], false, t0);
        let s = |n| Duration::from_secs(n);
        t.answered(3, peer(1).addr, t0 + s(1));
        t.answered(3, peer(2).addr, t0 + s(1));
        t.answered(3, peer(1).addr, t0 + s(4));
        assert_eq!(t.verdict_(t0 + s(4), QUIET), Verdict::AllAnswer);
        assert_eq!(t.verdict_(t0 + s(5), QUIET), Verdict::Silent(vec![2]));
    }

    #[test]
    fn an_answer_of_another_generation_or_from_another_address_does_not_count() {
        let t0 = Instant::now();
        let mut t = Table::default();
        t.follow(3, vec![peer(1)], false, t0);
        t.answered(2, peer(1).addr, t0 + Duration::from_secs(3));
        t.answered(3, peer(2).addr, t0 + Duration::from_secs(3));
        assert_eq!(
            t.verdict_(t0 + Duration::from_secs(4), QUIET),
            Verdict::Unknown,
            "no answer of this generation from that peer"
        );
    }

    #[test]
    fn a_peer_is_known_by_its_address_whatever_rank_its_answer_carries() {
        // A node sent away by a partition keeps probing its last generation's peers; their
        // group re-formed without it, so their answers carry new node ranks.
        let s = |n| Duration::from_secs(n);
        let t0 = Instant::now();
        let mut t = Table::default();
        t.follow(3, vec![peer(1), peer(3)], false, t0);
        t.answered(3, peer(1).addr, t0 + s(1));
        t.answered(3, peer(3).addr, t0 + s(1));
        assert_eq!(t.verdict_(t0 + s(2), QUIET), Verdict::AllAnswer);
    }

    #[test]
    fn a_member_without_a_probe_port_leaves_no_evidence() {
        let t0 = Instant::now();
        let mut t = Table::default();
        t.follow(1, vec![peer(1)], true, t0);
        t.answered(1, peer(1).addr, t0);
        assert_eq!(t.verdict_(t0, QUIET), Verdict::Unknown);
    }

    #[test]
    fn following_the_next_generation_forgets_the_old_answers() {
        let t0 = Instant::now();
        let mut t = Table::default();
        t.follow(1, vec![peer(1)], false, t0);
        t.answered(1, peer(1).addr, t0 + Duration::from_secs(10));
        t.follow(2, vec![peer(1)], false, t0 + Duration::from_secs(10));
        assert_eq!(t.generation(), 2);
        assert_eq!(
            t.verdict_(t0 + Duration::from_secs(14), QUIET),
            Verdict::Unknown
        );
        t.clear();
        assert_eq!(t.verdict_(t0, QUIET), Verdict::Alone);
    }

    #[test]
    fn a_node_whose_own_probes_stalled_blames_nobody() {
        let t0 = Instant::now();
        let mut t = Table::default();
        t.follow(3, vec![peer(1)], false, t0);
        t.answered(3, peer(1).addr, t0);
        t.sent();
        // 10 s without an answer, but only one probe went out (this process was starved).
        assert_eq!(
            t.verdict(t0 + Duration::from_secs(10), QUIET, 6),
            Verdict::AllAnswer
        );
        for _ in 0..5 {
            t.sent();
        }
        assert_eq!(
            t.verdict(t0 + Duration::from_secs(10), QUIET, 6),
            Verdict::Silent(vec![1])
        );
        t.answered(3, peer(1).addr, t0 + Duration::from_secs(11));
        t.sent();
        assert_eq!(
            t.verdict(t0 + Duration::from_secs(15), QUIET, 6),
            Verdict::AllAnswer
        );
    }
}
