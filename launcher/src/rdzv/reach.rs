//! Whether the gRPC link keeps trying to reach its rendezvous server ([`Reach`]): a pure
//! function of the connection history and the instant, tested with synthetic instants.
//!
//! * **First connection.** Nodes start in any order (Kubernetes, Slurm) and the server, or the
//!   agent hosting it, may come up later: like torchrun, the link waits up to the join timeout,
//!   with one progress line every [`PROGRESS_EVERY`] (the first after [`QUIET`]), then gives up
//!   with one line naming the endpoint and the fix.
//! * **Later.** A lost server is said once when the stream breaks, then one progress line every
//!   [`PROGRESS_EVERY`] while it stays unreachable (not one per attempt). No server for a whole
//!   lease TTL means the lease must be taken as expired (a fence) — unless every peer of the
//!   running generation answers this agent's probes (`crate::peers`): then the control plane is
//!   gone for everyone, the servers hold the generation's leases meanwhile, and the agent keeps
//!   its generation and workers and attaches again when a server answers (static stability;
//!   `docs/architecture.md`, "Control-plane outages"). No server for longer than the join
//!   timeout ends the link.

use std::time::Duration;

use drun_rendezvous::human::duration as human;
use tokio::time::Instant;

use super::grpc::UNREACHABLE;

/// How long a first connection may fail quietly (peers start at slightly different times).
pub const QUIET: Duration = Duration::from_secs(2);
/// How often a node still waiting for its first connection says so.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// How long the link waits (from the session's configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `--rdzv-conf lease_ttl`: no server this long is a fence.
    pub lease_ttl: Duration,
    /// `--rdzv-conf join_timeout`: no server this long ends the link.
    pub join_timeout: Duration,
}

/// What to do before the next connection attempt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// The lease must be taken as expired: this fence line (the link forgets the lease).
    pub fence: Option<String>,
    /// A progress line to log.
    pub progress: Option<String>,
    /// The link ends with this error line (exit 3).
    pub give_up: Option<String>,
}

/// The link's connection history.
#[derive(Debug, Clone)]
pub struct Reach {
    started: Instant,
    ever_connected: bool,
    last_contact: Instant,
    next_progress: Instant,
    last_error: Option<String>,
    /// Whether this outage's "kept by the peers" line was said.
    outage_said: bool,
    /// The outage this link kept its generation through: the generation, and when the server
    /// was last heard before it.
    kept: Option<(u64, Instant)>,
    /// When the server last sent anything (a stream that broke vouches for `last_contact` only).
    last_message: Instant,
}

impl Reach {
    /// A link started at `now`, never connected.
    pub fn new(now: Instant) -> Self {
        Self {
            started: now,
            ever_connected: false,
            last_contact: now,
            next_progress: now + QUIET,
            last_error: None,
            outage_said: false,
            kept: None,
            last_message: now,
        }
    }

    /// Whether a session stream was ever opened.
    pub fn ever_connected(&self) -> bool {
        self.ever_connected
    }

    /// The server answered at `now` (a session opened, an event, a keep-alive).
    pub fn contact(&mut self, now: Instant) {
        self.last_message = now;
        self.vouched(now);
    }

    /// The stream broke at `now` after the server last spoke: the transport's own keep-alive
    /// pings vouch for the server until `unanswered` before the break (a stream that broke
    /// because its pings went unanswered had not heard the server for that long; it counts
    /// for the TTL), but the server said nothing since its last message (an outage is measured
    /// from that).
    pub fn stream_broke(&mut self, now: Instant, unanswered: Duration) {
        let at = now.checked_sub(unanswered).unwrap_or(now);
        self.vouched(at.max(self.last_contact));
    }

    fn vouched(&mut self, now: Instant) {
        self.ever_connected = true;
        self.last_contact = now;
        self.last_error = None;
        self.outage_said = false;
        self.next_progress = now + QUIET;
    }

    /// The server answers again at `now` (call before [`Reach::contact`]): the outage this link
    /// kept its generation through, if any — the generation and how long the server was away.
    pub fn take_outage(&mut self, now: Instant) -> Option<(u64, Duration)> {
        self.kept
            .take()
            .map(|(g, began)| (g, now.saturating_duration_since(began)))
    }

    /// An attempt failed: why, as the connection error says it.
    pub fn failed(&mut self, why: &str) {
        self.last_error = Some(short_reason(why));
    }

    /// An attempt failed for a reason already in words (kept as it is).
    pub fn failed_because(&mut self, why: String) {
        self.last_error = Some(why);
    }

    /// The verdict at `now` (`leased`: the session holds a lease; `vouched`: the generation it
    /// runs, when every peer of it answers its probes; `endpoints`: as tried).
    pub fn check(
        &mut self,
        now: Instant,
        leased: bool,
        vouched: Option<u64>,
        l: Limits,
        endpoints: &str,
    ) -> Verdict {
        let mut v = Verdict::default();
        let why = self.last_error.as_deref().unwrap_or("no answer");
        if !self.ever_connected {
            let waited = now.saturating_duration_since(self.started);
            if waited >= l.join_timeout {
                v.give_up = Some(format!(
                    "cannot reach the rendezvous server at {endpoints} ({why}) within the join timeout of {}; start `drun-rendezvous serve` there (with the c10d/embedded backend: the agent on that host), check the address, or raise --rdzv-conf join_timeout=SECONDS",
                    human(l.join_timeout)
                ));
            } else if now >= self.next_progress {
                v.progress = Some(format!(
                    "waiting for the rendezvous server at {endpoints}: {why}; giving up in {}",
                    human(l.join_timeout - waited)
                ));
                while self.next_progress <= now {
                    self.next_progress += PROGRESS_EVERY;
                }
            }
            return v;
        }
        let gone = now.saturating_duration_since(self.last_contact);
        let mut kept = None;
        if let (true, true, Some(g)) = (leased, gone > l.lease_ttl, vouched) {
            if !self.outage_said {
                self.outage_said = true;
                self.kept = Some((g, self.last_message));
                kept = Some(format!(
                    "{UNREACHABLE} for {} (TTL {}; tried {endpoints}), but every peer of generation {g} answers: this node is not cut off, so it keeps its generation (its workers, or the failure it reports) and attaches again when a server answers",
                    human(gone),
                    human(l.lease_ttl),
                ));
            }
        } else if leased && gone > l.lease_ttl {
            v.fence = Some(format!(
                "{UNREACHABLE} for {} (TTL {}; tried {endpoints})",
                human(gone),
                human(l.lease_ttl),
            ));
        }
        // A server gone for good must not keep the agent retrying forever: past the join
        // timeout (the longest this node would wait for a group anyway) it is an error.
        let limit = l.join_timeout.max(l.lease_ttl);
        if gone > limit {
            v.give_up = Some(format!(
                "lost the rendezvous server ({endpoints}) for {}; giving up",
                human(gone)
            ));
        } else if let Some(why) = self
            .last_error
            .as_deref()
            .filter(|_| now >= self.next_progress)
        {
            v.progress = Some(format!(
                "rendezvous server at {endpoints} unreachable for {} ({why}); still trying, giving up in {}",
                human(gone),
                human(limit - gone)
            ));
            while self.next_progress <= now {
                self.next_progress += PROGRESS_EVERY;
            }
        }
        if kept.is_some() {
            v.progress = kept;
        }
        v
    }
}

/// What a fence at the TTL adds when some peers of generation `g` (node ranks `silent`) do not
/// answer this node's probes either: why it cannot hold on as a node whose peers all answer
/// does (an operator reads it in the run's last lines; a trial's node 0, hosting the
/// embedded rendezvous, had died).
pub fn silent_peers_note(silent: &[u32], g: u64) -> String {
    let ranks = silent
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if silent.len() == 1 {
        format!(
            ", and node rank {ranks} of generation {g} does not answer this node's probes either"
        )
    } else {
        format!(
            ", and node ranks {ranks} of generation {g} do not answer this node's probes either"
        )
    }
}

/// The last cause of a connection error chain, without the OS error number:
/// `transport error: tcp connect error: Connection refused (os error 111)` →
/// `connection refused`. Two causes that say little on their own get their usual meaning (a
/// trial read `invalid argument` for a blackhole route to the server).
pub fn short_reason(chain: &str) -> String {
    let last = chain.rsplit(": ").next().unwrap_or(chain).trim();
    let last = match last.rfind(" (os error ") {
        Some(i) if last.ends_with(')') => &last[..i],
        _ => last,
    };
    if last.eq_ignore_ascii_case("invalid argument") && chain.contains("connect") {
        // What connect(2) says for a destination behind a blackhole route.
        return "invalid argument: this host's routes drop the path to it (a blackhole route?)"
            .into();
    }
    if last == "deadline has elapsed" {
        return "no answer within the connect timeout (a host that is down, or a path that drops packets)".into();
    }
    let mut c = last.chars();
    match c.next() {
        Some(f) if c.clone().next().is_some_and(char::is_lowercase) => {
            f.to_lowercase().chain(c).collect()
        }
        _ => last.to_string(),
    }
}

/// `short`, with a hint when the full error `chain` shows a TLS mismatch
/// ([`drun_rendezvous::server::tls::hint`]) or a listener that is not a rendezvous server.
pub fn explain(short: String, chain: &str, tls: drun_rendezvous::server::tls::Mode) -> String {
    match drun_rendezvous::server::tls::hint(chain, tls) {
        Some(h) => format!("{short}; {h}"),
        // The connection opened, and what listens did not speak HTTP/2 (a trial's silent
        // listener on the port said only "http2 error" for ten minutes).
        None if short == "http2 error" => format!(
            "{short}: what listens on that port is not a rendezvous server (it does not speak HTTP/2); another program may hold it, so check the --rdzv-endpoint port"
        ),
        None => short,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits {
        lease_ttl: Duration::from_secs(30),
        join_timeout: Duration::from_secs(600),
    };
    const EP: &str = "h:29400";

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn a_fence_names_the_peers_that_do_not_answer_either() {
        assert_eq!(
            silent_peers_note(&[0], 1),
            ", and node rank 0 of generation 1 does not answer this node's probes either"
        );
        assert_eq!(
            silent_peers_note(&[0, 2], 4),
            ", and node ranks 0, 2 of generation 4 do not answer this node's probes either"
        );
    }

    #[test]
    fn the_first_connection_waits_up_to_the_join_timeout_with_progress_every_10_s() {
        let t0 = Instant::now();
        let mut r = Reach::new(t0);
        r.failed("transport error: tcp connect error: Connection refused (os error 111)");
        assert_eq!(r.check(t0 + s(1), false, None, L, EP), Verdict::default());
        let v = r.check(t0 + s(2), false, None, L, EP);
        assert_eq!(
            v.progress.as_deref(),
            Some("waiting for the rendezvous server at h:29400: connection refused; giving up in 598 s")
        );
        assert_eq!(r.check(t0 + s(5), false, None, L, EP), Verdict::default());
        let v = r.check(t0 + s(12), false, None, L, EP);
        assert!(v.progress.unwrap().ends_with("giving up in 588 s"));
        // A long attempt skips the lines it missed: one line, not a burst.
        assert!(r.check(t0 + s(45), false, None, L, EP).progress.is_some());
        assert_eq!(r.check(t0 + s(50), false, None, L, EP), Verdict::default());
        assert!(r.check(t0 + s(599), false, None, L, EP).give_up.is_none());
        let v = r.check(t0 + s(600), false, None, L, EP);
        let line = v.give_up.expect("gives up at the join timeout");
        assert!(
            line.starts_with("cannot reach the rendezvous server at h:29400 (connection refused) within the join timeout of 600 s;"),
            "{line}"
        );
        assert!(line.contains("join_timeout="), "{line}");
    }

    #[test]
    fn after_a_connection_a_ttl_without_server_fences_and_the_join_timeout_ends() {
        let t0 = Instant::now();
        let mut r = Reach::new(t0);
        r.contact(t0 + s(1));
        r.contact(t0 + s(700));
        assert_eq!(r.check(t0 + s(730), true, None, L, EP), Verdict::default());
        let v = r.check(t0 + s(731), true, None, L, EP);
        assert!(v.fence.unwrap().starts_with(UNREACHABLE));
        assert!(v.give_up.is_none());
        assert!(
            r.check(t0 + s(731), false, None, L, EP).fence.is_none(),
            "no lease"
        );
        let v = r.check(t0 + s(1301), false, None, L, EP);
        assert!(v
            .give_up
            .unwrap()
            .starts_with("lost the rendezvous server (h:29400)"));
    }

    #[test]
    fn a_lost_server_is_a_progress_line_every_10_s_not_one_per_attempt() {
        let t0 = Instant::now();
        let mut r = Reach::new(t0);
        r.contact(t0);
        assert_eq!(
            r.check(t0 + s(5), true, None, L, EP),
            Verdict::default(),
            "no failure yet"
        );
        // The stream broke at 5 s (contact), attempts fail every second from then on.
        r.contact(t0 + s(5));
        let mut lines = Vec::new();
        for t in 6..=30 {
            r.failed("transport error: tcp connect error: Connection refused (os error 111)");
            if let Some(p) = r.check(t0 + s(t), true, None, L, EP).progress {
                lines.push((t, p));
            }
        }
        let at: Vec<u64> = lines.iter().map(|(t, _)| *t).collect();
        assert_eq!(at, [7, 17, 27]);
        assert_eq!(
            lines[0].1,
            "rendezvous server at h:29400 unreachable for 2 s (connection refused); still trying, giving up in 598 s"
        );
        // Back: quiet again, and a new outage starts its own count.
        r.contact(t0 + s(31));
        assert_eq!(r.check(t0 + s(40), true, None, L, EP), Verdict::default());
    }

    #[test]
    fn the_reason_is_the_last_cause_in_plain_words() {
        assert_eq!(
            short_reason("transport error: tcp connect error: Connection refused (os error 111)"),
            "connection refused"
        );
        assert_eq!(
            short_reason(
                "dns error: failed to lookup address information: Name or service not known"
            ),
            "name or service not known"
        );
        assert_eq!(short_reason("HTTP/2 error"), "HTTP/2 error");
        assert!(
            short_reason("transport error: tcp connect error: Invalid argument (os error 22)")
                .contains("blackhole route")
        );
        assert!(
            short_reason("transport error: timeout: deadline has elapsed")
                .starts_with("no answer within the connect timeout")
        );
    }

    #[test]
    fn a_generation_whose_peers_all_answer_is_kept_through_an_outage_and_one_without_is_fenced() {
        let t0 = Instant::now();
        let mut r = Reach::new(t0);
        r.contact(t0);
        r.stream_broke(t0 + s(5), s(4));
        r.failed("transport error: tcp connect error: Connection timed out (os error 110)");
        let v = r.check(t0 + s(31), true, Some(4), L, EP);
        assert!(
            v.progress.is_none_or(|p| !p.contains("every peer")),
            "a TTL counts from the break"
        );
        let v = r.check(t0 + s(32), true, Some(4), L, EP);
        assert_eq!(v.fence, None, "vouched for by its peers");
        let line = v.progress.expect("said once");
        assert!(
            line.contains("but every peer of generation 4 answers")
                && line.contains("keeps its generation (its workers, or the failure it reports)"),
            "{line}"
        );
        let again = r.check(t0 + s(32), true, Some(4), L, EP);
        assert!(
            again.progress.is_none_or(|p| !p.contains("every peer")),
            "the kept line is said once per outage"
        );
        // The peers fall silent too: this node is the one cut off; it fences as before.
        let v = r.check(t0 + s(40), true, None, L, EP);
        assert!(v.fence.unwrap().starts_with(UNREACHABLE));
        // Still past the join timeout the link ends, peers or not.
        let v = r.check(t0 + s(602), false, Some(4), L, EP);
        assert!(v.give_up.is_some());
        // The server answers: the outage kept is told once, with its length from the server's
        // last message (a broken stream vouched for the TTL, not for the server's word).
        assert_eq!(r.take_outage(t0 + s(602)), Some((4, s(602))));
        assert_eq!(r.take_outage(t0 + s(602)), None);
        // After contact, a new outage is said again.
        r.contact(t0 + s(602));
        let v = r.check(t0 + s(633), true, Some(4), L, EP);
        assert!(v.progress.unwrap().contains("every peer of generation 4"));
    }

    #[test]
    fn a_listener_that_does_not_speak_http2_is_named_as_another_program() {
        use drun_rendezvous::server::tls::Mode;
        let why = explain(
            "http2 error".into(),
            "transport error: http2 error",
            Mode::Plain,
        );
        assert!(
            why.starts_with("http2 error: what listens on that port is not a rendezvous server"),
            "{why}"
        );
        assert_eq!(
            explain(
                "connection refused".into(),
                "connection refused",
                Mode::Plain
            ),
            "connection refused"
        );
    }
}
