//! Replicas over real loopback sockets: taken from the ring predecessor and verified; refused
//! from anyone else, when corrupted, unsigned with a token, or beyond the budget.

use super::send::line;
use super::*;
use crate::ckpt::digest::{Digest, DigestKind, Hasher, NEW};
use crate::ckpt::memory::wire::NONCE_BYTES;
use drun_rendezvous::{assign, Candidate};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(20);

fn listener() -> (std::net::TcpListener, u16) {
    let (_udp, tcp) = bind_pair(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)).unwrap();
    let port = tcp.local_addr().unwrap().port();
    (tcp, port)
}

/// Nodes a, b, c (node ranks 0, 1, 2) on loopback with these replica ports.
fn plan(ports: [u16; 3]) -> Plan {
    let c: Vec<Candidate> = ["a", "b", "c"]
        .iter()
        .zip(ports)
        .enumerate()
        .map(|(i, (id, port))| Candidate {
            node_id: (*id).into(),
            advertise_addr: "127.0.0.1".into(),
            slots: 1,
            requested_node_rank: Some(i as u32),
            master_port: 1,
            probe_port: port,
        })
        .collect();
    assign("run", 3, &c, 0, 0).unwrap()
}

struct Node {
    r: Replicas,
    rx: mpsc::UnboundedReceiver<Note>,
    stage: tempfile::TempDir,
}

fn node(
    me: &str,
    tcp: std::net::TcpListener,
    ckpt: &Path,
    budget: u64,
    token: Option<&str>,
) -> Node {
    let stage = tempfile::tempdir().unwrap();
    let (r, rx) = Replicas::start(
        tcp,
        "run",
        me,
        token.map(String::from),
        ckpt,
        stage.path(),
        budget,
    )
    .unwrap();
    Node { r, rx, stage }
}

async fn note(rx: &mut mpsc::UnboundedReceiver<Note>) -> Note {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn a_staged_step_reaches_the_ring_neighbour_verified() {
    let ckpt = tempfile::tempdir().unwrap();
    let ((ta, pa), (tb, pb)) = (listener(), listener());
    let p = plan([pa, pb, 1]);
    let mut a = node("a", ta, ckpt.path(), 8 << 20, Some("tok"));
    let mut b = node("b", tb, ckpt.path(), 8 << 20, Some("tok"));
    a.r.follow(&p);
    b.r.follow(&p);
    let key = (2, p.generation);
    let rel = format!("run/step-2-g{}/rank0.pt", p.generation);
    let staged = a.stage.path().join(&rel);
    std::fs::create_dir_all(staged.parent().unwrap()).unwrap();
    let body = vec![7u8; 3 << 20];
    std::fs::write(&staged, &body).unwrap();
    let target = ckpt.path().join(&rel).display().to_string();
    assert!(a.r.send(
        key,
        vec![(target.clone(), staged, body.len() as u64, String::new(), 0)]
    ));
    assert_eq!(a.r.sent_state(key), Some(None), "in flight");
    match note(&mut a.rx).await {
        Note::Sent { key: k, to, result } => {
            assert_eq!((k, to.as_str()), (key, "b"));
            let (_, digests) = result.unwrap();
            let ours = digest(&body, NEW).to_string();
            assert_eq!(digests, [(target, ours)], "the digest of the bytes sent");
        }
        n => panic!("{n:?}"),
    }
    a.r.sent(key, true);
    assert_eq!(a.r.sent_state(key), Some(Some(true)));
    assert!(matches!(note(&mut b.rx).await, Note::Received { from, .. } if from == "a"));
    let held = b.stage.path().join(".replicas").join(&rel);
    let got = std::fs::read(&held).unwrap();
    assert!(
        got == body,
        "identical bytes: {} of {} bytes",
        got.len(),
        body.len()
    );
    let (list, bytes) = b.r.held();
    assert_eq!(bytes, body.len() as u64);
    assert_eq!(list[0]["from"], "a");
    // b's neighbour is c (port 1: nobody): a send fails with a reason, nothing else.
    let staged_b = b.stage.path().join("x.pt");
    std::fs::write(&staged_b, b"abc").unwrap();
    let target = ckpt.path().join("run/x.pt").display().to_string();
    assert!(b.r.send(key, vec![(target, staged_b, 3, String::new(), 0)]));
    loop {
        if let Note::Sent { result, .. } = note(&mut b.rx).await {
            let err = result.unwrap_err();
            assert!(matches!(err, ReplicaError::Connect { .. }), "{err}");
            assert!(err.to_string().starts_with("cannot connect to "), "{err}");
            break;
        }
    }
    // An own save that needs the room releases the replica.
    b.r.free(1);
    assert_eq!(b.r.held().1, 0);
    assert!(!held.exists(), "its file is gone");
}

/// Offers `offer` by hand to `port` (signed with `token`), streaming `body` with `digest` when
/// taken; the answer lines.
async fn offer_by_hand(
    port: u16,
    mut offer: Offer,
    token: Option<&str>,
    body: &[u8],
    digest: [u8; 32],
) -> Vec<String> {
    let conn = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut conn = BufReader::new(conn);
    let mut nonce = [0u8; NONCE_BYTES];
    conn.read_exact(&mut nonce).await.unwrap();
    offer.sign(token, &nonce);
    conn.get_mut().write_all(&offer.encode()).await.unwrap();
    let first = line(&mut conn).await.unwrap();
    if first != "take" {
        return vec![first];
    }
    conn.get_mut().write_all(body).await.unwrap();
    conn.get_mut().write_all(&digest).await.unwrap();
    vec![first, line(&mut conn).await.unwrap()]
}

#[tokio::test]
async fn offers_from_outside_the_ring_corrupted_unsigned_or_too_big_are_refused() {
    let ckpt = tempfile::tempdir().unwrap();
    let (tb, pb) = listener();
    let p = plan([1, pb, 2]);
    let mut b = node("b", tb, ckpt.path(), 100, Some("tok"));
    b.r.follow(&p);
    let offer = |from: &str, bytes: u64| Offer {
        run_id: "run".into(),
        generation: p.generation,
        step: 4,
        from: from.into(),
        files: vec![OfferFile {
            path: ckpt
                .path()
                .join("run/step-4/rank0.pt")
                .display()
                .to_string(),
            bytes,
            digest: String::new(),
            rank: Some(0),
        }],
        mac: String::new(),
    };
    let good = digest(b"abc", NEW).bytes;
    let a = offer_by_hand(pb, offer("c", 3), Some("tok"), b"abc", good).await;
    assert!(
        a[0].starts_with("refused: 'c' is not the node whose replicas this node holds"),
        "{a:?}"
    );
    let a = offer_by_hand(pb, offer("a", 3), None, b"abc", good).await;
    assert!(a[0].contains("MAC does not match"), "unsigned: {a:?}");
    let a = offer_by_hand(pb, offer("a", 3), Some("other"), b"abc", good).await;
    assert!(a[0].contains("MAC does not match"), "another token: {a:?}");
    let a = offer_by_hand(pb, offer("a", 101), Some("tok"), b"abc", good).await;
    assert!(
        a[0].starts_with("refused: a replica of step 4 (101 B) does not fit the budget of 100 B"),
        "{a:?}"
    );
    let a = offer_by_hand(pb, offer("a", 3), Some("tok"), b"abd", good).await;
    assert_eq!(a[0], "take");
    assert!(
        a[1].starts_with("bad: ") && a[1].contains("do not match the sender's digest"),
        "{a:?}"
    );
    assert_eq!(b.r.held().1, 0, "nothing of it is held");
    assert!(
        !b.stage.path().join(".replicas/run").exists(),
        "its file is gone"
    );
    let a = offer_by_hand(pb, offer("a", 3), Some("tok"), b"abc", good).await;
    assert_eq!(a, ["take", "ok"]);
    assert!(matches!(note(&mut b.rx).await, Note::Received { .. }));
    assert_eq!(b.r.held().1, 3);
}

/// The receiver's budget counts the staging table's spares (or the room kept for them), and a
/// replica released for this node's own save while its bytes arrive is refused as they land,
/// leaving no file behind.
#[tokio::test]
async fn a_replica_fits_beside_the_spares_and_one_released_as_it_arrives_leaves_nothing() {
    let ckpt = tempfile::tempdir().unwrap();
    let (tb, pb) = listener();
    let p = plan([1, pb, 2]);
    let mut b = node("b", tb, ckpt.path(), 100, Some("tok"));
    b.r.follow(&p);
    let offer = |step: u64| {
        let mut o = Offer {
            run_id: "run".into(),
            generation: p.generation,
            step,
            from: "a".into(),
            files: vec![OfferFile {
                path: ckpt
                    .path()
                    .join(format!("run/step-{step}/rank0.pt"))
                    .display()
                    .to_string(),
                bytes: 3,
                digest: String::new(),
                rank: Some(0),
            }],
            mac: String::new(),
        };
        o.mac.clear();
        o
    };
    let good = digest(b"abc", NEW).bytes;
    b.r.own(Vec::new(), 98);
    let a = offer_by_hand(pb, offer(4), Some("tok"), b"abc", good).await;
    assert!(
        a[0].starts_with("refused: a replica of step 4 (3 B) does not fit the budget of 100 B"),
        "98 B of spares: {a:?}"
    );
    b.r.own(Vec::new(), 97);
    // Taken; this node's own save releases it before its bytes are sent.
    let conn = TcpStream::connect(("127.0.0.1", pb)).await.unwrap();
    let mut conn = BufReader::new(conn);
    let mut nonce = [0u8; NONCE_BYTES];
    conn.read_exact(&mut nonce).await.unwrap();
    let mut o = offer(6);
    o.sign(Some("tok"), &nonce);
    conn.get_mut().write_all(&o.encode()).await.unwrap();
    assert_eq!(line(&mut conn).await.unwrap(), "take");
    assert_eq!(b.r.held().1, 3, "its room is reserved");
    b.r.free(1);
    assert_eq!(b.r.held().1, 0);
    conn.get_mut().write_all(b"abc").await.unwrap();
    conn.get_mut().write_all(&good).await.unwrap();
    let answer = line(&mut conn).await.unwrap();
    assert!(
        answer.starts_with("refused: the replica of step 6 was released as it arrived"),
        "{answer}"
    );
    assert_eq!(b.r.held().1, 0, "nothing of it is held");
    assert!(
        !b.stage
            .path()
            .join(".replicas/run/step-6/rank0.pt")
            .exists(),
        "its file is gone"
    );
    assert!(b.rx.try_recv().is_err(), "no note of a replica received");
}

/// A resume from memory over loopback: c holds nothing and fetches each rank from the node
/// the plan names; b links in the replica it holds; a digest that is not the plan's is refused
/// and leaves nothing behind.
#[tokio::test]
async fn a_resume_from_memory_gathers_every_file_by_fetch_or_replica_verified() {
    let ckpt = tempfile::tempdir().unwrap();
    let ((ta, pa), (tb, pb), (tc, pc)) = (listener(), listener(), listener());
    let p = plan([pa, pb, pc]);
    let a = node("a", ta, ckpt.path(), 8 << 20, Some("tok"));
    let b = node("b", tb, ckpt.path(), 8 << 20, Some("tok"));
    let c = node("c", tc, ckpt.path(), 8 << 20, Some("tok"));
    let mut nodes = [a, b, c];
    for n in nodes.iter_mut() {
        n.r.follow(&p);
    }
    let [a, b, c] = nodes;
    let rel = |r: u32| format!("run/step-6-g1/rank{r}.pt");
    let body = |r: u32| format!("rank {r} step 6 ").repeat(5000).into_bytes();
    let put = |root: &Path, r: u32| {
        let f = root.join(rel(r));
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, body(r)).unwrap();
    };
    // a staged rank 0; b staged rank 1 and holds a's replica of rank 0.
    put(a.stage.path(), 0);
    put(b.stage.path(), 1);
    put(&b.stage.path().join(".replicas"), 0);
    let m = drun_rendezvous::Manifest {
        run_id: "run".into(),
        step: 6,
        generation: 1,
        world_size: 2,
        cursor: Default::default(),
        files: (0..2)
            .map(|r| drun_rendezvous::ShardFile {
                rank: r,
                path: ckpt.path().join(rel(r)).display().to_string(),
                bytes: body(r).len() as u64,
                digest: digest(&body(r), DigestKind::Sha256).to_string(),
            })
            .collect(),
        sealed_at_ms: 0,
        adopted_from: None,
        save_ms: None,
        stall_ms: None,
    };
    let sources = drun_rendezvous::MemoryResume {
        sources: [(0, "a".to_string()), (1, "b".to_string())].into(),
    };
    let local = |n: &Node, me: &str| fetch::Local {
        run_id: "run".into(),
        me: me.into(),
        token: Some("tok".into()),
        stage: n.stage.path().to_path_buf(),
        ckpt_dir: ckpt.path().to_path_buf(),
    };
    let file = fetch::gather(&local(&c, "c"), &p, &m, &sources)
        .await
        .unwrap();
    for r in 0..2 {
        assert_eq!(
            std::fs::read(c.stage.path().join(rel(r))).unwrap(),
            body(r),
            "c fetched rank {r} byte for byte"
        );
    }
    assert_eq!(
        file,
        c.stage.path().join("run/step-6-g1/drun-manifest-6-1.json")
    );
    // b holds both already (its own, a's replica linked in): nothing crosses the wire.
    fetch::gather(&local(&b, "b"), &p, &m, &sources)
        .await
        .unwrap();
    assert_eq!(std::fs::read(b.stage.path().join(rel(0))).unwrap(), body(0));
    // A plan whose digest of rank 1 is not the bytes b serves: refused, nothing left on a.
    let mut wrong = m.clone();
    wrong.files[1].digest = "0".repeat(64);
    let err = fetch::gather(&local(&a, "a"), &p, &wrong, &sources)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ReplicaError::Fetching { node, source }
            if node == "b" && matches!(**source, ReplicaError::NotRanks { .. })),
        "{err}"
    );
    let line = err.to_string();
    assert!(
        line.starts_with("fetching from b: ") && line.contains(": digest "),
        "{line}"
    );
    assert!(
        !a.stage.path().join(rel(1)).exists(),
        "nothing half-fetched stays"
    );
    // Without the run's token the source refuses.
    let mut stranger = local(&a, "a");
    stranger.token = None;
    let err = fetch::gather(&stranger, &p, &m, &sources)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ReplicaError::Fetching { source, .. }
            if matches!(&**source, ReplicaError::Answered { answer }
                if answer == "refused: the fetch's MAC does not match this run's token")),
        "{err}"
    );
}

#[tokio::test]
async fn a_replica_goes_out_no_faster_than_its_rate_its_bytes_and_digest_intact() {
    let dir = tempfile::tempdir().unwrap();
    let staged = dir.path().join("rank0.pt");
    const BYTES: usize = 3 << 20;
    std::fs::write(&staged, vec![5u8; BYTES]).unwrap();
    let files = [crate::ckpt::memory::wire::OfferFile {
        path: "step-1/rank0.pt".into(),
        bytes: BYTES as u64,
        digest: String::new(),
        rank: Some(0),
    }];
    // With a limit and without one (a resume's fetch): the same bytes and digest.
    for rate in [4u64 << 20, 0] {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let reader = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut v = Vec::new();
            s.read_to_end(&mut v).await.unwrap();
            v
        });
        let mut conn = TcpStream::connect(addr).await.unwrap();
        let began = std::time::Instant::now();
        let digests = super::send::stream_files(
            &mut conn,
            &files,
            std::slice::from_ref(&staged),
            "peer",
            rate,
        )
        .await
        .unwrap();
        let took = began.elapsed();
        drop(conn);
        let got = reader.await.unwrap();
        assert_eq!(got.len(), BYTES + 32, "the file and its digest");
        let want = digest(&got[..BYTES], NEW);
        assert_eq!(got[BYTES..], want.bytes, "the digest follows the file");
        let want = want.to_string();
        assert_eq!(digests, vec![want]);
        // 3 MiB at 4 MiB/s: the last MiB leaves no sooner than 0.75 s in (the first goes at once).
        if rate > 0 {
            assert!(took >= Duration::from_millis(700), "rate {rate}: {took:?}");
        }
    }
}

/// The digest of `bytes` taken with `kind`.
fn digest(bytes: &[u8], kind: DigestKind) -> Digest {
    let mut h = Hasher::new(kind);
    h.update(bytes);
    h.finish()
}
