//! The seam around the operating system: spawning, reaping, signalling, /proc scans, ports.
//!
//! Everything that forks, waits or reads `/proc` lives here so the agent logic above it deals
//! in plain values (pids, exit statuses). `spawn` holds the only `unsafe` block of the crate.

pub mod guard;
pub mod ports;
pub mod procs;
pub mod spawn;
