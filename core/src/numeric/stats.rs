//! The statistics of an acquisition's samples, pure: count, extremes, mean, median, sample
//! standard deviation, rms, skewness, kurtosis, and process capability against limits.
//!
//! Two passes: the mean first, then the moments of the deviations from it, with the corrected
//! two-pass formula for the variance, so a large offset (1e6 ± 1e-3) loses nothing. A
//! statistic the samples cannot give (the deviation of one sample, the skewness of constant
//! samples, anything of a non-finite sample) is `None`, never NaN.

use serde_json::{Value as Json, json};

/// Specification limits for Cp and Cpk.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub lsl: f64,
    pub usl: f64,
}

/// The statistics of a set of samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    pub count: usize,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub range: Option<f64>,
    pub mean: Option<f64>,
    pub median: Option<f64>,
    /// The sample standard deviation (n − 1), from 2 samples on.
    pub stdev: Option<f64>,
    pub rms: Option<f64>,
    /// The adjusted Fisher–Pearson skewness (as spreadsheets' SKEW), from 3 samples that vary.
    pub skewness: Option<f64>,
    /// The sample excess kurtosis (as spreadsheets' KURT), from 4 samples that vary.
    pub kurtosis: Option<f64>,
    /// With limits: `(usl − lsl) / 6σ` and `min(usl − mean, mean − lsl) / 3σ`; `None` inside
    /// when σ is 0 or unknown. `None` outside when no limits were given.
    pub capability: Option<(Option<f64>, Option<f64>)>,
}

fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

impl Stats {
    /// The statistics of `samples`, with Cp and Cpk when `limits` are given.
    pub fn of(samples: &[f64], limits: Option<Limits>) -> Stats {
        let count = samples.len();
        let none = Stats {
            count,
            min: None,
            max: None,
            range: None,
            mean: None,
            median: None,
            stdev: None,
            rms: None,
            skewness: None,
            kurtosis: None,
            capability: limits.map(|_| (None, None)),
        };
        if count == 0 || samples.iter().any(|x| !x.is_finite()) {
            return none;
        }
        let n = count as f64;
        let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
        // Kahan-summed mean: the first pass.
        let (mut sum, mut carry) = (0.0f64, 0.0f64);
        for &x in samples {
            min = min.min(x);
            max = max.max(x);
            let y = x - carry;
            let t = sum + y;
            carry = (t - sum) - y;
            sum = t;
        }
        let mean0 = sum / n;
        // Second pass: moments of the deviations; Σd corrects the mean's rounding.
        let (mut s1, mut s2, mut s3, mut s4) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        for &x in samples {
            let d = x - mean0;
            let d2 = d * d;
            s1 += d;
            s2 += d2;
            s3 += d2 * d;
            s4 += d2 * d2;
        }
        let mean = mean0 + s1 / n;
        // Corrected two-pass sum of squares about the mean.
        let m2_sum = (s2 - s1 * s1 / n).max(0.0);
        let stdev = (count >= 2).then(|| (m2_sum / (n - 1.0)).sqrt());
        // Population central moments (the small Σd correction is below rounding for m3, m4).
        let m2 = m2_sum / n;
        let m3 = s3 / n;
        let m4 = s4 / n;
        // Constant samples: no shape. "Constant" allows the rounding of the mean itself.
        let varies = m2 > (f64::EPSILON * mean.abs()).powi(2) && max > min;
        let skewness = (count >= 3 && varies).then(|| {
            let g1 = m3 / m2.powf(1.5);
            g1 * (n * (n - 1.0)).sqrt() / (n - 2.0)
        });
        let kurtosis = (count >= 4 && varies).then(|| {
            let g2 = m4 / (m2 * m2) - 3.0;
            ((n + 1.0) * g2 + 6.0) * (n - 1.0) / ((n - 2.0) * (n - 3.0))
        });
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let median = if count % 2 == 1 {
            sorted[count / 2]
        } else {
            let (a, b) = (sorted[count / 2 - 1], sorted[count / 2]);
            a + (b - a) / 2.0
        };
        let rms = (mean * mean + m2).sqrt();
        let capability = limits.map(|Limits { lsl, usl }| match stdev {
            Some(sigma) if sigma > 0.0 => (
                finite((usl - lsl) / (6.0 * sigma)),
                finite((usl - mean).min(mean - lsl) / (3.0 * sigma)),
            ),
            _ => (None, None),
        });
        Stats {
            count,
            min: Some(min),
            max: Some(max),
            range: finite(max - min),
            mean: finite(mean),
            median: finite(median),
            stdev: stdev.and_then(finite),
            rms: finite(rms),
            skewness: skewness.and_then(finite),
            kurtosis: kurtosis.and_then(finite),
            capability,
        }
    }

    /// As `accordionq2/numeric_results.py` 5.28.1 lists it (`NumericAcquisition.stats`):
    /// `count`, the statistics (null when unknown), and `cp`/`cpk`
    /// only when limits were given.
    pub fn to_json(&self) -> Json {
        let mut doc = json!({
            "count": self.count,
            "min": self.min,
            "max": self.max,
            "range": self.range,
            "mean": self.mean,
            "median": self.median,
            "stdev": self.stdev,
            "rms": self.rms,
            "skewness": self.skewness,
            "kurtosis": self.kurtosis,
        });
        if let (Some((cp, cpk)), Some(map)) = (self.capability, doc.as_object_mut()) {
            map.insert("cp".into(), json!(cp));
            map.insert("cpk".into(), json!(cpk));
        }
        doc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: Option<f64>, want: f64, tolerance: f64) {
        let got = got.expect("a value");
        assert!(
            (got - want).abs() <= tolerance,
            "got {got}, want {want} ± {tolerance}"
        );
    }

    #[test]
    fn a_known_small_set() {
        // 2 4 4 4 5 5 7 9: mean 5, population σ 2, sample σ √(32/7).
        let xs = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
        let s = Stats::of(
            &xs,
            Some(Limits {
                lsl: 0.0,
                usl: 12.0,
            }),
        );
        assert_eq!(s.count, 8);
        assert_eq!((s.min, s.max, s.range), (Some(2.0), Some(9.0), Some(7.0)));
        close(s.mean, 5.0, 1e-15);
        close(s.median, 4.5, 1e-15);
        let sigma = (32.0f64 / 7.0).sqrt();
        close(s.stdev, sigma, 1e-14);
        close(s.rms, (232.0f64 / 8.0).sqrt(), 1e-14);
        // Spreadsheet SKEW and KURT of the same data.
        close(s.skewness, 0.818_487_553_5, 1e-9);
        close(s.kurtosis, 0.940_625, 1e-9);
        let (cp, cpk) = s.capability.expect("limits were given");
        close(cp, 12.0 / (6.0 * sigma), 1e-14);
        close(cpk, 5.0 / (3.0 * sigma), 1e-14);
    }

    #[test]
    fn one_sample_gives_no_spread_and_no_nan() {
        let s = Stats::of(&[3.3], Some(Limits { lsl: 3.2, usl: 3.4 }));
        assert_eq!(
            (s.count, s.mean, s.median, s.min),
            (1, Some(3.3), Some(3.3), Some(3.3))
        );
        assert_eq!((s.stdev, s.skewness, s.kurtosis), (None, None, None));
        assert_eq!(s.capability, Some((None, None)));
        let doc = s.to_json();
        assert!(doc["stdev"].is_null() && doc["cp"].is_null() && doc["cpk"].is_null());
        assert_eq!(doc["count"], 1);
    }

    #[test]
    fn constant_samples_have_zero_spread_and_no_shape() {
        let s = Stats::of(&[1e6 + 0.1; 1000], Some(Limits { lsl: 0.0, usl: 2e6 }));
        assert_eq!(s.stdev, Some(0.0));
        assert_eq!(s.range, Some(0.0));
        assert_eq!((s.skewness, s.kurtosis), (None, None));
        assert_eq!(
            s.capability,
            Some((None, None)),
            "σ = 0: no finite capability"
        );
        close(s.rms, 1e6 + 0.1, 1e-9);
    }

    /// 100 000 samples of 1e6 ± 1e-3 (alternating): the naive Σx² − n·mean² formula loses
    /// every digit here; the two-pass one keeps them.
    #[test]
    fn a_large_offset_keeps_the_spread() {
        let xs: Vec<f64> = (0..100_000)
            .map(|i| if i % 2 == 0 { 1e6 + 1e-3 } else { 1e6 - 1e-3 })
            .collect();
        let s = Stats::of(&xs, None);
        close(s.mean, 1e6, 1e-9);
        // Sample σ of ±a alternating over even n: a·√(n/(n−1)).
        let want = 1e-3 * (100_000.0f64 / 99_999.0).sqrt();
        close(s.stdev, want, want * 1e-6);
        close(s.skewness, 0.0, 1e-6);
        close(s.kurtosis, -2.0, 1e-3);
        assert_eq!(s.capability, None);
        assert!(s.to_json().get("cp").is_none(), "no limits: no cp");
    }

    #[test]
    fn a_non_finite_sample_makes_every_statistic_unknown() {
        let s = Stats::of(&[1.0, f64::NAN, 2.0], None);
        assert_eq!(s.count, 3);
        assert_eq!((s.mean, s.min, s.stdev), (None, None, None));
        let text = s.to_json().to_string();
        assert!(!text.contains("NaN"), "{text}");
        assert_eq!(Stats::of(&[], None).mean, None);
    }

    #[test]
    fn an_off_centre_process_has_a_smaller_cpk() {
        let xs: Vec<f64> = (0..1000)
            .map(|i| 3.35 + 0.01 * ((i % 7) as f64 - 3.0))
            .collect();
        let s = Stats::of(&xs, Some(Limits { lsl: 3.2, usl: 3.4 }));
        let (cp, cpk) = s.capability.unwrap();
        assert!(cpk.unwrap() < cp.unwrap());
    }
}
