//! The pure generation core: what a session does about its running generation, given an input and the time.
//!
//! Every decision a session takes while a generation runs lives here, as functions of (the
//! session's view of the generation, a watch event or a timer tick, now, the rules) returning
//! effects for the actor to carry out and a reason a human can read. Nothing here touches the
//! store, spawns or sleeps: the tests drive it with synthetic instants. The actor
//! (`session/actor.rs`) classifies store events into [`Input`]s (`session/watch.rs`), calls
//! [`step`], and executes the
//! [`Effect`]s; a few effects are guarded by one store read (does a newcomer still wait? did the
//! successor start?) whose answer is again judged here ([`successor_lost`]).
//!
//! See `docs/architecture.md` §2 (re-form, restarts, end) for the rules themselves.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

use super::protocol::{Event, RunEnd};
use super::save_clock::SaveClock;
use super::silence::{self, Silence};
use crate::decisions::envcheck::{Door, Report};
use crate::human::duration as human;
use crate::{Join, Plan};

/// The knobs the generation core needs, taken from [`super::SessionConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rules {
    /// `--nnodes` MAX: a newcomer is admitted only below it.
    pub max_nodes: usize,
    /// `--on-scale-up checkpoint`: how long a newcomer waits for a checkpoint's seal.
    pub scale_up_save: Option<Duration>,
    /// The last call (`last_call_timeout`): newcomers that arrive within it of the first one
    /// are admitted in one re-form (zero: each at once).
    pub scale_up_window: Duration,
    /// The successor must write its membership key within this (the lease TTL).
    pub lease_ttl: Duration,
    /// Job-wide worker-failure restart budget.
    pub max_restarts: u32,
    /// `--ckpt-interval`, `--expected-mtbf` (node rank 0's session applies them).
    pub ckpt_interval: crate::decisions::ckpt_interval::IntervalConfig,
}

/// A newcomer held at the door until a coordinated checkpoint is sealed (`--on-scale-up
/// checkpoint`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingScaleUp {
    /// The newcomer that asked to join.
    pub node: String,
    /// `ckpt/latest` when the save was requested: a newer manifest id is the save.
    pub latest_before: String,
    /// Re-form without a checkpoint after this.
    pub deadline: Instant,
}

/// Newcomers held while the scale-up window runs (node rank 0 only): the running world trains
/// meanwhile, and every node that arrives before it ends is admitted in the same re-form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Arrivals {
    /// The newcomers seen so far, in name order.
    pub nodes: BTreeSet<String>,
    /// When the window ends (the first arrival plus the last call).
    pub until: Instant,
}

/// The session's view of the generation it runs, with the deadlines it owns.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Running {
    /// The generation's plan.
    pub plan: Plan,
    /// This node.
    pub node: String,
    /// The node after this one in node-rank order (the one this node watches), if any.
    pub successor: Option<String>,
    /// When the successor must have written its membership key; `None`: it has, or none.
    pub successor_deadline: Option<Instant>,
    /// Node rank 0 only: a newcomer waits while a coordinated checkpoint is taken.
    pub scale_up: Option<PendingScaleUp>,
    /// Node rank 0 only: newcomers held until the scale-up window ends.
    pub arrivals: Option<Arrivals>,
    /// Node rank 0 only, with `--ckpt-interval`: when the next interval save is due.
    pub save_clock: Option<SaveClock>,
    /// Node rank 0 only: what the members' environments agreed on at formation (`None`:
    /// unknown; every newcomer re-forms the group to be judged).
    pub door: Option<Door>,
    /// Who says this node does not answer, and whom it says so of ([`silence`]).
    pub silence: Silence,
}

impl Running {
    /// Enters `plan`'s generation as `node`. `before` is the view this session had (a re-watch
    /// of the same generation keeps its pending scale-up; another generation's is dropped).
    /// `successor_started`: the successor's membership key exists; if not, it has one lease TTL.
    pub fn enter(
        plan: Plan,
        node: &str,
        before: Option<Running>,
        successor_started: bool,
        now: Instant,
        rules: &Rules,
    ) -> Running {
        let successor = successor(&plan, node);
        let before = before.filter(|b| b.plan.generation == plan.generation);
        let first = plan.members.first().is_some_and(|m| m.node_id == node);
        let save_clock = (first && rules.ckpt_interval.mode.is_on()).then(|| {
            before
                .as_ref()
                .and_then(|b| b.save_clock)
                .unwrap_or(SaveClock::start(now))
        });
        let silence = before
            .as_ref()
            .map(|b| b.silence.clone())
            .unwrap_or_default();
        let arrivals = before.as_ref().and_then(|b| b.arrivals.clone());
        let scale_up = before.and_then(|b| b.scale_up);
        let successor_deadline =
            (successor.is_some() && !successor_started).then(|| now + rules.lease_ttl);
        Running {
            plan,
            node: node.to_string(),
            successor,
            successor_deadline,
            scale_up,
            arrivals,
            save_clock,
            door: None,
            silence,
        }
    }

    /// The generation number.
    pub fn generation(&self) -> u64 {
        self.plan.generation
    }

    /// The earliest instant at which a [`Input::Tick`] can change anything.
    pub fn wake_at(&self) -> Option<Instant> {
        let scale_up = self.scale_up.as_ref().map(|p| p.deadline);
        let save = self.save_clock.as_ref().and_then(SaveClock::due_at);
        [
            self.successor_deadline,
            scale_up,
            self.arrivals.as_ref().map(|a| a.until),
            save,
            self.silence.wake_at(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The scale-up save of `node` was written (`latest_before` was `ckpt/latest` then): hold
    /// the newcomer until its seal or `now + limit`.
    pub fn scale_up_requested(
        &mut self,
        node: &str,
        latest_before: String,
        now: Instant,
        limit: Duration,
    ) {
        self.scale_up = Some(PendingScaleUp {
            node: node.to_string(),
            latest_before,
            deadline: now + limit,
        });
    }

    /// Nobody waits any more: the pending scale-up is called off (returns its newcomer).
    pub fn call_off_scale_up(&mut self) -> Option<String> {
        self.scale_up.take().map(|p| p.node)
    }
}

/// What the store showed a running generation, or a timer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Input {
    /// `gen/<g>/closed` was written; the value is the reason.
    Closed(String),
    /// A coordinated checkpoint was requested (`gen/<g>/preempt`, `scale-up-save` or
    /// `save-due/…`; raw value).
    SaveRequest(Vec<u8>),
    /// `ckpt/latest` moved to this manifest id.
    Sealed(String),
    /// The run ended (`finished`).
    Finished(RunEnd),
    /// `waiting/<node>` was written: a node asks to join, with its join (`None`: the value did
    /// not decode).
    Waiting(String, Option<Box<Join>>),
    /// A `waiting/<node>` key went away.
    WaitingGone,
    /// `members/<g>/<node>` was written: the node started.
    MemberUp(String),
    /// `members/<g>/<node>` went away: the node left or its lease expired.
    MemberGone(String),
    /// `gen/<g>/silent/<accused>/<by>` was written (`still`) or withdrawn: member `by` does
    /// not hear member `accused`.
    Accused {
        /// The member not heard.
        accused: String,
        /// The member that says so.
        by: String,
        /// Written (true) or withdrawn.
        still: bool,
    },
    /// This node's agent sent something (it answers the ping of [`silence`]).
    AgentHeard,
    /// Node rank 0's checkpoint interval was decided (what [`Effect::EvaluateInterval`] read).
    IntervalDecided(Duration),
    /// The scale-up save for `node` was written while `ckpt/latest` was `latest_before` (what
    /// [`Effect::RequestScaleUpSave`] did): hold the newcomer up to `limit`.
    ScaleUpSaveWritten {
        /// The newcomer(s), listed.
        node: String,
        /// `ckpt/latest` when the save was requested.
        latest_before: String,
        /// How long to wait for the seal.
        limit: Duration,
    },
    /// No newcomer waits any more (what [`Effect::CallOffIfNobodyWaits`] read).
    NobodyWaits,
    /// A watched key this core has no use for.
    Other,
    /// Time passed: deadlines at or before `now` are due.
    Tick,
}

/// What the actor must do.
// Short-lived, a few per step: the size of `Emit` does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Effect {
    /// Tell the agent.
    Emit(Event),
    /// Tell the agent about a save request (raw value; undecodable ones are logged).
    ReportSaveRequest(Vec<u8>),
    /// Close the generation once (guarded on `gen/current`), with this reason.
    Close(String),
    /// `--ckpt-interval` (node rank 0): read C and M from the store, decide the interval,
    /// report it when it changed, and set [`Running::save_clock`]. `entered`: the generation
    /// just started (after a re-form, report the work it lost).
    EvaluateInterval {
        /// The generation just started.
        entered: bool,
    },
    /// `--ckpt-interval` (node rank 0): this interval since the last seal passed; ask every
    /// rank for a checkpoint (`gen/<g>/save-due/<latest>`).
    RequestIntervalSave(Duration),
    /// Close the generation with `reason` only if a newcomer still waits; otherwise, when
    /// `gone_note` is set, log it.
    AdmitIfWaiting {
        /// The close reason.
        reason: String,
        /// Logged when nobody waits any more.
        gone_note: Option<String>,
    },
    /// Ask every rank for a checkpoint before admitting `node`; then
    /// [`Running::scale_up_requested`].
    RequestScaleUpSave {
        /// The newcomer.
        node: String,
        /// How long to wait for the seal.
        limit: Duration,
    },
    /// Refuse the newcomer `node` with `message` (its round's published verdict) without
    /// re-forming: it ends with the refusal, the group runs on.
    TurnAway {
        /// The newcomer.
        node: String,
        /// The refusal (contains [`crate::decisions::envcheck::REFUSAL_MARK`]).
        message: String,
    },
    /// Call the pending scale-up off if no newcomer waits any more
    /// ([`Running::call_off_scale_up`]).
    CallOffIfNobodyWaits,
    /// Ask this node's agent to answer at once ([`silence`]).
    Ping,
    /// Give this node up as lost with `reason` unless its agent was heard since `asked_at`
    /// ([`silence`]).
    GiveUpIfUnheard {
        /// When the agent was asked.
        asked_at: Instant,
        /// The loss record's line.
        reason: String,
    },
    /// The successor vanished: read why and whether a preemption save is sealed, then judge
    /// with [`successor_lost`].
    SuccessorLost(String),
    /// The successor's start deadline passed: close if its membership key is still missing,
    /// with this reason.
    CheckSuccessorStarted {
        /// The successor.
        node: String,
        /// The close reason if it did not start.
        reason: String,
    },
}

/// The outcome of one [`step`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Step {
    /// In order.
    pub effects: Vec<Effect>,
    /// The generation is over for this session (re-form or end): the session goes idle.
    pub ends: bool,
    /// Why, for a human (empty: nothing happened).
    pub reason: String,
}

impl Step {
    fn nothing(reason: impl Into<String>) -> Step {
        Step {
            effects: vec![],
            ends: false,
            reason: reason.into(),
        }
    }

    fn does(effects: Vec<Effect>, reason: impl Into<String>) -> Step {
        Step {
            effects,
            ends: false,
            reason: reason.into(),
        }
    }

    fn ends(effect: Effect, reason: impl Into<String>) -> Step {
        Step {
            effects: vec![effect],
            ends: true,
            reason: reason.into(),
        }
    }
}

/// The core: one input to a running generation. Pure: same inputs, same answer.
pub(crate) fn step(run: &mut Running, input: Input, now: Instant, rules: &Rules) -> Step {
    let g = run.generation();
    match input {
        Input::Closed(reason) => Step::ends(
            Effect::Emit(Event::Reform {
                generation: g,
                reason: reason.clone(),
            }),
            format!("generation {g} closed: {reason}"),
        ),
        Input::Finished(end) => {
            let why = format!("the run ended: {}", end.reason);
            Step::ends(Effect::Emit(Event::Finished(end)), why)
        }
        Input::SaveRequest(v) => Step::does(
            vec![Effect::ReportSaveRequest(v)],
            "a coordinated checkpoint was requested",
        ),
        Input::Sealed(id) => sealed(run, id, now),
        Input::Waiting(node, join) => newcomer(run, node, join.as_deref(), now, rules),
        Input::WaitingGone if run.scale_up.is_some() => Step::does(
            vec![Effect::CallOffIfNobodyWaits],
            "a node stopped waiting while a scale-up is pending",
        ),
        Input::MemberUp(node) if run.successor.as_deref() == Some(node.as_str()) => {
            run.successor_deadline = None;
            Step::nothing(format!("successor {node} started"))
        }
        Input::MemberGone(node) if run.successor.as_deref() == Some(node.as_str()) => Step::does(
            vec![Effect::SuccessorLost(node.clone())],
            format!("successor {node} is gone"),
        ),
        Input::Accused { accused, by, still } if accused == run.node => {
            silent(run.silence.accused(&by, still, now))
        }
        Input::AgentHeard => silent(run.silence.heard(now)),
        Input::IntervalDecided(interval) => {
            if let Some(c) = run.save_clock.as_mut() {
                c.set(interval);
            }
            Step::nothing("")
        }
        Input::ScaleUpSaveWritten {
            node,
            latest_before,
            limit,
        } => {
            run.scale_up_requested(&node, latest_before, now, limit);
            Step::nothing(format!(
                "{} waiting to join: asking every rank for a checkpoint first (--on-scale-up checkpoint, up to {})",
                are(&node),
                human(limit)
            ))
        }
        Input::NobodyWaits => match run.call_off_scale_up() {
            Some(node) => Step::nothing(format!(
                "{} no longer waiting to join: the scale-up is called off, no re-form",
                are(&node)
            )),
            None => Step::nothing(""),
        },
        Input::Tick => tick(run, now, rules),
        Input::Accused { .. }
        | Input::WaitingGone
        | Input::MemberUp(_)
        | Input::MemberGone(_)
        | Input::Other => Step::nothing(""),
    }
}

/// `ckpt/latest` moved: report it, restart the checkpoint clock, and admit a newcomer held for
/// this save.
fn sealed(run: &mut Running, id: String, now: Instant) -> Step {
    let mut effects = vec![Effect::Emit(Event::Sealed(id.clone()))];
    if let Some(c) = run.save_clock.as_mut() {
        c.sealed(now);
        effects.push(Effect::EvaluateInterval { entered: false });
    }
    let Some(p) = run.scale_up.take_if(|p| id > p.latest_before) else {
        return Step::does(effects, format!("checkpoint {id} sealed"));
    };
    let reason = format!(
        "{} waiting to join (scale-up), admitted after {} was sealed",
        are(&p.node),
        crate::ledger::describe_id(&id)
    );
    effects.push(Effect::AdmitIfWaiting {
        reason: reason.clone(),
        gone_note: Some(format!(
            "{} no longer waiting when the checkpoint was sealed: no re-form",
            are(&p.node)
        )),
    });
    Step::does(effects, reason)
}

/// A node asks to join while the generation runs: a newcomer below MAX re-forms the group (at
/// once, or after a coordinated checkpoint), together with every other newcomer that arrives
/// within the scale-up window of the first one (at once when they bring the group to MAX); a
/// member's own join, or anyone at MAX, stands by; a newcomer the re-form's environment check
/// would refuse is turned away at the door.
fn newcomer(
    run: &mut Running,
    node: String,
    join: Option<&Join>,
    now: Instant,
    rules: &Rules,
) -> Step {
    if run.plan.member(&node).is_some() {
        return Step::nothing(format!("node {node} is a member of the running generation"));
    }
    if run.plan.members.len() >= rules.max_nodes {
        return Step::nothing(format!(
            "node {node} stands by: the group is at its maximum of {} nodes",
            rules.max_nodes
        ));
    }
    let refused = match (&run.door, join) {
        (Some(door), Some(j)) => {
            crate::decisions::door::refusal(door, run.generation(), &Report::of(j))
        }
        _ => None,
    };
    if let Some(message) = refused {
        let reason = format!("node {node} is turned away at the door: {message}");
        return Step::does(vec![Effect::TurnAway { node, message }], reason);
    }
    if rules.scale_up_window.is_zero() {
        let reason = format!("node {node} is waiting to join (scale-up)");
        return admit(run, node, reason, rules);
    }
    let arrivals = run.arrivals.get_or_insert_with(|| Arrivals {
        nodes: BTreeSet::new(),
        until: now + rules.scale_up_window,
    });
    arrivals.nodes.insert(node.clone());
    if run.plan.members.len() + arrivals.nodes.len() < rules.max_nodes {
        let left = arrivals.until.saturating_duration_since(now);
        return Step::nothing(format!(
            "node {node} is waiting to join (scale-up): admitted in {} with every node that arrives meanwhile (the last call since the first arrival), the group trains on",
            human(left)
        ));
    }
    let list = listed(&run.arrivals.take().map(|a| a.nodes).unwrap_or_default());
    let reason = format!(
        "{} waiting to join (scale-up): with them the group reaches its maximum of {} nodes",
        are(&list),
        rules.max_nodes
    );
    admit(run, list, reason, rules)
}

/// The newcomers as one list, "a" or "a, b".
fn listed(nodes: &BTreeSet<String>) -> String {
    nodes
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

/// "node a is" or "nodes a, b are", for a list made by [`listed`].
pub(crate) fn are(list: &str) -> String {
    if list.contains(", ") {
        format!("nodes {list} are")
    } else {
        format!("node {list} is")
    }
}

/// Admits the newcomers `list` (see [`listed`]): re-forms at once, or asks for a checkpoint
/// first (`--on-scale-up checkpoint`).
fn admit(run: &Running, list: String, reason: String, rules: &Rules) -> Step {
    match rules.scale_up_save {
        None => Step::does(vec![Effect::Close(reason.clone())], reason),
        Some(_) if run.scale_up.is_some() => Step::nothing(format!(
            "{} waiting for the pending scale-up save",
            are(&list)
        )),
        Some(limit) => Step::does(
            vec![Effect::RequestScaleUpSave { node: list, limit }],
            format!("{reason}: asking for a checkpoint first"),
        ),
    }
}

/// Deadlines at or before `now`: the successor's start, the scale-up save's seal, the
/// checkpoint interval.
fn tick(run: &mut Running, now: Instant, rules: &Rules) -> Step {
    let mut effects = vec![];
    let mut why = vec![];
    if let Some(interval) = run.save_clock.as_mut().and_then(|c| c.take_due(now)) {
        why.push(format!(
            "the checkpoint interval ({}) since the last seal passed",
            human(interval)
        ));
        effects.push(Effect::RequestIntervalSave(interval));
    }
    if run.successor_deadline.is_some_and(|d| d <= now) {
        run.successor_deadline = None;
        if let Some(succ) = &run.successor {
            why.push(format!("successor {succ}'s start deadline passed"));
            effects.push(Effect::CheckSuccessorStarted {
                node: succ.clone(),
                reason: format!(
                    "node {succ} did not start within the lease TTL ({})",
                    human(rules.lease_ttl)
                ),
            });
        }
    }
    if let Some(a) = run.arrivals.take_if(|a| a.until <= now) {
        let list = listed(&a.nodes);
        let who = are(&list);
        let reason = format!(
            "{who} waiting to join (scale-up), admitted together at the end of the last call ({})",
            human(rules.scale_up_window)
        );
        why.push(reason.clone());
        match rules.scale_up_save {
            None => effects.push(Effect::AdmitIfWaiting {
                reason,
                gone_note: Some(format!("{who} no longer waiting: no re-form")),
            }),
            Some(_) if run.scale_up.is_some() => {}
            Some(limit) => effects.push(Effect::RequestScaleUpSave { node: list, limit }),
        }
    }
    if let Some(p) = run.scale_up.take_if(|p| p.deadline <= now) {
        let limit = rules.scale_up_save.unwrap_or_default();
        let reason = format!(
            "{} waiting to join (scale-up); no checkpoint was sealed within {}, re-forming without one",
            are(&p.node),
            human(limit)
        );
        why.push(reason.clone());
        effects.push(Effect::AdmitIfWaiting {
            reason,
            gone_note: None,
        });
    }
    if let silence::Act::GiveUp { asked_at, reason } = run.silence.tick(now) {
        why.push(format!("this node's agent did not answer: {reason}"));
        effects.push(Effect::GiveUpIfUnheard { asked_at, reason });
    }
    Step::does(effects, why.join("; "))
}

/// What the silence rule says, as a step.
fn silent(act: silence::Act) -> Step {
    match act {
        silence::Act::Nothing(why) => Step::nothing(why),
        silence::Act::Ping(why) => Step::does(vec![Effect::Ping], why),
        silence::Act::GiveUp { asked_at, reason } => Step::does(
            vec![Effect::GiveUpIfUnheard {
                asked_at,
                reason: reason.clone(),
            }],
            reason,
        ),
    }
}

/// The successor `node` vanished, `why` (its `lost/<node>` record). `None`: no re-form, because
/// every node stops after a sealed preemption checkpoint (exit 5) and saying so would mislead.
pub(crate) fn successor_lost(
    plan: &Plan,
    node: &str,
    why: &str,
    preemption_sealed: bool,
) -> Option<String> {
    (!preemption_sealed).then(|| crate::decisions::loss::describe(plan, node, why))
}

/// Whether `node` watches the waiting set of `plan`: node rank 0 of a group below MAX.
pub(crate) fn watches_newcomers(plan: &Plan, node: &str, rules: &Rules) -> bool {
    plan.members.first().is_some_and(|m| m.node_id == node) && plan.members.len() < rules.max_nodes
}

/// The node after `node` in node-rank order (wrapping), if the group has another node.
pub(crate) fn successor(plan: &Plan, node: &str) -> Option<String> {
    let n = plan.members.len();
    let i = plan.members.position(node)?;
    (n > 1).then(|| plan.members[(i + 1) % n].node_id.clone())
}

#[cfg(test)]
pub(super) mod tests;
