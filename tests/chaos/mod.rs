//! Chaos testing (issue 18): seeded random fault schedules against real agents, servers, etcd
//! and workers; a history of every step; a checker of the data and ledger invariants.

mod check;
#[cfg(test)]
mod check_tests;
mod history;
mod schedule;
