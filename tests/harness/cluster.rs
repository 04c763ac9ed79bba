//! Services for multi-node tests: etcd (single member or a 3-member cluster) and
//! `drun-rendezvous` replicas, all on free loopback ports, killed on drop.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use nix::unistd::Pid;

pub use super::etcd::{free_port, Etcd};

/// A `drun-rendezvous serve` replica.
pub struct RdzvServer {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub endpoint: String,
    /// `127.0.0.1:PORT` of `/metrics`, when started with [`RdzvServer::start_with_metrics`].
    pub metrics: Option<String>,
    /// The rest of its stdout (kept open: a closed pipe would fail its later lines).
    stdout: Option<std::io::BufReader<std::process::ChildStdout>>,
}

pub fn rendezvous_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_drun-rendezvous"))
}

impl RdzvServer {
    /// `--rdzv-endpoint` this replica with a 3 s lease TTL and a 0.5 s last call: an elastic
    /// test's quick re-forms.
    pub fn quick_rdzv(&self) -> [&str; 4] {
        [
            "--rdzv-endpoint",
            self.endpoint.as_str(),
            "--rdzv-conf",
            "lease_ttl=3,last_call_timeout=0.5",
        ]
    }

    /// Starts a replica on a free port; `store_args` e.g. `["--store", "memory"]`.
    pub fn start(store_args: &[&str]) -> RdzvServer {
        Self::start_on("127.0.0.1:0", store_args)
    }

    /// Starts a replica on a free port that serves `/metrics` on another free port.
    pub fn start_with_metrics(store_args: &[&str]) -> RdzvServer {
        let mut args = store_args.to_vec();
        args.extend(["--metrics-addr", "127.0.0.1:0"]);
        let mut s = Self::spawn("127.0.0.1:0", &args, "warn", Stdio::inherit());
        s.read_metrics_address();
        s
    }

    /// [`RdzvServer::start_logging`] that also serves `/metrics` on a free port.
    pub fn start_logging_with_metrics(
        args: &[&str],
        level: &str,
        log: &std::path::Path,
    ) -> RdzvServer {
        let mut args = args.to_vec();
        args.extend(["--metrics-addr", "127.0.0.1:0"]);
        let file = std::fs::File::create(log).expect("create the server's log file");
        let mut s = Self::spawn("127.0.0.1:0", &args, level, file.into());
        s.read_metrics_address();
        s
    }

    /// Reads the `/metrics` address the server announces on its second stdout line.
    fn read_metrics_address(&mut self) {
        let mut line = String::new();
        self.stdout
            .as_mut()
            .expect("stdout kept")
            .read_line(&mut line)
            .unwrap();
        self.metrics = Some(
            super::scrape::announced(&line)
                .unwrap_or_else(|| panic!("no metrics address: {line:?}")),
        );
    }

    /// Starts a replica listening on `listen`.
    pub fn start_on(listen: &str, store_args: &[&str]) -> RdzvServer {
        Self::spawn(listen, store_args, "warn", Stdio::inherit())
    }

    /// Starts a replica on a free port with `args` (store and log flags) whose log records
    /// (`level`: a `DRUN_LOG` filter) go to the file `log`.
    pub fn start_logging(args: &[&str], level: &str, log: &std::path::Path) -> RdzvServer {
        let file = std::fs::File::create(log).expect("create the server's log file");
        Self::spawn("127.0.0.1:0", args, level, file.into())
    }

    /// Starts a replica listening on `listen` with `args` whose log records (`level`) are
    /// appended to the file `log` (a restarted replica continues its predecessor's log).
    pub fn start_on_logging(
        listen: &str,
        args: &[&str],
        level: &str,
        log: &std::path::Path,
    ) -> RdzvServer {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("open the server's log file");
        Self::spawn(listen, args, level, file.into())
    }

    /// `drun-rendezvous serve --listen LISTEN ARGS` logging at `level`.
    fn command(listen: &str, args: &[&str], level: &str) -> Command {
        let mut c = Command::new(rendezvous_bin());
        c.args(["serve", "--listen", listen])
            .args(args)
            .env("DRUN_LOG", level)
            .env_remove("DRUN_LOG_FORMAT");
        c
    }

    /// Starts a replica on host `host` of `bed`, on its address and a free port, with `args`;
    /// its log records (`level`) go to the file `log`.
    pub fn start_in(
        bed: &super::netbed::Bed,
        host: &str,
        args: &[&str],
        level: &str,
        log: &std::path::Path,
    ) -> RdzvServer {
        let listen = format!("{}:0", bed.host(host).addr);
        let file = std::fs::File::create(log).expect("create the server's log file");
        Self::start_command(
            bed.on(host, &Self::command(&listen, args, level)),
            file.into(),
        )
    }

    fn spawn(listen: &str, args: &[&str], level: &str, stderr: Stdio) -> RdzvServer {
        Self::start_command(Self::command(listen, args, level), stderr)
    }

    fn start_command(mut cmd: Command, stderr: Stdio) -> RdzvServer {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start drun-rendezvous");
        let mut line = String::new();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut line).unwrap();
        let endpoint = line
            .split_whitespace()
            .nth(3)
            .unwrap_or_else(|| panic!("drun-rendezvous did not start: {line:?}"))
            .to_string();
        RdzvServer {
            child,
            endpoint,
            metrics: None,
            stdout: Some(stdout),
        }
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// Sends SIGTERM and waits up to `within` for the replica to exit: its exit code, or
    /// `None` if it is still running then (it is killed on drop).
    pub fn terminate(&mut self, within: std::time::Duration) -> Option<i32> {
        nix::sys::signal::kill(self.pid(), nix::sys::signal::Signal::SIGTERM).unwrap();
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Some(st) = self.child.try_wait().unwrap() {
                return Some(st.code().unwrap_or(-1));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        None
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RdzvServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Node `i` (pinned node rank `i`) of the 2-node run `run` on `server`, 2 workers,
/// `--max-restarts 0`, a 3 s shutdown timeout: the test worker `script` with `args`.
pub fn pinned_node<S: AsRef<std::ffi::OsStr>>(
    server: &RdzvServer,
    run: &str,
    i: usize,
    script: &str,
    args: &[S],
) -> super::Agent {
    let rdzv = [
        "--rdzv-backend",
        "drun",
        "--rdzv-endpoint",
        &server.endpoint,
    ];
    let mut c = super::node_cmd(i, run, "2", &rdzv);
    c.args(["--node-rank", &i.to_string(), "--max-restarts", "0"])
        .args(["--shutdown-timeout", "3"])
        .arg(super::worker(script))
        .args(args);
    super::Agent::start(c)
}
