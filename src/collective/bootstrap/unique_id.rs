//! NCCL's unique id as a value: bytes, hex text, and `ncclGetUniqueId`.

#[cfg(doc)]
use super::LaunchEnv;
use crate::error::{Error, Result};

/// Size of an NCCL unique id (`NCCL_UNIQUE_ID_BYTES` in nccl.h).
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// NCCL's `ncclUniqueId`: 128 opaque bytes made by rank 0 ([`NcclUniqueId::new`]) that
/// every rank passes to [`RankComm::init_process`](crate::collective::RankComm::init_process).
///
/// It moves between processes as bytes ([`as_bytes`](Self::as_bytes),
/// [`from_bytes`](Self::from_bytes)) or as 256 hex digits (`Display`, `FromStr`), so any
/// channel works; [`LaunchEnv::exchange_id`] is gpubind's own. `Debug` shows only the
/// first 8 bytes.
///
/// ```
/// use gpubind::collective::NcclUniqueId;
/// let id = NcclUniqueId::from_bytes(&[7u8; 128])?;
/// let text = id.to_string();
/// assert_eq!(text.len(), 256);
/// assert_eq!(text.parse::<NcclUniqueId>()?, id);
/// assert!("nope".parse::<NcclUniqueId>().is_err());
/// # Ok::<(), gpubind::Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NcclUniqueId([u8; NCCL_UNIQUE_ID_BYTES]);

impl NcclUniqueId {
    /// A fresh id from `ncclGetUniqueId` (rank 0 only: it also starts NCCL's bootstrap
    /// listener in this process). [`Error::NoNccl`] without the library,
    /// [`Error::FeatureDisabled`] without the `nccl` feature. Needs no GPU.
    pub fn new() -> Result<Self> {
        crate::collective::backend::nccl::unique_id_bytes().map(NcclUniqueId)
    }

    /// The id from its 128 bytes ([`Error::InvalidArgument`] for any other length).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let arr: [u8; NCCL_UNIQUE_ID_BYTES] = bytes.try_into().map_err(|_| {
            Error::InvalidArgument(format!(
                "an NCCL unique id is {NCCL_UNIQUE_ID_BYTES} bytes, got {}",
                bytes.len()
            ))
        })?;
        Ok(NcclUniqueId(arr))
    }

    /// The 128 bytes.
    pub fn as_bytes(&self) -> &[u8; NCCL_UNIQUE_ID_BYTES] {
        &self.0
    }
}

impl std::fmt::Display for NcclUniqueId {
    /// 256 lowercase hex digits.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for NcclUniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclUniqueId(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

impl std::str::FromStr for NcclUniqueId {
    type Err = Error;

    /// Exactly 256 hex digits (either case).
    fn from_str(s: &str) -> Result<Self> {
        let bad = |why: String| Error::InvalidArgument(format!("not an NCCL unique id: {why}"));
        if s.len() != 2 * NCCL_UNIQUE_ID_BYTES {
            return Err(bad(format!(
                "{} characters, expected {} hex digits",
                s.len(),
                2 * NCCL_UNIQUE_ID_BYTES
            )));
        }
        let mut out = [0u8; NCCL_UNIQUE_ID_BYTES];
        for (i, pair) in s.as_bytes().chunks(2).enumerate() {
            let text = std::str::from_utf8(pair).map_err(|_| bad("not ASCII".into()))?;
            out[i] = u8::from_str_radix(text, 16)
                .map_err(|_| bad(format!("{text:?} at offset {} is not hex", 2 * i)))?;
        }
        Ok(NcclUniqueId(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_hex_round_trip_and_bad_text() {
        let mut bytes = [0u8; 128];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 37 + 11) as u8;
        }
        let id = NcclUniqueId::from_bytes(&bytes).unwrap();
        let hex = id.to_string();
        assert_eq!(hex.len(), 256);
        assert_eq!(hex.parse::<NcclUniqueId>().unwrap(), id);
        assert_eq!(hex.to_uppercase().parse::<NcclUniqueId>().unwrap(), id);
        assert_eq!(id.as_bytes(), &bytes);
        assert!(format!("{id:?}").starts_with("NcclUniqueId(0b30"));
        assert!(NcclUniqueId::from_bytes(&bytes[..127]).is_err());
        assert!(hex[..254].parse::<NcclUniqueId>().is_err());
        let mut bad = hex.clone();
        bad.replace_range(10..12, "zz");
        let e = bad.parse::<NcclUniqueId>().unwrap_err();
        assert!(e.to_string().contains("offset 10"), "{e}");
        let mut multibyte = hex[..254].to_string();
        multibyte.push('é');
        assert!(matches!(
            multibyte.parse::<NcclUniqueId>(),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn unique_id_needs_nccl_not_a_gpu() {
        match NcclUniqueId::new() {
            Ok(a) => {
                // Two ids differ (each names its own bootstrap listener and a random magic).
                let b = NcclUniqueId::new().unwrap();
                assert_ne!(a, b);
            }
            Err(e) => assert!(
                matches!(e, Error::NoNccl | Error::FeatureDisabled { .. }),
                "{e:?}"
            ),
        }
    }
}
