//! Hostile and malformed input to a real `drun-rendezvous` server (issue 15), from a raw gRPC
//! client speaking drun.v1: an invalid Hello is answered `InvalidArgument` with one line, a
//! request in another node's name ends that session with one line and changes nothing in the
//! store, a run past `--max-runs` is refused `ResourceExhausted`, an oversized message is
//! refused; through all of it the server keeps serving.

use std::time::Duration;

use drun_proto::v1 as pb;
use drun_proto::v1::rendezvous_client::RendezvousClient;
use serde_json::Value;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::harness::cluster::{rendezvous_bin, RdzvServer};

fn hello(run: &str, node: &str) -> pb::AgentMessage {
    pb::AgentMessage {
        kind: Some(pb::agent_message::Kind::Hello(pb::Hello {
            protocol_version: drun_proto::PROTOCOL_VERSION,
            run_id: run.into(),
            node_id: node.into(),
            min_nodes: 2,
            max_nodes: 2,
            join_timeout_ms: 30_000,
            lease_ttl_ms: 10_000,
            ..Default::default()
        })),
    }
}

fn join(node: &str) -> pb::AgentMessage {
    pb::AgentMessage {
        kind: Some(pb::agent_message::Kind::Join(pb::Join {
            candidate: Some(pb::Candidate {
                node_id: node.into(),
                advertise_addr: "127.0.0.1".into(),
                slots: 1,
                requested_node_rank: -1,
                master_port: 29500,
                ..Default::default()
            }),
            after_generation: 0,
        })),
    }
}

/// Opens a session sending `msgs`: the status of the open, and the session's first events
/// (up to `n`, or until it ends or 5 s pass) when it opened.
async fn session(
    endpoint: &str,
    msgs: Vec<pb::AgentMessage>,
    n: usize,
) -> Result<Vec<pb::ServerEvent>, tonic::Status> {
    // No limit of the client's own: what the server takes is under test.
    let mut client = RendezvousClient::connect(format!("http://{endpoint}"))
        .await
        .expect("connect to the server")
        .max_encoding_message_size(usize::MAX);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for m in msgs {
        tx.send(m).unwrap();
    }
    let mut inbound = client
        .session(UnboundedReceiverStream::new(rx))
        .await?
        .into_inner();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while out.len() < n {
        match tokio::time::timeout_at(deadline, inbound.message()).await {
            Ok(Ok(Some(ev))) => out.push(ev),
            Ok(Ok(None)) | Err(_) => break,
            Ok(Err(s)) => return Err(s),
        }
    }
    drop(tx);
    Ok(out)
}

fn error_of(events: &[pb::ServerEvent]) -> Option<String> {
    events.iter().find_map(|e| match &e.kind {
        Some(pb::server_event::Kind::Error(m)) => Some(m.clone()),
        _ => None,
    })
}

/// The run's status as JSON, asked of the server.
fn status(endpoint: &str, run: &str) -> Value {
    let o = std::process::Command::new(rendezvous_bin())
        .args(["status", run, "--json", "--endpoint", endpoint])
        .env_remove("DRUN_RDZV_TOKEN")
        .output()
        .expect("run drun-rendezvous status");
    serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().unwrap()
}

#[test]
fn an_invalid_hello_is_refused_with_invalid_argument_and_one_line() {
    let server = RdzvServer::start(&["--store", "memory"]);
    let rt = rt();
    for (run, node, says) in [
        ("a/b", "n1", "invalid Hello: run id 'a/b'"),
        ("job", "", "invalid Hello: node id is empty"),
        (
            "job",
            &"x".repeat(300),
            "invalid Hello: node id is 300 bytes",
        ),
    ] {
        let s = rt
            .block_on(session(&server.endpoint, vec![hello(run, node)], 1))
            .expect_err("an invalid Hello must be refused");
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
        assert!(s.message().starts_with(says), "{}", s.message());
        assert!(!s.message().contains('\n'), "one line: {}", s.message());
    }
}

/// Opens a session sending `msgs` that stays open (its lease held) while the returned sender
/// lives, once the server's first answer came.
async fn held(
    endpoint: &str,
    msgs: Vec<pb::AgentMessage>,
) -> tokio::sync::mpsc::UnboundedSender<pb::AgentMessage> {
    let mut client = RendezvousClient::connect(format!("http://{endpoint}"))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for m in msgs {
        tx.send(m).unwrap();
    }
    let mut inbound = client
        .session(UnboundedReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    inbound
        .message()
        .await
        .unwrap()
        .expect("the session opened");
    tokio::spawn(async move { while let Ok(Some(_)) = inbound.message().await {} });
    tx
}

/// A well-formed join of `node` to `run` is still taken: no Error among the first `n` events.
fn still_serves(rt: &tokio::runtime::Runtime, endpoint: &str, run: &str, node: &str, n: usize) {
    let events = rt
        .block_on(session(endpoint, vec![hello(run, node), join(node)], n))
        .unwrap();
    assert!(error_of(&events).is_none(), "{events:?}");
}

/// The node ids waiting in `run`, once `status` answers with `want` of them (5 s at most).
fn waiting_nodes(endpoint: &str, run: &str, want: usize) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let st = status(endpoint, run);
        let ids: Vec<String> = st["waiting"]
            .as_array()
            .map(|w| {
                w.iter()
                    .filter_map(|j| j["node_id"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        if ids.len() == want || std::time::Instant::now() > deadline {
            return ids;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_join_in_another_nodes_name_ends_the_session_and_changes_nothing() {
    let server = RdzvServer::start(&["--store", "memory"]);
    let rt = rt();
    // n0 waits in the run (min 2 nodes: nothing forms).
    let _n0 = rt.block_on(held(&server.endpoint, vec![hello("job", "n0"), join("n0")]));
    assert_eq!(waiting_nodes(&server.endpoint, "job", 1), ["n0"]);

    let events = rt
        .block_on(session(
            &server.endpoint,
            vec![hello("job", "n1"), join("n2")],
            3,
        ))
        .expect("the Hello is valid");
    let err = error_of(&events).expect("an Error event names the refusal");
    assert!(
        err.contains("refused an invalid request: a join in the name of node 'n2'"),
        "{err}"
    );
    assert!(!err.contains('\n'), "one line: {err}");
    // Nothing was written: n0 still waits alone, nothing formed.
    assert_eq!(waiting_nodes(&server.endpoint, "job", 1), ["n0"]);
    assert_eq!(status(&server.endpoint, "job")["generation"], 0);

    // The server still takes a well-formed join: with n1 the round of 2 forms.
    still_serves(&rt, &server.endpoint, "job", "n1", 3);
}

#[test]
fn a_new_run_past_max_runs_is_refused_resource_exhausted() {
    let server = RdzvServer::start(&["--store", "memory", "--max-runs", "1"]);
    let rt = rt();
    rt.block_on(async {
        // Run A holds a session open while run B asks.
        let tx = held(&server.endpoint, vec![hello("run-a", "n1")]).await;
        let s = session(&server.endpoint, vec![hello("run-b", "n1")], 1)
            .await
            .expect_err("run B is past the limit");
        assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{s:?}");
        assert!(s.message().contains("--max-runs 1"), "{}", s.message());
        // Another session of run A is no new run.
        let ok = session(&server.endpoint, vec![hello("run-a", "n2")], 1).await;
        assert!(ok.is_ok(), "{ok:?}");
        drop(tx);
    });
}

#[test]
fn an_oversized_message_is_refused_and_the_server_keeps_serving() {
    let server = RdzvServer::start(&["--store", "memory"]);
    let rt = rt();
    let huge = pb::AgentMessage {
        kind: Some(pb::agent_message::Kind::Report(pb::NodeReport {
            kind: "pace".into(),
            json: "x".repeat(5 * 1024 * 1024),
        })),
    };
    let r = rt.block_on(session(&server.endpoint, vec![hello("job", "n1"), huge], 3));
    let events = r.expect("the Hello was taken");
    let err = error_of(&events).expect("an Error event names the refusal");
    assert!(
        err.starts_with("the rendezvous server refused a message") && err.contains("too large"),
        "{err}"
    );
    still_serves(&rt, &server.endpoint, "job", "n1", 2);
}

/// A `TMPDIR` other users may write to without the sticky bit would let them swap the worker
/// API socket's directory: the agent refuses it with one line and exit 2, before any worker.
#[test]
fn an_agent_refuses_a_tmpdir_others_can_write_without_the_sticky_bit() {
    use std::os::unix::fs::PermissionsExt;
    let base = tempfile::tempdir().unwrap();
    let open = base.path().join("open-tmp");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut c = crate::harness::drun();
    c.env("TMPDIR", &open)
        .args(["--standalone", "--nproc-per-node", "1"])
        .arg(crate::harness::worker("printer.py"))
        .arg("1");
    let (code, out, err) = crate::harness::run(c, Duration::from_secs(30));
    assert_eq!(code, 2, "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("refusing"))
        .unwrap_or_else(|| panic!("no refusal line: {err}"));
    assert!(
        line.contains("worker API socket") && line.contains("sticky") && line.contains("TMPDIR"),
        "{line}"
    );
    assert!(!out.contains("out rank=0"), "no worker ran: {out}");

    // The same directory with the sticky bit (as /tmp has) is fine.
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let mut c = crate::harness::drun();
    c.env("TMPDIR", &open)
        .args(["--standalone", "--nproc-per-node", "1"])
        .arg(crate::harness::worker("printer.py"))
        .arg("1");
    let (code, out, err) = crate::harness::run(c, Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("out rank=0"), "{out}");
}
