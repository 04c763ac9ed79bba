//! Tests of the server's input checks.

use super::*;
use crate::ledger::ShardFile;
use crate::Join;

fn cand(node: &str) -> Candidate {
    Candidate {
        node_id: node.into(),
        advertise_addr: "10.0.0.7".into(),
        slots: 8,
        requested_node_rank: None,
        master_port: 29500,
        probe_port: 0,
    }
}

fn join(c: Candidate) -> Request {
    Request::Join(Join::from(c), 0)
}

#[test]
fn ids_are_printable_bounded_and_slash_free() {
    for good in ["job-42", "127.0.0.1_4242", "[::1]_7", "a:b@c"] {
        assert_eq!(id("node id", good), Ok(()), "{good}");
    }
    for bad in [
        "",
        "a/b",
        "a b",
        "a\nb",
        "\u{0}",
        ".",
        "..",
        &"x".repeat(MAX_ID + 1),
    ] {
        let e = id("node id", bad).unwrap_err().to_string();
        assert!(e.starts_with("node id"), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }
}

#[test]
fn addresses_are_names_or_ip_literals() {
    for good in [
        "",
        "node-1.cluster.local",
        "10.1.2.3",
        "fe80::1%eth0",
        "[::1]",
    ] {
        assert_eq!(addr(good), Ok(()), "{good}");
    }
    for bad in ["a b", "x;rm -rf", "ä.example", &"a".repeat(MAX_ADDR + 1)] {
        assert!(addr(bad).is_err(), "{bad}");
    }
}

#[test]
fn a_join_is_checked_field_by_field_and_must_be_the_sessions_own() {
    assert_eq!(request(&join(cand("n1")), "n1"), Ok(()));
    let e = request(&join(cand("n2")), "n1").unwrap_err().to_string();
    assert!(e.contains("in the name of node 'n2'"), "{e}");
    for (c, says) in [
        (
            Candidate {
                slots: 0,
                ..cand("n1")
            },
            "0 worker slots",
        ),
        (
            Candidate {
                slots: MAX_SLOTS + 1,
                ..cand("n1")
            },
            "worker slots",
        ),
        (
            Candidate {
                requested_node_rank: Some(MAX_NODES),
                ..cand("n1")
            },
            "node rank",
        ),
        (
            Candidate {
                advertise_addr: "evil host".into(),
                ..cand("n1")
            },
            "advertise address",
        ),
    ] {
        let e = request(&join(c), "n1").unwrap_err().to_string();
        assert!(e.contains(says), "{e}");
    }
}

#[test]
fn free_text_and_reports_are_bounded() {
    let big = "x".repeat(MAX_TEXT + 1);
    let failed = Request::Failed {
        generation: 1,
        description: big.clone(),
        cause: None,
    };
    assert!(request(&failed, "n")
        .unwrap_err()
        .to_string()
        .contains("failure description"));
    let report = Request::Report {
        kind: crate::store::reports::ReportKind::Pace,
        json: "y".repeat(MAX_REPORT + 1),
    };
    assert!(request(&report, "n")
        .unwrap_err()
        .to_string()
        .contains("node report"));
    assert_eq!(request(&Request::KeepAlive, "n"), Ok(()));
}

#[test]
fn a_commit_must_be_the_sessions_own_with_real_digests() {
    let file = |sha: &str| ShardFile {
        rank: 0,
        path: "/ckpt/step-2/rank-0.pt".into(),
        bytes: 3,
        digest: sha.into(),
    };
    let commit = |node: &str, files| Request::Commit {
        commit: NodeCommit {
            node_id: node.into(),
            generation: 1,
            step: 2,
            ranks: vec![0],
            cursor: Default::default(),
            files,
            save_started_ms: None,
            staged_ms: None,
        },
        retention: Default::default(),
    };
    let good = "ab".repeat(32);
    assert_eq!(request(&commit("n", vec![file(&good)]), "n"), Ok(()));
    let blake3 = format!("blake3:{good}");
    assert_eq!(request(&commit("n", vec![file(&blake3)]), "n"), Ok(()));
    assert!(request(&commit("m", vec![]), "n")
        .unwrap_err()
        .to_string()
        .contains("node 'm'"));
    for bad in ["zz", "blake3:zz", &format!("md5:{good}")] {
        assert!(request(&commit("n", vec![file(bad)]), "n")
            .unwrap_err()
            .to_string()
            .contains("has no digest"));
    }
}

#[test]
fn a_hello_names_its_run_and_node_within_limits() {
    let h = pb::Hello {
        run_id: "job".into(),
        node_id: "n1".into(),
        min_nodes: 1,
        max_nodes: 4,
        lease_ttl_ms: 10_000,
        ..Default::default()
    };
    assert_eq!(hello(&h), Ok(()));
    let bad = |f: &dyn Fn(&mut pb::Hello)| {
        let mut h = h.clone();
        f(&mut h);
        hello(&h).unwrap_err().to_string()
    };
    assert!(bad(&|h| h.run_id = "a/b".into()).starts_with("run id"));
    assert!(bad(&|h| h.node_id.clear()).starts_with("node id"));
    assert!(bad(&|h| h.max_nodes = MAX_NODES + 1).contains("nnodes"));
    assert!(bad(&|h| h.lease_ttl_ms = MAX_LEASE_TTL_MS + 1).contains("lease TTL"));
}
