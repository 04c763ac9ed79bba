//! The rank table node rank 0 prints at each formation: global rank → node rank, host, local
//! rank, pid and `CUDA_VISIBLE_DEVICES`.
//!
//! What is shown is what node rank 0 knows without asking anyone: every rank, its node rank,
//! host (the node's advertised address) and local rank come from the plan, which every agent
//! receives; pids and `CUDA_VISIBLE_DEVICES` are known for node rank 0's own workers only, and
//! are `-` for the ranks of other nodes. A plan of more than
//! [`drun_rendezvous::decisions::plan::FULL_PLAN_NODES`] nodes reaches an agent with its own entry only: the
//! table then lists this node's ranks and says how many it leaves out.

use drun_rendezvous::Plan;

/// One of this node's workers as the table shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalWorker {
    /// LOCAL_RANK.
    pub local_rank: u32,
    /// Its pid.
    pub pid: i32,
}

/// The table (pure): a heading line, a header row and one row per rank in rank order.
/// `node_id` is this node, `local` its workers, `devices` its workers' `CUDA_VISIBLE_DEVICES`.
pub fn rank_table(
    plan: &Plan,
    node_id: &str,
    local: &[LocalWorker],
    devices: Option<&str>,
) -> String {
    let mut rows: Vec<[String; 6]> = Vec::with_capacity(plan.world_size as usize);
    for m in plan.members.iter() {
        let mine = m.node_id == node_id;
        for lr in 0..m.slots {
            let pid = local
                .iter()
                .find(|w| mine && w.local_rank == lr)
                .map_or("-".to_string(), |w| w.pid.to_string());
            let dev = match devices {
                Some(d) if mine && !d.is_empty() => d.to_string(),
                _ => "-".to_string(),
            };
            rows.push([
                (m.base_rank + lr).to_string(),
                m.node_rank.to_string(),
                m.advertise_addr.clone(),
                lr.to_string(),
                pid,
                dev,
            ]);
        }
    }
    let header = [
        "RANK",
        "NODE_RANK",
        "HOST",
        "LOCAL_RANK",
        "PID",
        "CUDA_VISIBLE_DEVICES",
    ];
    let widths: Vec<usize> = (0..6)
        .map(|c| {
            rows.iter()
                .map(|r| r[c].len())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: [&str; 6]| {
        let mut s = String::from(" ");
        for (c, cell) in cells.iter().enumerate() {
            s.push(' ');
            if c == 5 {
                s.push_str(cell);
            } else {
                s.push_str(&format!("{cell:w$}", w = widths[c]));
            }
        }
        s
    };
    let left_out = if plan.complete() {
        String::new()
    } else {
        format!(
            "; the plan of {} nodes lists only this node, {} rank(s) of other nodes are not shown",
            plan.node_count(),
            plan.world_size as usize - rows.len()
        )
    };
    let mut out = format!(
        "rank table of generation {} ({} rank(s); PID and CUDA_VISIBLE_DEVICES of this node's workers only{left_out}):\n{}",
        plan.generation,
        plan.world_size,
        line(header)
    );
    for r in &rows {
        out.push('\n');
        out.push_str(&line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use drun_rendezvous::{assign, Candidate};

    fn plan() -> Plan {
        let node = |id: &str, slots| Candidate {
            node_id: id.into(),
            advertise_addr: format!("{id}.cluster"),
            slots,
            requested_node_rank: None,
            master_port: 1,
            probe_port: 0,
        };
        assign("r", 2, &[node("b", 1), node("a", 2)], 0, 0).unwrap()
    }

    fn rows(t: &str) -> Vec<Vec<&str>> {
        t.lines()
            .skip(2)
            .map(|l| l.split_whitespace().collect())
            .collect()
    }

    #[test]
    fn every_rank_once_with_pids_and_devices_of_this_node_only() {
        let local = [
            LocalWorker {
                local_rank: 0,
                pid: 100,
            },
            LocalWorker {
                local_rank: 1,
                pid: 101,
            },
        ];
        let t = rank_table(&plan(), "a", &local, Some("0,1"));
        assert!(
            t.starts_with("rank table of generation 2 (3 rank(s)"),
            "{t}"
        );
        assert_eq!(
            rows(&t),
            [
                ["0", "0", "a.cluster", "0", "100", "0,1"],
                ["1", "0", "a.cluster", "1", "101", "0,1"],
                ["2", "1", "b.cluster", "0", "-", "-"],
            ]
        );
        // Without CUDA_VISIBLE_DEVICES: a dash.
        let t = rank_table(&plan(), "a", &local, None);
        assert_eq!(rows(&t)[0][5], "-");
    }

    #[test]
    fn a_plan_with_only_this_nodes_entry_says_what_it_leaves_out() {
        let mut p = plan();
        p.node_count = 80;
        p.world_size = 160;
        p.members = p.members[..1].to_vec().into();
        let t = rank_table(&p, "a", &[], None);
        assert!(
            t.contains("158 rank(s) of other nodes are not shown"),
            "{t}"
        );
        assert_eq!(rows(&t).len(), 2);
    }
}
