//! [`Streams`]: the list of streams holding an allocation's pending writes, and
//! [`StreamList`], what a tracker's lists have in common.

use std::ops::{Deref, DerefMut};

/// A list of streams that keeps its first stream inline: the usual tracker (one pending
/// write, no reads: the reader list, a `Vec`, is empty and so unallocated) allocates
/// nothing, so a temporary buffer's tracker costs no heap allocation and no free. Only
/// the writers use it: each look at the list costs a branch, which the readers, empty
/// on the hot paths, need not pay. Derefs to a slice. It moves to the heap at its second
/// stream and stays there, keeping the capacity for the streams that replace them.
#[derive(Clone, Debug)]
pub(crate) enum Streams<S> {
    /// No stream, or one.
    Inline(Option<S>),
    /// Any number, on the heap.
    Heap(Vec<S>),
}

impl<S> Default for Streams<S> {
    fn default() -> Self {
        Streams::Inline(None)
    }
}

impl<S> Deref for Streams<S> {
    type Target = [S];

    #[inline]
    fn deref(&self) -> &[S] {
        match self {
            Streams::Inline(one) => one.as_slice(),
            Streams::Heap(v) => v,
        }
    }
}

impl<S> DerefMut for Streams<S> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [S] {
        match self {
            Streams::Inline(one) => one.as_mut_slice(),
            Streams::Heap(v) => v,
        }
    }
}

impl<'a, S> IntoIterator for &'a Streams<S> {
    type Item = &'a S;
    type IntoIter = std::slice::Iter<'a, S>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// Equal when they hold equal streams in the same order, inline or not.
impl<S: PartialEq> PartialEq for Streams<S> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<S> From<Vec<S>> for Streams<S> {
    fn from(v: Vec<S>) -> Self {
        Streams::Heap(v)
    }
}

impl<S> Streams<S> {
    /// One stream, inline.
    #[inline]
    pub(crate) fn one(s: S) -> Self {
        Streams::Inline(Some(s))
    }

    /// Appends `s`.
    pub(crate) fn push(&mut self, s: S) {
        match self {
            Streams::Inline(one) => match one.take() {
                None => *one = Some(s),
                Some(first) => *self = Streams::Heap(vec![first, s]),
            },
            Streams::Heap(v) => v.push(s),
        }
    }

    /// Removes and returns the last stream.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<S> {
        match self {
            Streams::Inline(one) => one.take(),
            Streams::Heap(v) => v.pop(),
        }
    }

    /// Removes every stream.
    pub(crate) fn clear(&mut self) {
        match self {
            Streams::Inline(one) => *one = None,
            Streams::Heap(v) => v.clear(),
        }
    }
}

/// A tracker's list of streams, emptied into a grave.
pub(crate) trait StreamList<S> {
    /// Removes every stream, in order, handing each to `f` (a list on the heap keeps its
    /// capacity for the streams that replace them).
    fn take_each(&mut self, f: impl FnMut(S));
}

impl<S> StreamList<S> for Vec<S> {
    #[inline]
    fn take_each(&mut self, f: impl FnMut(S)) {
        self.drain(..).for_each(f);
    }
}

impl<S> StreamList<S> for Streams<S> {
    #[inline]
    fn take_each(&mut self, mut f: impl FnMut(S)) {
        match self {
            Streams::Inline(one) => {
                if let Some(s) = one.take() {
                    f(s);
                }
            }
            Streams::Heap(v) => v.take_each(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{StreamList, Streams};

    #[test]
    fn the_first_stream_is_inline_and_order_is_kept() {
        let mut s = Streams::default();
        assert!(s.is_empty());
        s.push(1);
        assert!(matches!(s, Streams::Inline(Some(1))));
        s.push(2);
        s.push(3);
        assert_eq!(&s[..], [1, 2, 3]);
        assert_eq!(s.pop(), Some(3));
        let mut taken = Vec::new();
        s.take_each(|x| taken.push(x));
        assert_eq!(taken, [1, 2]);
        assert!(
            s.is_empty() && matches!(s, Streams::Heap(_)),
            "keeps its heap"
        );
        assert_eq!(Streams::one(4), Streams::from(vec![4]));
    }
}
