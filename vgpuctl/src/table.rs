//! The human view of `vgpuctl status` and `watch`: per region a title
//! line, a device table and a process table, columns aligned.
#![forbid(unsafe_code)]

use std::fmt::Write as _;

use crate::snapshot::{Alive, Snapshot, Unreadable};

/// Renders every snapshot, then one line per region that could not be read.
pub fn render(regions: &[Snapshot], errors: &[Unreadable]) -> String {
    let mut out = String::new();
    for (i, s) in regions.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        region(&mut out, s);
    }
    for e in errors {
        let _ = writeln!(out, "unreadable {}: {}", e.path, e.error);
    }
    out
}

fn region(out: &mut String, s: &Snapshot) {
    let fmt = match s.format {
        crate::snapshot::Format::Vgpu => "vgpu",
        crate::snapshot::Format::Hami => "HAMi-core",
    };
    let _ = write!(out, "{}  ({fmt} layout {})", s.path, s.layout_version);
    if let Some(o) = &s.owner {
        let ns = if o.namespace.is_empty() { "" } else { "/" };
        let _ = write!(
            out,
            "  pod {}{ns}{} container {}",
            o.namespace, o.pod, o.container
        );
    }
    if let Some(n) = s.slots_reclaimed {
        let _ = write!(out, "  slots reclaimed {n}");
    }
    if let Some(h) = &s.hami {
        let _ = write!(
            out,
            "  priority {}  recent_kernel {}  utilization_switch {}",
            h.priority, h.recent_kernel, h.utilization_switch
        );
        if h.recent_kernel < 0 {
            let _ = write!(
                out,
                "  launches blocked by a node monitor (each process lifts it after {} s alone on its GPUs, {} s at most)",
                vgpu_shm::hami::BLOCK_ALONE_S,
                vgpu_shm::hami::BLOCK_MAX_S
            );
        }
    }
    out.push('\n');

    let mut devs = Table::new(&[
        "DEV",
        "UUID",
        "MEM LIMIT",
        "USED",
        "SM LIMIT",
        "UTIL",
        "SCALE",
        "THROTTLED",
        "WAITED",
        "OOM",
        "LEADER",
    ]);
    for d in &s.devices {
        devs.row(vec![
            d.index.to_string(),
            d.uuid.clone(),
            limit_bytes(d.memory_limit_bytes),
            bytes(d.used_bytes),
            match (d.sm_limit_percent, d.sm_rest_percent) {
                (0 | 100.., Some(r @ 1..)) => format!("none (rest {r}%)"),
                (0 | 100.., _) => "none".into(),
                (p, _) => format!("{p}%"),
            },
            format!("{:.1}%", d.utilization_percent),
            opt(d.bucket_scale.map(|v| format!("{v:.3}"))),
            opt(d.launches_throttled.map(|v| v.to_string())),
            opt(d.throttled_seconds.map(|v| format!("{v:.1} s"))),
            opt(d.oom_denials.map(|v| v.to_string())),
            opt(d.leader_pid.filter(|&p| p != 0).map(|v| v.to_string())),
        ]);
    }
    devs.write(out);

    let mut procs = Table::new(&[
        "SLOT", "PID", "HOST PID", "ALIVE", "DEV", "USED", "CONTEXT", "BUFFERS", "SM%",
    ]);
    for p in &s.processes {
        let alive = match p.alive {
            Alive::Yes => "yes",
            Alive::No => "no",
            Alive::Unknown => "unknown",
        };
        let head = [
            p.slot.to_string(),
            p.pid.to_string(),
            opt(p.host_pid.map(|v| v.to_string())),
            alive.to_string(),
        ];
        if p.devices.is_empty() {
            procs.row(
                head.iter()
                    .cloned()
                    .chain(std::iter::repeat_n("-".to_string(), 5))
                    .collect(),
            );
        }
        for d in &p.devices {
            procs.row(
                head.iter()
                    .cloned()
                    .chain([
                        d.index.to_string(),
                        bytes(d.used_bytes),
                        bytes(d.context_bytes),
                        bytes(d.buffer_bytes),
                        d.sm_util_percent.to_string(),
                    ])
                    .collect(),
            );
        }
    }
    if s.processes.is_empty() {
        out.push_str("  no processes\n");
    } else {
        procs.write(out);
    }
}

/// Left-aligned columns, two spaces apart, indented by two.
struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(header: &[&str]) -> Table {
        Table {
            rows: vec![header.iter().map(|h| h.to_string()).collect()],
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn write(&self, out: &mut String) {
        let cols = self.rows[0].len();
        let width: Vec<usize> = (0..cols)
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for r in &self.rows {
            let mut line = String::new();
            for (c, cell) in r.iter().enumerate() {
                let _ = write!(line, "  {cell:<w$}", w = width[c]);
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
}

fn opt(v: Option<String>) -> String {
    v.unwrap_or_else(|| "-".into())
}

fn limit_bytes(b: u64) -> String {
    if b == 0 { "none".into() } else { bytes(b) }
}

/// Bytes as people read them.
pub fn bytes(b: u64) -> String {
    const KIB: f64 = 1024.0;
    let f = b as f64;
    if b >= 1 << 30 {
        format!("{:.2} GiB", f / (KIB * KIB * KIB))
    } else if b >= 1 << 20 {
        format!("{:.1} MiB", f / (KIB * KIB))
    } else if b >= 1 << 10 {
        format!("{:.1} KiB", f / KIB)
    } else {
        format!("{b} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(256 << 20), "256.0 MiB");
        assert_eq!(bytes(4 << 30), "4.00 GiB");
        assert_eq!(limit_bytes(0), "none");
    }

    #[test]
    fn columns_line_up() {
        let mut t = Table::new(&["A", "LONGER"]);
        t.row(vec!["wide cell".into(), "x".into()]);
        let mut out = String::new();
        t.write(&mut out);
        assert_eq!(out, "  A          LONGER\n  wide cell  x\n");
    }
}
