//! The device memory gpubind's allocations of one device hold: bytes in use now and
//! their high-water mark ([`Device::memory_usage`](super::Device::memory_usage)).

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of device memory held by gpubind allocations of one device, and the most they
/// held at once since the device was first used or the peak was last reset
/// ([`Device::memory_usage`](super::Device::memory_usage)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct MemoryUsage {
    /// Bytes held now.
    pub in_use: u64,
    /// The most bytes held at once.
    pub peak: u64,
}

/// The counters behind [`MemoryUsage`], one per device.
#[derive(Debug, Default)]
pub(crate) struct UsageCounter {
    in_use: AtomicU64,
    peak: AtomicU64,
}

impl UsageCounter {
    /// Counts an allocation of `bytes`, raising the peak if it is passed.
    #[inline]
    pub(crate) fn add(&self, bytes: u64) {
        let now = self.in_use.fetch_add(bytes, Ordering::Relaxed) + bytes;
        // `fetch_max` changes nothing unless `now` is above the peak: skip its
        // read-modify-write when the peak is not exceeded (a loop reusing one amount of
        // memory never exceeds it). A reset racing with this stores `in_use`, which
        // already counts these bytes.
        if now > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// Counts the release of an allocation of `bytes` (never below zero).
    #[inline]
    pub(crate) fn sub(&self, bytes: u64) {
        let _ = self
            .in_use
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(bytes))
            });
    }

    pub(crate) fn get(&self) -> MemoryUsage {
        let in_use = self.in_use.load(Ordering::Relaxed);
        MemoryUsage {
            in_use,
            peak: self.peak.load(Ordering::Relaxed).max(in_use),
        }
    }

    /// Sets the peak to the bytes in use now.
    pub(crate) fn reset_peak(&self) {
        self.peak
            .store(self.in_use.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_is_the_high_water_mark_until_reset() {
        let c = UsageCounter::default();
        c.add(100);
        c.add(50);
        c.sub(100);
        assert_eq!(
            c.get(),
            MemoryUsage {
                in_use: 50,
                peak: 150
            }
        );
        c.reset_peak();
        assert_eq!(
            c.get(),
            MemoryUsage {
                in_use: 50,
                peak: 50
            }
        );
        c.add(10);
        assert_eq!(
            c.get(),
            MemoryUsage {
                in_use: 60,
                peak: 60
            }
        );
        c.sub(1000);
        assert_eq!(
            c.get(),
            MemoryUsage {
                in_use: 0,
                peak: 60
            }
        );
    }
}
