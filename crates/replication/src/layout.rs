//! A volume's layout: how its bytes are kept on its nodes, and what that costs and buys.
//!
//! - **Mirror** (every volume today): every copy holds every byte; N copies survive N-1 lost
//!   nodes and keep 1/N of the raw space usable.
//! - **Parity** (issue 67): mirror-accelerated parity. Stripes of K data and M parity chunks
//!   on K+M nodes; hot data lands in a mirror of M+1 copies (as many losses as the parity
//!   survives) covering a share of the volume, and cold regions are encoded in the
//!   background. The type, its bounds and its arithmetic are here; the geometry is
//!   `stripes.rs`'s.
//!
//! A record written by a newer trireme with a layout this build does not know reads back as
//! [`Layout::Unknown`]: refused too, never taken for a mirror (a writer that mirrored into a
//! parity volume's chunks would destroy them).

use serde::{Deserialize, Serialize};

/// Bounds of a parity layout. K below 2 is a mirror; past 16 a stripe's small writes and
/// rebuild reads span too many nodes. M up to 3: three lost nodes at once, as a 4-way mirror.
pub const DATA_CHUNKS: std::ops::RangeInclusive<u8> = 2..=16;
pub const PARITY_CHUNKS: std::ops::RangeInclusive<u8> = 1..=3;
/// The mirrored share, in percent: some room for writes to land, and short of a whole
/// mirror (a volume all mirrored is `--replicas M+1`).
pub const MIRROR_SHARE: std::ops::RangeInclusive<u8> = 1..=99;
/// The mirrored share when none is asked: S2D's default proportion for mirror-accelerated
/// parity is about a fifth mirror.
pub const DEFAULT_MIRROR_SHARE: u8 = 20;

/// How a volume's bytes are kept (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Layout {
    /// Every copy holds every byte.
    #[default]
    Mirror,
    /// K+M parity with a mirrored share for hot writes.
    Parity(Parity),
    /// A layout a newer trireme wrote, which this build cannot read or write.
    #[serde(other)]
    Unknown,
}

/// A parity layout: `data`+`parity` chunks per stripe, `mirror_share` percent mirrored.
///
/// A record is checked against the bounds as it is read: a corrupt or hand-edited record
/// with K = 0 would otherwise reach the stripe arithmetic (a division by a zero-length
/// region), so it fails to decode and the metadata reports the key as corrupt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "ParityRecord")]
pub struct Parity {
    pub data: u8,
    pub parity: u8,
    pub mirror_share: u8,
}

/// A parity layout as stored, before its bounds are checked.
#[derive(Deserialize)]
struct ParityRecord {
    data: u32,
    parity: u32,
    mirror_share: u32,
}

impl TryFrom<ParityRecord> for Parity {
    type Error = LayoutError;

    fn try_from(r: ParityRecord) -> Result<Parity, LayoutError> {
        Parity::new(r.data, r.parity, r.mirror_share)
    }
}

/// Why a layout is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("parity `{0}` is not of the form K+M (e.g. 2+1 or 4+2)")]
    Syntax(String),
    #[error("parity {data}+{parity}: K (data chunks) must be 2..=16")]
    DataChunks { data: u32, parity: u32 },
    #[error("parity {data}+{parity}: M (parity chunks) must be 1..=3")]
    ParityChunks { data: u32, parity: u32 },
    #[error("mirror share {0}%: must be 1..=99 (a volume all mirrored is --replicas)")]
    MirrorShare(u32),
    #[error("the volume's layout was written by a newer trireme; attach it with that version")]
    Unknown,
    #[error("a parity {data}+{parity} volume needs {} copies, one per node; it lists {got}", data + parity)]
    StripeNodes { data: u8, parity: u8, got: usize },
    #[error("parity volumes: {0} is not built yet")]
    NotBuilt(&'static str),
    #[error("the volume's region record names {recorded} regions; the volume has {regions}")]
    Regions { recorded: usize, regions: usize },
}

impl Parity {
    /// `K+M` (`2+1`, `4+2`) with a mirrored share in percent (None: the default).
    pub fn parse(spec: &str, mirror_share: Option<u32>) -> Result<Parity, LayoutError> {
        let syntax = || LayoutError::Syntax(spec.to_string());
        let (k, m) = spec.trim().split_once('+').ok_or_else(syntax)?;
        let number = |s: &str| match s.trim() {
            t if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => {
                t.parse::<u32>().map_err(|_| syntax())
            }
            _ => Err(syntax()),
        };
        let share = mirror_share.unwrap_or(u32::from(DEFAULT_MIRROR_SHARE));
        Parity::new(number(k)?, number(m)?, share)
    }

    /// K data and M parity chunks with `share` percent mirrored, each within its bounds.
    pub fn new(data: u32, parity: u32, share: u32) -> Result<Parity, LayoutError> {
        let fits = |n: u32, r: &std::ops::RangeInclusive<u8>| {
            u8::try_from(n).ok().filter(|n| r.contains(n))
        };
        let d = fits(data, &DATA_CHUNKS).ok_or(LayoutError::DataChunks { data, parity })?;
        let p = fits(parity, &PARITY_CHUNKS).ok_or(LayoutError::ParityChunks { data, parity })?;
        let s = fits(share, &MIRROR_SHARE).ok_or(LayoutError::MirrorShare(share))?;
        Ok(Parity {
            data: d,
            parity: p,
            mirror_share: s,
        })
    }
}

impl Layout {
    pub fn is_mirror(&self) -> bool {
        *self == Layout::Mirror
    }

    /// Whether this build's writer serves it: a mirror and parity; not a layout of a newer
    /// trireme.
    pub fn served(&self) -> Result<(), LayoutError> {
        match self {
            Layout::Mirror | Layout::Parity(_) => Ok(()),
            Layout::Unknown => Err(LayoutError::Unknown),
        }
    }

    /// The size of each node's copy of a volume of `size` bytes: the volume's for a mirror;
    /// for parity, a stride per region (its mirrored blocks and two chunk slots, see
    /// [`Stripes::node_block`](crate::Stripes::node_block)).
    pub fn replica_size(&self, size: u64) -> u64 {
        match self {
            Layout::Parity(p) => {
                let region = crate::CHUNK_BLOCKS * u64::from(p.data);
                let stride = region + crate::CHUNK_SLOTS * crate::CHUNK_BLOCKS;
                size.div_ceil(4096).div_ceil(region) * stride * 4096
            }
            _ => size,
        }
    }

    /// How many nodes it spans with `copies` copies (a mirror's count; a parity stripe's K+M).
    pub fn nodes(&self, copies: usize) -> usize {
        match self {
            Layout::Parity(p) => usize::from(p.data + p.parity),
            _ => copies,
        }
    }

    /// How many nodes it may lose at once and lose nothing.
    pub fn losses_tolerated(&self, copies: usize) -> usize {
        match self {
            Layout::Parity(p) => usize::from(p.parity),
            _ => copies.saturating_sub(1),
        }
    }

    /// Raw bytes stored per byte written, with `copies` copies: N for a mirror; for parity,
    /// the mirrored share at M+1 copies and the rest at (K+M)/K.
    pub fn raw_per_byte(&self, copies: usize) -> f64 {
        match self {
            Layout::Parity(p) => {
                let share = f64::from(p.mirror_share) / 100.0;
                let (k, m) = (f64::from(p.data), f64::from(p.parity));
                share * (m + 1.0) + (1.0 - share) * (k + m) / k
            }
            _ => copies.max(1) as f64,
        }
    }

    /// The fraction of raw space a user can fill: 1/3 for a 3-way mirror, 0.56 for 4+2 with
    /// a fifth mirrored.
    pub fn usable_to_raw(&self, copies: usize) -> f64 {
        1.0 / self.raw_per_byte(copies)
    }

    /// One line for people: `mirror, 3 copies, survives 2 lost nodes, 33% of raw usable`.
    pub fn summary(&self, copies: usize) -> String {
        let lost = self.losses_tolerated(copies);
        let what = match self {
            Layout::Mirror => format!("mirror, {copies} cop{}", plural(copies, "y", "ies")),
            Layout::Parity(p) => format!(
                "parity {}+{} on {} nodes, {}% mirrored on {} copies",
                p.data,
                p.parity,
                self.nodes(copies),
                p.mirror_share,
                p.parity + 1
            ),
            Layout::Unknown => return "a layout of a newer trireme".to_string(),
        };
        format!(
            "{what}, survives {lost} lost node{}, {:.0}% of raw usable",
            plural(lost, "", "s"),
            self.usable_to_raw(copies) * 100.0
        )
    }
}

fn plural(n: usize, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 {
        one
    } else {
        many
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Layout::Mirror => write!(f, "mirror"),
            Layout::Parity(p) => write!(
                f,
                "parity {}+{} ({}% mirrored)",
                p.data, p.parity, p.mirror_share
            ),
            Layout::Unknown => write!(f, "unknown"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parity(spec: &str, share: Option<u32>) -> Layout {
        Layout::Parity(Parity::parse(spec, share).unwrap())
    }

    #[test]
    fn parity_specs_parse_within_bounds_and_refuse_the_rest() {
        assert_eq!(
            Parity::parse(" 4+2 ", None),
            Ok(Parity {
                data: 4,
                parity: 2,
                mirror_share: 20
            })
        );
        assert_eq!(Parity::parse("2+1", Some(50)).unwrap().mirror_share, 50);
        for bad in [
            "",
            "4",
            "4+",
            "+2",
            "4-2",
            "4+2+1",
            "a+b",
            "-1+2",
            "4+ 2x",
            "99999999999+1",
        ] {
            assert!(
                matches!(Parity::parse(bad, None), Err(LayoutError::Syntax(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            Parity::parse("1+1", None),
            Err(LayoutError::DataChunks { .. })
        ));
        assert!(matches!(
            Parity::parse("17+2", None),
            Err(LayoutError::DataChunks { .. })
        ));
        assert!(matches!(
            Parity::parse("4+0", None),
            Err(LayoutError::ParityChunks { .. })
        ));
        assert!(matches!(
            Parity::parse("4+4", None),
            Err(LayoutError::ParityChunks { .. })
        ));
        assert_eq!(
            Parity::parse("4+2", Some(0)),
            Err(LayoutError::MirrorShare(0))
        );
        assert_eq!(
            Parity::parse("4+2", Some(100)),
            Err(LayoutError::MirrorShare(100))
        );
        // A message names what was asked.
        let e = Parity::parse("300+1", None).unwrap_err().to_string();
        assert!(e.contains("300+1"), "{e}");
    }

    #[test]
    fn a_stored_parity_layout_out_of_bounds_fails_to_decode() {
        let read = |json: &str| serde_json::from_str::<Layout>(json);
        let good = r#"{"kind":"parity","data":4,"parity":2,"mirror_share":20}"#;
        assert_eq!(read(good).unwrap(), parity("4+2", Some(20)));
        for bad in [
            r#"{"kind":"parity","data":0,"parity":2,"mirror_share":20}"#,
            r#"{"kind":"parity","data":4,"parity":0,"mirror_share":20}"#,
            r#"{"kind":"parity","data":4,"parity":9,"mirror_share":20}"#,
            r#"{"kind":"parity","data":4,"parity":2,"mirror_share":0}"#,
            r#"{"kind":"parity","data":4,"parity":2,"mirror_share":100}"#,
            r#"{"kind":"parity","data":300,"parity":2,"mirror_share":20}"#,
            r#"{"kind":"parity","data":4,"parity":2}"#,
        ] {
            let e = read(bad).expect_err(bad).to_string();
            assert!(e.contains("must be") || e.contains("missing"), "{bad}: {e}");
        }
        // A layout this build does not know is still `Unknown`, not an error.
        assert_eq!(read(r#"{"kind":"lrc","k":8}"#).unwrap(), Layout::Unknown);
    }

    #[test]
    fn capacity_is_what_the_issue_promises() {
        assert!((Layout::Mirror.usable_to_raw(3) - 1.0 / 3.0).abs() < 1e-9);
        assert!((Layout::Mirror.usable_to_raw(2) - 0.5).abs() < 1e-9);
        // 4+2 with a fifth mirrored on 3 copies: 1 / (0.2*3 + 0.8*1.5) = 0.556, the goal
        // being 55% or better.
        let p = parity("4+2", None);
        assert!((p.usable_to_raw(0) - 1.0 / 1.8).abs() < 1e-9);
        assert!(p.usable_to_raw(0) >= 0.55);
        assert_eq!((p.nodes(0), p.losses_tolerated(0)), (6, 2));
        // As the share shrinks, parity's own ratio (K/(K+M)) is the bound.
        assert!(parity("4+2", Some(1)).usable_to_raw(0) < 4.0 / 6.0);
        assert!(parity("4+2", Some(1)).usable_to_raw(0) > 0.65);
        assert_eq!(parity("2+1", None).losses_tolerated(0), 1);
    }

    #[test]
    fn mirrors_and_parity_are_served_and_an_unknown_layout_is_never_a_mirror() {
        assert_eq!(Layout::Mirror.served(), Ok(()));
        assert_eq!(parity("2+1", None).served(), Ok(()));
        // A copy's size is the geometry's, for any volume size.
        for (spec, size) in [
            ("2+1", 4096),
            ("4+2", 1 << 30),
            ("3+2", 5 << 20),
            ("16+3", 12288),
        ] {
            let p = Parity::parse(spec, None).unwrap();
            let nodes = (1..=u32::from(p.data + p.parity)).collect();
            let s = crate::Stripes::new(&p, nodes).unwrap();
            assert_eq!(
                Layout::Parity(p).replica_size(size),
                s.replica_blocks(size / 4096) * 4096,
                "{spec}"
            );
        }
        assert_eq!(Layout::Mirror.replica_size(12288), 12288);
        let newer: Layout = serde_json::from_str(r#"{"kind":"striped","width":8}"#).unwrap();
        assert_eq!(newer, Layout::Unknown);
        assert_eq!(newer.served(), Err(LayoutError::Unknown));
        // The record's encoding, both ways.
        let p = parity("4+2", Some(30));
        let s = serde_json::to_string(&p).unwrap();
        assert_eq!(
            s,
            r#"{"kind":"parity","data":4,"parity":2,"mirror_share":30}"#
        );
        assert_eq!(serde_json::from_str::<Layout>(&s).unwrap(), p);
        assert_eq!(
            serde_json::from_str::<Layout>(r#"{"kind":"mirror"}"#).unwrap(),
            Layout::Mirror
        );
    }

    #[test]
    fn summaries_say_cost_and_protection() {
        assert_eq!(
            Layout::Mirror.summary(3),
            "mirror, 3 copies, survives 2 lost nodes, 33% of raw usable"
        );
        assert_eq!(
            Layout::Mirror.summary(1),
            "mirror, 1 copy, survives 0 lost nodes, 100% of raw usable"
        );
        assert_eq!(
            parity("4+2", None).summary(0),
            "parity 4+2 on 6 nodes, 20% mirrored on 3 copies, survives 2 lost nodes, 56% of raw usable"
        );
    }
}
