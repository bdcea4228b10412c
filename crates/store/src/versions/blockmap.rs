//! A version's map from logical block to [`Entry`]: a persistent radix tree on the block
//! number, built for the write path's lookup.
//!
//! Each level takes six bits of the block number; a node keeps only the slots in use, as a
//! bitmap and a packed vector (the bitmap's rank of a slot is its index). A lookup is one
//! step per level, each an array index with no search: two levels of branches cover a 1 GiB
//! volume's 2^18 blocks, four a 4 TiB one's. The B-tree it replaced (`imbl::OrdMap`) searched
//! up to 64 keys per node and spent most of a redirected write's bookkeeping on cache misses
//! (`examples/redirect_cost.rs`).
//!
//! Nodes are shared between maps (`Arc`), so a clone — a snapshot of the head — costs a
//! pointer whatever the map's size; a change copies the nodes on its path that another map
//! still shares. [`BlockMap::diff`] skips the subtrees two maps share, so the difference
//! between neighbouring versions costs what changed between them.
//!
//! Memory: about 16 bytes an entry where entries are dense (a leaf of 64 blocks full); a
//! lone entry far from any other costs a leaf and a branch of its own, about 150 bytes.

use std::sync::Arc;

use super::table::Entry;

/// Bits of the block number per level.
const BITS: u32 = 6;
/// Levels a 64-bit block number needs at most.
const MAX_HEIGHT: u32 = 64_u32.div_ceil(BITS) - 1;

/// Slots in use of one node: a bitmap and the items of its set bits, in order.
#[derive(Debug, Clone)]
struct Slots<T> {
    bits: u64,
    items: Vec<T>,
}

impl<T> Slots<T> {
    fn new() -> Slots<T> {
        Slots {
            bits: 0,
            items: Vec::new(),
        }
    }
    fn rank(&self, i: u32) -> usize {
        (self.bits & ((1u64 << i) - 1)).count_ones() as usize
    }
    fn has(&self, i: u32) -> bool {
        (self.bits >> i) & 1 == 1
    }
    fn get(&self, i: u32) -> Option<&T> {
        self.has(i).then(|| &self.items[self.rank(i)])
    }
    fn get_mut(&mut self, i: u32) -> Option<&mut T> {
        let r = self.rank(i);
        self.has(i).then(|| &mut self.items[r])
    }
    /// Sets slot `i`; its item before, if it had one.
    fn set(&mut self, i: u32, v: T) -> Option<T> {
        let r = self.rank(i);
        if self.has(i) {
            return Some(std::mem::replace(&mut self.items[r], v));
        }
        self.bits |= 1 << i;
        self.items.insert(r, v);
        None
    }
    fn take(&mut self, i: u32) -> Option<T> {
        if !self.has(i) {
            return None;
        }
        let r = self.rank(i);
        self.bits &= !(1 << i);
        Some(self.items.remove(r))
    }
    /// The slots in use, in order, with their items.
    fn iter(&self) -> impl Iterator<Item = (u32, &T)> + '_ {
        SetBits(self.bits).zip(self.items.iter())
    }
}

/// The set bits of a word, lowest first.
#[derive(Debug)]
struct SetBits(u64);

impl Iterator for SetBits {
    type Item = u32;
    fn next(&mut self) -> Option<u32> {
        if self.0 == 0 {
            return None;
        }
        let i = self.0.trailing_zeros();
        self.0 &= self.0 - 1;
        Some(i)
    }
}

#[derive(Debug, Clone)]
enum Node {
    /// Level 0: entries by the block number's low six bits.
    Leaf(Slots<Entry>),
    Branch(Slots<Arc<Node>>),
}

impl Node {
    fn empty(level: u32) -> Node {
        match level {
            0 => Node::Leaf(Slots::new()),
            _ => Node::Branch(Slots::new()),
        }
    }
    fn bits(&self) -> u64 {
        match self {
            Node::Leaf(s) => s.bits,
            Node::Branch(s) => s.bits,
        }
    }
}

/// Slot of block `key` in a node at `level`.
fn slot(key: u64, level: u32) -> u32 {
    ((key >> (BITS * level)) & ((1 << BITS) - 1)) as u32
}

/// True if a tree of `height` levels of branches reaches block `key`.
fn reaches(height: u32, key: u64) -> bool {
    key.checked_shr(BITS * (height + 1)).unwrap_or(0) == 0
}

/// The first block a subtree at `level`, slot `i` of a node whose first block is `base`, holds;
/// wide enough for the top level's last slot.
fn child_base(base: u128, level: u32, i: u32) -> u128 {
    base + ((i as u128) << (BITS * level))
}

/// One difference between two maps, as [`BlockMap::diff`] gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Only the second map has an entry for the block.
    Add(u64, Entry),
    /// Only the first map has one.
    Remove(u64, Entry),
    /// Both have one, not the same.
    Update { key: u64, old: Entry, new: Entry },
}

/// A persistent map from logical block to [`Entry`] (see the module docs).
#[derive(Clone, Default)]
pub struct BlockMap {
    root: Option<Arc<Node>>,
    /// Levels of branches above the leaves.
    height: u32,
    len: usize,
}

impl BlockMap {
    pub fn new() -> BlockMap {
        BlockMap::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, key: &u64) -> Option<&Entry> {
        let key = *key;
        if !reaches(self.height, key) {
            return None;
        }
        let mut node = self.root.as_deref()?;
        let mut level = self.height;
        loop {
            match node {
                Node::Leaf(s) => return s.get(slot(key, 0)),
                Node::Branch(s) => {
                    node = s.get(slot(key, level))?;
                    level -= 1;
                }
            }
        }
    }

    pub fn contains_key(&self, key: &u64) -> bool {
        self.get(key).is_some()
    }

    /// Sets the entry of `key`; the one it had, if any.
    pub fn insert(&mut self, key: u64, e: Entry) -> Option<Entry> {
        if self.root.is_none() {
            self.height = 0;
        }
        while !reaches(self.height, key) {
            // The tree grows a level on top: the old root becomes slot 0 of the new.
            if let Some(old) = self.root.take() {
                let mut s = Slots::new();
                s.set(0, old);
                self.root = Some(Arc::new(Node::Branch(s)));
            }
            self.height += 1;
            debug_assert!(self.height <= MAX_HEIGHT);
        }
        let height = self.height;
        let root = self
            .root
            .get_or_insert_with(|| Arc::new(Node::empty(height)));
        let old = insert_at(root, height, key, e);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// Drops the entry of `key`; the one it had, if any.
    pub fn remove(&mut self, key: &u64) -> Option<Entry> {
        // A miss copies nothing another map shares.
        self.get(key)?;
        let root = self.root.as_mut()?;
        let old = remove_at(root, self.height, *key);
        if old.is_some() {
            self.len -= 1;
        }
        if self.len == 0 {
            self.root = None;
            self.height = 0;
        }
        old
    }

    /// The entries in block order.
    pub fn iter(&self) -> Iter<'_> {
        self.range(0..=u64::MAX)
    }

    pub fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = Entry> + '_ {
        self.iter().map(|(_, e)| e)
    }

    /// The entries of blocks in `r`, in block order.
    pub fn range(&self, r: impl std::ops::RangeBounds<u64>) -> Iter<'_> {
        use std::ops::Bound;
        let lo = match r.start_bound() {
            Bound::Included(&a) => Some(a),
            Bound::Excluded(&a) => a.checked_add(1),
            Bound::Unbounded => Some(0),
        };
        let hi = match r.end_bound() {
            Bound::Included(&b) => Some(b),
            Bound::Excluded(&b) => b.checked_sub(1),
            Bound::Unbounded => Some(u64::MAX),
        };
        let mut it = Iter {
            stack: Vec::new(),
            lo: 0,
            hi: 0,
        };
        if let (Some(lo), Some(hi), Some(root)) = (lo, hi, self.root.as_deref()) {
            if lo <= hi {
                it.lo = lo;
                it.hi = hi;
                it.push(root, self.height, 0);
            }
        }
        it
    }

    /// What differs from `self` to `other`, in block order. Subtrees the two share are
    /// skipped unvisited.
    pub fn diff(&self, other: &BlockMap) -> Vec<Change> {
        let height = self.height.max(other.height);
        let (a, b) = (self.lifted(height), other.lifted(height));
        let mut out = Vec::new();
        diff_nodes(a.as_ref(), b.as_ref(), height, 0, &mut out);
        out
    }

    /// The root as a tree of `height` levels of branches (`height` at least the map's own):
    /// the root under a chain of slot-0 branches, sharing it.
    fn lifted(&self, height: u32) -> Option<Arc<Node>> {
        let mut node = self.root.clone()?;
        for _ in self.height..height {
            let mut s = Slots::new();
            s.set(0, node);
            node = Arc::new(Node::Branch(s));
        }
        Some(node)
    }
}

fn insert_at(node: &mut Arc<Node>, level: u32, key: u64, e: Entry) -> Option<Entry> {
    match Arc::make_mut(node) {
        Node::Leaf(s) => s.set(slot(key, 0), e),
        Node::Branch(s) => {
            let i = slot(key, level);
            if let Some(child) = s.get_mut(i) {
                return insert_at(child, level - 1, key, e);
            }
            let mut child = Arc::new(Node::empty(level - 1));
            insert_at(&mut child, level - 1, key, e);
            s.set(i, child);
            None
        }
    }
}

/// Drops `key` under `node` (which holds it); a child left empty goes from its parent.
fn remove_at(node: &mut Arc<Node>, level: u32, key: u64) -> Option<Entry> {
    match Arc::make_mut(node) {
        Node::Leaf(s) => s.take(slot(key, 0)),
        Node::Branch(s) => {
            let i = slot(key, level);
            let child = s.get_mut(i)?;
            let old = remove_at(child, level - 1, key);
            if child.bits() == 0 {
                s.take(i);
            }
            old
        }
    }
}

/// Every entry under `node` (at `level`, its first block `base`) as `f` makes it a change.
fn all_under(
    node: &Node,
    level: u32,
    base: u128,
    f: fn(u64, Entry) -> Change,
    out: &mut Vec<Change>,
) {
    match node {
        Node::Leaf(s) => out.extend(s.iter().map(|(i, &e)| f((base + i as u128) as u64, e))),
        Node::Branch(s) => {
            for (i, c) in s.iter() {
                all_under(c, level - 1, child_base(base, level, i), f, out);
            }
        }
    }
}

fn diff_nodes(
    a: Option<&Arc<Node>>,
    b: Option<&Arc<Node>>,
    level: u32,
    base: u128,
    out: &mut Vec<Change>,
) {
    match (a, b) {
        (None, None) => {}
        (Some(a), Some(b)) if Arc::ptr_eq(a, b) => {}
        (Some(a), None) => all_under(a, level, base, Change::Remove, out),
        (None, Some(b)) => all_under(b, level, base, Change::Add, out),
        (Some(a), Some(b)) => match (&**a, &**b) {
            (Node::Leaf(x), Node::Leaf(y)) => {
                for i in SetBits(x.bits | y.bits) {
                    let key = (base + i as u128) as u64;
                    match (x.get(i), y.get(i)) {
                        (Some(&old), Some(&new)) if old != new => {
                            out.push(Change::Update { key, old, new })
                        }
                        (Some(&old), None) => out.push(Change::Remove(key, old)),
                        (None, Some(&new)) => out.push(Change::Add(key, new)),
                        _ => {}
                    }
                }
            }
            (Node::Branch(x), Node::Branch(y)) => {
                for i in SetBits(x.bits | y.bits) {
                    let at = child_base(base, level, i);
                    diff_nodes(x.get(i), y.get(i), level - 1, at, out);
                }
            }
            _ => unreachable!("two maps' nodes at one level are of one kind"),
        },
    }
}

/// The entries of a range of blocks, in order ([`BlockMap::range`]).
#[derive(Debug)]
pub struct Iter<'a> {
    /// Nodes being walked: the node, its level, its first block, its slots still to visit.
    stack: Vec<(&'a Node, u32, u128, SetBits)>,
    lo: u64,
    hi: u64,
}

impl<'a> Iter<'a> {
    /// Walks `node` next, only its slots whose blocks meet `lo..=hi`.
    fn push(&mut self, node: &'a Node, level: u32, base: u128) {
        let span = BITS * level;
        let first = match (self.lo as u128).checked_sub(base) {
            Some(d) => (d >> span).min(64) as u32,
            None => 0,
        };
        let last = match (self.hi as u128).checked_sub(base) {
            Some(d) => (d >> span).min(63) as u32,
            None => return,
        };
        if first > last {
            return;
        }
        let wanted = (u64::MAX >> (63 - last)) & (u64::MAX << first);
        self.stack
            .push((node, level, base, SetBits(node.bits() & wanted)));
    }
}

impl Iterator for Iter<'_> {
    type Item = (u64, Entry);
    fn next(&mut self) -> Option<(u64, Entry)> {
        loop {
            let (node, level, base, rest) = self.stack.last_mut()?;
            let Some(i) = rest.next() else {
                self.stack.pop();
                continue;
            };
            let (node, level, base) = (*node, *level, *base);
            match node {
                Node::Leaf(s) => {
                    let e = s.items[s.rank(i)];
                    return Some(((base + i as u128) as u64, e));
                }
                Node::Branch(s) => {
                    let child = &s.items[s.rank(i)];
                    self.push(child, level - 1, child_base(base, level, i));
                }
            }
        }
    }
}

impl std::fmt::Debug for BlockMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl PartialEq for BlockMap {
    fn eq(&self, other: &BlockMap) -> bool {
        self.len == other.len && self.diff(other).is_empty()
    }
}

impl Eq for BlockMap {}

impl FromIterator<(u64, Entry)> for BlockMap {
    fn from_iter<I: IntoIterator<Item = (u64, Entry)>>(iter: I) -> BlockMap {
        let mut m = BlockMap::new();
        for (k, e) in iter {
            m.insert(k, e);
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn e(phys: u64) -> Entry {
        Entry { phys, birth: 1 }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u64),
        Remove(u64),
        /// Keep a copy of the map as it is (a snapshot).
        Keep,
    }

    /// Keys near one another (to fill nodes), and some anywhere in the 64 bits.
    fn key() -> impl Strategy<Value = u64> {
        prop_oneof![
            4 => 0u64..300,
            2 => 0u64..(1 << 20),
            1 => any::<u64>(),
            1 => (u64::MAX - 100)..=u64::MAX,
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (key(), 0u64..1000).prop_map(|(k, p)| Op::Insert(k, p)),
            3 => key().prop_map(Op::Remove),
            1 => Just(Op::Keep),
        ]
    }

    fn model_diff(a: &BTreeMap<u64, Entry>, b: &BTreeMap<u64, Entry>) -> Vec<Change> {
        let keys: std::collections::BTreeSet<u64> = a.keys().chain(b.keys()).copied().collect();
        keys.into_iter()
            .filter_map(|k| match (a.get(&k), b.get(&k)) {
                (Some(&old), Some(&new)) if old != new => Some(Change::Update { key: k, old, new }),
                (Some(&old), None) => Some(Change::Remove(k, old)),
                (None, Some(&new)) => Some(Change::Add(k, new)),
                _ => None,
            })
            .collect()
    }

    fn same(m: &BlockMap, model: &BTreeMap<u64, Entry>) -> Result<(), TestCaseError> {
        prop_assert_eq!(m.len(), model.len());
        prop_assert_eq!(m.is_empty(), model.is_empty());
        let got: Vec<(u64, Entry)> = m.iter().collect();
        let want: Vec<(u64, Entry)> = model.iter().map(|(&k, &e)| (k, e)).collect();
        prop_assert_eq!(got, want);
        for (&k, &v) in model {
            prop_assert_eq!(m.get(&k), Some(&v));
        }
        Ok(())
    }

    proptest! {
        /// Against a `BTreeMap`: every lookup, the order, ranges and differences, and the
        /// copies kept along the way stay as they were when kept.
        #[test]
        fn behaves_as_an_ordered_map(ops in proptest::collection::vec(op(), 1..200), probes in proptest::collection::vec((key(), key()), 8)) {
            let mut m = BlockMap::new();
            let mut model: BTreeMap<u64, Entry> = BTreeMap::new();
            let mut kept: Vec<(BlockMap, BTreeMap<u64, Entry>)> = Vec::new();
            for o in ops {
                match o {
                    Op::Insert(k, p) => prop_assert_eq!(m.insert(k, e(p)), model.insert(k, e(p))),
                    Op::Remove(k) => prop_assert_eq!(m.remove(&k), model.remove(&k)),
                    Op::Keep => kept.push((m.clone(), model.clone())),
                }
            }
            same(&m, &model)?;
            for &(a, b) in &probes {
                prop_assert_eq!(m.get(&a), model.get(&a));
                let (lo, hi) = (a.min(b), a.max(b));
                let got: Vec<(u64, Entry)> = m.range(lo..=hi).collect();
                let want: Vec<(u64, Entry)> = model.range(lo..=hi).map(|(&k, &e)| (k, e)).collect();
                prop_assert_eq!(got, want);
                let got: Vec<(u64, Entry)> = m.range(lo..hi).collect();
                let want: Vec<(u64, Entry)> = model.range(lo..hi).map(|(&k, &e)| (k, e)).collect();
                prop_assert_eq!(got, want);
            }
            for (km, kmodel) in &kept {
                same(km, kmodel)?;
                prop_assert_eq!(km.diff(&m), model_diff(kmodel, &model));
                prop_assert_eq!(m.diff(km), model_diff(&model, kmodel));
                prop_assert_eq!(km == &m, kmodel == &model);
            }
        }
    }

    #[test]
    fn a_copy_shares_its_nodes_and_a_change_copies_only_its_path() {
        let mut head: BlockMap = (0..4096u64).map(|k| (k, e(k + 10_000))).collect();
        let snap = head.clone();
        head.insert(5, e(1));
        // The snapshot still reads its own entry, and the difference is the one block.
        assert_eq!(snap.get(&5), Some(&e(10_005)));
        assert_eq!(
            snap.diff(&head),
            vec![Change::Update {
                key: 5,
                old: e(10_005),
                new: e(1)
            }]
        );
        // Only the path to block 5 was copied: the other leaves are the snapshot's.
        let (Some(Node::Branch(a)), Some(Node::Branch(b))) =
            (head.root.as_deref(), snap.root.as_deref())
        else {
            panic!("4,096 blocks take a branch");
        };
        let shared = a
            .iter()
            .zip(b.iter())
            .filter(|((_, x), (_, y))| Arc::ptr_eq(x, y))
            .count();
        assert_eq!(shared, 63);
    }

    #[test]
    fn the_tree_grows_and_empties() {
        let mut m = BlockMap::new();
        m.insert(3, e(1));
        assert_eq!(m.height, 0);
        m.insert(u64::MAX, e(2));
        assert_eq!(m.height, MAX_HEIGHT);
        assert_eq!(m.get(&3), Some(&e(1)));
        assert_eq!(m.keys().collect::<Vec<_>>(), vec![3, u64::MAX]);
        assert_eq!(m.remove(&u64::MAX), Some(e(2)));
        assert_eq!(m.remove(&3), Some(e(1)));
        assert!(m.is_empty() && m.root.is_none());
        assert_eq!(m.remove(&3), None);
    }
}
