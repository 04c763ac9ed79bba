//! Scale-up: a checkpoint before a newcomer is admitted, its timeout, a newcomer that leaves, and a
//! preemption request across a re-form.

use super::*;

// --- Scale-up: a checkpoint before admitting a newcomer -----------------------

/// The torch example alone on one node (`--nnodes 1:2`, no periodic checkpoint); a second node
/// arrives mid-epoch. With `--on-scale-up checkpoint` every rank saves the same step first, the
/// group re-forms once it is sealed, and the 4 workers resume from it: no sample skipped or
/// repeated, and only the steps run between the seal and the re-form are repeated.
fn scale_up_waits_for_a_checkpoint(store: Store) {
    let Some(python) = crate::harness::torch_python() else {
        return;
    };
    let d = dirs();
    let r = rdzv(store, "scale-up-ckpt", "1:2");
    let policy = ["--on-scale-up", "checkpoint"];
    let no_periodic = ["--ckpt-every", "100000"];
    let a = example_agent_with(&python, 0, &r, &d, "scaled", &policy, &no_periodic);
    let alone = d.out.join("idx.rank0.gen1");
    wait_for(
        "the first node to train alone to step 15",
        Duration::from_secs(120),
        || std::fs::read_to_string(&alone).is_ok_and(|t| t.lines().count() >= 15),
    );
    // The newcomer starts cold so that it arrives mid-run: a warm one joins once its
    // interpreters imported torch, and on a loaded machine the first node could finish meanwhile.
    let cold = ["--on-scale-up", "checkpoint", "--warm-workers", "off"];
    let b = example_agent_with(&python, 1, &r, &d, "scaled", &cold, &no_periodic);
    let (ca, oa, ea) = a.wait(Duration::from_secs(240));
    let (cb, _, eb) = b.wait(Duration::from_secs(60));
    assert_eq!((ca, cb), (0, 0), "A:\n{ea}\nB:\n{eb}");
    let sealed: u64 = ea
        .lines()
        .find_map(|l| l.split("admitted after step ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("the re-form waited for a checkpoint:\n{ea}"));
    assert!(
        sealed >= 15,
        "saved after the newcomer came (step {sealed})"
    );
    assert!(
        oa.contains(&format!("resumed at step={sealed} ")) && oa.contains("now 4)"),
        "the 4 workers resume from the scale-up checkpoint:\n{oa}"
    );
    let prefix = d.out.join("idx");
    let mut args = vec!["indices", prefix.to_str().unwrap()];
    args.extend(crate::harness::EXAMPLE_DATA_ARGS);
    let summary = check(&python, &args);
    let alone_steps = std::fs::read_to_string(&alone).unwrap().lines().count() as u64;
    let replayed = summary["steps_run_again"].as_u64().unwrap();
    assert_eq!(
        replayed,
        alone_steps - sealed,
        "only the steps after the seal are repeated: {summary}"
    );
    eprintln!("scale-up checkpoint at step {sealed}, {replayed} step(s) repeated: {summary}");
}

#[test]
fn torch_scale_up_waits_for_a_checkpoint_memory() {
    scale_up_waits_for_a_checkpoint(Store::Memory);
}

/// Workers that never ask `should_save`: the newcomer is admitted after
/// `--scale-up-save-timeout` anyway, and the log says there was no checkpoint.
fn scale_up_save_times_out(store: Store) {
    let d = dirs();
    let r = rdzv(store, "scale-up-timeout", "1:2");
    let extra = [
        "--on-scale-up",
        "checkpoint",
        "--scale-up-save-timeout",
        "1",
    ];
    // Generation 1 must outlast the newcomer's join plus the 1 s timeout (8 s of steps).
    let env = [("CKPT_EVERY", "1000"), ("CKPT_STEPS", "160")];
    let a = agent(0, &r, &d, 2, &extra, &env);
    wait_for("the first node's workers", Duration::from_secs(30), || {
        count(&events(&d), "start", |e| e["gen"] == 1) == 2
    });
    let b = agent(1, &r, &d, 2, &extra, &env);
    let (ca, _, ea) = a.wait(Duration::from_secs(60));
    let (cb, _, eb) = b.wait(Duration::from_secs(60));
    assert_eq!((ca, cb), (0, 0), "A:\n{ea}\nB:\n{eb}");
    assert!(
        ea.contains("no checkpoint was sealed within 1 s, re-forming without one"),
        "{ea}"
    );
    let evs = events(&d);
    assert_eq!(
        count(&evs, "start", |e| e["gen"] == 2 && e["world"] == 4),
        4,
        "{evs:?}"
    );
    assert_eq!(count(&evs, "done", |_| true), 4);
}

#[test]
fn scale_up_save_times_out_memory() {
    scale_up_save_times_out(Store::Memory);
}

#[test]
fn scale_up_save_times_out_etcd() {
    scale_up_save_times_out(Store::Etcd);
}

/// The newcomer stops waiting (SIGTERM: it leaves, its lease is revoked) while the scale-up
/// checkpoint is pending: the scale-up is called off, the running group is not re-formed, not
/// even when the timeout passes.
#[test]
fn a_scale_up_is_called_off_when_the_newcomer_leaves() {
    let d = dirs();
    let r = rdzv(Store::Etcd, "scale-up-off", "1:2");
    let extra = [
        "--on-scale-up",
        "checkpoint",
        "--scale-up-save-timeout",
        "5",
    ];
    let env = [
        ("CKPT_EVERY", "1000"),
        ("CKPT_STEPS", "240"),
        ("CKPT_SLEEP", "0.05"),
    ];
    let a = agent(0, &r, &d, 2, &extra, &env);
    wait_for("the first node's workers", Duration::from_secs(30), || {
        count(&events(&d), "start", |e| e["gen"] == 1) == 2
    });
    let b = agent(1, &r, &d, 2, &extra, &env);
    wait_for(
        "the scale-up checkpoint request",
        Duration::from_secs(30),
        || {
            a.stderr_so_far()
                .contains("is waiting to join (scale-up)); workers see should_save")
        },
    );
    b.signal(Signal::SIGTERM);
    let (cb, _, eb) = b.wait(Duration::from_secs(30));
    assert_eq!(cb, 143, "{eb}");
    let (ca, _, ea) = a.wait(Duration::from_secs(60));
    assert_eq!(ca, 0, "{ea}");
    assert!(
        ea.contains("the scale-up is called off, no re-form"),
        "{ea}"
    );
    assert!(!ea.contains("re-forming the group"), "{ea}");
    let evs = events(&d);
    assert_eq!(
        count(&evs, "start", |_| true),
        2,
        "only generation 1 ran: {evs:?}"
    );
    assert_eq!(count(&evs, "done", |e| e["gen"] == 1), 2);
}

/// A preemption warning whose checkpoint is not sealed yet survives a re-form (a node joined):
/// the new generation is asked again, saves, and every agent exits 5.
#[test]
fn a_preemption_request_survives_a_reform() {
    let d = dirs();
    let r = rdzv(Store::Memory, "preempt-reform", "1:2");
    let extra = ["--on-preempt", "checkpoint"];
    // Generation 1 ignores the request (so it is still pending when B arrives); later ones save.
    let env = [
        ("CKPT_EVERY", "1000"),
        ("CKPT_STEPS", "400"),
        ("CKPT_SAVE_ON_REQUEST_FROM_GEN", "2"),
    ];
    let a = agent(0, &r, &d, 1, &extra, &env);
    wait_for("the first node's worker", Duration::from_secs(30), || {
        count(&events(&d), "start", |e| e["gen"] == 1) == 1
    });
    a.signal(Signal::SIGUSR1);
    wait_for("the preemption request", Duration::from_secs(30), || {
        a.stderr_so_far()
            .contains("coordinated checkpoint requested (SIGUSR1")
    });
    let b = agent(1, &r, &d, 1, &extra, &env);
    let (ca, _, ea) = a.wait(Duration::from_secs(60));
    let (cb, _, eb) = b.wait(Duration::from_secs(60));
    assert_eq!((ca, cb), (5, 5), "A:\n{ea}\nB:\n{eb}");
    assert!(
        ea.contains("(generation 2) sealed; stopping the workers"),
        "{ea}"
    );
    let evs = events(&d);
    assert_eq!(count(&evs, "start", |e| e["gen"] == 2), 2, "{evs:?}");
    assert_eq!(
        count(&evs, "done", |_| true),
        0,
        "stopped, not finished: {evs:?}"
    );
}
