//! An exposition: the families of samples one scrape returns, gathered by whoever knows them,
//! then encoded by `prometheus-client` in the OpenMetrics text format.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use crate::histogram::{bound_seconds, HistSnapshot, BUCKETS};

/// The content type of [`Exposition::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A sample's labels, in the order given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels(pub Vec<(String, String)>);

impl Labels {
    pub fn new() -> Labels {
        Labels(Vec::new())
    }

    pub fn with(mut self, key: &str, value: impl std::fmt::Display) -> Labels {
        self.0.push((key.to_string(), value.to_string()));
        self
    }
}

/// What a scalar family counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only grows (the encoder adds `_total` to its name).
    Counter,
    Gauge,
}

#[derive(Debug)]
enum Samples {
    Scalar(Kind, Vec<(Labels, f64)>),
    Histogram(Vec<(Labels, HistSnapshot)>),
}

#[derive(Debug)]
struct Family {
    name: String,
    help: String,
    samples: Samples,
}

/// The families of one scrape.
#[derive(Debug, Default)]
pub struct Exposition {
    families: Vec<Family>,
}

impl Exposition {
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Adds samples to family `name` (made with `help` and `kind` at its first samples).
    pub fn family(&mut self, name: &str, help: &str, kind: Kind, samples: Vec<(Labels, f64)>) {
        match self.families.iter_mut().find(|f| f.name == name) {
            Some(Family {
                samples: Samples::Scalar(k, s),
                ..
            }) if *k == kind => s.extend(samples),
            Some(f) => panic!("metric family {} given twice with different types", f.name),
            None => self.families.push(Family {
                name: name.to_string(),
                help: help.to_string(),
                samples: Samples::Scalar(kind, samples),
            }),
        }
    }

    /// One sample of a family.
    pub fn sample(&mut self, name: &str, help: &str, kind: Kind, labels: Labels, value: f64) {
        self.family(name, help, kind, vec![(labels, value)]);
    }

    pub fn histograms(&mut self, name: &str, help: &str, samples: Vec<(Labels, HistSnapshot)>) {
        self.families.push(Family {
            name: name.to_string(),
            help: help.to_string(),
            samples: Samples::Histogram(samples),
        });
    }

    /// True if a family of that name is here.
    pub fn has(&self, name: &str) -> bool {
        self.families.iter().any(|f| f.name == name)
    }

    /// The OpenMetrics text ([`CONTENT_TYPE`]), ending in `# EOF`.
    pub fn encode(self) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(self));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("writing to a String does not fail");
        out
    }
}

impl Collector for Exposition {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        for f in &self.families {
            match &f.samples {
                Samples::Scalar(kind, samples) => {
                    let t = match kind {
                        Kind::Counter => MetricType::Counter,
                        Kind::Gauge => MetricType::Gauge,
                    };
                    let mut m = encoder.encode_descriptor(&f.name, &f.help, None, t)?;
                    for (labels, v) in samples {
                        let mut s = m.encode_family(&labels.0)?;
                        match kind {
                            Kind::Counter => s.encode_counter::<NoLabelSet, f64, f64>(v, None)?,
                            Kind::Gauge => s.encode_gauge(v)?,
                        }
                    }
                }
                Samples::Histogram(samples) => {
                    let mut m =
                        encoder.encode_descriptor(&f.name, &f.help, None, MetricType::Histogram)?;
                    for (labels, h) in samples {
                        let buckets: [(f64, u64); BUCKETS] =
                            std::array::from_fn(|i| (bound_seconds(i), h.buckets[i]));
                        m.encode_family(&labels.0)?.encode_histogram::<NoLabelSet>(
                            h.sum_ns as f64 / 1e9,
                            h.count,
                            &buckets,
                            None,
                        )?;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::histogram::Histogram;

    #[test]
    fn encodes_counters_gauges_and_histograms() {
        let mut e = Exposition::new();
        e.sample(
            "trireme_node_up",
            "1 if the node answers.",
            Kind::Gauge,
            Labels::new().with("node", 2),
            1.0,
        );
        e.family(
            "trireme_volume_ops",
            "Requests.",
            Kind::Counter,
            vec![(Labels::new().with("volume", "v").with("op", "read"), 7.0)],
        );
        let h = Histogram::default();
        h.record(std::time::Duration::from_micros(100));
        h.record(std::time::Duration::from_millis(3));
        e.histograms(
            "trireme_volume_op_duration_seconds",
            "Latency.",
            vec![(Labels::new().with("volume", "v"), h.snapshot())],
        );
        let text = e.encode();
        assert!(text.contains("trireme_node_up{node=\"2\"} 1"), "{text}");
        assert!(text.contains("# TYPE trireme_volume_ops counter"), "{text}");
        assert!(
            text.contains("trireme_volume_ops_total{volume=\"v\",op=\"read\"} 7"),
            "{text}"
        );
        assert!(
            text.contains("trireme_volume_op_duration_seconds_bucket{le=\"+Inf\",volume=\"v\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("trireme_volume_op_duration_seconds_count{volume=\"v\"} 2"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
