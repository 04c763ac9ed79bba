//! The chaos checker: invariants over a run's history, the store's ledger and the observed
//! outcome. Pure: a history in, the violations out (each with a minimal excerpt of the history).
//! Invariants (issue 18): (a) the steps kept — the final generation's and, through each
//! generation's resume point, the ones it resumed from — cover every epoch's permutation exactly
//! once, in order; (b) every rank of a generation resumed from the same sealed step and cursor;
//! (c) sealed checkpoints never move backwards and none sealed before a generation started is
//! skipped by its resume; (d) no older world seals after a newer one did; (e) generations only
//! increase; (f) no process of the run is left; (g) the run ends, successfully, within the
//! schedule's bound (and one stopped by a preemption warning exits 5).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::history::{Corruption, Data, Kind, Ledger, Outcome, Record, Resume, Verified};

/// One broken invariant: its letter, what broke, and the history lines that show it.
#[derive(Clone, Debug, PartialEq)]
pub struct Violation {
    pub invariant: char,
    pub what: String,
    pub excerpt: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "invariant ({}) violated: {}", self.invariant, self.what)?;
        for l in &self.excerpt {
            writeln!(f, "    {l}")?;
        }
        Ok(())
    }
}

fn v(invariant: char, what: String, recs: &[&Record]) -> Violation {
    Violation {
        invariant,
        what,
        excerpt: recs
            .iter()
            .take(6)
            .map(|r| format!("line {}: {}", r.line, r.text))
            .collect(),
    }
}

/// Every invariant over the run; empty when all hold.
pub fn check(h: &[Record], ledger: &Ledger, out: &Outcome, data: Data) -> Vec<Violation> {
    let mut found = Vec::new();
    found.extend(same_resume(h, ledger));
    found.extend(kept_cover_each_epoch(h, data));
    found.extend(seals_never_backwards(
        h,
        ledger,
        &out.corrupted,
        &out.verified,
    ));
    found.extend(generations_increase(h));
    if !out.leftover.is_empty() {
        found.push(v(
            'f',
            format!(
                "processes of the run left after it ended: {:?}",
                out.leftover
            ),
            &[],
        ));
    }
    if out.finishers.is_empty() || out.finishers.iter().any(|c| *c != 0) {
        found.push(v(
            'g',
            format!(
                "the agents that stayed exited {:?}, not all 0",
                out.finishers
            ),
            &[],
        ));
    }
    if let Some(c) = out.leavers.iter().find(|c| ![0, 143].contains(*c)) {
        found.push(v(
            'g',
            format!("an agent told to leave exited {c} (documented: 0 or 143)"),
            &[],
        ));
    }
    if let Some(c) = out.preempted.iter().find(|c| **c != 5) {
        found.push(v(
            'g',
            format!("an agent stopped by a preemption warning exited {c} (documented: 5)"),
            &[],
        ));
    }
    if out.dropped_warnings > 0 {
        found.push(v(
            'g',
            format!(
                "{} preemption warning(s) dropped: a SIGUSR1 between generations was not turned \
                 into a coordinated checkpoint (documented: the first warning becomes a job-wide \
                 request)",
                out.dropped_warnings
            ),
            &[],
        ));
    }
    if out.elapsed_ms > out.bound_ms {
        found.push(v(
            'g',
            format!(
                "the run took {} ms, past its bound of {} ms",
                out.elapsed_ms, out.bound_ms
            ),
            &[],
        ));
    }
    found
}

fn starts(h: &[Record]) -> BTreeMap<u64, Vec<&Record>> {
    let mut by_gen: BTreeMap<u64, Vec<&Record>> = BTreeMap::new();
    for r in h.iter().filter(|r| matches!(r.kind, Kind::Start { .. })) {
        by_gen.entry(r.gen).or_default().push(r);
    }
    by_gen
}

fn resume_of(r: &Record) -> Option<Resume> {
    match r.kind {
        Kind::Start { resume } => resume,
        _ => None,
    }
}

/// (b) Every rank of a generation resumed from the same step and cursor, a step the ledger
/// sealed, with the cursor its generation committed.
pub fn same_resume(h: &[Record], ledger: &Ledger) -> Vec<Violation> {
    let mut found = Vec::new();
    for (g, recs) in starts(h) {
        let first = resume_of(recs[0]);
        if let Some(other) = recs.iter().find(|r| resume_of(r) != first) {
            found.push(v(
                'b',
                format!("ranks of generation {g} resumed from different points"),
                &[recs[0], other],
            ));
            continue;
        }
        let Some(r) = first else { continue };
        if !ledger
            .sealed
            .iter()
            .any(|s| s.step == r.step && s.generation == r.generation)
        {
            let what = format!(
                "generation {g} resumed from step {} of generation {}, which the ledger does not \
                 list as sealed",
                r.step, r.generation
            );
            found.push(v('b', what, &[recs[0]]));
        }
        let commits: Vec<&Record> = h
            .iter()
            .filter(|c| {
                c.gen == r.generation
                    && matches!(c.kind, Kind::Commit { step, .. } if step == r.step)
            })
            .collect();
        if let Some(c) = commits.iter().find(|c| {
            let at = (r.epoch, r.samples);
            matches!(c.kind, Kind::Commit { cursor, .. } if (cursor.epoch, cursor.samples) != at)
        }) {
            let what = format!(
                "generation {g} resumed at epoch {} sample {}, not at the cursor committed with \
                 step {}",
                r.epoch, r.samples, r.step
            );
            found.push(v('b', what, &[recs[0], c]));
        }
    }
    found
}

/// Kept steps: step → (generation, its step records).
type Kept<'a> = BTreeMap<u64, (u64, Vec<&'a Record>)>;

/// The kept steps, following resume points back from the generation that finished, and the
/// kept steps some rank has no record of; or the violation that stops the walk.
fn kept(h: &[Record], data: Data) -> Result<(Kept<'_>, Vec<Violation>), Violation> {
    let done = h
        .iter()
        .filter(|r| matches!(r.kind, Kind::Done { .. }))
        .max_by_key(|r| r.gen);
    let Some(done) = done else {
        return Err(v(
            'a',
            "no generation ran to the end: nothing was kept".into(),
            &[],
        ));
    };
    let by_gen = starts(h);
    let (mut out, mut incomplete) = (BTreeMap::new(), Vec::new());
    let (mut g, mut hi) = (done.gen, data.total_steps());
    loop {
        let Some(st) = by_gen.get(&g) else {
            return Err(v(
                'a',
                format!("generation {g} is resumed from but never started"),
                &[],
            ));
        };
        let resume = resume_of(st[0]);
        let lo = resume.map_or(0, |r| r.step);
        let world = st[0].world;
        for s in lo + 1..=hi {
            let recs: Vec<&Record> = h
                .iter()
                .filter(|r| r.gen == g && matches!(r.kind, Kind::Step { step, .. } if step == s))
                .collect();
            let ranks: BTreeSet<u32> = recs.iter().map(|r| r.rank).collect();
            if ranks.len() != world as usize || recs.len() != world as usize {
                // Reported once, for the first such step: the rest follow from it.
                if incomplete.is_empty() {
                    let what = format!(
                        "generation {g} (world size {world}) resumed from step {lo} ran to the \
                         end, but step {s} has records of ranks {ranks:?} only"
                    );
                    incomplete.push(v('a', what, &recs));
                }
                continue;
            }
            out.insert(s, (g, recs));
        }
        match resume {
            None => return Ok((out, incomplete)),
            Some(r) if r.generation >= g => {
                return Err(v(
                    'e',
                    format!(
                        "generation {g} resumed from generation {}, not an older one",
                        r.generation
                    ),
                    &[st[0]],
                ));
            }
            Some(r) => (g, hi) = (r.generation, r.step),
        }
    }
}

/// (a) The kept steps' samples are, step by step, the next global batch of their epoch's
/// permutation: every epoch's samples exactly once, none skipped, none repeated.
pub fn kept_cover_each_epoch(h: &[Record], data: Data) -> Vec<Violation> {
    let (kept, mut found) = match kept(h, data) {
        Ok(k) => k,
        Err(e) => return vec![e],
    };
    let mut perms: BTreeMap<u64, &Record> = BTreeMap::new();
    for r in h {
        if let Kind::Perm { epoch, perm } = &r.kind {
            match perms.get(epoch) {
                Some(p) if !matches!(&p.kind, Kind::Perm { perm: q, .. } if q == perm) => {
                    found.push(v(
                        'a',
                        format!("two permutations of epoch {epoch}"),
                        &[p, r],
                    ));
                }
                Some(_) => {}
                None => {
                    perms.insert(*epoch, r);
                }
            }
        }
    }
    let spe = data.steps_per_epoch();
    let gb = data.global_batch as usize;
    for s in 1..=data.total_steps() {
        let Some((g, recs)) = kept.get(&s) else {
            continue;
        };
        let (epoch, j) = ((s - 1) / spe, ((s - 1) % spe) as usize);
        let Some(Kind::Perm { perm, .. }) = perms.get(&epoch).map(|r| &r.kind) else {
            found.push(v(
                'a',
                format!("no permutation of epoch {epoch} recorded"),
                &[],
            ));
            continue;
        };
        let mut want: Vec<u64> = perm[j * gb..(j + 1) * gb].to_vec();
        let mut got: Vec<u64> = recs
            .iter()
            .flat_map(|r| match &r.kind {
                Kind::Step { idx, .. } => idx.clone(),
                _ => vec![],
            })
            .collect();
        want.sort_unstable();
        got.sort_unstable();
        if got != want {
            let missing: Vec<u64> = want
                .iter()
                .filter(|i| !got.contains(i))
                .take(5)
                .copied()
                .collect();
            let extra: Vec<u64> = got
                .iter()
                .filter(|i| !want.contains(i))
                .take(5)
                .copied()
                .collect();
            let what = format!(
                "kept step {s} (epoch {epoch}, generation {g}) consumed {} samples, not batch {j} \
                 of the permutation: missing {missing:?}, unexpected {extra:?}",
                got.len()
            );
            found.push(v('a', what, recs));
            break;
        }
    }
    found
}

/// (c) The ledger's sealed steps only increase (leaving out checkpoints marked bad or corrupted
/// by the runner, after which a step is sealed again), every seal a rank heard is in the ledger,
/// no generation resumes from a corrupted checkpoint, and none from an earlier step than an
/// intact one a rank heard sealed before it started.
/// (d), in the form a history can show: once a world sealed a checkpoint no older world seals
/// one (an old world's workers may still run, e.g. under a stopped agent, but not commit).
///
/// A shard corrupted while a generation was already under way is not one drun could see: a
/// generation whose agents all verified and took the checkpoint before the corruption (their
/// logs' "resuming from checkpoint" lines, `verified`) is not held to it; one without such a
/// record, or with one after the corruption, is.
pub fn seals_never_backwards(
    h: &[Record],
    ledger: &Ledger,
    corrupted: &[Corruption],
    verified: &[Verified],
) -> Vec<Violation> {
    // When checkpoint (step, gen) was first corrupted, if it was.
    let corrupted_at = |step: u64, gen: u64| {
        corrupted
            .iter()
            .filter(|c| c.step == step && c.generation == gen)
            .map(|c| c.t)
            .reduce(f64::min)
    };
    let spoiled =
        |step: u64, gen: u64| ledger.is_bad(step, gen) || corrupted_at(step, gen).is_some();
    let mut found = Vec::new();
    let good: Vec<_> = ledger
        .sealed
        .iter()
        .filter(|s| !spoiled(s.step, s.generation))
        .collect();
    if let Some(w) = good.windows(2).find(|w| w[1].step <= w[0].step) {
        found.push(v(
            'c',
            format!(
                "the ledger's sealed checkpoints go backwards: {:?} then {:?}",
                w[0], w[1]
            ),
            &[],
        ));
    }
    if let Some(w) = ledger
        .sealed
        .windows(2)
        .find(|w| w[1].generation < w[0].generation)
    {
        let what = format!(
            "an older world sealed after a newer one: {:?} then {:?}",
            w[0], w[1]
        );
        found.push(v('d', what, &[]));
    }
    let seals: Vec<(&Record, u64)> = h
        .iter()
        .filter_map(|r| match r.kind {
            Kind::Commit {
                step, sealed: true, ..
            } => Some((r, step)),
            _ => None,
        })
        .collect();
    for (g, recs) in starts(h) {
        let Some(r) = resume_of(recs[0]) else {
            continue;
        };
        let Some(at) = corrupted_at(r.step, r.generation) else {
            continue;
        };
        let mut checks = verified
            .iter()
            .filter(|v| v.gen == g && v.step == r.step && v.saved_by == r.generation)
            .peekable();
        let before = checks.peek().is_some() && checks.all(|v| v.t < at);
        if !before {
            let what = format!(
                "generation {g} resumed from step {} of generation {}, whose shard was corrupted \
                 (at {at:.3}; no agent of the generation verified it before that)",
                r.step, r.generation
            );
            found.push(v('c', what, &[recs[0]]));
        }
    }
    for (r, step) in &seals {
        if !ledger
            .sealed
            .iter()
            .any(|s| s.step == *step && s.generation == r.gen)
        {
            found.push(v(
                'c',
                format!(
                    "step {step} of generation {} was sealed but is not in the ledger",
                    r.gen
                ),
                &[r],
            ));
        }
    }
    for (g, recs) in starts(h) {
        let t0 = recs.iter().map(|r| r.t).fold(f64::INFINITY, f64::min);
        let from = resume_of(recs[0]).map_or(0, |r| r.step);
        if let Some((r, step)) = seals
            .iter()
            .filter(|(r, s)| r.gen < g && r.t < t0 && !spoiled(*s, r.gen))
            .max_by_key(|(_, s)| *s)
        {
            if *step > from {
                let what = format!(
                    "generation {g} resumed from step {from}, though step {step} was sealed \
                     before it started"
                );
                found.push(v('c', what, &[r, recs[0]]));
            }
        }
    }
    found
}

/// (e) On every agent, the generations its workers start in only increase, and no generation
/// number names two worlds (a rank of it started twice, by two processes).
pub fn generations_increase(h: &[Record]) -> Vec<Violation> {
    let mut last: BTreeMap<usize, &Record> = BTreeMap::new();
    let mut found = Vec::new();
    let mut first: BTreeMap<(u64, u32), &Record> = BTreeMap::new();
    for r in h.iter().filter(|r| matches!(r.kind, Kind::Start { .. })) {
        match first.get(&(r.gen, r.rank)) {
            Some(p) if p.pid != r.pid => {
                let what = format!(
                    "generation {} started twice: rank {} by pid {}, then by pid {}",
                    r.gen, r.rank, p.pid, r.pid
                );
                found.push(v('e', what, &[p, r]));
                break;
            }
            Some(_) => {}
            None => {
                first.insert((r.gen, r.rank), r);
            }
        }
    }
    for r in h.iter().filter(|r| matches!(r.kind, Kind::Start { .. })) {
        if let Some(p) = last.get(&r.node) {
            if r.gen < p.gen {
                found.push(v(
                    'e',
                    format!(
                        "agent {} started generation {} after {}",
                        r.node, r.gen, p.gen
                    ),
                    &[p, r],
                ));
            }
        }
        last.insert(r.node, r);
    }
    found
}
