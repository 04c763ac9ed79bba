//! The decisions: pure functions of a snapshot, the time and the configuration, each with a
//! reason people read. Nothing here touches the store or sleeps; the round, the session and the
//! server call them and carry out what they say.
//!
//! * [`core`] — when a waiting set forms (last call, settle window, no second world beside a
//!   running generation); [`plan`] — the ranks every agent receives.
//! * [`envcheck`] — whether the members' environments agree; [`door`] — the door a newcomer is
//!   judged against while a generation runs, by the same verdict.
//! * [`loss`] — naming a lost node and attributing a survivor's failure to it;
//!   [`root_cause`] — the first failure of a generation and its summary;
//!   [`partition`] — which side of a partition leaves.
//! * [`ckpt_interval`] — the automatic checkpoint interval; [`formation`] — the work a re-form
//!   threw away.
//! * [`flight`] — the flight recorder's verdict on a hang: who waits for whom, over the dumps
//!   of one node (its agent) or of every node (`status`).
//! * [`names`] — node lists in those reasons, bounded whatever the group's size.

pub mod ckpt_interval;
pub mod core;
pub mod door;
pub mod envcheck;
pub mod flight;
pub mod formation;
pub mod loss;
pub mod names;
pub mod partition;
pub mod plan;
pub mod root_cause;
