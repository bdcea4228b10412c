//! The encoder and the fold-back, carried out as the core hands out their steps.

use super::*;

impl Run {
    /// One step of the encoder: begins one, or carries out its next step.
    pub(super) fn encode(&mut self) -> Result<(), String> {
        let Some(e) = &self.encoder else {
            let region = self.rng.below(self.regions);
            let fold_back = self.recorded[region as usize] != Region::Mirror;
            if self.core.encode_begin(region).is_ok() {
                self.encoder = Some(Encoder {
                    region,
                    id: self.seq * 1000 + region + 1,
                    place: None,
                    read: Vec::new(),
                    fold_back,
                    trim: None,
                });
            }
            return Ok(());
        };
        let (region, place) = (e.region, e.place);
        if let Some((blocks, nodes, stale)) = self.encoder.as_mut().and_then(|e| e.trim.take()) {
            // A lost node misses it (and fails it).
            let mut ok = true;
            for n in nodes {
                let node = &mut self.nodes[n as usize - 1];
                ok &= node.up;
                if node.up {
                    for &b in &blocks {
                        node.trim(b);
                    }
                }
            }
            // The replaced stripe: nothing may read it now (a failure is only space).
            for c in stale {
                let node = &mut self.nodes[c.node as usize - 1];
                if node.up {
                    node.slots.retain(|&(r, slot, chunk, _), _| {
                        (r, slot, chunk) != (c.region, c.slot, c.chunk)
                    });
                }
            }
            return self.answer_encode(region, ok);
        }
        let step = match self.core.encode_next(region, place) {
            // The core abandoned it (a resync of one of its nodes began).
            None => {
                trace!(self, "encode {region} abandoned by the core");
                if let Some(p) = self.encoder.take().and_then(|e| e.place) {
                    self.release(p);
                }
                self.counts.abandoned += 1;
                return Ok(());
            }
            Some(EncodeAction::Do(s)) => s,
            Some(EncodeAction::Hold { start, end }) => {
                let phase = self.core.region_map().and_then(|m| m.step(region));
                let sabotaged = match phase {
                    Some(EncodeStep::Read { .. }) => self.sabotage == Sabotage::ReadWithoutHold,
                    _ => self.sabotage == Sabotage::FreeWithoutHold,
                };
                if sabotaged {
                    self.core.region_map().and_then(|m| m.step(region)).unwrap()
                } else {
                    if place.is_none() {
                        let p = match self.core.step(Input::Hold { start, end }).pop() {
                            Some(Action::Proceed { place: Some(p), .. })
                            | Some(Action::Wait { place: p }) => p,
                            other => return Err(format!("an encode's hold: {other:?}")),
                        };
                        self.encoder.as_mut().unwrap().place = Some(p);
                    }
                    return Ok(());
                }
            }
        };
        if let EncodeStep::Free {
            blocks,
            nodes,
            stale,
        } = step
        {
            trace!(
                self,
                "encode {region}: trim {blocks:?} on {nodes:?} sent, and {} stale chunks",
                stale.len()
            );
            self.encoder.as_mut().unwrap().trim = Some((blocks, nodes, stale));
            return Ok(());
        }
        trace!(self, "encode {region}: {step:?}");
        let ok = self.carry(region, step)?;
        self.answer_encode(region, ok)
    }

    /// The encode's step went well (`ok`) or failed; its hold, if any, is given up.
    pub(super) fn answer_encode(&mut self, region: u64, ok: bool) -> Result<(), String> {
        let end = self.core.encode_answered(region, ok);
        trace!(self, "encode {region} answered {ok}: {end:?}");
        if let Some(p) = self.encoder.as_mut().and_then(|e| e.place.take()) {
            self.release(p);
        }
        if end != EncodeEnd::Going {
            let e = self.encoder.take().unwrap();
            match (end, e.fold_back) {
                (EncodeEnd::Done, false) => self.counts.encodes += 1,
                (EncodeEnd::Done, true) => self.counts.fold_backs += 1,
                _ => self.counts.abandoned += 1,
            }
        }
        Ok(())
    }

    /// Carries out one step of the encode of `region`; whether it went well.
    pub(super) fn carry(&mut self, region: u64, step: EncodeStep) -> Result<bool, String> {
        let k = usize::from(self.parity.data);
        match step {
            EncodeStep::Read { .. } => {
                let first = region * self.region_blocks();
                let mut read = Vec::new();
                for at in 0..HOT {
                    let mut values = Vec::with_capacity(k);
                    for c in 0..k as u64 {
                        values.push(self.read(first + c * CHUNK_BLOCKS + at)?);
                    }
                    read.push(values);
                }
                self.encoder.as_mut().unwrap().read = read;
                Ok(true)
            }
            EncodeStep::Write { slot, chunks, .. } => {
                let e = self.encoder.as_ref().unwrap();
                let (id, read) = (e.id, e.read.clone());
                let skip = (self.sabotage == Sabotage::ChunkNotWritten).then(|| chunks[0].node);
                let mut ok = true;
                for c in &chunks {
                    let node = &mut self.nodes[c.node as usize - 1];
                    ok &= node.up;
                    if !node.up || skip == Some(c.node) {
                        continue;
                    }
                    for (at, values) in read.iter().enumerate() {
                        let cell = Cell {
                            encode: id,
                            data: values.clone(),
                        };
                        node.slots.insert((region, slot, c.chunk, at as u64), cell);
                    }
                }
                Ok(ok)
            }
            EncodeStep::Flush { nodes } => {
                let mut ok = true;
                for n in nodes {
                    let node = &mut self.nodes[n as usize - 1];
                    ok &= node.up;
                    if node.up && self.sabotage != Sabotage::FlushSkipped {
                        node.flush();
                    }
                }
                Ok(ok)
            }
            EncodeStep::Switch { to, .. } => {
                // The record's write may fail (etcd away): the region reads as before.
                if self.rng.chance(0.1) {
                    return Ok(false);
                }
                self.recorded[region as usize] = to;
                Ok(true)
            }
            EncodeStep::Free { .. } => Err("a trim is sent, not carried at once".into()),
        }
    }
}
