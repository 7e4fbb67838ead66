//! Device UUIDs: a utility below the device layer, so that errors can name a device
//! by UUID. Public as [`gpubind::Uuid`](crate::Uuid).

use std::fmt;

/// A device's 16-byte UUID, printed as `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` like
/// `nvidia-smi -L`. It is stable across processes, unlike ordinals, which depend on
/// `CUDA_VISIBLE_DEVICES`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Uuid(pub [u8; 16]);

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        write!(f, "GPU-")?;
        for (i, byte) in b.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                write!(f, "-")?;
            }
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
