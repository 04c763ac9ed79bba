//! The checkpoint ledger on both stores: the in-memory store and a real etcd started by the test.

use std::sync::Arc;
use std::time::Duration;

use drun_rendezvous::store::keys::RunKeys;
use drun_rendezvous::{
    assign, Candidate, CommitOutcome, Cursor, EtcdStore, Ledger, LedgerError, Manifest,
    MemoryStore, NodeCommit, Plan, Retention, ShardFile, Store,
};

use crate::harness::cluster::Etcd;

const RUN: &str = "ledger-test";

/// Runs `scenario` on the in-memory store and on a fresh etcd.
fn on_both_stores<F, Fut>(scenario: F)
where
    F: Fn(Arc<dyn Store>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(scenario(Arc::new(MemoryStore::new())));
    let etcd = Etcd::start();
    rt.block_on(async {
        let store = EtcdStore::connect(std::slice::from_ref(&etcd.endpoint))
            .await
            .expect("etcd reachable");
        scenario(Arc::new(store)).await;
    });
}

fn node(id: &str) -> Candidate {
    Candidate {
        node_id: id.into(),
        advertise_addr: "127.0.0.1".into(),
        slots: 2,
        requested_node_rank: None,
        master_port: 1,
        probe_port: 0,
    }
}

/// Generation `g` of nodes `a` and `b` (2 ranks each) as formation leaves it: `gen/current`, and
/// each node's membership key under its own lease. Returns the plan and the leases.
async fn form(store: &Arc<dyn Store>, g: u64, resume: Option<Manifest>) -> (Plan, Vec<i64>) {
    let keys = RunKeys::new(RUN);
    let mut plan = assign(RUN, g, &[node("a"), node("b")], 0, 0).unwrap();
    plan.resume = resume;
    store
        .put(&keys.gen_current(), g.to_string().into_bytes(), None)
        .await
        .unwrap();
    let mut leases = Vec::new();
    for n in ["a", "b"] {
        let l = store.lease_grant(Duration::from_secs(30)).await.unwrap();
        store
            .put(&keys.member(g, n), b"{}".to_vec(), Some(l))
            .await
            .unwrap();
        leases.push(l);
    }
    (plan, leases)
}

fn cursor(samples: u64) -> Cursor {
    Cursor {
        epoch: 0,
        consumed_in_epoch: samples,
        consumed_total: samples,
        seed: 7,
        dataset_len: 1024,
        global_batch: 8,
    }
}

fn commit(plan: &Plan, node: &str, step: u64, samples: u64) -> NodeCommit {
    let m = plan.member(node).unwrap();
    let ranks: Vec<u32> = (m.base_rank..m.base_rank + m.slots).collect();
    NodeCommit {
        node_id: node.into(),
        generation: plan.generation,
        step,
        files: ranks
            .iter()
            .map(|r| ShardFile {
                rank: *r,
                path: format!("/ckpt/step-{step}-g{}/rank{r}.pt", plan.generation),
                bytes: 100,
                digest: "0".repeat(64),
            })
            .collect(),
        ranks,
        cursor: cursor(samples),
        save_started_ms: None,
        staged_ms: None,
    }
}

/// Steps of every sealed manifest, oldest first.
async fn sealed_steps(ledger: &Ledger) -> Vec<u64> {
    let manifests = ledger.manifests().await.unwrap();
    manifests.iter().map(|m| m.step).collect()
}

const KEEP_ALL: Retention = Retention {
    keep_last: 0,
    keep_every: 0,
};

async fn seal(ledger: &Ledger, plan: &Plan, step: u64) -> Manifest {
    let first = ledger
        .commit(plan, &commit(plan, "a", step, step * 8), KEEP_ALL)
        .await
        .unwrap();
    assert_eq!(
        first,
        CommitOutcome::Recorded {
            waiting_for: vec!["b".into()]
        },
        "one node's record does not seal"
    );
    match ledger
        .commit(plan, &commit(plan, "b", step, step * 8), KEEP_ALL)
        .await
        .unwrap()
    {
        CommitOutcome::Sealed { manifest, .. } => manifest,
        other => panic!("the last node's record seals, got {other:?}"),
    }
}

#[test]
fn seals_complete_aligned_steps_and_refuses_misaligned_and_stale_ones() {
    on_both_stores(|store| async move {
        let ledger = Ledger::new(store.clone(), RUN);
        let (plan, leases) = form(&store, 1, None).await;
        let m4 = seal(&ledger, &plan, 4).await;
        assert_eq!((m4.step, m4.generation, m4.world_size), (4, 1, 4));
        assert_eq!(
            m4.files.iter().map(|f| f.rank).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        assert_eq!(m4.cursor.consumed_in_epoch, 32);
        seal(&ledger, &plan, 8).await;

        // Node b's ranks report a different cursor: not sealed, both groups of ranks named.
        ledger
            .commit(&plan, &commit(&plan, "a", 12, 96), KEEP_ALL)
            .await
            .unwrap();
        let e = ledger
            .commit(&plan, &commit(&plan, "b", 12, 97), KEEP_ALL)
            .await
            .unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(e, LedgerError::Misaligned { step: 12, .. }),
            "{text}"
        );
        assert!(text.contains("ranks 0-1 report cursor"), "{text}");
        assert!(text.contains("ranks 2-3 report cursor"), "{text}");
        let steps = sealed_steps(&ledger).await;
        assert_eq!(steps, [4, 8], "step 12 was not sealed");

        // A step not after the resume point is refused.
        let (plan2, _) = form(&store, 2, Some(m4.clone())).await;
        let e = ledger
            .commit(&plan2, &commit(&plan2, "a", 4, 32), KEEP_ALL)
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                LedgerError::NotAfterResume {
                    step: 4,
                    resumed: 4
                }
            ),
            "{e}"
        );

        // Generation 1 is over: its nodes cannot commit any more.
        let e = ledger
            .commit(&plan, &commit(&plan, "a", 16, 128), KEEP_ALL)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("generation 1 is over"), "{e}");

        // Node b's lease ends (a stale agent): its record is refused.
        let (plan3, leases3) = form(&store, 3, None).await;
        store.lease_revoke(leases3[1]).await.unwrap();
        let e = ledger
            .commit(&plan3, &commit(&plan3, "b", 20, 160), KEEP_ALL)
            .await
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("node b is no longer a member of generation 3"),
            "{e}"
        );
        let _ = leases;
    });
}

#[test]
fn resume_point_is_the_newest_good_manifest_and_retention_collects() {
    on_both_stores(|store| async move {
        let ledger = Ledger::new(store.clone(), RUN);
        let (plan, _) = form(&store, 1, None).await;
        assert_eq!(ledger.resume_point(&[]).await.unwrap().manifest, None);
        for step in [2, 4, 6] {
            seal(&ledger, &plan, step).await;
        }
        let rp = ledger.resume_point(&[]).await.unwrap();
        assert_eq!(rp.manifest.as_ref().map(|m| m.step), Some(6));
        assert!(rp.latest_revision > 0 && !rp.import);
        ledger
            .mark_bad(&rp.manifest.unwrap().id(), "rank1.pt digest differs")
            .await
            .unwrap();
        let rp = ledger.resume_point(&[]).await.unwrap();
        assert_eq!(
            rp.manifest.map(|m| m.step),
            Some(4),
            "falls back past the bad one"
        );

        // A node's manifest file newer than anything stored (a fresh store) is imported.
        let mut hint = seal(&ledger, &plan, 8).await;
        hint.step = 100;
        let rp = ledger.resume_point(&[&hint]).await.unwrap();
        assert!(rp.import);
        assert_eq!(rp.manifest.map(|m| m.step), Some(100));
        let mut foreign = hint.clone();
        foreign.run_id = "another-run".into();
        foreign.step = 200;
        let rp = ledger.resume_point(&[&foreign]).await.unwrap();
        assert_eq!(
            rp.manifest.map(|m| m.step),
            Some(8),
            "other runs' files are ignored"
        );

        // Retention: keep the newest 2 plus milestones every 4 steps.
        let keep = Retention {
            keep_last: 2,
            keep_every: 4,
        };
        ledger
            .commit(&plan, &commit(&plan, "a", 10, 80), keep)
            .await
            .unwrap();
        let CommitOutcome::Sealed {
            dropped, garbage, ..
        } = ledger
            .commit(&plan, &commit(&plan, "b", 10, 80), keep)
            .await
            .unwrap()
        else {
            panic!("sealed")
        };
        assert_eq!(
            dropped.iter().map(|m| m.step).collect::<Vec<_>>(),
            [6, 2],
            "steps 10 and 8 are the newest, 4 and 8 milestones"
        );
        assert_eq!(garbage.len(), 8, "the files of steps 2 and 6: {garbage:?}");
        assert!(garbage
            .iter()
            .all(|p| p.contains("step-2-") || p.contains("step-6-")));
        let steps = sealed_steps(&ledger).await;
        assert_eq!(steps, [4, 8, 10]);
    });
}

#[test]
fn a_seal_records_the_save_cost_from_the_first_rank_s_start() {
    on_both_stores(|store| async move {
        let ledger = Ledger::new(store.clone(), RUN);
        let (plan, _leases) = form(&store, 1, None).await;
        assert_eq!(
            seal(&ledger, &plan, 4).await.save_ms,
            None,
            "no start reported"
        );
        let now = drun_rendezvous::clock::now_ms();
        let mut a = commit(&plan, "a", 8, 64);
        a.save_started_ms = Some(now - 900);
        let mut b = commit(&plan, "b", 8, 64);
        b.save_started_ms = Some(now - 400);
        ledger.commit(&plan, &a, KEEP_ALL).await.unwrap();
        let CommitOutcome::Sealed { manifest, .. } =
            ledger.commit(&plan, &b, KEEP_ALL).await.unwrap()
        else {
            panic!("b's record seals step 8");
        };
        let cost = manifest.save_ms.expect("measured");
        let since = drun_rendezvous::clock::now_ms() - now;
        assert!(
            (900..=900 + since).contains(&cost),
            "first rank's start → seal: {cost} ms"
        );
        let stored = ledger.manifests().await.unwrap();
        assert_eq!(
            stored.last().unwrap().save_ms,
            Some(cost),
            "kept in the ledger"
        );
    });
}
