//! An agent's exit: its last requests reach the rendezvous before its process exits, and a
//! c10d host serves the other agents until they have gone.

use std::time::Duration;

use drun_rendezvous::decisions::ckpt_interval::IntervalConfig;
use drun_rendezvous::store::reports::ReportKind;
use drun_rendezvous::store::run_state::RunState;
use drun_rendezvous::{Candidate, RoundConfig};

use super::*;

fn one_node(run: &str) -> SessionConfig {
    nodes(run, "n0", 1)
}

fn nodes(run: &str, node: &str, n: usize) -> SessionConfig {
    SessionConfig {
        run_id: run.into(),
        node_id: node.into(),
        round: RoundConfig {
            min_nodes: n,
            max_nodes: n,
            last_call: Duration::ZERO,
            join_timeout: Duration::from_secs(30),
            settle: Duration::ZERO,
        },
        lease_ttl: Duration::from_secs(10),
        keep_alive_interval: Duration::from_secs(1),
        max_restarts: 0,
        auto_keep_alive: true,
        scale_up_save: None,
        ckpt_interval: IntervalConfig::default(),
    }
}

/// The next event within 10 s (`None`: the link's events closed).
async fn next(link: &mut Link) -> Option<Event> {
    tokio::time::timeout(Duration::from_secs(10), link.rx.recv())
        .await
        .expect("an event, or the events closing, within 10 s")
}

/// A report sent after the run ended (a hang's flight recorder dumps race the end that another
/// node's failure brings: seen in CI, the report lost) is on the server once the leave returns.
#[tokio::test]
async fn a_report_sent_after_the_runs_end_is_carried_out_before_the_leave_returns() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let service = RendezvousService::new(store.clone());
    tokio::spawn(drun_rendezvous::server::service::serve(
        listener,
        service.clone(),
        std::future::pending(),
    ));
    let (tx, rx, task) = grpc::connect(
        vec![addr.to_string()],
        one_node("late"),
        grpc::Creds::default(),
        None,
    );
    let mut link = Link {
        task: Some(task),
        ..Link::new((tx, rx), None)
    };
    let candidate = Candidate {
        node_id: "n0".into(),
        advertise_addr: "127.0.0.1".into(),
        slots: 1,
        requested_node_rank: None,
        master_port: 1,
        probe_port: 0,
    };
    link.tx.send(Request::Join(candidate.into(), 0)).unwrap();
    while !matches!(next(&mut link).await, Some(Event::Formed(_))) {}

    let end = drun_rendezvous::RunEnd {
        success: false,
        reason: "another node's workers failed".into(),
        at_ms: drun_rendezvous::clock::now_ms(),
        root_cause: None,
        retryable: false,
        unfit: false,
    };
    assert!(service.end_run("late", &end).await.unwrap());
    loop {
        match next(&mut link).await {
            Some(Event::Finished(e)) => assert_eq!(e.reason, end.reason),
            Some(_) => {}
            // The agent hears the link close after the end, as it always has.
            None => break,
        }
    }
    // The agent is still stopping its workers: what it sends now must not be lost.
    link.tx
        .send(Request::Report {
            kind: ReportKind::Flight,
            json: r#"{"generation":1,"dumps":{"0":"late"}}"#.into(),
        })
        .unwrap();
    assert!(link.leave().await, "the leave was confirmed within 2 s");

    let reports = RunState::new(store, "late").reports().await.unwrap();
    assert_eq!(
        reports.get("flight").and_then(|by_node| by_node.get("n0")),
        Some(&serde_json::json!({"generation": 1, "dumps": {"0": "late"}})),
        "{reports:?}"
    );
    assert_eq!(
        service.active_sessions(),
        0,
        "the session ended with the leave"
    );
}

/// A c10d host that has left its own session keeps serving while another agent's session is
/// open (it may not have heard the run's end yet), and stops once that agent has left.
#[tokio::test]
async fn a_host_that_left_serves_until_the_other_agents_have_left() {
    let h = host("127.0.0.1:0".parse().unwrap(), false, None, None)
        .await
        .unwrap();
    let addr = h.addr;
    let (tx, rx, task) = grpc::connect(
        vec![addr.to_string()],
        nodes("hosted", "n1", 2),
        grpc::Creds::default(),
        None,
    );
    let mut other = Link {
        task: Some(task),
        ..Link::new((tx, rx), None)
    };
    assert!(matches!(next(&mut other).await, Some(Event::Opened { .. })));
    let service = h.service.clone();
    let stopping = tokio::spawn(h.shutdown(0, false));
    // Still taking connections for as long as the other agent stays (a host that stops
    // serving closes its listener at once).
    let until = tokio::time::Instant::now() + Duration::from_millis(500);
    while tokio::time::Instant::now() < until {
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_ok(),
            "the host stopped serving while another agent's session was open"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(service.active_sessions(), 1);
    assert!(other.leave().await);
    tokio::time::timeout(Duration::from_secs(5), stopping)
        .await
        .expect("the host stops once the other agent has left")
        .unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "a host that stopped takes no more connections"
    );
}
