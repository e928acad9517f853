//! The node's oversubscription board (docs/oversubscription.md) as
//! `vgpu_oversub_*` families: per live process (labels `entry`, its place
//! on the board, and `pid`, in its own namespace) its state, bytes on each
//! card and on the host, bytes it waits for, time suspended and restoring
//! (the current spell counted), suspensions and restores, turns taken and
//! given and its quantum (turns between busy processes); for the node,
//! the host bytes of every suspended process and the count of processes.
//! The board is read into private memory at each scrape
//! (`Board::read_copy`); without one (no oversubscribed process has
//! started on the node) these families are not registered at all.
#![forbid(unsafe_code)]

use prometheus_client::registry::Registry;
use vgpu_shm::board::{Board, ProcState};

use super::family::{Counters, Gauges, counter, gauge, set};

/// The states a process can be in, each one series of
/// `vgpu_oversub_process_state` (1 for the current one, 0 for the others).
const STATES: [ProcState; 5] = [
    ProcState::Running,
    ProcState::Suspending,
    ProcState::Suspended,
    ProcState::Restoring,
    ProcState::Failed,
];

/// The `vgpu_oversub_*` families.
pub(super) struct Oversub {
    state: Gauges,
    device_bytes: Gauges,
    host_bytes: Gauges,
    waiting_bytes: Gauges,
    suspended_seconds: Counters,
    restoring_seconds: Counters,
    suspensions: Counters,
    restores: Counters,
    turns_taken: Counters,
    turns_given: Counters,
    quantum: Gauges,
    node_host_bytes: Gauges,
    processes: Gauges,
}

impl Oversub {
    /// Registers the families in `r`.
    pub(super) fn register(r: &mut Registry) -> Oversub {
        Oversub {
            state: gauge(
                r,
                "vgpu_oversub_process_state",
                "1 for the state an oversubscribed process is in (running, suspending, suspended, restoring, failed), 0 for the others",
            ),
            device_bytes: gauge(
                r,
                "vgpu_oversub_process_device_bytes",
                "Device memory an oversubscribed process holds on the card while running (0 while suspended)",
            ),
            host_bytes: gauge(
                r,
                "vgpu_oversub_process_host_bytes",
                "Bytes of the process's device state held in host memory (suspended, or reserved while suspending)",
            ),
            waiting_bytes: gauge(
                r,
                "vgpu_oversub_process_waiting_bytes",
                "Bytes the process waits for room for on a card (an allocation or its own restore); 0: none",
            ),
            suspended_seconds: counter(
                r,
                "vgpu_oversub_process_suspended_seconds",
                "Seconds the process has spent suspended, restoring included",
            ),
            restoring_seconds: counter(
                r,
                "vgpu_oversub_process_restoring_seconds",
                "Seconds the process has spent restoring, waiting for room included",
            ),
            suspensions: counter(
                r,
                "vgpu_oversub_process_suspensions",
                "Times the process was suspended to host memory",
            ),
            restores: counter(
                r,
                "vgpu_oversub_process_restores",
                "Times the process was restored to the card",
            ),
            turns_taken: counter(
                r,
                "vgpu_oversub_process_turns_taken",
                "Times the process got the card back after waiting for its turn (busy processes taking turns)",
            ),
            turns_given: counter(
                r,
                "vgpu_oversub_process_turns_given",
                "Times the process was suspended at the end of its turn, busy, for a process waiting on its card",
            ),
            quantum: gauge(
                r,
                "vgpu_oversub_process_quantum_seconds",
                "The process's turn length when others wait for its card (VGPU_OVERSUBSCRIBE_QUANTUM_MS; 0: it gives no turns)",
            ),
            node_host_bytes: gauge(
                r,
                "vgpu_oversub_host_bytes",
                "Bytes of suspended device state in host memory, over every process on the node's board (bounded by VGPU_OVERSUBSCRIBE_HOST_LIMIT)",
            ),
            processes: gauge(
                r,
                "vgpu_oversub_processes",
                "Live processes on the node's oversubscription board",
            ),
        }
    }

    /// The series of board `b` at `now` (the board's monotonic clock).
    pub(super) fn board(&self, b: &Board, now: u64) {
        let none = Vec::new();
        set(&self.node_host_bytes, &none, b.host_bytes(None) as f64);
        let mut live = 0;
        for (i, e) in b.others(None) {
            live += 1;
            let labels = vec![("entry", i.to_string()), ("pid", e.pid().to_string())];
            let current = e.state();
            for s in STATES {
                let mut l = labels.clone();
                l.push(("state", s.name().to_string()));
                set(&self.state, &l, f64::from(u8::from(s == current)));
            }
            for (uuid, bytes) in e.cards() {
                let mut l = labels.clone();
                l.push(("device_uuid", vgpu_shm::format_uuid(&uuid)));
                set(&self.device_bytes, &l, bytes as f64);
            }
            let host = e.host_bytes();
            set(&self.host_bytes, &labels, host as f64);
            let waiting = e.wants().map_or(0, |(_, n)| n);
            set(&self.waiting_bytes, &labels, waiting as f64);
            let quantum_ms = e.quantum_ms();
            set(&self.quantum, &labels, f64::from(quantum_ms) / 1e3);
            let secs = |ns: u64| ns as f64 / 1e9;
            let counters = [
                (&self.suspended_seconds, secs(e.suspended_ns_at(now))),
                (&self.restoring_seconds, secs(e.restoring_ns_at(now))),
                (&self.suspensions, e.suspensions() as f64),
                (&self.restores, e.restores() as f64),
                (&self.turns_taken, e.turns_taken() as f64),
                (&self.turns_given, e.turns_given() as f64),
            ];
            for (family, v) in counters {
                family.get_or_create(&labels).inc_by(v);
            }
        }
        set(&self.processes, &none, f64::from(live));
    }
}
