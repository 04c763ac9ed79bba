//! Where a chaos run's processes run: this machine's loopback addresses (agent slot `i` on
//! 127.0.0.(i+1)), or the hosts of a network test bed (the server on host `server`, agent slot
//! `i` on host `n{i}`), and the bed's faults. The runner is the same for both; only this seam
//! differs.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::schedule::{Event, Schedule};
use crate::harness::cluster::RdzvServer;
use crate::harness::netbed::Bed;
use crate::harness::DrunCmd;

/// Where a run's server and agents live.
pub enum Place {
    Loopback,
    Bed(Bed),
}

/// The bed's host of agent slot `slot`.
fn host(slot: usize) -> String {
    format!("n{slot}")
}

/// The rate of a slow link.
const SLOW: &str = "20mbit";

impl Place {
    /// Where `s` runs: on loopback, or on a bed of its own with a host for the server and one per
    /// agent slot the schedule uses; `None` when a bed cannot be built here ([`Bed::new`] said
    /// why; with `DRUN_REQUIRE_NETNS=1` it fails instead).
    pub fn for_schedule(s: &Schedule) -> Option<Place> {
        if !s.bed {
            return Some(Place::Loopback);
        }
        let names: Vec<String> = std::iter::once("server".to_string())
            .chain((0..s.slots()).map(host))
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        Bed::new(&names).map(Place::Bed)
    }

    /// Starts the rendezvous server with `args` (store flags), its records at info in `log`.
    pub fn server(&self, args: &[&str], log: &Path) -> RdzvServer {
        match self {
            Place::Loopback => RdzvServer::start_logging(args, "info", log),
            Place::Bed(bed) => RdzvServer::start_in(bed, "server", args, "info", log),
        }
    }

    /// Starts the server again on `endpoint`, appending to `log`. Loopback only: bed schedules
    /// run on the memory store, whose server is never restarted.
    pub fn restart_server(&self, endpoint: &str, args: &[&str], log: &Path) -> RdzvServer {
        match self {
            Place::Loopback => RdzvServer::start_on_logging(endpoint, args, "info", log),
            Place::Bed(_) => panic!("bed schedules run on the memory store: no server restart"),
        }
    }

    /// Agent slot `slot`'s address flag (`--local-addr`), added to `c` before the script.
    pub fn address(&self, slot: usize, c: &mut Command) {
        match self {
            Place::Loopback => {
                c.node(slot);
            }
            Place::Bed(bed) => {
                c.args(["--local-addr", &bed.host(&host(slot)).addr])
                    .env("GLOO_SOCKET_IFNAME", "eth0");
            }
        }
    }

    /// `c` as it runs for agent slot `slot`: as it is, or on the slot's host.
    pub fn on_agent_host(&self, slot: usize, c: Command) -> Command {
        match self {
            Place::Loopback => c,
            Place::Bed(bed) => bed.on(&host(slot), &c),
        }
    }

    /// `c` as it runs beside the server (a client that must reach it).
    pub fn beside_server(&self, c: Command) -> Command {
        match self {
            Place::Loopback => c,
            Place::Bed(bed) => bed.on("server", &c),
        }
    }

    /// Applies one of the bed's network faults and heals it after its duration. Panics on
    /// another event, or off the bed (the generator draws these only for the bed).
    pub fn network_fault(&self, event: &Event) {
        let Place::Bed(bed) = self else {
            panic!("a network fault off the bed: {event}");
        };
        let wait = |ms: u64| std::thread::sleep(Duration::from_millis(ms));
        match *event {
            Event::CutCable { slot, ms } => {
                bed.pull_cable(&host(slot));
                wait(ms);
                bed.plug_cable(&host(slot));
            }
            Event::Partition { a, b, ms } => {
                bed.partition(&host(a), &host(b));
                wait(ms);
                bed.heal(&host(a), &host(b));
            }
            Event::CutServer { ms } => {
                bed.pull_cable("server");
                wait(ms);
                bed.plug_cable("server");
            }
            Event::SlowLink { slot, ms } => {
                bed.limit_rate(&host(slot), SLOW);
                wait(ms);
                bed.unlimit_rate(&host(slot));
            }
            _ => panic!("not a network fault: {event}"),
        }
    }
}
