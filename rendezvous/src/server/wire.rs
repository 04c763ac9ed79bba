//! Conversions between the rendezvous types and the `drun.v1` wire messages.

use drun_proto::v1 as pb;

use crate::decisions::root_cause::RootCause;
use crate::ledger::Retention;
use crate::round::Restarts;
use crate::session::{Event, Request, Resume, RunEnd};
use crate::{Candidate, Join, Member, Plan};

impl From<&Join> for pb::Candidate {
    fn from(j: &Join) -> Self {
        let c = &j.candidate;
        pb::Candidate {
            node_id: c.node_id.clone(),
            advertise_addr: c.advertise_addr.clone(),
            slots: c.slots,
            requested_node_rank: c.requested_node_rank.map_or(-1, |r| r as i32),
            master_port: u32::from(c.master_port),
            probe_port: u32::from(c.probe_port),
            resume_hint_json: j
                .resume_hint
                .as_ref()
                .map(|m| serde_json::to_string(m).expect("Manifest serializes"))
                .unwrap_or_default(),
            fingerprint: j
                .fingerprint
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            env_check: j
                .env_check
                .map(|c| c.as_str().to_string())
                .unwrap_or_default(),
            held_json: if j.held.is_empty() {
                String::new()
            } else {
                serde_json::to_string(&j.held).expect("HeldStep serializes")
            },
        }
    }
}

impl From<pb::Candidate> for Join {
    fn from(c: pb::Candidate) -> Self {
        Join {
            candidate: Candidate {
                node_id: c.node_id,
                advertise_addr: c.advertise_addr,
                slots: c.slots,
                requested_node_rank: u32::try_from(c.requested_node_rank).ok(),
                master_port: u16::try_from(c.master_port).unwrap_or(0),
                probe_port: u16::try_from(c.probe_port).unwrap_or(0),
            },
            resume_hint: optional_json(&c.resume_hint_json),
            fingerprint: c.fingerprint.into_iter().collect(),
            env_check: crate::decisions::envcheck::EnvCheck::parse(&c.env_check),
            held: optional_json(&c.held_json).unwrap_or_default(),
        }
    }
}

impl From<&Plan> for pb::Plan {
    fn from(p: &Plan) -> Self {
        pb::Plan {
            run_id: p.run_id.clone(),
            generation: p.generation,
            members: p
                .members
                .iter()
                .map(|m| pb::Member {
                    node_id: m.node_id.clone(),
                    advertise_addr: m.advertise_addr.clone(),
                    node_rank: m.node_rank,
                    slots: m.slots,
                    base_rank: m.base_rank,
                    probe_port: u32::from(m.probe_port),
                })
                .collect(),
            world_size: p.world_size,
            master_addr: p.master_addr.clone(),
            master_port: u32::from(p.master_port),
            restarts_failures: p.restarts_failures,
            restarts_membership: p.restarts_membership,
            resume_json: p
                .resume
                .as_ref()
                .map(|m| serde_json::to_string(m).expect("Manifest serializes"))
                .unwrap_or_default(),
            resume_memory_json: p
                .resume_memory
                .as_ref()
                .map(|m| serde_json::to_string(m).expect("MemoryResume serializes"))
                .unwrap_or_default(),
            notes: p.notes.clone(),
            formed_because: p.formed_because.clone(),
            node_count: p.node_count,
        }
    }
}

impl From<pb::Plan> for Plan {
    fn from(p: pb::Plan) -> Self {
        Plan {
            run_id: p.run_id,
            generation: p.generation,
            members: p
                .members
                .into_iter()
                .map(|m| Member {
                    node_id: m.node_id,
                    advertise_addr: m.advertise_addr,
                    node_rank: m.node_rank,
                    slots: m.slots,
                    base_rank: m.base_rank,
                    probe_port: u16::try_from(m.probe_port).unwrap_or(0),
                })
                .collect(),
            world_size: p.world_size,
            master_addr: p.master_addr,
            master_port: u16::try_from(p.master_port).unwrap_or(0),
            restarts_failures: p.restarts_failures,
            restarts_membership: p.restarts_membership,
            resume: optional_json(&p.resume_json),
            resume_memory: optional_json(&p.resume_memory_json),
            notes: p.notes,
            formed_because: p.formed_because,
            node_count: p.node_count,
        }
    }
}

/// A request as sent on the wire.
pub fn request_to_wire(r: &Request) -> pb::AgentMessage {
    use pb::agent_message::Kind;
    let kind = match r {
        Request::Join(c, after) => Kind::Join(pb::Join {
            candidate: Some(c.into()),
            after_generation: *after,
        }),
        Request::KeepAlive => Kind::KeepAlive(true),
        Request::Succeeded(g) => Kind::Succeeded(*g),
        Request::Failed {
            generation,
            description,
            cause,
        } => Kind::Failed(pb::Failed {
            generation: *generation,
            description: description.clone(),
            root_cause_json: cause_to_wire(cause.as_ref()),
        }),
        Request::Leave => Kind::Leave(true),
        Request::Unfit { reason } => Kind::Unfit(pb::Unfit {
            reason: reason.clone(),
        }),
        Request::StandBy(g) => Kind::StandBy(*g),
        Request::Commit { commit, retention } => Kind::Commit(pb::Commit {
            node_commit_json: serde_json::to_string(commit).expect("NodeCommit serializes"),
            keep_last: retention.keep_last,
            keep_every: retention.keep_every,
        }),
        Request::Preempt { generation, reason } => Kind::Preempt(pb::Preempt {
            generation: *generation,
            reason: reason.clone(),
        }),
        Request::Report { kind, json } => Kind::Report(pb::NodeReport {
            kind: kind.as_str().to_string(),
            json: json.clone(),
        }),
        Request::MarkBad {
            generation,
            id,
            reason,
        } => Kind::BadCheckpoint(pb::BadCheckpoint {
            generation: *generation,
            manifest_id: id.clone(),
            reason: reason.clone(),
        }),
    };
    pb::AgentMessage { kind: Some(kind) }
}

/// A wire message as a request; `None` for Hello or an empty message.
pub fn request_from_wire(m: pb::AgentMessage) -> Option<Request> {
    use pb::agent_message::Kind;
    Some(match m.kind? {
        Kind::Hello(_) => return None,
        Kind::Join(j) => Request::Join(j.candidate?.into(), j.after_generation),
        Kind::KeepAlive(_) => Request::KeepAlive,
        Kind::Succeeded(g) => Request::Succeeded(g),
        Kind::Failed(f) => Request::Failed {
            generation: f.generation,
            description: f.description,
            cause: optional_json(&f.root_cause_json),
        },
        Kind::Leave(_) => Request::Leave,
        Kind::Unfit(u) => Request::Unfit { reason: u.reason },
        Kind::StandBy(g) => Request::StandBy(g),
        Kind::Commit(c) => Request::Commit {
            commit: serde_json::from_str(&c.node_commit_json).ok()?,
            retention: Retention {
                keep_last: c.keep_last,
                keep_every: c.keep_every,
            },
        },
        Kind::Preempt(p) => Request::Preempt {
            generation: p.generation,
            reason: p.reason,
        },
        Kind::Report(r) => Request::Report {
            kind: crate::store::reports::ReportKind::parse(&r.kind)?,
            json: r.json,
        },
        Kind::BadCheckpoint(b) => Request::MarkBad {
            generation: b.generation,
            id: b.manifest_id,
            reason: b.reason,
        },
    })
}

/// An event as sent on the wire.
pub fn event_to_wire(e: &Event) -> pb::ServerEvent {
    use pb::server_event::Kind;
    let kind = match e {
        Event::Opened { lease } => Kind::OpenedLease(*lease),
        Event::Waiting(t) => Kind::Waiting(t.clone()),
        Event::Formed(p) => Kind::Formed(p.into()),
        Event::Reform { generation, reason } => Kind::Reform(pb::Reform {
            generation: *generation,
            reason: reason.clone(),
        }),
        Event::Finished(end) => Kind::Finished(pb::Finished {
            success: end.success,
            reason: end.reason.clone(),
            at_ms: end.at_ms,
            root_cause_json: cause_to_wire(end.root_cause.as_ref()),
            retryable: end.retryable,
            unfit: end.unfit,
        }),
        Event::FailureDecision {
            restart,
            restarts,
            cause,
        } => Kind::FailureDecision(pb::FailureDecision {
            restart: *restart,
            restarts_failures: restarts.failures,
            restarts_membership: restarts.membership,
            history: restarts.history.clone(),
            root_cause_json: cause_to_wire(cause.as_ref()),
        }),
        Event::Fenced(r) => Kind::Fenced(r.clone()),
        Event::Error(r) => Kind::Error(r.clone()),
        Event::SaveRequested(r) => {
            Kind::SaveRequested(serde_json::to_string(r).expect("SaveRequest serializes"))
        }
        Event::Sealed(id) => Kind::Sealed(id.clone()),
        Event::Pace(p) => Kind::Pace(serde_json::to_string(p).expect("a pace serializes")),
        Event::Ping => Kind::Ping(true),
        Event::StandBy(reach) => Kind::StandBy(pb::StandBy {
            reach: reach
                .iter()
                .map(|r| pb::Reach {
                    node_id: r.node_id.clone(),
                    advertise_addr: r.advertise_addr.clone(),
                    probe_port: u32::from(r.probe_port),
                })
                .collect(),
        }),
        Event::Committed {
            generation,
            step,
            result,
        } => Kind::Committed(pb::Committed {
            generation: *generation,
            step: *step,
            outcome_json: result
                .as_ref()
                .map(|o| serde_json::to_string(o).expect("CommitOutcome serializes"))
                .unwrap_or_default(),
            error: result
                .as_ref()
                .err()
                .map(ToString::to_string)
                .unwrap_or_default(),
        }),
    };
    pb::ServerEvent { kind: Some(kind) }
}

/// A wire event as an event; `None` for an empty message.
pub fn event_from_wire(e: pb::ServerEvent) -> Option<Event> {
    use pb::server_event::Kind;
    Some(match e.kind? {
        Kind::OpenedLease(lease) => Event::Opened { lease },
        Kind::KeptAlive(_) => return None,
        Kind::Ping(_) => Event::Ping,
        Kind::StandBy(s) => Event::StandBy(
            s.reach
                .into_iter()
                .map(|r| crate::session::standby::Reach {
                    node_id: r.node_id,
                    advertise_addr: r.advertise_addr,
                    probe_port: u16::try_from(r.probe_port).unwrap_or(0),
                })
                .collect(),
        ),
        Kind::Waiting(t) => Event::Waiting(t),
        Kind::Formed(p) => Event::Formed(p.into()),
        Kind::Reform(r) => Event::Reform {
            generation: r.generation,
            reason: r.reason,
        },
        Kind::Finished(f) => Event::Finished(RunEnd {
            success: f.success,
            reason: f.reason,
            at_ms: f.at_ms,
            root_cause: optional_json(&f.root_cause_json),
            retryable: f.retryable,
            unfit: f.unfit,
        }),
        Kind::FailureDecision(d) => Event::FailureDecision {
            restart: d.restart,
            restarts: Restarts {
                failures: d.restarts_failures,
                membership: d.restarts_membership,
                history: d.history,
            },
            cause: optional_json(&d.root_cause_json),
        },
        Kind::Fenced(r) => Event::Fenced(r),
        Kind::Error(r) => Event::Error(r),
        Kind::SaveRequested(j) => Event::SaveRequested(serde_json::from_str(&j).ok()?),
        Kind::Sealed(id) => Event::Sealed(id),
        Kind::Pace(j) => Event::Pace(serde_json::from_str(&j).ok()?),
        Kind::Committed(c) => Event::Committed {
            generation: c.generation,
            step: c.step,
            result: if c.error.is_empty() {
                serde_json::from_str(&c.outcome_json)
                    .map_err(|e| crate::CommitRefused::Undecodable(e.to_string()))
            } else {
                Err(crate::CommitRefused::Said(c.error))
            },
        },
    })
}

impl From<&Resume> for pb::Resume {
    fn from(r: &Resume) -> Self {
        pb::Resume {
            lease_id: r.lease,
            generation: r.generation,
            waiting: r.waiting.as_ref().map(Into::into),
        }
    }
}

impl From<pb::Resume> for Resume {
    fn from(r: pb::Resume) -> Self {
        Resume {
            lease: r.lease_id,
            generation: r.generation,
            waiting: r.waiting.map(Into::into),
        }
    }
}

/// A root cause as its wire field: JSON, empty for none.
fn cause_to_wire(c: Option<&RootCause>) -> String {
    c.map(|c| serde_json::to_string(c).expect("RootCause serializes"))
        .unwrap_or_default()
}

/// A root cause from its wire field; none when empty or unreadable (a newer peer's shape).
/// An optional JSON field: empty (absent) is `None` without a parse, which would build an error
/// (and, the first time, detect CPU features for it) on every plan and join.
fn optional_json<T: serde::de::DeserializeOwned>(json: &str) -> Option<T> {
    (!json.is_empty())
        .then(|| serde_json::from_str(json).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::RunEnd;

    #[test]
    fn a_run_end_crosses_the_wire_with_whether_a_restart_may_carry_on() {
        for (success, retryable, unfit) in [
            (true, false, false),
            (false, false, false),
            (false, true, false),
            (false, false, true),
        ] {
            let end = Event::Finished(RunEnd {
                success,
                reason: "why".into(),
                at_ms: 42,
                root_cause: None,
                retryable,
                unfit,
            });
            assert_eq!(event_from_wire(event_to_wire(&end)), Some(end));
        }
    }

    #[test]
    fn an_unfit_node_s_request_crosses_the_wire() {
        let r = Request::Unfit {
            reason: "GPU health: GPU 1: lost".into(),
        };
        assert_eq!(request_from_wire(request_to_wire(&r)), Some(r));
    }

    /// A refused commit's line crosses the wire as it was; it comes back as the line.
    #[test]
    fn a_refused_commit_crosses_the_wire_as_its_line() {
        let refusals = [
            crate::CommitRefused::NotRunning {
                generation: 4,
                node: "n1".into(),
            },
            crate::CommitRefused::Ledger("checkpoint 00000007 is already sealed".into()),
            crate::CommitRefused::NoLedger,
        ];
        for refused in refusals {
            let line = refused.to_string();
            let ev = Event::Committed {
                generation: 4,
                step: 7,
                result: Err(refused),
            };
            let wire = event_to_wire(&ev);
            let Some(pb::server_event::Kind::Committed(c)) = &wire.kind else {
                panic!("{wire:?}")
            };
            assert_eq!(c.error, line);
            assert_eq!(
                event_from_wire(wire),
                Some(Event::Committed {
                    generation: 4,
                    step: 7,
                    result: Err(crate::CommitRefused::Said(line)),
                })
            );
        }
        assert_eq!(
            crate::CommitRefused::NotRunning {
                generation: 4,
                node: "n1".into()
            }
            .to_string(),
            "stale commit: generation 4 is not running on node n1"
        );
    }
}
