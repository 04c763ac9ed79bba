//! Parsers of single flag values: `--nnodes`, `--nproc-per-node`, signal lists, rank filters.

use std::collections::BTreeSet;

use nix::sys::signal::Signal;

use drun_rendezvous::server::validate::MAX_SLOTS;

use super::invalid;
use crate::ConfigError;

/// Parses `--nnodes`: `N` or `MIN:MAX` with `0 < MIN <= MAX` (torchrun `parse_min_max_nnodes`).
///
/// ```
/// use drun_launcher::config::parse_nnodes;
/// assert_eq!(parse_nnodes("2").unwrap(), (2, 2));
/// assert_eq!(parse_nnodes("1:4").unwrap(), (1, 4));
/// assert!(parse_nnodes("3:2").is_err());
/// ```
pub fn parse_nnodes(v: &str) -> Result<(u32, u32), ConfigError> {
    let bad = |why: &str| invalid("--nnodes", v, why);
    let parse = |s: &str| {
        s.trim()
            .parse::<u32>()
            .map_err(|_| bad("expected N or MIN:MAX with integers"))
    };
    let (min, max) = match v.split_once(':') {
        None => {
            let n = parse(v)?;
            (n, n)
        }
        Some((a, b)) => (parse(a)?, parse(b)?),
    };
    if min == 0 || min > max {
        return Err(bad("need 0 < MIN <= MAX"));
    }
    if max > drun_rendezvous::server::validate::MAX_NODES {
        return Err(bad(&format!(
            "at most {} nodes",
            drun_rendezvous::server::validate::MAX_NODES
        )));
    }
    Ok((min, max))
}

/// Parses `--nproc-per-node`: an integer ≥ 1, `cpu` (`cpus`), `gpu` (`gpus`, error if 0) or
/// `auto` (`gpus` if any, else `cpus`).
pub fn parse_nproc(v: &str, cpus: u32, gpus: u32) -> Result<u32, ConfigError> {
    match v.trim() {
        "cpu" => Ok(cpus),
        "gpu" => match gpus {
            0 => Err(invalid(
                "--nproc-per-node",
                v,
                "no NVIDIA GPU is visible; use an integer or `cpu`",
            )),
            n => Ok(n),
        },
        "auto" => Ok(match gpus {
            0 => cpus,
            n => n,
        }),
        "xpu" => Err(invalid(
            "--nproc-per-node",
            v,
            "Intel XPUs are not supported; use an integer, cpu, gpu or auto",
        )),
        s => match s.parse::<u32>() {
            Ok(0) => Err(invalid("--nproc-per-node", v, "must be at least 1")),
            Ok(n) if n > MAX_SLOTS => Err(invalid(
                "--nproc-per-node",
                v,
                format!("at most {MAX_SLOTS} workers per node (what a rendezvous server accepts)"),
            )),
            Ok(n) => Ok(n),
            Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => Err(invalid(
                "--nproc-per-node",
                v,
                "far more workers than one node can run",
            )),
            Err(_) => Err(invalid(
                "--nproc-per-node",
                v,
                "expected an integer >= 1, cpu, gpu or auto",
            )),
        },
    }
}

/// Parses `SIGTERM,SIGINT,...` (names with or without `SIG`, or numbers).
pub fn parse_signals(v: &str) -> Result<Vec<Signal>, ConfigError> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            let upper = s.to_ascii_uppercase();
            let name = if upper.starts_with("SIG") {
                upper
            } else {
                format!("SIG{upper}")
            };
            name.parse::<Signal>()
                .or_else(|_| {
                    s.parse::<i32>()
                        .map_err(|_| ())
                        .and_then(|n| Signal::try_from(n).map_err(|_| ()))
                })
                .map_err(|_| invalid("--signals-to-handle", v, format!("unknown signal {s}")))
                .and_then(|sig| match unhandleable(sig) {
                    Some(why) => Err(invalid(
                        "--signals-to-handle",
                        v,
                        format!("{sig} {why}; list signals that ask the job to stop, e.g. SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"),
                    )),
                    None => Ok(sig),
                })
        })
        .collect()
}

/// Why drun cannot take `sig` as a request to stop the job, if it cannot: the kernel does not
/// let it be caught, it reports a fault of drun itself, or it comes in the ordinary course of
/// a run (a worker exits, the terminal resizes, job control) and would stop a healthy job.
fn unhandleable(sig: Signal) -> Option<&'static str> {
    use Signal::*;
    match sig {
        SIGKILL | SIGSTOP => Some("cannot be caught"),
        SIGSEGV | SIGBUS | SIGFPE | SIGILL | SIGTRAP | SIGSYS => {
            Some("reports a fault of the process it is sent to")
        }
        SIGCHLD | SIGWINCH | SIGURG | SIGPIPE => {
            Some("comes in the ordinary course of a run and would stop a healthy job")
        }
        SIGTSTP | SIGCONT | SIGTTIN | SIGTTOU => {
            Some("is job control, which drun relays to the workers itself")
        }
        _ => None,
    }
}

/// `--preempt-signal`: exactly one signal.
pub(super) fn parse_preempt_signal(v: &str) -> Result<Signal, ConfigError> {
    parse_signals(v)
        .ok()
        .filter(|v| v.len() == 1)
        .map(|v| v[0])
        .ok_or_else(|| {
            invalid(
                "--preempt-signal",
                v,
                "expected one signal name, e.g. SIGUSR1",
            )
        })
}

/// `--stdin-rank` must name one of this node's local ranks.
pub(super) fn check_stdin_rank(stdin_rank: Option<u32>, nproc: u32) -> Result<(), ConfigError> {
    match stdin_rank.filter(|r| *r >= nproc) {
        None => Ok(()),
        Some(r) => Err(invalid(
            "--stdin-rank",
            r.to_string(),
            format!(
                "this node runs local ranks 0..{} (--nproc-per-node {nproc}); name one of them",
                nproc - 1,
            ),
        )),
    }
}

/// `--local-ranks-filter`: comma-separated local ranks; empty = every rank (`None`).
pub(super) fn parse_ranks_filter(v: &str) -> Result<Option<BTreeSet<u32>>, ConfigError> {
    if v.trim().is_empty() {
        return Ok(None);
    }
    v.split(',')
        .map(|s| {
            s.trim().parse::<u32>().map_err(|_| {
                invalid(
                    "--local-ranks-filter",
                    v,
                    "expected comma-separated local ranks",
                )
            })
        })
        .collect::<Result<BTreeSet<_>, _>>()
        .map(Some)
}

/// A warning for `--local-ranks-filter` ranks this node does not run (torchrun accepts them
/// silently, and shows nothing for them): `None` when every named rank is below `nproc`.
pub(super) fn ranks_filter_note(filter: Option<&BTreeSet<u32>>, nproc: u32) -> Option<String> {
    let outside: Vec<String> = filter?
        .iter()
        .filter(|r| **r >= nproc)
        .map(u32::to_string)
        .collect();
    if outside.is_empty() {
        return None;
    }
    let consequence = if outside.len() == filter.map_or(0, BTreeSet::len) {
        "no worker's output will show on the console"
    } else {
        "they show nothing"
    };
    Some(format!(
        "--local-ranks-filter names local rank(s) {} that this node does not run (--nproc-per-node {nproc}: local ranks 0..{}); {consequence}",
        outside.join(", "),
        nproc.saturating_sub(1),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ranks_filter_beyond_the_nodes_workers_is_warned_about() {
        let f = |v: &str| parse_ranks_filter(v).unwrap();
        assert_eq!(ranks_filter_note(f("").as_ref(), 4), None);
        assert_eq!(ranks_filter_note(f("0,3").as_ref(), 4), None);
        let some = ranks_filter_note(f("1,4,9").as_ref(), 4).unwrap();
        assert!(
            some.contains("local rank(s) 4, 9") && some.contains("0..3"),
            "{some}"
        );
        assert!(some.ends_with("they show nothing"), "{some}");
        let all = ranks_filter_note(f("8").as_ref(), 8).unwrap();
        assert!(
            all.ends_with("no worker's output will show on the console"),
            "{all}"
        );
    }

    #[test]
    fn nnodes_and_nproc_validation() {
        assert_eq!(parse_nnodes("2").unwrap(), (2, 2));
        assert_eq!(parse_nnodes("1:4").unwrap(), (1, 4));
        assert!(parse_nnodes("3:2")
            .unwrap_err()
            .to_string()
            .contains("0 < MIN <= MAX"));
        assert!(parse_nnodes("0").is_err());
        assert!(parse_nnodes("a:b").is_err());
        assert_eq!(parse_nproc("4", 8, 0).unwrap(), 4);
        assert!(parse_nproc("0", 8, 0)
            .unwrap_err()
            .to_string()
            .contains("at least 1"));
        assert_eq!(parse_nproc("cpu", 8, 2).unwrap(), 8);
        assert_eq!(parse_nproc("auto", 8, 2).unwrap(), 2);
        assert_eq!(parse_nproc("auto", 8, 0).unwrap(), 8);
        assert!(parse_nproc("gpu", 8, 0).is_err());
    }

    #[test]
    fn signals() {
        assert_eq!(
            parse_signals("SIGTERM,int, 10").unwrap(),
            [Signal::SIGTERM, Signal::SIGINT, Signal::SIGUSR1]
        );
        assert!(parse_signals("SIGNOPE").is_err());
        // Signals that cannot be caught, are faults, or come in every run: refused up front.
        for (bad, why) in [
            ("SIGTERM,SIGKILL", "cannot be caught"),
            ("11", "a fault"),
            ("SIGCHLD", "would stop a healthy job"),
            ("winch", "would stop a healthy job"),
            ("SIGTSTP", "job control"),
        ] {
            let e = parse_signals(bad).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains("e.g. SIGTERM"), "{bad}: {e}");
        }
        assert!(parse_preempt_signal("SIGCHLD").is_err());
        assert_eq!(parse_preempt_signal("usr2").unwrap(), Signal::SIGUSR2);
        assert!(parse_preempt_signal("SIGUSR1,SIGUSR2").is_err());
        assert_eq!(
            parse_ranks_filter("0, 2").unwrap(),
            Some(BTreeSet::from([0, 2]))
        );
        assert_eq!(parse_ranks_filter(" ").unwrap(), None);
        assert!(parse_ranks_filter("a").is_err());
    }
}
