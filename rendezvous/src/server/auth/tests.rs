use super::*;

fn entries(text: &str) -> Vec<Entry> {
    parse_tokens(text).expect("parses")
}

#[test]
fn token_files_hold_global_and_run_scoped_tokens() {
    let e = entries("# comment\n\n  s3cret  \nrunA tokA\n");
    assert_eq!(e.len(), 2);
    assert_eq!(e[0].run, None);
    assert_eq!(e[0].token.expose(), "s3cret");
    assert_eq!(e[1].run.as_deref(), Some("runA"));
    assert_eq!(e[1].token.expose(), "tokA");
}

#[test]
fn a_bad_token_line_is_named_by_number_not_content() {
    let err = parse_tokens("ok\nrun tok extra-secret\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 2"), "{err}");
    assert!(!err.contains("extra-secret"), "{err}");
    let long = "x".repeat(MAX_TOKEN_LEN + 1);
    assert!(parse_tokens(&long)
        .unwrap_err()
        .to_string()
        .contains("line 1"));
    // A token gRPC metadata cannot carry would never match; a run id no run can have, neither.
    let err = parse_tokens("ok\nrun sécret\n").unwrap_err().to_string();
    assert!(
        err.contains("line 2") && err.contains("printable ASCII"),
        "{err}"
    );
    assert!(!err.contains("sécret"), "{err}");
    let err = parse_tokens("../x tok\n").unwrap_err().to_string();
    assert!(err.contains("line 1") && err.contains("run id"), "{err}");
}

#[test]
fn only_printable_ascii_tokens_can_be_sent() {
    assert_eq!(token_problem("Az09-._~+/=!"), None);
    for bad in ["", "a b", "tab\t", "é", "\u{7f}"] {
        assert!(token_problem(bad).is_some(), "{bad:?}");
    }
    assert!(token_problem(&"x".repeat(MAX_TOKEN_LEN + 1)).is_some());
    assert_eq!(token_problem(&"x".repeat(MAX_TOKEN_LEN)), None);
}

#[test]
fn constant_time_equality_is_equality() {
    assert!(ct_eq(b"abc", b"abc"));
    assert!(!ct_eq(b"abc", b"abd"));
    assert!(!ct_eq(b"abc", b"ab"));
    assert!(ct_eq(b"", b""));
}

#[test]
fn decisions_follow_scope() {
    let e = entries("global\nrunA tokA\nrunB tokB\n");
    assert_eq!(decide(false, &[], Some("r"), None), Verdict::Open);
    assert_eq!(decide(true, &e, Some("r"), None), Verdict::Missing);
    assert_eq!(decide(true, &e, Some("r"), Some("nope")), Verdict::Wrong);
    assert_eq!(
        decide(true, &e, Some("any"), Some("global")),
        Verdict::Accepted
    );
    assert_eq!(
        decide(true, &e, Some("runA"), Some("tokA")),
        Verdict::Accepted
    );
    assert_eq!(decide(true, &e, Some("runB"), Some("tokA")), Verdict::Wrong);
    // Before the run is known, a scoped token passes the first gate.
    assert_eq!(decide(true, &e, None, Some("tokB")), Verdict::Accepted);
    // Configured, but nothing readable: nothing is accepted.
    assert_eq!(decide(true, &[], Some("r"), Some("x")), Verdict::Wrong);
}

#[test]
fn secrets_do_not_print() {
    let s = Secret::new("hunter2");
    assert!(!format!("{s:?} {s}").contains("hunter2"));
    let e = Entry {
        run: None,
        token: s,
    };
    assert!(!format!("{e:?}").contains("hunter2"));
}

#[test]
fn token_files_are_read_again_when_they_change() {
    use crate::server::auth::token_files::RECHECK;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("tokens");
    std::fs::write(&f, "old\n").unwrap();
    let auth = Auth::from_files(std::slice::from_ref(&f)).unwrap();
    let md = |t: &str| {
        let mut r = tonic::Request::new(());
        attach(&mut r, Some(&Secret::new(t)));
        r.metadata().clone()
    };
    let t0 = std::time::Instant::now();
    assert!(auth.check_at(&md("old"), Some("r"), t0).is_ok());
    std::fs::write(&f, "new\n").unwrap();
    let err = auth
        .check_at(&md("old"), Some("r"), t0 + RECHECK)
        .unwrap_err();
    assert!(matches!(err, ServiceError::Unauthenticated(_)));
    assert!(!err.to_string().contains("old"), "{err}");
    assert!(auth.check_at(&md("new"), Some("r"), t0 + RECHECK).is_ok());
    // A file gone: fail closed.
    std::fs::remove_file(&f).unwrap();
    assert!(auth
        .check_at(&md("new"), Some("r"), t0 + RECHECK * 2)
        .is_err());
    let missing = auth
        .check(&tonic::metadata::MetadataMap::new(), None)
        .unwrap_err();
    assert!(
        missing.to_string().contains("--rdzv-token-file"),
        "{missing}"
    );
}

#[test]
fn empty_or_unreadable_files_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "# nothing\n").unwrap();
    assert!(Auth::from_files(&[empty])
        .unwrap_err()
        .to_string()
        .contains("no token"));
    let gone = dir.path().join("gone");
    assert!(Auth::from_files(&[gone])
        .unwrap_err()
        .to_string()
        .contains("cannot read"));
    assert!(Auth::from_files(&[]).unwrap().is_open());
}
