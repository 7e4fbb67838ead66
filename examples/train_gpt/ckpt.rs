//! Checkpoints and initial weights as safetensors files. Pure host code.
//!
//! A checkpoint holds every parameter under its `state_dict` name, the AdamW moments as
//! `adam_m.<name>` and `adam_v.<name>`, and the metadata `model`, `step` and
//! `params` (the parameter count). It is written to `<path>.tmp` and renamed into place,
//! so a crash never leaves a half-written checkpoint under the real name.

use crate::GptError;
use crate::model::ParamLayout;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A training state read back from a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    /// Steps done.
    pub step: usize,
    pub params: Vec<f32>,
    pub m: Vec<f32>,
    pub v: Vec<f32>,
}

fn err(path: &Path, tensor: Option<&str>, why: impl ToString) -> GptError {
    GptError::Checkpoint {
        path: path.to_path_buf(),
        tensor: tensor.map(str::to_string),
        why: why.to_string(),
    }
}

fn le_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The safetensors bytes of `sets` (name prefix, flat values laid out as `layout`).
pub fn to_bytes(
    layout: &ParamLayout,
    sets: &[(&str, &[f32])],
    meta: HashMap<String, String>,
) -> Result<Vec<u8>, GptError> {
    let raw: Vec<Vec<u8>> = sets.iter().map(|(_, v)| le_bytes(v)).collect();
    let mut views = Vec::new();
    for ((prefix, _), bytes) in sets.iter().zip(&raw) {
        for p in &layout.params {
            let data = &bytes[p.offset * 4..(p.offset + p.len()) * 4];
            let view = TensorView::new(Dtype::F32, p.shape.clone(), data)
                .map_err(|e| err(Path::new("-"), Some(&p.name), e))?;
            views.push((format!("{prefix}{}", p.name), view));
        }
    }
    safetensors::serialize(views, Some(meta)).map_err(|e| err(Path::new("-"), None, e))
}

/// Writes `bytes` to `path` through `<path>.tmp` and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), GptError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).map_err(|e| err(&tmp, None, e))?;
    std::fs::rename(&tmp, path).map_err(|e| err(path, None, e))
}

/// Saves a training state of `model` (its `--model` name).
pub fn save(path: &Path, layout: &ParamLayout, model: &str, state: &State) -> Result<(), GptError> {
    let meta = HashMap::from([
        ("model".to_string(), model.to_string()),
        ("step".to_string(), state.step.to_string()),
        ("params".to_string(), layout.total.to_string()),
    ]);
    let sets = [
        ("", &state.params[..]),
        ("adam_m.", &state.m[..]),
        ("adam_v.", &state.v[..]),
    ];
    let bytes = to_bytes(layout, &sets, meta)?;
    write_atomic(path, &bytes)
}

/// Reads a checkpoint of `model` with `layout`: a truncated file, another model, or a
/// tensor missing or of the wrong shape or type is [`GptError::Checkpoint`] naming it.
pub fn load(path: &Path, layout: &ParamLayout, model: &str) -> Result<State, GptError> {
    let bytes = std::fs::read(path).map_err(|e| err(path, None, e))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| err(path, None, e))?;
    let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| err(path, None, e))?;
    let info = meta.metadata().clone().unwrap_or_default();
    let get = |k: &str| {
        info.get(k)
            .cloned()
            .ok_or_else(|| err(path, None, format!("no `{k}` in the metadata")))
    };
    let saved = get("model")?;
    if saved != model {
        return Err(err(
            path,
            None,
            format!("a checkpoint of model {saved}, not {model}"),
        ));
    }
    let step = get("step")?
        .parse()
        .map_err(|e| err(path, None, format!("metadata step: {e}")))?;
    let mut out = [(); 3].map(|_| vec![0.0f32; layout.total]);
    for (prefix, dst) in ["", "adam_m.", "adam_v."].iter().zip(out.iter_mut()) {
        for p in &layout.params {
            let name = format!("{prefix}{}", p.name);
            let t = st.tensor(&name).map_err(|e| err(path, Some(&name), e))?;
            if t.dtype() != Dtype::F32 || t.shape() != p.shape.as_slice() {
                return Err(err(
                    path,
                    Some(&name),
                    format!(
                        "{:?} {:?}, expected F32 {:?}",
                        t.dtype(),
                        t.shape(),
                        p.shape
                    ),
                ));
            }
            for (d, b) in dst[p.range()].iter_mut().zip(t.data().chunks_exact(4)) {
                *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
    }
    let [params, m, v] = out;
    Ok(State { step, params, m, v })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Config;

    fn state(layout: &ParamLayout) -> State {
        let f = |k: f32| (0..layout.total).map(|i| i as f32 * k).collect();
        State {
            step: 7,
            params: f(1.0),
            m: f(0.5),
            v: f(0.25),
        }
    }

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("train_gpt_{}_{name}", std::process::id()))
    }

    #[test]
    fn round_trip_and_atomic_write() {
        let layout = ParamLayout::new(&Config::named("small").unwrap());
        let path = tmp("rt.safetensors");
        let s = state(&layout);
        save(&path, &layout, "small", &s).unwrap();
        assert!(!Path::new(&format!("{}.tmp", path.display())).exists());
        assert_eq!(load(&path, &layout, "small").unwrap(), s);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn another_model_or_a_truncated_file_is_refused() {
        let cfg = Config::named("small").unwrap();
        let layout = ParamLayout::new(&cfg);
        let path = tmp("bad.safetensors");
        save(&path, &layout, "small", &state(&layout)).unwrap();
        let e = load(&path, &layout, "gpt2").unwrap_err();
        assert!(e.to_string().contains("model small, not gpt2"), "{e}");
        // Same name, other shape: the first tensor that differs is named.
        let mut other = cfg;
        other.context = 128;
        let e = load(&path, &ParamLayout::new(&other), "small").unwrap_err();
        assert!(
            matches!(&e, GptError::Checkpoint { tensor: Some(t), .. } if t == "wpe.weight"),
            "{e}"
        );
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        let e = load(&path, &layout, "small").unwrap_err();
        assert!(matches!(e, GptError::Checkpoint { .. }), "{e}");
        let _ = std::fs::remove_file(path);
    }
}
