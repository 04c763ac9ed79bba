//! The seeded fault-schedule generator: a pure function of the seed, so the seed printed with a
//! failure replays the same schedule (the model is etcd's robustness tests: seed → schedule →
//! history → checker).

use std::fmt;

/// Lease TTL of chaos runs, seconds (agents get `lease_ttl=TTL`).
pub const TTL_S: u64 = 3;
/// At most this many agents at once (`--nnodes 1:MAX_AGENTS`).
pub const MAX_AGENTS: usize = 4;

/// Where the rendezvous state lives: a `drun-rendezvous` server over its in-memory store, or a
/// server over etcd (whose restart loses nothing, so only then is the server restarted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    Memory,
    Etcd,
}

/// One fault (or a wait) of a schedule. Agents are named by their slot: slot `i` is the agent
/// on loopback address 127.0.0.(i+1) (on the network test bed: on host `n{i}`), started at the
/// beginning or by a [`Event::ScaleUp`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// SIGKILL agent `slot` (its workers die with it).
    KillAgent(usize),
    /// SIGSTOP agent `slot`, SIGCONT it after `ms` milliseconds (within or past the lease TTL).
    StopAgent { slot: usize, ms: u64 },
    /// SIGKILL one worker of the newest generation: the `pick`-th (modulo their number).
    KillWorker { pick: usize },
    /// SIGTERM agent `slot`: it leaves the job.
    Leave(usize),
    /// Start a new agent in slot `slot` (scale-up).
    ScaleUp(usize),
    /// Kill the rendezvous server and start it again on the same port after `down_ms`.
    RestartServer { down_ms: u64 },
    /// Wait (up to 30 s) until one more checkpoint is sealed than before, so later faults hit a
    /// run that has something to resume from.
    WaitSealed,
    /// Truncate to half (or flip a byte of) the `pick`-th file (modulo their number) of the
    /// checkpoint `<ckpt>/latest` points at: drun must find it at the next resume
    /// (`--ckpt-verify digest`) and fall back to the previous checkpoint.
    CorruptShard { pick: usize, truncate: bool },
    /// SIGUSR1 agent `slot` under `--on-preempt checkpoint`: a job-wide coordinated checkpoint,
    /// then every agent of the world exits 5; the runner starts them again in their slots, like a
    /// requeued job (same run id), and they resume from that checkpoint.
    Preempt(usize),
    /// Over a 3-member etcd cluster: take the leader (or a follower) down for `down_ms` — a
    /// SIGKILL and a restart on its data directory (`kill`), or a SIGSTOP and SIGCONT (a hung
    /// member). The cluster keeps its quorum; the leader's loss forces an election.
    EtcdMember {
        leader: bool,
        kill: bool,
        down_ms: u64,
    },
    /// Bed only: pull the cable of agent `slot`'s host, plug it back after `ms` (within or past
    /// the lease TTL). Its peers and the server stop hearing it: the others re-form without it,
    /// it fences itself at the TTL and joins again by itself once the cable is back.
    CutCable { slot: usize, ms: u64 },
    /// Bed only: the hosts of agents `a` and `b` cannot reach each other (both still reach the
    /// server and the others) for `ms`: one side is sent away and stands by until it reaches
    /// its last generation's nodes again, then joins.
    Partition { a: usize, b: usize, ms: u64 },
    /// Bed only: pull the server host's cable for `ms` (a control-plane outage of 1 to 3 lease
    /// TTLs): agents whose peers all answer keep their generation and workers.
    CutServer { ms: u64 },
    /// Bed only: a 20 Mbit/s token bucket on agent `slot`'s host for `ms`.
    SlowLink { slot: usize, ms: u64 },
    /// SIGKILL agent `slot` while its persister writes a staged checkpoint to `--ckpt-dir`: as
    /// soon as a `.drun-persist-*` file naming its pid is there (at most 30 s; then it is
    /// killed anyway, and the runner says so). A schedule with this event runs with
    /// `--ckpt-memory` and a slowed persister ([`Schedule::ckpt_memory`]).
    KillPersisting(usize),
    /// SIGKILL agent `slot` once it holds a replica of its ring predecessor's staged
    /// checkpoint (`--ckpt-replicas 1`): as soon as a file is under the `.replicas` of its
    /// staging directory (at most 30 s; then it is killed anyway, and the runner says so). A
    /// schedule with this event runs with `--ckpt-memory`, `--ckpt-replicas 1` and a slowed
    /// persister ([`Schedule::replicas`]).
    KillReplicaHolder(usize),
}

/// An event `delay_ms` milliseconds after the previous one finished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timed {
    pub delay_ms: u64,
    pub event: Event,
}

/// A whole chaos run: the store, the agents at the start, workers per agent, and the faults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub seed: u64,
    pub store: StoreKind,
    /// On the network test bed (the server and each agent slot on a host of its own) rather
    /// than on this machine's loopback addresses.
    pub bed: bool,
    /// Agents started before the first fault, in slots `0..agents` (1..=MAX_AGENTS).
    pub agents: usize,
    /// Workers per agent (1 or 2).
    pub nproc: u32,
    pub events: Vec<Timed>,
}

/// splitmix64: tiny, well-distributed, and the same on every platform.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.next_u64() as usize % from.len()]
    }
}

/// The schedule of `seed` on `store` with `min_events..=max_events` faults (waits not counted).
/// The generator keeps a model of the live agents so that every event is applicable: at least
/// one agent stays alive, at most [`MAX_AGENTS`] run at once, and the server is restarted only
/// over etcd.
pub fn generate(seed: u64, store: StoreKind, min_events: usize, max_events: usize) -> Schedule {
    let mut rng = Rng::new(seed ^ (((store == StoreKind::Etcd) as u64) << 63));
    let agents = rng.range(1, MAX_AGENTS as u64) as usize;
    let nproc = rng.range(1, 2) as u32;
    let mut live: Vec<usize> = (0..agents).collect();
    let mut next_slot = agents;
    let n = rng.range(min_events as u64, max_events as u64) as usize;
    let mut events = Vec::new();
    let mut faults = 0;
    while faults < n {
        if rng.range(0, 3) == 0 {
            events.push(Timed {
                delay_ms: 0,
                event: Event::WaitSealed,
            });
        }
        let ttl = TTL_S * 1000;
        let event = match rng.range(0, 6) {
            0 if live.len() > 1 => {
                let s = rng.pick(&live);
                live.retain(|l| *l != s);
                Event::KillAgent(s)
            }
            1 => {
                let ms = if rng.range(0, 1) == 0 {
                    rng.range(200, ttl - 500)
                } else {
                    rng.range(ttl + 500, 2 * ttl)
                };
                Event::StopAgent {
                    slot: rng.pick(&live),
                    ms,
                }
            }
            2 if live.len() > 1 => {
                let s = rng.pick(&live);
                live.retain(|l| *l != s);
                Event::Leave(s)
            }
            3 if live.len() < MAX_AGENTS => {
                live.push(next_slot);
                next_slot += 1;
                Event::ScaleUp(next_slot - 1)
            }
            4 if store == StoreKind::Etcd => Event::RestartServer {
                down_ms: rng.range(200, 1500),
            },
            _ => Event::KillWorker {
                pick: rng.range(0, 7) as usize,
            },
        };
        events.push(Timed {
            delay_ms: rng.range(300, 2000),
            event,
        });
        faults += 1;
    }
    Schedule {
        seed,
        store,
        bed: false,
        agents,
        nproc,
        events,
    }
}

/// The schedule of `seed` on the network test bed (memory store) with
/// `min_events..=max_events` faults (waits not counted): the network's faults ([`Event::CutCable`]
/// within or past the lease TTL, [`Event::Partition`], [`Event::CutServer`] for 1 to 3 TTLs,
/// [`Event::SlowLink`]) mixed with a killed agent or worker, a leave and a scale-up. A stream of
/// its own of the seed: [`generate`]'s schedules stay what they were. The live agents are the
/// processes that run: a cut-off or partitioned agent stays live (it may be fenced, and then
/// joins again by itself once the network is back), so one live agent is always left and two
/// are partitioned only while two run. The network faults do not overlap: each is healed
/// before the next event.
pub fn generate_bed(seed: u64, min_events: usize, max_events: usize) -> Schedule {
    let mut rng = Rng::new(seed ^ 0xBED0_0000_5EED_0004);
    let agents = rng.range(1, MAX_AGENTS as u64) as usize;
    let nproc = rng.range(1, 2) as u32;
    let mut live: Vec<usize> = (0..agents).collect();
    let mut next_slot = agents;
    let n = rng.range(min_events as u64, max_events as u64) as usize;
    let ttl = TTL_S * 1000;
    let mut events = Vec::new();
    while events
        .iter()
        .filter(|t: &&Timed| t.event != Event::WaitSealed)
        .count()
        < n
    {
        if rng.range(0, 3) == 0 {
            events.push(Timed {
                delay_ms: 0,
                event: Event::WaitSealed,
            });
        }
        let event = match rng.range(0, 9) {
            0 | 1 => {
                let ms = if rng.range(0, 1) == 0 {
                    rng.range(200, ttl - 500)
                } else {
                    rng.range(ttl + 500, 3 * ttl)
                };
                Event::CutCable {
                    slot: rng.pick(&live),
                    ms,
                }
            }
            2 | 3 if live.len() > 1 => {
                let a = rng.pick(&live);
                let others: Vec<usize> = live.iter().copied().filter(|l| *l != a).collect();
                Event::Partition {
                    a,
                    b: rng.pick(&others),
                    ms: rng.range(1000, 3 * ttl),
                }
            }
            4 => Event::CutServer {
                ms: rng.range(ttl, 3 * ttl),
            },
            5 => Event::SlowLink {
                slot: rng.pick(&live),
                ms: rng.range(1000, 2 * ttl),
            },
            6 if live.len() > 1 => {
                let s = rng.pick(&live);
                live.retain(|l| *l != s);
                if rng.range(0, 1) == 0 {
                    Event::KillAgent(s)
                } else {
                    Event::Leave(s)
                }
            }
            7 if live.len() < MAX_AGENTS => {
                live.push(next_slot);
                next_slot += 1;
                Event::ScaleUp(next_slot - 1)
            }
            _ => Event::KillWorker {
                pick: rng.range(0, 7) as usize,
            },
        };
        events.push(Timed {
            delay_ms: rng.range(300, 2000),
            event,
        });
    }
    Schedule {
        seed,
        store: StoreKind::Memory,
        bed: true,
        agents,
        nproc,
        events,
    }
}

/// `s` with, after each wait for a seal, a corrupted shard of the sealed checkpoint and a killed
/// worker (with probability 1/2). Drawn from a second stream of the seed, so the other events stay those of
/// [`generate`] (a seed found without corruption replays the same without it).
pub fn with_corruption(mut s: Schedule) -> Schedule {
    let mut rng = Rng::new(s.seed ^ 0xC0AA_0B7E_5EED_0001);
    let mut out = Vec::new();
    for t in s.events.drain(..) {
        let wait = t.event == Event::WaitSealed;
        out.push(t);
        if wait && rng.range(0, 1) == 0 {
            out.push(Timed {
                delay_ms: rng.range(0, 300),
                event: Event::CorruptShard {
                    pick: rng.range(0, 7) as usize,
                    truncate: rng.range(0, 1) == 0,
                },
            });
            // A killed worker makes the group resume at once, from the corrupted checkpoint
            // unless another was sealed in between.
            out.push(Timed {
                delay_ms: 0,
                event: Event::KillWorker {
                    pick: rng.range(0, 7) as usize,
                },
            });
        }
    }
    s.events = out;
    s
}

/// `s` with one preemption warning (with probability 1/2), to a live agent at a random point of
/// the schedule. Drawn from a stream of its own of the seed, so the other events stay those of
/// [`generate`] (and of [`with_corruption`], which may be applied after).
pub fn with_preemption(mut s: Schedule) -> Schedule {
    let mut rng = Rng::new(s.seed ^ 0x9E3E_3A7E_5EED_0002);
    if rng.range(0, 1) == 1 {
        return s;
    }
    let at = rng.range(0, s.events.len() as u64) as usize;
    let mut live: Vec<usize> = (0..s.agents).collect();
    for t in &s.events[..at] {
        match t.event {
            Event::KillAgent(a)
            | Event::Leave(a)
            | Event::KillPersisting(a)
            | Event::KillReplicaHolder(a) => live.retain(|l| *l != a),
            Event::ScaleUp(a) => live.push(a),
            _ => {}
        }
    }
    let slot = rng.pick(&live);
    let delay_ms = rng.range(300, 2000);
    s.events.insert(
        at,
        Timed {
            delay_ms,
            event: Event::Preempt(slot),
        },
    );
    s
}

/// `s` with an agent killed while it persists a staged checkpoint ([`Event::KillPersisting`]),
/// early, so that it hits a running job: at the first point where fewer than [`MAX_AGENTS`]
/// run, an agent is started in a fresh slot, a checkpoint is awaited, and that agent is killed
/// mid-persist — the live agents after it are those before it, so every later event of `s`
/// stays applicable. When [`MAX_AGENTS`] run throughout, a live agent is killed at the end
/// instead. Drawn from a stream of its own of the seed, so the other events stay those of `s`.
/// The schedule then runs with `--ckpt-memory`.
pub fn with_persist_kill(s: Schedule) -> Schedule {
    with_kill(s, 0x9E25_1575_5EED_0005, Event::KillPersisting)
}

/// `s` with the agent holding a replica killed ([`Event::KillReplicaHolder`]), placed as
/// [`with_persist_kill`] places its kill (from a stream of its own); the schedule then runs with
/// `--ckpt-memory --ckpt-replicas 1`.
pub fn with_replica_kill(s: Schedule) -> Schedule {
    with_kill(s, 0x9E25_1575_5EED_0006, Event::KillReplicaHolder)
}

/// `s` with the kill `kill(slot)` placed as [`with_persist_kill`] says, drawn from the stream
/// `salt` of the seed.
fn with_kill(mut s: Schedule, salt: u64, kill: fn(usize) -> Event) -> Schedule {
    let mut rng = Rng::new(s.seed ^ salt);
    let mut live: Vec<usize> = (0..s.agents).collect();
    let mut at = None;
    for (i, t) in s.events.iter().enumerate() {
        if live.len() < MAX_AGENTS {
            at = Some(i);
            break;
        }
        match t.event {
            Event::KillAgent(a)
            | Event::Leave(a)
            | Event::KillPersisting(a)
            | Event::KillReplicaHolder(a) => live.retain(|l| *l != a),
            Event::ScaleUp(a) => live.push(a),
            _ => {}
        }
    }
    let at = at.or((live.len() < MAX_AGENTS).then_some(s.events.len()));
    let timed = |delay_ms, event| Timed { delay_ms, event };
    let added = match at {
        Some(at) => {
            let fresh = s.slots();
            let added = [
                timed(rng.range(300, 1000), Event::ScaleUp(fresh)),
                timed(0, Event::WaitSealed),
                timed(rng.range(0, 300), kill(fresh)),
            ];
            s.events.splice(at..at, added);
            return s;
        }
        None => [
            timed(rng.range(0, 300), kill(rng.pick(&live))),
            timed(0, Event::WaitSealed),
        ],
    };
    s.events.extend(added);
    s
}

/// `s` (over etcd) with, after each fault, an etcd member taken down (with probability 1/3),
/// run on a 3-member cluster. Drawn from a third stream of the seed, so the other events stay
/// those of `s`. A schedule on the memory store is returned as it is.
pub fn with_etcd_members(mut s: Schedule) -> Schedule {
    if s.store != StoreKind::Etcd {
        return s;
    }
    let mut rng = Rng::new(s.seed ^ 0xE7CD_3E3B_0000_0003);
    let mut out = Vec::new();
    for t in s.events.drain(..) {
        let fault = t.event != Event::WaitSealed;
        out.push(t);
        if fault && rng.range(0, 2) == 0 {
            out.push(Timed {
                delay_ms: rng.range(200, 1500),
                event: Event::EtcdMember {
                    leader: rng.range(0, 1) == 0,
                    kill: rng.range(0, 1) == 0,
                    down_ms: rng.range(500, 2 * TTL_S * 1000),
                },
            });
        }
    }
    s.events = out;
    s
}

impl Schedule {
    /// Whether the agents stage checkpoints in memory (`--ckpt-memory`, a slowed persister):
    /// the schedule kills an agent mid-persist.
    pub fn ckpt_memory(&self) -> bool {
        self.events.iter().any(|t| {
            matches!(
                t.event,
                Event::KillPersisting(_) | Event::KillReplicaHolder(_)
            )
        })
    }

    /// Whether the agents also copy their staged checkpoints to their ring neighbour
    /// (`--ckpt-replicas 1`): the schedule kills an agent holding a replica.
    pub fn replicas(&self) -> bool {
        self.events
            .iter()
            .any(|t| matches!(t.event, Event::KillReplicaHolder(_)))
    }

    /// etcd members the schedule needs: 3 when it takes one down, else 1.
    pub fn etcd_members(&self) -> usize {
        if self
            .events
            .iter()
            .any(|t| matches!(t.event, Event::EtcdMember { .. }))
        {
            3
        } else {
            1
        }
    }

    /// Agent slots the schedule uses (those at the start and those scaled up): the bed's agent
    /// hosts `n0`..`n{slots-1}`.
    pub fn slots(&self) -> usize {
        self.events
            .iter()
            .filter_map(|t| match t.event {
                Event::ScaleUp(s) => Some(s + 1),
                _ => None,
            })
            .fold(self.agents, usize::max)
    }

    /// Faults in the schedule (waits not counted).
    pub fn faults(&self) -> usize {
        self.events
            .iter()
            .filter(|t| t.event != Event::WaitSealed)
            .count()
    }

    /// How long the run may take, milliseconds, from the first agent's start to the last exit:
    /// forming and the fault-free training (`train_ms`), plus per event its delay and the worst
    /// recovery it can cause (a lease expiry and a re-form, and the training redone since the
    /// last checkpoint, at most `train_ms`).
    pub fn bound_ms(&self, train_ms: u64) -> u64 {
        let ttl = TTL_S * 1000;
        let recover = ttl + 10_000 + train_ms;
        self.events.iter().fold(60_000 + 2 * train_ms, |acc, t| {
            acc + t.delay_ms
                + match t.event {
                    Event::WaitSealed => 30_000,
                    Event::StopAgent { ms, .. } => ms + recover,
                    Event::RestartServer { down_ms: ms }
                    | Event::EtcdMember { down_ms: ms, .. }
                    | Event::CutCable { ms, .. }
                    | Event::Partition { ms, .. }
                    | Event::CutServer { ms }
                    | Event::SlowLink { ms, .. } => ms + recover,
                    // The coordinated checkpoint, the exits, and a start from scratch.
                    Event::Preempt(_) => 2 * recover,
                    // The wait for the persister, then a lost agent.
                    Event::KillPersisting(_) | Event::KillReplicaHolder(_) => 30_000 + recover,
                    _ => recover,
                }
        })
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::KillAgent(s) => write!(f, "SIGKILL agent {s}"),
            Event::KillPersisting(s) => write!(
                f,
                "SIGKILL agent {s} while it persists a staged checkpoint (--ckpt-memory)"
            ),
            Event::KillReplicaHolder(s) => write!(
                f,
                "SIGKILL agent {s} once it holds a replica of its ring predecessor's staged checkpoint (--ckpt-replicas 1)"
            ),
            Event::StopAgent { slot, ms } => write!(
                f,
                "SIGSTOP agent {slot} for {ms} ms ({} the {TTL_S} s lease TTL)",
                if *ms < TTL_S * 1000 { "within" } else { "past" }
            ),
            Event::KillWorker { pick } => {
                write!(f, "SIGKILL worker #{pick} of the newest generation")
            }
            Event::Leave(s) => write!(f, "SIGTERM agent {s} (leave)"),
            Event::ScaleUp(s) => write!(f, "start agent {s} (scale-up)"),
            Event::RestartServer { down_ms } => {
                write!(f, "restart the rendezvous server ({down_ms} ms down)")
            }
            Event::WaitSealed => write!(f, "wait for the next sealed checkpoint"),
            Event::Preempt(s) => write!(
                f,
                "SIGUSR1 agent {s} (preemption warning), then start the world's agents again"
            ),
            Event::CorruptShard { pick, truncate } => write!(
                f,
                "{} shard #{pick} of the newest sealed checkpoint",
                if *truncate {
                    "truncate"
                } else {
                    "flip a byte of"
                }
            ),
            Event::EtcdMember {
                leader,
                kill,
                down_ms,
            } => write!(
                f,
                "{} {} for {down_ms} ms",
                if *kill {
                    "SIGKILL and restart"
                } else {
                    "SIGSTOP and SIGCONT"
                },
                if *leader {
                    "the etcd leader"
                } else {
                    "an etcd follower"
                }
            ),
            Event::CutCable { slot, ms } => write!(
                f,
                "pull the cable of agent {slot}'s host for {ms} ms ({} the {TTL_S} s lease TTL)",
                if *ms < TTL_S * 1000 { "within" } else { "past" }
            ),
            Event::Partition { a, b, ms } => {
                write!(
                    f,
                    "partition agents {a} and {b} from each other for {ms} ms"
                )
            }
            Event::CutServer { ms } => write!(
                f,
                "pull the cable of the server's host for {ms} ms (a control-plane outage)"
            ),
            Event::SlowLink { slot, ms } => {
                write!(f, "limit agent {slot}'s host to 20 Mbit/s for {ms} ms")
            }
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {} on {:?}{}: {} agents x {} workers, {} faults",
            self.seed,
            self.store,
            if self.bed { " (network test bed)" } else { "" },
            self.agents,
            self.nproc,
            self.faults()
        )?;
        for (i, t) in self.events.iter().enumerate() {
            writeln!(f, "  {i:>2}. +{} ms: {}", t.delay_ms, t.event)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chaos_schedule_same_seed_same_schedule() {
        for seed in 0..50 {
            for store in [StoreKind::Memory, StoreKind::Etcd] {
                assert_eq!(generate(seed, store, 3, 8), generate(seed, store, 3, 8));
            }
        }
        assert_ne!(
            generate(1, StoreKind::Memory, 3, 8),
            generate(2, StoreKind::Memory, 3, 8)
        );
    }

    #[test]
    fn chaos_schedule_events_are_always_applicable() {
        for seed in 0..500 {
            for store in [StoreKind::Memory, StoreKind::Etcd] {
                let plain = with_preemption(generate(seed, store, 2, 10));
                let replicas = seed % 2 == 1;
                let s = if replicas {
                    with_replica_kill(plain.clone())
                } else {
                    with_persist_kill(plain.clone())
                };
                assert_eq!(s.replicas(), replicas, "{s}");
                // Without the kill and what was added for it, the schedule is the plain one.
                let k = s
                    .events
                    .iter()
                    .position(|t| {
                        matches!(
                            t.event,
                            Event::KillPersisting(_) | Event::KillReplicaHolder(_)
                        )
                    })
                    .expect("a kill mid-persist or of a replica's holder");
                let fresh = matches!(
                    s.events[k].event,
                    Event::KillPersisting(a) | Event::KillReplicaHolder(a) if a == plain.slots()
                );
                let mut rest = s.events.clone();
                if fresh {
                    assert_eq!(rest[k - 2].event, Event::ScaleUp(plain.slots()), "{s}");
                    rest.drain(k - 2..=k);
                } else {
                    assert_eq!(k, s.events.len() - 2, "at the end: {s}");
                    rest.drain(k..);
                }
                assert_eq!(rest, plain.events, "{s}");
                assert!(s.ckpt_memory() && !plain.ckpt_memory());
                assert!((3..=13).contains(&s.faults()), "{s}");
                assert!((1..=MAX_AGENTS).contains(&s.agents) && (1..=2).contains(&s.nproc));
                let mut live: Vec<usize> = (0..s.agents).collect();
                for t in &s.events {
                    match t.event {
                        Event::KillAgent(a)
                        | Event::Leave(a)
                        | Event::KillPersisting(a)
                        | Event::KillReplicaHolder(a) => {
                            assert!(live.contains(&a), "{s}");
                            live.retain(|l| *l != a);
                            assert!(!live.is_empty(), "one agent always survives: {s}");
                        }
                        Event::StopAgent { slot, ms } => {
                            assert!(live.contains(&slot), "{s}");
                            assert!((200..=2 * TTL_S * 1000).contains(&ms));
                        }
                        Event::ScaleUp(a) => {
                            assert!(!live.contains(&a));
                            live.push(a);
                            assert!(live.len() <= MAX_AGENTS, "{s}");
                        }
                        Event::RestartServer { .. } => assert_eq!(store, StoreKind::Etcd),
                        Event::Preempt(a) => assert!(live.contains(&a), "{s}"),
                        Event::KillWorker { .. }
                        | Event::WaitSealed
                        | Event::CorruptShard { .. }
                        | Event::EtcdMember { .. } => {}
                        Event::CutCable { .. }
                        | Event::Partition { .. }
                        | Event::CutServer { .. }
                        | Event::SlowLink { .. } => panic!("a bed fault off the bed: {s}"),
                    }
                }
                assert!(!s.bed);
            }
        }
    }

    #[test]
    fn chaos_schedule_bed_events_are_always_applicable_and_reproducible() {
        for seed in 0..500 {
            let s = with_preemption(generate_bed(seed, 3, 8));
            assert_eq!(s, with_preemption(generate_bed(seed, 3, 8)));
            assert!(s.bed && s.store == StoreKind::Memory, "{s}");
            assert!((3..=9).contains(&s.faults()), "{s}");
            let mut live: Vec<usize> = (0..s.agents).collect();
            let ttl = TTL_S * 1000;
            for t in &s.events {
                match t.event {
                    Event::KillAgent(a) | Event::Leave(a) => {
                        assert!(live.contains(&a), "{s}");
                        live.retain(|l| *l != a);
                        assert!(!live.is_empty(), "one agent always survives: {s}");
                    }
                    Event::ScaleUp(a) => {
                        assert!(!live.contains(&a) && a < s.slots());
                        live.push(a);
                        assert!(live.len() <= MAX_AGENTS, "{s}");
                    }
                    Event::CutCable { slot, ms } => {
                        assert!(live.contains(&slot), "{s}");
                        assert!((200..=3 * ttl).contains(&ms));
                    }
                    Event::SlowLink { slot, .. } | Event::Preempt(slot) => {
                        assert!(live.contains(&slot), "{s}")
                    }
                    Event::Partition { a, b, .. } => {
                        assert!(a != b && live.contains(&a) && live.contains(&b), "{s}")
                    }
                    Event::CutServer { ms } => assert!((ttl..=3 * ttl).contains(&ms)),
                    Event::KillWorker { .. } | Event::WaitSealed => {}
                    Event::StopAgent { .. }
                    | Event::RestartServer { .. }
                    | Event::CorruptShard { .. }
                    | Event::EtcdMember { .. }
                    | Event::KillPersisting(_)
                    | Event::KillReplicaHolder(_) => panic!("not drawn on the bed: {s}"),
                }
            }
        }
    }

    #[test]
    fn chaos_schedule_bed_draws_every_kind_of_event() {
        let all: Vec<Event> = (0..100)
            .flat_map(|seed| generate_bed(seed, 3, 8).events)
            .map(|t| t.event)
            .collect();
        let has = |f: fn(&Event) -> bool| all.iter().any(f);
        assert!(has(
            |e| matches!(e, Event::CutCable { ms, .. } if *ms < TTL_S * 1000)
        ));
        assert!(has(
            |e| matches!(e, Event::CutCable { ms, .. } if *ms > TTL_S * 1000)
        ));
        assert!(has(|e| matches!(e, Event::Partition { .. })));
        assert!(has(|e| matches!(e, Event::CutServer { .. })));
        assert!(has(|e| matches!(e, Event::SlowLink { .. })));
        assert!(has(|e| matches!(e, Event::KillAgent(_))));
        assert!(has(|e| matches!(e, Event::Leave(_))));
        assert!(has(|e| matches!(e, Event::ScaleUp(_))));
        assert!(has(|e| matches!(e, Event::KillWorker { .. })));
        assert!(has(|e| matches!(e, Event::WaitSealed)));
    }

    #[test]
    fn chaos_schedule_corruption_follows_a_seal_and_keeps_the_other_events() {
        let mut seen = 0;
        for seed in 0..200 {
            let plain = generate(seed, StoreKind::Memory, 3, 8);
            let c = with_corruption(plain.clone());
            assert_eq!(c, with_corruption(plain.clone()), "reproducible");
            let mut others = Vec::new();
            let mut i = 0;
            while i < c.events.len() {
                if matches!(c.events[i].event, Event::CorruptShard { .. }) {
                    assert_eq!(c.events[i - 1].event, Event::WaitSealed, "{c}");
                    assert!(
                        matches!(c.events[i + 1].event, Event::KillWorker { .. }),
                        "{c}"
                    );
                    seen += 1;
                    i += 2;
                    continue;
                }
                others.push(&c.events[i]);
                i += 1;
            }
            assert_eq!(others, plain.events.iter().collect::<Vec<_>>());
        }
        assert!(seen > 20, "corruption is drawn: {seen}");
    }

    #[test]
    fn chaos_schedule_preemption_is_drawn_and_keeps_the_other_events() {
        let mut seen = 0;
        for seed in 0..100 {
            let plain = generate(seed, StoreKind::Etcd, 3, 8);
            let p = with_preemption(plain.clone());
            assert_eq!(p, with_preemption(plain.clone()), "reproducible");
            let others: Vec<&Timed> = p
                .events
                .iter()
                .filter(|t| !matches!(t.event, Event::Preempt(_)))
                .collect();
            assert_eq!(others, plain.events.iter().collect::<Vec<_>>());
            let n = p.events.len() - others.len();
            assert!(n <= 1, "{p}");
            seen += n;
        }
        assert!(
            (20..=80).contains(&seen),
            "drawn about half the time: {seen}"
        );
    }

    #[test]
    fn chaos_schedule_draws_every_kind_of_event() {
        let all: Vec<Event> = (0..100)
            .flat_map(|seed| generate(seed, StoreKind::Etcd, 3, 8).events)
            .map(|t| t.event)
            .collect();
        let has = |f: fn(&Event) -> bool| all.iter().any(f);
        assert!(has(|e| matches!(e, Event::KillAgent(_))));
        assert!(has(
            |e| matches!(e, Event::StopAgent { ms, .. } if *ms < TTL_S * 1000)
        ));
        assert!(has(
            |e| matches!(e, Event::StopAgent { ms, .. } if *ms > TTL_S * 1000)
        ));
        assert!(has(|e| matches!(e, Event::KillWorker { .. })));
        assert!(has(|e| matches!(e, Event::Leave(_))));
        assert!(has(|e| matches!(e, Event::ScaleUp(_))));
        assert!(has(|e| matches!(e, Event::RestartServer { .. })));
        assert!(has(|e| matches!(e, Event::WaitSealed)));
    }

    #[test]
    fn chaos_schedule_etcd_member_faults_only_over_etcd_and_keep_the_other_events() {
        let mut seen = 0;
        for seed in 0..100 {
            let m = generate(seed, StoreKind::Memory, 3, 8);
            assert_eq!(with_etcd_members(m.clone()), m);
            let plain = generate(seed, StoreKind::Etcd, 3, 8);
            let e = with_etcd_members(plain.clone());
            assert_eq!(e, with_etcd_members(plain.clone()), "reproducible");
            let others: Vec<_> = e
                .events
                .iter()
                .filter(|t| !matches!(t.event, Event::EtcdMember { .. }))
                .cloned()
                .collect();
            assert_eq!(others, plain.events);
            let n = e.events.len() - plain.events.len();
            seen += n;
            assert_eq!(e.etcd_members(), if n > 0 { 3 } else { 1 });
        }
        assert!(seen > 50, "member faults are drawn: {seen}");
    }

    #[test]
    fn chaos_schedule_bound_grows_with_each_fault() {
        let s = generate(7, StoreKind::Memory, 3, 3);
        let mut shorter = s.clone();
        shorter.events.pop();
        assert!(s.bound_ms(5_000) > shorter.bound_ms(5_000));
        assert!(s.bound_ms(5_000) >= 60_000 + 10_000);
    }
}
