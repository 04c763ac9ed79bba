//! Why `execve` refused a worker's program, in words: a missing `#!` interpreter, a directory,
//! a file without an execute bit or without a `#!` line. [`explain`] is pure; [`describe`]
//! looks at the file to fill in the [`Facts`].

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// What the file system says about a program `execve` refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// The program exists (as a file or a directory).
    pub exists: bool,
    /// The program is a directory.
    pub is_dir: bool,
    /// The interpreter named by its `#!` first line, if it has one.
    pub interpreter: Option<PathBuf>,
    /// That interpreter exists.
    pub interpreter_exists: bool,
    /// That interpreter is a file with an execute bit.
    pub interpreter_executable: bool,
}

/// One line saying why `program` could not be started, from `execve`'s `errno` and the
/// [`Facts`] about it: no file system access.
pub fn explain(program: &Path, errno: i32, facts: &Facts) -> String {
    let p = program.display();
    if facts.is_dir {
        return format!("{p} is a directory, not a program; name the script or executable in it");
    }
    match (errno, &facts.interpreter) {
        (libc::ENOENT, Some(i))
            if facts.exists
                && !facts.interpreter_exists
                && i.as_os_str().as_encoded_bytes().ends_with(b"\r") =>
        {
            let shown = i.display().to_string();
            format!(
                "the first line of {p} ends in a carriage return (Windows line endings), so its interpreter {} is looked up as '{}\\r'; convert the file (dos2unix {p})",
                shown.trim_end_matches('\r'),
                shown.trim_end_matches('\r'),
            )
        }
        (libc::ENOENT, Some(i)) if facts.exists && !facts.interpreter_exists => format!(
            "interpreter {} named in the first line of {p} does not exist",
            i.display()
        ),
        (libc::EACCES, Some(i)) if facts.exists && !facts.interpreter_executable => format!(
            "interpreter {} named in the first line of {p} is not executable",
            i.display()
        ),
        (libc::ENOENT, _) if !facts.exists => format!("{p} not found"),
        (libc::EACCES, _) => {
            format!("{p} is not executable (permission denied); chmod +x it")
        }
        (libc::ENOEXEC, _) => format!(
            "{p} is neither a binary the kernel can run nor a script with a '#!' first line; \
             add one (e.g. '#!/usr/bin/env python3')"
        ),
        _ => format!("{p}: {}", std::io::Error::from_raw_os_error(errno)),
    }
}

/// [`explain`] with the [`Facts`] read from the file system now.
pub fn describe(program: &Path, err: &std::io::Error) -> String {
    match err.raw_os_error() {
        Some(errno) => explain(program, errno, &facts(program)),
        None => format!("{}: {err}", program.display()),
    }
}

/// Reads the [`Facts`] about `program` (its first line only, for the `#!`).
fn facts(program: &Path) -> Facts {
    let meta = std::fs::metadata(program).ok();
    let interpreter = shebang(program);
    let imeta = interpreter
        .as_deref()
        .and_then(|i| std::fs::metadata(i).ok());
    Facts {
        exists: meta.is_some(),
        is_dir: meta.as_ref().is_some_and(|m| m.is_dir()),
        interpreter_exists: imeta.is_some(),
        interpreter_executable: imeta
            .is_some_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0),
        interpreter,
    }
}

/// The interpreter of a `#!` first line (the kernel reads at most 256 bytes of it).
fn shebang(program: &Path) -> Option<PathBuf> {
    let mut head = [0u8; 256];
    let n = std::fs::File::open(program).ok()?.read(&mut head).ok()?;
    parse_shebang(&head[..n])
}

/// The interpreter named by the `#!` line at the start of `head`, as the kernel splits it.
pub fn parse_shebang(head: &[u8]) -> Option<PathBuf> {
    let rest = head.strip_prefix(b"#!")?;
    let line = rest.split(|b| *b == b'\n').next()?;
    let word = line
        .split(|b| *b == b' ' || *b == b'\t')
        .find(|w| !w.is_empty())?;
    use std::os::unix::ffi::OsStrExt;
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(word)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_interp(i: &str, exists: bool, executable: bool) -> Facts {
        Facts {
            exists: true,
            interpreter: Some(i.into()),
            interpreter_exists: exists,
            interpreter_executable: executable,
            ..Facts::default()
        }
    }

    #[test]
    fn a_missing_interpreter_is_named_not_the_script() {
        let f = with_interp("/no/such/python", false, false);
        assert_eq!(
            explain(Path::new("train.py"), libc::ENOENT, &f),
            "interpreter /no/such/python named in the first line of train.py does not exist"
        );
        let f = with_interp("/etc/passwd", true, false);
        assert_eq!(
            explain(Path::new("t.sh"), libc::EACCES, &f),
            "interpreter /etc/passwd named in the first line of t.sh is not executable"
        );
    }

    #[test]
    fn windows_line_endings_are_named() {
        let f = with_interp("/usr/bin/python3\r", false, false);
        assert_eq!(
            explain(Path::new("t.py"), libc::ENOENT, &f),
            "the first line of t.py ends in a carriage return (Windows line endings), so its interpreter /usr/bin/python3 is looked up as '/usr/bin/python3\\r'; convert the file (dos2unix t.py)"
        );
    }

    #[test]
    fn directories_missing_files_permissions_and_formats_each_say_what_they_are() {
        let dir = Facts {
            exists: true,
            is_dir: true,
            ..Facts::default()
        };
        assert!(explain(Path::new("d"), libc::EACCES, &dir).starts_with("d is a directory"));
        assert_eq!(
            explain(Path::new("x"), libc::ENOENT, &Facts::default()),
            "x not found"
        );
        let plain = Facts {
            exists: true,
            ..Facts::default()
        };
        assert!(explain(Path::new("x"), libc::EACCES, &plain).contains("chmod +x"));
        assert!(explain(Path::new("x"), libc::ENOEXEC, &plain).contains("'#!' first line"));
        assert!(explain(Path::new("x"), libc::E2BIG, &plain).starts_with("x: "));
    }

    #[test]
    fn the_shebang_interpreter_is_its_first_word() {
        assert_eq!(
            parse_shebang(b"#! /usr/bin/env python3 -u\nprint()"),
            Some(PathBuf::from("/usr/bin/env"))
        );
        assert_eq!(parse_shebang(b"#!/bin/sh"), Some(PathBuf::from("/bin/sh")));
        assert_eq!(parse_shebang(b"print()\n"), None);
        assert_eq!(parse_shebang(b"#!\n"), None);
    }

    #[test]
    fn describe_reads_the_file() {
        let d = tempfile::tempdir().unwrap();
        let s = d.path().join("train.py");
        std::fs::write(&s, "#!/no/such/python\n").unwrap();
        let enoent = std::io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(
            describe(&s, &enoent),
            format!(
                "interpreter /no/such/python named in the first line of {} does not exist",
                s.display()
            )
        );
        let eacces = std::io::Error::from_raw_os_error(libc::EACCES);
        assert!(describe(d.path(), &eacces).contains("is a directory"));
    }
}
