//! GPU health: before a node joins a generation, its GPUs are checked, and a node with a failing
//! GPU does not join (it stands by, or, in a run of a fixed size, ends naming the GPU).
//!
//! | module | concern |
//! |---|---|
//! | [`read`] | `nvidia-smi`'s rows and error lines, the kernel log's Xids: text → readings (pure) |
//! | [`judge`] | readings → healthy, unhealthy with one reason per GPU, or unknown (pure) |
//! | [`gate`] | when to probe, and whether a join may go (pure, on instants) |
//! | [`probe`] | the seam: runs `nvidia-smi` bounded, reads `/dev/kmsg` and `/proc/uptime` |
//!
//! What fails a GPU: `nvidia-smi` cannot reach it, uncorrectable ECC errors, memory held by
//! another process before the workers start, clocks held back by a hardware or thermal
//! slowdown, a recent Xid that means the hardware failed, or fewer visible GPUs than the node
//! asked for. A check that cannot be made (no `nvidia-smi`, a wedged one) holds nothing back:
//! it is said in one line. A node without an NVIDIA GPU skips the check in one line.

pub mod gate;
pub mod judge;
pub mod probe;
pub mod read;

pub use gate::{Cadence, Checks, Gate};
pub use judge::{Finding, Probe, Rules, Verdict};
