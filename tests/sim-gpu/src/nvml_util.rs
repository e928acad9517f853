//! NVML's per-process utilisation, the way the real one reports it.
//!
//! NVML works in sample periods (`SIM_GPU_NVML_PERIOD_US`, 1/6 s on an
//! H200). While a process is alone on the device, a period gives it its
//! exact busy fraction. While contexts of several processes time-slice, a
//! period goes to one of them, as if the process running at one sampled
//! instant had done all of the period's work: it gets the device's busy
//! fraction, the others nothing. On an H200 a process whose true share was
//! 0.2, read every 0.5 s, read 0, 0.33, 0.5, 0.66 or 0.99, with the right
//! mean over long windows. Here the instant is picked by a hash of the
//! period's index, weighted by each process's busy time in it, so every
//! process sees the same attribution and tests are reproducible.
//!
//! A query returns one sample per process that the window's periods gave
//! something: its mean over the window's periods since its first (periods
//! given to others count 0), stamped with the end of the newest period.

use std::sync::atomic::Ordering;

use crate::queue;
use crate::state::{self, Proc, RING, shared};

/// The longest window a query looks at (periods).
const MAX_PERIODS: u64 = 120;

pub struct Sample {
    /// As the caller sees it (`state::reported_pid`).
    pub pid: u32,
    /// Percent of the device.
    pub sm: u32,
    /// End of the newest period (CLOCK_REALTIME µs).
    pub timestamp_us: u64,
}

/// Intervals of `p` on `dev`, newest first: (start, end) ns.
fn intervals(p: &Proc, dev: usize) -> impl Iterator<Item = (u64, u64)> + '_ {
    let head = p.head[dev].load(Ordering::Acquire);
    (1..=head.min(RING as u64)).map(move |k| {
        let iv = &p.ring[dev][((head - k) % RING as u64) as usize];
        (
            iv.start.load(Ordering::Acquire),
            iv.end.load(Ordering::Acquire),
        )
    })
}

/// Busy ns of `p` on `dev` in each of `n` periods of `period_ns` from
/// period `k0` on.
fn busy_per_period(p: &Proc, dev: usize, k0: u64, n: usize, period_ns: u64) -> Vec<u64> {
    let mut busy = vec![0u64; n];
    let (w0, w1) = (k0 * period_ns, (k0 + n as u64) * period_ns);
    for (s, e) in intervals(p, dev) {
        if e <= w0 {
            break;
        }
        let (mut s, e) = (s.max(w0), e.min(w1));
        while s < e {
            let k = s / period_ns;
            let end = e.min((k + 1) * period_ns);
            busy[(k - k0) as usize] += end - s;
            s = end;
        }
    }
    busy
}

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Who gets period `k` of `dev`, given each process's busy ns in it.
fn attribute(k: u64, dev: usize, busy: &[u64], period_ns: u64) -> Vec<f64> {
    let total: u64 = busy.iter().sum();
    let mut got = vec![0.0; busy.len()];
    if busy.iter().filter(|&&b| b > 0).count() <= 1 {
        for (g, &b) in got.iter_mut().zip(busy) {
            *g = b as f64 / period_ns as f64;
        }
        return got;
    }
    let mut at = mix(k ^ ((dev as u64) << 56)) % total;
    for (i, &b) in busy.iter().enumerate() {
        if at < b {
            got[i] = total.min(period_ns) as f64 / period_ns as f64;
            break;
        }
        at -= b;
    }
    got
}

/// What `nvmlDeviceGetProcessUtilization(dev, .., last_seen_us)` returns.
pub fn process_samples(dev: usize, last_seen_us: u64) -> Vec<Sample> {
    let sh = shared();
    let period_us = sh.nvml_period_us.load(Ordering::Relaxed).max(1);
    let period_ns = period_us * 1000;
    let offset_us = sh.clock_offset_us.load(Ordering::Relaxed);
    queue::advanced(dev, |now| {
        let Some(newest) = (now / period_ns).checked_sub(1) else {
            return Vec::new();
        };
        // The first period that ends after `last_seen_us`.
        let k0 = (last_seen_us.saturating_sub(offset_us) / period_us)
            .max((newest + 1).saturating_sub(MAX_PERIODS));
        if k0 > newest {
            return Vec::new();
        }
        let n = (newest - k0 + 1) as usize;
        // (pid as the caller sees it, first period, busy per period) of
        // every process; those the caller cannot see still take their share.
        let procs: Vec<(Option<u32>, u64, Vec<u64>)> = sh
            .procs
            .iter()
            .filter(|p| p.pid.load(Ordering::Acquire) > 0)
            .filter_map(|p| {
                let (oldest, _) = intervals(p, dev).last()?;
                let busy = busy_per_period(p, dev, k0, n, period_ns);
                Some((state::reported_pid(p), oldest / period_ns, busy))
            })
            .collect();
        let mut got = vec![vec![0.0; n]; procs.len()];
        for j in 0..n {
            let busy: Vec<u64> = procs.iter().map(|(_, _, b)| b[j]).collect();
            for (i, g) in attribute(k0 + j as u64, dev, &busy, period_ns)
                .into_iter()
                .enumerate()
            {
                got[i][j] = g;
            }
        }
        let timestamp_us = (newest + 1) * period_us + offset_us;
        procs
            .iter()
            .zip(got)
            .filter_map(|((pid, first, _), got)| {
                // A process's window starts at its first period.
                let first = first.saturating_sub(k0).min(n as u64 - 1) as usize;
                let sum: f64 = got[first..].iter().sum();
                let mean = sum / (n - first) as f64;
                if sum == 0.0 {
                    return None;
                }
                Some(Sample {
                    pid: (*pid)?,
                    sm: (mean * 100.0).round().min(100.0) as u32,
                    timestamp_us,
                })
            })
            .collect()
    })
}

/// The device's busy percentage over the last second.
pub fn device_percent(dev: usize) -> u32 {
    queue::advanced(dev, |now| {
        let t0 = now.saturating_sub(1_000_000_000);
        let busy: u64 = shared()
            .procs
            .iter()
            .map(|p| {
                intervals(p, dev)
                    .take_while(|&(_, e)| e > t0)
                    .map(|(s, e)| e.min(now).saturating_sub(s.max(t0)))
                    .sum::<u64>()
            })
            .sum();
        (busy as f64 / 1e7).round().min(100.0) as u32
    })
}
