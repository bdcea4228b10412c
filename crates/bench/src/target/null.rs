//! The null target: every I/O completes at once, nothing is stored. Measures the harness.

#[derive(Debug)]
pub struct NullTarget {
    size: u64,
}

impl NullTarget {
    pub fn new(size: u64) -> NullTarget {
        NullTarget { size }
    }
    pub fn size(&self) -> u64 {
        self.size
    }
}
