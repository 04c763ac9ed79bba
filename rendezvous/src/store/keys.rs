//! Key layout under `/drun/v1/<run>/` (`docs/architecture.md` §3). One place builds every key.

use crate::store::LeaseId;

/// Whether `key` is a node's join (`/drun/v1/<run>/waiting/<node>`) or its membership of a
/// generation (`/drun/v1/<run>/members/<g>/<node>`): a session that resumes the agent's lease
/// on another replica writes that key again before the agent hears anything
/// (`session/open.rs`: the membership as it re-enters the generation, the join as it waits on
/// or is admitted), so the lease's registry record need not name it
/// (`store/shared_lease.rs`).
pub fn rewritten_on_resume(key: &str) -> bool {
    let Some((_run, rest)) = key
        .strip_prefix("/drun/v1/")
        .and_then(|k| k.split_once('/'))
    else {
        return false;
    };
    let plain = |node: &str| !node.is_empty() && !node.contains('/');
    if let Some(node) = rest.strip_prefix("waiting/") {
        return plain(node);
    }
    rest.strip_prefix("members/")
        .and_then(|r| r.split_once('/'))
        .is_some_and(|(g, node)| {
            !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()) && plain(node)
        })
}

/// Keys of one run.
#[derive(Debug, Clone)]
pub struct RunKeys {
    prefix: String,
}

impl RunKeys {
    /// Keys of run `run` (the `--rdzv-id`).
    pub fn new(run: &str) -> Self {
        Self {
            prefix: format!("/drun/v1/{run}/"),
        }
    }

    /// The run's prefix, ending in `/`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Current generation number (decimal).
    pub fn gen_current(&self) -> String {
        [self.prefix.as_str(), "gen/current"].concat()
    }

    /// Decider of the round being formed (node id), under the decider's lease. Its name extends
    /// `gen/current` so one prefix watch sees the generation, the decider and its progress.
    pub fn leader(&self) -> String {
        [self.prefix.as_str(), "gen/current.leader"].concat()
    }

    /// The decider's latest progress line ("waiting for 1 more node (2/3)").
    pub fn progress(&self) -> String {
        [self.prefix.as_str(), "gen/current.progress"].concat()
    }

    /// The verdict of a failed round (JSON [`crate::round::RoundFailure`]): every node it names
    /// that joined before it was written ends with its message. Under `gen/current` so the
    /// waiting nodes' one prefix watch sees it.
    pub fn round_failed(&self) -> String {
        [self.prefix.as_str(), "gen/current.failed"].concat()
    }

    /// Assignment of generation `g` (JSON [`crate::Plan`]).
    pub fn plan(&self, g: u64) -> String {
        format!("{}gen/{g}/plan", self.prefix)
    }

    /// Prefix of the nodes asking to join.
    pub fn waiting_prefix(&self) -> String {
        [self.prefix.as_str(), "waiting/"].concat()
    }

    /// A node asking to join (JSON [`crate::Candidate`]), attached to the agent's lease.
    pub fn waiting(&self, node: &str) -> String {
        format!("{}waiting/{node}", self.prefix)
    }

    /// The session that resumed `node`'s agent lease `lease` last (a token), attached to that
    /// lease: a server-side session whose agent vanished revokes the lease only if no newer
    /// session (the agent reconnected with the lease, possibly to another replica) took it
    /// over. Only a resume writes it: no other session can speak for a lease just granted.
    pub fn session_owner(&self, node: &str, lease: LeaseId) -> String {
        format!("{}sessions/{node}/{lease:016x}", self.prefix)
    }

    /// Why `node` was dropped (e.g. "connection to its agent closed"), written just before its
    /// lease is revoked; read to name a node loss. No lease: it outlives the node.
    pub fn lost(&self, node: &str) -> String {
        format!("{}lost/{node}", self.prefix)
    }

    /// Membership of `node` in generation `g`, attached to the agent's lease.
    pub fn member(&self, g: u64, node: &str) -> String {
        format!("{}members/{g}/{node}", self.prefix)
    }

    /// Prefix of the members of generation `g`.
    pub fn members_prefix(&self, g: u64) -> String {
        format!("{}members/{g}/", self.prefix)
    }

    /// Set when generation `g` must re-form (value: the reason). Written once.
    pub fn closed(&self, g: u64) -> String {
        format!("{}gen/{g}/closed", self.prefix)
    }

    /// The first worker failure of generation `g` (a JSON [`crate::decisions::root_cause::RootCause`]),
    /// written with the decision on it. Outside `gen/<g>/`: no member's watch wakes for it.
    pub fn root_cause(&self, g: u64) -> String {
        format!("{}{g}", self.root_cause_prefix())
    }

    /// The prefix of every generation's root cause.
    pub fn root_cause_prefix(&self) -> String {
        [self.prefix.as_str(), "root-cause/"].concat()
    }

    /// Keys of generation `g` itself (plan, closed); watched by its members.
    pub fn generation_prefix(&self, g: u64) -> String {
        format!("{}gen/{g}/", self.prefix)
    }

    /// Prefix of the nodes whose workers all succeeded in generation `g` (outside
    /// [`Self::generation_prefix`], so members watching their generation do not see each one).
    pub fn done_prefix(&self, g: u64) -> String {
        format!("{}done/{g}/", self.prefix)
    }

    /// `node`'s workers all succeeded in generation `g`.
    pub fn done(&self, g: u64, node: &str) -> String {
        format!("{}done/{g}/{node}", self.prefix)
    }

    /// When generation `g` formed and what its re-form lost (JSON
    /// [`crate::decisions::formation::Formation`]), written with its plan. Outside `gen/<g>/`: no member's
    /// watch wakes for it.
    pub fn formation(&self, g: u64) -> String {
        format!("{}formation/{g}", self.prefix)
    }

    /// The failure (a worker failure or a lost node) that ended generation `g` (JSON
    /// [`crate::ledger::failure_log::FailureRecord`]), written with the close: the job-wide failure
    /// history `--ckpt-interval auto` takes M from. Outside `gen/<g>/`, so it outlives re-forms.
    pub fn failure(&self, g: u64) -> String {
        format!("{}{g:020}", self.failures_prefix())
    }

    /// The prefix of every generation's failure record.
    pub fn failures_prefix(&self) -> String {
        [self.prefix.as_str(), "failure/"].concat()
    }

    /// The checkpoint interval in force (JSON [`crate::decisions::ckpt_interval::Interval`]), written by the
    /// session that decides it (node rank 0's) when it changes; read by `status`.
    pub fn ckpt_interval(&self) -> String {
        [self.prefix.as_str(), "ckpt/interval"].concat()
    }

    /// A coordinated checkpoint `--ckpt-interval` asked of generation `g` while `ckpt/latest`
    /// was `latest` (JSON [`crate::session::SaveRequest`]): one per checkpoint, under the
    /// generation's prefix, so members see it.
    pub fn save_due(&self, g: u64, latest: &str) -> String {
        let latest = if latest.is_empty() { "none" } else { latest };
        format!("{}gen/{g}/save-due/{latest}", self.prefix)
    }

    /// The prefix of generation `g`'s [`Self::save_due`] keys.
    pub fn save_due_prefix(&self, g: u64) -> String {
        format!("{}gen/{g}/save-due/", self.prefix)
    }

    /// Prefix of the accusations of generation `g`: `<accused>/<by>` says member `by` does not
    /// hear `accused` (its agent's probes go unanswered); under `by`'s lease
    /// (`session::silence`).
    pub fn silent_prefix(&self, g: u64) -> String {
        format!("{}gen/{g}/silent/", self.prefix)
    }

    /// Member `by` of generation `g` does not hear member `accused`.
    pub fn silent(&self, g: u64, accused: &str, by: &str) -> String {
        format!("{}{accused}/{by}", self.silent_prefix(g))
    }

    /// Job-wide restart counters (JSON).
    pub fn restarts(&self) -> String {
        [self.prefix.as_str(), "restarts"].concat()
    }

    /// Terminal state of the run (JSON), written once.
    pub fn finished(&self) -> String {
        [self.prefix.as_str(), "finished"].concat()
    }
    /// A coordinated checkpoint was requested in generation `g` (JSON
    /// [`crate::session::SaveRequest`]); under the generation's prefix, so members see it.
    pub fn preempt(&self, g: u64) -> String {
        format!("{}gen/{g}/preempt", self.prefix)
    }

    /// A coordinated checkpoint before admitting a newcomer was requested in generation `g`
    /// (`--on-scale-up checkpoint`; JSON [`crate::session::SaveRequest`]); under the
    /// generation's prefix, so members see it. Separate from [`Self::preempt`], so a
    /// preemption warning during it is still recorded.
    pub fn scale_up_save(&self, g: u64) -> String {
        format!("{}gen/{g}/scale-up-save", self.prefix)
    }

    /// Prefix of every shard record of the checkpoint ledger.
    pub fn ckpt_shards_prefix(&self) -> String {
        [self.prefix.as_str(), "ckpt/shards/"].concat()
    }

    /// Prefix of the shard records of step `step` in generation `g`.
    pub fn ckpt_step_prefix(&self, g: u64, step: u64) -> String {
        format!("{}ckpt/shards/{g}/{step}/", self.prefix)
    }

    /// Shard record of `node` for step `step` of generation `g` (JSON
    /// [`crate::ledger::NodeCommit`]): one per node, all its ranks batched.
    pub fn ckpt_shard(&self, g: u64, step: u64, node: &str) -> String {
        format!("{}ckpt/shards/{g}/{step}/{node}", self.prefix)
    }

    /// Prefix of the sealed manifests.
    pub fn ckpt_manifest_prefix(&self) -> String {
        [self.prefix.as_str(), "ckpt/manifest/"].concat()
    }

    /// Sealed manifest `id` (JSON [`crate::ledger::Manifest`]).
    pub fn ckpt_manifest(&self, id: &str) -> String {
        format!("{}ckpt/manifest/{id}", self.prefix)
    }

    /// Id of the newest sealed manifest; moves forward in `(step, generation)` only.
    pub fn ckpt_latest(&self) -> String {
        [self.prefix.as_str(), "ckpt/latest"].concat()
    }

    /// Prefix of manifests that failed verification.
    pub fn ckpt_bad_prefix(&self) -> String {
        [self.prefix.as_str(), "ckpt/bad/"].concat()
    }

    /// Manifest `id` failed verification (value: why).
    pub fn ckpt_bad(&self, id: &str) -> String {
        format!("{}ckpt/bad/{id}", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::{rewritten_on_resume, RunKeys};

    #[test]
    fn only_a_nodes_join_and_membership_are_rewritten_on_resume() {
        let k = RunKeys::new("job");
        assert!(rewritten_on_resume(&k.waiting("node-3")));
        assert!(rewritten_on_resume(&k.member(12, "node-3")));
        for other in [
            k.waiting_prefix(),
            k.members_prefix(12),
            k.session_owner("node-3", 7),
            k.leader(),
            k.silent(12, "a", "b"),
            k.lost("node-3"),
            k.plan(12),
            "/drun/v1/job/members/x/node-3".to_string(),
            "/drun/v1/job/waiting/a/b".to_string(),
            "/other/job/waiting/node-3".to_string(),
        ] {
            assert!(!rewritten_on_resume(&other), "{other}");
        }
    }
}
