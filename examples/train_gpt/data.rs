//! Training text as byte tokens: reading (`--data` files or Python's standard library),
//! the held-out split and the seeded batch order. Pure host code.

use crate::GptError;
use crate::model::Rng;
use std::path::{Path, PathBuf};

/// The token stream, split into training and validation parts.
#[derive(Debug, Clone)]
pub struct Dataset {
    pub train: Vec<u8>,
    pub val: Vec<u8>,
    /// Where the text came from, for the log.
    pub source: String,
}

/// Reads `paths` (files, or directories searched for `.py` files), or without any the
/// `.py` files of Python's standard library, and splits off the last `val_frac` as
/// validation data. Both parts must hold at least one sequence of `context + 1` tokens.
pub fn load(paths: &[PathBuf], context: usize, val_frac: f64) -> Result<Dataset, GptError> {
    let (files, source) = if paths.is_empty() {
        let dir = python_stdlib().ok_or(GptError::NoData)?;
        let mut files = Vec::new();
        collect_py(&dir, &mut files, 0);
        if files.is_empty() {
            return Err(GptError::NoData);
        }
        files.sort();
        (
            files,
            format!("{} (Python standard library)", dir.display()),
        )
    } else {
        let mut files = Vec::new();
        for p in paths {
            if p.is_dir() {
                collect_py(p, &mut files, 0);
            } else {
                files.push(p.clone());
            }
        }
        let names = paths.iter().map(|p| p.display().to_string());
        (files, names.collect::<Vec<_>>().join(", "))
    };
    let mut bytes = Vec::new();
    for f in &files {
        let data = std::fs::read(f).map_err(|e| GptError::Data {
            path: f.clone(),
            why: e.to_string(),
        })?;
        bytes.extend_from_slice(&data);
    }
    split(bytes, context, val_frac, source)
}

/// Splits `bytes` into training data and the last `val_frac` (at least one sequence).
pub fn split(
    bytes: Vec<u8>,
    context: usize,
    val_frac: f64,
    source: String,
) -> Result<Dataset, GptError> {
    let seq = context + 1;
    let val_len = ((bytes.len() as f64 * val_frac) as usize).max(seq);
    if bytes.len() < val_len + seq {
        return Err(GptError::TooLittleData {
            have: bytes.len(),
            need: val_len + seq,
        });
    }
    let cut = bytes.len() - val_len;
    let mut train = bytes;
    let val = train.split_off(cut);
    Ok(Dataset { train, val, source })
}

fn collect_py(dir: &Path, out: &mut Vec<PathBuf>, depth: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if p.is_dir() && depth < 4 && name != "site-packages" && name != "__pycache__" {
            collect_py(&p, out, depth + 1);
        } else if name.ends_with(".py") {
            out.push(p);
        }
    }
}

/// Python's standard library directory, from `python3` itself.
fn python_stdlib() -> Option<PathBuf> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sysconfig;print(sysconfig.get_paths()['stdlib'])",
        ])
        .output()
        .ok()?;
    let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    (out.status.success() && dir.is_dir()).then_some(dir)
}

/// The start offsets of every step's `batch` sequences (`steps × batch`), drawn from
/// the seeded generator: the batch order `--dump-init` writes and the trainers replay.
pub fn batch_order(
    train_len: usize,
    context: usize,
    batch: usize,
    steps: usize,
    seed: u64,
) -> Vec<u64> {
    let mut rng = Rng(seed ^ 0x6461_7461);
    let span = train_len - context; // starts 0..span leave context + 1 tokens
    (0..steps * batch).map(|_| rng.below(span) as u64).collect()
}

/// Inputs and targets (`batch × context` each) of the sequences starting at `starts`.
pub fn make_batch(data: &[u8], starts: &[u64], context: usize) -> (Vec<u32>, Vec<u32>) {
    let mut x = Vec::with_capacity(starts.len() * context);
    let mut y = Vec::with_capacity(starts.len() * context);
    for &s in starts {
        let s = s as usize;
        x.extend(data[s..s + context].iter().map(|&b| u32::from(b)));
        y.extend(data[s + 1..s + context + 1].iter().map(|&b| u32::from(b)));
    }
    (x, y)
}

/// The validation batches: consecutive windows from the start of the held-out data,
/// at most `max` batches of `batch` sequences (at least one).
pub fn val_starts(val_len: usize, context: usize, batch: usize, max: usize) -> Vec<Vec<u64>> {
    let windows = (val_len - 1) / context;
    let batches = (windows / batch).clamp(1, max);
    (0..batches)
        .map(|b| {
            (0..batch)
                .map(|i| (((b * batch + i) % windows) * context) as u64)
                .collect()
        })
        .collect()
}

/// The little-endian file of a batch order.
pub fn order_bytes(order: &[u64]) -> Vec<u8> {
    order.iter().flat_map(|s| s.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_the_tail_for_validation() {
        let d = split(
            (0..=255u8).cycle().take(10_000).collect(),
            16,
            0.05,
            "t".into(),
        )
        .unwrap();
        assert_eq!(d.val.len(), 500);
        assert_eq!(d.train.len(), 9500);
        assert_eq!(d.val[0], (9500 % 256) as u8);
    }

    #[test]
    fn split_refuses_too_little_data() {
        let e = split(vec![1; 30], 16, 0.05, "t".into()).unwrap_err();
        assert!(matches!(e, GptError::TooLittleData { have: 30, need: 34 }));
    }

    #[test]
    fn batches_stay_inside_and_shift_targets() {
        let data: Vec<u8> = (0..200u32).map(|i| i as u8).collect();
        let order = batch_order(data.len(), 8, 4, 50, 7);
        assert_eq!(order.len(), 200);
        assert!(order.iter().all(|&s| s as usize + 9 <= data.len()));
        assert_eq!(order, batch_order(data.len(), 8, 4, 50, 7));
        let (x, y) = make_batch(&data, &order[..4], 8);
        assert_eq!(x.len(), 32);
        assert!(x.iter().zip(&y).all(|(a, b)| b == &(a + 1)));
        assert_eq!(order_bytes(&order[..1]), order[0].to_le_bytes());
    }

    #[test]
    fn unreadable_file_is_a_typed_error() {
        let e = load(&[PathBuf::from("/nonexistent/train_gpt.txt")], 8, 0.05).unwrap_err();
        assert!(matches!(e, GptError::Data { .. }), "{e}");
        assert!(e.to_string().contains("/nonexistent/train_gpt.txt"));
    }

    #[test]
    fn validation_windows_cover_the_held_out_data() {
        let v = val_starts(1000, 10, 4, 100);
        assert_eq!(v.len(), 24);
        assert!(v.iter().flatten().all(|&s| s as usize + 11 <= 1000));
        assert_eq!(val_starts(12, 10, 4, 8).len(), 1);
    }
}
