//! Kubernetes: names that resolve late, drun as a container's PID 1, `drun doctor`.

mod dns;
mod doctor;
mod pid1;
