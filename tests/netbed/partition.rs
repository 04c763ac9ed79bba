//! A partition between two peers that both still reach the server: named and healed by sending one
//! side away, or the end of a run that would fall below its minimum.

use super::*;

/// Three hosts train (one torch worker each, default settings) through a server on a fourth;
/// n1 and n2 can no longer reach each other, while both still reach the server and n0. Within
/// 10 s both agents name the peer they cannot reach (its node rank and address); the node of the
/// pair with the higher rank is sent away (the largest set that all reach each other, ties
/// towards node rank 0), the other two train at world 2 soon after the break, the one sent
/// away stands by; when the partition heals it joins again and the world is 3 again.
#[test]
fn a_partition_between_two_peers_is_named_and_healed_by_sending_one_side_away() {
    let Some(Trio {
        bed,
        dir,
        out,
        agents,
        server: _server,
    }) = trio("split", "2:3")
    else {
        return;
    };
    let rank_of = |name: &str| -> u64 {
        let pids = bed.pids_on(name);
        crate::harness::gen_records(&out, 1)
            .iter()
            .find(|r| pids.contains(&(r["pid"].as_i64().unwrap() as i32)))
            .and_then(|r| r["group_rank"].as_u64())
            .unwrap()
    };
    let (r1, r2) = (rank_of("n1"), rank_of("n2"));

    let cut = Instant::now();
    bed.partition("n1", "n2");
    let names = |a: &Agent, rank: u64, host: &str| {
        a.stderr_so_far().contains(&format!(
            "cannot reach node rank {rank} ({}) of generation 1",
            bed.host(host).addr
        ))
    };
    wait_for("both sides name the other", Duration::from_secs(10), || {
        names(&agents[1], r2, "n2") && names(&agents[2], r1, "n1")
    });
    let named = cut.elapsed();
    assert!(
        !agents[0].stderr_so_far().contains("cannot reach node rank"),
        "n0 reaches both"
    );
    let (kept, away) = if r1 < r2 { ("n1", "n2") } else { ("n2", "n1") };
    let cut_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        - cut.elapsed().as_secs_f64();
    let first_step_at_world_2 = || -> Option<f64> {
        (0..2).find_map(|r| {
            std::fs::read_to_string(out.join(format!("steps_rank{r}.log")))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    (f.get(2) == Some(&"2"))
                        .then(|| f[0].parse::<f64>().ok())
                        .flatten()
                })
                .find(|t| *t > cut_at)
        })
    };
    let reformed = crate::harness::poll_until(Duration::from_secs(60), || {
        first_step_at_world_2().is_some()
    });
    assert!(
        reformed,
        "the other two train at world 2; server log:\n{}",
        std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default()
    );
    let trained = first_step_at_world_2().unwrap() - cut_at;
    let i_away = if away == "n1" { 1 } else { 2 };
    let i_kept = if kept == "n1" { 1 } else { 2 };
    wait_for(
        "the node sent away stands by",
        Duration::from_secs(10),
        || {
            agents[i_away]
                .stderr_so_far()
                .contains("standing by: sent away from generation 1")
        },
    );
    let reason = format!(
        "node {} ↔ node {} cannot reach each other",
        r1.min(r2),
        r1.max(r2)
    );
    assert!(
        agents[0].stderr_so_far().contains(&reason),
        "the survivors name why: {}",
        agents[0].stderr_so_far()
    );
    assert!(!agents[i_kept].stderr_so_far().contains("standing by"));
    let (g2, _) = newest_generation(&out).unwrap();
    bed.heal("n1", "n2");
    wait_for(
        "the world is 3 again",
        Duration::from_secs(90),
        || matches!(newest_generation(&out), Some((g, 3)) if g > g2),
    );
    assert!(agents[i_away]
        .stderr_so_far()
        .contains("every node to reach answers this node's probes again"));
    eprintln!(
        "partition named on both sides {named:?} after it began; world 2 trained {trained:.2} s after it"
    );
    // Measured at the defaults: 9.0–9.4 s (the target: 15 s); the bound leaves room for
    // a loaded CI machine (the restart includes `import torch`).
    assert!(
        trained <= 30.0,
        "the remaining world trained {trained:.2} s after the break"
    );
}

/// The same partition in a run that needs all three nodes (`--nnodes 3`): no two-node world may
/// go on, so the run ends on every node with one line naming the broken pair (exit 3, which a
/// restart policy retries), instead of hanging in the collective for its 30-minute timeout.
#[test]
fn a_partition_that_leaves_fewer_than_min_nodes_ends_the_run_naming_the_broken_pair() {
    // Every field bound: `..` would drop the server and the records' folder right here.
    let Some(Trio {
        bed,
        agents,
        out: _out,
        server: _server,
        dir: _dir,
    }) = trio("split-min", "3")
    else {
        return;
    };
    bed.partition("n1", "n2");
    for a in agents {
        let (code, _, err) = a.wait(Duration::from_secs(60));
        assert_eq!(code, 3, "{err}");
        assert!(
            err.contains("the nodes cannot all reach each other (node 1 ↔ node 2): no 3 of them"),
            "{err}"
        );
    }
}
