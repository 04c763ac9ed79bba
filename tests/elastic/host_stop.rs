//! A c10d host that stops for any reason but the run's own end ends the run for every agent at
//! once: the run's state lived in its memory, so nobody can go on without it. Before, the
//! others re-formed without it, lost the server when it stopped 30 s later, and then waited for
//! it until the join timeout (10 min by default) before exiting 3.

use std::time::Duration;

use nix::sys::signal::Signal;

use super::{agent, gen, wait_gen};
use crate::harness::cluster::free_port;
use crate::harness::{processes_of_run, wait_for, Agent, DrunCmd};

#[test]
fn a_stopping_c10d_host_ends_the_run_for_every_agent_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("127.0.0.1:{}", free_port());
    let rdzv: Vec<String> = ["--rdzv-backend", "c10d", "--rdzv-endpoint", &endpoint]
        .map(String::from)
        .to_vec();
    let agents: Vec<Agent> = (0..3)
        .map(|i| agent(i, "hoststop", "2:3", &rdzv, &[], dir.path()))
        .collect();
    wait_gen(dir.path(), 1, 6, Duration::from_secs(60));
    let host = agents
        .iter()
        .position(|a| a.stderr_so_far().contains("hosting the rendezvous"))
        .expect("one agent hosts the rendezvous");

    agents[host].signal(Signal::SIGTERM);
    // Well inside the 30 s the host used to linger for, let alone the join timeout after it.
    for (i, a) in agents.into_iter().enumerate() {
        let (code, _, err) = a.wait(Duration::from_secs(20));
        if i == host {
            assert_eq!(code, 143, "the host ends as its signal says:\n{err}");
            continue;
        }
        assert_eq!(code, 3, "agent {i} ends retryable:\n{err}");
        let line = err
            .lines()
            .find(|l| l.starts_with("drun: run hoststop ended:"))
            .unwrap_or_else(|| panic!("agent {i} says why:\n{err}"));
        assert!(
            line.contains("the agent hosting the rendezvous")
                && line.contains("stopped by SIGTERM")
                && line.contains("restart the job on every node"),
            "{line}"
        );
    }
    assert!(
        gen(dir.path(), 2).is_empty(),
        "no generation formed around a host that was going away"
    );
    wait_for(
        "no process of the run left",
        Duration::from_secs(10),
        || processes_of_run("hoststop").is_empty(),
    );
}

/// A c10d host killed outright (SIGKILL: no word to anyone) while the other agents' workers
/// fail: nobody can decide their failure, and each survivor ends (exit 3) naming, beside its own
/// worker's failure, that the host's node rank answers neither the rendezvous nor its probes (a
/// trial's Slurm run blamed only the survivor's own worker).
#[test]
fn a_killed_c10d_host_is_named_in_the_survivors_last_words() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("127.0.0.1:{}", free_port());
    let trigger = dir.path().join("fail-now");
    let agents: Vec<Agent> = (0..3)
        .map(|i| {
            let mut c = crate::harness::drun();
            c.job("hostkill", "2:3")
                .nproc(1)
                .node(i)
                .quick_shutdown()
                .args(["--rdzv-backend", "c10d", "--rdzv-endpoint", &endpoint])
                .args(["--rdzv-conf", "lease_ttl=3"])
                .args(["--no-python", "sh", "-c"])
                .arg("touch \"$0.$RANK\"; while [ ! -e \"$0\" ]; do sleep 0.05; done; exit 7")
                .arg(&trigger);
            Agent::start(c)
        })
        .collect();
    wait_for("every worker started", Duration::from_secs(60), || {
        (0..3).all(|r| dir.path().join(format!("fail-now.{r}")).exists())
    });
    let host = agents
        .iter()
        .position(|a| a.stderr_so_far().contains("hosting the rendezvous"))
        .expect("one agent hosts the rendezvous");
    // The peers have answered each other's probes for a while (a peer never heard in a
    // generation leaves no evidence of silence).
    let started = std::time::Instant::now();
    wait_for(
        "the generation ran for two probe quiet limits",
        Duration::from_secs(10),
        || started.elapsed() >= 2 * drun_launcher::peers::QUIET,
    );
    agents[host].signal(Signal::SIGKILL);
    std::fs::write(&trigger, b"").unwrap();
    for (i, a) in agents.into_iter().enumerate() {
        if i == host {
            continue;
        }
        let (code, _, err) = a.wait(Duration::from_secs(30));
        assert_eq!(code, 3, "agent {i} ends retryable:\n{err}");
        let also = err
            .lines()
            .find(|l| l.starts_with("drun: also: could not report the failure"))
            .unwrap_or_else(|| panic!("agent {i} says why its failure went undecided:\n{err}"));
        assert!(
            also.contains("node rank ")
                && also.contains("of generation 1 does not answer this node's probes either"),
            "{also}"
        );
    }
    wait_for(
        "no process of the run left",
        Duration::from_secs(10),
        || processes_of_run("hostkill").is_empty(),
    );
}
