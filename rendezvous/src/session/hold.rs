//! Whether a server keeps the lease of an agent it no longer hears: pure rules of the silences,
//! tested with synthetic durations.
//!
//! A server that hears no agent of a run at all — every session of the run silent at once — is
//! far more likely cut off itself (its host's cable, its rack's switch, a network between the
//! control plane and the nodes) than to have lost every node in the same second. Expiring or
//! revoking the leases then would close a generation that trains on undisturbed, and restart
//! every job of the cluster when the control plane comes back. So while the run is *deaf*
//! (nobody of it heard for more than a keep-alive period and a margin), the server keeps its
//! silent agents' leases, for at most [`HOLD_MAX`]; as soon as any agent of the run is heard
//! again the usual rules apply, after a [`return_grace`] for the others to reconnect. This is
//! what etcd does for leases across a leader election, for the same reason. The agents' side of
//! the rule — keep the generation while every peer answers — is in the launcher's peer probes;
//! `docs/architecture.md` ("Control-plane outages") argues that together they never make two
//! worlds.

use std::time::Duration;

/// The longest a server keeps silent agents' leases for a run it hears nobody of.
pub const HOLD_MAX: Duration = Duration::from_secs(600);
/// Beyond one keep-alive period, how long a run may be silent before the server calls itself
/// deaf (a late keep-alive under load must not look like an outage).
pub const DEAF_MARGIN: Duration = Duration::from_secs(1);

/// Whether a run silent for `run_silent` (since any agent of it was last heard on this server)
/// means this server is cut off, for agents that send a keep-alive every `ttl / 3`.
pub fn deaf(run_silent: Duration, ttl: Duration) -> bool {
    run_silent > ttl / 3 + DEAF_MARGIN && run_silent <= HOLD_MAX
}

/// Why the keeper renews a lease this round, or that it does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renew {
    /// The agent was heard within a TTL.
    Heard,
    /// The agent is silent, but so is its whole run: the lease is held for it.
    Held,
    /// The agent is silent and the run is not: the lease runs out.
    No,
}

/// The server-side keeper's rule: `agent_silent` since this agent was heard, `run_silent` since
/// any agent of its run was (`None`: no run-wide view, e.g. a test session).
pub fn renew(agent_silent: Duration, run_silent: Option<Duration>, ttl: Duration) -> Renew {
    if agent_silent <= ttl {
        Renew::Heard
    } else if run_silent.is_some_and(|r| deaf(r, ttl)) {
        Renew::Held
    } else {
        Renew::No
    }
}

/// What a session whose agent's stream ended without a Leave does after the reconnect grace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterBreak {
    /// Revoke the lease: the node is gone (others of the run are heard, this one is not).
    Revoke,
    /// Keep the lease and look again shortly: the whole run is silent.
    Hold,
}

/// The rule after a broken stream, `run_silent` since any agent of the run was heard.
pub fn after_break(run_silent: Option<Duration>, ttl: Duration) -> AfterBreak {
    if run_silent.is_some_and(|r| deaf(r, ttl)) {
        AfterBreak::Hold
    } else {
        AfterBreak::Revoke
    }
}

/// How long an agent whose lease was held gets to reconnect once its run is heard again (its
/// link retries every 2 s at most): half a TTL, and at least 2 s.
pub fn return_grace(ttl: Duration) -> Duration {
    (ttl / 2).max(Duration::from_secs(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    fn s(n: f64) -> Duration {
        Duration::from_secs_f64(n)
    }

    #[test]
    fn a_run_is_deaf_past_one_keep_alive_period_and_the_margin_and_not_forever() {
        assert!(
            !deaf(s(4.3), TTL),
            "a keep-alive every 3.3 s, 1 s of margin"
        );
        assert!(deaf(s(4.4), TTL));
        assert!(deaf(HOLD_MAX, TTL));
        assert!(!deaf(HOLD_MAX + s(0.1), TTL), "held for 10 minutes at most");
    }

    #[test]
    fn a_heard_agent_is_renewed_a_silent_one_in_a_talking_run_is_not() {
        assert_eq!(renew(s(3.0), Some(s(3.0)), TTL), Renew::Heard);
        assert_eq!(renew(s(10.0), Some(s(0.5)), TTL), Renew::Heard);
        assert_eq!(renew(s(10.1), Some(s(0.5)), TTL), Renew::No);
        assert_eq!(renew(s(10.1), None, TTL), Renew::No, "no run-wide view");
    }

    #[test]
    fn a_silent_agent_of_a_silent_run_is_held_until_the_hold_runs_out() {
        assert_eq!(renew(s(12.0), Some(s(11.0)), TTL), Renew::Held);
        assert_eq!(renew(s(300.0), Some(s(299.0)), TTL), Renew::Held);
        assert_eq!(renew(s(700.0), Some(s(699.0)), TTL), Renew::No);
    }

    #[test]
    fn a_broken_stream_is_revoked_unless_the_whole_run_went_silent() {
        // A crashed or cut-off node while the others talk: revoked after the grace, as before.
        assert_eq!(after_break(Some(s(1.2)), TTL), AfterBreak::Revoke);
        assert_eq!(after_break(None, TTL), AfterBreak::Revoke);
        // Every stream broke by the HTTP/2 keep-alive (6 s of silence): the server is cut off.
        assert_eq!(after_break(Some(s(6.0)), TTL), AfterBreak::Hold);
        assert_eq!(return_grace(TTL), s(5.0));
        assert_eq!(return_grace(s(3.0)), s(2.0));
    }
}
