//! What the round's decider reads before it judges: one [`RoundSnapshot`] per step, and the
//! [`FormationInputs`] once it judged that a generation forms. Plain data; the reads go
//! through the run's door ([`RunState`]) in the order the judgement relies on.

use std::collections::{BTreeMap, HashSet};

use crate::ledger::{Ledger, Manifest};
use crate::store::records::{Formation, Restarts};
use crate::store::run_state::RunState;
use crate::{Join, Plan, StoreError};

/// The round as the decider reads it at one step.
#[derive(Debug, Clone, Default)]
pub struct RoundSnapshot {
    /// The current generation (0: none formed yet).
    pub generation: u64,
    /// `gen/current`'s `mod_revision` when read: the formation's guard.
    pub revision: i64,
    /// The plan of `generation`, if any.
    pub current: Option<Plan>,
    /// Members of `generation` whose membership key exists, read BEFORE the waiting set: a
    /// survivor moves from one to the other in one transaction (`Round::rejoin`), so each is
    /// seen in at least one of the two reads and none is left out of a re-form.
    pub live: HashSet<String>,
    /// The joins waiting, oldest first, each with its key's `mod_revision`.
    pub waiting: Vec<(Join, i64)>,
    /// The run has ended.
    pub finished: bool,
    /// `generation` was closed (it must re-form).
    pub closed: bool,
    /// A member of `generation` was still live when read after the waiting set (read only
    /// when it was not closed).
    pub live_after: bool,
}

/// What forming generation `g + 1` reads besides the snapshot.
#[derive(Debug, Clone, Default)]
pub struct FormationInputs {
    /// The restart counters and their key's `mod_revision` (0: never written).
    pub restarts: Restarts,
    /// Their `mod_revision`.
    pub restarts_revision: i64,
    /// Generation `g` was closed (read again: a formation of an unclosed one counts its
    /// restart).
    pub closed: bool,
    /// Generation `g`'s formation record, if it has one.
    pub previous: Option<Formation>,
    /// Every sealed manifest, oldest first.
    pub manifests: Vec<Manifest>,
    /// Manifests marked bad: id → why.
    pub bad: BTreeMap<String, String>,
    /// `ckpt/latest`'s `mod_revision` (0: missing): a seal since then fails the formation.
    pub latest_revision: i64,
}

/// Reads the round at generation `g` (`gen/current`'s revision `rev`).
pub async fn read(state: &RunState, g: u64, rev: i64) -> Result<RoundSnapshot, StoreError> {
    // A waiting key written before generation `g` formed, by a node admitted to `g`, is the
    // join that got it in; the node deletes it once it starts. Not a new candidate.
    let current = if g > 0 { state.plan(g).await? } else { None };
    let live: HashSet<String> = match &current {
        Some(_) => state.live_members(g).await?.into_iter().collect(),
        None => HashSet::new(),
    };
    let waiting = state.waiting().await?;
    let finished = state.has_finished().await?;
    let mut snap = RoundSnapshot {
        generation: g,
        revision: rev,
        current,
        live,
        waiting,
        finished,
        closed: false,
        live_after: false,
    };
    if finished || snap.current.is_none() {
        return Ok(snap);
    }
    snap.closed = state.closed(g).await?.is_some();
    if !snap.closed {
        snap.live_after = !state.live_members(g).await?.is_empty();
    }
    Ok(snap)
}

/// Reads what forming generation `g + 1` needs besides the snapshot.
pub async fn read_formation(
    state: &RunState,
    ledger: &Ledger,
    g: u64,
) -> Result<FormationInputs, StoreError> {
    let (restarts, restarts_revision) = state.restarts().await?;
    let closed = g > 0 && state.closed(g).await?.is_some();
    let latest_revision = state.ckpt_latest().await?.map_or(0, |(_, rev)| rev);
    let bad = ledger.bad().await?;
    let manifests = ledger.manifests().await?;
    let previous = if g > 0 {
        state.formation(g).await?
    } else {
        None
    };
    Ok(FormationInputs {
        restarts,
        restarts_revision,
        closed,
        previous,
        manifests,
        bad,
        latest_revision,
    })
}
