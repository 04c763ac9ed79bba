//! A multi-host test bed on network namespaces: hosts with their own `eth0`, address and
//! hostname on one switch, and the network's faults between them. The file has no dependency on
//! the rest of the harness, so the benchmarks include it too (`benches/recovery/bed.rs`).
//!
//! # Shape
//!
//! The switch is a namespace of its own holding a Linux bridge; each host is a namespace with a
//! veth pair whose host end is `eth0` (address `10.77.0.(10+i)/24`, no default route) and whose
//! other end is a port of the bridge. Nothing touches the machine's own interfaces, and the
//! addresses exist only inside the bed, so traffic never leaves it. Commands run in a host
//! through `ip netns exec` and `unshare --uts` (its own hostname); they inherit the test's
//! environment and filesystem, except `/etc/hosts`: each host has one naming every host of the
//! bed (`/etc/netns/<namespace>/hosts`, which `ip netns exec` mounts over it), so a host resolves
//! its own hostname as a real machine does (torchrun's c10d backend looks it up to decide whether
//! it hosts the store).
//!
//! # Faults
//!
//! - a pulled cable: the switch port goes down ([`Bed::pull_cable`]); the host's peers see
//!   silence, no FIN and no RST, until [`Bed::plug_cable`];
//! - a partition between two hosts only: blackhole routes ([`Bed::partition`], both ways, or
//!   [`Bed::partition_one_way`]), healed by [`Bed::heal`];
//! - a slow link: a token bucket on the host's `eth0` egress ([`Bed::limit_rate`]), removed by
//!   [`Bed::unlimit_rate`].
//!
//! # Clean-up
//!
//! Dropping the [`Bed`] kills every process left in its namespaces and deletes them (and their
//! `/etc/netns/<namespace>` folders), also when
//! the test panics. A test process killed outright (a nextest timeout) cannot run its drops, so
//! each new bed first removes the beds of test processes that are gone (names carry the pid).
//!
//! # Root
//!
//! Building a bed needs root and `ip`. Without them [`Bed::new`] returns `None` after one line
//! saying why (the test is skipped), unless `DRUN_REQUIRE_NETNS=1` (CI): then it panics.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Prefix of every namespace a bed creates.
const PREFIX: &str = "drunbed";
/// The bed's subnet (only inside its own switch).
const SUBNET: &str = "10.77.0";

/// One host of a bed.
#[derive(Debug, Clone)]
pub struct BedHost {
    /// Its hostname inside the bed (`n0`, `server`, ...).
    pub name: String,
    /// Its network namespace.
    pub ns: String,
    /// Its address on `eth0`.
    pub addr: String,
    /// Its port on the switch.
    port: String,
}

/// A set of hosts on one switch; removed on drop.
pub struct Bed {
    switch: String,
    hosts: Vec<BedHost>,
}

static BEDS: AtomicUsize = AtomicUsize::new(0);

/// Runs `ip ARGS`; panics with its stderr if it fails.
fn ip(args: &[&str]) {
    let o = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run ip");
    assert!(
        o.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr).trim()
    );
}

/// Why a bed cannot be built here, if it cannot.
fn unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root".into());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => {}
        _ => return Some("no `ip` command (iproute2)".into()),
    }
    match Command::new("unshare").arg("--version").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("no `unshare` command (util-linux)".into()),
    }
}

/// The pids in namespace `ns`.
fn pids_in(ns: &str) -> Vec<i32> {
    Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether process `pid` is running (a zombie is not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .and_then(|a| a.split_whitespace().next())
                != Some("Z")
        })
        .unwrap_or(false)
}

/// The folder whose files `ip netns exec` mounts over `/etc` in namespace `ns`.
fn etc_of(ns: &str) -> std::path::PathBuf {
    std::path::Path::new("/etc/netns").join(ns)
}

/// Kills what runs in `ns` and deletes it (best effort: a drop must not panic).
fn remove(ns: &str) {
    for _ in 0..50 {
        let pids = pids_in(ns);
        if pids.is_empty() {
            break;
        }
        for p in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = Command::new("ip")
        .args(["netns", "del", ns])
        .stderr(Stdio::null())
        .status();
    let _ = std::fs::remove_dir_all(etc_of(ns));
}

/// The namespaces (and `/etc/netns` folders) of beds whose test process is gone.
fn stale() -> Vec<String> {
    let folders = std::fs::read_dir("/etc/netns")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|ns| ns.starts_with(PREFIX));
    let mut all: Vec<String> = bed_namespaces().into_iter().chain(folders).collect();
    all.sort();
    all.dedup();
    all.into_iter()
        .filter(|ns| {
            let pid: i32 = ns
                .strip_prefix(PREFIX)
                .and_then(|r| r.strip_prefix('-'))
                .and_then(|r| r.split('-').next())
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            pid > 0 && !alive(pid)
        })
        .collect()
}

/// The namespaces this machine has that belong to any bed (for leak checks).
pub fn bed_namespaces() -> Vec<String> {
    let Ok(o) = Command::new("ip").args(["netns", "list"]).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|ns| ns.starts_with(PREFIX))
        .map(str::to_string)
        .collect()
}

impl Bed {
    /// Builds hosts named `names` on one switch, or returns `None` (skipped, with a note) where
    /// a bed cannot be built and `DRUN_REQUIRE_NETNS` is not `1`.
    pub fn new(names: &[&str]) -> Option<Bed> {
        if let Some(why) = unavailable() {
            assert_ne!(
                std::env::var("DRUN_REQUIRE_NETNS").as_deref(),
                Ok("1"),
                "DRUN_REQUIRE_NETNS=1 but the network test bed cannot be built: {why}"
            );
            eprintln!("skipping: the network test bed needs root, ip and unshare ({why})");
            return None;
        }
        for ns in stale() {
            remove(&ns);
        }
        let id = format!(
            "{PREFIX}-{}-{}",
            std::process::id(),
            BEDS.fetch_add(1, Ordering::Relaxed)
        );
        let mut bed = Bed {
            switch: format!("{id}-sw"),
            hosts: Vec::new(),
        };
        ip(&["netns", "add", &bed.switch]);
        ip(&["-n", &bed.switch, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &bed.switch, "link", "set", "br0", "up"]);
        ip(&["-n", &bed.switch, "link", "set", "lo", "up"]);
        let hosts_file: String = names
            .iter()
            .enumerate()
            .map(|(i, name)| format!("{SUBNET}.{} {name}\n", 10 + i))
            .collect();
        for (i, name) in names.iter().enumerate() {
            let host = BedHost {
                name: (*name).to_string(),
                ns: format!("{id}-{name}"),
                addr: format!("{SUBNET}.{}", 10 + i),
                port: format!("p{i}"),
            };
            // Registered before it is built, so a failure half-way still removes it.
            bed.hosts.push(host.clone());
            ip(&["netns", "add", &host.ns]);
            let etc = etc_of(&host.ns);
            std::fs::create_dir_all(&etc).expect("create /etc/netns/<namespace>");
            std::fs::write(
                etc.join("hosts"),
                format!("127.0.0.1 localhost\n{hosts_file}"),
            )
            .expect("write the host's /etc/hosts");
            ip(&[
                "-n",
                &bed.switch,
                "link",
                "add",
                &host.port,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &host.ns,
            ]);
            ip(&[
                "-n",
                &bed.switch,
                "link",
                "set",
                &host.port,
                "master",
                "br0",
            ]);
            ip(&["-n", &bed.switch, "link", "set", &host.port, "up"]);
            let cidr = format!("{}/24", host.addr);
            ip(&["-n", &host.ns, "addr", "add", &cidr, "dev", "eth0"]);
            ip(&["-n", &host.ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &host.ns, "link", "set", "lo", "up"]);
        }
        Some(bed)
    }

    /// The host named `name`.
    pub fn host(&self, name: &str) -> &BedHost {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no host {name} in this bed"))
    }

    /// The namespaces of this bed (switch first).
    pub fn namespaces(&self) -> Vec<String> {
        std::iter::once(self.switch.clone())
            .chain(self.hosts.iter().map(|h| h.ns.clone()))
            .collect()
    }

    /// `cmd` as it would run on host `name`: in its namespace, with its hostname, and with
    /// `cmd`'s environment, arguments and working directory.
    pub fn on(&self, name: &str, cmd: &Command) -> Command {
        let h = self.host(name);
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &h.ns, "unshare", "--uts", "--", "sh", "-c"])
            .arg("echo \"$0\" > /proc/sys/kernel/hostname && exec \"$@\"")
            .arg(&h.name)
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        if let Some(d) = cmd.get_current_dir() {
            c.current_dir(d);
        }
        c
    }

    /// Pulls host `name`'s cable: its switch port goes down (its peers hear nothing more).
    pub fn pull_cable(&self, name: &str) {
        self.set_port(name, "down");
    }

    /// Plugs host `name`'s cable back in.
    pub fn plug_cable(&self, name: &str) {
        self.set_port(name, "up");
    }

    fn set_port(&self, name: &str, state: &str) {
        let port = &self.host(name).port;
        ip(&["-n", &self.switch, "link", "set", port, state]);
    }

    /// `from` can no longer send to `to` (a blackhole route on `from`); the other way still works.
    pub fn partition_one_way(&self, from: &str, to: &str) {
        let dst = format!("{}/32", self.host(to).addr);
        ip(&["-n", &self.host(from).ns, "route", "add", "blackhole", &dst]);
    }

    /// `a` and `b` can no longer reach each other; both still reach every other host.
    pub fn partition(&self, a: &str, b: &str) {
        self.partition_one_way(a, b);
        self.partition_one_way(b, a);
    }

    /// Removes the blackhole routes between `a` and `b` (either way, where they exist).
    pub fn heal(&self, a: &str, b: &str) {
        for (from, to) in [(a, b), (b, a)] {
            let dst = format!("{}/32", self.host(to).addr);
            let _ = Command::new("ip")
                .args(["-n", &self.host(from).ns, "route", "del", "blackhole", &dst])
                .stderr(Stdio::null())
                .status();
        }
    }

    /// Limits what host `name` sends to `rate` (tc's syntax, e.g. `20mbit`): a token bucket on
    /// its `eth0`.
    pub fn limit_rate(&self, name: &str, rate: &str) {
        let ns = &self.host(name).ns;
        ip(&["netns", "exec", ns, "true"]);
        let o = Command::new("ip")
            .args([
                "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
            ])
            .args(["rate", rate, "burst", "32kbit", "latency", "400ms"])
            .output()
            .expect("run tc");
        assert!(
            o.status.success(),
            "tc tbf on {name}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }

    /// Limits what host `name` receives to `rate`: a token bucket on its port of the switch
    /// (gone with the bed).
    pub fn limit_receive_rate(&self, name: &str, rate: &str) {
        let port = &self.host(name).port;
        let o = Command::new("ip")
            .args(["-n", &self.switch, "link", "show", port])
            .output()
            .expect("run ip");
        assert!(o.status.success(), "no switch port {port} for {name}");
        let o = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.switch,
                "tc",
                "qdisc",
                "add",
                "dev",
                port,
                "root",
                "tbf",
            ])
            .args(["rate", rate, "burst", "32kbit", "latency", "400ms"])
            .output()
            .expect("run tc");
        assert!(
            o.status.success(),
            "tc tbf on {name}'s switch port: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }

    /// Removes the token bucket [`Bed::limit_rate`] put on host `name`'s `eth0`.
    pub fn unlimit_rate(&self, name: &str) {
        let ns = &self.host(name).ns;
        let o = Command::new("ip")
            .args([
                "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root",
            ])
            .output()
            .expect("run tc");
        assert!(
            o.status.success(),
            "tc qdisc del on {name}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }

    /// The processes running on host `name`.
    pub fn pids_on(&self, name: &str) -> Vec<i32> {
        pids_in(&self.host(name).ns)
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        for h in &self.hosts {
            remove(&h.ns);
        }
        remove(&self.switch);
    }
}
