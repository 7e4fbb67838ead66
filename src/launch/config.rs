//! [`LaunchConfig`]: grid, block and shared memory of a launch, and its checks against
//! the device's and the kernel's limits.

use crate::device::DeviceLimits;
use crate::error::{Error, Result};
use crate::module::FunctionLimits;

/// Grid, block and dynamic shared memory of a launch.
///
/// The launch configuration is checked against the device's and the kernel's limits before
/// the driver sees it: threads per block (the device's, and the kernel's own, lower for
/// kernels with many registers or `__launch_bounds__`), each block and grid dimension, and
/// static plus dynamic shared memory. Over a limit is [`Error::LaunchLimit`], naming the
/// limit. Dynamic shared memory above the default per-block amount (48 KiB) needs the
/// kernel's opt-in: raise `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` with
/// [`Function::set_max_dynamic_shared_memory`](crate::Function::set_max_dynamic_shared_memory)
/// (or `cuFuncSetAttribute` on [`Function::raw`](crate::Function::raw)); gpubind reads the
/// attribute at such a launch, so a raise is seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid_dim: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block_dim: (u32, u32, u32),
    /// Dynamic shared memory per block, bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// One thread per element, 256 threads a block, at least one block.
    pub fn for_num_elems(n: u32) -> Self {
        const BLOCK: u32 = 256;
        LaunchConfig {
            grid_dim: (n.div_ceil(BLOCK).max(1), 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let (g, b) = (self.grid_dim, self.block_dim);
        if [g.0, g.1, g.2, b.0, b.1, b.2].contains(&0) {
            return Err(Error::InvalidArgument(format!(
                "launch dimensions must be non-zero (grid {g:?}, block {b:?})"
            )));
        }
        Ok(())
    }

    /// Checks the configuration against the device's and the kernel's limits, so a launch
    /// the driver would refuse is a typed [`Error::LaunchLimit`] instead. In order: threads
    /// per block (the device's, then the kernel's), block dimensions, grid dimensions,
    /// static plus dynamic shared memory against the device's opt-in ceiling, and — only
    /// when that total is over the default per-block amount, which every kernel may use —
    /// the dynamic part against the kernel's current
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`, read by `max_dynamic_shared`.
    #[inline]
    pub(crate) fn check_limits(
        &self,
        kernel: &str,
        dev: &DeviceLimits,
        func: &FunctionLimits,
        max_dynamic_shared: impl FnOnce() -> Result<u32>,
    ) -> Result<()> {
        if self.within_default_limits(dev, func) {
            return Ok(());
        }
        self.check_limits_one_by_one(kernel, dev, func, max_dynamic_shared)
    }

    /// Whether the configuration passes every check of
    /// [`check_limits`](Self::check_limits) without needing the kernel's dynamic
    /// shared-memory attribute (its total shared memory is within the default per-block
    /// amount): the usual launch, decided with a few compares and no branch per limit.
    /// `false` sends the launch through the checks one by one, which name the first limit
    /// exceeded (or pass, for shared memory over the default amount).
    #[inline(always)]
    fn within_default_limits(&self, dev: &DeviceLimits, func: &FunctionLimits) -> bool {
        // A zero dimension passes here, as it passes the checks one by one ([`validate`]
        // refuses it); `quick_check` does not pass it.
        //
        // [`validate`]: Self::validate
        self.within::<false>(dev, func)
    }

    /// [`validate`](Self::validate) and [`check_limits`](Self::check_limits) together
    /// for the usual launch: `true` only if every dimension is non-zero and the
    /// configuration is [within the default limits](Self::within_default_limits), so
    /// that both pass it (a launch with `false` runs them one by one). One pass of
    /// compares, no branch per check.
    #[inline(always)]
    pub(crate) fn quick_check(&self, dev: &DeviceLimits, func: &FunctionLimits) -> bool {
        self.within::<true>(dev, func)
    }

    /// [`within_default_limits`](Self::within_default_limits), with every dimension
    /// also non-zero if `NON_ZERO`.
    #[inline(always)]
    fn within<const NON_ZERO: bool>(&self, dev: &DeviceLimits, func: &FunctionLimits) -> bool {
        let b = [self.block_dim.0, self.block_dim.1, self.block_dim.2].map(u64::from);
        let g = [self.grid_dim.0, self.grid_dim.1, self.grid_dim.2].map(u64::from);
        // `d - 1 < limit` (wrapping) is `0 < d <= limit`: both are u32 widened to u64,
        // so a zero dimension wraps to u64::MAX, over every limit.
        let fits = |d: u64, limit: u32| {
            if NON_ZERO {
                d.wrapping_sub(1) < u64::from(limit)
            } else {
                d <= u64::from(limit)
            }
        };
        // Saturates as in the checks one by one (only for blocks over any limit).
        let threads = b[0].saturating_mul(b[1]).saturating_mul(b[2]);
        let max_threads = dev.max_threads_per_block.min(func.max_threads_per_block);
        let total_shared = u64::from(func.static_shared) + u64::from(self.shared_mem_bytes);
        (threads <= u64::from(max_threads))
            & fits(b[0], dev.max_block_dim[0])
            & fits(b[1], dev.max_block_dim[1])
            & fits(b[2], dev.max_block_dim[2])
            & fits(g[0], dev.max_grid_dim[0])
            & fits(g[1], dev.max_grid_dim[1])
            & fits(g[2], dev.max_grid_dim[2])
            & (total_shared <= u64::from(dev.shared_per_block))
    }

    /// [`check_limits`](Self::check_limits), one limit at a time, naming the first one
    /// exceeded.
    #[cold]
    #[inline(never)]
    fn check_limits_one_by_one(
        &self,
        kernel: &str,
        dev: &DeviceLimits,
        func: &FunctionLimits,
        max_dynamic_shared: impl FnOnce() -> Result<u32>,
    ) -> Result<()> {
        let over = |what: &'static str, requested: u64, limit: u64| {
            if requested > limit {
                Err(Error::LaunchLimit {
                    kernel: kernel.to_owned(),
                    what,
                    requested,
                    limit,
                })
            } else {
                Ok(())
            }
        };
        let b = [self.block_dim.0, self.block_dim.1, self.block_dim.2].map(u64::from);
        let g = [self.grid_dim.0, self.grid_dim.1, self.grid_dim.2].map(u64::from);
        // Saturates only for blocks of more than 2^64 threads, which are over any limit.
        let threads = b[0].saturating_mul(b[1]).saturating_mul(b[2]);
        over(
            "threads per block exceed the device's CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK",
            threads,
            dev.max_threads_per_block.into(),
        )?;
        over(
            "threads per block exceed the kernel's CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK \
             (its register use or __launch_bounds__ allow fewer than the device)",
            threads,
            func.max_threads_per_block.into(),
        )?;
        const BLOCK: [&str; 3] = [
            "block dimension x exceeds the device's CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X",
            "block dimension y exceeds the device's CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y",
            "block dimension z exceeds the device's CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z",
        ];
        const GRID: [&str; 3] = [
            "grid dimension x exceeds the device's CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X",
            "grid dimension y exceeds the device's CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y",
            "grid dimension z exceeds the device's CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z",
        ];
        for i in 0..3 {
            over(BLOCK[i], b[i], dev.max_block_dim[i].into())?;
        }
        for i in 0..3 {
            over(GRID[i], g[i], dev.max_grid_dim[i].into())?;
        }
        let dynamic = u64::from(self.shared_mem_bytes);
        let total = u64::from(func.static_shared) + dynamic;
        // Devices without an opt-in report 0: their ceiling is the default amount.
        let ceiling = dev.shared_per_block_optin.max(dev.shared_per_block);
        over(
            "shared memory per block (static + dynamic bytes) exceeds the device's \
             CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
            total,
            ceiling.into(),
        )?;
        if total > u64::from(dev.shared_per_block) {
            over(
                "dynamic shared memory (bytes) exceeds the kernel's \
                 CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (raise it with \
                 cuFuncSetAttribute, up to the device's opt-in maximum less the kernel's \
                 static shared memory)",
                dynamic,
                max_dynamic_shared()?.into(),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn for_num_elems_covers_every_element() {
        for n in [0u32, 1, 255, 256, 257, 1 << 20] {
            let c = LaunchConfig::for_num_elems(n);
            assert!(c.grid_dim.0 * c.block_dim.0 >= n);
            assert!(c.grid_dim.0 >= 1);
        }
    }

    /// An H200's limits.
    const H200: DeviceLimits = DeviceLimits {
        max_threads_per_block: 1024,
        max_block_dim: [1024, 1024, 64],
        max_grid_dim: [i32::MAX as u32, 65535, 65535],
        shared_per_block: 48 << 10,
        shared_per_block_optin: 227 << 10,
    };
    const PLAIN: FunctionLimits = FunctionLimits {
        max_threads_per_block: 1024,
        static_shared: 0,
    };

    fn cfg(grid: (u32, u32, u32), block: (u32, u32, u32), shared: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: grid,
            block_dim: block,
            shared_mem_bytes: shared,
        }
    }

    /// The limit a configuration is refused for: `(what, requested, limit)`.
    fn refused(
        c: LaunchConfig,
        func: &FunctionLimits,
        max_dynamic: u32,
    ) -> Option<(&'static str, u64, u64)> {
        match c.check_limits("k", &H200, func, || Ok(max_dynamic)) {
            Ok(()) => None,
            Err(Error::LaunchLimit {
                kernel,
                what,
                requested,
                limit,
            }) => {
                assert_eq!(kernel, "k");
                Some((what, requested, limit))
            }
            Err(e) => panic!("not a LaunchLimit: {e:?}"),
        }
    }

    /// The quick check never passes a configuration the checks one by one refuse, and
    /// it passes the usual ones: every combination of dimensions and shared memory at,
    /// around and far over each limit (a kernel with a lower thread limit and static
    /// shared memory too).
    #[test]
    fn the_quick_check_agrees_with_the_checks_one_by_one() {
        let dims = [
            1u32,
            2,
            63,
            64,
            65,
            1023,
            1024,
            1025,
            65535,
            65536,
            u32::MAX,
        ];
        let shared = [
            0u32,
            1,
            (48 << 10) - 512,
            48 << 10,
            (48 << 10) + 1,
            227 << 10,
            u32::MAX,
        ];
        let tight = FunctionLimits {
            max_threads_per_block: 256,
            static_shared: 512,
        };
        let mut quick = 0;
        for func in [&PLAIN, &tight] {
            for &x in &dims {
                for &y in &dims[..6] {
                    for &z in &dims[..6] {
                        for &sh in &shared {
                            for c in [cfg((x, y, z), (1, 1, 1), sh), cfg((1, 1, 1), (x, y, z), sh)]
                            {
                                let one_by_one =
                                    c.check_limits_one_by_one("k", &H200, func, || Ok(64 << 10));
                                if c.within_default_limits(&H200, func) {
                                    quick += 1;
                                    assert!(one_by_one.is_ok(), "{c:?} {func:?}: {one_by_one:?}");
                                }
                                // Every dimension here is non-zero: the launch's quick
                                // check agrees with the one it adds the zero check to.
                                assert_eq!(
                                    c.quick_check(&H200, func),
                                    c.within_default_limits(&H200, func)
                                );
                                let both = c.check_limits("k", &H200, func, || Ok(64 << 10));
                                assert_eq!(
                                    both.map_err(|e| e.to_string()),
                                    one_by_one.map_err(|e| e.to_string())
                                );
                            }
                        }
                    }
                }
            }
        }
        assert!(
            quick > 1000,
            "the quick check passed only {quick} configurations"
        );
    }

    #[test]
    fn threads_per_block_over_the_device_limit_are_refused() {
        let (what, req, lim) = refused(cfg((1, 1, 1), (2048, 1, 1), 0), &PLAIN, 0).unwrap();
        assert!(what.contains("device's CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK"));
        assert_eq!((req, lim), (2048, 1024));
        // The product counts, not only one dimension.
        let (what, req, _) = refused(cfg((1, 1, 1), (32, 32, 2), 0), &PLAIN, 0).unwrap();
        assert!(what.contains("MAX_THREADS_PER_BLOCK"));
        assert_eq!(req, 2048);
        // Absurd blocks saturate rather than overflow.
        let huge = cfg((1, 1, 1), (u32::MAX, u32::MAX, u32::MAX), 0);
        assert_eq!(refused(huge, &PLAIN, 0).unwrap().1, u64::MAX);
        let e = cfg((1, 1, 1), (2048, 1, 1), 0)
            .check_limits("saxpy", &H200, &PLAIN, || Ok(0))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "kernel `saxpy`: threads per block exceed the device's \
             CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: 2048 requested, limit 1024"
        );
    }

    #[test]
    fn threads_per_block_over_the_kernel_limit_are_refused() {
        let heavy = FunctionLimits {
            max_threads_per_block: 128,
            static_shared: 0,
        };
        let (what, req, lim) = refused(cfg((1, 1, 1), (256, 1, 1), 0), &heavy, 0).unwrap();
        assert!(what.contains("kernel's CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK"));
        assert_eq!((req, lim), (256, 128));
        assert_eq!(refused(cfg((1, 1, 1), (128, 1, 1), 0), &heavy, 0), None);
    }

    #[test]
    fn block_and_grid_dimensions_are_checked_one_by_one() {
        let cases = [
            (cfg((1, 1, 1), (1, 1, 65), 0), "MAX_BLOCK_DIM_Z", 65, 64),
            (
                cfg((1, 1, 1), (1, 1025, 1), 0),
                "MAX_THREADS_PER_BLOCK",
                1025,
                1024,
            ),
            (
                cfg((1, 65536, 1), (1, 1, 1), 0),
                "MAX_GRID_DIM_Y",
                65536,
                65535,
            ),
            (
                cfg((1, 1, 65536), (1, 1, 1), 0),
                "MAX_GRID_DIM_Z",
                65536,
                65535,
            ),
            (
                cfg((1 << 31, 1, 1), (1, 1, 1), 0),
                "MAX_GRID_DIM_X",
                1 << 31,
                (1 << 31) - 1,
            ),
        ];
        for (c, name, req, lim) in cases {
            let (what, r, l) = refused(c, &PLAIN, 0).unwrap();
            assert!(what.contains(name), "{what} for {c:?}");
            assert_eq!((r, l), (req, lim), "{c:?}");
        }
        // A device with a smaller y limit on blocks.
        let mut small = H200;
        small.max_block_dim[1] = 512;
        let e = cfg((1, 1, 1), (1, 513, 1), 0).check_limits("k", &small, &PLAIN, || Ok(0));
        assert!(
            matches!(e, Err(Error::LaunchLimit { what, requested: 513, limit: 512, .. })
            if what.contains("MAX_BLOCK_DIM_Y"))
        );
    }

    #[test]
    fn shared_memory_over_the_opt_in_ceiling_is_refused() {
        let optin = 227u64 << 10;
        let (what, req, lim) =
            refused(cfg((1, 1, 1), (1, 1, 1), (227 << 10) + 1), &PLAIN, u32::MAX).unwrap();
        assert!(what.contains("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"));
        assert_eq!((req, lim), (optin + 1, optin));
        // Static shared memory counts towards the ceiling.
        let with_static = FunctionLimits {
            max_threads_per_block: 1024,
            static_shared: 1 << 10,
        };
        let (what, req, _) =
            refused(cfg((1, 1, 1), (1, 1, 1), 227 << 10), &with_static, u32::MAX).unwrap();
        assert!(what.contains("OPTIN"));
        assert_eq!(req, optin + 1024);
        // A device without opt-in (reports 0): the default amount is the ceiling.
        let mut old = H200;
        old.shared_per_block_optin = 0;
        let e = cfg((1, 1, 1), (1, 1, 1), (48 << 10) + 4)
            .check_limits("k", &old, &PLAIN, || Ok(u32::MAX));
        assert!(matches!(e, Err(Error::LaunchLimit { limit, .. }) if limit == 48 << 10));
    }

    #[test]
    fn dynamic_shared_memory_over_the_default_needs_the_kernels_opt_in() {
        // 64 KiB with the kernel's attribute at its default: refused, naming the attribute.
        let (what, req, lim) =
            refused(cfg((1, 1, 1), (1, 1, 1), 64 << 10), &PLAIN, 48 << 10).unwrap();
        assert!(what.contains("CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES"));
        assert_eq!((req, lim), (64 << 10, 48 << 10));
        // Raised: accepted, up to the device's opt-in maximum.
        assert_eq!(
            refused(cfg((1, 1, 1), (1, 1, 1), 64 << 10), &PLAIN, 227 << 10),
            None
        );
        assert_eq!(
            refused(cfg((1, 1, 1), (1, 1, 1), 227 << 10), &PLAIN, 227 << 10),
            None
        );
        // Within the default amount the attribute is not read at all.
        let mut read = false;
        let c = cfg((1, 1, 1), (1, 1, 1), 48 << 10);
        assert!(
            c.check_limits("k", &H200, &PLAIN, || {
                read = true;
                Ok(0)
            })
            .is_ok()
        );
        assert!(
            !read,
            "the kernel's attribute was read for a default-sized launch"
        );
        // A failure to read it is returned.
        let e = cfg((1, 1, 1), (1, 1, 1), 64 << 10).check_limits("k", &H200, &PLAIN, || {
            Err(Error::InvalidArgument("no attribute".into()))
        });
        assert_eq!(e, Err(Error::InvalidArgument("no attribute".into())));
    }

    #[test]
    fn maximal_configurations_pass() {
        let max = cfg((i32::MAX as u32, 65535, 65535), (1024, 1, 1), 227 << 10);
        assert_eq!(refused(max, &PLAIN, 227 << 10), None);
        assert_eq!(refused(cfg((1, 1, 1), (1, 1024, 1), 0), &PLAIN, 0), None);
        assert_eq!(refused(cfg((1, 1, 1), (16, 1, 64), 0), &PLAIN, 0), None);
        assert_eq!(
            refused(LaunchConfig::for_num_elems(u32::MAX), &PLAIN, 0),
            None
        );
    }

    #[test]
    fn zero_dimensions_are_rejected() {
        let mut c = LaunchConfig::for_num_elems(10);
        c.block_dim.1 = 0;
        assert!(matches!(c.validate(), Err(Error::InvalidArgument(_))));
        assert!(LaunchConfig::for_num_elems(10).validate().is_ok());
    }

    /// The launch's quick check passes no zero dimension (whatever the limits), so a
    /// zero always reaches `validate`.
    #[test]
    fn the_quick_check_passes_no_zero_dimension() {
        let open = DeviceLimits {
            max_threads_per_block: u32::MAX,
            max_block_dim: [u32::MAX; 3],
            max_grid_dim: [u32::MAX; 3],
            shared_per_block: u32::MAX,
            shared_per_block_optin: u32::MAX,
        };
        let any = FunctionLimits {
            max_threads_per_block: u32::MAX,
            static_shared: 0,
        };
        for i in 0..6 {
            let mut d = [1u32; 6];
            d[i] = 0;
            let c = cfg((d[0], d[1], d[2]), (d[3], d[4], d[5]), 0);
            assert!(!c.quick_check(&open, &any), "{c:?}");
            assert!(!c.quick_check(&H200, &PLAIN), "{c:?}");
            assert!(c.validate().is_err());
        }
        assert!(cfg((1, 1, 1), (1, 1, 1), 0).quick_check(&open, &any));
        let max = cfg((u32::MAX, u32::MAX, u32::MAX), (u32::MAX, 1, 1), 0);
        assert!(max.quick_check(&open, &any));
    }
}
