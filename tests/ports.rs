//! MASTER_PORT choice: jobs started at the same moment on one host never share a port.

use std::time::Duration;

use crate::harness::{drun, read_json, worker, Agent};

#[test]
fn concurrent_jobs_get_distinct_working_master_ports() {
    for round in 0..10 {
        let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
        let agents: Vec<Agent> = dirs
            .iter()
            .map(|d| {
                let mut c = drun();
                // Worker rank 0 binds MASTER_PORT itself here, as it does with
                // --worker-store rank0 (with the default, the agent listens there).
                c.args(["--standalone", "--nproc-per-node", "2"])
                    .args(["--worker-store", "rank0"])
                    .arg(worker("portcheck.py"))
                    .arg(d.path());
                Agent::start(c)
            })
            .collect();
        let mut ports = Vec::new();
        for (a, d) in agents.into_iter().zip(&dirs) {
            let (code, _, err) = a.wait(Duration::from_secs(60));
            assert_eq!(code, 0, "round {round}: {err}");
            let p0 = read_json(&d.path().join("port_0.json"));
            let p1 = read_json(&d.path().join("port_1.json"));
            assert_eq!(
                p1["run_id_seen"], p1["own_run_id"],
                "rank 1 reached its own job's rank 0"
            );
            assert!(p0["bind_error"].is_null(), "{p0}");
            ports.push(p0["port"].clone());
        }
        assert_ne!(ports[0], ports[1], "round {round}");
    }
}
