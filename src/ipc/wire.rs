//! The checksummed envelope every serialized IPC handle travels in.
//!
//! ```text
//! offset  size  field
//!      0     4  magic   b"GBIH"
//!      4     2  version u16 LE (currently 1)
//!      6     2  kind    u16 LE (1 pool, 2 buffer, 3 legacy, 4 bundle, 5 event,
//!                               6 hand-off)
//!      8     4  length  u32 LE of the payload (at most MAX_PAYLOAD)
//!     12     n  payload JSON (serde) of the handle
//!   12+n     8  FNV-1a 64 of bytes 0..12+n, LE
//! ```
//!
//! Decoding checks every field before it parses the payload, so truncated, oversized,
//! foreign or bit-flipped input is an [`Error::CorruptHandle`] naming what is wrong.

use crate::error::{Error, Result};
use crate::fnv::fnv1a64;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// First four bytes of every sealed handle.
pub(crate) const MAGIC: [u8; 4] = *b"GBIH";
/// The envelope version this build writes and reads.
pub(crate) const VERSION: u16 = 1;
/// Largest payload accepted (a bundle of many handles stays far below this).
pub(crate) const MAX_PAYLOAD: usize = 1 << 20;
const HEADER: usize = 12;
const TRAILER: usize = 8;

/// What a sealed envelope holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Pool = 1,
    Buffer = 2,
    Legacy = 3,
    Bundle = 4,
    Event = 5,
    Handoff = 6,
}

impl Kind {
    fn name(code: u16) -> &'static str {
        match code {
            1 => "a pool handle",
            2 => "a buffer handle",
            3 => "a legacy IPC handle",
            4 => "a handle bundle",
            5 => "an interprocess event handle",
            6 => "a hand-off message",
            _ => "an unknown kind",
        }
    }
}

pub(crate) fn corrupt(reason: impl Into<String>) -> Error {
    Error::CorruptHandle {
        reason: reason.into(),
    }
}

/// Serializes `value` into a sealed envelope of `kind`.
pub(crate) fn seal<T: Serialize + ?Sized>(kind: Kind, value: &T) -> Result<Vec<u8>> {
    let payload = serde_json::to_vec(value)
        .map_err(|e| Error::InvalidArgument(format!("cannot serialize IPC handle: {e}")))?;
    if payload.len() > MAX_PAYLOAD {
        return Err(Error::InvalidArgument(format!(
            "serialized IPC payload is {} bytes, more than the limit of {MAX_PAYLOAD}",
            payload.len()
        )));
    }
    let mut out = Vec::with_capacity(HEADER + payload.len() + TRAILER);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(kind as u16).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&payload);
    let sum = fnv1a64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    Ok(out)
}

/// Checks and parses an envelope that must hold `kind`.
pub(crate) fn open<T: DeserializeOwned>(kind: Kind, bytes: &[u8]) -> Result<T> {
    if bytes.len() < HEADER + TRAILER {
        return Err(corrupt(format!(
            "truncated: {} bytes, a sealed handle has at least {}",
            bytes.len(),
            HEADER + TRAILER
        )));
    }
    if bytes[0..4] != MAGIC {
        return Err(corrupt(format!(
            "bad magic {:02x?} (expected {:02x?} \"GBIH\")",
            &bytes[0..4],
            MAGIC
        )));
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != VERSION {
        return Err(corrupt(format!(
            "unsupported version {version} (this build reads version {VERSION})"
        )));
    }
    let found = u16::from_le_bytes([bytes[6], bytes[7]]);
    if found != kind as u16 {
        return Err(corrupt(format!(
            "expected {}, found {} (kind {found})",
            Kind::name(kind as u16),
            Kind::name(found)
        )));
    }
    let len = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(corrupt(format!(
            "payload length {len} exceeds the limit of {MAX_PAYLOAD}"
        )));
    }
    let want = HEADER + len + TRAILER;
    if bytes.len() != want {
        return Err(corrupt(if bytes.len() < want {
            format!("truncated: {} of {want} bytes", bytes.len())
        } else {
            format!("{} trailing bytes after the handle", bytes.len() - want)
        }));
    }
    let (body, sum) = bytes.split_at(HEADER + len);
    let mut stored = [0u8; 8];
    stored.copy_from_slice(sum);
    let stored = u64::from_le_bytes(stored);
    let computed = fnv1a64(body);
    if stored != computed {
        return Err(corrupt(format!(
            "checksum mismatch (stored {stored:#018x}, computed {computed:#018x})"
        )));
    }
    serde_json::from_slice(&body[HEADER..]).map_err(|e| corrupt(format!("malformed payload: {e}")))
}

/// `#[serde(with = "hex")]` for fixed-size byte arrays: a lowercase hex string.
pub(crate) mod hex {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn encode(bytes: &[u8]) -> String {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(bytes.len() * 2);
        for &b in bytes {
            s.push(DIGITS[usize::from(b >> 4)] as char);
            s.push(DIGITS[usize::from(b & 15)] as char);
        }
        s
    }

    pub(crate) fn decode<const N: usize>(s: &str) -> Result<[u8; N], String> {
        let digits = s.as_bytes();
        if digits.len() != 2 * N {
            return Err(format!(
                "expected {} hex digits, found {}",
                2 * N,
                digits.len()
            ));
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err(format!("invalid hex digit {:?}", c as char)),
        };
        let mut out = [0u8; N];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = (nibble(digits[2 * i])? << 4) | nibble(digits[2 * i + 1])?;
        }
        Ok(out)
    }

    pub(crate) fn serialize<S: Serializer, const N: usize>(
        bytes: &[u8; N],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_str(&encode(bytes))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>, const N: usize>(
        d: D,
    ) -> Result<[u8; N], D::Error> {
        let s = String::deserialize(d)?;
        decode(&s).map_err(D::Error::custom)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Probe {
        #[serde(with = "hex")]
        data: [u8; 8],
        n: u64,
    }

    pub(crate) fn is_corrupt<T>(r: &Result<T>) -> bool {
        matches!(r, Err(Error::CorruptHandle { .. }))
    }

    #[test]
    fn hex_round_trips_and_rejects() {
        let b = [0u8, 1, 0xab, 0xff];
        assert_eq!(hex::encode(&b), "0001abff");
        assert_eq!(hex::decode::<4>("0001ABff").unwrap(), b);
        assert!(hex::decode::<4>("0001ab").is_err());
        assert!(hex::decode::<4>("0001abzz").is_err());
    }

    #[test]
    fn every_field_is_checked() {
        let p = Probe {
            data: [7; 8],
            n: 42,
        };
        let sealed = seal(Kind::Buffer, &p).unwrap();
        assert_eq!(open::<Probe>(Kind::Buffer, &sealed).unwrap(), p);
        let reason = |bytes: &[u8], kind| match open::<Probe>(kind, bytes) {
            Err(Error::CorruptHandle { reason }) => reason,
            other => panic!("expected CorruptHandle, got {other:?}"),
        };
        assert!(reason(&sealed, Kind::Pool).contains("expected a pool handle"));
        let mut bad = sealed.clone();
        bad[0] = b'X';
        assert!(reason(&bad, Kind::Buffer).contains("magic"));
        let mut bad = sealed.clone();
        bad[4] = 9;
        assert!(reason(&bad, Kind::Buffer).contains("version 9"));
        let mut bad = sealed.clone();
        bad[8..12].copy_from_slice(&(MAX_PAYLOAD as u32 + 1).to_le_bytes());
        assert!(reason(&bad, Kind::Buffer).contains("exceeds"));
        assert!(reason(&sealed[..sealed.len() - 1], Kind::Buffer).contains("truncated"));
        let mut long = sealed.clone();
        long.push(0);
        assert!(reason(&long, Kind::Buffer).contains("trailing"));
        let mut bad = sealed.clone();
        bad[HEADER + 3] ^= 0x01;
        assert!(reason(&bad, Kind::Buffer).contains("checksum"));
        // A valid envelope around a payload of the wrong shape.
        let other = seal(Kind::Buffer, &serde_json::json!({"n": "x"})).unwrap();
        assert!(reason(&other, Kind::Buffer).contains("malformed"));
    }

    proptest! {
        #[test]
        fn any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = open::<Probe>(Kind::Buffer, &bytes);
        }

        #[test]
        fn any_single_flip_is_rejected(data in any::<[u8; 8]>(), n in any::<u64>(),
                                       pos in any::<prop::sample::Index>(), bit in 0u8..8) {
            let sealed = seal(Kind::Buffer, &Probe { data, n }).unwrap();
            let mut bad = sealed.clone();
            let i = pos.index(bad.len());
            bad[i] ^= 1 << bit;
            prop_assert!(is_corrupt(&open::<Probe>(Kind::Buffer, &bad)));
        }

        #[test]
        fn any_truncation_is_rejected(data in any::<[u8; 8]>(), n in any::<u64>(),
                                      cut in any::<prop::sample::Index>()) {
            let sealed = seal(Kind::Buffer, &Probe { data, n }).unwrap();
            let keep = cut.index(sealed.len());
            prop_assert!(is_corrupt(&open::<Probe>(Kind::Buffer, &sealed[..keep])));
        }
    }
}
