//! Tests of [`super`]: real children, exec errors, PATH lookup, inherited descriptors.

use super::*;
use std::io::Read;

fn spec(program: &str, args: &[&str], env: &[(&str, &str)]) -> SpawnSpec {
    SpawnSpec {
        program: program.into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        env: env
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect(),
        output: Output::Piped,
        stdin: Input::Null,
        die_with_agent: true,
        handoff: None,
        cpus: None,
    }
}

fn read_all(fd: Option<OwnedFd>) -> String {
    let mut s = String::new();
    std::fs::File::from(fd.expect("piped"))
        .read_to_string(&mut s)
        .unwrap();
    s
}

#[test]
fn the_child_gets_exactly_its_environment_arguments_and_pipes() {
    let s = spec(
        "sh",
        &[
            "-c",
            "echo \"$0 $FOO ${HOME:-nohome}\"; echo err >&2; read x || echo eof",
            "zero",
        ],
        &[("FOO", "bar"), ("PATH", "/usr/bin:/bin")],
    );
    let child = spawn_now(s).unwrap();
    assert_eq!(read_all(child.stdout), "zero bar nohome\neof\n");
    assert_eq!(read_all(child.stderr), "err\n");
    assert_eq!(
        waitpid(child.pid, None).unwrap(),
        WaitStatus::Exited(child.pid, 0)
    );
}

#[test]
fn the_child_leads_its_own_session_and_process_group() {
    let child = spawn_now(spec("/bin/sleep", &["5"], &[])).unwrap();
    assert_eq!(nix::unistd::getsid(Some(child.pid)).unwrap(), child.pid);
    assert_eq!(nix::unistd::getpgid(Some(child.pid)).unwrap(), child.pid);
    nix::sys::signal::kill(child.pid, Signal::SIGKILL).unwrap();
    assert!(matches!(
        waitpid(child.pid, None).unwrap(),
        WaitStatus::Signaled(_, Signal::SIGKILL, _)
    ));
}

#[test]
fn a_missing_program_is_enoent_and_leaves_no_child() {
    let e = spawn_now(spec("drun-no-such-program", &[], &[("PATH", "/usr/bin")])).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    let e = spawn_now(spec("/nonexistent/prog", &[], &[])).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
}

#[test]
fn a_program_is_looked_up_on_the_childs_path() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("hello-drun");
    std::fs::write(&exe, "#!/bin/sh\necho found\n").unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/bin:/bin", dir.path().display());
    let child = spawn_now(spec("hello-drun", &[], &[("PATH", &path)])).unwrap();
    assert_eq!(read_all(child.stdout), "found\n");
    waitpid(child.pid, None).unwrap();
}

#[test]
fn the_child_gets_no_descriptor_above_stderr() {
    // Opened without O_CLOEXEC: inherited by every child unless the spawn closes it.
    let held =
        nix::fcntl::open("/dev/null", OFlag::O_RDONLY, nix::sys::stat::Mode::empty()).unwrap();
    assert!(held.as_raw_fd() > 2);
    let child = spawn_now(spec("/bin/sh", &["-c", "ls /proc/$$/fd"], &[])).unwrap();
    assert_eq!(read_all(child.stdout), "0\n1\n2\n");
    waitpid(child.pid, None).unwrap();
    drop(held);
}

#[test]
fn a_handoff_descriptor_arrives_as_fd_3_and_nothing_else_does() {
    use std::io::Write;
    let held =
        nix::fcntl::open("/dev/null", OFlag::O_RDONLY, nix::sys::stat::Mode::empty()).unwrap();
    let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let mut s = spec(
        "/bin/sh",
        &["-c", "ls /proc/$$/fd; read line <&3; echo \"got $line\""],
        &[],
    );
    s.handoff = Some(theirs.into());
    let child = spawn_now(s).unwrap();
    ours.write_all(b"hello\n").unwrap();
    assert_eq!(read_all(child.stdout), "0\n1\n2\n3\ngot hello\n");
    waitpid(child.pid, None).unwrap();
    drop(held);
}

#[test]
fn a_signal_before_the_agents_handlers_is_noted_not_lost() {
    assert_eq!(take_early_signal(), None);
    note_early_signals(&[Signal::SIGTERM]);
    nix::sys::signal::raise(Signal::SIGTERM).unwrap();
    assert_eq!(take_early_signal(), Some(Signal::SIGTERM));
    assert_eq!(take_early_signal(), None, "taken once");
}
