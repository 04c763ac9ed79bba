//! Whole paths through several transitions.

use super::*;

#[test]
fn join_form_run_and_reform_from_idle_back_to_idle() {
    let t0 = Instant::now();
    let p = plan(3, &["a", "b"]);
    let (s, fx, _) = run(idle(), request(Request::Join(join("a"), 2)), t0);
    let (what, n) = tries_of(&fx).remove(0);
    let wait = Phase::Waiting {
        join: join("a"),
        since: t0,
    };
    let (s, _, _) = run(s, tried(what, n, Ok(Some(wait))), t0);
    assert!(s.phase.is_waiting());
    let (s, fx, _) = run(s, Input::Decided(Decided::Plan(p.clone())), ms(t0, 300));
    let (what, n) = tries_of(&fx).remove(0);
    let view = Running::enter(p, "a", None, true, ms(t0, 300), &params().rules);
    let (s, _, _) = run(
        s,
        tried(what, n, Ok(Some(Phase::Running(view)))),
        ms(t0, 300),
    );
    assert_eq!(s.phase.running_generation(), Some(3));
    let closed = generation::Input::Closed("node b left".into());
    let (s, fx, _) = run(s, Input::Watch(closed), ms(t0, 900));
    let [Effect::Generation { ends: true, .. }] = &fx[..] else {
        panic!("{fx:?}")
    };
    let Phase::Running(view) = s.phase.clone() else {
        panic!()
    };
    let (s, _, _) = run(s, executed(view, true, Ok(None)), ms(t0, 900));
    assert_eq!(s.phase, Phase::Idle);
    assert_eq!(s.last_gen, 3);
}

#[test]
fn the_transitions_need_no_runtime() {
    // Every test here is a plain `#[test]`: `Instant::now()` is the only clock read, and
    // nothing sleeps. This one steps ten thousand times to show it is cheap.
    let t0 = Instant::now();
    let mut s = running(t0);
    for i in 0..10_000u64 {
        let (s2, _, _) = run(s, request(Request::KeepAlive), ms(t0, i));
        s = s2;
    }
    assert!(s.phase.is_running());
}
