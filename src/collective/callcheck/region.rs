//! The identities of a call's buffers that other processes can map, exchanged with the
//! call header so ranks of one job never use one memory in one call (an IPC import on
//! one rank of another rank's exported buffer).

use crate::collective::api::call::Call;
#[cfg(feature = "ipc")]
use crate::collective::api::call::Kind;
use crate::error::{Error, Result};

/// A byte range of memory other processes may map (an IPC import, or an allocation this
/// process exported), named the same in every process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Region {
    /// 0: the send buffer; 1: the receive buffer.
    pub(crate) role: u8,
    /// The allocation's key (`ipc::shared_identity`).
    pub(crate) key: [u8; 81],
    /// Byte offsets in the allocation: `[lo, hi)`.
    pub(crate) lo: u64,
    pub(crate) hi: u64,
}

/// The encoded length of a [`Region`]: role, key, lo, hi.
pub(crate) const REGION_BYTES: usize = 98;

impl Region {
    /// Whether `self` and `other` share a byte.
    pub(crate) fn overlaps(&self, other: &Region) -> bool {
        self.key == other.key && self.lo < other.hi && other.lo < self.hi
    }

    fn role_name(&self) -> &'static str {
        if self.role == 0 { "send" } else { "receive" }
    }
}

/// Appends `regions` in their wire form.
pub(crate) fn encode_into(regions: &[Region], out: &mut Vec<u8>) {
    for r in regions {
        out.push(r.role);
        out.extend_from_slice(&r.key);
        out.extend_from_slice(&r.lo.to_le_bytes());
        out.extend_from_slice(&r.hi.to_le_bytes());
    }
}

/// Parses [`encode_into`]'s output of at most two regions; `None` for anything else.
pub(crate) fn decode_all(b: &[u8]) -> Option<Vec<Region>> {
    if !b.len().is_multiple_of(REGION_BYTES) || b.len() / REGION_BYTES > 2 {
        return None;
    }
    let u64_at = |c: &[u8], i: usize| u64::from_le_bytes(c[i..i + 8].try_into().unwrap_or([0; 8]));
    Some(
        b.chunks_exact(REGION_BYTES)
            .map(|c| {
                let mut key = [0u8; 81];
                key.copy_from_slice(&c[1..82]);
                Region {
                    role: c[0].min(1),
                    key,
                    lo: u64_at(c, 82),
                    hi: u64_at(c, 90),
                }
            })
            .collect(),
    )
}

/// The buffers of `call` (of a job of `n` ranks) that other processes can map.
#[cfg(feature = "ipc")]
pub(crate) fn of_call(call: &Call, n: usize) -> Vec<Region> {
    let es = call.dtype.size as u64;
    let c = call.count as u64;
    let (send, recv) = match call.kind {
        Kind::AllGather => (c, n as u64 * c),
        Kind::ReduceScatter(_) => (n as u64 * c, c),
        _ => (c, c),
    };
    let reads = !matches!(call.kind, Kind::Recv(_));
    let writes = !matches!(call.kind, Kind::Send(_));
    [(0u8, call.send, send, reads), (1, call.recv, recv, writes)]
        .into_iter()
        .filter(|&(_, ptr, elems, used)| used && ptr != 0 && elems > 0)
        .filter_map(|(role, ptr, elems, _)| {
            let (key, lo) = crate::ipc::shared_identity(ptr)?;
            Some(Region {
                role,
                key,
                lo,
                hi: lo.saturating_add(elems * es),
            })
        })
        .collect()
}

/// Without the `ipc` feature no memory is shared by `gpubind::ipc`.
#[cfg(not(feature = "ipc"))]
pub(crate) fn of_call(_call: &Call, _n: usize) -> Vec<Region> {
    Vec::new()
}

/// The same verdict wherever the same `shared` regions (index: rank) are seen: an error
/// naming the first two ranks whose buffers of the call (`what`) share memory.
pub(crate) fn check(shared: &[Vec<Region>], what: &str) -> Result<()> {
    for (r, mine) in shared.iter().enumerate() {
        for (q, theirs) in shared.iter().enumerate().skip(r + 1) {
            for a in mine {
                if let Some(b) = theirs.iter().find(|b| a.overlaps(b)) {
                    return Err(Error::InvalidArgument(format!(
                        "collective aliasing: rank {r}'s {} buffer and rank {q}'s {} buffer \
                         of {what} are the same memory (one allocation shared between their \
                         processes by IPC); each rank needs its own buffers",
                        a.role_name(),
                        b.role_name(),
                    )));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(role: u8, key: u8, lo: u64, hi: u64) -> Region {
        Region {
            role,
            key: [key; 81],
            lo,
            hi,
        }
    }

    #[test]
    fn regions_overlap_only_in_one_allocation() {
        assert!(r(1, 1, 0, 8).overlaps(&r(0, 1, 7, 9)));
        assert!(!r(1, 1, 0, 8).overlaps(&r(1, 1, 8, 9)));
        assert!(!r(1, 1, 0, 8).overlaps(&r(1, 2, 0, 8)));
    }

    #[test]
    fn regions_round_trip_and_bad_lengths_are_refused() {
        let rs = vec![r(0, 3, 8, 4104), r(1, 9, 0, u64::MAX)];
        let mut b = Vec::new();
        encode_into(&rs, &mut b);
        assert_eq!(decode_all(&b), Some(rs.clone()));
        assert_eq!(decode_all(&[]), Some(vec![]));
        assert_eq!(decode_all(&b[1..]), None);
        let mut three = b.clone();
        encode_into(&rs[..1], &mut three);
        assert_eq!(decode_all(&three), None);
    }

    #[test]
    fn the_first_pair_in_rank_order_is_named() {
        let shared = vec![vec![r(1, 5, 0, 64)], vec![], vec![r(0, 5, 32, 96)]];
        let e = check(&shared, "x").unwrap_err().to_string();
        assert!(
            e.contains("rank 0's receive buffer and rank 2's send buffer"),
            "{e}"
        );
        assert!(check(&[vec![r(1, 5, 0, 64)], vec![r(1, 5, 64, 96)]], "x").is_ok());
    }
}
