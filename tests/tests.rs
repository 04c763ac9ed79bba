//! drun's integration tests: real `drun` processes, real workers, real signals.

mod harness;

mod auth;
mod chaos;
mod ckpt;
mod cli;
mod elastic;
mod envcheck;
mod etcd_secure;
mod hang;
mod json_logs;
mod k8s;
mod k8s_examples;
mod ledger;
mod logs;
mod metrics;
mod multinode;
mod node_loss;
mod output;
mod packaging;
mod ports;
mod preflight;
mod python_helper;
mod real_scripts;
mod root_cause;
mod slurm;
mod slurm_token;
mod standalone;
mod status;
mod store;
mod straggler;
mod supervision;
mod terminal;
mod tls;
mod torch_e2e;
mod worker_store;
