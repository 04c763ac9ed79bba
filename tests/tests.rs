//! drun's integration tests: real `drun` processes, real workers, real signals.

mod harness;

mod cli;
mod elastic;
mod logs;
mod multinode;
mod ports;
mod standalone;
mod supervision;
mod torch_e2e;
