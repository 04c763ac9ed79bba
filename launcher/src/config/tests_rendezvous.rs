//! Pure tests of the rendezvous choice: backends, endpoints, run ids, static ranks.

use super::tests::{args, err, host, ok, with_env};
use super::*;

/// A 2-node launch of `t.py` on the drun server `h:1`, run `j`, with `extra` flags.
fn two_nodes(extra: &[&'static str]) -> Vec<&'static str> {
    let mut v = vec![
        "--slurm",
        "off",
        "--nnodes",
        "2",
        "--rdzv-endpoint",
        "h:1",
        "--rdzv-id",
        "j",
    ];
    v.extend_from_slice(extra);
    v.push("t.py");
    v
}

#[test]
fn multi_node_static_needs_a_node_rank_below_nnodes() {
    assert!(err(&["--nnodes", "2", "t.py"], &host()).contains("never assumes localhost"));
    assert!(
        err(&["--nnodes", "1:2", "--node-rank", "0", "t.py"], &host()).contains("fixed node count")
    );
    assert!(err(&["--nnodes", "2", "--node-rank", "2", "t.py"], &host())
        .contains("must be below --nnodes 2"));
    let c = ok(&[
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "m",
        "t.py",
    ]);
    assert_eq!(
        c.rdzv.mode,
        RendezvousMode::Static {
            node_rank: 1,
            master_addr: "m".into(),
            master_port: 29500
        }
    );
    assert_eq!(
        c.rdzv.requested_node_rank, None,
        "a static rank is not a pin"
    );
    assert_eq!(c.run_id, "none");
}

#[test]
fn one_node_static_with_a_port_or_endpoint_keeps_it() {
    let c = ok(&["--master-port", "1234", "t.py"]);
    assert_eq!(
        c.rdzv.mode,
        RendezvousMode::Embedded {
            master_addr: "127.0.0.1".into(),
            fixed_port: Some(1234)
        }
    );
    let c = ok(&[
        "--rdzv-backend",
        "static",
        "--rdzv-endpoint",
        "[::1]:77",
        "t.py",
    ]);
    assert_eq!(
        c.rdzv.mode,
        RendezvousMode::Embedded {
            master_addr: "::1".into(),
            fixed_port: Some(77)
        }
    );
}

#[test]
fn dynamic_backends_get_their_default_ports_and_keep_pins() {
    let c = ok(&[
        "--nnodes",
        "1:3",
        "--rdzv-id",
        "j",
        "--rdzv-endpoint",
        "a,b:5",
        "--node-rank",
        "2",
        "t.py",
    ]);
    assert_eq!(
        c.rdzv.mode,
        RendezvousMode::Server {
            endpoints: vec!["a:29400".into(), "b:5".into()]
        }
    );
    assert_eq!(c.rdzv.requested_node_rank, Some(2));
    let c = ok(&[
        "--rdzv-backend",
        "etcd-v2",
        "--rdzv-endpoint",
        "e",
        "--rdzv-id",
        "j",
        "t.py",
    ]);
    assert_eq!(
        c.rdzv.mode,
        RendezvousMode::Etcd {
            endpoints: vec!["e:2379".into()]
        }
    );
    assert!(err(&["--rdzv-backend", "zk", "t.py"], &host()).contains("expected drun, c10d"));
    assert!(err(&["--rdzv-backend", "c10d", "t.py"], &host()).contains("never falls back"));
}

#[test]
fn c10d_is_host_comes_from_rdzv_conf() {
    let base = [
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "h",
        "--rdzv-conf",
    ];
    let mode = |conf: &str| {
        let mut v = base.to_vec();
        v.extend([conf, "t.py"]);
        ok(&v).rdzv.mode
    };
    assert_eq!(
        mode("is_host=yes"),
        RendezvousMode::C10d {
            endpoint: "h:29400".into(),
            is_host: Some(true)
        }
    );
    assert!(matches!(
        mode("is_host=0"),
        RendezvousMode::C10d {
            is_host: Some(false),
            ..
        }
    ));
    assert!(matches!(
        mode(""),
        RendezvousMode::C10d { is_host: None, .. }
    ));
    let mut v = base.to_vec();
    v.extend(["is_host=maybe", "t.py"]);
    assert!(err(&v, &host()).contains("expected 1 or 0"));
}

#[test]
fn a_multi_node_run_id_comes_from_the_flag_or_the_slurm_job_variable() {
    let v = [
        "--slurm",
        "off",
        "--nnodes",
        "2",
        "--rdzv-endpoint",
        "h:1",
        "t.py",
    ];
    let e = err(&v, &host());
    assert!(
        e.starts_with("--rdzv-id is missing: a multi-node run needs a run id"),
        "{e}"
    );
    assert!(!e.contains("'none'"), "{e}");
    let c = validate(&args(&v), &with_env(&[("SLURM_JOB_ID", "77")])).unwrap();
    assert_eq!(c.run_id, "77");
    assert!(c.scheduler.slurm.is_none(), "--slurm off");
    // The etcd backend's store outlives a job: an id is required there too.
    let mut etcd = v.to_vec();
    etcd.splice(0..0, ["--rdzv-backend", "etcd"]);
    assert!(err(&etcd, &host()).starts_with("--rdzv-id is missing"));
}

#[test]
fn a_c10d_run_without_an_id_is_none_as_under_torchrun_and_says_so() {
    for backend in ["c10d", "embedded"] {
        let v = [
            "--slurm",
            "off",
            "--nnodes",
            "1:2",
            "--rdzv-backend",
            backend,
            "--rdzv-endpoint",
            "h:1",
            "t.py",
        ];
        let c = validate(&args(&v), &host()).unwrap();
        assert_eq!(c.run_id, "none", "{backend}");
        assert!(
            c.notes
                .iter()
                .any(|n| n.contains("no --rdzv-id: the run id is 'none'")),
            "{backend}: {:?}",
            c.notes
        );
    }
}

#[test]
fn an_empty_endpoint_is_named_as_one_not_as_an_nnodes_problem() {
    for extra in [&[][..], &["--rdzv-backend", "c10d"][..]] {
        let mut v = vec!["--nnodes", "2", "--rdzv-id", "j", "--rdzv-endpoint", ""];
        v.extend_from_slice(extra);
        v.push("t.py");
        let e = err(&v, &host());
        assert!(
            e.starts_with("--rdzv-endpoint is empty: give HOST:PORT"),
            "{e}"
        );
    }
    let e = err(
        &[
            "--nnodes",
            "2",
            "--rdzv-backend",
            "drun",
            "--rdzv-id",
            "j",
            "t.py",
        ],
        &host(),
    );
    assert!(
        e.starts_with("--rdzv-endpoint is missing: --rdzv-backend drun needs"),
        "{e}"
    );
    // --standalone ignores the rendezvous flags, an empty endpoint too.
    ok(&["--standalone", "--rdzv-endpoint", "", "t.py"]);
}

#[test]
fn an_empty_or_path_like_run_id_is_refused_up_front() {
    // The last --rdzv-id wins.
    let with_id = |id: &'static str| two_nodes(&["--rdzv-id", id]);
    let e = err(&with_id(""), &host());
    assert!(e.starts_with("--rdzv-id is empty:"), "{e}");
    for bad in ["a/b", "a/../b", "job 1", ".", ".."] {
        let e = err(&with_id(bad), &host());
        assert!(e.starts_with("invalid --rdzv-id"), "{bad}: {e}");
    }
    assert!(validate(&args(&with_id("job-42.a_b:c@d")), &host()).is_ok());
    // The server's limit, said before any connection is tried.
    let long: &'static str = "r".repeat(254).leak();
    let e = err(&with_id(long), &host());
    assert!(e.contains("254 bytes long") && e.contains("253"), "{e}");
    assert!(validate(&args(&with_id(&long[1..])), &host()).is_ok());
}

#[test]
fn a_client_certificate_without_a_ca_is_refused_up_front() {
    for flag in ["--rdzv-tls-cert", "--rdzv-tls-key"] {
        let e = err(&two_nodes(&[flag, "c.pem"]), &host());
        assert!(
            e.starts_with("invalid --rdzv-tls-cert/--rdzv-tls-key") && e.contains("--rdzv-tls-ca"),
            "{e}"
        );
    }
}

#[test]
fn endpoints_schemes_and_limits_the_server_would_refuse_are_refused_up_front() {
    // The last --rdzv-endpoint and --nnodes win.
    let with = two_nodes;
    let cases: [(&[&str], &str); 7] = [
        (&["--rdzv-endpoint", "127.0.0.1:29425:1"], "is not a host"),
        (&["--rdzv-endpoint", "::1"], "in brackets"),
        (
            &["--rdzv-endpoint", "https://h:1"],
            "--rdzv-tls-ca is missing",
        ),
        (
            &["--rdzv-endpoint", "http://h:1", "--rdzv-tls-ca", "ca.pem"],
            "http:// is plaintext",
        ),
        (
            &["--rdzv-endpoint", "h:1", "--rdzv-conf", "lease_ttl=3601"],
            "at most 3600 s",
        ),
        (
            &["--rdzv-endpoint", "h:1", "--rdzv-conf", "lease_ttl=0.1"],
            "'lease_ttl=0.1': at least 1 s",
        ),
        (
            &["--rdzv-endpoint", "h:1", "--nnodes", "1:100001"],
            "at most 100000 nodes",
        ),
    ];
    for (extra, want) in cases {
        let e = err(&with(extra), &host());
        assert!(e.contains(want), "{extra:?}: {e}");
    }
    for ok in [
        &["--rdzv-endpoint", "[::1]:29400"][..],
        &["--rdzv-endpoint", "https://h:1", "--rdzv-tls-ca", "ca.pem"],
    ] {
        assert!(validate(&args(&with(ok)), &host()).is_ok(), "{ok:?}");
    }
}
