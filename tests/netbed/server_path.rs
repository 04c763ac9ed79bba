//! One host loses only its path to the rendezvous server, while it and its peers still reach
//! each other: the others go on without it, and it joins again once the path is back.

use super::*;

/// Three hosts train (one torch worker each, default settings) through a server on a fourth;
/// n1 and the server can no longer reach each other, while n1 still reaches n0 and n2. The
/// server gives n1 up and the other two train at world 2; n1's agent stays: once the path is
/// back it joins again and the world is 3 again. (A trial's finding: n1 reported its stopped
/// worker's failure to a server it could not reach, and exited 3 at the lease TTL, so the job
/// stayed at 2 nodes for the rest of its run.)
#[test]
fn a_host_that_loses_only_its_path_to_the_server_joins_again_once_it_is_back() {
    let Some(Trio {
        bed,
        dir,
        out,
        agents,
        server: _server,
    }) = trio("serverpath", "2:3")
    else {
        return;
    };
    let cut = Instant::now();
    bed.partition("n1", "server");
    let reformed = crate::harness::poll_until(
        Duration::from_secs(60),
        || matches!(newest_generation(&out), Some((g, 2)) if g > 1),
    );
    assert!(
        reformed,
        "n0 and n2 train at world 2; n1 said:\n{}\nserver log:\n{}",
        agents[1].stderr_so_far(),
        std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default()
    );
    let (g2, _) = newest_generation(&out).unwrap();
    let trained = cut.elapsed();
    // n1 gives its generation up at the lease TTL (nobody vouches for it: its peers went on).
    wait_for(
        "n1 no longer counts on its generation",
        Duration::from_secs(TTL + 20),
        || {
            agents[1]
                .stderr_so_far()
                .contains("no rendezvous server reachable for")
        },
    );
    let fenced = cut.elapsed();
    bed.heal("n1", "server");
    let back = crate::harness::poll_until(
        Duration::from_secs(90),
        || matches!(newest_generation(&out), Some((g, 3)) if g > g2),
    );
    assert!(
        back,
        "the world is 3 again once n1 reaches the server; n1 said:\n{}",
        agents[1].stderr_so_far()
    );
    let said = agents[1].stderr_so_far();
    assert!(
        said.contains("but every peer of generation 1 answers: this node is not cut off")
            && said.contains("the group went on without this node: joining again")
            && !said.contains("could not report the failure"),
        "n1 held on while its peers answered, and joined again once the server told it:\n{said}"
    );
    eprintln!(
        "path n1 ↔ server cut: world 2 trained {trained:?} after it, n1 fenced after {fenced:?}, \
         world 3 again {:?} after the cut",
        cut.elapsed()
    );
}
