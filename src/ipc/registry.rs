//! Process-wide bookkeeping that keeps imports sound: which IPC pools this process
//! created (and still has), which legacy handles it exported, and which imported
//! mappings are live.
//!
//! The invariant it protects: **no two live owning slices of this process map the same
//! device memory.** Every owning slice frees (or unmaps) its address on drop and hands
//! out `&mut` access, so two of them over one range would free it twice and alias.
//!
//! * `own_pools`: the live IPC pools created here, by id, with their raw driver handle.
//!   Importing one of them (by id, or when the driver hands back one of these handles)
//!   is [`Error::SameProcessImport`]. An entry is removed when the pool is destroyed.
//! * `own_legacy`: the 64 bytes of every legacy handle exported here. Opening one here is
//!   [`Error::SameProcessImport`] (the driver refuses it too, with a less clear error).
//!   Kept for the process's life: a handle of this process names this process's memory
//!   whether or not the allocation is still alive.
//! * `own_events`: the 64 bytes of every interprocess event handle exported here;
//!   opening one here is [`Error::SameProcessImport`]. Kept for the process's life.
//! * `keys` and `ranges`: the live [`ImportedSlice`](super::ImportedSlice)s and
//!   [`LegacySlice`](super::LegacySlice)s, by what named them (pool id + export data, or
//!   the legacy handle's bytes) and by the device address range they cover. A second
//!   import of a live key, or a mapping that overlaps a live range, is
//!   [`Error::AlreadyImported`]. A [`LiveImport`] guard, held by the slice, removes both
//!   when the slice is dropped (after it has unmapped).
//!
//! One mutex guards it all, and the import paths hold it across their driver calls, so
//! imports in one process are serialised and the checks cannot race each other.

use super::handle::PoolId;
use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// What named an imported allocation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ImportKey {
    /// A pool buffer: its pool's id and `cuMemPoolPtrExportData`.
    Pool(PoolId, [u8; 64]),
    /// A legacy handle's `CUipcMemHandle` bytes.
    Legacy([u8; 64]),
}

impl ImportKey {
    /// The key's fixed-size byte form (`0` + pool id + export data, or `1` + 16 zero
    /// bytes + the legacy handle), the same in every process.
    pub(crate) fn to_bytes(&self) -> [u8; 81] {
        let mut b = [0u8; 81];
        match self {
            ImportKey::Pool(id, data) => {
                b[1..17].copy_from_slice(&id.0);
                b[17..].copy_from_slice(data);
            }
            ImportKey::Legacy(data) => {
                b[0] = 1;
                b[17..].copy_from_slice(data);
            }
        }
        b
    }

    /// For error messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            ImportKey::Pool(id, _) => format!("a buffer of pool {id}"),
            ImportKey::Legacy(_) => "a legacy IPC handle".to_owned(),
        }
    }
}

/// The registry's state (see the module documentation).
#[derive(Default)]
pub(crate) struct State {
    own_pools: HashMap<PoolId, usize>,
    own_legacy: HashSet<[u8; 64]>,
    own_events: HashSet<[u8; 64]>,
    keys: HashSet<ImportKey>,
    /// start -> end (exclusive) of each live imported mapping; never overlapping.
    ranges: BTreeMap<u64, u64>,
    /// start -> what named the live imported mapping at `start`.
    range_keys: BTreeMap<u64, ImportKey>,
    /// start -> (end, key) of each allocation this process exported (pool buffers until
    /// freed, legacy allocations for the process's life).
    own_exports: BTreeMap<u64, (u64, ImportKey)>,
}

static REGISTRY: OnceLock<Mutex<State>> = OnceLock::new();

/// Locks the registry (recovering from poisoning: every update below is a single
/// insert or remove, so a panic elsewhere cannot leave it half-done).
pub(crate) fn lock() -> MutexGuard<'static, State> {
    REGISTRY
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

impl State {
    /// Records a live IPC pool created by this process.
    pub(crate) fn add_own_pool(&mut self, id: PoolId, raw: usize) {
        self.own_pools.insert(id, raw);
    }

    /// Forgets a pool created by this process (call once it is destroyed).
    pub(crate) fn remove_own_pool(&mut self, id: PoolId) {
        self.own_pools.remove(&id);
    }

    /// Whether `id` names a live IPC pool created by this process.
    pub(crate) fn is_own_pool(&self, id: PoolId) -> bool {
        self.own_pools.contains_key(&id)
    }

    /// Whether `raw` is the driver handle of a live IPC pool created by this process.
    pub(crate) fn is_own_raw_pool(&self, raw: usize) -> bool {
        self.own_pools.values().any(|&r| r == raw)
    }

    /// Whether this process has any live IPC pool of its own (only then can an import
    /// alias memory it owns).
    pub(crate) fn has_own_pools(&self) -> bool {
        !self.own_pools.is_empty()
    }

    /// Records a legacy handle exported by this process.
    pub(crate) fn add_own_legacy(&mut self, data: [u8; 64]) {
        self.own_legacy.insert(data);
    }

    /// Whether this process exported a legacy handle with these bytes.
    pub(crate) fn is_own_legacy(&self, data: &[u8; 64]) -> bool {
        self.own_legacy.contains(data)
    }

    /// Records an interprocess event handle exported by this process.
    pub(crate) fn add_own_event(&mut self, data: [u8; 64]) {
        self.own_events.insert(data);
    }

    /// Whether this process exported an interprocess event handle with these bytes.
    pub(crate) fn is_own_event(&self, data: &[u8; 64]) -> bool {
        self.own_events.contains(data)
    }

    /// [`Error::AlreadyImported`] if a live slice was imported from `key`.
    pub(crate) fn check_key(&self, key: &ImportKey) -> Result<()> {
        if self.keys.contains(key) {
            return Err(Error::AlreadyImported {
                what: key.describe(),
            });
        }
        Ok(())
    }

    /// Whether `bytes` bytes from `ptr` overlap a live imported mapping.
    pub(crate) fn overlaps(&self, ptr: u64, bytes: u64) -> bool {
        let end = ptr.saturating_add(bytes.max(1));
        // Ranges never overlap each other, so only the last one starting before `end`
        // can reach into [ptr, end).
        self.ranges
            .range(..end)
            .next_back()
            .is_some_and(|(_, &e)| e > ptr)
    }

    /// Whether `ptr` lies in a live imported mapping.
    pub(crate) fn is_imported(&self, ptr: u64) -> bool {
        self.overlaps(ptr, 1)
    }

    /// Records a live import of `bytes` bytes at `ptr`, named by `key`.
    /// [`Error::AlreadyImported`] (and nothing recorded) if the key is live or the range
    /// overlaps a live one. The guard must be dropped without the lock held.
    pub(crate) fn insert(&mut self, key: ImportKey, ptr: u64, bytes: u64) -> Result<LiveImport> {
        self.check_key(&key)?;
        if self.overlaps(ptr, bytes) {
            return Err(Error::AlreadyImported {
                what: format!(
                    "{} (mapped at {ptr:#x}, which a live imported slice covers)",
                    key.describe()
                ),
            });
        }
        let end = ptr.saturating_add(bytes.max(1));
        self.keys.insert(key.clone());
        self.ranges.insert(ptr, end);
        self.range_keys.insert(ptr, key.clone());
        Ok(LiveImport {
            key,
            start: ptr,
            kept: false,
        })
    }

    fn remove(&mut self, key: &ImportKey, start: u64) {
        self.keys.remove(key);
        self.ranges.remove(&start);
        self.range_keys.remove(&start);
    }

    /// Records an allocation of `bytes` bytes at `ptr` that this process exported under
    /// `key` (replacing an entry at the same address).
    /// Entries that start inside the new range go: this process's live allocations do
    /// not overlap, so they name freed memory (a legacy export's entry is kept past the
    /// free, and a pool slice freed by `free_async` leaves its own), and a lookup of an
    /// address past their start would find them instead of the new allocation, naming
    /// IPC-shared memory by a key no importer of it has.
    pub(crate) fn add_own_export(&mut self, key: ImportKey, ptr: u64, bytes: u64) {
        let end = ptr.saturating_add(bytes.max(1));
        let stale: Vec<u64> = self
            .own_exports
            .range(ptr.saturating_add(1)..end)
            .map(|(&start, _)| start)
            .collect();
        for start in stale {
            self.own_exports.remove(&start);
        }
        self.own_exports.insert(ptr, (end, key));
    }

    /// Forgets the exported allocation at `ptr` (call once it is freed).
    pub(crate) fn remove_own_export(&mut self, ptr: u64) {
        self.own_exports.remove(&ptr);
    }

    /// The identity across processes of the memory at `ptr`: what names its allocation
    /// (the same key in the exporting process and in every importer) and the byte offset
    /// of `ptr` in it. `None` for memory no other process can map.
    pub(crate) fn shared_identity(&self, ptr: u64) -> Option<(ImportKey, u64)> {
        if let Some((&start, &end)) = self.ranges.range(..=ptr).next_back()
            && ptr < end
        {
            return self
                .range_keys
                .get(&start)
                .map(|k| (k.clone(), ptr - start));
        }
        let (&start, (end, key)) = self.own_exports.range(..=ptr).next_back()?;
        (ptr < *end).then(|| (key.clone(), ptr - start))
    }
}

/// A live import's registry entry; dropping it removes the entry. Held by the imported
/// slice as its last field, so it is dropped after the slice's `Drop` has unmapped.
pub(crate) struct LiveImport {
    key: ImportKey,
    start: u64,
    /// Set by [`keep`](Self::keep): the entry outlives the guard.
    kept: bool,
}

impl LiveImport {
    /// Keeps the entry for the rest of the process: the slice's drop leaked its mapping
    /// (the device may still use it, e.g. a wait past `GPUBIND_DROP_TIMEOUT`), so a new
    /// import of the same allocation would alias memory that earlier, untracked work may
    /// still write. Importing it again is then [`Error::AlreadyImported`].
    pub(crate) fn keep(&mut self) {
        self.kept = true;
    }
}

impl Drop for LiveImport {
    fn drop(&mut self) {
        if !self.kept {
            lock().remove(&self.key, self.start);
        }
    }
}

impl std::fmt::Debug for LiveImport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveImport")
            .field("start", &format_args!("{:#x}", self.start))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_identity_names_imports_and_own_exports() {
        let mut s = State::default();
        let g = s.insert(pool_key(5), 0x10_0000, 0x100).unwrap();
        assert_eq!(s.shared_identity(0x10_0040), Some((pool_key(5), 0x40)));
        assert_eq!(s.shared_identity(0x10_0100), None);
        s.add_own_export(pool_key(6), 0x20_0000, 0x80);
        assert_eq!(s.shared_identity(0x20_0000), Some((pool_key(6), 0)));
        assert_eq!(s.shared_identity(0x20_0080), None);
        s.remove_own_export(0x20_0000);
        assert_eq!(s.shared_identity(0x20_0000), None);
        let (key, start) = (g.key.clone(), g.start);
        std::mem::forget(g);
        s.remove(&key, start);
        assert_eq!(s.shared_identity(0x10_0040), None);
    }

    /// An export over memory where a freed, smaller export started (its entry kept, as
    /// a legacy export's is) names every address of the new allocation by its own key.
    #[test]
    fn a_new_export_replaces_the_stale_entries_inside_it() {
        let mut s = State::default();
        s.add_own_export(pool_key(6), 0x20_0100, 0x80); // freed since, entry kept
        s.add_own_export(pool_key(7), 0x20_0000, 0x1000);
        assert_eq!(s.shared_identity(0x20_0000), Some((pool_key(7), 0)));
        assert_eq!(s.shared_identity(0x20_0110), Some((pool_key(7), 0x110)));
        assert_eq!(s.shared_identity(0x20_0f00), Some((pool_key(7), 0xf00)));
        assert_eq!(s.shared_identity(0x20_1000), None);
        // Entries outside the new range stay.
        s.add_own_export(pool_key(8), 0x30_0000, 0x10);
        s.add_own_export(pool_key(9), 0x30_0010, 0x10);
        assert_eq!(s.shared_identity(0x30_0000), Some((pool_key(8), 0)));
    }

    fn pool_key(seed: u8) -> ImportKey {
        ImportKey::Pool(PoolId([seed; 16]), [seed; 64])
    }

    #[test]
    fn a_live_key_is_refused_and_released_on_drop() {
        let mut s = State::default();
        let g = s.insert(pool_key(1), 0x1000, 64).unwrap();
        assert!(matches!(
            s.insert(pool_key(1), 0x9000, 64),
            Err(Error::AlreadyImported { .. })
        ));
        assert!(matches!(
            s.check_key(&pool_key(1)),
            Err(Error::AlreadyImported { .. })
        ));
        // Another key elsewhere is fine.
        let g2 = s.insert(pool_key(2), 0x2000, 64).unwrap();
        s.remove(&g.key, g.start);
        std::mem::forget(g); // its Drop would lock the global registry
        assert!(s.check_key(&pool_key(1)).is_ok());
        let g3 = s.insert(pool_key(1), 0x1000, 64).unwrap();
        for g in [g2, g3] {
            s.remove(&g.key, g.start);
            std::mem::forget(g);
        }
        assert!(s.keys.is_empty() && s.ranges.is_empty());
    }

    #[test]
    fn overlapping_ranges_are_refused_whatever_the_key() {
        let mut s = State::default();
        let g = s.insert(pool_key(1), 0x1000, 0x100).unwrap();
        for (ptr, len, overlaps) in [
            (0x1000, 0x100, true),  // the same range (same address, another key)
            (0x1000, 4, true),      // shorter, same start
            (0x10fc, 4, true),      // last 4 bytes
            (0x0f00, 0x101, true),  // ends one byte in
            (0x0f00, 0x100, false), // ends right before
            (0x1100, 4, false),     // starts right after
            (0x0800, 0x2000, true), // covers it
        ] {
            assert_eq!(s.overlaps(ptr, len), overlaps, "{ptr:#x}+{len:#x}");
            let r = s.insert(ImportKey::Legacy([7; 64]), ptr, len);
            assert_eq!(r.is_err(), overlaps, "{ptr:#x}+{len:#x}");
            if let Ok(g2) = r {
                s.remove(&g2.key, g2.start);
                std::mem::forget(g2);
            }
        }
        assert!(s.is_imported(0x1000) && s.is_imported(0x10ff) && !s.is_imported(0x1100));
        s.remove(&g.key, g.start);
        std::mem::forget(g);
        assert!(!s.overlaps(0x1000, 0x100));
    }

    #[test]
    fn many_ranges_find_their_neighbours() {
        let mut s = State::default();
        let mut guards = Vec::new();
        for i in 0..100u64 {
            guards.push(
                s.insert(ImportKey::Legacy([i as u8; 64]), i * 0x1000, 0x800)
                    .unwrap(),
            );
        }
        for i in 0..100u64 {
            assert!(s.overlaps(i * 0x1000 + 0x7ff, 1));
            assert!(!s.overlaps(i * 0x1000 + 0x800, 0x800));
        }
        for g in guards {
            s.remove(&g.key, g.start);
            std::mem::forget(g);
        }
    }

    #[test]
    fn own_pools_and_legacy_handles() {
        let mut s = State::default();
        let id = PoolId([9; 16]);
        assert!(!s.has_own_pools() && !s.is_own_pool(id));
        s.add_own_pool(id, 0xdead);
        assert!(s.has_own_pools() && s.is_own_pool(id) && s.is_own_raw_pool(0xdead));
        assert!(!s.is_own_pool(PoolId([8; 16])) && !s.is_own_raw_pool(0xbeef));
        s.remove_own_pool(id);
        assert!(!s.has_own_pools() && !s.is_own_raw_pool(0xdead));
        assert!(!s.is_own_legacy(&[1; 64]));
        s.add_own_legacy([1; 64]);
        assert!(s.is_own_legacy(&[1; 64]) && !s.is_own_legacy(&[2; 64]));
    }

    #[test]
    fn the_guard_releases_the_global_entry() {
        let key = ImportKey::Legacy([0xa5; 64]);
        // An address range no other test uses (tests share the process-wide registry).
        let g = lock().insert(key.clone(), 0xffff_0000_0000, 16).unwrap();
        assert!(matches!(
            lock().check_key(&key),
            Err(Error::AlreadyImported { .. })
        ));
        drop(g);
        assert!(lock().check_key(&key).is_ok());
        assert!(!lock().is_imported(0xffff_0000_0000));
    }
}
