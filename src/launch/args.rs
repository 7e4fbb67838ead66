//! [`Args`]: what a launch collects from its arguments — the kernel-parameter pointers,
//! the gpubind buffers passed and how, and the first errors found — inline for the usual
//! launch. Everything rare (more than [`INLINE_ARGS`] arguments or buffers, an error)
//! lives in one box, made only when needed: a launch allocates nothing, and its drop
//! looks at one pointer.

use crate::access::{Access, AccessTracker, Use};
use crate::error::Error;
use std::ffi::c_void;

/// How many argument pointers, and how many buffers, a launch keeps inline before
/// spilling to the heap.
pub(super) const INLINE_ARGS: usize = 12;

const _: () = assert!(INLINE_ARGS <= u16::BITS as usize);

/// A launch's arguments; see the [module docs](self).
pub(super) struct Args<'a> {
    /// The first [`INLINE_ARGS`] kernel-parameter pointers.
    ptrs: [*mut c_void; INLINE_ARGS],
    /// How many arguments were pushed.
    n: usize,
    /// The first [`INLINE_ARGS`] gpubind buffers passed.
    bufs: [Option<&'a AccessTracker>; INLINE_ARGS],
    /// How many of `bufs` are set.
    nbufs: usize,
    /// Bit `i` set: `bufs[i]` was passed by `&mut` (a write), else by `&` (a read).
    writes: u16,
    rare: Option<Box<Rare<'a>>>,
}

/// The rare part of [`Args`].
#[derive(Default)]
struct Rare<'a> {
    /// The first argument of another device: reported before everything but the
    /// module's device mismatch.
    error: Option<Error>,
    /// The first argument whose size differs from the kernel's parameter (reported after
    /// the count check).
    size_error: Option<Error>,
    /// Every argument pointer once there are more than [`INLINE_ARGS`] (the inline ones
    /// copied first): empty until then.
    ptrs: Vec<*mut c_void>,
    /// The buffers after the first [`INLINE_ARGS`].
    bufs: Vec<(&'a AccessTracker, Access)>,
}

impl<'a> Args<'a> {
    #[inline(always)]
    pub(super) fn new() -> Self {
        Args {
            ptrs: [std::ptr::null_mut(); INLINE_ARGS],
            n: 0,
            bufs: [None; INLINE_ARGS],
            nbufs: 0,
            writes: 0,
            rare: None,
        }
    }

    fn rare(&mut self) -> &mut Rare<'a> {
        self.rare.get_or_insert_with(Default::default)
    }

    /// How many arguments were pushed.
    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        self.n
    }

    /// Appends an argument's kernel-parameter pointer.
    #[inline(always)]
    pub(super) fn push_ptr(&mut self, p: *mut c_void) {
        if self.n < INLINE_ARGS {
            self.ptrs[self.n] = p;
        } else {
            self.spill_ptr(p);
        }
        self.n += 1;
    }

    #[cold]
    #[inline(never)]
    fn spill_ptr(&mut self, p: *mut c_void) {
        let inline = self.ptrs;
        let rare = self.rare();
        if rare.ptrs.is_empty() {
            rare.ptrs.reserve(2 * INLINE_ARGS);
            rare.ptrs.extend_from_slice(&inline);
        }
        rare.ptrs.push(p);
    }

    /// The pointers pushed, in order, contiguous (for the driver).
    #[inline(always)]
    pub(super) fn ptrs_mut(&mut self) -> &mut [*mut c_void] {
        match &mut self.rare {
            // Non-empty exactly when more than `INLINE_ARGS` were pushed: all of them.
            Some(rare) if !rare.ptrs.is_empty() => &mut rare.ptrs[..],
            _ => &mut self.ptrs[..self.n],
        }
    }

    /// Appends a gpubind buffer passed, read or written.
    #[inline(always)]
    pub(super) fn push_buf(&mut self, t: &'a AccessTracker, access: Access) {
        if self.nbufs < INLINE_ARGS {
            self.bufs[self.nbufs] = Some(t);
            self.writes |= u16::from(access == Access::Write) << self.nbufs;
            self.nbufs += 1;
        } else {
            self.spill_buf(t, access);
        }
    }

    #[cold]
    #[inline(never)]
    fn spill_buf(&mut self, t: &'a AccessTracker, access: Access) {
        self.rare().bufs.push((t, access));
    }

    /// Marks the last buffer pushed, `t`, as written.
    #[inline(always)]
    pub(super) fn mark_written(&mut self, t: &'a AccessTracker) {
        match self.rare.as_mut().and_then(|r| r.bufs.last_mut()) {
            Some(last) => *last = (t, Access::Write),
            None => self.writes |= 1 << (self.nbufs - 1),
        }
    }

    /// The buffers after the first [`INLINE_ARGS`].
    #[inline(always)]
    fn spilled(&self) -> &[(&'a AccessTracker, Access)] {
        self.rare.as_ref().map_or(&[], |r| &r.bufs[..])
    }

    /// How many buffers were pushed.
    pub(super) fn buffers(&self) -> usize {
        self.nbufs + self.spilled().len()
    }

    /// How `bufs[i]` is used.
    #[inline(always)]
    fn inline_access(&self, i: usize) -> Access {
        if self.writes & (1 << i) != 0 {
            Access::Write
        } else {
            Access::Read
        }
    }

    /// Whether every buffer publishes stream `on` for its use, a read or a write (the
    /// fast path: see [`crate::access`]). Call with `on`'s gate held. A buffer passed
    /// both ways is checked for both, which together admit exactly its write.
    #[inline(always)]
    pub(super) fn all_admit(&self, on: u64) -> bool {
        self.bufs[..self.nbufs]
            .iter()
            .enumerate()
            .all(|(i, t)| t.is_none_or(|t| t.admits(on, self.inline_access(i))))
            && self.spilled().iter().all(|&(t, a)| t.admits(on, a))
    }

    /// The first `N` of [`uses`](Self::uses), padded with `None` (for at most `N`
    /// buffers).
    #[inline(always)]
    pub(super) fn uses_array<const N: usize>(&self) -> [Use<'a>; N] {
        let mut out = [None; N];
        for (slot, u) in out.iter_mut().zip(self.uses()) {
            *slot = u;
        }
        out
    }

    /// Every buffer argument, claimed as read (passed by `&`) or written (by `&mut`); a
    /// buffer passed both ways is merged into one write by the claim.
    pub(super) fn uses(&self) -> impl Iterator<Item = Use<'a>> + '_ {
        self.bufs[..self.nbufs]
            .iter()
            .enumerate()
            .map(|(i, t)| t.map(|t| (t, self.inline_access(i))))
            .chain(self.spilled().iter().map(|&u| Some(u)))
    }

    /// Keeps `e` as the launch's error, unless one was found first.
    #[cold]
    #[inline(never)]
    pub(super) fn set_error(&mut self, e: Error) {
        let rare = self.rare();
        if rare.error.is_none() {
            rare.error = Some(e);
        }
    }

    /// Keeps the size error `make` builds, unless one was found first (only then is it
    /// built: describing the argument costs).
    #[cold]
    #[inline(never)]
    pub(super) fn set_size_error(&mut self, make: impl FnOnce() -> Error) {
        let rare = self.rare();
        if rare.size_error.is_none() {
            rare.size_error = Some(make());
        }
    }

    /// The errors found: `(error, size_error)` (see [`Rare`]).
    #[inline(always)]
    pub(super) fn errors(&self) -> (Option<&Error>, Option<&Error>) {
        match &self.rare {
            Some(r) => (r.error.as_ref(), r.size_error.as_ref()),
            None => (None, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The uses a launch claims: `&` arguments as reads, `&mut` and `arg_written` ones
    /// as writes, in argument order, inline and after spilling.
    #[test]
    fn buffer_arguments_are_claimed_as_passed() {
        let trackers: Vec<AccessTracker> = (0..INLINE_ARGS + 3)
            .map(|_| AccessTracker::default())
            .collect();
        let access = |i: usize| {
            if i % 3 == 1 {
                Access::Write
            } else {
                Access::Read
            }
        };
        let mut args = Args::new();
        for (i, t) in trackers.iter().enumerate() {
            args.push_buf(t, Access::Read);
            if access(i) == Access::Write {
                args.mark_written(t);
            }
        }
        assert_eq!(args.buffers(), trackers.len());
        let uses: Vec<Use<'_>> = args.uses().collect();
        assert_eq!(uses.len(), trackers.len());
        for (i, (u, t)) in uses.iter().zip(&trackers).enumerate() {
            let (ut, ua) = u.expect("every argument pushed is a buffer");
            assert!(std::ptr::eq(ut, t), "argument {i}: tracker");
            assert_eq!(ua, access(i), "argument {i}");
        }
        let few = args.uses_array::<4>();
        assert_eq!(
            few.map(|u| u.map(|(_, a)| a)),
            [0, 1, 2, 3].map(|i| Some(access(i)))
        );
    }

    /// The fast path admits a launch only when every buffer publishes the stream for
    /// its own use: a read needs a read id, a write the write id.
    #[test]
    fn fast_path_admits_reads_by_their_read_ids() {
        // No stream (the trackers' "nothing published").
        const NONE: u64 = u64::MAX;
        let reader = AccessTracker::with_published((NONE, [7, 9]));
        let writer = AccessTracker::with_published((7, [7, NONE]));
        let check = |uses: &[(&AccessTracker, Access)], on: u64| {
            let mut args = Args::new();
            for &(t, a) in uses {
                args.push_buf(t, a);
            }
            args.all_admit(on)
        };
        assert!(check(
            &[(&reader, Access::Read), (&writer, Access::Write)],
            7
        ));
        assert!(check(
            &[(&reader, Access::Read), (&writer, Access::Read)],
            7
        ));
        assert!(check(&[(&reader, Access::Read)], 9));
        assert!(
            !check(&[(&reader, Access::Write)], 7),
            "a read id admits no write"
        );
        assert!(!check(&[(&writer, Access::Write)], 9));
        assert!(
            !check(&[(&reader, Access::Read), (&reader, Access::Write)], 7),
            "a buffer passed both ways needs the write id"
        );
        assert!(check(&[], 3), "no buffer: nothing to wait for");
        // Past the inline buffers too.
        let mut many: Vec<(&AccessTracker, Access)> =
            vec![(&reader, Access::Read); INLINE_ARGS + 2];
        assert!(check(&many, 7));
        many.push((&reader, Access::Write));
        assert!(!check(&many, 7), "a spilled write needs the write id");
    }

    #[test]
    fn arg_pointers_keep_order_inline_and_after_spilling() {
        let vals: Vec<u64> = (0..3 * INLINE_ARGS as u64).collect();
        let mut args = Args::new();
        for (i, v) in vals.iter().enumerate() {
            args.push_ptr(v as *const u64 as *mut c_void);
            assert_eq!(args.len(), i + 1);
            assert_eq!(args.rare.is_some(), i >= INLINE_ARGS);
            let ptrs = args.ptrs_mut();
            assert_eq!(ptrs.len(), i + 1);
            // SAFETY: each pointer pushed points to a live u64 of `vals`.
            let seen: Vec<u64> = ptrs
                .iter()
                .map(|&p| unsafe { *(p as *const u64) })
                .collect();
            assert_eq!(seen, vals[..=i]);
        }
    }

    /// The first error of each kind is kept; none is made until one is found.
    #[test]
    fn the_first_errors_are_kept() {
        let mut args = Args::new();
        assert!(args.rare.is_none());
        assert!(matches!(args.errors(), (None, None)));
        let e = |s: &str| Error::InvalidArgument(s.into());
        args.set_size_error(|| e("size 1"));
        args.set_size_error(|| panic!("not built: a size error is kept already"));
        args.set_error(e("first"));
        args.set_error(e("second"));
        let (error, size) = args.errors();
        assert_eq!(error.map(|e| e.to_string()), Some(e("first").to_string()));
        assert_eq!(size.map(|e| e.to_string()), Some(e("size 1").to_string()));
    }
}
