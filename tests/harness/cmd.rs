//! One builder for the `drun` command lines the tests start: named steps for the flags every
//! multi-node test repeats (loopback node address, run id, workers per node, quick shutdown).

use std::path::Path;
use std::process::Command;

/// Named steps on a `drun` [`Command`] (start from [`super::drun`]).
pub trait DrunCmd {
    /// Simulated node `i`: `--local-addr 127.0.0.(i+1)` (its own loopback address).
    fn node(&mut self, i: usize) -> &mut Self;
    /// `--nnodes NNODES --rdzv-id RUN`: the job every node of a test joins.
    fn job(&mut self, run: &str, nnodes: &str) -> &mut Self;
    /// `--nproc-per-node N`.
    fn nproc(&mut self, n: u32) -> &mut Self;
    /// `--shutdown-timeout 3`: workers get 3 s, not the default 30 s, to exit after SIGTERM.
    fn quick_shutdown(&mut self) -> &mut Self;
    /// `--python P`: the interpreter the workers run with (torch's venv for torch workers).
    fn python(&mut self, p: &Path) -> &mut Self;
}

impl DrunCmd for Command {
    fn node(&mut self, i: usize) -> &mut Self {
        self.arg("--local-addr").arg(format!("127.0.0.{}", i + 1))
    }

    fn job(&mut self, run: &str, nnodes: &str) -> &mut Self {
        self.args(["--nnodes", nnodes, "--rdzv-id", run])
    }

    fn nproc(&mut self, n: u32) -> &mut Self {
        self.args(["--nproc-per-node", &n.to_string()])
    }

    fn quick_shutdown(&mut self) -> &mut Self {
        self.args(["--shutdown-timeout", "3"])
    }

    fn python(&mut self, p: &Path) -> &mut Self {
        self.arg("--python").arg(p)
    }
}
