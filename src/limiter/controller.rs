//! The feedback controller: steers the bucket's refill scale so that the
//! utilisation NVML measures for the container meets the limit. Event
//! timing of isolated short kernels overstates their cost by the launch
//! latency (57 µs measured for a 52.7 µs kernel on an H200), and streams
//! overlap; the scale corrects both.
#![forbid(unsafe_code)]

pub const MIN_SCALE: f64 = 0.5;
pub const MAX_SCALE: f64 = 4.0;
/// Relative errors below this are left alone (samples are whole percents).
const DEADBAND: f64 = 0.01;
/// Fraction of the log-error corrected per step: NVML samples lag by
/// 200-400 ms, so full steps would overshoot.
const GAIN: f64 = 0.6;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Controller {
    scale: f64,
}

impl Controller {
    pub fn new(scale: f64) -> Controller {
        Controller {
            scale: scale.clamp(MIN_SCALE, MAX_SCALE),
        }
    }

    #[cfg(test)]
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// One step. `target` and `measured` are fractions of the device;
    /// `throttled` says whether any launch waited on the bucket since the
    /// last step. Below target without throttling, the workload itself is
    /// the limit: the scale is left alone rather than wound up.
    pub fn update(&mut self, target: f64, measured: f64, throttled: bool) -> f64 {
        if !(measured > 0.0 && target > 0.0) {
            return self.scale;
        }
        let ratio = target / measured;
        if (ratio - 1.0).abs() < DEADBAND || (ratio > 1.0 && !throttled) {
            return self.scale;
        }
        let step = pow_gain(ratio).clamp(0.8, 1.25);
        self.scale = (self.scale * step).clamp(MIN_SCALE, MAX_SCALE);
        self.scale
    }
}

/// `x^GAIN` (GAIN = 3/5) for the ratios that give an unclamped step
/// (0.8^(5/3) to 1.25^(5/3)), as the fifth root of x³ by Newton's method.
/// Written out so that the library does not need libm.so.6 for one `pow`
/// (a dependency costs every exec of every process that preloads us).
fn pow_gain(x: f64) -> f64 {
    const _: () = assert!(GAIN == 0.6);
    let a = x.clamp(0.6, 1.5).powi(3);
    let mut y = 1.0f64;
    for _ in 0..8 {
        y = (4.0 * y + a / y.powi(4)) / 5.0;
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plant whose utilisation is `bias * target * scale` (a cost
    /// estimate off by `bias`), measured with one step of lag.
    fn converge(bias: f64, target: f64) -> (f64, f64) {
        let mut c = Controller::new(1.0);
        let mut measured = bias * target;
        for _ in 0..12 {
            let s = c.update(target, measured, true);
            measured = (bias * target * s).min(1.0);
        }
        (c.scale(), measured)
    }

    #[test]
    fn corrects_biased_costs_within_a_few_steps() {
        for bias in [0.9, 0.7, 1.2] {
            for target in [0.1, 0.3, 0.6, 0.9] {
                let (_, m) = converge(bias, target);
                assert!(
                    (m - target).abs() / target < 0.02,
                    "bias {bias} target {target}: {m}"
                );
            }
        }
    }

    #[test]
    fn pow_gain_matches_powf_where_the_step_is_not_clamped() {
        for i in 0..=1000 {
            let x = 0.6 + 0.9 * f64::from(i) / 1000.0;
            let want = x.powf(GAIN);
            assert!((pow_gain(x) - want).abs() < 1e-12, "{x}: {}", pow_gain(x));
        }
    }

    #[test]
    fn does_not_wind_up_when_the_workload_is_light() {
        let mut c = Controller::new(1.0);
        for _ in 0..20 {
            c.update(0.5, 0.1, false);
        }
        assert_eq!(c.scale(), 1.0);
        // ...but over the limit it always pulls back.
        c.update(0.3, 0.6, false);
        assert!(c.scale() < 1.0);
    }

    #[test]
    fn stays_in_bounds_and_ignores_empty_samples() {
        let mut c = Controller::new(1.0);
        for _ in 0..50 {
            c.update(0.9, 0.01, true);
        }
        assert_eq!(c.scale(), MAX_SCALE);
        assert_eq!(c.update(0.9, 0.0, true), MAX_SCALE);
    }
}
