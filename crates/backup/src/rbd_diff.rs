//! Ceph's `rbd export-diff` stream (Ceph's `doc/dev/rbd-diff.rst`), versions 1 and 2: what
//! `rbd import-diff` reads, so a diff moves between trireme and Ceph RBD.
//!
//! A stream is a header line, metadata records (the snapshot it starts from, the one it ends
//! at, the image size), data records (bytes written at an offset, or a range zeroed), and an
//! end record. In version 2 each record's tag is followed by the length of what follows, so a
//! reader skips tags it does not know. We read both, and write version 1 unless asked for 2:
//! version 1 is what `rbd export-diff` writes and the only one `rbd import-diff` and `rbd
//! merge-diff` read (Ceph writes version 2 only inside `rbd export --export-format 2` images).
//!
//! The reader trusts nothing: names are bounded, every range is checked against the size
//! before it is used, a write record's data is handed out in pieces of at most
//! [`MAX_PIECE`], so no length in the stream makes it allocate more.

use std::io::{Read, Write};

pub const HEADER_V1: &[u8] = b"rbd diff v1\n";
pub const HEADER_V2: &[u8] = b"rbd diff v2\n";
/// Most bytes of a write record handed out at once.
pub const MAX_PIECE: u64 = 4 << 20;
/// Longest snapshot name accepted.
pub const MAX_NAME: usize = 4096;
/// Longest unknown (skipped) metadata record accepted.
const MAX_SKIP: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not an rbd diff: {0}")]
    Format(String),
}

fn bad(what: impl Into<String>) -> DiffError {
    DiffError::Format(what.into())
}

/// One thing a diff says, in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// The snapshot the diff starts from (absent: from an empty image).
    From(String),
    /// The snapshot the diff ends at (absent: the image's head).
    To(String),
    /// The image's size at the end.
    Size(u64),
    /// `data` belongs at `offset` (a long write record comes as several, in order).
    Write { offset: u64, data: Vec<u8> },
    /// `[offset, offset+len)` reads as zeros.
    Zero { offset: u64, len: u64 },
    /// The end: nothing follows.
    End,
}

/// Which version of the stream to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Version {
    /// `rbd export-diff`'s, which `rbd import-diff` reads.
    #[default]
    V1,
    /// With a length after each tag, as inside `rbd export --export-format 2`.
    V2,
}

impl Version {
    /// Version `n` (1 or 2), as `rbd`'s `--export-format` numbers them.
    pub fn numbered(n: u8) -> Option<Version> {
        match n {
            1 => Some(Version::V1),
            2 => Some(Version::V2),
            _ => None,
        }
    }
}

/// Writes a diff.
#[derive(Debug)]
pub struct DiffWriter<W: Write> {
    w: W,
    size: u64,
    version: Version,
    /// Bytes written so far, header included.
    pub bytes: u64,
}

impl<W: Write> DiffWriter<W> {
    /// Starts a diff of `version` from snapshot `from` (or an empty image) to `to` (or the
    /// head) of an image of `size` bytes.
    pub fn new(
        mut w: W,
        from: Option<&str>,
        to: Option<&str>,
        size: u64,
        version: Version,
    ) -> Result<DiffWriter<W>, DiffError> {
        let header = match version {
            Version::V1 => HEADER_V1,
            Version::V2 => HEADER_V2,
        };
        w.write_all(header)?;
        let mut d = DiffWriter {
            w,
            size,
            version,
            bytes: header.len() as u64,
        };
        for (tag, name) in [(b'f', from), (b't', to)] {
            if let Some(n) = name {
                let mut b = (n.len() as u32).to_le_bytes().to_vec();
                b.extend_from_slice(n.as_bytes());
                d.record(tag, &b, &[])?;
            }
        }
        d.record(b's', &size.to_le_bytes(), &[])?;
        Ok(d)
    }

    fn record(&mut self, tag: u8, head: &[u8], data: &[u8]) -> Result<(), DiffError> {
        let len = (head.len() + data.len()) as u64;
        self.w.write_all(&[tag])?;
        self.bytes += 1 + len;
        if self.version == Version::V2 {
            self.w.write_all(&len.to_le_bytes())?;
            self.bytes += 8;
        }
        self.w.write_all(head)?;
        self.w.write_all(data)?;
        Ok(())
    }

    fn range(&self, offset: u64, len: u64) -> Result<[u8; 16], DiffError> {
        if offset.checked_add(len).is_none_or(|e| e > self.size) {
            return Err(bad(format!(
                "range {offset}+{len} past the image's {} bytes",
                self.size
            )));
        }
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&offset.to_le_bytes());
        b[8..].copy_from_slice(&len.to_le_bytes());
        Ok(b)
    }

    /// `data` at `offset`.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), DiffError> {
        let h = self.range(offset, data.len() as u64)?;
        self.record(b'w', &h, data)
    }

    /// Zeros over `[offset, offset+len)`.
    pub fn zero(&mut self, offset: u64, len: u64) -> Result<(), DiffError> {
        let h = self.range(offset, len)?;
        self.record(b'z', &h, &[])
    }

    /// Writes the end record and flushes; the writer back.
    pub fn finish(mut self) -> Result<W, DiffError> {
        self.w.write_all(b"e")?;
        self.bytes += 1;
        self.w.flush()?;
        Ok(self.w)
    }
}

/// Reads a diff of either version, record by record.
#[derive(Debug)]
pub struct DiffReader<R: Read> {
    r: R,
    v2: bool,
    size: Option<u64>,
    /// Data records have begun (metadata after them is refused).
    in_data: bool,
    /// The rest of a write record being handed out: where, and how many bytes.
    rest: Option<(u64, u64)>,
    done: bool,
}

impl<R: Read> DiffReader<R> {
    /// Reads the header.
    pub fn new(mut r: R) -> Result<DiffReader<R>, DiffError> {
        let mut h = [0u8; 12];
        r.read_exact(&mut h)
            .map_err(|_| bad("shorter than its 12-byte header"))?;
        let v2 = match &h[..] {
            HEADER_V2 => true,
            HEADER_V1 => false,
            _ => {
                return Err(bad(format!(
                    "header {:?} is neither \"rbd diff v1\" nor \"rbd diff v2\"",
                    String::from_utf8_lossy(&h)
                )))
            }
        };
        Ok(DiffReader {
            r,
            v2,
            size: None,
            in_data: false,
            rest: None,
            done: false,
        })
    }

    /// The image's size, once its record has been read.
    pub fn size(&self) -> Option<u64> {
        self.size
    }

    fn u8(&mut self) -> Result<u8, DiffError> {
        let mut b = [0u8; 1];
        self.r.read_exact(&mut b).map_err(eof)?;
        Ok(b[0])
    }

    fn u32(&mut self) -> Result<u32, DiffError> {
        let mut b = [0u8; 4];
        self.r.read_exact(&mut b).map_err(eof)?;
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> Result<u64, DiffError> {
        let mut b = [0u8; 8];
        self.r.read_exact(&mut b).map_err(eof)?;
        Ok(u64::from_le_bytes(b))
    }

    /// A version 2 record's length, which must be `want` (or, for `None`, is returned).
    fn length(&mut self, tag: u8, want: Option<u64>) -> Result<u64, DiffError> {
        if !self.v2 {
            return Ok(want.unwrap_or(0));
        }
        let n = self.u64()?;
        match want {
            Some(w) if w != n => Err(bad(format!(
                "record '{}' says it is {n} bytes long, not {w}",
                tag as char
            ))),
            _ => Ok(n),
        }
    }

    fn name(&mut self, tag: u8) -> Result<String, DiffError> {
        if self.in_data {
            return Err(bad("a snapshot name after the data records"));
        }
        let outer = if self.v2 {
            Some(self.length(tag, None)?)
        } else {
            None
        };
        let n = self.u32()? as usize;
        if n > MAX_NAME {
            return Err(bad(format!("a {n}-byte snapshot name")));
        }
        if outer.is_some_and(|o| o != 4 + n as u64) {
            return Err(bad(format!(
                "record '{}' length disagrees with its name's",
                tag as char
            )));
        }
        let mut b = vec![0u8; n];
        self.r.read_exact(&mut b).map_err(eof)?;
        String::from_utf8(b).map_err(|_| bad("a snapshot name that is not UTF-8"))
    }

    fn range(&mut self, tag: u8, data: bool) -> Result<(u64, u64), DiffError> {
        let Some(size) = self.size else {
            return Err(bad("a data record before the size record"));
        };
        let outer = if self.v2 {
            Some(self.length(tag, None)?)
        } else {
            None
        };
        let (offset, len) = (self.u64()?, self.u64()?);
        let want = if data { len.checked_add(16) } else { Some(16) };
        if outer.is_some() && outer != want {
            return Err(bad(format!(
                "record '{}' length disagrees with its range",
                tag as char
            )));
        }
        if offset.checked_add(len).is_none_or(|e| e > size) {
            return Err(bad(format!(
                "range {offset}+{len} past the image's {size} bytes"
            )));
        }
        self.in_data = true;
        Ok((offset, len))
    }

    fn piece(&mut self, offset: u64, len: u64) -> Result<Record, DiffError> {
        let n = len.min(MAX_PIECE);
        let mut data = vec![0u8; n as usize];
        self.r.read_exact(&mut data).map_err(eof)?;
        self.rest = (len > n).then_some((offset + n, len - n));
        Ok(Record::Write { offset, data })
    }

    /// The next record; after [`Record::End`], `End` again.
    pub fn next_record(&mut self) -> Result<Record, DiffError> {
        if self.done {
            return Ok(Record::End);
        }
        if let Some((offset, len)) = self.rest.take() {
            return self.piece(offset, len);
        }
        loop {
            let tag = self.u8()?;
            return match tag {
                b'f' => Ok(Record::From(self.name(tag)?)),
                b't' => Ok(Record::To(self.name(tag)?)),
                b's' => {
                    if self.in_data {
                        return Err(bad("a size record after the data records"));
                    }
                    self.length(tag, Some(8))?;
                    let s = self.u64()?;
                    self.size = Some(s);
                    Ok(Record::Size(s))
                }
                b'w' => {
                    let (offset, len) = self.range(tag, true)?;
                    if len == 0 {
                        continue;
                    }
                    self.piece(offset, len)
                }
                b'z' => {
                    let (offset, len) = self.range(tag, false)?;
                    Ok(Record::Zero { offset, len })
                }
                b'e' => {
                    self.done = true;
                    Ok(Record::End)
                }
                other if self.v2 && !self.in_data => {
                    // A metadata record of a newer writer: skipped, as v2 allows.
                    let n = self.u64()?;
                    if n > MAX_SKIP {
                        return Err(bad(format!("unknown record {other:#04x} of {n} bytes")));
                    }
                    std::io::copy(&mut (&mut self.r).take(n), &mut std::io::sink())?;
                    continue;
                }
                other => Err(bad(format!("unknown record tag {other:#04x}"))),
            };
        }
    }
}

fn eof(e: std::io::Error) -> DiffError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        bad("it ends before its end record (cut short?)")
    } else {
        DiffError::Io(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(b: &[u8]) -> Result<Vec<Record>, DiffError> {
        let mut r = DiffReader::new(b)?;
        let mut out = Vec::new();
        loop {
            let rec = r.next_record()?;
            if rec == Record::End {
                return Ok(out);
            }
            out.push(rec);
        }
    }

    #[test]
    fn a_written_diff_reads_back_in_either_version() {
        for v in [Version::V1, Version::V2] {
            let mut w = DiffWriter::new(Vec::new(), Some("a"), Some("bb"), 1 << 20, v).unwrap();
            w.write(4096, &[7; 100]).unwrap();
            w.zero(8192, 4096).unwrap();
            assert!(w.write((1 << 20) - 10, &[1; 11]).is_err());
            let counted = w.bytes + 1;
            let b = w.finish().unwrap();
            assert_eq!(counted, b.len() as u64, "{v:?}: bytes counted");
            assert_eq!(
                all(&b).unwrap(),
                vec![
                    Record::From("a".into()),
                    Record::To("bb".into()),
                    Record::Size(1 << 20),
                    Record::Write {
                        offset: 4096,
                        data: vec![7; 100]
                    },
                    Record::Zero {
                        offset: 8192,
                        len: 4096
                    },
                ],
                "{v:?}"
            );
        }
    }

    /// A version 1 stream, laid out by hand from Ceph's description: read, and written byte
    /// for byte the same.
    #[test]
    fn version_1_is_ceph_s_layout() {
        let mut b = HEADER_V1.to_vec();
        b.push(b't');
        b.extend_from_slice(&2u32.to_le_bytes());
        b.extend_from_slice(b"s1");
        b.push(b's');
        b.extend_from_slice(&65536u64.to_le_bytes());
        b.push(b'w');
        b.extend_from_slice(&512u64.to_le_bytes());
        b.extend_from_slice(&3u64.to_le_bytes());
        b.extend_from_slice(b"abc");
        b.push(b'z');
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&512u64.to_le_bytes());
        b.push(b'e');
        assert_eq!(
            all(&b).unwrap(),
            vec![
                Record::To("s1".into()),
                Record::Size(65536),
                Record::Write {
                    offset: 512,
                    data: b"abc".to_vec()
                },
                Record::Zero {
                    offset: 0,
                    len: 512
                },
            ]
        );
        let mut w = DiffWriter::new(Vec::new(), None, Some("s1"), 65536, Version::V1).unwrap();
        w.write(512, b"abc").unwrap();
        w.zero(0, 512).unwrap();
        assert_eq!(w.finish().unwrap(), b);
    }

    #[test]
    fn long_writes_come_in_pieces_and_unknown_metadata_is_skipped() {
        let mut w = DiffWriter::new(Vec::new(), None, None, 16 << 20, Version::V2).unwrap();
        let data: Vec<u8> = (0..(MAX_PIECE + 5)).map(|i| i as u8).collect();
        w.write(1, &data).unwrap();
        let mut b = w.finish().unwrap();
        // An unknown metadata record right after the header.
        let mut x = HEADER_V2.to_vec();
        x.push(b'q');
        x.extend_from_slice(&3u64.to_le_bytes());
        x.extend_from_slice(b"xyz");
        x.extend_from_slice(&b[12..]);
        b = x;
        let recs = all(&b).unwrap();
        assert_eq!(recs.len(), 3);
        let Record::Write { offset, data: d } = &recs[1] else {
            panic!("{:?}", recs[1])
        };
        assert_eq!((*offset, d.len() as u64), (1, MAX_PIECE));
        let Record::Write { offset, data: d2 } = &recs[2] else {
            panic!("{:?}", recs[2])
        };
        assert_eq!((*offset, d2.len()), (1 + MAX_PIECE, 5));
        assert_eq!([&d[..], &d2[..]].concat(), data);
    }

    #[test]
    fn damage_is_refused_with_a_reason() {
        let mut w = DiffWriter::new(Vec::new(), None, Some("s"), 8192, Version::default()).unwrap();
        w.write(0, &[1; 4096]).unwrap();
        let good = w.finish().unwrap();
        assert!(all(&good).is_ok());
        // Cut short anywhere: an error, never a panic or a silent success.
        for n in 0..good.len() - 1 {
            assert!(all(&good[..n]).is_err(), "cut at {n}");
        }
        let mut b = good.clone();
        b[0] = b'x';
        assert!(all(&b).unwrap_err().to_string().contains("header"));
        // A write past the size.
        let mut w = DiffWriter::new(Vec::new(), None, None, 1 << 30, Version::V1).unwrap();
        w.write((1 << 30) - 4096, &[1; 4096]).unwrap();
        let mut b = w.finish().unwrap();
        let at = b.len() - 1 - 4096 - 16;
        b[at..at + 8].copy_from_slice(&(1u64 << 31).to_le_bytes());
        assert!(all(&b).unwrap_err().to_string().contains("past"));
        // A data record with no size before it.
        let mut b = HEADER_V2.to_vec();
        b.push(b'z');
        b.extend_from_slice(&16u64.to_le_bytes());
        b.extend_from_slice(&[0; 16]);
        assert!(all(&b).unwrap_err().to_string().contains("size"));
        // A huge name length.
        let mut b = HEADER_V2.to_vec();
        b.push(b'f');
        b.extend_from_slice(&(4u64 + u32::MAX as u64).to_le_bytes());
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(all(&b).is_err());
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_decode_without_panic(b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let mut x = HEADER_V2.to_vec();
            x.extend_from_slice(&b);
            let _ = all(&x);
        }
    }
}
