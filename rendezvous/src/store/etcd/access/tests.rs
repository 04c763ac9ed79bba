//! Tests of reading the etcd access flags and of the one-line diagnoses.

use super::*;

fn files(dir: &Path) -> (PathBuf, PathBuf) {
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, "not a pem").unwrap();
    let pw = dir.join("pw");
    std::fs::write(&pw, "\n  s3cret-pw  \nignored\n").unwrap();
    (ca, pw)
}

#[test]
fn the_password_file_wins_and_a_user_needs_a_password() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, pw) = files(dir.path());
    let f = EtcdAccessFiles {
        cacert: Some(ca.clone()),
        user: Some("drun".into()),
        password_file: Some(pw.clone()),
        ..Default::default()
    };
    let a = f.load(Some("from-env")).unwrap();
    assert!(a.is_tls());
    assert_eq!(a.user(), Some("drun"));
    assert_eq!(a.user.as_ref().unwrap().1.expose(), "s3cret-pw");
    let dbg = format!("{a:?}");
    assert!(!dbg.contains("s3cret") && dbg.contains("drun"), "{dbg}");
    let env_only = EtcdAccessFiles {
        user: Some("drun".into()),
        ..Default::default()
    };
    let a = env_only.load(Some("from-env")).unwrap();
    assert_eq!(a.user.as_ref().unwrap().1.expose(), "from-env");
    assert!(!a.is_tls());
    let e = env_only.load(None).unwrap_err().to_string();
    assert!(e.contains("needs a password"), "{e}");
    let e = EtcdAccessFiles {
        user: Some("drun:s3cret".into()),
        ..Default::default()
    }
    .load(Some("x"))
    .unwrap_err()
    .to_string();
    assert!(e.contains("user name only") && !e.contains("s3cret"), "{e}");
    // The variable alone (exported for another tool) turns nothing on.
    let none = EtcdAccessFiles::default().load(Some("x")).unwrap();
    assert_eq!(none.user(), None);
}

#[test]
fn bad_flag_combinations_are_one_line_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, pw) = files(dir.path());
    let load = |f: EtcdAccessFiles| f.load(None).unwrap_err().to_string();
    let e = load(EtcdAccessFiles {
        cacert: Some(ca.clone()),
        cert: Some(ca.clone()),
        ..Default::default()
    });
    assert!(e.contains("go together"), "{e}");
    let e = load(EtcdAccessFiles {
        cert: Some(ca.clone()),
        key: Some(ca.clone()),
        ..Default::default()
    });
    assert!(e.contains("needs --etcd-cacert"), "{e}");
    let e = load(EtcdAccessFiles {
        password_file: Some(pw),
        ..Default::default()
    });
    assert!(e.contains("needs --etcd-user"), "{e}");
    let e = load(EtcdAccessFiles {
        cacert: Some(dir.path().join("gone")),
        ..Default::default()
    });
    assert!(
        e.contains("--etcd-cacert") && e.contains("cannot read"),
        "{e}"
    );
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n \n").unwrap();
    let e = load(EtcdAccessFiles {
        user: Some("u".into()),
        password_file: Some(empty),
        ..Default::default()
    });
    assert!(e.contains("is empty"), "{e}");
}

#[test]
fn urls_follow_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, _) = files(dir.path());
    let plain = EtcdAccess::default();
    let tls = EtcdAccessFiles {
        cacert: Some(ca),
        ..Default::default()
    }
    .load(None)
    .unwrap();
    assert_eq!(plain.url("h:1").unwrap(), "http://h:1");
    assert_eq!(tls.url("h:1").unwrap(), "https://h:1");
    assert_eq!(tls.url("https://h:1").unwrap(), "https://h:1");
    assert!(plain
        .url("https://h:1")
        .unwrap_err()
        .to_string()
        .contains("--etcd-cacert"));
    assert!(tls
        .url("http://h:1")
        .unwrap_err()
        .to_string()
        .contains("not https"));
}

#[test]
fn diagnoses_name_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, pw) = files(dir.path());
    let plain = EtcdAccess::default();
    let tls_user = EtcdAccessFiles {
        cacert: Some(ca),
        user: Some("drun".into()),
        password_file: Some(pw),
        ..Default::default()
    }
    .load(None)
    .unwrap();
    let refused = |e, a| match diagnose(e, a) {
        Some(Diagnosis::Refused(l)) => l,
        other => panic!("{e}: {other:?}"),
    };
    let hint = |e, a| match diagnose(e, a) {
        Some(Diagnosis::Hint(l)) => l,
        other => panic!("{e}: {other:?}"),
    };
    let l = refused(
        "grpc request error: status: InvalidArgument, message: \"etcdserver: authentication failed, invalid user ID or password\"",
        &tls_user,
    );
    assert!(l.contains("refused the credentials for user drun"), "{l}");
    assert!(!l.contains("s3cret"));
    assert!(refused("etcdserver: user name is empty", &plain).contains("--etcd-user"));
    assert!(refused("etcdserver: permission denied", &tls_user).contains("user drun may not"));
    assert!(refused("etcdserver: permission denied", &plain).contains("--etcd-user NAME"));
    assert!(refused("invalid peer certificate: UnknownIssuer", &tls_user).contains("wrong CA"));
    assert!(hint("transport error: connection reset by peer", &plain).contains("--etcd-cacert"));
    assert!(hint("h2 protocol error: connection closed", &tls_user).contains("client certificate"));
    assert_eq!(
        diagnose("tcp connect error: Connection refused", &plain),
        None
    );
    assert_eq!(diagnose("timeout", &tls_user), None);
}
