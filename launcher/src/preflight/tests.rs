use std::path::Path;

use super::*;

fn link(src: u32, dst: u32, gbps: f64) -> Link {
    Link {
        src,
        dst,
        src_host: format!("h{src}"),
        dst_host: format!("h{dst}"),
        gbps,
        latency_us: 40.0,
        bytes: (gbps * 1e9 / 8.0 * 1.5) as u64,
        seconds: 1.5,
    }
}

fn report(links: Vec<Link>) -> Report {
    Report {
        backend: "gloo".into(),
        world_size: 4,
        nodes: links.len().max(1) as u32,
        all_reduce: AllReduce {
            bytes: 8 << 20,
            seconds: 0.02,
            algbw_gbps: 3.3,
            busbw_gbps: 5.0,
        },
        links,
        seconds: 0.8,
        measure_seconds: 0.5,
        within: Vec::new(),
    }
}

#[test]
fn a_link_under_half_the_median_is_slow_and_even_links_are_not() {
    let even = [link(0, 1, 10.0), link(1, 2, 9.0), link(2, 0, 11.0)];
    assert_eq!(judge(&even, None), vec![None, None, None]);
    let one_slow = [link(0, 1, 10.0), link(1, 2, 4.0), link(2, 0, 11.0)];
    let v = judge(&one_slow, None);
    assert_eq!(v[0], None);
    assert_eq!(
        v[1].as_deref(),
        Some("below half the median link (10.00 Gbit/s)")
    );
    assert_eq!(v[2], None);
}

#[test]
fn both_links_of_a_slow_node_name_the_node() {
    // A trial's ring: node 2 at 20 Mbit/s; its outgoing link also fell under half the median
    // and was given that reason instead, while its incoming link named the node.
    let ring = [link(0, 1, 10.0), link(1, 2, 0.25), link(2, 0, 0.1)];
    let v = judge(&ring, None);
    assert_eq!(v[0], None);
    for why in &v[1..] {
        assert!(
            why.as_deref()
                .is_some_and(|w| w.starts_with("node 2 is slow")),
            "{v:?}"
        );
    }
}

#[test]
fn two_links_compare_with_their_mean_and_one_link_only_with_the_floor() {
    // The median of two is their mean: 1 is under half of 5.5, 4 is not under half of 7.
    assert!(judge(&[link(0, 1, 10.0), link(1, 0, 1.0)], None)[1].is_some());
    assert_eq!(
        judge(&[link(0, 1, 10.0), link(1, 0, 4.0)], None),
        vec![None, None]
    );
    assert_eq!(judge(&[link(0, 1, 0.1)], None), vec![None]);
    assert_eq!(
        judge(&[link(0, 1, 0.1)], Some(1.0))[0].as_deref(),
        Some("below --preflight-min-gbps 1")
    );
}

#[test]
fn the_floor_names_every_link_under_it() {
    let v = judge(&[link(0, 1, 10.0), link(1, 0, 9.0)], Some(9.5));
    assert_eq!(v[0], None);
    assert!(v[1]
        .as_deref()
        .unwrap()
        .contains("--preflight-min-gbps 9.5"));
}

#[test]
fn the_table_has_the_total_time_one_row_per_link_and_marks_the_slow_one() {
    let r = report(vec![link(0, 1, 10.0), link(1, 0, 1.0)]);
    let slow = judge(&r.links, None);
    let t = lines(&r, &slow);
    assert!(
        t[0] == "preflight: 4 ranks on 2 nodes (gloo) in 0.80 s, 0.50 s of it measuring",
        "{t:?}"
    );
    assert!(t[1].contains("all_reduce of 8.0 MiB") && t[1].contains("bus bandwidth 5.00"));
    assert_eq!(t.len(), 5, "{t:?}");
    assert!(t[3].contains("node 0 → 1") && t[3].contains("10.00 Gbit/s") && !t[3].contains("SLOW"));
    assert!(t[4].contains("node 1 → 0") && t[4].contains("h1 → h0") && t[4].contains("SLOW: "));
    assert!(t[4].ends_with("; moved 178.8 MiB in 1.50 s"), "{t:?}");
    let s = summary(&r, &slow);
    assert!(s.contains("slow: node 1 → 0"), "{s}");
    let one = report(vec![]);
    assert!(lines(&one, &[]).last().unwrap().contains("one node"));
    assert!(summary(&one, &[]).contains("none slow"));
}

#[test]
fn the_wrapped_argv_runs_the_check_then_the_target_with_its_arguments() {
    let script = Path::new("/run/drun-agent-x/preflight.py");
    let e = Entrypoint::unresolved(
        EntryKind::Script,
        &["train.py".into(), "--lr".into(), "${local_rank}".into()],
        None,
    );
    assert_eq!(
        argv(&e, script, 3),
        [
            "-u",
            "/run/drun-agent-x/preflight.py",
            "script",
            "train.py",
            "--lr",
            "3"
        ]
    );
    let m = Entrypoint::unresolved(EntryKind::Module, &["pkg.train".into()], None);
    assert_eq!(argv(&m, script, 0)[2..], ["module", "pkg.train"]);
    let r = Entrypoint::unresolved(EntryKind::RunPath, &["t.py".into(), "a".into()], None);
    assert_eq!(argv(&r, script, 0)[2..], ["run-path", "t.py", "a"]);
}

#[test]
fn no_python_and_a_rank0_store_cannot_run_the_check() {
    let b = Entrypoint::unresolved(EntryKind::Binary, &["./a.out".into()], None);
    assert!(unsupported(&b, true).unwrap().contains("--no-python"));
    let s = Entrypoint::unresolved(EntryKind::Script, &["t.py".into()], None);
    assert!(unsupported(&s, false)
        .unwrap()
        .contains("--worker-store agent"));
    assert_eq!(unsupported(&s, true), None);
}

#[test]
fn the_worker_api_answer_parses_with_and_without_a_report() {
    let skipped: Outcome =
        serde_json::from_str(r#"{"rank":0,"skipped":"torch is not importable"}"#).unwrap();
    assert_eq!(skipped.report, None);
    let r = report(vec![link(0, 1, 2.0)]);
    let full = serde_json::json!({"rank": 2, "report": r});
    let back: Outcome = serde_json::from_value(full).unwrap();
    assert_eq!(back.report, Some(r));
}

#[test]
fn a_node_whose_two_links_are_slow_is_named_even_in_a_ring_of_three() {
    // Node 2 is slow both ways: its two links are the median of three, so the median rule alone
    // names nothing; the links between the other nodes show it.
    let links = [link(0, 1, 10.0), link(1, 2, 0.02), link(2, 0, 0.03)];
    let nodes = slow_nodes(&links);
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!((nodes[0].node, nodes[0].host.as_str()), (2, "h2"));
    assert_eq!(
        (nodes[0].gbps_in, nodes[0].gbps_out, nodes[0].others),
        (0.02, 0.03, 10.0)
    );
    let v = judge(&links, None);
    assert_eq!(v[0], None);
    assert!(
        v[1].as_deref().unwrap().starts_with("node 2 is slow"),
        "{v:?}"
    );
    assert!(
        v[2].as_deref().unwrap().starts_with("node 2 is slow"),
        "{v:?}"
    );
    let r = report(links.to_vec());
    let table = lines(&r, &v).join("\n");
    assert!(
        table.contains("SLOW NODE: node 2 (h2): in 0.02 and out 0.03 Gbit/s, the links between the other nodes 10.00"),
        "{table}"
    );
    assert!(summary(&r, &v).contains("; slow node: node 2 (h2)"));
}

#[test]
fn one_slow_link_or_two_nodes_name_no_node() {
    // Only node 2's outgoing link is slow: the link is named, not a node.
    let links = [link(0, 1, 10.0), link(1, 2, 9.0), link(2, 0, 0.02)];
    assert!(slow_nodes(&links).is_empty());
    // Two nodes: both links touch both nodes.
    assert!(slow_nodes(&[link(0, 1, 0.01), link(1, 0, 0.01)]).is_empty());
    // Five nodes, node 3 slow both ways.
    let five = [
        link(0, 1, 10.0),
        link(1, 2, 11.0),
        link(2, 3, 0.5),
        link(3, 4, 0.4),
        link(4, 0, 9.0),
    ];
    let n = slow_nodes(&five);
    assert_eq!(n.iter().map(|n| n.node).collect::<Vec<_>>(), [3]);
}
